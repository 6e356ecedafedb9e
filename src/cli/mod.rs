pub mod doctor;
pub mod stat;
