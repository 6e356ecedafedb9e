//! The group page: one budget per physical GPU shared by every process of
//! the same user started with the same `VRAMCAP_GROUP`.
//!
//! # Layout (version 1)
//! A [`GroupHeader`] (4096 bytes), then [`GROUP_DEVICES`] [`GroupDevice`]
//! entries (64 bytes each) keyed by GPU UUID, then [`MEMBERS`] [`Member`]
//! slots (528 bytes each). Offsets are pinned by a test.
//!
//! # The budget, without locks
//! - A device entry's `used` is the group's reservation on that GPU. A
//!   member reserves with a compare-and-swap of `used` against `limit`
//!   (so no interleaving of members passes the limit), *then* adds the bytes
//!   to its own `held[device]`. It gives bytes back in the opposite order:
//!   first its `held`, then `used`. A member killed between the two steps
//!   leaves `used` too high by one allocation, never too low: the cap may be
//!   briefly pessimistic, never exceeded.
//! - Each member slot is claimed by a compare-and-swap of `pid` from 0. A
//!   member whose process is gone (no such PID, or a PID reused by a process
//!   with another start time) is reclaimed by whoever notices first: the
//!   reclaimer moves `pid` to [`RECLAIMING`] with a compare-and-swap (so only
//!   one does it), swaps each `held` to zero and subtracts it from `used`,
//!   then frees the slot. No lock exists that a dead process could leave held.
//! - Device entries are claimed the same way (state 0 → 1 → 2) by the first
//!   member to use that GPU, which writes its UUID and the group's limit for
//!   it; the others wait for state 2 (a few stores).
//! - The limit is the first member's `VRAMCAP_LIMIT`, kept as text in the
//!   header; a later member with another value is told at start. Each
//!   member's own limit applies too: the group can only make it stricter.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const GROUP_MAGIC: [u8; 8] = *b"vramcapg";
pub const GROUP_VERSION: u32 = 1;
pub const GROUP_DEVICES: usize = 64;
pub const MEMBERS: usize = 1024;
pub const GROUP_HEADER_SIZE: usize = 4096;
pub const GROUP_DEVICE_SIZE: usize = 64;
pub const MEMBER_SIZE: usize = 528;
pub const GROUP_PAGE_SIZE: usize =
    GROUP_HEADER_SIZE + GROUP_DEVICES * GROUP_DEVICE_SIZE + MEMBERS * MEMBER_SIZE;
pub const NAME_LEN: usize = 64;
pub const LIMIT_TEXT_LEN: usize = 512;

/// `Member::pid` while a dead member's bytes are being returned.
pub const RECLAIMING: u32 = u32::MAX;

/// Device entry states.
pub const DEVICE_FREE: u32 = 0;
pub const DEVICE_CLAIMING: u32 = 1;
pub const DEVICE_READY: u32 = 2;

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

/// Checks a `VRAMCAP_GROUP` value: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with('.')
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
    pub _pad: u32,
    pub created_unix_ns: u64,
    pub name: [u8; NAME_LEN],
    /// The group's `VRAMCAP_LIMIT`, as its first member gave it.
    pub limit_text: [u8; LIMIT_TEXT_LEN],
    pub reserved: [u8; GROUP_HEADER_SIZE - 48 - NAME_LEN - LIMIT_TEXT_LEN],
}

#[repr(C)]
pub struct GroupDevice {
    pub state: AtomicU32,
    pub _pad: u32,
    /// The GPU's UUID bytes (two native-endian words).
    pub uuid: [AtomicU64; 2],
    /// Bytes the group may hold on this GPU (`u64::MAX`: no cap).
    pub limit: AtomicU64,
    pub used: AtomicU64,
    pub peak: AtomicU64,
    pub reserved: [u64; 2],
}

#[repr(C)]
pub struct Member {
    pub pid: AtomicU32,
    pub _pad: u32,
    pub start_time: AtomicU64,
    /// Bytes this member holds on each group device entry.
    pub held: [AtomicU64; GROUP_DEVICES],
}

#[repr(C)]
pub struct GroupPage {
    pub header: GroupHeader,
    pub devices: [GroupDevice; GROUP_DEVICES],
    pub members: [Member; MEMBERS],
}

const _: () = assert!(size_of::<GroupHeader>() == GROUP_HEADER_SIZE);
const _: () = assert!(size_of::<GroupDevice>() == GROUP_DEVICE_SIZE);
const _: () = assert!(size_of::<Member>() == MEMBER_SIZE);
const _: () = assert!(size_of::<GroupPage>() == GROUP_PAGE_SIZE);

pub fn uuid_words(bytes: [u8; 16]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&bytes[..8]);
    b.copy_from_slice(&bytes[8..]);
    (u64::from_ne_bytes(a), u64::from_ne_bytes(b))
}

impl GroupDevice {
    pub fn uuid_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.uuid[0].load(Ordering::Acquire).to_ne_bytes());
        out[8..].copy_from_slice(&self.uuid[1].load(Ordering::Acquire).to_ne_bytes());
        out
    }

    /// Reserves `bytes` for the group; `Err(used)` when it does not fit.
    pub fn try_reserve(&self, bytes: u64) -> Result<(), u64> {
        let limit = self.limit.load(Ordering::Acquire);
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = match cur.checked_add(bytes) {
                Some(n) if n <= limit => n,
                _ => return Err(cur),
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives bytes back, clamped at zero.
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }
}

impl Member {
    /// Returns every byte this member holds to `devices` (the member is
    /// dead, or leaving). The caller owns the slot (it moved `pid`).
    pub fn return_all(&self, devices: &[GroupDevice; GROUP_DEVICES]) -> u64 {
        let mut total = 0;
        for (held, dev) in self.held.iter().zip(devices.iter()) {
            let b = held.swap(0, Ordering::AcqRel);
            if b > 0 {
                dev.release(b);
                total += b;
            }
        }
        total
    }
}

impl GroupPage {
    /// Reclaims the slot of member `i` if its process is gone (`alive` says
    /// whether slot `i` with this pid and start time is still held; members
    /// hold a lock on [`member_lock_offset`] while they live). Returns the
    /// bytes given back, or `None` if the slot was not reclaimed.
    pub fn reclaim_if_dead(
        &self,
        i: usize,
        alive: impl Fn(usize, u32, u64) -> bool,
    ) -> Option<u64> {
        let m = self.members.get(i)?;
        let pid = m.pid.load(Ordering::Acquire);
        if pid == 0 || pid == RECLAIMING {
            return None;
        }
        let start = m.start_time.load(Ordering::Acquire);
        if alive(i, pid, start) {
            return None;
        }
        m.pid
            .compare_exchange(pid, RECLAIMING, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        // Between the look and the swap the slot may have been reclaimed by
        // another and joined by a new member with the same PID (PIDs repeat
        // across namespaces): look again, now that nobody else can.
        if alive(i, pid, start) {
            m.pid.store(pid, Ordering::Release);
            return None;
        }
        let bytes = m.return_all(&self.devices);
        m.start_time.store(0, Ordering::Release);
        m.pid.store(0, Ordering::Release);
        Some(bytes)
    }

    /// Claims a free member slot for `pid`; `None` when all are taken.
    /// `lock(i)` takes the slot's liveness lock first (false: someone holds
    /// it) and `unlock(i)` gives it back when the slot was taken meanwhile,
    /// so a slot is never claimed without its lock held.
    pub fn join(
        &self,
        pid: u32,
        start_time: u64,
        mut lock: impl FnMut(usize) -> bool,
        mut unlock: impl FnMut(usize),
    ) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if m.pid.load(Ordering::Relaxed) != 0 || !lock(i) {
                continue;
            }
            if m.pid
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                unlock(i);
            } else {
                m.start_time.store(start_time, Ordering::Release);
                for h in &m.held {
                    h.store(0, Ordering::Relaxed);
                }
                return Some(i);
            }
        }
        None
    }

    /// The entry of the GPU with this UUID, claiming a free one (and setting
    /// its limit with `limit_for`) if none has it yet.
    pub fn device_for(&self, uuid: [u8; 16], limit_for: impl FnOnce() -> u64) -> Option<usize> {
        let (a, b) = uuid_words(uuid);
        let mut limit_for = Some(limit_for);
        loop {
            let mut free = None;
            for (i, d) in self.devices.iter().enumerate() {
                match d.state.load(Ordering::Acquire) {
                    DEVICE_READY => {
                        if d.uuid[0].load(Ordering::Acquire) == a
                            && d.uuid[1].load(Ordering::Acquire) == b
                        {
                            return Some(i);
                        }
                    }
                    DEVICE_CLAIMING => {
                        // Another member is writing this entry: look again.
                        free = Some(usize::MAX);
                    }
                    _ => {
                        if free.is_none() {
                            free = Some(i);
                        }
                    }
                }
            }
            match free {
                None => return None,
                Some(usize::MAX) => std::thread::yield_now(),
                Some(i) => {
                    let d = &self.devices[i];
                    if d.state
                        .compare_exchange(
                            DEVICE_FREE,
                            DEVICE_CLAIMING,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        d.uuid[0].store(a, Ordering::Release);
                        d.uuid[1].store(b, Ordering::Release);
                        let limit = limit_for.take().map(|f| f()).unwrap_or(u64::MAX);
                        d.limit.store(limit, Ordering::Release);
                        d.state.store(DEVICE_READY, Ordering::Release);
                        return Some(i);
                    }
                }
            }
        }
    }

    pub fn live_members(&self) -> impl Iterator<Item = (usize, &Member)> {
        self.members.iter().enumerate().filter(|(_, m)| {
            let p = m.pid.load(Ordering::Acquire);
            p != 0 && p != RECLAIMING
        })
    }
}

/// Checks a group file's header like `page::check_header`.
pub fn check_group_header(
    len: u64,
    head: &[u8],
    expected_uid: Option<u32>,
) -> Result<(), crate::page::PageProblem> {
    use crate::page::PageProblem;
    if head.len() < 16 {
        return Err(PageProblem::Truncated { len });
    }
    if head[..8] != GROUP_MAGIC {
        return Err(PageProblem::ForeignMagic);
    }
    let word = |at: usize| u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let version = word(offset_of!(GroupHeader, version));
    if version != GROUP_VERSION {
        return Err(PageProblem::OtherVersion { version });
    }
    if len < GROUP_PAGE_SIZE as u64 || head.len() < 48 {
        return Err(PageProblem::Truncated { len });
    }
    if word(offset_of!(GroupHeader, header_size)) as usize != GROUP_HEADER_SIZE
        || word(offset_of!(GroupHeader, page_size)) as usize != GROUP_PAGE_SIZE
        || word(offset_of!(GroupHeader, device_count)) as usize != GROUP_DEVICES
        || word(offset_of!(GroupHeader, member_count)) as usize != MEMBERS
    {
        return Err(PageProblem::BadSizes);
    }
    let uid = word(offset_of!(GroupHeader, uid));
    if expected_uid.is_some_and(|e| e != uid) {
        return Err(PageProblem::OtherUser { uid });
    }
    if word(offset_of!(GroupHeader, state)) != crate::page::STATE_READY {
        return Err(PageProblem::Initialising);
    }
    Ok(())
}

impl GroupHeader {
    pub fn fill(&mut self, uid: u32, created_unix_ns: u64, name: &str, limit_text: &str) {
        self.magic = GROUP_MAGIC;
        self.version = GROUP_VERSION;
        self.header_size = GROUP_HEADER_SIZE as u32;
        self.page_size = GROUP_PAGE_SIZE as u32;
        self.device_count = GROUP_DEVICES as u32;
        self.member_count = MEMBERS as u32;
        self.uid = uid;
        self.created_unix_ns = created_unix_ns;
        crate::page::put_text(&mut self.name, name);
        crate::page::put_text(&mut self.limit_text, limit_text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Box<GroupPage> {
        // SAFETY: all-zero bytes are a valid GroupPage (integers and atomics).
        unsafe { Box::new_zeroed().assume_init() }
    }

    #[test]
    fn layout_is_pinned() {
        assert_eq!(offset_of!(GroupHeader, version), 8);
        assert_eq!(offset_of!(GroupHeader, uid), 28);
        assert_eq!(offset_of!(GroupHeader, state), 32);
        assert_eq!(offset_of!(GroupHeader, created_unix_ns), 40);
        assert_eq!(offset_of!(GroupHeader, name), 48);
        assert_eq!(offset_of!(GroupHeader, limit_text), 112);
        assert_eq!(offset_of!(GroupDevice, uuid), 8);
        assert_eq!(offset_of!(GroupDevice, limit), 24);
        assert_eq!(offset_of!(GroupDevice, used), 32);
        assert_eq!(offset_of!(GroupDevice, peak), 40);
        assert_eq!(offset_of!(Member, start_time), 8);
        assert_eq!(offset_of!(Member, held), 16);
        assert_eq!(offset_of!(GroupPage, devices), 4096);
        assert_eq!(offset_of!(GroupPage, members), 4096 + 64 * 64);
        assert_eq!(GROUP_PAGE_SIZE, 4096 + 64 * 64 + 1024 * 528);
    }

    #[test]
    fn names() {
        for ok in ["train", "job-1", "a.b_c", "X"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(64), "ü"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn members_share_and_the_dead_are_reclaimed_once() {
        let g = page();
        let d = g.device_for([1; 16], || 1000).unwrap();
        assert_eq!(
            g.device_for([1; 16], || 5).unwrap(),
            d,
            "found, limit untouched"
        );
        assert_eq!(g.devices[d].limit.load(Ordering::Relaxed), 1000);
        let a = g.join(10, 1, |_| true, |_| {}).unwrap();
        let b = g.join(20, 2, |_| true, |_| {}).unwrap();
        assert_ne!(a, b);
        g.devices[d].try_reserve(768).unwrap();
        g.members[a].held[d].fetch_add(768, Ordering::Relaxed);
        assert_eq!(g.devices[d].try_reserve(300), Err(768));
        g.devices[d].try_reserve(232).unwrap();
        g.members[b].held[d].fetch_add(232, Ordering::Relaxed);
        // Member 10 dies: its 768 bytes come back exactly once.
        let alive = |_, pid: u32, _| pid != 10;
        assert_eq!(g.reclaim_if_dead(a, alive), Some(768));
        assert_eq!(g.reclaim_if_dead(a, alive), None);
        assert_eq!(g.reclaim_if_dead(b, alive), None);
        assert_eq!(g.devices[d].used.load(Ordering::Relaxed), 232);
        assert_eq!(g.devices[d].peak.load(Ordering::Relaxed), 1000);
        assert_eq!(g.live_members().count(), 1);
        assert_eq!(
            g.join(30, 3, |_| true, |_| {}),
            Some(a),
            "the slot is free again"
        );
        assert_eq!(
            g.join(40, 4, |_| false, |_| {}),
            None,
            "no slot without its lock"
        );
    }

    #[test]
    fn threads_never_pass_the_group_limit() {
        let g: &'static GroupPage = Box::leak(page());
        let d = g.device_for([7; 16], || 10_000).unwrap();
        let handles: Vec<_> = (0..16u32)
            .map(|t| {
                std::thread::spawn(move || {
                    let me = g.join(100 + t, 0, |_| true, |_| {}).unwrap();
                    let mut x = u64::from(t) * 2654435761 + 1;
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let n = x % 500 + 1;
                        if g.devices[d].try_reserve(n).is_ok() {
                            g.members[me].held[d].fetch_add(n, Ordering::Relaxed);
                            assert!(g.devices[d].used.load(Ordering::Relaxed) <= 10_000);
                            g.members[me].held[d].fetch_sub(n, Ordering::Relaxed);
                            g.devices[d].release(n);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(g.devices[d].used.load(Ordering::Relaxed), 0);
        assert!(g.devices[d].peak.load(Ordering::Relaxed) <= 10_000);
    }
}
