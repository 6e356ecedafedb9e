//! Handlers for plain, pitched and managed device memory, its free, and the
//! memory queries.
//!
//! The allocation path they share is `allocate.rs`.

use std::ffi::c_uint;

use vramcap_core::budget::NO_CAP;
use vramcap_core::cache::Block;
use vramcap_core::page::DeviceSlot;

use crate::engine::Engine;
use crate::engine::accounting::records::{Kind, Record};
use crate::engine::driver::Driver;
use crate::engine::handlers::allocate::{Made, Request};
use crate::ffi::*;
use crate::log::log_once;

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
    /// With spill on, an allocation that would take the process above its
    /// soft limit goes to host memory first; `None` when it does not (no
    /// soft limit, below it, or spill could not place it).
    pub(in crate::engine) fn spill_past_soft(
        &self,
        what: &'static str,
        estimate: u64,
        request: Request,
        ctx: usize,
        device: CUdevice,
    ) -> Option<Result<Made, CUresult>> {
        // Managed memory is never spilled (docs/design/spill-modes.md).
        if self.base.settings().spill == vramcap_core::settings::Spill::Off
            || matches!(request, Request::Pitch { .. } | Request::Managed)
        {
            return None;
        }
        let slot = self.base.slot(device)?;
        let soft = slot.soft.load(std::sync::atomic::Ordering::Relaxed);
        if soft == 0 || slot.budget.used().saturating_add(estimate) <= soft {
            return None;
        }
        let (ptr, record) = self
            .spill
            .place(&self.base, what, true, device, ctx, estimate)?;
        self.insert(ptr, record);
        Some(Ok(Made::at(ptr)))
    }

    /// `cuMemAlloc_v2` of `bytes`: `real` makes the real call and answers
    /// the address it made (the boundary reads and writes the caller's
    /// pointer, `boundary/allocs.rs`).
    pub fn mem_alloc(
        &'static self,
        real: impl FnMut() -> Result<Made, CUresult>,
        bytes: u64,
    ) -> Result<Made, CUresult> {
        let target = self.base.current();
        self.capped_alloc("cuMemAlloc", bytes, Request::Plain, target, real, |_| bytes)
    }

    /// `cuMemAllocPitch_v2`: reserved at [`pitch_estimate`], settled to the
    /// real `pitch × height`.
    pub fn mem_alloc_pitch(
        &'static self,
        real: impl FnMut() -> Result<Made, CUresult>,
        width: u64,
        height: u64,
        element_size: c_uint,
    ) -> Result<Made, CUresult> {
        let request = Request::Pitch {
            width,
            height,
            elem: element_size,
        };
        let target = self.base.current();
        self.capped_alloc(
            "cuMemAllocPitch",
            pitch_estimate(width, height),
            request,
            target,
            real,
            |made| made.pitch.saturating_mul(height),
        )
    }

    /// `cuMemAllocManaged`: counted against the current device's cap (it can
    /// occupy that device in full), never cached and never spilled: past the
    /// cap it is refused in every mode (docs/design/spill-modes.md).
    pub fn mem_alloc_managed(
        &'static self,
        real: impl FnMut() -> Result<Made, CUresult>,
        bytes: u64,
    ) -> Result<Made, CUresult> {
        let target = self.base.current();
        let request = Request::Managed;
        self.capped_alloc("cuMemAllocManaged", bytes, request, target, real, |_| bytes)
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
        if matches!(r.kind, Kind::SpillHost(_)) {
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

    /// `cuMemGetInfo_v2`'s figures as the cap shows them: the driver's
    /// `free` and `total` on the current device in, the (free, total) to
    /// answer out; `None` to leave the driver's (no context, no cap worked
    /// out). The boundary reads and writes the caller's pointers
    /// (`boundary/queries.rs`).
    pub fn mem_info(&'static self, free: u64, total: u64) -> Option<(u64, u64)> {
        let (_, device) = self.base.current()?;
        let (Some(s), Some(_)) = (self.base.slot(device), self.limit_of(device)) else {
            return None;
        };
        // What the pools and graphs hold may have shrunk at a synchronisation.
        self.base.pools_refresh(Some(device as u16));
        if let Some(limit) = self.base.cap_in_force(s, device) {
            self.base.context_check(device, s, 0, limit);
        }
        self.base.graphs_refresh(device);
        let (t, f) = self.base.picture(s, device, total, free);
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
