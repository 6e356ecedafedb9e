//! `cuMemFree_v2` and what every free of a recorded allocation shares.

use vramcap_core::cache::Block;
use vramcap_core::page::DeviceSlot;

use crate::engine::Engine;
use crate::engine::accounting::records::{Kind, Record};
use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::log_once;

impl<D: Driver> Engine<D> {
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
        self.spill.reap(self.driver, &self.accounting);
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
            let rc = self.spill.free(self.driver, &self.accounting, dptr, &r);
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
            if self.cache.keep(&self.accounting, r.device, block) {
                if let Some(s) = self.accounting.slot(CUdevice::from(r.device)) {
                    DeviceSlot::add(&s.frees, 1);
                }
                self.start_worker(); // releases idle blocks
                return CUDA_SUCCESS;
            }
        }
        self.free_recorded(real, dptr, r)
    }

    /// The real free of the recorded allocation `r` at `dptr`, whose record
    /// left the table: its bytes go back when the driver freed it, else the
    /// record returns.
    pub(in crate::engine) fn free_recorded(
        &self,
        mut real: impl FnMut() -> CUresult,
        dptr: CUdeviceptr,
        r: Record,
    ) -> CUresult {
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
                if let Some(s) = self.accounting.slot(CUdevice::from(r.device)) {
                    DeviceSlot::add(&s.frees, 1);
                }
                self.accounting.pool_freed(serial);
            }
            _ => self.accounting.give_back(r.device, r.bytes),
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
}
