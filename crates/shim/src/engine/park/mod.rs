//! Parking (issue 34; docs/design/parking.md): the process moves its own
//! device memory to host memory through the driver's checkpoint calls, on
//! the background thread, and releases its budget; it comes back when asked
//! or when the program calls CUDA again (the [`gate`]).

// Used by the boundary and the worker as they are wired in.
#![allow(dead_code)]

pub mod gate;
