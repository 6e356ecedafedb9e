//! NVML memory queries, so tools and frameworks asking NVML see the same
//! picture as `cuMemGetInfo`: for a GPU the process sees with a cap, total =
//! min(cap, real total), free = min(real free + cached, cap − held), used =
//! total − free (and `reserved` = 0 in the v2 structure). Devices without a
//! cap, or that the process cannot see, are reported as the driver says.
//!
//! NVML devices are matched to the process's CUDA devices by UUID when the
//! process has used CUDA; before that, the cap is worked out from the limit
//! by UUID, or by the device's position in `CUDA_VISIBLE_DEVICES`. The hook
//! never initialises CUDA itself: programs (PyTorch among them) query NVML
//! precisely so that a later `fork` can still use CUDA.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::limit::{Amount, cuda_ordinal};
use vramcap_core::page::uuid_text;

use crate::hooks::{REAL, boundary, disabled};
use crate::real::call_real;
use crate::state::settings;

#[repr(C)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_FOUND: c_int = 6;

/// (cap, bytes held by this process, bytes of that in its cache) for an
/// NVML device, or `None` when it has no cap for this process.
fn view(device: *mut c_void, real_total: u64) -> Option<(u64, u64, u64)> {
    let mut buf = [0 as c_char; 96];
    let rc = call_real!(
        REAL.nvmlDeviceGetUUID,
        fn(*mut c_void, *mut c_char, c_uint) -> c_int,
        device,
        buf.as_mut_ptr(),
        96
    );
    if rc != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into the buffer.
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let page = crate::stats::page();
    for (i, s) in page.slots.iter().enumerate() {
        if s.flags.load(Ordering::Relaxed) == 0 {
            continue;
        }
        if uuid_text(&s.uuid_bytes()).is_some_and(|u| u.eq_ignore_ascii_case(&uuid)) {
            let limit = s.budget.limit()?;
            return (limit != NO_CAP).then(|| {
                (
                    limit,
                    crate::state::held_on(s, i as i32),
                    s.cached.load(Ordering::Relaxed),
                )
            });
        }
    }
    // CUDA not used on this device yet: work the cap out from the limit.
    let spec = &settings().limit;
    if spec.is_unlimited() {
        return None;
    }
    let mut index: c_uint = 0;
    let rc = call_real!(
        REAL.nvmlDeviceGetIndex,
        fn(*mut c_void, *mut c_uint) -> c_int,
        device,
        &mut index
    );
    let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let ordinal = if rc == NVML_SUCCESS {
        cuda_ordinal(index, &uuid, cvd.as_deref())?
    } else {
        return None;
    };
    let cap = match spec.amount_for(ordinal, Some(&uuid))? {
        Amount::Bytes(b) => b,
        a @ Amount::Percent(_) => a.resolve(real_total),
    };
    Some((cap, 0, 0))
}

/// (total, free) as the cap sees them.
fn adjust(total: u64, free: u64, cap: u64, held: u64, cached: u64) -> (u64, u64) {
    let t = total.min(cap);
    let room = cap.saturating_sub(held.saturating_sub(cached));
    (t, free.saturating_add(cached).min(room).min(t))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    memory: *mut Memory,
) -> c_int {
    boundary("nvmlDeviceGetMemoryInfo", NVML_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.nvmlDeviceGetMemoryInfo,
            fn(*mut c_void, *mut Memory) -> c_int,
            device,
            memory
        );
        if rc != NVML_SUCCESS || disabled() || memory.is_null() {
            return rc;
        }
        // SAFETY: non-null and just written by NVML.
        let m = unsafe { &mut *memory };
        if let Some((cap, held, cached)) = view(device, m.total) {
            let (t, f) = adjust(m.total, m.free, cap, held, cached);
            m.total = t;
            m.free = f;
            m.used = t - f;
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    memory: *mut MemoryV2,
) -> c_int {
    boundary("nvmlDeviceGetMemoryInfo_v2", NVML_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.nvmlDeviceGetMemoryInfo_v2,
            fn(*mut c_void, *mut MemoryV2) -> c_int,
            device,
            memory
        );
        if rc != NVML_SUCCESS || disabled() || memory.is_null() {
            return rc;
        }
        // SAFETY: non-null and just written by NVML.
        let m = unsafe { &mut *memory };
        if let Some((cap, held, cached)) = view(device, m.total) {
            let (t, f) = adjust(m.total, m.free, cap, held, cached);
            m.total = t;
            m.free = f;
            m.reserved = 0;
            m.used = t - f;
        }
        rc
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn adjust_is_the_cap_picture() {
        let g = 1u64 << 30;
        assert_eq!(super::adjust(140 * g, 139 * g, 4 * g, 0, 0), (4 * g, 4 * g));
        assert_eq!(
            super::adjust(140 * g, 139 * g, 4 * g, 3 * g, g),
            (4 * g, 2 * g)
        );
        assert_eq!(super::adjust(140 * g, g / 2, 4 * g, 0, 0), (4 * g, g / 2));
        assert_eq!(super::adjust(2 * g, g, 4 * g, 5 * g, 0), (2 * g, 0));
    }
}
