//! Spill past the cap into host memory (`VRAMCAP_SPILL=host`, and what
//! tiered spill does not take).
//!
//! Order on the allocation path: the cap is reached → the device's cache is
//! released → spill, if on and within `VRAMCAP_SPILL_LIMIT` → refuse.
//! Spilled memory is pinned host memory mapped for the device
//! (`cuMemHostAlloc` with `DEVICEMAP`, device address from
//! `cuMemHostGetDevicePointer_v2`): the program cannot move it onto the GPU.
//! There is no managed placement, and the program's own managed memory is
//! never spilled (docs/design/spill-modes.md).
//!
//! Spilled bytes do not count against the device cap; they are counted in
//! the page (`spilled`, `spill_allocs`) and against the per-process spill
//! limit. Frees go to `cuMemFreeHost`. A stream-ordered free of a spilled pointer is
//! deferred until the stream reaches it (an event recorded on the stream,
//! polled by later allocations and by the background thread), since the
//! driver refuses `cuMemFreeAsync` on such memory. `cuMemGetInfo` keeps
//! reporting the device cap. VMM handles and arrays cannot spill.
//!
//! Concurrency: the spill total is an atomic taken by compare-and-swap
//! within the limit. The deferred frees are a list under a mutex that is
//! held only to push, or to take the whole list out and put back what is
//! not ready: the events are queried with the lock released.

use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Settings;
use vramcap_core::settings::Spill as Mode;

use crate::engine::accounting::records::{Kind, Place, Record};
use crate::engine::accounting::state::Accounting;
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::*;
use crate::log::{log_at, log_once};

const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;

/// A stream-ordered free of a spilled pointer, waiting for its event.
struct Deferred {
    event: usize,
    ptr: CUdeviceptr,
    record: Record,
}

/// The process's spill state.
pub struct HostSpill {
    /// The settings, handed in once: the mode and the spill limit.
    settings: &'static Settings,
    used: AtomicU64,
    limit: OnceLock<u64>,
    /// Deferred frees waiting (checked without the lock by every call that
    /// may reap).
    pending: AtomicUsize,
    deferred: Mutex<Vec<Deferred>>,
}

impl HostSpill {
    pub fn new(settings: &'static Settings) -> HostSpill {
        HostSpill {
            settings,
            used: AtomicU64::new(0),
            limit: OnceLock::new(),
            pending: AtomicUsize::new(0),
            deferred: Mutex::new(Vec::new()),
        }
    }

    fn list(&self) -> MutexGuard<'_, Vec<Deferred>> {
        // A push or an extend cannot be left half done: carry on after a panic.
        self.deferred.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limit(&self) -> u64 {
        *self.limit.get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let (pages, size) = unsafe {
                (
                    libc::sysconf(libc::_SC_PHYS_PAGES),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            let host = (pages.max(0) as u64).saturating_mul(size.max(0) as u64);
            let l = self.settings.spill_limit.resolve(host);
            match self.settings.spill {
                // Only parking's moves (`VRAMCAP_PARK_MOVE=shim`) use it.
                vramcap_core::settings::Spill::Off => log_at!(
                    Info,
                    "parking: up to {l} bytes of host memory for parked blocks (VRAMCAP_SPILL_LIMIT)"
                ),
                mode => log_at!(
                    Info,
                    "spill: {} up to {l} bytes of host memory",
                    mode.name()
                ),
            }
            l
        })
    }

    /// Takes `bytes` of the spill limit; false when they do not fit.
    pub(super) fn take(&self, bytes: u64) -> bool {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                u.checked_add(bytes).filter(|&n| n <= limit)
            })
            .is_ok()
    }

    /// What the spill limit still allows.
    pub(super) fn room(&self) -> u64 {
        self.limit()
            .saturating_sub(self.used.load(Ordering::Acquire))
    }

    pub(super) fn give_back(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    /// Places `bytes` past the cap of `device` in host memory (for context
    /// `ctx`), if spill is on and the spill limit allows. Returns the
    /// device address and the record to keep, or `None` to refuse as
    /// without spill. `soft`: placed because the allocation would pass the
    /// soft limit (said in the log), not the cap.
    pub fn place<D: Driver>(
        &self,
        driver: &D,
        accounting: &Accounting<D>,
        (what, soft): (&str, bool),
        (device, ctx): (CUdevice, usize),
        bytes: u64,
    ) -> Option<(CUdeviceptr, Record)> {
        if self.settings.spill == Mode::Off || bytes == 0 {
            return None;
        }
        self.reap(driver, accounting);
        if !self.take(bytes) {
            log_once!(
                Warn,
                "{what}: the spill limit (VRAMCAP_SPILL_LIMIT) is reached too; refusing"
            );
            return None;
        }
        // Under tiered spill too: what tiered spill does not take (small,
        // pitched) is pinned host memory.
        let placed = match driver.mem_host_alloc(
            bytes as usize,
            CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP,
        ) {
            Err(_) => None,
            Ok(h) => match driver.mem_host_get_device_pointer(h) {
                Ok(d) => Some((d, Kind::SpillHost(h as u64))),
                Err(_) => {
                    let _ = driver.mem_free_host(h);
                    None
                }
            },
        };
        let Some((ptr, kind)) = placed else {
            self.give_back(bytes);
            return None;
        };
        if let Some(s) = accounting.slot(device) {
            DeviceSlot::add(&s.spilled, bytes);
            DeviceSlot::add(&s.spill_allocs, 1);
            DeviceSlot::add(&s.allocs, 1);
            s.mark_active();
        }
        if soft {
            log_once!(
                Info,
                "{what}: the soft limit of device {device} (VRAMCAP_SOFT_LIMIT) is reached; spilling to host memory ({})",
                self.settings.spill.name()
            );
        } else {
            log_once!(
                Info,
                "{what}: the cap of device {device} is reached; spilling to host memory ({})",
                self.settings.spill.name()
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
    pub fn free<D: Driver>(
        &self,
        driver: &D,
        accounting: &Accounting<D>,
        ptr: CUdeviceptr,
        r: &Record,
    ) -> CUresult {
        let rc = match r.kind {
            Kind::SpillHost(h) => driver.mem_free_host(h as usize),
            Kind::TieredFreed { handle, .. } => {
                let rc = driver.vmm_unmap(ptr, r.bytes);
                if rc == CUDA_SUCCESS {
                    let _ = driver.vmm_release(handle);
                    let _ = driver.vmm_free_address(ptr, r.bytes);
                }
                rc
            }
            // In its own context: the background thread, which frees
            // deferred stream-ordered frees, has none.
            _ => accounting.free_in_ctx(ptr, r.ctx),
        };
        if rc == CUDA_SUCCESS {
            self.forget(accounting, r);
        }
        rc
    }

    /// Settles the counters of a spilled allocation that is gone.
    pub fn forget<D: Driver>(&self, accounting: &Accounting<D>, r: &Record) {
        if let Kind::TieredFreed {
            place: Place::Device,
            ..
        } = r.kind
        {
            accounting.give_back(r.device, r.bytes);
            return;
        }
        self.give_back(r.bytes);
        if let Some(s) = accounting.slot(CUdevice::from(r.device)) {
            s.spilled.fetch_sub(r.bytes, Ordering::Relaxed);
            DeviceSlot::add(&s.frees, 1);
        }
    }

    /// Frees a spilled pointer once `stream` reaches this point. The engine
    /// starts the background thread, which reaps.
    pub fn free_when_reached<D: Driver>(
        &self,
        driver: &D,
        ptr: CUdeviceptr,
        record: Record,
        stream: usize,
        flavour: Flavour,
    ) -> CUresult {
        let event = match driver.event_create(CU_EVENT_DISABLE_TIMING) {
            Ok(e) => e,
            Err(rc) => return rc,
        };
        let rc = driver.event_record(event, stream, flavour);
        if rc != CUDA_SUCCESS {
            let _ = driver.event_destroy(event);
            return rc;
        }
        self.list().push(Deferred { event, ptr, record });
        self.pending.fetch_add(1, Ordering::AcqRel);
        CUDA_SUCCESS
    }

    /// Frees the deferred spilled pointers whose streams have passed the free.
    pub fn reap<D: Driver>(&self, driver: &D, accounting: &Accounting<D>) {
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
            .extract_if(.., |d| driver.event_query(d.event) == CUDA_SUCCESS)
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
            let _ = driver.event_destroy(d.event);
            let rc = self.free(driver, accounting, d.ptr, &d.record);
            if rc != CUDA_SUCCESS {
                log_once!(Warn, "a deferred free of spilled memory failed with {rc}");
                self.forget(accounting, &d.record);
            }
        }
    }
}
