//! The handlers of tiered spill: the allocation, the frees, the placement
//! rounds and the launch, copy and memset hooks. What they decide with and
//! how, the locks and the moves, is in `tier`.

use std::ffi::{c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::LogLevel;

use crate::engine::Engine;
use crate::engine::accounting::records::{Kind, Record};
use crate::engine::driver::Driver;
use crate::engine::tiered::{
    Claim, HALF_LIFE_LAUNCHES, ON_DEVICE, ON_HOST, PROMOTE_MARGIN, Plan, STOP_WAIT, TierBlock,
    location, plan, take_round,
};
use crate::ffi::*;
use crate::log::{log_at, log_once};

/// Makes physical memory of `bytes` on the host or `device` and maps it at
/// `ptr` for the device: the handle, with nothing left behind on failure.
fn make_mapped<D: Driver>(
    driver: &D,
    ptr: u64,
    bytes: u64,
    host: bool,
    device: CUdevice,
) -> Result<u64, CUresult> {
    let h = driver.vmm_create(bytes, location(host, device))?;
    let rc = driver.vmm_map(ptr, bytes, h, device);
    if rc != CUDA_SUCCESS {
        let _ = driver.vmm_release(h);
        return Err(rc);
    }
    Ok(h)
}

/// One move being carried out: the new memory, mapped at a scratch address.
struct Staged {
    block: Claim,
    to_host: bool,
    handle: u64,
    scratch: u64,
    stream: usize,
}

impl<D: Driver> Engine<D> {
    /// `cuMemAlloc_v2` under tiered spill (module docs): physical memory
    /// on the device within the cap, on the host past it, behind an
    /// address of its own. `None`: the request is not tiered (smaller than
    /// the granularity, or no VMM), for the ordinary path.
    ///
    /// # Safety
    /// `dptr` is non-null and writable.
    pub(in crate::engine) unsafe fn tiered_alloc(
        &'static self,
        what: &'static str,
        dptr: *mut CUdeviceptr,
        bytes: u64,
        ctx: usize,
        device: CUdevice,
    ) -> Option<CUresult> {
        let g = self.tiers.granularity(&self.driver, device)?;
        if bytes < g {
            return None;
        }
        let size = bytes.checked_next_multiple_of(g)?;
        let dev16 = device as u16;
        let _inflight = self.inflight.enter();
        let on_device = match self.tier_place(what, device, size) {
            Ok(on) => on,
            Err(rc) => return Some(rc),
        };
        let ptr = match self.driver.vmm_reserve(size) {
            Ok(p) => p,
            Err(rc) => {
                self.tier_unplace(device, size, on_device);
                return Some(rc);
            }
        };
        let handle = match make_mapped(&self.driver, ptr, size, !on_device, device) {
            Ok(h) => h,
            Err(rc) => {
                let _ = self.driver.vmm_free_address(ptr, size);
                self.tier_unplace(device, size, on_device);
                return Some(if rc == CUDA_ERROR_OUT_OF_MEMORY || !on_device {
                    CUDA_ERROR_OUT_OF_MEMORY
                } else {
                    rc
                });
            }
        };
        // SAFETY: the caller's contract.
        unsafe { *dptr = ptr };
        self.tier_placed(what, device, size, on_device);
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
        let _ = self
            .tiers
            .insert(self.tiers.make(ptr, size, dev16, ctx, handle, on_device));
        log_at!(
            Debug,
            "{what}: {bytes} bytes at {ptr:#x}, tiered ({size} mapped), on the {}",
            if on_device { "device" } else { "host" }
        );
        Some(CUDA_SUCCESS)
    }

    /// Where a new tiered allocation of `size` goes: reserved under the
    /// cap (true), or taken from the spill limit for host memory (false).
    /// Above the soft limit new blocks start on the host, as a round would
    /// put them there (the round's target is the soft limit).
    pub(in crate::engine) fn tier_place(
        &'static self,
        what: &'static str,
        device: CUdevice,
        size: u64,
    ) -> Result<bool, CUresult> {
        let soft = self.slot(device).map_or(0, |s| {
            let soft = s.soft.load(Ordering::Relaxed);
            if soft > 0 && s.budget.used().saturating_add(size) > soft {
                soft
            } else {
                0
            }
        });
        let reserved = if soft > 0 && self.spill.room(&self.base) >= size {
            Err(Some(crate::engine::accounting::Refusal {
                used: self.slot(device).map_or(0, |s| s.budget.used()),
                limit: soft,
                group: false,
            }))
        } else {
            self.try_reserve_evicting(device, size)
        };
        let why = match reserved {
            Ok(_) => return Ok(true),
            Err(None) => return Err(CUDA_ERROR_OUT_OF_MEMORY),
            Err(Some(why)) => why,
        };
        if self.spill.take(&self.base, size) {
            return Ok(false);
        }
        log_once!(
            Warn,
            "{what}: the spill limit (VRAMCAP_SPILL_LIMIT) is reached too; refusing"
        );
        if let Some(s) = self.slot(device) {
            DeviceSlot::add(&s.refusals, 1);
            self.refused(what, device, size, why);
        }
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Counts a tiered allocation of `size` just made on the device or the
    /// host.
    pub(in crate::engine) fn tier_placed(
        &self,
        what: &str,
        device: CUdevice,
        size: u64,
        on_device: bool,
    ) {
        let Some(s) = self.slot(device) else {
            return;
        };
        DeviceSlot::add(&s.allocs, 1);
        if !on_device {
            DeviceSlot::add(&s.spilled, size);
            DeviceSlot::add(&s.spill_allocs, 1);
            s.mark_active();
            log_once!(
                Info,
                "{what}: the cap of device {device} is reached; new blocks go to host memory and the most-used move onto the GPU (VRAMCAP_SPILL=tiered)"
            );
        }
    }

    /// Undoes [`Self::tier_place`] for an allocation that was not made.
    pub(in crate::engine) fn tier_unplace(&self, device: CUdevice, size: u64, on_device: bool) {
        if !on_device {
            self.spill.give_back(size);
        } else if let Some(s) = self.slot(device) {
            self.release_on(s, device, size);
        }
    }

    /// Settles the bytes of a tiered block that is gone.
    pub(in crate::engine) fn tier_settle(&self, r: &Record, on_device: bool) {
        self.tier_settle_bytes(r.device, r.bytes, on_device);
    }

    /// Settles `bytes` of a tiered allocation of `device` that is gone,
    /// from the device's budget or the spill.
    pub(in crate::engine) fn tier_settle_bytes(&self, device: u16, bytes: u64, on_device: bool) {
        if on_device {
            self.give_back(device, bytes);
        } else {
            self.spill.give_back(bytes);
            if let Some(s) = self.slot(CUdevice::from(device)) {
                s.spilled.fetch_sub(bytes, Ordering::Relaxed);
                DeviceSlot::add(&s.frees, 1);
            }
        }
    }

    /// A tiered record found stale (its address handed out again): only
    /// its bytes are settled; its driver objects are not touched, since
    /// the address is someone else's now.
    pub(in crate::engine) fn tier_forget(&self, ptr: u64, r: &Record) {
        let on_device = self.tiers.detach(ptr).is_none_or(|b| b.on_device());
        self.tier_settle(r, on_device);
    }

    /// A tiered block of a context that went away: VMM memory outlives its
    /// context, so the mapping, the memory and the address are released
    /// here (no work of the context can be running), then the bytes.
    pub(in crate::engine) fn tier_release(&self, ptr: u64, r: &Record) {
        match self.tiers.detach(ptr) {
            Some(b) => {
                self.release_vmm(&b);
                self.tier_settle(r, b.on_device());
            }
            None => self.tier_settle(r, true),
        }
    }

    /// Unmaps a detached block and releases its memory and address.
    fn release_vmm(&self, b: &TierBlock) -> CUresult {
        let rc = self.driver.vmm_unmap(b.ptr, b.bytes);
        if rc == CUDA_SUCCESS {
            let _ = self.driver.vmm_release(b.handle());
            let _ = self.driver.vmm_free_address(b.ptr, b.bytes);
        }
        rc
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
            self.tier_settle(r, true);
            return CUDA_SUCCESS;
        };
        if self.capture_in_progress() {
            self.tiers.defer_free(b, *r);
            self.start_worker();
            return CUDA_SUCCESS;
        }
        let _ = self.sync_ctx(b.ctx);
        let rc = self.release_vmm(&b);
        if rc != CUDA_SUCCESS {
            self.tiers.reattach(b);
            return rc;
        }
        self.tier_settle(r, b.on_device());
        CUDA_SUCCESS
    }

    /// `cuCtxSynchronize` of `ctx` (pushed for the call when it is not current).
    fn sync_ctx(&self, ctx: usize) -> CUresult {
        if self.driver.ctx_get_current() == Ok(ctx) {
            return self.driver.ctx_synchronize();
        }
        let rc = self.driver.ctx_push_current(ctx);
        if rc != CUDA_SUCCESS {
            return rc;
        }
        let out = self.driver.ctx_synchronize();
        let _ = self.driver.ctx_pop_current();
        out
    }

    /// The frees left to a round (made during a capture): done now.
    fn deferred_frees(&self) {
        for (b, r) in self.tiers.take_deferred() {
            let _ = self.sync_ctx(b.ctx);
            if self.release_vmm(&b) != CUDA_SUCCESS {
                log_once!(
                    Warn,
                    "tiered spill: a free left for after a capture failed; its bytes are given back anyway"
                );
            }
            self.tier_settle(&r, b.on_device());
        }
    }

    /// One placement round of the background thread (module docs).
    pub(in crate::engine) fn tier_round(&'static self) {
        if !self.tiers.on() {
            return;
        }
        let _no_teardown = self.tiers.running.read().unwrap_or_else(|e| e.into_inner());
        let _no_capture_begins = self.cache.ordering_shared();
        // Captures the hooks saw; one begun unseen shows on the legacy
        // stream of its context, which `move_staged` asks with it current.
        if self.capturing() {
            return;
        }
        self.deferred_frees();
        if self.tiers.stalled(self.tiers.round.load(Ordering::Relaxed)) {
            return;
        }
        let blocks = self.tiers.snapshot();
        if blocks.is_empty() {
            return;
        }
        let round = self.tiers.round.fetch_add(1, Ordering::Relaxed) + 1;
        let launches = self.tiers.launches.load(Ordering::Relaxed);
        let since = launches.saturating_sub(self.tiers.scored.swap(launches, Ordering::Relaxed));
        let decay = 0.5f64.powf(since as f64 / HALF_LIFE_LAUNCHES);
        for (b, (passes, weight)) in blocks.iter().zip(take_round(&blocks, round)) {
            b.weight.fetch_add(weight, Ordering::Relaxed);
            let s = b.score() * decay + passes;
            b.score.store(s.to_bits(), Ordering::Relaxed);
        }
        if round.is_multiple_of(50) && crate::log::enabled(LogLevel::Debug) {
            let on = blocks.iter().filter(|b| b.on_device()).count();
            log_at!(
                Debug,
                "tiered spill: round {round}: {} blocks, {on} on the device; {} launches seen (a graph's kernels each), {} uses",
                blocks.len(),
                self.tiers.launches.load(Ordering::Relaxed),
                self.tiers.hits.load(Ordering::Relaxed)
            );
            // The table placement decisions are made from, one line a block.
            for b in &blocks {
                log_at!(
                    Debug,
                    "tiered spill: round {round}: block {:#x} {} bytes on the {} score {:.1} weighted {} moved at round {}",
                    b.ptr,
                    b.bytes,
                    if b.on_device() { "device" } else { "host" },
                    b.score(),
                    b.weight.load(Ordering::Relaxed),
                    b.moved.load(Ordering::Relaxed)
                );
            }
        }
        let mut devices: Vec<u16> = blocks.iter().map(|b| b.device).collect();
        devices.sort_unstable();
        devices.dedup();
        for dev in devices {
            let device = CUdevice::from(dev);
            let Some(slot) = self.slot(device) else {
                continue;
            };
            let Some(limit) = self.cap_in_force(slot, device) else {
                continue;
            };
            let soft = slot.soft.load(Ordering::Relaxed);
            let target = if soft > 0 { limit.min(soft) } else { limit };
            let mine: Vec<Arc<TierBlock>> =
                blocks.iter().filter(|b| b.device == dev).cloned().collect();
            let used = i128::from(slot.budget.used());
            let (over, room) = if target == NO_CAP {
                (0, i128::from(u64::MAX))
            } else {
                let margin = i128::from(PROMOTE_MARGIN.min(target));
                (
                    used - i128::from(target),
                    i128::from(target) - margin - used,
                )
            };
            let p = plan(&mine, over, room, self.spill.room(&self.base), round);
            if !p.demote.is_empty() || !p.promote.is_empty() {
                self.apply(slot, device, limit, round, p);
            }
        }
    }

    /// Stages one move: claims the block, reserves a promotion's bytes,
    /// makes the new memory and maps it at a scratch address.
    fn stage(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        limit: u64,
        b: Arc<TierBlock>,
        to_host: bool,
    ) -> Result<Staged, bool> {
        let Some(b) = b.claim() else {
            return Err(false);
        };
        let Some(stream) = self.tiers.mover(&self.driver, b.ctx) else {
            return Err(true);
        };
        if !to_host && self.reserve_on(slot, device, b.bytes, limit).is_err() {
            return Err(true);
        }
        if to_host && !self.spill.take(&self.base, b.bytes) {
            return Err(false);
        }
        let undo = |b: &TierBlock| {
            if to_host {
                self.spill.give_back(b.bytes);
            } else {
                self.release_on(slot, device, b.bytes);
            }
        };
        let Ok(scratch) = self.driver.vmm_reserve(b.bytes) else {
            undo(&b);
            return Err(true);
        };
        match make_mapped(&self.driver, scratch, b.bytes, to_host, device) {
            Ok(handle) => Ok(Staged {
                block: b,
                to_host,
                handle,
                scratch,
                stream,
            }),
            Err(_) => {
                let _ = self.driver.vmm_free_address(scratch, b.bytes);
                undo(&b);
                Err(true)
            }
        }
    }

    /// Undoes a staged move that did not happen.
    fn unstage(&self, slot: &DeviceSlot, device: CUdevice, m: Staged) {
        let _ = self.driver.vmm_unmap(m.scratch, m.block.bytes);
        let _ = self.driver.vmm_release(m.handle);
        let _ = self.driver.vmm_free_address(m.scratch, m.block.bytes);
        if m.to_host {
            self.spill.give_back(m.block.bytes);
        } else {
            self.release_on(slot, device, m.block.bytes);
        }
    }

    /// Carries out one device's plan (module docs): the demotions, then
    /// the promotions, which often need the room the demotions make.
    fn apply(&'static self, slot: &DeviceSlot, device: CUdevice, limit: u64, round: u64, p: Plan) {
        let mut staged = Vec::new();
        for b in p.demote {
            if let Ok(m) = self.stage(slot, device, limit, b, true) {
                staged.push(m);
            }
        }
        let down = self.move_staged(slot, device, round, staged);
        let mut staged = Vec::new();
        for b in p.promote {
            match self.stage(slot, device, limit, b, false) {
                Ok(m) => staged.push(m),
                Err(true) => break,
                Err(false) => {}
            }
        }
        let up = self.move_staged(slot, device, round, staged);
        if up + down > 0 {
            log_at!(
                Debug,
                "tiered spill, device {device}: round {round} promoted {up} and demoted {down} blocks; {} launches seen (a graph's kernels each), {} uses",
                self.tiers.launches.load(Ordering::Relaxed),
                self.tiers.hits.load(Ordering::Relaxed)
            );
        }
    }

    /// Stops the world, copies and remaps the staged moves, opens the gate
    /// and settles them: how many moved.
    fn move_staged(
        &'static self,
        slot: &DeviceSlot,
        device: CUdevice,
        round: u64,
        staged: Vec<Staged>,
    ) -> usize {
        if staged.is_empty() {
            return 0;
        }
        let Some(gate) = self.tiers.stop() else {
            log_at!(
                Debug,
                "tiered spill: the program kept the gate busy for {STOP_WAIT:?}; moving nothing this round"
            );
            for m in staged {
                self.unstage(slot, device, m);
            }
            return 0;
        };
        // Nothing the program issued may still touch a block; and no
        // capture the hooks did not see may be running (a synchronisation
        // would break it).
        // Every context that owns tiered blocks: another one's work may
        // reach a moving block too.
        let mut ctxs: Vec<usize> = staged.iter().map(|m| m.block.ctx).collect();
        ctxs.extend(self.tiers.contexts());
        ctxs.sort_unstable();
        ctxs.dedup();
        let mut quiet = true;
        for &c in &ctxs {
            if self.driver.ctx_push_current(c) != CUDA_SUCCESS {
                quiet = false;
                continue;
            }
            if self.capture_in_progress() {
                quiet = false;
            }
            let _ = self.driver.ctx_pop_current();
        }
        if quiet && !self.quiesce(&ctxs, round) {
            quiet = false;
        }
        if !quiet {
            drop(gate);
            for m in staged {
                self.unstage(slot, device, m);
            }
            return 0;
        }
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for m in staged {
            let b = &m.block;
            let copied = self.driver.copy_dtod(m.scratch, b.ptr, b.bytes, m.stream) == CUDA_SUCCESS
                && self.driver.stream_synchronize(m.stream) == CUDA_SUCCESS;
            if !copied || self.driver.vmm_unmap(b.ptr, b.bytes) != CUDA_SUCCESS {
                failed.push(m);
                continue;
            }
            if self.map_block(b, m.handle, device) != CUDA_SUCCESS {
                // Put the old memory back where it was.
                let old = b.handle.load(Ordering::SeqCst);
                if self.map_block(b, old, device) != CUDA_SUCCESS {
                    log_once!(
                        Error,
                        "tiered spill: the block at {:#x} could not be mapped again after a failed move; the program will fault on it",
                        b.ptr
                    );
                }
                failed.push(m);
                continue;
            }
            done.push(m);
        }
        drop(gate);
        for m in failed {
            self.unstage(slot, device, m);
        }
        let moved = done.len();
        for m in done {
            let b = &m.block;
            let old = b.handle.swap(m.handle, Ordering::SeqCst);
            let _ = self.driver.vmm_unmap(m.scratch, b.bytes);
            let _ = self.driver.vmm_free_address(m.scratch, b.bytes);
            let _ = self.driver.vmm_release(old);
            b.moved.store(round, Ordering::Relaxed);
            DeviceSlot::add(&slot.moved_bytes, b.bytes);
            if m.to_host {
                b.state.store(ON_HOST, Ordering::SeqCst);
                self.release_on(slot, device, b.bytes);
                DeviceSlot::add(&slot.spilled, b.bytes);
                DeviceSlot::add(&slot.demotions, 1);
            } else {
                b.state.store(ON_DEVICE, Ordering::SeqCst);
                self.spill.give_back(b.bytes);
                slot.spilled.fetch_sub(b.bytes, Ordering::Relaxed);
                DeviceSlot::add(&slot.promotions, 1);
            }
        }
        moved
    }

    /// Maps `handle` at a moving block's address for its device, with the
    /// access the program granted to it when it is the program's.
    fn map_block(&self, b: &TierBlock, handle: u64, device: CUdevice) -> CUresult {
        let rc = self.driver.vmm_map(b.ptr, b.bytes, handle, device);
        if rc != CUDA_SUCCESS || b.program_handle == 0 {
            return rc;
        }
        let access = b.access.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let rc = self.driver.vmm_set_access(b.ptr, b.bytes, &access);
        if rc != CUDA_SUCCESS {
            let _ = self.driver.vmm_unmap(b.ptr, b.bytes);
        }
        rc
    }

    /// Waits, with the gate closed, for the contexts' work to finish, for
    /// at most [`sync_wait`](crate::engine::tiered::Tiers::sync_wait): work that
    /// waits on something the program would do after its next launch (a kernel waiting on another GPU's,
    /// a stream waiting on a value the host writes) never finishes while
    /// the program is held. The synchronisation runs on a thread of its
    /// own; past the wait the round gives up (that thread finishes when
    /// the GPU does), and moves pause for 10 s, for good after three.
    fn quiesce(&'static self, ctxs: &[usize], round: u64) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        let driver = &self.driver;
        let list = ctxs.to_vec();
        let quiescing = &self.tiers.quiescing;
        quiescing.fetch_add(1, Ordering::SeqCst);
        /// Counts the thread out when it ends, however it ends.
        struct Out(&'static std::sync::atomic::AtomicU32);
        impl Drop for Out {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let spawned = std::thread::Builder::new()
            .name("vramcap-quiesce".into())
            .spawn(move || {
                let _out = Out(quiescing);
                let mut ok = true;
                for c in list {
                    if driver.ctx_push_current(c) != CUDA_SUCCESS {
                        ok = false;
                        continue;
                    }
                    ok &= driver.ctx_synchronize() == CUDA_SUCCESS;
                    let _ = driver.ctx_pop_current();
                }
                let _ = tx.send(ok);
            });
        if spawned.is_err() {
            quiescing.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        let wait = self.tiers.sync_wait();
        match rx.recv_timeout(wait) {
            Ok(ok) => ok,
            Err(_) => {
                let n = self.tiers.stall(round);
                log_at!(
                    Warn,
                    "tiered spill: the GPU did not finish its work within {wait:?} while the program was held for a move (work waiting on the program?); {}",
                    if n >= 3 {
                        "blocks no longer move"
                    } else {
                        "moves pause for 10 s, and the next move waits twice as long"
                    }
                );
                false
            }
        }
    }

    /// Counts uses for tiered spill, then makes the launch through the gate.
    ///
    /// # Safety
    /// The launch function's contract.
    unsafe fn launched(
        &'static self,
        func: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
        mut real: impl FnMut() -> CUresult,
    ) -> CUresult {
        if !self.tiers.on() {
            return real();
        }
        // SAFETY: the launch function's contract.
        unsafe {
            self.tiers
                .note_launch(&self.driver, func as usize, params, extra)
        };
        let _open = self.tiers.enter();
        real()
    }

    /// `cuLaunchKernel[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_kernel(
        &'static self,
        real: impl FnMut() -> CUresult,
        f: CUfunction,
        _gx: c_uint,
        _gy: c_uint,
        _gz: c_uint,
        _bx: c_uint,
        _by: c_uint,
        _bz: c_uint,
        _shared: c_uint,
        _stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult {
        // SAFETY: the driver function's contract.
        unsafe { self.launched(f, params, extra, real) }
    }

    /// `cuLaunchKernelEx[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    pub unsafe fn launch_kernel_ex(
        &'static self,
        real: impl FnMut() -> CUresult,
        _config: *const c_void,
        f: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult {
        // SAFETY: the driver function's contract.
        unsafe { self.launched(f, params, extra, real) }
    }

    /// `cuLaunchCooperativeKernel[_ptsz]`.
    ///
    /// # Safety
    /// The driver function's contract.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_cooperative(
        &'static self,
        real: impl FnMut() -> CUresult,
        f: CUfunction,
        _gx: c_uint,
        _gy: c_uint,
        _gz: c_uint,
        _bx: c_uint,
        _by: c_uint,
        _bz: c_uint,
        _shared: c_uint,
        _stream: CUstream,
        params: *mut *mut c_void,
    ) -> CUresult {
        // SAFETY: the driver function's contract.
        unsafe { self.launched(f, params, std::ptr::null_mut(), real) }
    }

    /// `cuModuleUnload`, `cuLibraryUnload`: the functions' handles may come
    /// back for other functions, so every parameter layout is asked again.
    pub fn code_unloaded(
        &'static self,
        mut real: impl FnMut() -> CUresult,
        _handle: *mut c_void,
    ) -> CUresult {
        let rc = real();
        if self.tiers.on() {
            self.tiers.forget_layouts();
        }
        rc
    }

    /// A copy, memset, stream memory operation or parameterless launch
    /// (the hook list's `gate` entries): passes the gate under tiered
    /// spill, whatever the call's arguments are.
    pub fn pass_gate(&'static self, mut real: impl FnMut() -> CUresult) -> CUresult {
        let _open = self.tiers.enter();
        real()
    }
}
