//! The integration tests, one binary: every case runs the shim or the CLI in
//! fresh processes against the stand-in driver (see `standin/README.md`
//! for what the stand-in models and what it does not prove).

mod util;

mod alloc_path;
mod autostart;
mod cache;
mod cli;
mod docs;
mod escape;
mod exporter;
mod fork;
mod forward;
mod group;
mod held;
mod layout;
mod limit;
mod live;
mod operator;
mod park_basics;
mod park_calls;
mod park_cli;
mod park_exit;
mod park_move;
mod park_policy;
mod park_resume;
mod park_util;
mod paths;
mod peers;
mod python;
mod readers;
mod shim;
mod spill;
mod standin_model;
mod stats;
mod tiered;
mod top;
