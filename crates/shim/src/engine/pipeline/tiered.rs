//! The pipeline's tiered placement: a plain allocation becomes a block
//! (reserved, created, mapped), placed on the device within the cap or on
//! the host past it; and the frees of blocks. The part it places into is
//! `engine/tiered/`.

use std::sync::atomic::Ordering;

use vramcap_core::page::DeviceSlot;

use crate::engine::Engine;
use crate::engine::accounting::records::{Kind, Record};
use crate::engine::driver::Driver;
use crate::engine::pipeline::Made;
use crate::engine::tiered::{HostRoom, Place, TierBlock, make_mapped};
use crate::ffi::*;
use crate::log::{log_at, log_once};

impl<D: Driver> Engine<D> {
    /// `cuMemAlloc_v2` under tiered spill (module docs): physical memory
    /// on the device within the cap, on the host past it, behind an
    /// address of its own. `None`: the request is not tiered (smaller than
    /// the granularity, or no VMM), for the ordinary path.
    pub(in crate::engine) fn tiered_alloc(
        &'static self,
        what: &'static str,
        bytes: u64,
        ctx: usize,
        device: CUdevice,
    ) -> Option<Result<Made, CUresult>> {
        let g = self.tiers.granularity(self.driver, device)?;
        if bytes < g {
            return None;
        }
        let size = bytes.checked_next_multiple_of(g)?;
        let dev16 = device as u16;
        let _inflight = self.inflight.enter();
        let place = match self.tier_reserve(what, device, size) {
            Ok(place) => place,
            Err(rc) => return Some(Err(rc)),
        };
        let ptr = match self.driver.vmm_reserve(size) {
            Ok(p) => p,
            Err(rc) => {
                self.tiering().unreserve(device, size, place);
                return Some(Err(rc));
            }
        };
        let handle = match make_mapped(self.driver, ptr, size, place, device) {
            Ok(h) => h,
            // Parking's blocks on a full GPU: the ordinary path, whose
            // driver call has the cache's retry and the full GPU's policy.
            Err(CUDA_ERROR_OUT_OF_MEMORY) if !self.tiers.placing() => {
                let _ = self.driver.vmm_free_address(ptr, size);
                self.tiering().unreserve(device, size, place);
                return None;
            }
            Err(rc) => {
                let _ = self.driver.vmm_free_address(ptr, size);
                self.tiering().unreserve(device, size, place);
                return Some(Err(
                    if rc == CUDA_ERROR_OUT_OF_MEMORY || place == Place::Host {
                        CUDA_ERROR_OUT_OF_MEMORY
                    } else {
                        rc
                    },
                ));
            }
        };
        self.tiering().count_made(what, device, size, place);
        // The record first: a stale one at this address (released behind
        // the engine's back) is settled before the new block is tracked.
        self.insert(
            ptr,
            Record {
                device: dev16,
                exported: false,
                bytes: size,
                ctx,
                kind: Kind::Tiered,
            },
        );
        let _ = self.tiers.insert(TierBlock::new(
            ptr,
            size,
            dev16,
            ctx,
            handle,
            place,
            self.tiers.round_now(),
        ));
        // In the block map, then the GPUs the program gave peer access to
        // this one get it too (`tiered/peers.rs`: a walk of the map either
        // finds the block or ran before the bit this reads was set).
        self.tiers.grant_peers(self.driver, ptr, size, device);
        log_at!(
            Debug,
            "{what}: {bytes} bytes at {ptr:#x}, tiered ({size} mapped), on the {}",
            place.name()
        );
        Some(Ok(Made::at(ptr)))
    }

    /// Reserves a new tiered allocation of `size` where it goes: under the
    /// cap (`Place::Device`), or from the spill limit for host memory
    /// (`Place::Host`). The lifecycle of a block's bytes: reserve, then
    /// count_made or unreserve; give_back when it is freed, drop_stale when
    /// its record is found stale, release_orphaned when its context went.
    /// Above the soft limit new blocks start on the host, as a round would
    /// put them there (the round's target is the soft limit).
    pub(in crate::engine) fn tier_reserve(
        &'static self,
        what: &'static str,
        device: CUdevice,
        size: u64,
    ) -> Result<Place, CUresult> {
        if !self.tiers.placing() {
            // Parking's blocks (`VRAMCAP_PARK_MOVE=shim`): on the device
            // within the cap, or refused as the ordinary path refuses.
            return match self.try_reserve_evicting(device, size) {
                Ok(_) => Ok(Place::Device),
                Err(None) => Err(CUDA_ERROR_OUT_OF_MEMORY),
                Err(Some(why)) => {
                    if let Some(s) = self.accounting.slot(device) {
                        DeviceSlot::add(&s.refusals, 1);
                        self.accounting.refused(what, device, size, why);
                    }
                    Err(CUDA_ERROR_OUT_OF_MEMORY)
                }
            };
        }
        let soft = self.accounting.slot(device).map_or(0, |s| {
            let soft = s.soft.load(Ordering::Relaxed);
            if soft > 0 && s.budget.used().saturating_add(size) > soft {
                soft
            } else {
                0
            }
        });
        let reserved = if soft > 0 && HostRoom::room(self) >= size {
            Err(Some(crate::engine::accounting::Refusal {
                used: self.accounting.slot(device).map_or(0, |s| s.budget.used()),
                limit: soft,
                group: false,
            }))
        } else {
            self.try_reserve_evicting(device, size)
        };
        let why = match reserved {
            Ok(_) => return Ok(Place::Device),
            Err(None) => return Err(CUDA_ERROR_OUT_OF_MEMORY),
            Err(Some(why)) => why,
        };
        if HostRoom::take(self, size) {
            return Ok(Place::Host);
        }
        log_once!(
            Warn,
            "{what}: the spill limit (VRAMCAP_SPILL_LIMIT) is reached too; refusing"
        );
        if let Some(s) = self.accounting.slot(device) {
            DeviceSlot::add(&s.refusals, 1);
            self.accounting.refused(what, device, size, why);
        }
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// A tiered record found stale (its address handed out again): only
    /// its bytes are settled; its driver objects are not touched, since
    /// the address is someone else's now.
    pub(in crate::engine) fn tier_drop_stale(&self, ptr: u64, r: &Record) {
        let place = self.tiers.detach(ptr).map_or(Place::Device, |b| b.place());
        self.tiering().give_back(r, place);
    }

    /// A tiered block of a context that went away: VMM memory outlives its
    /// context, so the mapping, the memory and the address are released
    /// here (no work of the context can be running), then the bytes.
    pub(in crate::engine) fn tier_release_orphaned(&self, ptr: u64, r: &Record) {
        match self.tiers.detach(ptr) {
            Some(b) => {
                b.release_vmm(self.driver);
                self.tiering().give_back(r, b.place());
            }
            None => self.tiering().give_back(r, Place::Device),
        }
    }

    /// Frees a tiered block: as the driver's `cuMemFree` does, it first
    /// waits for the block's context to finish its work (unmapping memory
    /// a kernel still uses makes the kernel fault, and the context with
    /// it), then unmaps it and releases its memory and address. The
    /// program's `cuMemFree_v2` of a tiered address comes here instead of
    /// the driver, which would refuse a mapped range. During a capture,
    /// when a synchronisation would break it, the free is left to the next
    /// round (which runs only outside captures).
    pub(in crate::engine) fn tier_free(&'static self, ptr: u64, r: &Record) -> CUresult {
        let Some(b) = self.tiers.detach(ptr) else {
            self.tiering().give_back(r, Place::Device);
            return CUDA_SUCCESS;
        };
        if self.accounting.capture_in_progress() {
            self.tiers.defer_free(b, *r);
            self.start_worker();
            return CUDA_SUCCESS;
        }
        let _ = self.tiering().sync_ctx(b.ctx);
        let rc = b.release_vmm(self.driver);
        if rc != CUDA_SUCCESS {
            self.tiers.reattach(b);
            return rc;
        }
        self.tiering().give_back(r, b.place());
        CUDA_SUCCESS
    }
}
