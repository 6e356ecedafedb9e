//! Handlers for stream-ordered allocation and memory pools.
//!
//! Each allocation is counted when it is made, on its stream's device, and
//! given back when its free is *issued* (`cuMemFreeAsync`), not when the
//! stream reaches it; a pool may keep freed memory reserved above what is
//! live (its release threshold), which the cap does not count. Allocations
//! made while their stream is being captured are graph memory nodes: the
//! driver allocates them when the graph runs, outside any call the shim
//! sees, so they are not counted. A free of a pointer the engine does not
//! know (another pool's, or a captured one) goes to the driver unchanged.
//! The allocations belong to the device's pool, not to a context: they
//! stay counted when their context is destroyed or reset, as the driver
//! keeps them, until they are freed.

use std::ffi::c_void;

use super::alloc::Request;
use super::cuda::*;
use super::driver::{Driver, Flavour};
use super::records::Kind;
use super::state::Engine;

impl<D: Driver> Engine<D> {
    /// The (context, device) a stream's allocations come from; `None` when
    /// the stream is being captured (the call then goes to the driver
    /// uncounted) or there is no current context.
    fn stream_target(&self, stream: usize, flavour: Flavour) -> Option<(usize, CUdevice)> {
        let (ctx, cur_dev) = self.current()?;
        if self.capturing()
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

    /// `cuMemAllocAsync[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_alloc_async(
        &'static self,
        flavour: Flavour,
        real: impl FnMut() -> CUresult,
        dptr: *mut CUdeviceptr,
        size: usize,
        stream: CUstream,
    ) -> CUresult {
        let what = ["cuMemAllocAsync", "cuMemAllocAsync_ptsz"];
        // SAFETY: the driver function's contract.
        unsafe { self.alloc_on_stream(what, flavour, real, dptr, size, stream) }
    }

    /// `cuMemAllocFromPoolAsync[_ptsz]`: as [`Engine::mem_alloc_async`].
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn mem_alloc_from_pool_async(
        &'static self,
        flavour: Flavour,
        real: impl FnMut() -> CUresult,
        dptr: *mut CUdeviceptr,
        size: usize,
        _pool: *mut c_void,
        stream: CUstream,
    ) -> CUresult {
        let what = ["cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"];
        // SAFETY: the driver function's contract.
        unsafe { self.alloc_on_stream(what, flavour, real, dptr, size, stream) }
    }

    /// A stream-ordered allocation of `size` bytes on `stream`'s device;
    /// `what` names the legacy and the per-thread variant.
    ///
    /// # Safety
    /// `dptr` is null or writable.
    unsafe fn alloc_on_stream(
        &'static self,
        what: [&'static str; 2],
        flavour: Flavour,
        real: impl FnMut() -> CUresult,
        dptr: *mut CUdeviceptr,
        size: usize,
        stream: CUstream,
    ) -> CUresult {
        let what = what[usize::from(flavour == Flavour::PerThread)];
        let target = self.stream_target(stream as usize, flavour);
        let bytes = size as u64;
        // SAFETY: the caller's contract.
        unsafe { self.capped_alloc(what, dptr, bytes, Request::Async, target, real, || bytes) }
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
        let Some((_, r)) = self.table.remove(&dptr) else {
            return self.free_unknown(real, dptr);
        };
        if matches!(r.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
            let rc = self
                .spill
                .free_when_reached(&self.base, dptr, r, stream as usize, flavour);
            if rc == CUDA_SUCCESS {
                self.start_worker(); // reaps it
            } else {
                self.table.insert(dptr, r);
            }
            return rc;
        }
        let rc = real();
        if rc == CUDA_SUCCESS {
            self.give_back(r.device, r.bytes);
        } else {
            self.table.insert(dptr, r);
        }
        rc
    }
}
