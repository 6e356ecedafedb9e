//! Logic shared by the `vramcap` CLI and the `libvramcap.so` shim, free of CUDA
//! and of FFI so it can be tested as plain Rust.

pub mod budget;
pub mod cache;
pub mod counters;
pub mod exe;
pub mod group;
pub mod limit;
pub mod liveness;
pub mod mailbox;
pub mod page;
pub mod park;
pub mod peers;
pub mod settings;
pub mod size;
pub mod stats_dir;
pub mod text;

pub use limit::{Amount, Key, LimitError, LimitSpec, MAX_DEVICES, parse_limit};
pub use size::{Percent, human_bytes, parse_size};
