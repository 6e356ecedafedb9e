//! The hooks that allocate, free and report device memory.

#![allow(non_snake_case)]

use std::ffi::{c_uint, c_void};
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::cache::{Block, Shape, Want};
use vramcap_core::page::DeviceSlot;

use crate::cuda::*;
use crate::hooks::{REAL, boundary, disabled};
use crate::log::{log_at, log_once};
use crate::real::call_real;
use crate::state::{Kind, Record, limit_of, slot, table};
use crate::state::{held_on, release_on, reserve_on};
use crate::{cache, spill};

/// The calling thread's current context and its device.
pub fn current() -> Option<(usize, CUdevice)> {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let rc = call_real!(
        REAL.cuCtxGetCurrent,
        fn(*mut *mut c_void) -> CUresult,
        &mut ctx
    );
    if rc != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let mut dev: CUdevice = 0;
    let rc = call_real!(REAL.cuCtxGetDevice, fn(*mut CUdevice) -> CUresult, &mut dev);
    (rc == CUDA_SUCCESS).then_some((ctx as usize, dev))
}

/// What an allocating hook asks for.
#[derive(Clone, Copy)]
pub(crate) enum Request {
    Plain,
    Pitch {
        width: u64,
        height: u64,
        elem: u32,
        pitch_out: *mut usize,
    },
    Managed,
    Async,
}

/// Why a reservation did not fit.
pub struct NoRoom {
    used: u64,
    limit: u64,
}

/// Reserves `estimate` bytes on `device`, releasing cached blocks of the
/// device when the cap would refuse.
fn try_reserve_evicting(
    device: CUdevice,
    estimate: u64,
) -> Result<(&'static DeviceSlot, u64), Option<NoRoom>> {
    let Some(slot) = slot(device) else {
        log_once!(
            Error,
            "device {device} is beyond the {} devices vramcap tracks; refusing its allocations",
            vramcap_core::MAX_DEVICES
        );
        return Err(None);
    };
    let Some(limit) = limit_of(device) else {
        return Err(None);
    };
    loop {
        match reserve_on(slot, device, estimate, limit) {
            Ok(()) => return Ok((slot, limit)),
            Err(r) => {
                let need = r.used.saturating_add(estimate).saturating_sub(limit);
                if cache::evict(device as u16, need) == 0 {
                    return Err(Some(NoRoom {
                        used: r.used,
                        limit,
                    }));
                }
            }
        }
    }
}

/// Counts and logs a refusal; the out-of-memory code to return.
fn refuse(what: &str, device: CUdevice, bytes: u64, why: Option<NoRoom>) -> CUresult {
    if let (Some(s), Some(n)) = (slot(device), why) {
        DeviceSlot::add(&s.refusals, 1);
        refused(what, device, bytes, n.used, n.limit);
    }
    CUDA_ERROR_OUT_OF_MEMORY
}

/// [`try_reserve_evicting`], refusing with out-of-memory when it does not fit.
pub fn reserve(
    what: &str,
    device: CUdevice,
    estimate: u64,
) -> Result<(&'static DeviceSlot, u64), CUresult> {
    try_reserve_evicting(device, estimate).map_err(|why| refuse(what, device, estimate, why))
}

/// Settles a reservation of `estimate` to the `actual` size the driver
/// chose. When the extra bytes do not fit, returns the refusal and leaves
/// the whole reservation released; the caller frees what it got.
pub fn settle(
    what: &str,
    device: CUdevice,
    slot: &DeviceSlot,
    limit: u64,
    estimate: u64,
    actual: u64,
) -> Result<(), CUresult> {
    if actual > estimate {
        if let Err(r) = reserve_on(slot, device, actual - estimate, limit) {
            release_on(slot, device, estimate);
            DeviceSlot::add(&slot.refusals, 1);
            refused(what, device, actual, r.used, limit);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    } else {
        release_on(slot, device, estimate - actual);
    }
    Ok(())
}

/// Runs a driver allocation, once more after releasing the device's cache
/// when the driver itself is out of memory with blocks parked there.
pub fn call_with_retry(device: CUdevice, mut alloc: impl FnMut() -> CUresult) -> CUresult {
    let rc = alloc();
    if rc == CUDA_ERROR_OUT_OF_MEMORY && cache::evict(device as u16, u64::MAX) > 0 {
        return alloc();
    }
    rc
}

/// The allocation path shared by the hooks that return a device address:
/// 1. reuse a cached block when the request may have one (a hit costs no
///    driver allocation and no reservation: its bytes are still reserved);
/// 2. reserve `estimate` bytes on `target`'s device, releasing cached
///    blocks when the cap would refuse;
/// 3. call the driver (once more after releasing the cache if the driver
///    itself is out of memory);
/// 4. settle the reservation to the `actual` size the driver chose and
///    record the allocation.
///
/// `target` is the (context, device) the memory comes from; `None` (no
/// current context) passes the call to the driver unchanged.
pub(crate) fn capped_alloc(
    what: &'static str,
    dptr: *mut CUdeviceptr,
    estimate: u64,
    request: Request,
    target: Option<(usize, CUdevice)>,
    alloc: impl FnMut() -> CUresult,
    actual: impl FnOnce() -> u64,
) -> CUresult {
    capped_alloc_flags(what, dptr, estimate, request, target, alloc, actual, 1)
}

/// [`capped_alloc`] with the flags of a managed request (used if it spills).
#[allow(clippy::too_many_arguments)]
pub(crate) fn capped_alloc_flags(
    what: &'static str,
    dptr: *mut CUdeviceptr,
    estimate: u64,
    request: Request,
    target: Option<(usize, CUdevice)>,
    alloc: impl FnMut() -> CUresult,
    actual: impl FnOnce() -> u64,
    managed_flags: c_uint,
) -> CUresult {
    let mut alloc = alloc;
    if disabled() || dptr.is_null() || estimate == 0 {
        return alloc();
    }
    let Some((ctx, device)) = target else {
        // No current context: the driver's own answer, whatever it is.
        return alloc();
    };
    let dev16 = device as u16;
    // Working out the cap also sets the device's cache bound.
    if limit_of(device).is_none() {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let want = match request {
        Request::Plain => Some(Want::Plain { bytes: estimate }),
        Request::Pitch {
            width,
            height,
            elem,
            ..
        } => Some(Want::Pitch {
            width,
            height,
            elem,
        }),
        Request::Managed | Request::Async => None,
    };
    if let Some(want) = want.filter(|_| cache::caching(dev16))
        && let Some(slot) = slot(device)
    {
        if let Some(b) = cache::reuse(dev16, ctx, want) {
            // SAFETY: `dptr` is non-null (checked above); `pitch_out` was
            // checked non-null by the pitch hook.
            unsafe {
                *dptr = b.ptr;
                if let (Request::Pitch { pitch_out, .. }, Shape::Pitch { pitch, .. }) =
                    (request, b.shape)
                {
                    *pitch_out = pitch as usize;
                }
            }
            slot.cached.fetch_sub(b.bytes, Ordering::Relaxed);
            DeviceSlot::add(&slot.cache_hits, 1);
            DeviceSlot::add(&slot.allocs, 1);
            insert(
                b.ptr,
                Record {
                    device: dev16,
                    exported: false,
                    bytes: b.bytes,
                    ctx,
                    kind: Kind::Device(b.shape),
                },
            );
            log_at!(
                Debug,
                "{what}: {} bytes at {:#x} on device {device} from the cache",
                b.bytes,
                b.ptr
            );
            return CUDA_SUCCESS;
        }
        DeviceSlot::add(&slot.cache_misses, 1);
    }

    let (slot, limit) = match try_reserve_evicting(device, estimate) {
        Ok(x) => x,
        Err(why) => {
            // Past the cap: spill, if on, else refuse.
            let (bytes, managed_flags) = match request {
                Request::Pitch { width, height, .. } => {
                    (width.next_multiple_of(512).saturating_mul(height), None)
                }
                Request::Managed => (estimate, Some(managed_flags)),
                _ => (estimate, None),
            };
            if why.is_some()
                && let Some((ptr, record)) = spill::place(what, device, ctx, bytes, managed_flags)
            {
                // SAFETY: `dptr` is non-null; `pitch_out` checked by the pitch hook.
                unsafe {
                    *dptr = ptr;
                    if let Request::Pitch {
                        width, pitch_out, ..
                    } = request
                    {
                        *pitch_out = width.next_multiple_of(512) as usize;
                    }
                }
                insert(ptr, record);
                return CUDA_SUCCESS;
            }
            return refuse(what, device, estimate, why);
        }
    };
    let rc = call_with_retry(device, alloc);
    if rc != CUDA_SUCCESS {
        release_on(slot, device, estimate);
        return rc;
    }
    // SAFETY: the driver succeeded, so it wrote the pointer through `dptr`.
    let ptr = unsafe { *dptr };
    let bytes = actual();
    if let Err(rc) = settle(what, device, slot, limit, estimate, bytes) {
        let _ = call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, ptr);
        return rc;
    }
    DeviceSlot::add(&slot.allocs, 1);
    let kind = match request {
        Request::Plain => Kind::Device(Shape::Plain),
        Request::Pitch {
            width,
            height,
            elem,
            pitch_out,
        } => Kind::Device(Shape::Pitch {
            width,
            height,
            elem,
            // SAFETY: non-null (checked by the pitch hook) and just written.
            pitch: unsafe { *pitch_out } as u64,
        }),
        Request::Managed => Kind::Managed,
        Request::Async => Kind::Async,
    };
    insert(
        ptr,
        Record {
            device: dev16,
            exported: false,
            bytes,
            ctx,
            kind,
        },
    );
    log_at!(
        Debug,
        "{what}: {bytes} bytes at {ptr:#x} on device {device}"
    );
    rc
}

pub(crate) fn insert(ptr: CUdeviceptr, record: Record) {
    if let Some(stale) = table().insert(ptr, record) {
        // The driver handed out an address the shim still thought was live:
        // it was released behind the shim's back.
        if matches!(stale.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
            spill::forget(&stale);
        } else if let Some(s) = slot(CUdevice::from(stale.device)) {
            release_on(s, CUdevice::from(stale.device), stale.bytes);
        }
        log_once!(
            Warn,
            "address {ptr:#x} was reused by the driver while vramcap still counted it; counting it once"
        );
    }
}

pub(crate) fn refused(what: &str, device: CUdevice, bytes: u64, used: u64, limit: u64) {
    match crate::state::settings().group.as_deref() {
        Some(g) => log_once!(
            Warn,
            "{what}: refused {bytes} bytes on device {device}: group {g:?} holds {used} of its {limit}-byte budget (VRAMCAP_GROUP, VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
        ),
        None => log_once!(
            Warn,
            "{what}: refused {bytes} bytes on device {device}: {used} of the {limit}-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
        ),
    }
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
            Request::Plain,
            current(),
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
        let real = || {
            call_real!(
                REAL.cuMemAllocPitch_v2,
                fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
                dptr,
                pitch,
                width,
                height,
                element_size
            )
        };
        if pitch.is_null() {
            return real();
        }
        let estimate = (width as u64)
            .checked_next_multiple_of(512)
            .and_then(|w| w.checked_mul(height as u64))
            .unwrap_or(u64::MAX);
        capped_alloc(
            "cuMemAllocPitch",
            dptr,
            estimate,
            Request::Pitch {
                width: width as u64,
                height: height as u64,
                elem: element_size,
                pitch_out: pitch,
            },
            current(),
            real,
            // SAFETY: on success the driver wrote the pitch; `pitch` is non-null.
            || unsafe { *pitch as u64 }.saturating_mul(height as u64),
        )
    })
}

/// Managed memory is counted against the current device's cap (it can
/// occupy that device in full) and never cached.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    boundary("cuMemAllocManaged", CUDA_ERROR_OUT_OF_MEMORY, || {
        capped_alloc_flags(
            "cuMemAllocManaged",
            dptr,
            bytesize as u64,
            Request::Managed,
            current(),
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
            flags,
        )
    })
}

/// A known device block goes to the cache when its device caches; anything
/// else is freed for real. The record leaves the table before the real free:
/// once the driver has freed the address, another thread may be handed it
/// and record it anew. The bytes return to the budget only after the driver
/// has released them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let real = || call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, dptr);
    boundary("cuMemFree_v2", CUDA_ERROR_NOT_FOUND, || {
        if dptr == 0 || disabled() {
            return real();
        }
        spill::reap();
        let Some((_, r)) = table().remove(&dptr) else {
            return real();
        };
        if matches!(r.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
            let rc = spill::free(dptr, &r);
            if rc != CUDA_SUCCESS {
                table().insert(dptr, r);
            }
            return rc;
        }
        if let (Kind::Device(shape), false) = (r.kind, r.exported) {
            let block = Block {
                ptr: dptr,
                bytes: r.bytes,
                ctx: r.ctx,
                shape,
                ticket: 0,
                freed_ns: 0,
            };
            if cache::keep(r.device, block) {
                if let Some(s) = slot(CUdevice::from(r.device)) {
                    DeviceSlot::add(&s.frees, 1);
                }
                return CUDA_SUCCESS;
            }
        }
        let rc = real();
        if rc == CUDA_SUCCESS {
            if let Some(s) = slot(CUdevice::from(r.device)) {
                DeviceSlot::add(&s.frees, 1);
                if !release_on(s, CUdevice::from(r.device), r.bytes) {
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
        rc
    })
}

/// Free and total as the cap sees them: total = min(cap, real total); free =
/// min(real free + cached, cap − (held − cached)), never below zero: cached
/// blocks are this process's to reuse.
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
        let Some((_, device)) = current() else {
            return rc;
        };
        let (Some(s), Some(limit)) = (slot(device), limit_of(device)) else {
            return rc;
        };
        let cached = usize::try_from(s.cached.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        // SAFETY: both pointers are non-null and the driver just wrote them.
        unsafe {
            let mut f = (*free).saturating_add(cached).min(*total);
            if limit != NO_CAP {
                let cap = usize::try_from(limit).unwrap_or(usize::MAX);
                let held = held_on(s, device).saturating_sub(cached as u64);
                let room = usize::try_from(limit.saturating_sub(held)).unwrap_or(usize::MAX);
                *total = (*total).min(cap);
                f = f.min(room);
            }
            *free = f.min(*total);
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
            // SAFETY: non-null and just written by the driver.
            unsafe { *bytes = (*bytes).min(usize::try_from(limit).unwrap_or(usize::MAX)) };
        }
        rc
    })
}
