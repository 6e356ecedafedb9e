//! Handlers for stream-ordered allocation, memory pools and graph memory.
//!
//! Under `VRAMCAP_COUNT=held` (the default) a stream-ordered allocation is
//! charged through its pool: by what the pool grows, not by its size, and
//! its free changes nothing, since the pool keeps the memory; the pool's
//! charge follows the reserve the driver reports (the rules are in
//! `held.rs`). Under `VRAMCAP_COUNT=allocations` (or for a pool the driver
//! will not describe) each allocation is counted when it is made, on its
//! stream's device, and given back when its free is *issued*.
//!
//! Allocations made while their stream is being captured are graph memory
//! nodes: the driver allocates them when the graph is uploaded or
//! launched, which is where graph memory is charged (`held.rs`). A free of
//! a pointer the engine does not know (another pool's, or a captured one)
//! goes to the driver unchanged. The allocations belong to the device's
//! pool, not to a context: they stay counted when their context is
//! destroyed or reset, as the driver keeps them, until they are freed.

use std::ffi::{c_int, c_void};

use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Counting;

use super::on_success;
use crate::engine::Engine;
use crate::engine::accounting::records::{Kind, Place, Record};
use crate::engine::driver::{Driver, Flavour};
use crate::engine::pipeline::{Made, Request};
use crate::ffi::*;
use crate::log::log_at;

impl<D: Driver> Engine<D> {
    /// The (context, device) a stream's allocations come from; `None` when
    /// the stream is being captured (the call then goes to the driver
    /// uncounted) or there is no current context.
    pub(in crate::engine) fn stream_target(
        &self,
        stream: usize,
        flavour: Flavour,
    ) -> Option<(usize, CUdevice)> {
        let (ctx, cur_dev) = self.accounting.current()?;
        if self.accounting.capturing()
            && self
                .driver
                .stream_is_capturing(stream, flavour)
                .is_ok_and(|status| status != 0)
        {
            return None;
        }
        let dev = self
            .driver
            .stream_get_device(stream, flavour)
            .unwrap_or(cur_dev);
        Some((ctx, dev))
    }

    /// `cuMemAllocAsync[_ptsz]` of `size` bytes on `stream`: `real` makes
    /// the real call and answers the address it made (the boundary reads
    /// and writes the caller's pointer, `boundary/allocs.rs`).
    pub fn mem_alloc_async(
        &'static self,
        flavour: Flavour,
        real: impl FnMut() -> Result<Made, CUresult>,
        size: usize,
        stream: CUstream,
    ) -> Result<Made, CUresult> {
        let what = ["cuMemAllocAsync", "cuMemAllocAsync_ptsz"];
        self.alloc_on_stream(what, flavour, real, size, None, stream)
    }

    /// `cuMemAllocFromPoolAsync[_ptsz]`: as [`Engine::mem_alloc_async`].
    pub fn mem_alloc_from_pool_async(
        &'static self,
        flavour: Flavour,
        real: impl FnMut() -> Result<Made, CUresult>,
        size: usize,
        pool: *mut c_void,
        stream: CUstream,
    ) -> Result<Made, CUresult> {
        let what = ["cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"];
        let pool = (!pool.is_null()).then_some(pool as usize);
        self.alloc_on_stream(what, flavour, real, size, pool, stream)
    }

    /// A stream-ordered allocation of `size` bytes on `stream`'s device;
    /// `what` names the legacy and the per-thread variant.
    fn alloc_on_stream(
        &'static self,
        what: [&'static str; 2],
        flavour: Flavour,
        mut real: impl FnMut() -> Result<Made, CUresult>,
        size: usize,
        pool: Option<usize>,
        stream: CUstream,
    ) -> Result<Made, CUresult> {
        let what = what[usize::from(flavour == Flavour::PerThread)];
        let target = self.stream_target(stream as usize, flavour);
        let bytes = size as u64;
        let through_pool = match target {
            Some((_, dev)) if self.settings.counting == Counting::Held => {
                pool.or_else(|| self.driver.device_mem_pool(dev).ok())
            }
            _ => None,
        };
        if let (Some(pool), Some((ctx, dev))) = (through_pool, target) {
            if size == 0 || self.accounting.pool_exempt(pool) {
                // A pool of host memory holds nothing on any GPU.
                return real();
            }
            let device = self
                .accounting
                .held()
                .pool_device(pool)
                .unwrap_or(dev as u16);
            if self.limit_of(CUdevice::from(device)).is_none() {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            if let Some(made) = self.alloc_from_pool(what, &mut real, bytes, pool, device, ctx) {
                return made;
            }
        }
        self.capped_alloc(what, bytes, Request::Async, target, real, |_| bytes)
    }

    /// A stream-ordered allocation charged through its pool (`held.rs`):
    /// claim, reserve the claim's estimate (once more after reclaiming
    /// when it does not fit, since the claim itself keeps the pool's
    /// charge from falling), call, settle. `None` when the driver will not
    /// describe the pool: the caller charges by size instead.
    fn alloc_from_pool(
        &'static self,
        what: &'static str,
        real: &mut impl FnMut() -> Result<Made, CUresult>,
        bytes: u64,
        pool: usize,
        device: u16,
        ctx: usize,
    ) -> Option<Result<Made, CUresult>> {
        let dev = CUdevice::from(device);
        let _inflight = self.inflight.enter();
        let mut claim = self.accounting.pool_claim(pool, device, bytes)?;
        let mut reserved = self.try_reserve_evicting(dev, claim.grow);
        if let Err(why) = reserved {
            self.accounting.pool_settle(claim, false, false);
            self.accounting.reclaim(dev);
            claim = self.accounting.pool_claim(pool, device, bytes)?;
            reserved = self.try_reserve_evicting(dev, claim.grow);
            if reserved.is_err() {
                self.accounting.pool_settle(claim, false, false);
                return Some(self.spill_or_refuse(what, bytes, Request::Async, ctx, dev, why));
            }
        }
        let made = match self.call_with_retry(dev, bytes, real) {
            Ok(m) => m,
            Err(rc) => {
                self.accounting.pool_settle(claim, false, true);
                return Some(Err(rc));
            }
        };
        self.accounting.pool_settle(claim, true, true);
        self.start_worker(); // sees the pool shrink at synchronisations
        let ptr = made.ptr;
        if let Some(s) = self.accounting.slot(dev) {
            DeviceSlot::add(&s.allocs, 1);
        }
        self.insert(
            ptr,
            Record {
                device,
                exported: false,
                bytes,
                ctx,
                kind: Kind::Async(Some(claim.serial)),
            },
        );
        log_at!(
            Debug,
            "{what}: {bytes} bytes at {ptr:#x} from pool {pool:#x} on device {device}"
        );
        Some(Ok(made))
    }

    /// `cuMemFreeAsync[_ptsz]`. A spilled pointer cannot be freed
    /// stream-ordered (the driver refuses): it is freed for real once the
    /// stream gets there.
    pub fn mem_free_async(
        &'static self,
        flavour: Flavour,
        mut real: impl FnMut() -> CUresult,
        dptr: CUdeviceptr,
        stream: CUstream,
    ) -> CUresult {
        if dptr == 0 {
            return real();
        }
        let Some((_, mut r)) = self.table.remove(&dptr) else {
            return self.free_unknown(real, dptr);
        };
        let tiered = if r.kind == Kind::Tiered {
            // Never moved again; settled by where it is when it goes.
            let b = self.tiers.detach(dptr);
            r.kind = Kind::TieredFreed {
                place: b.as_ref().map_or(Place::Device, |b| b.place()),
                handle: b.as_ref().map_or(0, |b| b.handle()),
            };
            b
        } else {
            None
        };
        if matches!(r.kind, Kind::SpillHost(_) | Kind::TieredFreed { .. }) {
            let rc = self
                .spill
                .free_when_reached(self.driver, dptr, r, stream as usize, flavour);
            if rc != CUDA_SUCCESS
                && let Some(b) = tiered
            {
                r.kind = Kind::Tiered;
                self.tiers.reattach(b);
            }
            if rc == CUDA_SUCCESS {
                self.start_worker(); // reaps it
            } else {
                self.table.insert(dptr, r);
            }
            return rc;
        }
        self.free_recorded(real, dptr, r)
    }
}

impl<D: Driver> Engine<D> {
    /// `cuMemPoolCreate` with the properties `props`: the pool's device is
    /// noted, so its allocations are charged there whichever stream makes
    /// them. `real` makes the real call and answers the pool it made (the
    /// boundary reads the caller's pointer, `boundary/allocs.rs`).
    pub fn mem_pool_create(
        &'static self,
        mut real: impl FnMut() -> Result<CUmemoryPool, CUresult>,
        props: &CUmemPoolProps,
    ) -> CUresult {
        let p = match real() {
            Ok(p) => p as usize,
            Err(rc) => return rc,
        };
        if self.settings.counting != Counting::Held {
            return CUDA_SUCCESS;
        }
        match u16::try_from(props.location.id) {
            Ok(dev) if props.location.kind == CU_MEM_LOCATION_TYPE_DEVICE => {
                self.accounting.held().created(p, dev, false)
            }
            // Host (and host NUMA) pools hold no GPU memory.
            _ => self.accounting.held().created(p, 0, true),
        }
        CUDA_SUCCESS
    }

    /// `cuMemPoolDestroy`: a pool with live allocations stays charged
    /// until the last is freed; one without is given back (`held.rs`).
    pub fn mem_pool_destroy(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        pool: CUmemoryPool,
    ) -> CUresult {
        if self.settings.counting != Counting::Held {
            return real();
        }
        let reserved = self
            .driver
            .mem_pool_attribute(pool as usize, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
            .ok();
        on_success(real(), || {
            self.accounting.pool_destroyed(pool as usize, reserved)
        })
    }

    /// `cuMemPoolTrimTo`: the pool's charge follows what it keeps.
    pub fn mem_pool_trim_to(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        pool: CUmemoryPool,
        _keep: usize,
    ) -> CUresult {
        on_success(real(), || self.accounting.pool_refresh(pool as usize))
    }

    /// `cuMemPoolSetAttribute`: the pool's charge is read again.
    pub fn mem_pool_set_attribute(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        pool: CUmemoryPool,
        _attr: c_int,
        _value: *mut c_void,
    ) -> CUresult {
        on_success(real(), || self.accounting.pool_refresh(pool as usize))
    }
}
