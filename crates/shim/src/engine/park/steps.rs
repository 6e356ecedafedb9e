//! Parking's steps on the background thread: the refusals, the checkpoint
//! with the ledgers' release, and the resume with their reservation.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vramcap_core::budget::NO_CAP;
use vramcap_core::page::{Page, uuid_text};
use vramcap_core::park::{Outcome, PARK_DEVICES, ParkState, RESUME_MARGIN, believable_free};

use super::Parking;
use super::policy::Among;
use crate::engine::accounting::Refusal;
use crate::engine::accounting::page::now_unix_ns;
use crate::engine::driver::{Checkpoint, Driver};
use crate::ffi::{CUDA_SUCCESS, CUdevice};
use crate::log::{log_at, log_once};
use crate::process::gate;

/// How long parking waits for the program's calls in flight (and the
/// driver's lock for its own).
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle members a transparent resume parks at most per round before it
/// waits for the next (each one it parked may have been outrun to the
/// room by an allocation).
const POLICY_TRIES: u32 = 4;

/// A resume found short of room measures the GPUs again only this much
/// later (nanoseconds): each measure runs nvidia-smi.
const REMEASURE_NS: u64 = 1_000_000_000;

impl<D: Driver> Parking<'_, D> {
    /// Sets the state, on the gate and on the page.
    fn park_set(&self, state: ParkState) {
        let page = self.accounting.page().get(self.settings);
        page.header
            .park_state
            .store(state as u64, Ordering::Release);
        gate::set_state(state as u32);
    }

    /// Why the process cannot be parked now, if it cannot (design item 4a).
    pub(super) fn park_refusal(&self) -> Option<Outcome> {
        let live = (self.records)();
        if live.managed {
            return Some(Outcome::ManagedMemory);
        }
        if live.exported || self.park.vmm_exported.load(Ordering::Relaxed) {
            return Some(Outcome::IpcExport);
        }
        // NCCL merely loaded is no refusal: every PyTorch process maps
        // libnccl. Its communicators leave marks the shim sees: another
        // process's share of GPU memory (an IPC or shareable export, above)
        // or, within one process, more than one GPU in use (peer copies).
        // A communicator over the network alone leaves none (docs/parking.md).
        if self.devices_in_use() > 1
            && std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains("libnccl"))
        {
            return Some(Outcome::Nccl);
        }
        if self.accounting.capturing() {
            return Some(Outcome::Capture);
        }
        // Tiered spill's moves run on this same thread, between rounds:
        // none is in flight here (Outcome::TieredMoving is never needed).
        let page = self.accounting.page().get(self.settings);
        for (d, s) in page.slots.iter().enumerate().skip(PARK_DEVICES) {
            if s.budget.used() > 0 {
                return Some(Outcome::TooManyDevices(d as u32));
            }
        }
        None
    }

    /// The first GPU the process holds memory on whose free memory cannot
    /// be measured now (nvidia-smi missing, or not listing it): parked, the
    /// process could never be let resume (design item 5b).
    pub(super) fn unmeasured(&self) -> Option<usize> {
        let page = self.accounting.page().get(self.settings);
        let held: Vec<usize> = (0..PARK_DEVICES)
            .filter(|&d| page.slots[d].budget.used() > 0)
            .collect();
        if held.is_empty() {
            return None;
        }
        let Ok(free) = self.driver.gpu_free() else {
            return held.first().copied();
        };
        held.into_iter()
            .find(|&d| free_on(page, d, &free).is_none())
    }

    /// How many GPUs the process holds memory on now.
    fn devices_in_use(&self) -> usize {
        let page = self.accounting.page().get(self.settings);
        page.slots.iter().filter(|s| s.budget.used() > 0).count()
    }

    /// Closes the gate and waits for the calls in flight (at most
    /// [`LOCK_TIMEOUT`]; else reopens: `Busy`). When it began.
    fn close_and_drain(&self) -> Result<Instant, Outcome> {
        self.park_set(ParkState::Parking);
        let start = Instant::now();
        while gate::INSIDE.load(Ordering::SeqCst) != 0 {
            if start.elapsed() > LOCK_TIMEOUT {
                self.park_set(ParkState::Running);
                return Err(Outcome::Busy);
            }
            std::thread::yield_now();
        }
        Ok(start)
    }

    /// The end of either park, its bytes recorded: since when, said anew,
    /// and parked.
    fn mark_parked(&self) {
        let page = self.accounting.page().get(self.settings);
        page.header
            .parked_since
            .store(now_unix_ns(), Ordering::Release);
        self.park.said_waiting.store(false, Ordering::Relaxed);
        // Exit handlers registered since the background thread started
        // would otherwise run first and ask for a resume (worker.rs).
        crate::process::stop_first_at_exit();
        self.park_set(ParkState::Parked);
    }

    /// The end of either resume: nothing parked, and just resumed is
    /// active (the policy of another member must not park it back before
    /// its program's call has run); running.
    fn mark_resumed(&self) {
        let page = self.accounting.page().get(self.settings);
        for d in 0..PARK_DEVICES {
            self.park.parked[d].store(0, Ordering::Relaxed);
            page.header.parked[d].store(0, Ordering::Release);
        }
        page.header.parked_since.store(0, Ordering::Release);
        page.header
            .last_activity
            .store(now_unix_ns(), Ordering::Release);
        self.park_set(ParkState::Running);
    }

    /// The shim's moves out: closes the gate, waits for the calls in
    /// flight, empties the cache, waits for the process's work and moves
    /// the blocks to host memory (the moves release their bytes from the
    /// ledgers). When it began, the cached bytes released, the bytes moved
    /// per device; on `Err` the process runs on.
    fn moves_out(&self) -> Result<(Instant, u64, [u64; PARK_DEVICES]), Outcome> {
        let start = self.close_and_drain()?;
        let freed = (self.empty_cache)();
        // The answers a parked process gives its queries (`enter_known`)
        // say its work is done: it must be.
        if !(self.sync_all)() {
            self.park_set(ParkState::Running);
            return Err(Outcome::Busy);
        }
        // A panic in the moves must not leave the gate closed for good.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.move_out)())) {
            Ok(m) => Ok((start, freed, m)),
            Err(_) => {
                // Blocks moved before it have nothing mapped at their
                // addresses: back they come, or the process cannot go on.
                let back =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.move_in)()));
                if matches!(back, Ok(Ok(_))) {
                    self.park_set(ParkState::Running);
                    log_at!(
                        Error,
                        "parking: an internal error while moving the blocks; they are back and the process runs on (please report this)"
                    );
                    Err(Outcome::Busy)
                } else {
                    self.park_set(ParkState::Failed);
                    log_at!(
                        Error,
                        "parking: an internal error while moving the blocks, and they could not be moved back; its CUDA calls answer CUDA_ERROR_ILLEGAL_STATE from now on (please report this)"
                    );
                    Err(Outcome::Stuck(0))
                }
            }
        }
    }

    /// Records blocks moved out: the page's `parked` words say them, and a
    /// resume moves them back.
    fn record_moved(&self, moved: &[u64; PARK_DEVICES]) {
        let page = self.accounting.page().get(self.settings);
        for (d, &bytes) in moved.iter().enumerate() {
            self.park.parked[d].store(0, Ordering::Relaxed);
            page.header.parked[d].store(bytes, Ordering::Release);
        }
        self.park.moved.store(true, Ordering::Relaxed);
    }

    /// `VRAMCAP_PARK_MOVE=shim`: the shim's moves out; the rest of the
    /// process stays on the GPU, charged as before.
    pub(super) fn move_and_release(&self) -> Outcome {
        let (start, freed, moved) = match self.moves_out() {
            Ok(m) => m,
            Err(o) => return o,
        };
        self.record_moved(&moved);
        self.mark_parked();
        log_at!(
            Info,
            "parked: {} bytes moved to host memory by the shim in {:.3}s ({freed} cached bytes released first); the rest of the process stays on the GPU",
            moved.iter().sum::<u64>(),
            start.elapsed().as_secs_f64()
        );
        Outcome::Ok
    }

    /// `VRAMCAP_PARK_MOVE=shim+checkpoint`: the shim's moves out, then the
    /// driver's lock and checkpoint of the rest (the context, small and
    /// pool allocations), whose bytes the ledgers release: nothing of the
    /// process stays on the GPU. A checkpoint the driver refuses leaves
    /// the park as the shim's moves made it, said once.
    pub(super) fn move_then_checkpoint(&self) -> Outcome {
        let (start, freed, moved) = match self.moves_out() {
            Ok(m) => m,
            Err(o) => return o,
        };
        self.record_moved(&moved);
        let moved_total = moved.iter().sum::<u64>();
        let driver_s = match self.lock_and_save() {
            Ok(s) => s,
            Err(o @ Outcome::Stuck(_)) => return o,
            Err(o) => {
                self.mark_parked();
                log_at!(
                    Warn,
                    "parked: {moved_total} bytes moved to host memory by the shim in {:.3}s; the driver's checkpoint of the rest was refused ({o}), so the rest of the process stays on the GPU",
                    start.elapsed().as_secs_f64()
                );
                return Outcome::Ok;
            }
        };
        let rest = self.checkpointed(&moved);
        log_at!(
            Info,
            "parked: {moved_total} bytes moved to host memory by the shim and {} by the driver's checkpoint in {:.3}s (the driver's lock and checkpoint {driver_s:.3}s; {freed} cached bytes released first); nothing of the process stays on the GPU",
            rest.iter().sum::<u64>(),
            start.elapsed().as_secs_f64()
        );
        Outcome::Ok
    }

    /// The driver's restore or unlock failed with `rc`: the process is
    /// stuck, its state `Failed` (its calls answer 401), said once.
    fn stuck(&self, rc: u32) -> Outcome {
        self.park_set(ParkState::Failed);
        log_at!(
            Error,
            "{}; its CUDA calls answer CUDA_ERROR_ILLEGAL_STATE from now on",
            Outcome::Stuck(rc)
        );
        Outcome::Stuck(rc)
    }

    /// The driver's lock and checkpoint of the process: their seconds.
    /// Refused, the process is unlocked again (as measured: a failed
    /// checkpoint leaves it locked, and unlocking recovers it); when the
    /// unlock fails too, the driver holds the process for good: `Stuck`,
    /// and the state `Failed` (its calls answer `CUDA_ERROR_ILLEGAL_STATE`
    /// instead of waiting in the driver for ever).
    fn lock_and_save(&self) -> Result<f64, Outcome> {
        let driver = self.driver;
        let driver_start = Instant::now();
        match driver.checkpoint(Checkpoint::Lock(LOCK_TIMEOUT.as_millis() as u32)) {
            Some(CUDA_SUCCESS) => {}
            None => return Err(Outcome::NoCheckpointApi),
            Some(rc) => return Err(Outcome::DriverError(rc as u32)),
        }
        match driver.checkpoint(Checkpoint::Save) {
            Some(CUDA_SUCCESS) => Ok(driver_start.elapsed().as_secs_f64()),
            other => match driver.checkpoint(Checkpoint::Unlock) {
                Some(CUDA_SUCCESS) => Err(Outcome::DriverError(other.unwrap_or(0) as u32)),
                unlock => Err(self.stuck(unlock.unwrap_or(0) as u32)),
            },
        }
    }

    /// The end of a park the driver's checkpoint holds: the ledgers
    /// released, the page's `parked` words the `moved` blocks and what
    /// the checkpoint took, locked, parked. What it took, per device.
    fn checkpointed(&self, moved: &[u64; PARK_DEVICES]) -> [u64; PARK_DEVICES] {
        let held = self.release_held();
        let page = self.accounting.page().get(self.settings);
        for (d, &bytes) in held.iter().enumerate() {
            page.header.parked[d].store(moved[d].saturating_add(bytes), Ordering::Release);
        }
        self.park.locked.store(true, Ordering::Relaxed);
        self.mark_parked();
        held
    }

    /// After the driver's checkpoint: what each device's ledgers held,
    /// now parked ([`Park::parked`](super::Park)) and released from them.
    fn release_held(&self) -> [u64; PARK_DEVICES] {
        let mut held = [0u64; PARK_DEVICES];
        for (d, h) in held.iter_mut().enumerate() {
            let Some(s) = self.accounting.slot(d as CUdevice) else {
                continue;
            };
            let used = s.budget.used();
            if used == 0 {
                continue;
            }
            self.park.parked[d].store(used, Ordering::Relaxed);
            self.accounting.release_on(s, d as CUdevice, used);
            self.accounting.forget_owed(d as CUdevice);
            *h = used;
        }
        held
    }

    /// Moves the parked blocks back (`VRAMCAP_PARK_MOVE=shim`): each is
    /// reserved under the cap and given device memory first, so without
    /// room nothing is lost and the process stays parked. `keep`: a
    /// transparent resume, which, refused by the group or by a full GPU,
    /// parks an idle member or process there first (the policy, as the
    /// driver's resume does; at most [`POLICY_TRIES`] a round).
    fn move_back(&self, keep: bool) -> Result<(), Outcome> {
        let start = Instant::now();
        let mut tries = 0;
        let kept = loop {
            self.park_set(ParkState::Resuming);
            let moved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.move_in)()));
            let (d, bytes, why) = match moved {
                Ok(Ok(kept)) => break kept,
                Ok(Err(short)) => short,
                Err(_) => {
                    // Never left resuming for good: parked, asked again.
                    self.park_set(ParkState::Parked);
                    log_at!(
                        Error,
                        "parking: an internal error while moving the blocks back; the process stays parked (please report this)"
                    );
                    return Err(Outcome::Busy);
                }
            };
            self.park_set(ParkState::Parked);
            tries += 1;
            let device = CUdevice::from(d);
            let parked_one = keep
                && tries <= POLICY_TRIES
                && match why {
                    Some(r) if r.group => {
                        let need = r.used.saturating_add(bytes).saturating_sub(r.limit);
                        self.settings.group.as_deref().is_some_and(|g| {
                            self.park_idle_member(device, Among::Group(g), need, " to resume")
                        })
                    }
                    None => self.gpu_of(device).is_some_and(|u| {
                        self.park_idle_member(device, Among::Gpu(u, bytes), bytes, " to resume")
                    }),
                    Some(_) => false,
                };
            if !parked_one {
                return Err(Outcome::NoRoom(u32::from(d)));
            }
        };
        self.park.moved.store(false, Ordering::Relaxed);
        self.mark_resumed();
        log_at!(
            Info,
            "resumed: the parked memory is back on the GPU in {:.3}s (moved by the shim; {} of host memory kept for the next park, until `vramcap trim` or exit)",
            start.elapsed().as_secs_f64(),
            vramcap_core::size::human_bytes(kept)
        );
        Ok(())
    }

    /// Closes the gate, waits for the calls in flight, empties the cache,
    /// locks and checkpoints, then releases the ledgers (module docs).
    pub(super) fn checkpoint_and_release(&self) -> Outcome {
        let start = match self.close_and_drain() {
            Ok(s) => s,
            Err(o) => return o,
        };
        let freed = (self.empty_cache)();
        let driver_s = match self.lock_and_save() {
            Ok(s) => s,
            Err(o @ Outcome::Stuck(_)) => return o,
            Err(o) => {
                self.park_set(ParkState::Running);
                return o;
            }
        };
        let held = self.checkpointed(&[0; PARK_DEVICES]);
        log_at!(
            Info,
            "parked: {} bytes moved to host memory in {:.3}s (the driver's lock and checkpoint {driver_s:.3}s; {freed} cached bytes released first); the budget is released",
            held.iter().sum::<u64>(),
            start.elapsed().as_secs_f64()
        );
        Outcome::Ok
    }

    /// Reserves the parked bytes (own budget and group), checks the real
    /// free memory, restores and unlocks. `keep`: a transparent resume; a
    /// reservation made and not usable yet (no real room) is kept for the
    /// next try, and one the group refuses parks an idle member first
    /// (the policy, as an allocation does; at most [`POLICY_TRIES`] per
    /// round, nothing reserved meanwhile).
    pub(super) fn reserve_and_restore(&self, keep: bool) -> Result<(), Outcome> {
        if !self.park.locked.load(Ordering::Relaxed) {
            return self.move_back(keep);
        }
        let mut tries = 0;
        let mut start = Instant::now();
        while !self.park.reserved.load(Ordering::Relaxed) {
            start = Instant::now();
            match self.reserve_parked() {
                Ok(()) => self.park.reserved.store(true, Ordering::Relaxed),
                Err((d, r)) => {
                    let bytes = self.park.parked[d].load(Ordering::Relaxed);
                    let need = r.used.saturating_add(bytes).saturating_sub(r.limit);
                    tries += 1;
                    let group = self.settings.group.as_deref();
                    if !(keep
                        && r.group
                        && tries <= POLICY_TRIES
                        && group.is_some_and(|g| {
                            self.park_idle_member(
                                d as CUdevice,
                                Among::Group(g),
                                need,
                                " to resume",
                            )
                        }))
                    {
                        return Err(Outcome::NoRoom(d as u32));
                    }
                }
            }
        }
        let mut short = self.short_of_room();
        // The policy on a full GPU: an idle process on it parked makes the
        // room (a transparent resume only, as for a group).
        while let Some(d) = short.filter(|_| keep && tries < POLICY_TRIES) {
            tries += 1;
            let need = self.park.short_need.load(Ordering::Relaxed);
            let parked = self.gpu_of(d as CUdevice).is_some_and(|u| {
                self.park_idle_member(d as CUdevice, Among::Gpu(u, need), need, " to resume")
            });
            if !parked {
                break;
            }
            self.park.short_at.store(0, Ordering::Relaxed);
            short = self.short_of_room();
        }
        if let Some(d) = short {
            if !keep {
                self.unreserve(PARK_DEVICES);
                self.park.reserved.store(false, Ordering::Relaxed);
            }
            return Err(Outcome::NoRoom(d as u32));
        }
        self.park_set(ParkState::Resuming);
        let driver = self.driver;
        let driver_start = Instant::now();
        for step in [Checkpoint::Restore, Checkpoint::Unlock] {
            match driver.checkpoint(step) {
                Some(CUDA_SUCCESS) => {}
                other => return Err(self.stuck(other.unwrap_or(0) as u32)),
            }
        }
        let driver_s = driver_start.elapsed().as_secs_f64();
        self.park.reserved.store(false, Ordering::Relaxed);
        self.park.locked.store(false, Ordering::Relaxed);
        if self.park.moved.load(Ordering::Relaxed) {
            // `shim+checkpoint`: the rest is back; the page says the
            // blocks alone, and they come back by the shim's moves (without
            // room for them, the process stays parked as `shim` parks it).
            let page = self.accounting.page().get(self.settings);
            for d in 0..PARK_DEVICES {
                let rest = self.park.parked[d].swap(0, Ordering::Relaxed);
                let now = page.header.parked[d].load(Ordering::Relaxed);
                page.header.parked[d].store(now.saturating_sub(rest), Ordering::Release);
            }
            log_at!(
                Info,
                "resuming: the driver's restore and unlock took {driver_s:.3}s; the blocks come back next"
            );
            return self.move_back(keep);
        }
        self.mark_resumed();
        // From the reservation that held: what the shim adds is the
        // reservation and the free-memory check.
        log_at!(
            Info,
            "resumed: the parked memory is back on the GPU in {:.3}s (the driver's restore and unlock {driver_s:.3}s)",
            start.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Reserves the parked bytes of every device, or none: on a refusal
    /// the devices before are given back (a partial reservation is never
    /// held across a wait) and the device and refusal are the answer.
    fn reserve_parked(&self) -> Result<(), (usize, Refusal)> {
        for d in 0..PARK_DEVICES {
            let bytes = self.park.parked[d].load(Ordering::Relaxed);
            let Some(s) = self.accounting.slot(d as CUdevice).filter(|_| bytes > 0) else {
                continue;
            };
            let limit = s.budget.limit().unwrap_or(NO_CAP);
            // The process holds nothing here (the checkpoint released it
            // all): the parked bytes alone are judged against a cap
            // lowered meanwhile, as a running process keeps what it holds
            // when its cap is lowered.
            if let Err(r) = self
                .accounting
                .reserve_to_resume(s, d as CUdevice, bytes, limit)
            {
                self.unreserve(d);
                return Err((d, r));
            }
        }
        Ok(())
    }

    /// Gives back the reservations of the parked bytes of devices before `upto`.
    fn unreserve(&self, upto: usize) {
        for d in 0..upto {
            let bytes = self.park.parked[d].load(Ordering::Relaxed);
            if let Some(s) = self.accounting.slot(d as CUdevice).filter(|_| bytes > 0) {
                self.accounting.release_on(s, d as CUdevice, bytes);
            }
        }
    }

    /// The first device whose real free memory (asked of another process:
    /// CUDA and NVML calls of this one block while it is checkpointed) is
    /// less than its parked bytes and a margin; a device that cannot be
    /// measured counts as short.
    fn short_of_room(&self) -> Option<usize> {
        let page = self.accounting.page().get(self.settings);
        // With `shim+checkpoint` a device may hold only blocks (no rest):
        // the blocks come back right after the restore, so it is measured
        // too (the page's words hold both).
        let parked: Vec<usize> = (0..PARK_DEVICES)
            .filter(|&d| {
                self.park.parked[d].load(Ordering::Relaxed) > 0
                    || page.header.parked[d].load(Ordering::Relaxed) > 0
            })
            .collect();
        if parked.is_empty() {
            return None;
        }
        let now = now_unix_ns();
        if now.saturating_sub(self.park.short_at.load(Ordering::Relaxed)) < REMEASURE_NS {
            return Some(self.park.short_on.load(Ordering::Relaxed) as usize);
        }
        let short = self.measure_short(page, parked);
        if let Some(d) = short {
            self.park.short_on.store(d as u64, Ordering::Relaxed);
            self.park.short_at.store(now, Ordering::Relaxed);
        }
        short
    }

    /// [`Self::short_of_room`]'s measure, of the devices `parked`.
    fn measure_short(&self, page: &Page, parked: Vec<usize>) -> Option<usize> {
        let free = match self.driver.gpu_free() {
            Ok(f) => f,
            Err(why) => {
                log_once!(
                    Warn,
                    "resume: the GPUs' free memory is not known ({why}); the process stays parked (a restore without room would leave it stuck)"
                );
                return parked.first().copied();
            }
        };
        parked.into_iter().find(|&d| {
            // With `shim+checkpoint` the blocks come back right after the
            // rest: the page's word holds both.
            let want = self.park.parked[d]
                .load(Ordering::Relaxed)
                .max(page.header.parked[d].load(Ordering::Relaxed))
                .saturating_add(RESUME_MARGIN);
            let f = free_on(page, d, &free);
            if f.is_none() {
                log_once!(
                    Warn,
                    "resume: GPU {d}'s free memory is not known (nvidia-smi does not list it); the process stays parked"
                );
            }
            let short = f.is_none_or(|f| f < want);
            if short {
                // What the policy must find on the GPU (items 5b, 10).
                let need = want - f.unwrap_or(0);
                self.park.short_need.store(need, Ordering::Relaxed);
            }
            short
        })
    }
}

/// The free bytes `free` (nvidia-smi's answer, by UUID) lists for the GPU
/// of the page's slot `d`, if it lists it.
fn free_on(page: &Page, d: usize, free: &[(String, u64)]) -> Option<u64> {
    let slot = &page.slots[d];
    let uuid = uuid_text(&slot.uuid_bytes())?;
    let f = free.iter().find(|(g, _)| *g == uuid).map(|&(_, f)| f)?;
    // Much more free than the GPU has (the driver's total, read before the
    // park) is no measure: a restore trusted to it could leave the process
    // stuck for good.
    let total = slot.total.load(Ordering::Relaxed);
    if !believable_free(f, total) {
        log_once!(
            Warn,
            "resume: nvidia-smi says GPU {d} has {f} bytes free, more than its {total} bytes and a sixteenth; not trusted, the process stays parked"
        );
        return None;
    }
    Some(f)
}
