//! Handlers for NVML's memory queries, so tools and frameworks asking NVML see the same
//! picture as `cuMemGetInfo`: for a GPU the process sees with a cap, the
//! stricter of its own and its group's (`accounting.rs`): total = min(caps,
//! real total), free = min(real free + cached, each cap − what it holds),
//! used = total − free (and `reserved` = 0 in the v2 structure). Devices
//! without a cap, or that the process cannot see, are reported as the
//! driver says.
//!
//! NVML devices are matched to the process's CUDA devices by UUID when the
//! process has used CUDA; before that, the cap is worked out from the limit
//! by UUID, or by the device's position in `CUDA_VISIBLE_DEVICES`. The hook
//! never initialises CUDA itself: programs (PyTorch among them) query NVML
//! precisely so that a later `fork` can still use CUDA.

use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::limit::{Amount, cuda_ordinal};
use vramcap_core::page::uuid_text;

use crate::engine::Engine;
use crate::engine::accounting::capped_info;
use crate::engine::driver::Driver;
use crate::ffi::*;

impl<D: Driver> Engine<D> {
    /// `nvmlDeviceGetMemoryInfo*`'s figures: the caps' (total, free) for
    /// an NVML device whose real figures are these, or `None` to leave them
    /// as NVML said (no cap for this process, or a GPU it does not see).
    /// The boundary reads and writes the caller's structure
    /// (`boundary/queries.rs`).
    pub fn nvml_capped(&self, device: nvmlDevice_t, total: u64, free: u64) -> Option<(u64, u64)> {
        let uuid = self.driver.nvml_device_uuid(device as usize)?;
        let page = self.accounting.page().get(self.settings);
        for (i, s) in page.slots.iter().enumerate() {
            if s.flags.load(Ordering::Relaxed) == 0 {
                continue;
            }
            if uuid_text(&s.uuid_bytes()).is_some_and(|u| u.eq_ignore_ascii_case(&uuid)) {
                let limit = self.accounting.cap_in_force(s, i as i32)?;
                return (limit != NO_CAP)
                    .then(|| self.accounting.picture(s, i as i32, total, free));
            }
        }
        // CUDA not used on this device yet: work the cap out from the
        // process's own limit (a group is joined on first CUDA use only).
        // The stricter of VRAMCAP_LIMIT, NVIDIA_GPU_MEMORY_LIMIT and the
        // operator's cap, as `compute_limit` will make it.
        let settings = self.settings;
        let specs = std::iter::once(&settings.limit).chain(settings.operator.as_ref());
        if settings.nvidia_limit.is_none() && specs.clone().all(|s| s.is_unlimited()) {
            return None;
        }
        let index = self.driver.nvml_device_index(device as usize)?;
        let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal = cuda_ordinal(index, &uuid, cvd.as_deref())?;
        let mut cap = settings.nvidia_limit.unwrap_or(NO_CAP);
        for spec in specs {
            match spec.amount_for(ordinal, Some(&uuid)) {
                Some(Amount::Bytes(b)) => cap = cap.min(b),
                Some(a @ Amount::Percent(_)) => cap = cap.min(a.resolve(total)),
                None => {}
            }
        }
        (cap != NO_CAP).then(|| capped_info(total, free, cap, 0, 0))
    }
}
