//! The group files: checked like pages (owner, then header). Only the
//! reader's own are opened for writing and mapped, so that the bytes
//! members that died left in the group's budget are returned; the mapping
//! is guarded ([`super::guard`]), so a file truncated meanwhile is
//! reported as having shrunk instead of killing the reader. Anyone else's
//! are only copied out. Members are those whose lock is held. Text fields
//! (name, limit) are made printable: a forged file may hold anything.

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use vramcap_core::liveness::ofd_locked;
use vramcap_core::text;

use super::Users;
use super::dir::{Dir, NotOpened};
use super::file::{CopyError, reader_uid, stable_copy};
use super::guard::Guarded;

/// One GPU of a group, as read from its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDeviceSnapshot {
    pub uuid: [u8; 16],
    /// `None`: no cap.
    pub limit: Option<u64>,
    pub used: u64,
    pub peak: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSnapshot {
    pub pid: u32,
    pub start_time: u64,
    /// Bytes held, per entry of `GroupSnapshot::devices`.
    pub held: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshot {
    /// The directory the group file was read from.
    pub dir: PathBuf,
    pub name: String,
    pub limit_text: String,
    pub devices: Vec<GroupDeviceSnapshot>,
    pub members: Vec<MemberSnapshot>,
}

impl GroupSnapshot {
    /// "0" without members; else `with(how many, their PIDs joined by ", ")`.
    pub fn members_text(&self, with: impl Fn(usize, String) -> String) -> String {
        let pids: Vec<String> = self.members.iter().map(|m| m.pid.to_string()).collect();
        if pids.is_empty() {
            "0".to_string()
        } else {
            with(pids.len(), pids.join(", "))
        }
    }
}

/// One group file: `Ok(None)` while it is being created or when it went.
pub(super) fn read_group(
    dir: &Dir,
    name: &OsStr,
    users: Users,
) -> Result<Option<GroupSnapshot>, String> {
    use vramcap_core::group::{GROUP_PAGE_SIZE, GroupPage, GroupProblem, member_lock_offset};
    // The reader's own group files are opened for writing, to reclaim dead
    // members; anyone else's only for reading.
    let (file, info) = match dir.open_file(name, |i| i.uid == reader_uid()) {
        Ok(x) => x,
        Err(NotOpened::Skip(why)) => return Err(why),
        Err(NotOpened::Gone) => return Ok(None),
    };
    if !users.accepts_owner(info.uid) {
        return Err(format!("owned by another user (uid {})", info.uid));
    }
    let check = |head: &[u8]| {
        let head = &head[..head.len().min(vramcap_core::group::GROUP_HEADER_SIZE)];
        vramcap_core::group::check_group_header(info.size, head, users.expected())
    };
    let fd = file.as_raw_fd();
    let alive = |i: usize| ofd_locked(fd, member_lock_offset(i), 1);
    if info.uid != reader_uid() {
        return match stable_copy::<GroupPage, _>(&file, check) {
            Ok(copy) => Ok(Some(group_snapshot(&copy, alive))),
            Err(CopyError::Refused(GroupProblem::Initialising)) => Ok(None),
            Err(CopyError::Refused(p)) => Err(p.to_string()),
            Err(CopyError::Read(e)) => Err(e),
        };
    }
    let mut head = vec![0u8; vramcap_core::group::GROUP_HEADER_SIZE];
    let n = file.read_at(&mut head, 0).unwrap_or(0);
    match check(&head[..n]) {
        Ok(()) => {}
        Err(GroupProblem::Initialising) => return Ok(None),
        Err(p) => return Err(p.to_string()),
    }
    // Guarded: the file's owner (this uid) may truncate it at any moment.
    let map = Guarded::map(fd, GROUP_PAGE_SIZE, true)?;
    // SAFETY: the guarded mapping is GROUP_PAGE_SIZE long (the checked
    // group page, or private zeroes once the file shrank) until dropped
    // below.
    let g = unsafe { &*map.ptr().cast::<GroupPage>() };
    if forged_ledger(g) {
        return Err("corrupt group file (a member's bytes add up to more than 2^64)".into());
    }
    // The group code is given bytes anyone with this uid may have written:
    // whatever it does with them, one file never takes the reader down.
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for i in 0..g.members.len() {
            let _ = g.reclaim_if_dead(i, |i, _, _| alive(i));
        }
        group_snapshot(g, alive)
    }));
    if map.faulted() {
        return Err("cannot read: the file shrank while being read".into());
    }
    read.map(Some).map_err(|_| {
        "corrupt group file (reading it failed; the reader went on with the others)".into()
    })
}

/// Whether a member's ledger holds more than any group can (its bytes
/// overflow a u64): the file is forged.
fn forged_ledger(g: &vramcap_core::group::GroupPage) -> bool {
    g.live_members().any(|(slot, _, _)| {
        (0..g.devices.len())
            .try_fold(0u64, |sum, d| sum.checked_add(g.held(d, slot)))
            .is_none()
    })
}

/// The group's values; members are those whose lock is held. What a GPU's
/// budget holds is the sum of the ledgers of the slots that count (dead
/// members not yet reclaimed included, as for the members themselves).
fn group_snapshot(
    g: &vramcap_core::group::GroupPage,
    alive: impl Fn(usize) -> bool,
) -> GroupSnapshot {
    use std::sync::atomic::Ordering;
    let ready: Vec<usize> = (0..g.devices.len())
        .filter(|&i| g.devices[i].ready())
        .collect();
    let devices = ready
        .iter()
        .map(|&i| {
            let d = &g.devices[i];
            let limit = d.limit().unwrap_or(u64::MAX);
            GroupDeviceSnapshot {
                uuid: d.uuid_bytes().unwrap_or_default(),
                limit: (limit != u64::MAX).then_some(limit),
                used: g.used(i),
                peak: d.peak.load(Ordering::Relaxed),
            }
        })
        .collect();
    let members = g
        .live_members()
        .filter(|&(i, _, _)| alive(i))
        .map(|(slot, pid, start_time)| MemberSnapshot {
            pid,
            start_time,
            held: ready.iter().map(|&i| g.held(i, slot)).collect(),
        })
        .collect();
    GroupSnapshot {
        dir: PathBuf::new(),
        name: text::field(&g.header.name),
        limit_text: text::field(&g.header.limit_text),
        devices,
        members,
    }
}

/// A group file of this user mapped for writing (to change the group's
/// limits), guarded like [`super::PageMap`]: truncated meanwhile, it reads
/// as zeroes and [`GroupMap::shrank`] says so.
pub struct GroupMap {
    map: Guarded,
}

impl GroupMap {
    pub fn page(&self) -> &vramcap_core::group::GroupPage {
        // SAFETY: the guarded mapping is GROUP_PAGE_SIZE long (the checked
        // group file, or private zeroes once it shrank) while self lives.
        unsafe { &*self.map.ptr().cast::<vramcap_core::group::GroupPage>() }
    }

    pub fn shrank(&self) -> bool {
        self.map.faulted()
    }
}

/// Maps group `name`'s file in `dir` read-write, after the checks of a
/// scan: a regular file (no link followed) of this user with a group header.
pub fn map_group_for_write(
    dir: &std::path::Path,
    name: &str,
    users: super::Users,
) -> Result<GroupMap, String> {
    use vramcap_core::group::{GROUP_HEADER_SIZE, GROUP_PAGE_SIZE, check_group_header, file_name};
    let path = dir.join(file_name(name));
    let shown = text::path(&path);
    let (file, len, head) =
        super::file::open_own_for_write(&path, users, GROUP_HEADER_SIZE, "a group file", || {
            format!("no group {name:?} in {}", text::path(dir))
        })?;
    check_group_header(len, &head, users.expected()).map_err(|p| format!("{shown}: {p}"))?;
    let map = Guarded::map(file.as_raw_fd(), GROUP_PAGE_SIZE, true)
        .map_err(|e| format!("{shown}: {e}"))?;
    Ok(GroupMap { map })
}
