//! The group page: one budget per physical GPU shared by every process of
//! the same user started with the same `VRAMCAP_GROUP`, exact whatever
//! instruction a member is killed at.
//!
//! # Layout (version 2)
//! A [`GroupHeader`] (4096 bytes), then [`GROUP_DEVICES`] [`GroupDevice`]
//! entries (64 bytes each) keyed by GPU UUID, then [`MEMBERS`] [`Member`]
//! slots (16 bytes each), then the ledgers: for each device entry, one
//! [`Ledger`] (16 bytes) per member slot. Offsets are pinned by a test.
//! Version 1 (until issue 13) kept one shared `used` word per GPU beside
//! the members' ledgers; a file of another version is refused with
//! [`GroupProblem::OtherLayout`], never read.
//!
//! # The design: the total is the sum of the members' ledgers
//! There is no group-wide "used" word. What the group holds on a GPU is
//! the sum, over the member slots that *count*, of their ledgers' `held`.
//! A member's ledger is written only by that member's own threads, so
//! everything a member holds is in its own slot, and a dead member's
//! holdings are recovered exactly by one step: its slot stops counting.
//!
//! - **Slots.** [`Member::owner`] is `generation << 32 | pid`, with pid
//!   [`FREE`] (0), [`JOINING`] (`u32::MAX`) or the member's pid (a label
//!   only: liveness is a lock, see below). A slot *counts* when its pid is
//!   neither. The generation goes up by one each time the slot is freed.
//! - **Liveness.** A member holds an open-file-description lock on its
//!   slot's byte ([`member_lock_offset`]) from before it claims the slot;
//!   the kernel drops it when the process dies, and every PID namespace
//!   sees it.
//! - **Join** ([`GroupPage::join`]): take the lock on a slot whose pid is
//!   `FREE`, then CAS the owner `(g, FREE)` → `(g, JOINING)`; zero the
//!   slot's ledgers (they may hold a dead predecessor's bytes); raise
//!   [`GroupHeader::members_hwm`] past the slot; store `(g, pid)`: from
//!   that store on, the slot counts, with zero bytes.
//! - **Reclaim** ([`GroupPage::reclaim_if_dead`]): read the owner `(g, p)`
//!   with `p` not `FREE`; if the slot's lock is not held, CAS `(g, p)` →
//!   `(g + 1, FREE)`. One atomic step: the slot, and every byte in its
//!   ledgers, stops counting at once. **Leave** ([`GroupPage::leave`]) is
//!   the same CAS made by the member itself at normal exit.
//! - **Reserve** ([`GroupPage::reserve`], `n` bytes on entry `d`): (1)
//!   *announce*: add `n` to the member's own `pending[d]`; (2) *scan*: read
//!   `members_hwm`, then for every slot below it the owner, then `pending`,
//!   then `held`, summing both over the slots that count; (3) if the sum
//!   is at most the limit, *commit*: add `n` to `held[d]`, then take it out
//!   of `pending[d]`; otherwise *retract* (take `n` out of `pending[d]`) and
//!   refuse: [`Refusal::Full`] when even without anyone's announcement the
//!   committed bytes and `n` pass the limit, else [`Refusal::Contended`]
//!   (another's announcement was in the way: try again).
//! - **Release**: take `n` out of `held[d]`: one atomic step.
//! - **Device entries** ([`GroupPage::device_for`]): the UUID is kept as
//!   three words with their top bit set ([`uuid_key`]), each written by a
//!   CAS from 0; a member takes the first entry whose words are all its
//!   own (writing the ones still 0) and skips one with a word that is not,
//!   then sets the limit by a CAS from 0 if nobody has. No claim, no
//!   waiting: a member killed half way leaves words that are exactly what
//!   the next member with that GPU would write, and that it completes.
//!
//! Every access above is a sequentially consistent atomic (`SeqCst`), so
//! all of them fall in one total order; the proofs below use that order.
//!
//! # Invariants
//! 1. A slot's ledgers change only by its owner's own steps (announce,
//!    commit, retract, release; zeroing while `JOINING`). So while a slot
//!    counts, its `held` is exactly the bytes its member reserved and has
//!    not released, and its `pending` the announcements in flight.
//! 2. **Never above the limit:** at every instant, the `held` of the slots
//!    that count sum to at most the limit. Proof sketch: suppose not, at
//!    instant `t`, and let `C` be the committed reservations whose bytes
//!    are then counted (each made by a member whose slot counts at `t` with
//!    the generation it had when it announced: a reclaim and a later join
//!    would have zeroed them). Let `X` be the one in `C` that announced
//!    last. Every other `Y` in `C` announced before `X` did, so before every
//!    read of `X`'s scan, and released nothing before `t`, after `X`'s
//!    commit. For `Y`'s slot, `X`'s scan read a counting owner (the same
//!    one), then `pending`, then `held`. `Y` moves its `n` by adding it to
//!    `held` *before* taking it out of `pending`: if `X`'s read of `pending`
//!    came before `Y` took it out, it saw `n` there; otherwise `Y` had
//!    already added it to `held`, and `X`'s later read of `held` saw it. So
//!    `X`'s sum counted every byte of `C` at least once (and anything else
//!    only adds), yet was at most the limit: a contradiction. (Slots below
//!    `members_hwm`: a joiner raises it before its slot counts, hence
//!    before `Y` announced.) A live member's bytes allocated from the
//!    driver are always covered by its `held` (it reserves before it
//!    allocates and releases after it frees), so members can never
//!    together pass the limit.
//! 3. **Exact after kills:** a kill between any two steps leaves
//!    - in join, before the owner CAS: nothing (its lock goes with it);
//!      after it: a `JOINING` slot without a lock, which does not count and
//!      is reclaimed like any dead member;
//!    - in reserve: an announcement in `pending` (counted by others' scans,
//!      making them [`Refusal::Contended`] until the slot is reclaimed), or
//!      bytes in `held` for an allocation that may or may not have been
//!      made: either way the process is gone and so are its allocations,
//!      and at reclaim the whole slot stops counting;
//!    - release, reclaim and leave are single steps; a device entry is
//!      completed by whoever needs it next.
//!
//!    After the dead are reclaimed, the sum is therefore exactly what the
//!    live members hold, whatever step each dead member died at.
//! 4. **ABA:** a reclaimer CASes the exact `(generation, pid)` it read
//!    before it found the lock free. If the slot was freed meanwhile its
//!    generation moved on and the CAS fails; if it was joined meanwhile,
//!    the joiner took the lock first, so the reclaimer saw it held or the
//!    CAS fails. (A reclaimer would have to stall across 2³² reuses of one
//!    slot for the generation to come round.)
//! 5. **Nothing a dead process leaves blocks anyone.** Join, reclaim,
//!    leave, release and device entries never wait on another process.
//!    Reserve is obstruction-free: run without another announcement in its
//!    way it decides at once; announcements in each other's way are
//!    retracted and retried (the caller yields, and reclaims the dead after
//!    a few tries, so a dead member's announcement is in the way only until
//!    then), and a caller that has tried long enough refuses: never more
//!    than the limit, only at worst a refusal.
//!
//! **Cost.** A reservation reads two words of each member slot below the
//! high-water mark (the highest slot ever joined; joiners take the lowest
//! free slot). Measured single-threaded (release build, a shared 2-core
//! machine), a reservation and its release take 105 ns with one member,
//! 116 ns with 8, 312 ns with 64 and 3.3 µs with 1024 (the version-1 pair:
//! 108 ns), against tens of microseconds for the driver's allocation.
//!
//! The limit is the first member's `VRAMCAP_LIMIT`, kept as text in the
//! header; a later member with another value is told at start. Each
//! member's own limit applies too: the group can only make it stricter.
//! The property tests (`group/tests.rs`) run members as
//! threads stepped one shared access at a time in orders a script picks,
//! kill them between any two steps, and check invariants 2 and 3 after
//! every step and at the end.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

pub const GROUP_MAGIC: [u8; 8] = *b"vramcapg";
pub const GROUP_VERSION: u32 = 2;
pub const GROUP_DEVICES: usize = 64;
pub const MEMBERS: usize = 1024;
pub const GROUP_HEADER_SIZE: usize = 4096;
pub const GROUP_DEVICE_SIZE: usize = 64;
pub const MEMBER_SIZE: usize = 16;
pub const LEDGER_SIZE: usize = 16;
pub const GROUP_PAGE_SIZE: usize = GROUP_HEADER_SIZE
    + GROUP_DEVICES * GROUP_DEVICE_SIZE
    + MEMBERS * MEMBER_SIZE
    + GROUP_DEVICES * MEMBERS * LEDGER_SIZE;
pub const NAME_LEN: usize = 64;
/// The limit field's size, set by the limit grammar's longest value.
pub use crate::limit::LIMIT_TEXT_LEN;

/// The pid part of a free slot's owner word.
pub const FREE: u32 = 0;
/// The pid part of a slot's owner word while its member joins.
pub const JOINING: u32 = u32::MAX;

/// A single request above this many bytes (256 TiB) is refused: no GPU has
/// that much, and it keeps the announcements of any number of threads
/// from overflowing a ledger word.
pub const MAX_REQUEST: u64 = 1 << 48;

/// A set limit word's top bit; the rest is the limit, all ones for no cap.
const LIMIT_SET: u64 = 1 << 63;
const LOW63: u64 = LIMIT_SET - 1;

/// The byte of the group file a live member keeps a lock on (an
/// open-file-description lock, released by the kernel when the process
/// dies, and visible across PID namespaces, unlike a PID).
pub fn member_lock_offset(i: usize) -> u64 {
    (offset_of!(GroupPage, members) + i * MEMBER_SIZE) as u64
}

/// The group file's name in the statistics directory.
pub fn file_name(group: &str) -> String {
    format!("group-{group}.grp")
}

/// Checks a `VRAMCAP_GROUP` value: 1 to 63 of `A-Z a-z 0-9 . _ -`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with('.')
}

/// An owner word: `generation << 32 | pid`.
pub fn owner_word(generation: u32, pid: u32) -> u64 {
    u64::from(generation) << 32 | u64::from(pid)
}

/// The pid part of an owner word.
pub fn owner_pid(word: u64) -> u32 {
    word as u32
}

/// The generation part of an owner word.
pub fn owner_generation(word: u64) -> u32 {
    (word >> 32) as u32
}

/// Whether a slot with this owner word counts in the group's sums.
pub fn counts(word: u64) -> bool {
    !matches!(owner_pid(word), FREE | JOINING)
}

#[repr(C)]
pub struct GroupHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub page_size: u32,
    pub device_count: u32,
    pub member_count: u32,
    pub uid: u32,
    pub state: AtomicU32,
    /// One past the highest member slot ever joined: scans stop there.
    pub members_hwm: AtomicU32,
    pub created_unix_ns: u64,
    pub name: [u8; NAME_LEN],
    /// The group's `VRAMCAP_LIMIT`, as its first member gave it.
    pub limit_text: [u8; LIMIT_TEXT_LEN],
    pub reserved: [u8; GROUP_HEADER_SIZE - 48 - NAME_LEN - LIMIT_TEXT_LEN],
}

#[repr(C)]
pub struct GroupDevice {
    /// The GPU's UUID as [`uuid_key`] words (0: not written yet).
    pub key: [AtomicU64; 3],
    /// The group's limit on this GPU with [`LIMIT_SET`] (0: not set yet).
    pub limit: AtomicU64,
    /// The most the members' scans ever saw committed, with their own
    /// request (at most the limit).
    pub peak: AtomicU64,
    pub reserved: [u64; 3],
}

#[repr(C)]
pub struct Member {
    /// `generation << 32 | pid` (see [`owner_word`]).
    pub owner: AtomicU64,
    /// The member's start time in clock ticks (a label).
    pub start_time: AtomicU64,
}

/// One member's bytes on one device entry.
#[repr(C)]
pub struct Ledger {
    /// Reserved and not released.
    pub held: AtomicU64,
    /// Announced by a reservation not yet decided.
    pub pending: AtomicU64,
}

#[repr(C)]
pub struct GroupPage {
    pub header: GroupHeader,
    pub devices: [GroupDevice; GROUP_DEVICES],
    pub members: [Member; MEMBERS],
    /// `ledgers[entry][slot]`: a device's ledgers side by side, so a scan
    /// reads few cache lines.
    pub ledgers: [[Ledger; MEMBERS]; GROUP_DEVICES],
}

const _: () = assert!(size_of::<GroupHeader>() == GROUP_HEADER_SIZE);
const _: () = assert!(size_of::<GroupDevice>() == GROUP_DEVICE_SIZE);
const _: () = assert!(size_of::<Member>() == MEMBER_SIZE);
const _: () = assert!(size_of::<Ledger>() == LEDGER_SIZE);
const _: () = assert!(size_of::<GroupPage>() == GROUP_PAGE_SIZE);

/// The three words a device entry keys a UUID by: its 128 bits as 63, 63
/// and 2, each with the top bit set, so that no word of a written key is 0.
pub fn uuid_key(bytes: [u8; 16]) -> [u64; 3] {
    let u = u128::from_be_bytes(bytes);
    [
        LIMIT_SET | (u as u64 & LOW63),
        LIMIT_SET | ((u >> 63) as u64 & LOW63),
        LIMIT_SET | (u >> 126) as u64,
    ]
}

fn key_uuid(key: [u64; 3]) -> [u8; 16] {
    let u = u128::from(key[0] & LOW63)
        | u128::from(key[1] & LOW63) << 63
        | u128::from(key[2] & 3) << 126;
    u.to_be_bytes()
}

fn encode_limit(limit: u64) -> u64 {
    LIMIT_SET | limit.min(LOW63)
}

/// Where a member sits: its slot and the owner word it joined with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat {
    pub slot: usize,
    pub owner: u64,
}

/// Why a reservation was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The committed bytes and the request pass the limit; `used` is what
    /// the scan saw committed.
    Full { used: u64 },
    /// It would fit but for announcements of reservations in flight (or of
    /// a dead member not reclaimed yet): try again.
    Contended { used: u64 },
    /// The seat is not this member's any more (its slot was reclaimed while
    /// it lived: its liveness lock was lost), or the entry is not set up.
    Unseated,
}

/// A step hook: called before each access to the shared page with what the
/// access is. The shim passes one that does nothing; the property tests
/// one that parks the thread until a scheduler lets it take the step.
pub trait Steps: FnMut(&'static str) {}
impl<F: FnMut(&'static str)> Steps for F {}

fn no_steps(_: &'static str) {}

impl GroupDevice {
    /// The UUID once all three words are written.
    pub fn uuid_bytes(&self) -> Option<[u8; 16]> {
        let key = [0, 1, 2].map(|k| self.key[k].load(SeqCst));
        key.iter().all(|&w| w != 0).then(|| key_uuid(key))
    }

    /// The group's limit on this GPU (`u64::MAX`: no cap), once set.
    pub fn limit(&self) -> Option<u64> {
        match self.limit.load(SeqCst) {
            0 => None,
            v if v & LOW63 == LOW63 => Some(u64::MAX),
            v => Some(v & LOW63),
        }
    }

    /// Changes the group's limit on this GPU (`u64::MAX`: no cap), once
    /// set (an entry still being made is left to its maker): every
    /// member's next reservation on it is held to the new limit. The limit
    /// before, or `None` when it was not set.
    pub fn change_limit(&self, limit: u64) -> Option<u64> {
        let word = if limit >= LOW63 {
            LIMIT_SET | LOW63
        } else {
            LIMIT_SET | limit.max(1)
        };
        let old = self
            .limit
            .fetch_update(SeqCst, SeqCst, |v| (v != 0).then_some(word))
            .ok()?;
        Some(if old & LOW63 == LOW63 {
            u64::MAX
        } else {
            old & LOW63
        })
    }

    /// Whether the entry is complete: its UUID and limit are written.
    pub fn ready(&self) -> bool {
        self.uuid_bytes().is_some() && self.limit().is_some()
    }
}

impl GroupPage {
    fn hwm(&self) -> usize {
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

mod header;
pub use header::*;

#[cfg(test)]
mod tests;
