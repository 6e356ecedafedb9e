//! Handlers that do not allocate but change what the engine may do with
//! memory: contexts going away (their memory goes with them), stream
//! capture (no synchronising or freeing while it runs) and IPC export (such
//! blocks are not cached), and streams that the legacy stream does not
//! order (the cache must wait before reusing a block); and the queries and
//! synchronisations a parked process answers without resuming.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use super::on_success;
use crate::engine::Engine;
use crate::engine::accounting::records::Kind;
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::*;
use crate::log::{log_at, log_once};

impl<D: Driver> Engine<D> {
    /// A query or synchronisation of streams, events or the context (the
    /// hook list's `known` entries, handed out only with parking): parked,
    /// the gate answered it already (`process/gate.rs`, `enter_known`);
    /// running, the driver answers.
    pub fn known_while_parked(&'static self, mut real: impl FnMut() -> CUresult) -> CUresult {
        real()
    }

    /// Drops the records of every allocation of a context the driver
    /// destroyed and gives their bytes back. Stream-ordered allocations
    /// stay: they live in the device's memory pool, which outlives the
    /// context (the real driver keeps them, checked on the H200; see
    /// `scripts/gpu/research/teardown.cu`), and their free gives the bytes back.
    fn forget_ctx(&self, ctx: usize) {
        self.cache.forget_ctx(&self.accounting, ctx);
        self.tiers.forget_ctx(ctx);
        self.tiered_forget_ctx(ctx);
        let mut gone = Vec::new();
        self.table.retain(|&p, r| {
            if r.ctx == ctx && !matches!(r.kind, Kind::Async(_)) {
                gone.push((p, *r));
                false
            } else {
                true
            }
        });
        for (p, r) in &gone {
            if r.kind == Kind::Tiered {
                self.tier_release_orphaned(*p, r);
            } else if matches!(r.kind, Kind::SpillHost(_)) {
                self.spill.forget(&self.accounting, r);
            } else if let Some(s) = self.accounting.slot(CUdevice::from(r.device)) {
                self.accounting
                    .release_on(s, CUdevice::from(r.device), r.bytes);
                s.frees.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut arrays = Vec::new();
        self.arrays.retain(|_, o| {
            if o.ctx == ctx {
                arrays.push(*o);
                false
            } else {
                true
            }
        });
        for o in &arrays {
            self.accounting.give_back(o.device, o.bytes);
        }
        if !gone.is_empty() || !arrays.is_empty() {
            log_at!(
                Info,
                "context {ctx:#x} went away holding {} allocations and {} arrays; their bytes are back in the budget",
                gone.len(),
                arrays.len()
            );
        }
    }

    /// `cuCtxDestroy_v2`.
    pub fn ctx_destroy(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        ctx: CUcontext,
    ) -> CUresult {
        if ctx.is_null() {
            return real();
        }
        self.cache
            .drain_ctx(self.driver, &self.accounting, ctx as usize);
        if self.tiers.on() {
            // Parking's kept host pages are unpinned in their context.
            if self.tiering().release_kept_of(ctx as usize) > 0 {
                self.say_kept();
            }
        }
        let no_round = self.tiers.no_round();
        let rc = real();
        if rc == CUDA_SUCCESS {
            self.forget_ctx(ctx as usize);
            drop(no_round);
            self.accounting.context_gone(None);
        }
        rc
    }

    /// The handle of `dev`'s primary context when it is active.
    fn active_primary(&self, dev: CUdevice) -> Option<usize> {
        if !self.driver.primary_ctx_state(dev).ok()?.1 {
            return None;
        }
        let ctx = self.driver.primary_ctx_retain(dev).ok()?;
        let _ = self.driver.primary_ctx_release(dev);
        Some(ctx)
    }

    fn still_active(&self, dev: CUdevice) -> bool {
        !matches!(self.driver.primary_ctx_state(dev), Ok((_, false)))
    }

    /// `cuDevicePrimaryCtxRelease_v2` and `cuDevicePrimaryCtxReset_v2`,
    /// which may destroy `dev`'s primary context (its last reference, or a
    /// reset): cached blocks are freed before (they might be the last use),
    /// records dropped after if the context is gone.
    pub fn primary_ctx_teardown(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        dev: CUdevice,
    ) -> CUresult {
        let primary = self.active_primary(dev);
        if let Some(ctx) = primary {
            self.cache.drain_ctx(self.driver, &self.accounting, ctx);
            if self.tiers.on() && self.tiering().release_kept_of(ctx) > 0 {
                self.say_kept();
            }
        }
        let no_round = self.tiers.no_round();
        let rc = real();
        if let (CUDA_SUCCESS, Some(ctx)) = (rc, primary)
            && !self.still_active(dev)
        {
            self.forget_ctx(ctx);
            drop(no_round);
            self.accounting.context_gone(Some(dev));
        }
        rc
    }

    /// `cuCtxEnablePeerAccess` (handed out where blocks are made): the
    /// driver maps the peer's plain memory for this context's GPU, and the
    /// shim grants it the peer GPU's blocks, which are VMM memory the
    /// driver's mapping leaves out (`tiered/peers.rs`). An ask already
    /// granted (the driver's 704) is recorded too: the program's first ask
    /// may have come before blocks were tracked.
    pub fn ctx_enable_peer_access(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        peer: CUcontext,
        _flags: c_uint,
    ) -> CUresult {
        let rc = real();
        if !self.tiers.on() || (rc != CUDA_SUCCESS && rc != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        {
            return rc;
        }
        let Ok(me) = self.driver.ctx_get_device() else {
            return rc;
        };
        if self.driver.ctx_push_current(peer as usize) != CUDA_SUCCESS {
            return rc;
        }
        let theirs = self.driver.ctx_get_device();
        let popped = self.driver.ctx_pop_current();
        if popped != CUDA_SUCCESS {
            log_once!(
                Error,
                "cuCtxEnablePeerAccess: the shim could not pop the peer's context it pushed to ask its GPU (error {popped}); the thread's current context may be wrong (please report this)"
            );
        }
        if let Ok(theirs) = theirs
            && self.tiers.add_peer(theirs, me)
        {
            self.tiers.grant_existing(self.driver, theirs);
        }
        rc
    }

    /// `cuIpcGetMemHandle`: a block exported for IPC may be open in another
    /// process, so it is never cached and its address never handed out
    /// again while it lives there.
    pub fn ipc_get_mem_handle(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _handle: *mut c_void,
        dptr: CUdeviceptr,
    ) -> CUresult {
        if self
            .table
            .get(&dptr)
            .is_some_and(|r| r.kind == Kind::Tiered)
        {
            // The settings accept the shim's moves only with parking.
            if self.settings.park_move.moves_blocks() {
                log_once!(
                    Warn,
                    "cuIpcGetMemHandle: the block at {dptr:#x} is VMM memory for the shim's parking moves (VRAMCAP_PARK_MOVE=shim, the default with VRAMCAP_PARK, or shim+checkpoint), which cannot be shared with other processes; use VRAMCAP_PARK_MOVE=checkpoint to share memory"
                );
            } else {
                log_once!(
                    Warn,
                    "cuIpcGetMemHandle: the block at {dptr:#x} is tiered (VRAMCAP_SPILL=tiered), and tiered blocks cannot be shared with other processes; run without tiered spill to share memory"
                );
            }
            return CUDA_ERROR_INVALID_VALUE;
        }
        let rc = real();
        if rc == CUDA_SUCCESS
            && let Some(mut r) = self.table.get_mut(&dptr)
        {
            r.exported = true;
        }
        rc
    }

    /// `cuMemGetHandleForAddressRange` (a dma-buf of device memory, as
    /// NCCL registers buffers with a network card): under tiered spill the
    /// blocks in the range stay where they are from then on, since the
    /// card keeps reaching the memory behind them, which a move would
    /// release. They are pinned before the call (so the dma-buf is of the
    /// memory they keep), and stay pinned if it fails.
    pub fn mem_get_handle_for_address_range(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _handle: *mut c_void,
        dptr: CUdeviceptr,
        size: usize,
        _kind: c_int,
        _flags: u64,
    ) -> CUresult {
        if self.tiers.on() {
            for b in self
                .tiers
                .blocks_overlapping(dptr, dptr.saturating_add(size as u64))
            {
                b.pin();
            }
        }
        real()
    }

    /// `cuStreamCreate`: a stream created `CU_STREAM_NON_BLOCKING` is not
    /// ordered with the legacy stream, so from then on the cache waits for
    /// a synchronisation before reusing a block (`cache.rs`). The flag is
    /// set before the stream exists: no work can be on it unseen.
    pub fn stream_create(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _stream: *mut CUstream,
        flags: c_uint,
    ) -> CUresult {
        self.note_stream_flags(flags);
        real()
    }

    /// `cuStreamCreateWithPriority`: as [`Engine::stream_create`].
    pub fn stream_create_with_priority(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _stream: *mut CUstream,
        flags: c_uint,
        _priority: c_int,
    ) -> CUresult {
        self.note_stream_flags(flags);
        real()
    }

    /// `cuGreenCtxStreamCreate`: green contexts' streams are always
    /// non-blocking.
    pub fn green_ctx_stream_create(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _stream: *mut CUstream,
        _green: *mut c_void,
        _flags: c_uint,
        _priority: c_int,
    ) -> CUresult {
        self.note_stream_flags(CU_STREAM_NON_BLOCKING);
        real()
    }

    /// The first non-blocking stream: with the ordering lock held
    /// exclusively, the flag is set and every ordering made so far is
    /// waited for (blocks it made safe may now meet work on the new
    /// stream, which the legacy stream does not order).
    fn note_stream_flags(&self, flags: c_uint) {
        if flags & CU_STREAM_NON_BLOCKING == 0 || self.accounting.nonblocking_streams() {
            return;
        }
        let _only = self.cache.ordering_exclusive();
        if !self.accounting.note_nonblocking_stream() {
            self.cache.wait_for_orderings(self.driver, &self.accounting);
            log_at!(
                Info,
                "the program asked for a non-blocking stream: from now on the freed-block cache waits for the GPU before reusing a block"
            );
        }
    }

    /// Any `cuStreamBeginCapture*` variant: one more capture in
    /// progress when it began.
    /// Begins it with the cache's ordering lock held exclusively, so that
    /// no reuse of the cache records on the legacy stream between its check
    /// for captures and its record (`cache.rs`).
    fn began(&self, mut real: impl FnMut() -> CUresult) -> CUresult {
        let _no_ordering = self.cache.ordering_exclusive();
        on_success(real(), || self.accounting.capture_began())
    }

    /// `cuStreamBeginCapture[_ptsz]` (CUDA 10.0).
    pub fn begin_capture(
        &'static self,
        real: impl FnMut() -> CUresult,
        _stream: CUstream,
    ) -> CUresult {
        self.began(real)
    }

    /// `cuStreamBeginCapture_v2[_ptsz]`.
    pub fn begin_capture_v2(
        &'static self,
        real: impl FnMut() -> CUresult,
        _stream: CUstream,
        _mode: c_int,
    ) -> CUresult {
        self.began(real)
    }

    /// `cuStreamBeginCaptureToGraph[_ptsz]`.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_capture_to_graph(
        &'static self,
        real: impl FnMut() -> CUresult,
        _stream: CUstream,
        _graph: *mut c_void,
        _deps: *const c_void,
        _dep_data: *const c_void,
        _count: usize,
        _mode: c_int,
    ) -> CUresult {
        self.began(real)
    }

    /// `cuStreamEndCapture[_ptsz]`: the capture is over when the stream says
    /// it is no longer capturing (whatever the call returned); if the stream
    /// cannot be asked, when the call succeeded or reported an invalidated
    /// capture.
    pub fn end_capture(
        &'static self,
        flavour: Flavour,
        mut real: impl FnMut() -> CUresult,
        stream: CUstream,
        _graph: *mut *mut c_void,
    ) -> CUresult {
        let rc = real();
        let over = match self.driver.stream_is_capturing(stream as usize, flavour) {
            Ok(status) => status == 0,
            Err(_) => rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        };
        if over {
            self.accounting.capture_ended();
        }
        rc
    }
}
