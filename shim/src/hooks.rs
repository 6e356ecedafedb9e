//! The intercepted driver functions, and the one table that says which they
//! are: the exports, the answers given to `dlsym` on the driver's handle and
//! the answers given by `cuGetProcAddress*` all come from [`HOOKS`].

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;

use crate::cuda::*;
use crate::log::{log_at, log_once};
use crate::real::{DynFn, call_real};
use crate::state::{DISABLED, Record, budget, limit_of, slot, table};
use vramcap_core::page::DeviceSlot;

/// The driver functions the shim calls, by exact (versioned) name.
pub struct RealFns {
    pub cuGetProcAddress: DynFn,
    pub cuGetProcAddress_v2: DynFn,
    pub cuMemAlloc_v2: DynFn,
    pub cuMemAllocPitch_v2: DynFn,
    pub cuMemAllocManaged: DynFn,
    pub cuMemFree_v2: DynFn,
    pub cuMemGetInfo_v2: DynFn,
    pub cuDeviceTotalMem_v2: DynFn,
    pub cuCtxGetDevice: DynFn,
    pub cuDeviceGetUuid: DynFn,
    pub cuDeviceGetUuid_v2: DynFn,
}

pub static REAL: RealFns = RealFns {
    cuGetProcAddress: DynFn::new(c"cuGetProcAddress"),
    cuGetProcAddress_v2: DynFn::new(c"cuGetProcAddress_v2"),
    cuMemAlloc_v2: DynFn::new(c"cuMemAlloc_v2"),
    cuMemAllocPitch_v2: DynFn::new(c"cuMemAllocPitch_v2"),
    cuMemAllocManaged: DynFn::new(c"cuMemAllocManaged"),
    cuMemFree_v2: DynFn::new(c"cuMemFree_v2"),
    cuMemGetInfo_v2: DynFn::new(c"cuMemGetInfo_v2"),
    cuDeviceTotalMem_v2: DynFn::new(c"cuDeviceTotalMem_v2"),
    cuCtxGetDevice: DynFn::new(c"cuCtxGetDevice"),
    cuDeviceGetUuid: DynFn::new(c"cuDeviceGetUuid"),
    cuDeviceGetUuid_v2: DynFn::new(c"cuDeviceGetUuid_v2"),
};

/// One intercepted variant.
pub struct Hook {
    /// The exact exported name, which is also the variant's name in the driver.
    pub name: &'static CStr,
    /// The base name `cuGetProcAddress` callers ask for.
    pub base: &'static str,
    /// `cudaVersion` range `[since, until)` for which the driver answers a
    /// request for `base` with this variant. Only used when the driver hands
    /// back a pointer that is not its exported symbol (see [`substitute`]).
    pub since: c_int,
    pub until: c_int,
    pub hook: *const c_void,
    pub real: &'static DynFn,
}

// SAFETY: the raw pointer is a function address, immutable and valid forever.
unsafe impl Sync for Hook {}

/// Requests above this `cudaVersion` are never matched by name and version,
/// only by pointer: a later major release may give a name a new signature.
const NAME_MATCH_MAX_VERSION: c_int = 13999;

const OPEN: c_int = c_int::MAX;

/// Every hooked variant. None of them has a per-thread-default-stream
/// (`_ptsz`/`_ptds`) twin, so `flags` never changes which one applies; a hook
/// for a stream-taking function must add a column for that.
pub static HOOKS: [Hook; 8] = [
    Hook {
        name: c"cuGetProcAddress",
        base: "cuGetProcAddress",
        since: 11030,
        until: 12000,
        hook: cuGetProcAddress as *const c_void,
        real: &REAL.cuGetProcAddress,
    },
    Hook {
        name: c"cuGetProcAddress_v2",
        base: "cuGetProcAddress",
        since: 12000,
        until: OPEN,
        hook: cuGetProcAddress_v2 as *const c_void,
        real: &REAL.cuGetProcAddress_v2,
    },
    Hook {
        name: c"cuMemAlloc_v2",
        base: "cuMemAlloc",
        since: 3020,
        until: OPEN,
        hook: cuMemAlloc_v2 as *const c_void,
        real: &REAL.cuMemAlloc_v2,
    },
    Hook {
        name: c"cuMemAllocPitch_v2",
        base: "cuMemAllocPitch",
        since: 3020,
        until: OPEN,
        hook: cuMemAllocPitch_v2 as *const c_void,
        real: &REAL.cuMemAllocPitch_v2,
    },
    Hook {
        name: c"cuMemAllocManaged",
        base: "cuMemAllocManaged",
        since: 6000,
        until: OPEN,
        hook: cuMemAllocManaged as *const c_void,
        real: &REAL.cuMemAllocManaged,
    },
    Hook {
        name: c"cuMemFree_v2",
        base: "cuMemFree",
        since: 3020,
        until: OPEN,
        hook: cuMemFree_v2 as *const c_void,
        real: &REAL.cuMemFree_v2,
    },
    Hook {
        name: c"cuMemGetInfo_v2",
        base: "cuMemGetInfo",
        since: 3020,
        until: OPEN,
        hook: cuMemGetInfo_v2 as *const c_void,
        real: &REAL.cuMemGetInfo_v2,
    },
    Hook {
        name: c"cuDeviceTotalMem_v2",
        base: "cuDeviceTotalMem",
        since: 3020,
        until: OPEN,
        hook: cuDeviceTotalMem_v2 as *const c_void,
        real: &REAL.cuDeviceTotalMem_v2,
    },
];

/// Runs a hook body; a panic is caught (it must never unwind into C), logged
/// once, and answered with `on_panic`.
pub fn boundary<R>(name: &'static str, on_panic: R, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            log_once!(
                Error,
                "internal error in the {name} hook; answering conservatively (please report this)"
            );
            on_panic
        }
    }
}

fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// The device of the calling thread's current context.
fn current_device() -> Option<CUdevice> {
    let mut dev: CUdevice = 0;
    let rc = call_real!(REAL.cuCtxGetDevice, fn(*mut CUdevice) -> CUresult, &mut dev);
    (rc == CUDA_SUCCESS).then_some(dev)
}

/// The allocation path shared by every allocating hook: reserve `estimate`
/// bytes on the current device, call the driver, then settle the reservation
/// to the `actual` size the driver chose. `free` releases a pointer for real
/// if the settled size no longer fits.
fn capped_alloc(
    what: &'static str,
    dptr: *mut CUdeviceptr,
    estimate: u64,
    alloc: impl FnOnce() -> CUresult,
    actual: impl FnOnce() -> u64,
) -> CUresult {
    if disabled() || dptr.is_null() || estimate == 0 {
        return alloc();
    }
    let Some(device) = current_device() else {
        // No current context: the driver's own answer, whatever it is.
        return alloc();
    };
    let Some(slot) = slot(device) else {
        log_once!(
            Error,
            "device {device} is beyond the {} devices vramcap tracks; refusing its allocations",
            vramcap_core::MAX_DEVICES
        );
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let budget = &slot.budget;
    let Some(limit) = limit_of(device) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if let Err(r) = budget.try_reserve(estimate, limit) {
        DeviceSlot::add(&slot.refusals, 1);
        refused(what, device, estimate, r.used, limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let rc = alloc();
    if rc != CUDA_SUCCESS {
        budget.release(estimate);
        return rc;
    }
    // SAFETY: the driver succeeded, so it wrote the pointer through `dptr`.
    let ptr = unsafe { *dptr };
    let bytes = actual();
    if bytes > estimate {
        if let Err(r) = budget.try_reserve(bytes - estimate, limit) {
            let _ = call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, ptr);
            budget.release(estimate);
            DeviceSlot::add(&slot.refusals, 1);
            refused(what, device, bytes, r.used, limit);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        budget.release(estimate - bytes);
    }
    DeviceSlot::add(&slot.allocs, 1);
    let record = Record {
        device: device as u16,
        bytes,
    };
    if let Some(stale) = table().insert(ptr, record) {
        // The driver handed out an address the shim still thought was live:
        // it was released behind the shim's back (a destroyed context).
        if let Some(b) = crate::state::budget(CUdevice::from(stale.device)) {
            b.release(stale.bytes);
        }
        log_once!(
            Warn,
            "address {ptr:#x} was reused by the driver while vramcap still counted it; counting it once"
        );
    }
    log_at!(
        Debug,
        "{what}: {bytes} bytes at {ptr:#x} on device {device}"
    );
    rc
}

fn refused(what: &str, device: CUdevice, bytes: u64, used: u64, limit: u64) {
    log_once!(
        Warn,
        "{what}: refused {bytes} bytes on device {device}: {used} of the {limit}-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
    );
    log_at!(
        Info,
        "{what}: refused {bytes} bytes on device {device} ({used} of {limit} in use)"
    );
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    boundary("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        capped_alloc(
            "cuMemAlloc",
            dptr,
            bytesize as u64,
            || {
                call_real!(
                    REAL.cuMemAlloc_v2,
                    fn(*mut CUdeviceptr, usize) -> CUresult,
                    dptr,
                    bytesize
                )
            },
            || bytesize as u64,
        )
    })
}

/// The pitch the driver picks is not known before the call: reserve for a
/// row rounded up to 512 bytes (what current drivers use), then settle to
/// the real `pitch × height`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    boundary("cuMemAllocPitch_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        let estimate = (width as u64)
            .checked_next_multiple_of(512)
            .and_then(|w| w.checked_mul(height as u64))
            .unwrap_or(u64::MAX);
        let estimate = if pitch.is_null() { 0 } else { estimate };
        capped_alloc(
            "cuMemAllocPitch",
            dptr,
            estimate,
            || {
                call_real!(
                    REAL.cuMemAllocPitch_v2,
                    fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
                    dptr,
                    pitch,
                    width,
                    height,
                    element_size
                )
            },
            // SAFETY: on success the driver wrote the pitch; `pitch` is non-null here.
            || unsafe { *pitch as u64 }.saturating_mul(height as u64),
        )
    })
}

/// Managed memory is counted against the current device's cap: it can
/// occupy that device in full.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    boundary("cuMemAllocManaged", CUDA_ERROR_OUT_OF_MEMORY, || {
        capped_alloc(
            "cuMemAllocManaged",
            dptr,
            bytesize as u64,
            || {
                call_real!(
                    REAL.cuMemAllocManaged,
                    fn(*mut CUdeviceptr, usize, c_uint) -> CUresult,
                    dptr,
                    bytesize,
                    flags
                )
            },
            || bytesize as u64,
        )
    })
}

/// The record leaves the table before the real free: once the driver has
/// freed the address, another thread may be handed it and record it anew.
/// The bytes return to the budget only after the driver has released them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let real = || call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, dptr);
    boundary("cuMemFree_v2", CUDA_ERROR_NOT_FOUND, || {
        if dptr == 0 || disabled() {
            return real();
        }
        let record = table().remove(&dptr).map(|(_, r)| r);
        let rc = real();
        if let Some(r) = record {
            if rc == CUDA_SUCCESS {
                if let Some(s) = slot(CUdevice::from(r.device)) {
                    DeviceSlot::add(&s.frees, 1);
                    if !s.budget.release(r.bytes) {
                        log_once!(
                            Error,
                            "device {} gave back more bytes than it held; the count is clamped at zero",
                            r.device
                        );
                    }
                }
            } else {
                table().insert(dptr, r);
            }
        }
        rc
    })
}

/// Free and total as the cap sees them: total = min(cap, real total), free =
/// min(real free, cap − held), never below zero.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    boundary("cuMemGetInfo_v2", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuMemGetInfo_v2,
            fn(*mut usize, *mut usize) -> CUresult,
            free,
            total
        );
        if rc != CUDA_SUCCESS || disabled() || free.is_null() || total.is_null() {
            return rc;
        }
        let Some(device) = current_device() else {
            return rc;
        };
        let (Some(b), Some(limit)) = (budget(device), limit_of(device)) else {
            return rc;
        };
        if limit == NO_CAP {
            return rc;
        }
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let room = usize::try_from(limit.saturating_sub(b.used())).unwrap_or(usize::MAX);
        // SAFETY: both pointers are non-null and the driver just wrote them.
        unsafe {
            *total = (*total).min(cap);
            *free = (*free).min(room).min(*total);
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    boundary("cuDeviceTotalMem_v2", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuDeviceTotalMem_v2,
            fn(*mut usize, CUdevice) -> CUresult,
            bytes,
            dev
        );
        if rc != CUDA_SUCCESS || disabled() || bytes.is_null() {
            return rc;
        }
        if let Some(limit) = limit_of(dev)
            && limit != NO_CAP
        {
            {
                // SAFETY: non-null and just written by the driver.
                unsafe { *bytes = (*bytes).min(usize::try_from(limit).unwrap_or(usize::MAX)) };
            }
        }
        rc
    })
}

/// Replaces a driver function pointer handed out by `cuGetProcAddress*` with
/// the hook for the same variant. The variant is identified by the pointer
/// itself (the driver's exported symbol of that exact name); when the driver
/// hands out a pointer that is none of its exports, by base name and version
/// within the CUDA major versions whose signatures the hooks were written for.
///
/// # Safety
/// `pfn` is non-null and holds what the real resolver wrote; `symbol` is the
/// caller's NUL-terminated name.
unsafe fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int) {
    if disabled() {
        return;
    }
    // SAFETY: guaranteed by the caller.
    let p = unsafe { *pfn };
    if p.is_null() {
        return;
    }
    if let Some(h) = HOOKS.iter().find(|h| h.real.get() == Some(p)) {
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = h.hook.cast_mut() };
        return;
    }
    if symbol.is_null() || cuda_version > NAME_MATCH_MAX_VERSION {
        return;
    }
    // SAFETY: the real resolver accepted it as a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if let Some(h) = HOOKS
        .iter()
        .find(|h| h.base.as_bytes() == name && (h.since..h.until).contains(&cuda_version))
    {
        log_at!(
            Debug,
            "cuGetProcAddress({}, {cuda_version}): internal driver pointer, matched {:?} by version",
            h.base,
            h.name
        );
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = h.hook.cast_mut() };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    boundary("cuGetProcAddress_v2", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuGetProcAddress_v2,
            fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult,
            symbol,
            pfn,
            cuda_version,
            flags,
            symbol_status
        );
        if rc == CUDA_SUCCESS && !pfn.is_null() {
            // SAFETY: pfn is non-null and the resolver filled it.
            unsafe { substitute(symbol, pfn, cuda_version) };
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    boundary("cuGetProcAddress", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuGetProcAddress,
            fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult,
            symbol,
            pfn,
            cuda_version,
            flags
        );
        if rc == CUDA_SUCCESS && !pfn.is_null() {
            // SAFETY: pfn is non-null and the resolver filled it.
            unsafe { substitute(symbol, pfn, cuda_version) };
        }
        rc
    })
}

/// What `dlsym(handle, name)` answers for a real handle, given glibc's own
/// answer `found`: the hook when `found` is the driver's own symbol of a
/// hooked name, else `found` unchanged.
pub fn answer_dlsym(name: &CStr, found: *mut c_void) -> *mut c_void {
    if found.is_null() || disabled() || !name.to_bytes().starts_with(b"cu") {
        return found;
    }
    let Some(h) = HOOKS.iter().find(|h| h.name == name) else {
        return found;
    };
    match h.real.get() {
        Some(p) if p == found => h.hook.cast_mut(),
        _ => {
            log_once!(
                Warn,
                "the program looked up {:?} in a library that is not the driver vramcap uses ({:?}); calls through it are not capped. Set VRAMCAP_CUDA_LIBRARY to the libcuda.so.1 the program loads",
                name,
                crate::real::driver_path()
            );
            found
        }
    }
}
