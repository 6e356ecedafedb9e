//! The group page's operations: joining and leaving, reserving and
//! releasing against the members' ledgers, following the group's cap,
//! and reclaiming a dead member's seat (the design is in `mod.rs`).

use super::*;

impl GroupPage {
    pub(super) fn hwm(&self) -> usize {
        (self.header.members_hwm.load(SeqCst) as usize).min(MEMBERS)
    }

    /// Claims a free member slot for `pid`; `None` when all are taken.
    /// `lock(i)` takes the slot's liveness lock first (false: someone holds
    /// it) and `unlock(i)` gives it back when the slot was taken meanwhile,
    /// so a slot is never claimed without its lock held.
    pub fn join(
        &self,
        pid: u32,
        start_time: u64,
        lock: impl FnMut(usize) -> bool,
        unlock: impl FnMut(usize),
    ) -> Option<Seat> {
        self.join_stepped(pid, start_time, lock, unlock, &mut no_steps)
    }

    /// [`GroupPage::join`], calling `step` before each shared access.
    pub fn join_stepped(
        &self,
        pid: u32,
        start_time: u64,
        mut lock: impl FnMut(usize) -> bool,
        mut unlock: impl FnMut(usize),
        step: &mut impl Steps,
    ) -> Option<Seat> {
        let pid = if matches!(pid, FREE | JOINING) {
            1
        } else {
            pid
        };
        for (i, m) in self.members.iter().enumerate() {
            step("join: read a slot's owner");
            let seen = m.owner.load(SeqCst);
            if owner_pid(seen) != FREE {
                continue;
            }
            step("join: take the slot's lock");
            if !lock(i) {
                continue;
            }
            let generation = owner_generation(seen);
            step("join: claim the slot");
            if m.owner
                .compare_exchange(seen, owner_word(generation, JOINING), SeqCst, SeqCst)
                .is_err()
            {
                step("join: give the lock back");
                unlock(i);
                continue;
            }
            // Zero what a dead predecessor left. A ledger is written only
            // for a complete entry, and a member looking for its GPU leaves
            // key word 0 of every entry it looks at written (key words are
            // never cleared): so every entry before the first with key word
            // 0 unwritten covers every ledger ever written.
            for (e, dev) in self.devices.iter().enumerate() {
                step("join: look at an entry");
                if dev.key[0].load(SeqCst) == 0 {
                    break;
                }
                step("join: zero held");
                self.ledgers[e][i].held.store(0, SeqCst);
                step("join: zero pending");
                self.ledgers[e][i].pending.store(0, SeqCst);
            }
            step("join: raise the high-water mark");
            self.header.members_hwm.fetch_max(i as u32 + 1, SeqCst);
            step("join: label the start time");
            m.start_time.store(start_time, SeqCst);
            let owner = owner_word(generation, pid);
            step("join: count from now on");
            m.owner.store(owner, SeqCst);
            return Some(Seat { slot: i, owner });
        }
        None
    }

    /// Whether `seat` is still this member's.
    pub fn seated(&self, seat: Seat) -> bool {
        self.members
            .get(seat.slot)
            .is_some_and(|m| m.owner.load(SeqCst) == seat.owner)
    }

    /// At normal exit: frees the member's slot; its bytes stop counting at
    /// once. False when the seat was not its own any more.
    pub fn leave(&self, seat: Seat) -> bool {
        self.leave_stepped(seat, &mut no_steps)
    }

    /// [`GroupPage::leave`], calling `step` before each shared access.
    pub fn leave_stepped(&self, seat: Seat, step: &mut impl Steps) -> bool {
        let Some(m) = self.members.get(seat.slot) else {
            return false;
        };
        let free = owner_word(owner_generation(seat.owner).wrapping_add(1), FREE);
        step("leave: free the slot");
        m.owner
            .compare_exchange(seat.owner, free, SeqCst, SeqCst)
            .is_ok()
    }

    /// Frees the slot of member `i` if its process is gone (`alive` says
    /// whether slot `i` with this pid and start time is still held; members
    /// hold a lock on [`member_lock_offset`] while they live). Returns the
    /// bytes that stopped counting, or `None` if the slot was not freed.
    pub fn reclaim_if_dead(
        &self,
        i: usize,
        alive: impl Fn(usize, u32, u64) -> bool,
    ) -> Option<u64> {
        self.reclaim_stepped(i, alive, &mut no_steps)
    }

    /// [`GroupPage::reclaim_if_dead`], calling `step` before each shared
    /// access (the liveness question included).
    pub fn reclaim_stepped(
        &self,
        i: usize,
        alive: impl Fn(usize, u32, u64) -> bool,
        step: &mut impl Steps,
    ) -> Option<u64> {
        let m = self.members.get(i)?;
        step("reclaim: read the owner");
        let seen = m.owner.load(SeqCst);
        let pid = owner_pid(seen);
        if pid == FREE {
            return None;
        }
        step("reclaim: read the start time");
        let start = m.start_time.load(SeqCst);
        step("reclaim: look at the lock");
        if alive(i, pid, start) {
            return None;
        }
        // Only informative (the member is dead, nobody else writes them).
        let mut bytes = 0u64;
        if pid != JOINING {
            for (e, dev) in self.devices.iter().enumerate() {
                step("reclaim: look at an entry");
                if dev.key[0].load(SeqCst) == 0 {
                    break;
                }
                step("reclaim: read held");
                bytes = bytes.saturating_add(self.ledgers[e][i].held.load(SeqCst));
            }
        }
        let free = owner_word(owner_generation(seen).wrapping_add(1), FREE);
        step("reclaim: free the slot");
        m.owner.compare_exchange(seen, free, SeqCst, SeqCst).ok()?;
        Some(bytes)
    }

    /// The entry of the GPU with this UUID, writing a free one (and its
    /// limit, `limit_for()`, if nobody has) if none has it yet; `None` when
    /// every entry holds another GPU. Wait-free: at most three CASes per
    /// entry and one for the limit.
    pub fn device_for(&self, uuid: [u8; 16], limit_for: impl FnOnce() -> u64) -> Option<usize> {
        self.device_for_stepped(uuid, limit_for, &mut no_steps)
    }

    /// [`GroupPage::device_for`], calling `step` before each shared access.
    pub fn device_for_stepped(
        &self,
        uuid: [u8; 16],
        limit_for: impl FnOnce() -> u64,
        step: &mut impl Steps,
    ) -> Option<usize> {
        let want = uuid_key(uuid);
        let found = self.devices.iter().position(|d| {
            want.iter().zip(&d.key).all(|(&w, word)| {
                step("device: write a key word");
                match word.compare_exchange(0, w, SeqCst, SeqCst) {
                    Ok(_) => true,
                    Err(seen) => seen == w,
                }
            })
        })?;
        let d = &self.devices[found];
        step("device: read the limit");
        if d.limit.load(SeqCst) == 0 {
            let limit = encode_limit(limit_for());
            step("device: set the limit");
            let _ = d.limit.compare_exchange(0, limit, SeqCst, SeqCst);
        }
        Some(found)
    }

    /// Reserves `bytes` on device entry `entry` for the member at `seat`
    /// (one attempt; see the module docs).
    pub fn reserve(&self, entry: usize, seat: Seat, bytes: u64) -> Result<(), Refusal> {
        self.reserve_stepped(entry, seat, bytes, &mut no_steps)
    }

    /// [`GroupPage::reserve`], calling `step` before each shared access.
    pub fn reserve_stepped(
        &self,
        entry: usize,
        seat: Seat,
        bytes: u64,
        step: &mut impl Steps,
    ) -> Result<(), Refusal> {
        let (Some(dev), Some(ledgers)) = (self.devices.get(entry), self.ledgers.get(entry)) else {
            return Err(Refusal::Unseated);
        };
        let Some(mine) = ledgers.get(seat.slot) else {
            return Err(Refusal::Unseated);
        };
        step("reserve: check the seat");
        if !self.seated(seat) {
            return Err(Refusal::Unseated);
        }
        step("reserve: read the limit");
        let Some(limit) = dev.limit() else {
            return Err(Refusal::Unseated);
        };
        if bytes == 0 {
            return Ok(());
        }
        if bytes > limit || bytes > MAX_REQUEST {
            return Err(Refusal::Full {
                used: self.used(entry),
            });
        }
        step("reserve: announce");
        mine.pending.fetch_add(bytes, SeqCst);
        step("reserve: read the high-water mark");
        let hwm = self.hwm();
        let (mut held, mut pending) = (0u64, 0u64);
        for (m, l) in self.members[..hwm].iter().zip(ledgers.iter()) {
            step("reserve: read an owner");
            if !counts(m.owner.load(SeqCst)) {
                continue;
            }
            step("reserve: read pending");
            pending = pending.saturating_add(l.pending.load(SeqCst));
            step("reserve: read held");
            held = held.saturating_add(l.held.load(SeqCst));
        }
        if held.saturating_add(pending) <= limit {
            step("reserve: commit");
            mine.held.fetch_add(bytes, SeqCst);
            step("reserve: take the announcement back");
            sub_saturating(&mine.pending, bytes);
            step("reserve: peak");
            dev.peak.fetch_max(held.saturating_add(bytes), SeqCst);
            return Ok(());
        }
        step("reserve: retract");
        sub_saturating(&mine.pending, bytes);
        if held.saturating_add(bytes) > limit {
            Err(Refusal::Full { used: held })
        } else {
            Err(Refusal::Contended { used: held })
        }
    }

    /// Takes `bytes` back on entry `entry` for the member at `seat` whatever
    /// the limit: what a parked member held, reserved again at its resume
    /// when the limit was lowered below it meanwhile (as a running member
    /// keeps what it holds when the limit is lowered under it). The group
    /// is over its limit until members free; every reservation is refused
    /// meanwhile. False when the seat is not its own any more.
    pub fn take_back(&self, entry: usize, seat: Seat, bytes: u64) -> bool {
        let (Some(dev), Some(mine)) = (
            self.devices.get(entry),
            self.ledgers.get(entry).and_then(|l| l.get(seat.slot)),
        ) else {
            return false;
        };
        if !self.seated(seat) {
            return false;
        }
        mine.held.fetch_add(bytes, SeqCst);
        dev.peak.fetch_max(self.used(entry), SeqCst);
        true
    }

    /// Gives `bytes` on entry `entry` back from the member at `seat`
    /// (clamped at what it holds). False when the seat is not its own any
    /// more or it held less (a bookkeeping bug; nothing else changes).
    pub fn release(&self, entry: usize, seat: Seat, bytes: u64) -> bool {
        self.release_stepped(entry, seat, bytes, &mut no_steps)
    }

    /// [`GroupPage::release`], calling `step` before each shared access.
    pub fn release_stepped(
        &self,
        entry: usize,
        seat: Seat,
        bytes: u64,
        step: &mut impl Steps,
    ) -> bool {
        let Some(mine) = self.ledgers.get(entry).and_then(|l| l.get(seat.slot)) else {
            return false;
        };
        step("release: check the seat");
        if !self.seated(seat) {
            return false;
        }
        step("release: give back");
        sub_saturating(&mine.held, bytes) >= bytes
    }

    /// Bytes the group holds on entry `entry`: the sum of the counting
    /// slots' `held`.
    pub fn used(&self, entry: usize) -> u64 {
        let Some(ledgers) = self.ledgers.get(entry) else {
            return 0;
        };
        self.members[..self.hwm()]
            .iter()
            .zip(ledgers.iter())
            .filter(|(m, _)| counts(m.owner.load(SeqCst)))
            .fold(0u64, |sum, (_, l)| sum.saturating_add(l.held.load(SeqCst)))
    }

    /// Bytes member slot `slot` holds on entry `entry`.
    pub fn held(&self, entry: usize, slot: usize) -> u64 {
        self.ledgers
            .get(entry)
            .and_then(|l| l.get(slot))
            .map_or(0, |l| l.held.load(SeqCst))
    }

    /// The slots that count: `(slot, pid, start time)`.
    pub fn live_members(&self) -> impl Iterator<Item = (usize, u32, u64)> + '_ {
        self.members[..self.hwm()]
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let w = m.owner.load(SeqCst);
                counts(w).then(|| (i, owner_pid(w), m.start_time.load(SeqCst)))
            })
    }
}

/// Subtracts `n` from `word`, clamped at zero; returns what it held.
fn sub_saturating(word: &AtomicU64, n: u64) -> u64 {
    match word.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n))) {
        Ok(v) | Err(v) => v,
    }
}
