//! What a process holds on a GPU beyond its allocations, and how the cap
//! counts it (`VRAMCAP_COUNT=held`, the default). The definition, and the
//! reasoning behind the rules for pools, graphs and the context:
//! `docs/design/held.md`.
//!
//! # Invariants
//! - The bytes held are allocations + pools + graph memory + the context,
//!   each in its own word of the device's slot and all inside the budget's
//!   `used`: whatever is charged is charged once, under the cap.
//! - A pool is charged by the reserve the driver reports for it, graph
//!   memory by what the device's graph memory grew by, the context by
//!   what NVML measures beyond the allocations.
//! - No allocation goes ahead before the context of its device is
//!   counted (the first figure is waited for; `engine/mod.rs` says how).

use std::sync::atomic::{AtomicU64, Ordering};

use vramcap_core::MAX_DEVICES;
use vramcap_core::budget::NO_CAP;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Counting;

use crate::engine::accounting::state::Accounting;
use std::ffi::c_int;

use crate::engine::accounting::ledger::*;
use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::log_once;

impl<D: Driver> Accounting<D> {
    fn pool_attr(&self, pool: usize, attr: c_int) -> Option<u64> {
        self.driver.mem_pool_attribute(pool, attr).ok()
    }

    fn counting_held(&self) -> bool {
        self.settings.counting == Counting::Held
    }

    /// Step 1 of a pool allocation (module docs): the claim, whose `grow`
    /// the caller reserves. `None` when the driver will not describe the
    /// pool (the caller then charges the allocation by its size), outside
    /// `VRAMCAP_COUNT=held`, and for a pool of host memory (`exempt`).
    pub fn pool_claim(&self, pool: usize, device: u16, size: u64) -> Option<PoolClaim> {
        if !self.counting_held() {
            return None;
        }
        let mut book = self.held.book();
        let i = match book.iter().position(|e| e.pool == pool && !e.destroyed) {
            Some(i) => i,
            None => {
                book.push(PoolEntry::new(pool, self.held.serial(), device, false));
                book.len() - 1
            }
        };
        if book[i].exempt {
            return None;
        }
        // Read under the lock, so no other reading of this pool's figures
        // can be applied after a later one.
        let r = self.pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let u = self.pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        let e = &mut book[i];
        let free = r.saturating_sub(u).saturating_sub(e.claimed);
        let take = free.min(size);
        let grow = (size - take)
            .checked_next_multiple_of(POOL_GRANULE)
            .unwrap_or(u64::MAX);
        e.claimed += take;
        e.inflight += 1;
        Some(PoolClaim {
            serial: e.serial,
            device: e.device,
            grow,
            take,
        })
    }

    /// Whether allocations from `pool` are host memory (a pool created on
    /// the host): not charged to any GPU.
    pub fn pool_exempt(&self, pool: usize) -> bool {
        self.held
            .book()
            .iter()
            .any(|e| e.pool == pool && !e.destroyed && e.exempt)
    }

    /// Step 3 (module docs): settles `claim` after the driver call, and
    /// applies the change. `made`: the allocation exists (it now counts as
    /// one of the pool's live records). `reserved`: the claim's estimate
    /// is in the budget. Where the pool grew by more than the estimate and
    /// the cap has no room for it, the excess is charged anyway (the memory
    /// is held) and said once.
    pub fn pool_settle(&self, claim: PoolClaim, made: bool, reserved: bool) {
        let grow = if reserved { claim.grow } else { 0 };
        let change = {
            let mut book = self.held.book();
            let Some(e) = book.iter_mut().find(|e| e.serial == claim.serial) else {
                drop(book);
                // The entry went (never while a claim is in flight, but
                // the estimate must not stay reserved if it did).
                let device = CUdevice::from(claim.device);
                if let (true, Some(slot)) = (grow > 0, self.slot(device)) {
                    self.release_held(slot, device, grow);
                }
                return;
            };
            e.claimed = e.claimed.saturating_sub(claim.take);
            e.inflight = e.inflight.saturating_sub(1);
            if made {
                e.live += 1;
            }
            let r = if e.destroyed {
                None
            } else {
                self.pool_attr(e.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
            };
            let old = e.charged;
            // Unreadable now: keep what was reserved for it.
            let new = r.map_or(old.saturating_add(grow), |r| e.charge_for(r));
            e.charged = new;
            Change {
                device: e.device,
                old,
                new,
                reserved: grow,
            }
        };
        self.apply(change, "a stream-ordered pool");
    }

    /// Reads pool `pool`'s reserve again and moves its charge to it (never
    /// below, while allocations from it are in flight). False when the pool
    /// is unknown.
    pub fn pool_refresh(&self, pool: usize) -> bool {
        if !self.counting_held() {
            return false;
        }
        let change = {
            let mut book = self.held.book();
            let Some(e) = book
                .iter_mut()
                .find(|e| e.pool == pool && !e.destroyed && !e.exempt)
            else {
                return false;
            };
            let Some(r) = self.pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) else {
                return true;
            };
            let old = e.charged;
            e.charged = e.charge_for(r);
            Change {
                device: e.device,
                old,
                new: e.charged,
                reserved: 0,
            }
        };
        self.apply(change, "a stream-ordered pool");
        true
    }

    /// Every known pool on `device` (all devices for `None`) read again.
    pub fn pools_refresh(&self, device: Option<u16>) {
        if !self.counting_held() {
            return;
        }
        let pools: Vec<usize> = self
            .held
            .book()
            .iter()
            .filter(|e| !e.destroyed && !e.exempt && device.is_none_or(|d| d == e.device))
            .map(|e| e.pool)
            .collect();
        for p in pools {
            self.pool_refresh(p);
        }
    }

    /// `cuMemPoolDestroy` succeeded. Without live allocations its charge
    /// goes back at once; with some, the driver keeps the pool's memory
    /// until the last is freed, so the charge stays (at most `reserved`,
    /// its reserve read before the call) until then.
    pub fn pool_destroyed(&self, pool: usize, reserved: Option<u64>) {
        let change = {
            let mut book = self.held.book();
            let Some(e) = book.iter_mut().find(|e| e.pool == pool && !e.destroyed) else {
                return;
            };
            e.destroyed = true;
            let old = e.charged;
            e.charged = if e.live == 0 {
                0
            } else {
                reserved.map_or(old, |r| r.min(old))
            };
            let c = Change {
                device: e.device,
                old,
                new: e.charged,
                reserved: 0,
            };
            book.retain(|e| !(e.destroyed && e.live == 0 && e.inflight == 0));
            c
        };
        self.apply(change, "a destroyed pool");
    }

    /// A stream-ordered allocation charged through the pool entry `serial`
    /// was freed: one live record less; a destroyed pool's whole charge
    /// goes back with its last one (module docs).
    pub fn pool_freed(&self, serial: u64) {
        let change = {
            let mut book = self.held.book();
            let Some(e) = book.iter_mut().find(|e| e.serial == serial) else {
                return;
            };
            e.live = e.live.saturating_sub(1);
            if !(e.destroyed && e.live == 0) {
                return;
            }
            let c = Change {
                device: e.device,
                old: e.charged,
                new: 0,
                reserved: 0,
            };
            e.charged = 0;
            book.retain(|e| !(e.destroyed && e.live == 0 && e.inflight == 0));
            c
        };
        self.apply(change, "a destroyed pool");
    }

    /// Before a refusal on `device`: trims each of its pools to its release
    /// threshold (what a synchronisation would do) unless a capture is in
    /// progress, reads pools and graph memory again, and measures the
    /// context again (at most every [`CONTEXT_AGAIN`]). The bytes of budget
    /// released, net.
    pub fn reclaim(&self, device: CUdevice) -> u64 {
        if !self.counting_held() {
            return 0;
        }
        let Some(slot) = self.slot(device) else {
            return 0;
        };
        let before = slot.budget.used();
        let dev16 = device as u16;
        let pools: Vec<usize> = self
            .held
            .book()
            .iter()
            .filter(|e| !e.destroyed && !e.exempt && e.device == dev16)
            .map(|e| e.pool)
            .collect();
        if !pools.is_empty() && !self.capture_in_progress() {
            for p in pools {
                let t = self
                    .driver
                    .mem_pool_attribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
                // A threshold at or past the reserve keeps everything: no
                // call (the real driver trims a pool asked to keep
                // UINT64_MAX bytes to nothing, measured on the H200).
                if let (Ok(t), Some(r)) =
                    (t, self.pool_attr(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT))
                    && t < r
                {
                    let _ = self.driver.mem_pool_trim_to(p, t);
                }
            }
        }
        self.pools_refresh(Some(dev16));
        if slot.graphs.load(Ordering::Relaxed) > 0 {
            self.graphs_refresh(device);
        }
        let i = usize::from(dev16) % MAX_DEVICES;
        let tried = self.held.tried_ns[i].load(Ordering::Relaxed);
        if mono_ns().saturating_sub(tried) >= CONTEXT_AGAIN.as_nanos() as u64 {
            self.context_measure(device);
        }
        before.saturating_sub(slot.budget.used())
    }

    /// The background thread's part: pools and graph memory read again on
    /// every device the process uses, the context measured again every
    /// [`CONTEXT_EVERY`] (at once after a context went away).
    pub fn held_round(&self) {
        if self.settings.counting != Counting::Held {
            return;
        }
        self.pools_refresh(None);
        let now = mono_ns();
        let page = self.page.get(self.settings);
        for (i, s) in page.slots.iter().enumerate() {
            if s.flags.load(Ordering::Relaxed) == 0 || s.budget.limit().is_none() {
                continue;
            }
            let device = i as CUdevice;
            self.graphs_refresh(device);
            let last = self.held.measured_ns[i % MAX_DEVICES].load(Ordering::Relaxed);
            if last == 0 || now.saturating_sub(last) >= CONTEXT_EVERY.as_nanos() as u64 {
                self.context_measure(device);
            }
        }
    }

    /// A context on `device` (any device for `None`) went away: measure
    /// again at the next round.
    pub fn context_gone(&self, device: Option<CUdevice>) {
        for (i, m) in self.held.measured_ns.iter().enumerate() {
            if device.is_none_or(|d| usize::try_from(d) == Ok(i)) {
                m.store(0, Ordering::Relaxed);
                self.held.tries[i].store(0, Ordering::Relaxed);
            }
        }
    }

    /// Moves the device's graph charge to its graph reserve.
    pub fn graphs_refresh(&self, device: CUdevice) -> Option<u64> {
        self.graphs_settle(device, 0)
    }

    /// [`Accounting::graphs_refresh`], where `reserved` more bytes are in the
    /// budget for the device's graph memory (an upload's or launch's
    /// admission): they become part of the move, so the room they kept is
    /// never open to another allocation in between.
    pub fn graphs_settle(&self, device: CUdevice, reserved: u64) -> Option<u64> {
        if self.settings.counting != Counting::Held {
            return None;
        }
        let slot = self.slot(device)?;
        // Read and swap under one lock: an older reading is never applied
        // after a newer one. The budget moves after it (additions commute).
        let (old, r) = {
            let _g = self.held.graph_lock();
            let Ok(r) = self
                .driver
                .graph_mem_attribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
            else {
                drop(_g);
                if reserved > 0 {
                    self.release_held(slot, device, reserved);
                }
                return None;
            };
            (slot.graphs.swap(r, Ordering::AcqRel), r)
        };
        self.apply_raw(
            slot,
            device,
            old.saturating_add(reserved),
            r,
            "graph memory",
        );
        Some(r)
    }

    /// Applies a pool's change to its device's budget and `slot.pools`.
    fn apply(&self, c: Change, what: &str) {
        let device = CUdevice::from(c.device);
        let Some(slot) = self.slot(device) else {
            return;
        };
        if c.new >= c.old {
            slot.pools.fetch_add(c.new - c.old, Ordering::Relaxed);
        } else {
            sub(&slot.pools, c.old - c.new);
        }
        self.apply_raw(slot, device, c.old.saturating_add(c.reserved), c.new, what);
    }

    /// Moves `old` bytes of the budget to `new`: a rise is reserved under
    /// the cap where it fits, else charged past it (the memory is held
    /// already); a fall is given back.
    pub(in crate::engine) fn apply_raw(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        old: u64,
        new: u64,
        what: &str,
    ) {
        if new > old {
            self.charge_held(slot, device, new - old, what);
        } else if old > new {
            self.release_held(slot, device, old - new);
        }
    }

    /// Charges bytes the process holds already.
    fn charge_held(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64, what: &str) {
        let limit = self.cap_in_force(slot, device).unwrap_or(NO_CAP);
        if self.reserve_on(slot, device, bytes, limit).is_ok() {
            return;
        }
        let _ = slot.budget.try_reserve(bytes, NO_CAP);
        if self.group.reserve(device, bytes).is_err() {
            self.held.owed[usize::try_from(device).unwrap_or(0) % MAX_DEVICES]
                .fetch_add(bytes, Ordering::Relaxed);
        }
        log_once!(
            Warn,
            "device {device}: {what} holds {bytes} bytes more than vramcap could reserve for it under the cap; the process is over its cap, and new allocations are refused until it is back under"
        );
    }

    /// At a park, which releases everything the process holds on `device`
    /// from both ledgers: nothing is owed to the group any more (the
    /// resume charges all of it to the group again), so a later release
    /// of held bytes gives them back to the group too.
    pub fn forget_owed(&self, device: CUdevice) {
        self.held.owed[usize::try_from(device).unwrap_or(0) % MAX_DEVICES]
            .store(0, Ordering::Release);
    }

    fn release_held(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64) {
        let owed = &self.held.owed[usize::try_from(device).unwrap_or(0) % MAX_DEVICES];
        let mut from_owed = 0;
        let _ = owed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
            from_owed = o.min(bytes);
            Some(o - from_owed)
        });
        if from_owed > 0 {
            slot.budget.release(from_owed);
        }
        if bytes > from_owed {
            self.release_on(slot, device, bytes - from_owed);
        }
    }
}

/// Subtracts, clamping at zero.
fn sub(word: &AtomicU64, bytes: u64) {
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(bytes))
    });
}
