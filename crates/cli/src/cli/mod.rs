pub mod doctor;
pub mod exporter;
pub mod kernel;
pub mod limit;
pub mod machine;
pub mod park;
pub mod plugin;
pub mod run;
pub mod secure;
pub mod stat;
pub mod top;
pub mod trim;

#[cfg(test)]
mod readme;
