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
//!
//! Concurrency: the spill total is an atomic taken by compare-and-swap
//! within the limit. The deferred frees are a list under a mutex that is
//! held only to push, or to take the whole list out and put back what is
//! not ready: the events are queried with the lock released.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vramcap_core::MAX_DEVICES;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Spill as Mode;

use crate::engine::accounting::base::Base;
use crate::engine::accounting::records::{Kind, Place, Record};
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::*;
use crate::log::{log_at, log_once};

const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: c_int = 89;
const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
const CU_MEM_ADVISE_SET_ACCESSED_BY: c_int = 5;
const CU_DEVICE_CPU: CUdevice = -1;
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;

/// A stream-ordered free of a spilled pointer, waiting for its event.
struct Deferred {
    event: usize,
    ptr: CUdeviceptr,
    record: Record,
}

/// The process's spill state.
pub struct HostSpill {
    used: AtomicU64,
    limit: OnceLock<u64>,
    /// Deferred frees waiting (checked without the lock by every call that
    /// may reap).
    pending: AtomicUsize,
    deferred: Mutex<Vec<Deferred>>,
    /// 0 unknown, 1 yes, 2 no: can the device read managed memory concurrently?
    managed_ok: [AtomicU8; MAX_DEVICES],
}

impl HostSpill {
    pub fn new() -> HostSpill {
        HostSpill {
            used: AtomicU64::new(0),
            limit: OnceLock::new(),
            pending: AtomicUsize::new(0),
            deferred: Mutex::new(Vec::new()),
            managed_ok: [const { AtomicU8::new(0) }; MAX_DEVICES],
        }
    }

    fn list(&self) -> MutexGuard<'_, Vec<Deferred>> {
        // A push or an extend cannot be left half done: carry on after a panic.
        self.deferred.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limit<D: Driver>(&self, base: &Base<D>) -> u64 {
        *self.limit.get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let (pages, size) = unsafe {
                (
                    libc::sysconf(libc::_SC_PHYS_PAGES),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            let host = (pages.max(0) as u64).saturating_mul(size.max(0) as u64);
            let l = base.settings().spill_limit.resolve(host);
            log_at!(
                Info,
                "spill: {} up to {l} bytes of host memory",
                base.settings().spill.name()
            );
            l
        })
    }

    /// Takes `bytes` of the spill limit; false when they do not fit.
    pub(super) fn take<D: Driver>(&self, base: &Base<D>, bytes: u64) -> bool {
        let limit = self.limit(base);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                u.checked_add(bytes).filter(|&n| n <= limit)
            })
            .is_ok()
    }

    /// What the spill limit still allows.
    pub(super) fn room<D: Driver>(&self, base: &Base<D>) -> u64 {
        self.limit(base)
            .saturating_sub(self.used.load(Ordering::Acquire))
    }

    pub(super) fn give_back(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    fn managed_ok<D: Driver>(&self, base: &Base<D>, device: CUdevice) -> bool {
        let Some(flag) = usize::try_from(device)
            .ok()
            .and_then(|d| self.managed_ok.get(d))
        else {
            return false;
        };
        match flag.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let ok = base
                    .driver()
                    .device_attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, device)
                    .is_ok_and(|v| v != 0);
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

    /// Places `bytes` past the cap of `device` in host memory, if spill is
    /// on, the device can, and the spill limit allows. Returns the device
    /// address and the record to keep, or `None` to refuse as without
    /// spill. `managed_flags`: the program's own flags when it asked for
    /// managed memory. `soft`: placed because the allocation would pass
    /// the soft limit (said in the log), not the cap.
    #[allow(clippy::too_many_arguments)]
    pub fn place<D: Driver>(
        &self,
        base: &Base<D>,
        what: &str,
        soft: bool,
        device: CUdevice,
        ctx: usize,
        bytes: u64,
        managed_flags: Option<c_uint>,
    ) -> Option<(CUdeviceptr, Record)> {
        let mode = base.settings().spill;
        if mode == Mode::Off || bytes == 0 {
            return None;
        }
        self.reap(base);
        let mode = if managed_flags.is_some() {
            Mode::Managed
        } else if mode == Mode::Tiered {
            // What tiered spill does not take (small, pitched): pinned host memory.
            Mode::Host
        } else {
            mode
        };
        if mode == Mode::Managed && base.settings().operator.is_some() {
            // The program could prefetch managed pages onto the GPU, past
            // the operator's cap: refused as without spill.
            log_once!(
                Warn,
                "{what}: managed memory past the operator's cap is not spilled; refusing"
            );
            return None;
        }
        if mode == Mode::Managed && !self.managed_ok(base, device) {
            return None;
        }
        if !self.take(base, bytes) {
            log_once!(
                Warn,
                "{what}: the spill limit (VRAMCAP_SPILL_LIMIT) is reached too; refusing"
            );
            return None;
        }
        let size = bytes as usize;
        let placed = match mode {
            Mode::Managed => {
                let flags = managed_flags.unwrap_or(CU_MEM_ATTACH_GLOBAL);
                match base.driver().mem_alloc_managed(size, flags) {
                    Err(_) => None,
                    Ok(p) if advise_host(base.driver(), p, size, device) != CUDA_SUCCESS => {
                        // Without the advice the pages could migrate onto
                        // the GPU and pass the cap: give it back and refuse.
                        log_once!(Warn, "{what}: cuMemAdvise failed; not spilling");
                        let _ = base.driver().mem_free(p);
                        None
                    }
                    Ok(p) => Some((p, Kind::SpillManaged)),
                }
            }
            Mode::Host => match base
                .driver()
                .mem_host_alloc(size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)
            {
                Err(_) => None,
                Ok(h) => match base.driver().mem_host_get_device_pointer(h) {
                    Ok(d) => Some((d, Kind::SpillHost(h as u64))),
                    Err(_) => {
                        let _ = base.driver().mem_free_host(h);
                        None
                    }
                },
            },
            Mode::Off | Mode::Tiered => None,
        };
        let Some((ptr, kind)) = placed else {
            self.give_back(bytes);
            return None;
        };
        if let Some(s) = base.slot(device) {
            DeviceSlot::add(&s.spilled, bytes);
            DeviceSlot::add(&s.spill_allocs, 1);
            DeviceSlot::add(&s.allocs, 1);
            s.mark_active();
        }
        if soft {
            log_once!(
                Info,
                "{what}: the soft limit of device {device} (VRAMCAP_SOFT_LIMIT) is reached; spilling to host memory ({})",
                base.settings().spill.name()
            );
        } else {
            log_once!(
                Info,
                "{what}: the cap of device {device} is reached; spilling to host memory ({})",
                base.settings().spill.name()
            );
        }
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
    pub fn free<D: Driver>(&self, base: &Base<D>, ptr: CUdeviceptr, r: &Record) -> CUresult {
        let rc = match r.kind {
            Kind::SpillHost(h) => base.driver().mem_free_host(h as usize),
            Kind::TieredFreed { handle, .. } => {
                let rc = base.driver().vmm_unmap(ptr, r.bytes);
                if rc == CUDA_SUCCESS {
                    let _ = base.driver().vmm_release(handle);
                    let _ = base.driver().vmm_free_address(ptr, r.bytes);
                }
                rc
            }
            // In its own context: the background thread, which frees
            // deferred stream-ordered frees, has none.
            _ => base.free_in_ctx(ptr, r.ctx),
        };
        if rc == CUDA_SUCCESS {
            self.forget(base, r);
        }
        rc
    }

    /// Settles the counters of a spilled allocation that is gone.
    pub fn forget<D: Driver>(&self, base: &Base<D>, r: &Record) {
        if let Kind::TieredFreed {
            place: Place::Device,
            ..
        } = r.kind
        {
            base.give_back(r.device, r.bytes);
            return;
        }
        self.give_back(r.bytes);
        if let Some(s) = base.slot(CUdevice::from(r.device)) {
            s.spilled.fetch_sub(r.bytes, Ordering::Relaxed);
            DeviceSlot::add(&s.frees, 1);
        }
    }

    /// Frees a spilled pointer once `stream` reaches this point. The engine
    /// starts the background thread, which reaps.
    pub fn free_when_reached<D: Driver>(
        &self,
        base: &Base<D>,
        ptr: CUdeviceptr,
        record: Record,
        stream: usize,
        flavour: Flavour,
    ) -> CUresult {
        let event = match base.driver().event_create(CU_EVENT_DISABLE_TIMING) {
            Ok(e) => e,
            Err(rc) => return rc,
        };
        let rc = base.driver().event_record(event, stream, flavour);
        if rc != CUDA_SUCCESS {
            let _ = base.driver().event_destroy(event);
            return rc;
        }
        self.list().push(Deferred { event, ptr, record });
        self.pending.fetch_add(1, Ordering::AcqRel);
        CUDA_SUCCESS
    }

    /// Frees the deferred spilled pointers whose streams have passed the free.
    pub fn reap<D: Driver>(&self, base: &Base<D>) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut waiting = std::mem::take(&mut *self.list());
        if waiting.is_empty() {
            return;
        }
        // Only a completed event frees; anything else (not ready, an event
        // recorded in a capture) keeps waiting. Nothing allocates while no
        // event has completed: the list goes back as it was.
        let ready: Vec<Deferred> = waiting
            .extract_if(.., |d| base.driver().event_query(d.event) == CUDA_SUCCESS)
            .collect();
        if !waiting.is_empty() {
            let mut list = self.list();
            if list.is_empty() {
                *list = waiting;
            } else {
                list.append(&mut waiting);
            }
        }
        self.pending.fetch_sub(ready.len(), Ordering::AcqRel);
        for d in ready {
            let _ = base.driver().event_destroy(d.event);
            let rc = self.free(base, d.ptr, &d.record);
            if rc != CUDA_SUCCESS {
                log_once!(Warn, "a deferred free of spilled memory failed with {rc}");
                self.forget(base, &d.record);
            }
        }
    }
}

/// Keeps managed pages on the host, mapped for `device`: CUDA 13's
/// location-based advice when the driver has it, the device-number form
/// otherwise.
fn advise_host<D: Driver>(
    driver: &D,
    ptr: CUdeviceptr,
    bytes: usize,
    device: CUdevice,
) -> CUresult {
    if driver.has_mem_advise_v2() {
        let host = CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let dev = CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        };
        let rc = driver.mem_advise_v2(ptr, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host);
        if rc != CUDA_SUCCESS {
            return rc;
        }
        return driver.mem_advise_v2(ptr, bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, dev);
    }
    let rc = driver.mem_advise(
        ptr,
        bytes,
        CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        CU_DEVICE_CPU,
    );
    if rc != CUDA_SUCCESS {
        return rc;
    }
    driver.mem_advise(ptr, bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, device)
}
