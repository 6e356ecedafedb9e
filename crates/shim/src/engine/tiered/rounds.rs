//! The placement rounds: the background thread's heat, plan and moves
//! (stage, copy, remap), with the gate closed and the contexts quiet.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::LogLevel;

use crate::engine::driver::Driver;
use crate::engine::tiered::pages::Pages;
use crate::engine::tiered::{
    BlockClaim, PROMOTE_MARGIN, Place, Plan, STOP_WAIT, TierBlock, Tiering, make_mapped, plan,
    score_round,
};
use crate::ffi::*;
use crate::log::{log_at, log_once};

/// One move being carried out: the new memory, mapped at a scratch
/// address; or, for a park's move to the host, the host pages the bytes
/// go to (`scratch` is their device address, and no handle is made).
pub(super) struct Staged {
    block: BlockClaim,
    to: Place,
    handle: u64,
    scratch: u64,
    stream: usize,
    /// A park's move (`bulk.rs`): to the host, into kept host pages;
    /// back to the GPU, from the block's pages, which are kept then.
    park: bool,
    /// A park's move to the host: the pages (their budget still taken).
    pages: Option<Pages>,
}

impl Staged {
    /// The bytes of the block it moves.
    pub(super) fn bytes(&self) -> u64 {
        self.block.bytes
    }
}

impl<D: Driver> Tiering<'static, D> {
    /// `cuCtxSynchronize` of `ctx` (pushed for the call when it is not current).
    pub fn sync_ctx(&self, ctx: usize) -> CUresult {
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
    pub(super) fn deferred_frees(&self) {
        for (b, r) in self.tiers.take_deferred() {
            let _ = self.sync_ctx(b.ctx);
            if b.release_vmm(self.driver) != CUDA_SUCCESS {
                log_once!(
                    Warn,
                    "tiered spill: a free left for after a capture failed; its bytes are given back anyway"
                );
            }
            self.give_back(&r, b.place());
        }
    }

    /// One placement round of the background thread (module docs), with
    /// `Tiers::running` held shared and no capture let begin (the engine
    /// takes both: `Engine::tier_round`).
    pub fn round(&self) {
        // Captures the hooks saw; one begun unseen shows on the legacy
        // stream of its context, which `move_staged` asks with it current.
        if self.accounting.capturing() {
            return;
        }
        self.deferred_frees();
        if !self.tiers.placing() || self.tiers.paused() {
            return;
        }
        let blocks = self.tiers.snapshot();
        if blocks.is_empty() {
            return;
        }
        let round = self.tiers.round.fetch_add(1, Ordering::Relaxed) + 1;
        let launches = self.tiers.launches();
        let since = launches.saturating_sub(self.tiers.scored.swap(launches, Ordering::Relaxed));
        score_round(&blocks, round, since);
        let debug = crate::log::enabled(LogLevel::Debug);
        self.tiers.record(debug);
        if round.is_multiple_of(50) && debug {
            self.report_staging(&blocks, round);
            let on = blocks.iter().filter(|b| b.on_device()).count();
            log_at!(
                Debug,
                "tiered spill: round {round}: {} blocks, {on} on the device; {} launches seen (a graph's kernels each), {} uses",
                blocks.len(),
                self.tiers.launches(),
                self.tiers.hits()
            );
            // The table placement decisions are made from, one line a block.
            for b in &blocks {
                log_at!(
                    Debug,
                    "tiered spill: round {round}: block {:#x} {} bytes on the {} score {:.1} weighted {} moved at round {}",
                    b.ptr,
                    b.bytes,
                    b.place().name(),
                    b.score(),
                    b.weight.load(Ordering::Relaxed),
                    b.moved.load(Ordering::Relaxed)
                );
            }
        }
        for dev in devices_of(&blocks) {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let Some((limit, target)) = self.target(device) else {
                continue;
            };
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
            let p = plan(&mine, over, room, self.host.room(), round);
            if !p.demote.is_empty() || !p.promote.is_empty() {
                // A synchronisation of an earlier round still runs: the
                // GPU has not drained since, and a stop now would wait on it.
                if self.tiers.syncing() {
                    return;
                }
                self.apply(slot, device, limit, round, p);
            }
        }
    }

    /// A device's cap in force and its target (the soft limit when lower):
    /// what a round places under.
    fn target(&self, device: CUdevice) -> Option<(u64, u64)> {
        let slot = self.accounting.slot(device)?;
        let limit = self.accounting.cap_in_force(slot, device)?;
        let soft = slot.soft.load(Ordering::Relaxed);
        Some((limit, if soft > 0 { limit.min(soft) } else { limit }))
    }

    /// Issue 44's report at debug level: where the recorded launch order
    /// repeats, and what staging one step under the first block's device's
    /// target, less the promotion margin, would move (`phases.rs`).
    fn report_staging(&self, blocks: &[Arc<TierBlock>], round: u64) {
        let trace = self.tiers.recorded();
        let size_of = |p: u64| blocks.iter().find(|b| b.ptr == p).map(|b| b.bytes);
        let budget = blocks
            .first()
            .and_then(|b| self.target(CUdevice::from(b.device)))
            .map_or(u64::MAX, |(_, t)| t.saturating_sub(PROMOTE_MARGIN.min(t)));
        let what = match super::phases::report(&trace, size_of, budget) {
            super::phases::Report::NoRepeat { launches } => {
                format!("the order of the last {launches} launches does not repeat")
            }
            super::phases::Report::Unfit { period, bytes } => format!(
                "a step of {period} launches repeats, but one launch uses {bytes} bytes, over the {budget}-byte budget"
            ),
            super::phases::Report::Phases {
                period,
                covered,
                step_bytes,
                phases,
                moved,
                locked_at,
                lost,
            } => format!(
                "a step of {period} launches repeats (the last {covered} of {} recorded), using {step_bytes} bytes of blocks: {phases} phases under the {budget}-byte budget, {moved} bytes coming in a step; following it, staging would lock on at launch {} and lose the order {lost} times",
                trace.len(),
                locked_at.map_or("(never)".to_string(), |i| i.to_string())
            ),
        };
        log_at!(Debug, "tiered spill: round {round}: staging ahead: {what}");
    }

    /// Stages one move: claims the block, reserves a promotion's bytes,
    /// makes the new memory and maps it at a scratch address.
    pub(super) fn stage(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        limit: u64,
        b: Arc<TierBlock>,
        to: Place,
        park: bool,
    ) -> Result<Staged, bool> {
        let Some(b) = b.claim() else {
            return Err(false);
        };
        let Some(stream) = self.tiers.mover(self.driver, b.ctx) else {
            return Err(true);
        };
        // A park's way back is reserved by its caller, all blocks at once
        // (`bulk.rs`).
        if to == Place::Device
            && !park
            && self
                .accounting
                .reserve_on(slot, device, b.bytes, limit)
                .is_err()
        {
            return Err(true);
        }
        if let (true, Place::Host) = (park, to) {
            // A park's pages were made before the stage (`bulk.rs`); none
            // of this size: the host budget or the driver refused them.
            return match self.tiers.take_kept(b.bytes) {
                Some(p) => Ok(Staged {
                    block: b,
                    to,
                    handle: 0,
                    scratch: p.dev,
                    stream,
                    park,
                    pages: Some(p),
                }),
                None => Err(false),
            };
        }
        if to == Place::Host && !self.host.take(b.bytes) {
            return Err(false);
        }
        let undo = |b: &TierBlock| match to {
            Place::Host => self.host.give_back(b.bytes),
            _ if park => {}
            _ => {
                self.accounting.release_on(slot, device, b.bytes);
            }
        };
        let Ok(scratch) = self.driver.vmm_reserve(b.bytes) else {
            undo(&b);
            return Err(true);
        };
        match make_mapped(self.driver, scratch, b.bytes, to, device) {
            Ok(handle) => Ok(Staged {
                block: b,
                to,
                handle,
                scratch,
                stream,
                park,
                pages: None,
            }),
            Err(_) => {
                let _ = self.driver.vmm_free_address(scratch, b.bytes);
                undo(&b);
                Err(true)
            }
        }
    }

    /// Undoes a staged move that did not happen.
    pub(super) fn unstage(&self, slot: &DeviceSlot, device: CUdevice, m: Staged) {
        if let Some(p) = m.pages {
            self.tiers.keep(p);
            return;
        }
        let _ = self.driver.vmm_unmap(m.scratch, m.block.bytes);
        let _ = self.driver.vmm_free_address(m.scratch, m.block.bytes);
        let _ = self.driver.vmm_release(m.handle);
        if m.to == Place::Host {
            self.host.give_back(m.block.bytes);
        } else if !m.park {
            self.accounting.release_on(slot, device, m.block.bytes);
        }
    }

    /// Carries out one device's plan (module docs): the demotions, then
    /// the promotions, which often need the room the demotions make.
    pub(super) fn apply(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        limit: u64,
        round: u64,
        p: Plan,
    ) {
        let mut staged = Vec::new();
        for b in p.demote {
            if let Ok(m) = self.stage(slot, device, limit, b, Place::Host, false) {
                staged.push(m);
            }
        }
        let down = self.move_staged(slot, device, round, staged).0;
        let mut staged = Vec::new();
        for b in p.promote {
            match self.stage(slot, device, limit, b, Place::Device, false) {
                Ok(m) => staged.push(m),
                Err(true) => break,
                Err(false) => {}
            }
        }
        let up = self.move_staged(slot, device, round, staged).0;
        if up + down > 0 {
            log_at!(
                Debug,
                "tiered spill, device {device}: round {round} promoted {up} and demoted {down} blocks; {} launches seen (a graph's kernels each), {} uses",
                self.tiers.launches(),
                self.tiers.hits()
            );
        }
    }

    /// Stops the world, copies and remaps the staged moves, opens the gate
    /// and settles them: how many moved, and their bytes.
    pub(super) fn move_staged(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        round: u64,
        staged: Vec<Staged>,
    ) -> (usize, u64) {
        if staged.is_empty() {
            return (0, 0);
        }
        let Some(gate) = self.tiers.stop() else {
            log_at!(
                Debug,
                "tiered spill: the program kept the gate busy for {STOP_WAIT:?}; moving nothing this round"
            );
            for m in staged {
                self.unstage(slot, device, m);
            }
            return (0, 0);
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
            if self.accounting.capture_in_progress() {
                quiet = false;
            }
            let _ = self.driver.ctx_pop_current();
        }
        if quiet && !self.quiesce(&ctxs) {
            quiet = false;
        }
        if !quiet {
            drop(gate);
            for m in staged {
                self.unstage(slot, device, m);
            }
            return (0, 0);
        }
        // The copies first, all issued before any is waited for (one
        // synchronisation a mover stream, not one a block).
        let mut copying = Vec::with_capacity(staged.len());
        for m in staged {
            let b = &m.block;
            // A park's way back reads the block's pages: nothing is mapped
            // at its address.
            let pages = match (m.park, m.to) {
                (true, Place::Device) => b
                    .pages
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .map(|p| p.dev),
                _ => None,
            };
            let issued =
                self.driver
                    .copy_dtod(m.scratch, pages.unwrap_or(b.ptr), b.bytes, m.stream)
                    == CUDA_SUCCESS;
            copying.push((m, pages, issued));
        }
        let mut streams: Vec<(usize, bool)> = Vec::new();
        for (m, _, _) in &copying {
            if !streams.iter().any(|&(s, _)| s == m.stream) {
                let ok = self.driver.stream_synchronize(m.stream) == CUDA_SUCCESS;
                streams.push((m.stream, ok));
            }
        }
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for (m, pages, issued) in copying {
            let b = &m.block;
            let copied = issued && streams.iter().any(|&(s, ok)| s == m.stream && ok);
            if !copied || (pages.is_none() && self.driver.vmm_unmap(b.ptr, b.bytes) != CUDA_SUCCESS)
            {
                failed.push(m);
                continue;
            }
            if m.pages.is_some() {
                // To host pages: the address stays unmapped while parked.
                done.push(m);
                continue;
            }
            if pages.is_some() {
                if self.map_block(b, m.handle, device) != CUDA_SUCCESS {
                    // Still parked, its pages intact.
                    failed.push(m);
                    continue;
                }
                done.push(m);
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
        let mut bytes = 0;
        for mut m in done {
            let b = &m.block;
            let old = b.handle.swap(m.handle, Ordering::SeqCst);
            match (m.park, m.to) {
                (true, Place::Host) => {
                    // The block's bytes are in its pages; its device memory goes.
                    let _ = self.driver.vmm_release(old);
                    *b.pages.lock().unwrap_or_else(|e| e.into_inner()) = m.pages.take();
                }
                (true, Place::Device) => {
                    // Back on the GPU: its pages are kept for the next park.
                    let _ = self.driver.vmm_unmap(m.scratch, b.bytes);
                    let _ = self.driver.vmm_free_address(m.scratch, b.bytes);
                    if let Some(p) = b.pages.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        self.tiers.keep(p);
                    }
                }
                _ => {
                    let _ = self.driver.vmm_unmap(m.scratch, b.bytes);
                    let _ = self.driver.vmm_free_address(m.scratch, b.bytes);
                    let _ = self.driver.vmm_release(old);
                }
            }
            b.moved.store(round, Ordering::Relaxed);
            b.parked
                .store(m.park && m.to == Place::Host, Ordering::Relaxed);
            b.set_place(m.to);
            bytes += b.bytes;
            if m.to == Place::Host {
                self.accounting.release_on(slot, device, b.bytes);
            }
            // A park's bytes are the page's `parked`, not spill's.
            if m.park {
                continue;
            }
            DeviceSlot::add(&slot.moved_bytes, b.bytes);
            if m.to == Place::Host {
                DeviceSlot::add(&slot.spilled, b.bytes);
                DeviceSlot::add(&slot.demotions, 1);
            } else {
                self.host.give_back(b.bytes);
                slot.spilled.fetch_sub(b.bytes, Ordering::Relaxed);
                DeviceSlot::add(&slot.promotions, 1);
            }
        }
        (moved, bytes)
    }

    /// Maps `handle` at a moving block's address for its device, with the
    /// access the program granted to it when it is the program's, else with
    /// its device's peers' (`peers.rs`).
    pub(super) fn map_block(&self, b: &TierBlock, handle: u64, device: CUdevice) -> CUresult {
        let rc = self.driver.vmm_map(b.ptr, b.bytes, handle, device);
        if rc != CUDA_SUCCESS {
            return rc;
        }
        if b.program_handle == 0 {
            // Mapped afresh: the GPUs the program gave peer access get it.
            self.tiers.grant_peers(self.driver, b.ptr, b.bytes, device);
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
    /// the GPU does, and what it took sets later waits), and moves pause,
    /// for good after three give-ups in a row ([`SYNC_WAIT`](super::SYNC_WAIT)).
    pub(in crate::engine) fn quiesce(&self, ctxs: &[usize]) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        let known = self.tiers.drain_seen();
        if !self.sync_on_thread(ctxs.to_vec(), tx) {
            return false;
        }
        let wait = self.tiers.sync_wait();
        match rx.recv_timeout(wait) {
            Ok(ok) => {
                self.tiers.quiesced();
                ok
            }
            Err(_) if !known => {
                // The first drain is longer than the first wait: no pause;
                // moves wait for it to end and then follow it.
                log_at!(
                    Info,
                    "tiered spill: the GPU's queue took longer than {wait:?} to drain; moves do not pause, and the next one waits twice as long as this drain took"
                );
                false
            }
            Err(_) => {
                let for_good = self.tiers.stall();
                log_at!(
                    Warn,
                    "tiered spill: the GPU did not finish its work within {wait:?} while the program was held for a move (a long queue, or work waiting on the program?); {}",
                    if for_good {
                        "blocks no longer move"
                    } else {
                        "moves pause, and the next move waits at least twice as long as the GPU took"
                    }
                );
                false
            }
        }
    }

    /// Synchronises `ctxs` on a thread of its own, counted in `quiescing`
    /// (a context teardown waits for it): what it took sets later waits
    /// ([`Tiers::drained`](crate::engine::tiered::Tiers::drained)), and
    /// whether every context synchronised goes to `tx`. Whether the thread
    /// started.
    fn sync_on_thread(&self, ctxs: Vec<usize>, tx: std::sync::mpsc::Sender<bool>) -> bool {
        let driver = self.driver;
        let tiers = self.tiers;
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
                let out = Out(quiescing);
                let start = std::time::Instant::now();
                let mut ok = true;
                for c in ctxs {
                    if driver.ctx_push_current(c) != CUDA_SUCCESS {
                        ok = false;
                        continue;
                    }
                    ok &= driver.ctx_synchronize() == CUDA_SUCCESS;
                    let _ = driver.ctx_pop_current();
                }
                tiers.drained(start.elapsed());
                // Counted out before the answer: a round that hears it
                // finds no synchronisation running (`Tiers::syncing`).
                drop(out);
                let _ = tx.send(ok);
            });
        if spawned.is_err() {
            quiescing.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// The devices of `blocks`, each once, ascending.
fn devices_of(blocks: &[Arc<TierBlock>]) -> Vec<u16> {
    let mut devices: Vec<u16> = blocks.iter().map(|b| b.device).collect();
    devices.sort_unstable();
    devices.dedup();
    devices
}
