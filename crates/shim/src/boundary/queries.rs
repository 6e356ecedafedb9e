//! The memory queries' handlers at the edge: the caller's out-pointers are
//! read and written here, and the engine answers in Rust values
//! (`Engine::mem_info`, `Engine::device_total`, `Engine::nvml_capped`).

use super::RealDriver;
use crate::engine::Engine;
use crate::ffi::*;

type E = &'static Engine<RealDriver>;

/// A figure as the caller's `size_t`.
fn size(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// `cuMemGetInfo_v2`: the driver's figures, then the caps' picture of the
/// current device.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_get_info(
    engine: E,
    mut real: impl FnMut() -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    let rc = real();
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    // SAFETY: both pointers are non-null and the driver just wrote them.
    let (f, t) = unsafe { (*free as u64, *total as u64) };
    if let Some((f, t)) = engine.mem_info(f, t) {
        // SAFETY: as above.
        unsafe { (*free, *total) = (size(f), size(t)) };
    }
    rc
}

/// `cuDeviceTotalMem_v2`: at most the cap.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn device_total_mem(
    engine: E,
    mut real: impl FnMut() -> CUresult,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    let rc = real();
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    // SAFETY: non-null and just written by the driver.
    unsafe { *bytes = size(engine.device_total(dev, *bytes as u64)) };
    rc
}

/// `nvmlDeviceGetMemoryInfo`.
///
/// # Safety
/// The library function's contract.
pub unsafe fn nvml_memory_info(
    engine: E,
    mut real: impl FnMut() -> nvmlReturn_t,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let rc = real();
    // SAFETY: null, or written by NVML when it succeeded.
    if let (NVML_SUCCESS, Some(m)) = (rc, unsafe { memory.as_mut() })
        && !super::is_free_probe()
        && let Some((t, f)) = engine.nvml_capped(device, m.total, m.free)
    {
        (m.total, m.free, m.used) = (t, f, t - f);
    }
    rc
}

/// `nvmlDeviceGetMemoryInfo_v2` (`reserved` reported as 0).
///
/// # Safety
/// The library function's contract.
pub unsafe fn nvml_memory_info_v2(
    engine: E,
    mut real: impl FnMut() -> nvmlReturn_t,
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    let rc = real();
    // SAFETY: null, or written by NVML when it succeeded.
    if let (NVML_SUCCESS, Some(m)) = (rc, unsafe { memory.as_mut() })
        && !super::is_free_probe()
        && let Some((t, f)) = engine.nvml_capped(device, m.total, m.free)
    {
        (m.total, m.free, m.reserved, m.used) = (t, f, 0, t - f);
    }
    rc
}
