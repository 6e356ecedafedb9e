//! Spill past the cap into host memory (`VRAMCAP_SPILL=managed|host`).
//!
//! Order on the allocation path: the cap is reached → the device's cache is
//! released → spill, if on and within `VRAMCAP_SPILL_LIMIT` → refuse.
//!
//! - `managed`: `cuMemAllocManaged`, then advice that its preferred location
//!   is the host and that the device accesses it (CUDA 13's location-based
//!   `cuMemAdvise_v2`, the older device-number form otherwise), so the pages
//!   stay in host memory and the device reads them over the link: the GPU's
//!   own memory never passes the cap. Only on devices with concurrent
//!   managed access; elsewhere the allocation is refused as without spill.
//! - `host`: pinned host memory mapped for the device (`cuMemHostAlloc` with
//!   `DEVICEMAP`, device address from `cuMemHostGetDevicePointer_v2`).
//!
//! Spilled bytes do not count against the device cap; they are counted in
//! the page (`spilled`, `spill_allocs`) and against the per-process spill
//! limit. Frees are routed to the matching call (`cuMemFree_v2` for managed,
//! `cuMemFreeHost` for host). A stream-ordered free of a spilled pointer is
//! deferred until the stream reaches it (an event recorded on the stream,
//! polled by later allocations and by the background thread), since the
//! driver refuses `cuMemFreeAsync` on such memory. `cuMemGetInfo` keeps
//! reporting the device cap. VMM handles and arrays cannot spill.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering};

use vramcap_core::MAX_DEVICES;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Spill;

use crate::cuda::*;
use crate::hooks::REAL;
use crate::log::{log_at, log_once};
use crate::real::call_real;
use crate::state::{Kind, Record, settings, slot};

static USED: AtomicU64 = AtomicU64::new(0);
/// Deferred frees waiting (checked without a lock on every call that may reap).
static PENDING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let host = (pages.max(0) as u64).saturating_mul(size.max(0) as u64);
        let l = settings().spill_limit.resolve(host);
        log_at!(
            Info,
            "spill: {} up to {l} bytes of host memory",
            settings().spill.name()
        );
        l
    })
}

fn take(bytes: u64) -> bool {
    let limit = limit();
    USED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
        u.checked_add(bytes).filter(|&n| n <= limit)
    })
    .is_ok()
}

fn give_back(bytes: u64) {
    let _ = USED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
        Some(u.saturating_sub(bytes))
    });
}

/// 0 unknown, 1 yes, 2 no: can `device` read managed memory concurrently?
static MANAGED_OK: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(0) }; MAX_DEVICES];
const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: c_int = 89;

fn managed_ok(device: CUdevice) -> bool {
    let Some(flag) = usize::try_from(device).ok().and_then(|d| MANAGED_OK.get(d)) else {
        return false;
    };
    match flag.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let mut v: c_int = 0;
            let rc = call_real!(
                REAL.cuDeviceGetAttribute,
                fn(*mut c_int, c_int, CUdevice) -> CUresult,
                &mut v,
                CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                device
            );
            let ok = rc == CUDA_SUCCESS && v != 0;
            flag.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            if !ok {
                log_once!(
                    Warn,
                    "device {device} has no concurrent managed access; VRAMCAP_SPILL=managed cannot spill there"
                );
            }
            ok
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: c_int,
    id: c_int,
}

const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
const CU_MEM_ADVISE_SET_ACCESSED_BY: c_int = 5;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
const CU_DEVICE_CPU: CUdevice = -1;

/// Keeps managed pages on the host, mapped for `device`.
fn advise_host(ptr: CUdeviceptr, bytes: usize, device: CUdevice) -> CUresult {
    if REAL.cuMemAdvise_v2.get().is_some() {
        let host = MemLocation {
            kind: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let dev = MemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        };
        let rc = call_real!(
            REAL.cuMemAdvise_v2,
            fn(CUdeviceptr, usize, c_int, MemLocation) -> CUresult,
            ptr,
            bytes,
            CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            host
        );
        if rc != CUDA_SUCCESS {
            return rc;
        }
        return call_real!(
            REAL.cuMemAdvise_v2,
            fn(CUdeviceptr, usize, c_int, MemLocation) -> CUresult,
            ptr,
            bytes,
            CU_MEM_ADVISE_SET_ACCESSED_BY,
            dev
        );
    }
    let rc = call_real!(
        REAL.cuMemAdvise,
        fn(CUdeviceptr, usize, c_int, CUdevice) -> CUresult,
        ptr,
        bytes,
        CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        CU_DEVICE_CPU
    );
    if rc != CUDA_SUCCESS {
        return rc;
    }
    call_real!(
        REAL.cuMemAdvise,
        fn(CUdeviceptr, usize, c_int, CUdevice) -> CUresult,
        ptr,
        bytes,
        CU_MEM_ADVISE_SET_ACCESSED_BY,
        device
    )
}

const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;

/// Places `bytes` past the cap of `device` in host memory, if spill is on,
/// the device can, and the spill limit allows. Returns the device address
/// and the record to keep, or `None` to refuse as without spill.
/// `managed_flags`: the program's own flags when it asked for managed memory.
pub fn place(
    what: &str,
    device: CUdevice,
    ctx: usize,
    bytes: u64,
    managed_flags: Option<c_uint>,
) -> Option<(CUdeviceptr, Record)> {
    let mode = settings().spill;
    if mode == Spill::Off || bytes == 0 {
        return None;
    }
    reap();
    let mode = if managed_flags.is_some() {
        Spill::Managed
    } else {
        mode
    };
    if mode == Spill::Managed && !managed_ok(device) {
        return None;
    }
    if !take(bytes) {
        log_once!(
            Warn,
            "{what}: the spill limit (VRAMCAP_SPILL_LIMIT) is reached too; refusing"
        );
        return None;
    }
    let size = bytes as usize;
    let placed = match mode {
        Spill::Managed => {
            let mut p: CUdeviceptr = 0;
            let flags = managed_flags.unwrap_or(CU_MEM_ATTACH_GLOBAL);
            let rc = call_real!(
                REAL.cuMemAllocManaged,
                fn(*mut CUdeviceptr, usize, c_uint) -> CUresult,
                &mut p,
                size,
                flags
            );
            if rc != CUDA_SUCCESS {
                None
            } else if advise_host(p, size, device) != CUDA_SUCCESS {
                // Without the advice the pages could migrate onto the GPU
                // and pass the cap: give it back and refuse.
                log_once!(Warn, "{what}: cuMemAdvise failed; not spilling");
                let _ = call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, p);
                None
            } else {
                Some((p, Kind::SpillManaged))
            }
        }
        Spill::Host => {
            let mut h: *mut c_void = std::ptr::null_mut();
            let rc = call_real!(
                REAL.cuMemHostAlloc,
                fn(*mut *mut c_void, usize, c_uint) -> CUresult,
                &mut h,
                size,
                CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
            );
            if rc != CUDA_SUCCESS {
                None
            } else {
                let mut d: CUdeviceptr = 0;
                let rc = call_real!(
                    REAL.cuMemHostGetDevicePointer_v2,
                    fn(*mut CUdeviceptr, *mut c_void, c_uint) -> CUresult,
                    &mut d,
                    h,
                    0
                );
                if rc != CUDA_SUCCESS {
                    let _ = call_real!(REAL.cuMemFreeHost, fn(*mut c_void) -> CUresult, h);
                    None
                } else {
                    Some((d, Kind::SpillHost(h as u64)))
                }
            }
        }
        Spill::Off => None,
    };
    let Some((ptr, kind)) = placed else {
        give_back(bytes);
        return None;
    };
    if let Some(s) = slot(device) {
        DeviceSlot::add(&s.spilled, bytes);
        DeviceSlot::add(&s.spill_allocs, 1);
        DeviceSlot::add(&s.allocs, 1);
        s.mark_active();
    }
    log_once!(
        Info,
        "{what}: the cap of device {device} is reached; spilling to host memory ({})",
        settings().spill.name()
    );
    log_at!(
        Debug,
        "{what}: spilled {bytes} bytes at {ptr:#x} for device {device}"
    );
    Some((
        ptr,
        Record {
            device: device as u16,
            exported: false,
            bytes,
            ctx,
            kind,
        },
    ))
}

/// Releases a spilled allocation for real; returns the driver's result.
pub fn free(ptr: CUdeviceptr, r: &Record) -> CUresult {
    let rc = match r.kind {
        Kind::SpillHost(h) => call_real!(
            REAL.cuMemFreeHost,
            fn(*mut c_void) -> CUresult,
            h as *mut c_void
        ),
        // In its own context: the background thread, which frees deferred
        // stream-ordered frees, has none.
        _ => crate::cache::free_in_ctx(ptr, r.ctx),
    };
    if rc == CUDA_SUCCESS {
        forget(r);
    }
    rc
}

/// Settles the counters of a spilled allocation that is gone.
pub fn forget(r: &Record) {
    give_back(r.bytes);
    if let Some(s) = slot(CUdevice::from(r.device)) {
        s.spilled.fetch_sub(r.bytes, Ordering::Relaxed);
        DeviceSlot::add(&s.frees, 1);
    }
}

type Deferred = Mutex<Vec<(usize, CUdeviceptr, Record)>>;

/// Stream-ordered frees of spilled pointers waiting for their streams
/// (leaked; a child after fork starts a new one, see `reset_after_fork`).
static DEFERRED: AtomicPtr<Deferred> = AtomicPtr::new(std::ptr::null_mut());

fn deferred() -> &'static Deferred {
    let p = DEFERRED.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published list is leaked and never freed.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Mutex::new(Vec::new())));
    match DEFERRED.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published; leaked for good.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never shared; `existing` is leaked for good.
            unsafe {
                drop(Box::from_raw(fresh));
                &*existing
            }
        }
    }
}

const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// Frees a spilled pointer once `stream` reaches this point.
pub fn free_when_reached(
    ptr: CUdeviceptr,
    r: Record,
    stream: *mut c_void,
    per_thread: bool,
) -> CUresult {
    let mut ev: *mut c_void = std::ptr::null_mut();
    let rc = call_real!(
        REAL.cuEventCreate,
        fn(*mut *mut c_void, c_uint) -> CUresult,
        &mut ev,
        CU_EVENT_DISABLE_TIMING
    );
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let rc = if per_thread {
        call_real!(
            REAL.cuEventRecord_ptsz,
            fn(*mut c_void, *mut c_void) -> CUresult,
            ev,
            stream
        )
    } else {
        call_real!(
            REAL.cuEventRecord,
            fn(*mut c_void, *mut c_void) -> CUresult,
            ev,
            stream
        )
    };
    if rc != CUDA_SUCCESS {
        let _ = call_real!(REAL.cuEventDestroy_v2, fn(*mut c_void) -> CUresult, ev);
        return rc;
    }
    deferred()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((ev as usize, ptr, r));
    PENDING.fetch_add(1, Ordering::AcqRel);
    crate::cache::start_thread();
    CUDA_SUCCESS
}

/// Frees the deferred spilled pointers whose streams have passed the free.
pub fn reap() {
    if PENDING.load(Ordering::Acquire) == 0 {
        return;
    }
    let ready: Vec<(usize, CUdeviceptr, Record)> = {
        let mut g = deferred().lock().unwrap_or_else(|e| e.into_inner());
        if g.is_empty() {
            return;
        }
        let mut ready = Vec::new();
        g.retain(|(ev, ptr, r)| {
            let q = call_real!(
                REAL.cuEventQuery,
                fn(*mut c_void) -> CUresult,
                *ev as *mut c_void
            );
            // Only a completed event frees; anything else (not ready, an
            // event recorded in a capture) keeps waiting.
            if q != CUDA_SUCCESS {
                true
            } else {
                ready.push((*ev, *ptr, *r));
                false
            }
        });
        ready
    };
    PENDING.fetch_sub(ready.len(), Ordering::AcqRel);
    for (ev, ptr, r) in ready {
        let _ = call_real!(
            REAL.cuEventDestroy_v2,
            fn(*mut c_void) -> CUresult,
            ev as *mut c_void
        );
        let rc = free(ptr, &r);
        if rc != CUDA_SUCCESS {
            log_once!(Warn, "a deferred free of spilled memory failed with {rc}");
            forget(&r);
        }
    }
}

/// In a child after fork: nothing spilled, nothing deferred.
pub fn reset_after_fork() {
    USED.store(0, Ordering::Release);
    PENDING.store(0, Ordering::Release);
    // The parent's list (and a lock a parent thread may hold) is left alone.
    DEFERRED.store(std::ptr::null_mut(), Ordering::Release);
}
