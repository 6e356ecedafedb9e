pub mod doctor;
pub mod stat;
pub mod trim;
