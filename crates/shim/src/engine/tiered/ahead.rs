//! Staging ahead (`VRAMCAP_TIERED_STAGE=ahead`, issue 44's prototype in
//! its second form): the moves the next phase needs are staged and their
//! copies issued on the mover stream while the current phase runs, so
//! that the next phase's stop only remaps.
//!
//! - *Prepare* (after a phase's stop, the gate open): the next phase's
//!   host blocks that fit in the room left under the target are given
//!   device memory at a scratch address and copied there; blocks outside
//!   this phase and the next are copied to host memory as far as the
//!   phase after them needs room ([`plan_ahead`]). Each copy is issued
//!   with the block claimed (a free waits for the issue, then its
//!   synchronisation waits for the copy), then the claim ends: a staged
//!   move holds no claim while the program runs. What it holds (the new
//!   memory, its reservation under the cap or its host budget) is the
//!   same as a round's staged move.
//! - *Written since?* Every hook that submits work passes the gate first
//!   and, under staging ahead, stamps what it may write with the gate's
//!   epoch, which each stop raises by one: a launch the blocks its
//!   parameters name, a copy or memset the block at its destination, and
//!   work whose writes are not decoded (a graph, a copy of many ranges, a
//!   kernel whose parameters were not read) every block
//!   (`Tiers::unseen_at`). A copy issued in epoch `e` stands at the next
//!   stop when neither the block nor the unseen mark is stamped `e` or
//!   later: work submitted before the stop that opened epoch `e` was
//!   drained by it, and so ran before the copy.
//! - *Remap* (the next phase's stop, `stage.rs`): each staged move still
//!   wanted is claimed again and carried out by `move_staged`, with its
//!   copy made again inside the stop when it was written since; a move
//!   whose block was freed, moved by another (a heat round, a park) or is
//!   no longer wanted is dropped: its copy waited for, its memory and
//!   budget given back.
//!
//! What it cannot see: a kernel that writes through a pointer it reads
//! from memory (an array of pointers in device memory) writes a block no
//! parameter names. An array the program copies from the host
//! (`cuMemcpyHtoD*`) is read for block addresses, and blocks found there
//! are never staged ahead; an array built on the GPU is not seen, and a
//! copy ahead of a block it points to may go stale. The in-stop form
//! (`on`) has no such gap. This is the decision's open risk
//! (docs/design/tiered.md).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use vramcap_core::page::DeviceSlot;

use super::rounds::Staged;
use super::{Place, Plan, TierBlock, Tiering, Tiers, to_promote};
use crate::engine::driver::Driver;
use crate::ffi::*;

/// One move staged and copied ahead, no claim held.
pub struct Ahead {
    block: Arc<TierBlock>,
    to: Place,
    handle: u64,
    scratch: u64,
    stream: usize,
    /// The block's handle and the round that last moved it, when staged:
    /// another value later means another move came first.
    from: u64,
    moved: u64,
    /// The gate's epoch the copy was issued in.
    epoch: u64,
}

impl TierBlock {
    /// Whether a move of it may be staged ahead: not a page of the
    /// program's own (a tensor may span several, and a write stamps only
    /// the page its pointer names), and never seen in an array of
    /// pointers the program copied to the GPU.
    fn stageable(&self) -> bool {
        self.program_handle == 0 && !self.indirect.load(Ordering::Relaxed)
    }
}

impl Tiers {
    /// Whether `b` was stamped with no write in `epoch` or later, and no
    /// unseen write was either (read with the gate closed).
    pub(super) fn unwritten_since(&self, b: &TierBlock, epoch: u64) -> bool {
        b.written.load(Ordering::Relaxed) < epoch && self.unseen_at.load(Ordering::Relaxed) < epoch
    }

    /// Counts a move staged ahead at its remap: its copy stood (`fresh`)
    /// or was made again.
    pub(super) fn count_ahead(&self, bytes: u64, fresh: bool) {
        let st = &self.stage_stats;
        let n = if fresh { &st.ahead } else { &st.redone };
        n.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The moves staged ahead that `which` picks, taken out.
    fn take_ahead_where(&self, which: impl Fn(&Ahead) -> bool) -> Vec<Ahead> {
        let mut all = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let (picked, rest): (Vec<Ahead>, Vec<Ahead>) = all.drain(..).partition(|a| which(a));
        *all = rest;
        picked
    }

    /// Whether any move is staged ahead.
    pub(in crate::engine) fn has_ahead(&self) -> bool {
        !self
            .ahead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

impl<D: Driver> Tiering<'static, D> {
    /// Stages the moves of `p` ahead (module docs): each block's new
    /// memory made and its copy issued, kept in `Tiers::ahead`.
    pub(super) fn prepare(&self, slot: &DeviceSlot, device: CUdevice, limit: u64, p: Plan) {
        let moves = p
            .demote
            .into_iter()
            .map(|b| (b, Place::Host))
            .chain(p.promote.into_iter().map(|b| (b, Place::Device)));
        for (b, to) in moves {
            let Ok(m) = self.stage(slot, device, limit, b, to, false) else {
                continue;
            };
            let (from, moved) = (m.block.handle(), m.block.moved.load(Ordering::Relaxed));
            // The epoch is read before the copy is issued: a write stamped
            // with it may have been submitted before the copy and run
            // beside it.
            let epoch = self.tiers.epoch.load(Ordering::Relaxed);
            if self
                .driver
                .copy_dtod(m.scratch, m.block.ptr, m.block.bytes, m.stream)
                != CUDA_SUCCESS
            {
                self.unstage(slot, device, m);
                continue;
            }
            let Staged {
                block,
                to,
                handle,
                scratch,
                stream,
                ..
            } = m;
            let a = Ahead {
                block: block.release(),
                to,
                handle,
                scratch,
                stream,
                from,
                moved,
                epoch,
            };
            self.tiers
                .ahead
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(a);
        }
    }

    /// The moves staged ahead for `dev` that `wanted` still wants, claimed
    /// again for their remap; the others dropped.
    pub(super) fn reclaim(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        dev: u16,
        wanted: impl Fn(&TierBlock, Place) -> bool,
    ) -> Vec<Staged> {
        let mut out = Vec::new();
        for a in self.tiers.take_ahead_where(|a| a.block.device == dev) {
            if !wanted(&a.block, a.to) {
                self.drop_one(Some(slot), device, a);
                continue;
            }
            let Some(c) = a.block.claim() else {
                self.drop_one(Some(slot), device, a);
                continue;
            };
            if c.handle() != a.from || c.moved.load(Ordering::Relaxed) != a.moved {
                drop(c);
                self.drop_one(Some(slot), device, a);
                continue;
            }
            out.push(Staged {
                block: c,
                to: a.to,
                handle: a.handle,
                scratch: a.scratch,
                stream: a.stream,
                park: false,
                pages: None,
                ahead: Some(a.epoch),
            });
        }
        out
    }

    /// Drops every move staged ahead (the order lost, moves paused, a
    /// park coming, a capture beginning).
    pub(in crate::engine) fn drop_ahead(&self) {
        self.drop_ahead_where(|_| true);
    }

    /// Drops the moves staged ahead of blocks of context `ctx`, which is
    /// about to be destroyed (its mover stream with it).
    pub(in crate::engine) fn drop_ahead_of_ctx(&self, ctx: usize) {
        if self.tiers.has_ahead() {
            self.drop_ahead_where(|a| a.block.ctx == ctx);
        }
    }

    /// Drops the move staged ahead of the block at `ptr` (freed, its
    /// address unmapped next).
    pub(in crate::engine) fn drop_ahead_of_block(&self, ptr: u64) {
        self.drop_ahead_where(|a| a.block.ptr == ptr);
    }

    /// Drops the moves staged ahead that `which` picks.
    fn drop_ahead_where(&self, which: impl Fn(&Ahead) -> bool) {
        for a in self.tiers.take_ahead_where(which) {
            let device = CUdevice::from(a.block.device);
            self.drop_one(self.accounting.slot(device), device, a);
        }
    }

    /// Drops one move staged ahead: waits for its copy (its new memory is
    /// the copy's destination), then gives back the memory and what was
    /// taken for it.
    fn drop_one(&self, slot: Option<&DeviceSlot>, device: CUdevice, a: Ahead) {
        let bytes = a.block.bytes;
        self.release_new(a.scratch, a.handle, bytes, Some(a.stream));
        self.give_back_taken(slot, device, a.to, false, bytes);
        let st = &self.tiers.stage_stats;
        st.dropped.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// The moves to stage ahead of the next phase (`next`) while the phase
/// `now` runs, within `room` bytes under the target: `next`'s host blocks
/// that fit are promoted; blocks outside both phases, coldest first, are
/// demoted as far as the next stop then needs room for the rest of
/// `next` and for `share` bytes more (a phase's budget: the phase after).
/// Only blocks [`TierBlock::stageable`]; the others move inside the stops.
pub(super) fn plan_ahead(
    mine: &[Arc<TierBlock>],
    now: &[u64],
    next: &[u64],
    mut room: i128,
    share: u64,
) -> Plan {
    let mut p = Plan::default();
    let mut left: i128 = 0;
    for addr in next {
        let Some(b) = to_promote(mine, *addr, &p.promote) else {
            continue;
        };
        if !b.stageable() {
            left += i128::from(b.bytes);
            continue;
        }
        if room >= i128::from(b.bytes) {
            room -= i128::from(b.bytes);
            p.promote.push(b.clone());
        } else {
            left += i128::from(b.bytes);
        }
    }
    let mut want = left + i128::from(share) - room.max(0);
    if want <= 0 {
        return p;
    }
    let mut spare: Vec<&Arc<TierBlock>> = mine
        .iter()
        .filter(|b| {
            b.on_device()
                && b.movable()
                && b.stageable()
                && !now.contains(&b.ptr)
                && !next.contains(&b.ptr)
        })
        .collect();
    // Coldest first.
    spare.sort_by(|x, y| x.score().total_cmp(&y.score()));
    for d in spare {
        if want <= 0 {
            break;
        }
        want -= i128::from(d.bytes);
        p.demote.push(d.clone());
    }
    p
}

#[cfg(test)]
impl Tiers {
    /// The bytes whose copy ahead stood, were copied again and were
    /// dropped, so far.
    pub(in crate::engine) fn ahead_counts(&self) -> (u64, u64, u64) {
        let st = &self.stage_stats;
        (
            st.ahead.load(Ordering::Relaxed),
            st.redone.load(Ordering::Relaxed),
            st.dropped.load(Ordering::Relaxed),
        )
    }

    /// The moves staged ahead now: each block's address and where it goes,
    /// by address.
    pub(in crate::engine) fn ahead_staged(&self) -> Vec<(u64, Place)> {
        let mut v: Vec<(u64, Place)> = self
            .ahead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|a| (a.block.ptr, a.to))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// Whether a phase was entered and not yet acted on.
    pub(in crate::engine) fn entry_pending(&self) -> bool {
        self.entered.load(Ordering::Acquire) != 0
    }

    /// The followed step's phases' block addresses.
    pub(in crate::engine) fn followed_phases(&self) -> Vec<Vec<u64>> {
        self.stage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or_else(Vec::new, |f| f.phases.clone())
    }
}
