//! The memory queries as the cap shows them: `cuMemGetInfo_v2` and
//! `cuDeviceTotalMem_v2`. The boundary reads and writes the caller's
//! pointers (`boundary/queries.rs`).

use vramcap_core::budget::NO_CAP;

use crate::engine::Engine;
use crate::engine::driver::Driver;
use crate::ffi::*;

impl<D: Driver> Engine<D> {
    /// `cuMemGetInfo_v2`'s figures as the cap shows them: the driver's
    /// `free` and `total` on the current device in, the (free, total) to
    /// answer out; `None` to leave the driver's (no context, no cap worked
    /// out). The boundary reads and writes the caller's pointers
    /// (`boundary/queries.rs`).
    pub fn mem_info(&'static self, free: u64, total: u64) -> Option<(u64, u64)> {
        let (_, device) = self.accounting.current()?;
        let (Some(s), Some(_)) = (self.accounting.slot(device), self.limit_of(device)) else {
            return None;
        };
        // What the pools and graphs hold may have shrunk at a synchronisation.
        self.accounting.pools_refresh(Some(device as u16));
        if let Some(limit) = self.accounting.cap_in_force(s, device) {
            self.accounting.context_check(device, s, 0, limit);
        }
        self.accounting.graphs_refresh(device);
        let (t, f) = self.accounting.picture(s, device, total, free);
        Some((f, t))
    }

    /// `cuDeviceTotalMem_v2`'s figure for `dev`: at most the cap.
    pub fn device_total(&'static self, dev: CUdevice, bytes: u64) -> u64 {
        match self.limit_of(dev) {
            Some(limit) if limit != NO_CAP => bytes.min(limit),
            _ => bytes,
        }
    }
}
