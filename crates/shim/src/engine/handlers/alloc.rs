//! Handlers for plain, pitched and managed device memory, its free, and the
//! memory queries; and the allocation path the other families share.
//!
//! The allocation path ([`Engine::capped_alloc`]):
//! 1. reuse a cached block when the request may have one (a hit costs no
//!    driver allocation and no reservation: its bytes are still reserved);
//! 2. reserve the estimate on the target device, releasing cached blocks
//!    when the cap would refuse;
//! 3. past the cap: spill, if on, else refuse with out-of-memory;
//! 4. call the driver (once more after releasing the cache if the driver
//!    itself is out of memory);
//! 5. settle the reservation to the size the driver chose and record it.

use std::ffi::c_uint;

use vramcap_core::budget::NO_CAP;
use vramcap_core::cache::{Block, Shape, Want};
use vramcap_core::page::DeviceSlot;

use crate::engine::Engine;
use crate::engine::accounting::Refusal;
use crate::engine::accounting::records::{Kind, Record};
use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::{log_at, log_once};

/// What an allocating handler asks for.
#[derive(Clone, Copy)]
pub enum Request {
    Plain,
    Pitch {
        width: u64,
        height: u64,
        elem: u32,
        pitch_out: *mut usize,
    },
    /// Managed memory, with the program's flags (used if it spills).
    Managed(c_uint),
    /// Stream-ordered, charged by size (`Kind::Async(None)`).
    Async,
}

/// The pitch the driver picks is not known before the call: reserve for a
/// row rounded up to 512 bytes (what current drivers use), then settle to
/// the real `pitch × height`.
fn pitch_estimate(width: u64, height: u64) -> u64 {
    width
        .checked_next_multiple_of(512)
        .and_then(|w| w.checked_mul(height))
        .unwrap_or(u64::MAX)
}

impl<D: Driver> Engine<D> {
    /// Reserves `estimate` bytes on `device`, releasing cached blocks of the
    /// device when the cap would refuse, then what pools retain
    /// ([`Base::reclaim`](crate::engine::accounting::base::Base::reclaim)).
    pub(in crate::engine) fn try_reserve_evicting(
        &'static self,
        device: CUdevice,
        estimate: u64,
    ) -> Result<(&'static DeviceSlot, u64), Option<Refusal>> {
        let Some(slot) = self.base.slot(device) else {
            log_once!(
                Error,
                "device {device} is beyond the {} devices vramcap tracks; refusing its allocations",
                vramcap_core::MAX_DEVICES
            );
            return Err(None);
        };
        let Some(limit) = self.limit_of(device) else {
            return Err(None);
        };
        self.base.context_check(device, slot, estimate, limit);
        let mut reclaimed = false;
        loop {
            match self.base.reserve_on(slot, device, estimate, limit) {
                Ok(()) => {
                    self.past_soft(slot, device, estimate);
                    return Ok((slot, limit));
                }
                Err(r) => {
                    let need = r.used.saturating_add(estimate).saturating_sub(r.limit);
                    if self.cache.evict(&self.base, device as u16, need) > 0 {
                        continue;
                    }
                    // Once per call: pools trimmed as a synchronisation
                    // would, pools, graphs and the context read again.
                    if reclaimed || self.base.reclaim(device) == 0 {
                        return Err(Some(r));
                    }
                    reclaimed = true;
                }
            }
        }
    }

    /// After a reservation of `bytes`: above the soft limit the cache gives
    /// back what passes it, and going above it counts one event.
    fn past_soft(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64) {
        let soft = slot.soft.load(std::sync::atomic::Ordering::Relaxed);
        if soft == 0 {
            return;
        }
        let used = slot.budget.used();
        if used <= soft {
            return;
        }
        if used.saturating_sub(bytes) <= soft {
            DeviceSlot::add(&slot.soft_events, 1);
            log_once!(
                Info,
                "device {device}: above the soft limit of {soft} bytes (VRAMCAP_SOFT_LIMIT): the cache gives back what passes it{}",
                if self.base.settings.spill == vramcap_core::settings::Spill::Off {
                    ""
                } else {
                    ", and allocations past it spill"
                }
            );
        }
        self.cache.evict(&self.base, device as u16, used - soft);
    }

    /// With spill on, an allocation that would take the process above its
    /// soft limit goes to host memory first; `None` when it does not (no
    /// soft limit, below it, or spill could not place it).
    ///
    /// # Safety
    /// As [`Engine::capped_alloc`]; `dptr` is non-null.
    unsafe fn spill_past_soft(
        &self,
        what: &'static str,
        dptr: *mut CUdeviceptr,
        estimate: u64,
        request: Request,
        ctx: usize,
        device: CUdevice,
    ) -> Option<CUresult> {
        if self.base.settings.spill == vramcap_core::settings::Spill::Off
            || matches!(request, Request::Pitch { .. })
        {
            return None;
        }
        let slot = self.base.slot(device)?;
        let soft = slot.soft.load(std::sync::atomic::Ordering::Relaxed);
        if soft == 0 || slot.budget.used().saturating_add(estimate) <= soft {
            return None;
        }
        let flags = match request {
            Request::Managed(f) => Some(f),
            _ => None,
        };
        let (ptr, record) = self
            .spill
            .place(&self.base, what, true, device, ctx, estimate, flags)?;
        // SAFETY: `dptr` is non-null and writable (the caller's contract).
        unsafe { *dptr = ptr };
        self.insert(ptr, record);
        Some(CUDA_SUCCESS)
    }

    /// Counts and logs a refusal; the out-of-memory code to return.
    fn refuse(&self, what: &str, device: CUdevice, bytes: u64, why: Option<Refusal>) -> CUresult {
        if let (Some(s), Some(r)) = (self.base.slot(device), why) {
            DeviceSlot::add(&s.refusals, 1);
            self.base.refused(what, device, bytes, r);
        }
        CUDA_ERROR_OUT_OF_MEMORY
    }

    /// [`Engine::try_reserve_evicting`], refusing with out-of-memory when it
    /// does not fit.
    pub(in crate::engine) fn reserve(
        &'static self,
        what: &str,
        device: CUdevice,
        estimate: u64,
    ) -> Result<(&'static DeviceSlot, u64), CUresult> {
        self.try_reserve_evicting(device, estimate)
            .map_err(|why| self.refuse(what, device, estimate, why))
    }

    /// Runs a driver allocation, once more after releasing the device's
    /// cache when the driver itself is out of memory with blocks parked there.
    pub(in crate::engine) fn call_with_retry(
        &self,
        device: CUdevice,
        mut alloc: impl FnMut() -> CUresult,
    ) -> CUresult {
        let rc = alloc();
        if rc == CUDA_ERROR_OUT_OF_MEMORY
            && self.cache.evict(&self.base, device as u16, u64::MAX) > 0
        {
            return alloc();
        }
        rc
    }

    /// The allocation path shared by the handlers that return a device
    /// address (module docs). `target` is the (context, device) the memory
    /// comes from; `None` (no current context) passes the call to the
    /// driver unchanged.
    ///
    /// # Safety
    /// `dptr` is null or writable; for a pitched request `pitch_out` is
    /// writable.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) unsafe fn capped_alloc(
        &'static self,
        what: &'static str,
        dptr: *mut CUdeviceptr,
        estimate: u64,
        request: Request,
        target: Option<(usize, CUdevice)>,
        mut alloc: impl FnMut() -> CUresult,
        actual: impl FnOnce() -> u64,
    ) -> CUresult {
        if dptr.is_null() || estimate == 0 {
            return alloc();
        }
        let Some((ctx, device)) = target else {
            // No current context: the driver's own answer, whatever it is.
            return alloc();
        };
        let dev16 = device as u16;
        // Working out the cap also sets the device's cache bound.
        if self.limit_of(device).is_none() {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if matches!(request, Request::Plain) && self.tiers.on() {
            // SAFETY: `dptr` is non-null (checked above) and writable.
            if let Some(rc) = unsafe { self.tiered_alloc(what, dptr, estimate, ctx, device) } {
                return rc;
            }
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
            Request::Managed(_) | Request::Async => None,
        };
        if let Some(want) = want.filter(|_| self.cache.caching(dev16))
            && let Some(slot) = self.base.slot(device)
        {
            if let Some(b) = self.cache.reuse(&self.base, dev16, ctx, want) {
                // SAFETY: `dptr` is non-null (checked above) and writable,
                // as is `pitch_out` (the caller's contract).
                unsafe {
                    *dptr = b.ptr;
                    if let (Request::Pitch { pitch_out, .. }, Shape::Pitch { pitch, .. }) =
                        (request, b.shape)
                    {
                        *pitch_out = pitch as usize;
                    }
                }
                slot.cached
                    .fetch_sub(b.bytes, std::sync::atomic::Ordering::Relaxed);
                DeviceSlot::add(&slot.cache_hits, 1);
                DeviceSlot::add(&slot.allocs, 1);
                self.insert(
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

        // SAFETY: `dptr` is non-null (checked above); the caller's contract.
        let soft = unsafe { self.spill_past_soft(what, dptr, estimate, request, ctx, device) };
        if let Some(rc) = soft {
            return rc;
        }
        // Counted in flight until the driver call is settled (`live.rs`).
        let _inflight = self.inflight.enter();
        let (slot, limit) = match self.try_reserve_evicting(device, estimate) {
            Ok(x) => x,
            Err(why) => {
                // SAFETY: `dptr` is non-null (checked above); the rest is
                // the caller's contract.
                return unsafe {
                    self.spill_or_refuse(what, dptr, estimate, request, ctx, device, why)
                };
            }
        };
        let rc = self.call_with_retry(device, alloc);
        if rc != CUDA_SUCCESS {
            self.base.release_on(slot, device, estimate);
            return rc;
        }
        // SAFETY: the driver succeeded, so it wrote the pointer through `dptr`.
        let ptr = unsafe { *dptr };
        let bytes = actual();
        if let Err(rc) = self.base.settle(what, device, slot, limit, estimate, bytes) {
            let _ = self.base.driver.mem_free(ptr);
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
                // SAFETY: writable (the caller's contract) and just written.
                pitch: unsafe { *pitch_out } as u64,
            }),
            Request::Managed(_) => Kind::Managed,
            Request::Async => Kind::Async(None),
        };
        self.insert(
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

    /// Past the cap: spill, if on, else refuse.
    ///
    /// # Safety
    /// As [`Engine::capped_alloc`]; `dptr` is non-null.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) unsafe fn spill_or_refuse(
        &self,
        what: &'static str,
        dptr: *mut CUdeviceptr,
        estimate: u64,
        request: Request,
        ctx: usize,
        device: CUdevice,
        why: Option<Refusal>,
    ) -> CUresult {
        let (bytes, managed_flags) = match request {
            Request::Pitch { width, height, .. } => {
                (width.next_multiple_of(512).saturating_mul(height), None)
            }
            Request::Managed(flags) => (estimate, Some(flags)),
            _ => (estimate, None),
        };
        if why.is_some()
            && let Some((ptr, record)) =
                self.spill
                    .place(&self.base, what, false, device, ctx, bytes, managed_flags)
        {
            // SAFETY: `dptr` is non-null and writable, as is `pitch_out`.
            unsafe {
                *dptr = ptr;
                if let Request::Pitch {
                    width, pitch_out, ..
                } = request
                {
                    *pitch_out = width.next_multiple_of(512) as usize;
                }
            }
            self.insert(ptr, record);
            return CUDA_SUCCESS;
        }
        self.refuse(what, device, estimate, why)
    }

    /// Records a live allocation. An address the engine still thought live
    /// was released behind its back: its old record is settled first.
    pub(in crate::engine) fn insert(&self, ptr: CUdeviceptr, record: Record) {
        if let Some(stale) = self.table.insert(ptr, record) {
            if stale.kind == Kind::Tiered {
                self.tier_forget(ptr, &stale);
            } else if matches!(stale.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
                self.spill.forget(&self.base, &stale);
            } else if let Kind::Async(Some(serial)) = stale.kind {
                self.base.pool_freed(serial);
            } else if let Some(s) = self.base.slot(CUdevice::from(stale.device)) {
                self.base
                    .release_on(s, CUdevice::from(stale.device), stale.bytes);
            }
            log_once!(
                Warn,
                "address {ptr:#x} was reused by the driver while vramcap still counted it; counting it once"
            );
        }
    }

    /// `cuMemAlloc_v2`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_alloc(
        &'static self,
        real: impl FnMut() -> CUresult,
        dptr: *mut CUdeviceptr,
        bytesize: usize,
    ) -> CUresult {
        let target = self.base.current();
        let bytes = bytesize as u64;
        // SAFETY: the driver function's contract.
        unsafe {
            self.capped_alloc(
                "cuMemAlloc",
                dptr,
                bytes,
                Request::Plain,
                target,
                real,
                || bytes,
            )
        }
    }

    /// `cuMemAllocPitch_v2`: reserved at [`pitch_estimate`], settled to the
    /// real `pitch × height`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_alloc_pitch(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element_size: c_uint,
    ) -> CUresult {
        if pitch.is_null() {
            return real();
        }
        let (width, height) = (width as u64, height as u64);
        let request = Request::Pitch {
            width,
            height,
            elem: element_size,
            pitch_out: pitch,
        };
        let target = self.base.current();
        // SAFETY: on success the driver wrote the pitch; `pitch` is non-null.
        let actual = || unsafe { *pitch as u64 }.saturating_mul(height);
        // SAFETY: the driver function's contract; `pitch` is non-null.
        unsafe {
            self.capped_alloc(
                "cuMemAllocPitch",
                dptr,
                pitch_estimate(width, height),
                request,
                target,
                real,
                actual,
            )
        }
    }

    /// `cuMemAllocManaged`: counted against the current device's cap (it can
    /// occupy that device in full) and never cached.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_alloc_managed(
        &'static self,
        real: impl FnMut() -> CUresult,
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        flags: c_uint,
    ) -> CUresult {
        let target = self.base.current();
        let bytes = bytesize as u64;
        let request = Request::Managed(flags);
        // SAFETY: the driver function's contract.
        unsafe {
            self.capped_alloc(
                "cuMemAllocManaged",
                dptr,
                bytes,
                request,
                target,
                real,
                || bytes,
            )
        }
    }

    /// `cuMemFree_v2`: a known device block goes to the cache when its
    /// device caches; anything else is freed for real. The record leaves the
    /// table before the real free: once the driver has freed the address,
    /// another thread may be handed it and record it anew. The bytes return
    /// to the budget only after the driver has released them.
    pub fn mem_free(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        dptr: CUdeviceptr,
    ) -> CUresult {
        if dptr == 0 {
            return real();
        }
        self.spill.reap(&self.base);
        let Some((_, r)) = self.table.remove(&dptr) else {
            return self.free_unknown(real, dptr);
        };
        if r.kind == Kind::Tiered {
            let rc = self.tier_free(dptr, &r);
            if rc != CUDA_SUCCESS {
                self.table.insert(dptr, r);
            }
            return rc;
        }
        if matches!(r.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
            let rc = self.spill.free(&self.base, dptr, &r);
            if rc != CUDA_SUCCESS {
                self.table.insert(dptr, r);
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
            if self.cache.keep(&self.base, r.device, block) {
                if let Some(s) = self.base.slot(CUdevice::from(r.device)) {
                    DeviceSlot::add(&s.frees, 1);
                }
                self.start_worker(); // releases idle blocks
                return CUDA_SUCCESS;
            }
        }
        let rc = real();
        if rc == CUDA_SUCCESS {
            self.freed(&r);
        } else {
            self.table.insert(dptr, r);
        }
        rc
    }

    /// The driver freed the allocation of `r`: its bytes go back, except
    /// a stream-ordered allocation charged through its pool, which keeps
    /// the memory (`held.rs`).
    pub(in crate::engine) fn freed(&self, r: &Record) {
        match r.kind {
            Kind::Async(Some(serial)) => {
                if let Some(s) = self.base.slot(CUdevice::from(r.device)) {
                    DeviceSlot::add(&s.frees, 1);
                }
                self.base.pool_freed(serial);
            }
            _ => self.base.give_back(r.device, r.bytes),
        }
    }

    /// A free of an address the engine holds no record of. One the cache
    /// holds was freed by the program already: a second free is answered
    /// as the driver answers a free of a freed address, and changes
    /// nothing (freeing it for real would let the cache hand out memory the
    /// driver may give to someone else). Anything else is the driver's.
    pub(in crate::engine) fn free_unknown(
        &self,
        mut real: impl FnMut() -> CUresult,
        dptr: CUdeviceptr,
    ) -> CUresult {
        if self.cache.holds(dptr) {
            log_once!(
                Warn,
                "a free of {dptr:#x}, which the program had freed already; answered CUDA_ERROR_INVALID_VALUE as the driver does"
            );
            return CUDA_ERROR_INVALID_VALUE;
        }
        real()
    }

    /// `cuMemGetInfo_v2`: the caps' picture of the current device
    /// ([`Base::picture`](crate::engine::accounting::base::Base::picture)).
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_get_info(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        free: *mut usize,
        total: *mut usize,
    ) -> CUresult {
        let rc = real();
        if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return rc;
        }
        let Some((_, device)) = self.base.current() else {
            return rc;
        };
        let (Some(s), Some(_)) = (self.base.slot(device), self.limit_of(device)) else {
            return rc;
        };
        // What the pools and graphs hold may have shrunk at a synchronisation.
        self.base.pools_refresh(Some(device as u16));
        if let Some(limit) = self.base.cap_in_force(s, device) {
            self.base.context_check(device, s, 0, limit);
        }
        self.base.graphs_refresh(device);
        // SAFETY: both pointers are non-null and the driver just wrote them.
        unsafe {
            let (t, f) = self.base.picture(s, device, *total as u64, *free as u64);
            *total = usize::try_from(t).unwrap_or(usize::MAX);
            *free = usize::try_from(f).unwrap_or(usize::MAX);
        }
        rc
    }

    /// `cuDeviceTotalMem_v2`: at most the cap.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn device_total_mem(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        bytes: *mut usize,
        dev: CUdevice,
    ) -> CUresult {
        let rc = real();
        if rc != CUDA_SUCCESS || bytes.is_null() {
            return rc;
        }
        if let Some(limit) = self.limit_of(dev)
            && limit != NO_CAP
        {
            // SAFETY: non-null and just written by the driver.
            unsafe { *bytes = (*bytes).min(usize::try_from(limit).unwrap_or(usize::MAX)) };
        }
        rc
    }
}
