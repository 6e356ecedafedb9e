//! Parking's calls into the real libraries ([`Checkpointing`] for
//! [`RealDriver`]): the driver's `cuCheckpointProcess*` on this process's
//! own PID, with zeroed 64-byte argument structs (every field but Lock's
//! timeout is reserved and must be zero), and NVML's free memory.
//! The checkpoint functions are resolved from the real driver by `dlsym`
//! (never hooked); a driver without them answers `None`.

use std::ffi::c_void;

use super::driver::RealDriver;
use super::hooks::calls as c;
use super::hooks::real as h;
use crate::engine::driver::{Checkpoint, Checkpointing};
use crate::ffi::{CUresult, NVML_SUCCESS, nvmlDevice_t, nvmlMemory_t};

impl Checkpointing for RealDriver {
    fn checkpoint(&self, step: Checkpoint) -> Option<CUresult> {
        // The args structs (`CUcheckpointLockArgs` and friends) are 64
        // bytes; Lock's first 32-bit word is its timeout in milliseconds.
        let mut args = [0u64; 8];
        if let Checkpoint::Lock(ms) = step {
            args[0] = u64::from(ms);
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let a = args.as_mut_ptr().cast::<c_void>();
        let slot_there = match step {
            Checkpoint::Lock(_) => c::cuCheckpointProcessLock::SLOT.get().is_some(),
            Checkpoint::Save => c::cuCheckpointProcessCheckpoint::SLOT.get().is_some(),
            Checkpoint::Restore => c::cuCheckpointProcessRestore::SLOT.get().is_some(),
            Checkpoint::Unlock => c::cuCheckpointProcessUnlock::SLOT.get().is_some(),
        };
        if !slot_there {
            return None;
        }
        // SAFETY: the PID is this process's and `args` is a zeroed struct
        // of the size the driver reads, alive across the call.
        let rc = unsafe {
            match step {
                Checkpoint::Lock(_) => c::cuCheckpointProcessLock::call(pid, a),
                Checkpoint::Save => c::cuCheckpointProcessCheckpoint::call(pid, a),
                Checkpoint::Restore => c::cuCheckpointProcessRestore::call(pid, a),
                Checkpoint::Unlock => c::cuCheckpointProcessUnlock::call(pid, a),
            }
        };
        Some(rc)
    }

    fn nvml_free(&self, device: usize) -> Option<u64> {
        let mut m = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a handle NVML gave and a valid out-pointer; the real
        // function, not the shim's hook (whose answer is the capped picture).
        let rc = unsafe { h::nvmlDeviceGetMemoryInfo::call(device as nvmlDevice_t, &mut m) };
        (rc == NVML_SUCCESS).then_some(m.free)
    }
}
