//! Staging by the launch order, issue 44's prototype
//! (`VRAMCAP_TIERED_STAGE=on` or `ahead`, with `VRAMCAP_SPILL=tiered`;
//! experimental, a spike to be measured and then kept or deleted): instead
//! of placing blocks by heat, follow the step's launch order and, at each
//! phase's first launch, move the blocks of that phase and of the next
//! onto the GPU, the others off as room needs.
//!
//! - *Learn* (the background thread, every [`LEARN_ROUNDS`] rounds): the
//!   launches recorded (`heat.rs`), their period and phases under the cap
//!   (`phases.rs`); a step of two phases or more is followed by a
//!   [`Follower`] of its kernels, with each phase's block addresses (a
//!   step that fits in one phase is heat's). While a step is followed, the
//!   last one recorded, turned to start where the followed one does, is
//!   checked against it: when its launches use other blocks now (the
//!   program's allocator placed a tensor elsewhere), it replaces it.
//! - *Follow* (the launch hook, [`Tiers::follow`]): each launch's kernel
//!   goes to the follower under one mutex; a phase's first launch stores
//!   the phase in `entered` and, when it is another phase than the one
//!   stored, wakes the background thread; a launch out of order clears it.
//! - *Stage* (the background thread: the short round it runs when woken,
//!   [`Tiering::stage_now`], or a full round's [`Tiering::stage_round`]):
//!   a phase entered is acted on once, with the same stage, stop and remap
//!   as a heat round's moves (`rounds.rs`): with `on` the world stops for
//!   the copies; with `ahead` the next phase's copies are made while the
//!   phase runs and its stop only remaps (`ahead.rs`). Short rounds count
//!   no round: the rounds that time
//!   pauses and block ages keep their pace. While the step is followed,
//!   heat places nothing, unless a device is over its target (a lowered
//!   cap: heat's demotions bring it under); once the order breaks, heat
//!   places again.
//! - What it did is counted ([`Stats`]) and said at info level every
//!   [`SAY_ROUNDS`] rounds: phases acted on, bytes in and out, stops of
//!   the world, time in moves, orders lost: the figures the decision needs.
//!
//! CUDA graphs' launches are not followed (a step launched as a graph is
//! not found); the launches of several threads interleave into one order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use vramcap_core::budget::NO_CAP;

use super::ahead::plan_ahead;
use super::phases::{self, Follower, Split};
use super::rounds::devices_of;
use super::{PROMOTE_MARGIN, Place, Plan, TierBlock, Tiering, Tiers, to_promote};
use crate::engine::driver::Driver;
use crate::ffi::CUdevice;
use crate::log::{log_at, log_once};

/// Rounds between tries to learn a step while none is followed.
pub const LEARN_ROUNDS: u64 = 10;
/// Rounds between the info lines of what staging did.
const SAY_ROUNDS: u64 = 50;
/// Staging ahead, a phase's budget is this share of the target's.
const AHEAD_SHARES: u64 = 3;
/// The longest a phase's first launch waits for its moves, staging ahead
/// (a stop waits at most [`super::STOP_WAIT`] for the gate, then drains).
const ENTRY_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The step followed: its follower, each phase's block addresses, and
/// the budget its phases were cut under.
pub struct Followed {
    follower: Follower,
    pub(super) phases: Vec<Vec<u64>>,
    kernels: Vec<u64>,
    share: u64,
}

/// What staging did since the last info line.
#[derive(Default)]
pub struct Stats {
    entered: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    move_us: AtomicU64,
    /// Stops of the world: a phase's demotions and its promotions stop
    /// it once each.
    stops: AtomicU64,
    lost: AtomicU64,
    /// Staging ahead (`ahead.rs`): bytes whose copy ahead stood at the
    /// remap, bytes copied again in the stop (written since), and bytes
    /// staged ahead and dropped.
    pub(super) ahead: AtomicU64,
    pub(super) redone: AtomicU64,
    pub(super) dropped: AtomicU64,
    /// The stops' time (every move's, `rounds.rs`), µs: the drain, the
    /// copies inside the stop, the remaps.
    drain_us: AtomicU64,
    copy_us: AtomicU64,
    remap_us: AtomicU64,
}

impl Tiers {
    /// One launch of `kernel` (the launch hook, under staging only, before
    /// the gate): staging ahead, when it begins another phase, the entry's
    /// number, for [`Tiers::wait_remapped`].
    pub(in crate::engine) fn follow(&self, kernel: u64) -> Option<u64> {
        let step = {
            let mut g = self.stage.lock().unwrap_or_else(|e| e.into_inner());
            g.as_mut().map(|f| f.follower.launched(kernel))
        };
        match step {
            Some(phases::Followed::Entered(i)) => {
                // Woken once per phase entered, not per launch. The entry
                // is numbered before it is stored: a round that takes it
                // then reads a number that covers it.
                if self.entered.load(Ordering::Acquire) == i + 1 {
                    return None;
                }
                let seq = self.entries.fetch_add(1, Ordering::AcqRel) + 1;
                if self.entered.swap(i + 1, Ordering::AcqRel) == i + 1 {
                    return None;
                }
                if let Some(t) = self.waker.get() {
                    t.unpark();
                }
                return self.ahead_on.then_some(seq);
            }
            Some(phases::Followed::Lost) => {
                self.entered.store(0, Ordering::Release);
                self.stage_stats.lost.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        None
    }

    /// Waits, at most [`ENTRY_WAIT`], until the phase entry `seq` was acted
    /// on: its staged moves remapped (or the background thread passed it
    /// by).
    pub(in crate::engine) fn wait_remapped(&self, seq: u64) {
        let g = self.remapped.lock().unwrap_or_else(|e| e.into_inner());
        let (_g, timeout) = self
            .remapped_cv
            .wait_timeout_while(g, ENTRY_WAIT, |done| *done < seq)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() {
            log_once!(
                Debug,
                "tiered spill: staging ahead: a phase's first launch waited {ENTRY_WAIT:?} for its moves and went on"
            );
        }
    }

    /// The entries numbered so far are acted on (or passed by): their
    /// launches go on.
    pub(in crate::engine) fn publish(&self) {
        let seq = self.entries.load(Ordering::Acquire);
        let mut g = self.remapped.lock().unwrap_or_else(|e| e.into_inner());
        if *g < seq {
            *g = seq;
        }
        drop(g);
        self.remapped_cv.notify_all();
    }

    /// What one stop took: the drain, the copies inside it, the remaps.
    pub(super) fn stop_times(
        &self,
        drain: std::time::Duration,
        copy: std::time::Duration,
        remap: std::time::Duration,
    ) {
        let st = &self.stage_stats;
        for (n, d) in [
            (&st.drain_us, drain),
            (&st.copy_us, copy),
            (&st.remap_us, remap),
        ] {
            n.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// Whether the step followed is locked on.
    pub(in crate::engine) fn stage_locked(&self) -> bool {
        self.stage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|f| f.follower.locked())
    }
}

impl<D: Driver> Tiering<'static, D> {
    /// Staging's part of a full round (module docs): true when it placed
    /// the blocks this round or left them where the step wants them, so
    /// that heat places nothing; false while no step is followed, or when
    /// a device is over its target (heat's demotions bring it under).
    pub(super) fn stage_round(&self, blocks: &[Arc<TierBlock>], round: u64) -> bool {
        let _ = self.tiers.waker.get_or_init(std::thread::current);
        if round.is_multiple_of(SAY_ROUNDS) {
            self.say_staged(round);
        }
        if self.tiers.stage_locked() && round.is_multiple_of(LEARN_ROUNDS) {
            // Followed: the phases' blocks checked against the last step's.
            self.learn(blocks);
        }
        if !self.tiers.stage_locked() {
            self.not_following();
            let followed = self
                .tiers
                .stage
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            if !followed || round.is_multiple_of(LEARN_ROUNDS) {
                self.learn(blocks);
            }
            return false;
        }
        self.act(blocks);
        self.tiers.publish();
        !self.any_over(blocks)
    }

    /// The short round's part (`Engine::tier_stage`): the moves of the
    /// phase entered, if a step is followed and one was entered.
    pub fn stage_now(&self) {
        if self.tiers.paused() || !self.tiers.stage_locked() {
            self.not_following();
            return;
        }
        self.act(&self.tiers.snapshot());
        self.tiers.publish();
    }

    /// No step followed (or moves paused): a launch waiting for its moves
    /// goes on, and nothing staged ahead keeps room or memory.
    fn not_following(&self) {
        self.tiers.publish();
        if self.tiers.has_ahead() {
            self.drop_ahead();
        }
    }

    /// Whether a device of `blocks` is over its target (a cap or soft limit
    /// lowered while it runs).
    fn any_over(&self, blocks: &[Arc<TierBlock>]) -> bool {
        devices_of(blocks).into_iter().any(|dev| {
            let device = CUdevice::from(dev);
            self.target(device)
                .zip(self.accounting.slot(device))
                .is_some_and(|((_, t), s)| t != NO_CAP && s.budget.used() > t)
        })
    }

    /// Acts on the phase entered last, once: its blocks and, as room is
    /// left, the next phase's onto the GPU, on each device. Staging ahead
    /// (`ahead.rs`), the moves staged during the phase before are
    /// remapped first, what `now` still lacks is moved inside the stop,
    /// and the next phase's moves are staged once the gate is open again.
    /// Left for the next round while a synchronisation of an earlier one
    /// still runs.
    fn act(&self, blocks: &[Arc<TierBlock>]) {
        if self.tiers.syncing() {
            return;
        }
        let entered = self.tiers.entered.swap(0, Ordering::AcqRel);
        if entered == 0 {
            return;
        }
        let round = self.tiers.round_now();
        let (now, next, share): (Vec<u64>, Vec<u64>, u64) = {
            let g = self.tiers.stage.lock().unwrap_or_else(|e| e.into_inner());
            let Some(f) = g.as_ref() else { return };
            let k = f.phases.len();
            (
                f.phases[(entered - 1) % k].clone(),
                f.phases[entered % k].clone(),
                f.share,
            )
        };
        let ahead = self.tiers.ahead_on;
        let st = &self.tiers.stage_stats;
        for dev in devices_of(blocks) {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let Some((limit, target)) = self.target(device) else {
                continue;
            };
            if target == NO_CAP {
                continue;
            }
            let room = || {
                i128::from(target)
                    - i128::from(PROMOTE_MARGIN.min(target))
                    - i128::from(slot.budget.used())
            };
            let mine: Vec<Arc<TierBlock>> =
                blocks.iter().filter(|b| b.device == dev).cloned().collect();
            let start = Instant::now();
            let mut stops = 0;
            if ahead {
                let ready = self.reclaim(slot, device, dev, |b, to| match to {
                    Place::Device => now.contains(&b.ptr) || next.contains(&b.ptr),
                    Place::Host => !now.contains(&b.ptr),
                });
                let (ins, out) = split_bytes(ready.iter().map(|m| (m.to, m.bytes())));
                if !ready.is_empty() {
                    stops += 1;
                    self.move_staged(slot, device, round, ready);
                    st.bytes_in.fetch_add(ins, Ordering::Relaxed);
                    st.bytes_out.fetch_add(out, Ordering::Relaxed);
                }
            }
            // Inside the stop: what `now` lacks (and, copying inside the
            // stop, `next` as room is left).
            let next_now: &[u64] = if ahead { &[] } else { &next };
            let p = plan_for(&mine, &now, next_now, room());
            if !p.demote.is_empty() || !p.promote.is_empty() {
                let (ins, out) = split_bytes(
                    (p.demote.iter().map(|b| (Place::Host, b.bytes)))
                        .chain(p.promote.iter().map(|b| (Place::Device, b.bytes))),
                );
                stops += u64::from(!p.demote.is_empty()) + u64::from(!p.promote.is_empty());
                self.apply(slot, device, limit, round, p);
                st.bytes_in.fetch_add(ins, Ordering::Relaxed);
                st.bytes_out.fetch_add(out, Ordering::Relaxed);
            }
            if ahead {
                // The phase's first launch may go on now.
                self.tiers.publish();
                // Not while a stop's synchronisation still runs: work
                // submitted before it may still write.
                if !self.tiers.syncing() {
                    let p = plan_ahead(&mine, &now, &next, room(), share);
                    self.prepare(slot, device, limit, p);
                }
            }
            st.stops.fetch_add(stops, Ordering::Relaxed);
            st.move_us
                .fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        st.entered.fetch_add(1, Ordering::Relaxed);
    }

    /// Learns the step from the launches recorded, if it repeats and
    /// splits under the first device's target into two phases or more;
    /// follows it unless the same step is followed already.
    fn learn(&self, blocks: &[Arc<TierBlock>]) {
        let size_of = |p: u64| blocks.iter().find(|b| b.ptr == p).map(|b| b.bytes);
        let Some(mut step) = phases::last_step(&self.tiers.recorded(), size_of) else {
            return;
        };
        // The step followed, seen from another launch: turned to start
        // where the followed one does, so that its phases compare.
        // (The followed kernels copied out: launches take the same mutex.)
        let followed = self
            .tiers
            .stage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|f| f.kernels.clone());
        let turn = followed.and_then(|k| phases::rotation(&step.kernels, &k));
        if let Some(r) = turn {
            step = step.turned(r);
        }
        // The phases are cut under the first block's device's target (one
        // GPU: a prototype's limit); staging ahead, under a third of it, so
        // that the phase before, the phase and the next fit together (the
        // whole of it when one launch needs more).
        let whole = self.stage_budget(blocks);
        let mut budget = if self.tiers.ahead_on {
            whole / AHEAD_SHARES
        } else {
            whole
        };
        let mut split = phases::split(&step.launches, &step.sizes, budget);
        if matches!(split, Split::Unfit { .. }) && budget < whole {
            budget = whole;
            split = phases::split(&step.launches, &step.sizes, budget);
        }
        // One phase: the whole step fits, and heat keeps it on the GPU.
        let Split::Phases(cut) = split else {
            return;
        };
        if cut.len() < 2 {
            return;
        }
        let addrs: Vec<Vec<u64>> = cut
            .iter()
            .map(|p| p.blocks.iter().map(|&i| step.starts[i]).collect())
            .collect();
        let mut g = self.tiers.stage.lock().unwrap_or_else(|e| e.into_inner());
        // The same step (kernels and blocks) keeps its follower, and with
        // it its progress; another replaces it (the same kernels whose
        // launches use other blocks now, too: the blocks a phase moves
        // follow the program's).
        if g.as_ref()
            .is_some_and(|f| f.phases == addrs && f.kernels == step.kernels)
        {
            return;
        }
        log_at!(
            Info,
            "tiered spill: staging ahead: following a step of {} launches in {} phases under {budget} bytes",
            step.period,
            cut.len()
        );
        let replaced = g.is_some();
        *g = Some(Followed {
            follower: Follower::new(step.kernels.clone(), &cut),
            phases: addrs,
            kernels: step.kernels,
            share: budget,
        });
        drop(g);
        if replaced {
            // The entry stored names a phase of the step replaced.
            self.tiers.entered.store(0, Ordering::Release);
            self.tiers.publish();
        }
    }

    /// The info line of what staging did since the last one.
    fn say_staged(&self, round: u64) {
        let st = &self.tiers.stage_stats;
        let entered = st.entered.swap(0, Ordering::Relaxed);
        let lost = st.lost.swap(0, Ordering::Relaxed);
        let (ins, out) = (
            st.bytes_in.swap(0, Ordering::Relaxed),
            st.bytes_out.swap(0, Ordering::Relaxed),
        );
        let us = st.move_us.swap(0, Ordering::Relaxed);
        let stops = st.stops.swap(0, Ordering::Relaxed);
        let (ahead, redone, dropped) = (
            st.ahead.swap(0, Ordering::Relaxed),
            st.redone.swap(0, Ordering::Relaxed),
            st.dropped.swap(0, Ordering::Relaxed),
        );
        let ms = |n: &AtomicU64| n.swap(0, Ordering::Relaxed) as f64 / 1000.0;
        let (drain, copy, remap) = (ms(&st.drain_us), ms(&st.copy_us), ms(&st.remap_us));
        if entered + lost > 0 {
            let copies = if self.tiers.ahead_on {
                format!(
                    "; copied ahead: {ahead} bytes stood, {redone} copied again in the stop (written since), {dropped} dropped"
                )
            } else {
                String::new()
            };
            log_at!(
                Info,
                "tiered spill: round {round}: staging: {entered} phases acted on, {ins} bytes in and {out} out in {stops} stops, {:.1} ms of moves (the stops and the copies ahead; in the stops {drain:.1} ms draining the GPU, {copy:.1} copying, {remap:.1} remapping); the order lost {lost} times{copies}",
                us as f64 / 1000.0
            );
        }
    }
}

/// The moves that put the blocks of the phase entered (`now`) and, as
/// room is left, of the next one (`next`) on the GPU within `room` bytes:
/// host blocks of `now` are promoted, demoting any device block outside
/// `now` (those outside `next` first, coldest first); then host blocks of
/// `next`, demoting only blocks outside both.
fn plan_for(mine: &[Arc<TierBlock>], now: &[u64], next: &[u64], mut room: i128) -> Plan {
    let in_next = |b: &Arc<TierBlock>| next.contains(&b.ptr);
    let mut spare: Vec<Arc<TierBlock>> = mine
        .iter()
        .filter(|b| b.on_device() && b.movable() && !now.contains(&b.ptr))
        .cloned()
        .collect();
    // Popped from the end: outside `next` and coldest first.
    spare.sort_by(|x, y| {
        (!in_next(x))
            .cmp(&!in_next(y))
            .then(y.score().total_cmp(&x.score()))
    });
    let mut p = Plan {
        demote: Vec::new(),
        promote: Vec::new(),
    };
    for (wanted, may_take_next) in [(now, true), (next, false)] {
        for addr in wanted {
            let Some(b) = to_promote(mine, *addr, &p.promote) else {
                continue;
            };
            let mut freed = Vec::new();
            while room < i128::from(b.bytes) {
                match spare.last() {
                    Some(d) if may_take_next || !in_next(d) => {}
                    _ => break,
                }
                let Some(d) = spare.pop() else { break };
                room += i128::from(d.bytes);
                freed.push(d);
            }
            if room < i128::from(b.bytes) {
                // It cannot fit: nothing is demoted for it.
                for d in freed.into_iter().rev() {
                    room -= i128::from(d.bytes);
                    spare.push(d);
                }
                break;
            }
            p.demote.extend(freed);
            room -= i128::from(b.bytes);
            p.promote.push(b.clone());
        }
    }
    p
}

/// The bytes moving in (to the GPU) and out of `moves`.
fn split_bytes(moves: impl Iterator<Item = (Place, u64)>) -> (u64, u64) {
    moves.fold((0, 0), |(i, o), (to, b)| match to {
        Place::Device => (i + b, o),
        Place::Host => (i, o + b),
    })
}
