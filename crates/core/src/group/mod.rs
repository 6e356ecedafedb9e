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

mod header;
mod page;
pub use header::*;

#[cfg(test)]
mod tests;
