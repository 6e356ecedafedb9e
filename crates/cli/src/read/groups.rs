//! The group files: checked like pages (owner, then header). Only the
//! reader's own are opened for writing and mapped, so that the bytes
//! members that died left in the group's budget are returned; anyone
//! else's are only copied out. Members are those whose lock is held.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use vramcap_core::liveness::ofd_locked;
use vramcap_core::page;

use super::dir::{Dir, NotOpened, last_error, with_extension};
use super::file::{map_shared, reader_uid, stable_copy};
use super::{Skipped, Users};

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

/// The group files among `names` (the directory's listing).
pub(super) fn groups_names(
    dir: &Dir,
    names: &[OsString],
    users: Users,
) -> (Vec<GroupSnapshot>, Vec<Skipped>) {
    let mut groups = Vec::new();
    let mut skipped = Vec::new();
    for name in with_extension(names, "grp") {
        let path = dir.path.join(name);
        match read_group(dir, name, users) {
            Ok(Some(mut g)) => {
                g.dir = dir.path.clone();
                groups.push(g)
            }
            Ok(None) => {}
            Err(reason) => skipped.push(Skipped { path, reason }),
        }
    }
    (groups, skipped)
}

/// One group file: `Ok(None)` while it is being created or when it went.
fn read_group(dir: &Dir, name: &OsStr, users: Users) -> Result<Option<GroupSnapshot>, String> {
    use vramcap_core::group::{GROUP_PAGE_SIZE, GroupPage, member_lock_offset};
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
    let mut head = vec![0u8; vramcap_core::group::GROUP_HEADER_SIZE];
    let n = file.read_at(&mut head, 0).unwrap_or(0);
    head.truncate(n);
    match vramcap_core::group::check_group_header(info.size, &head, users.expected()) {
        Ok(()) => {}
        Err(vramcap_core::group::GroupProblem::Initialising) => return Ok(None),
        Err(p) => return Err(p.to_string()),
    }
    let fd = file.as_raw_fd();
    let alive = |i: usize| ofd_locked(fd, member_lock_offset(i), 1);
    if info.uid != reader_uid() {
        let copy = stable_copy::<GroupPage>(&file)?;
        return Ok(Some(group_snapshot(&copy, alive)));
    }
    // SAFETY: a checked group page of the reader's own, at least
    // GROUP_PAGE_SIZE long and never shrunk.
    let Some(map) = (unsafe { map_shared(fd, GROUP_PAGE_SIZE, true) }) else {
        return Err(format!("cannot map: {}", last_error()));
    };
    // SAFETY: the mapping holds a checked group page until unmapped below.
    let g = unsafe { &*map.cast::<GroupPage>() };
    for i in 0..g.members.len() {
        let _ = g.reclaim_if_dead(i, |i, _, _| alive(i));
    }
    let snap = group_snapshot(g, alive);
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(map, GROUP_PAGE_SIZE) };
    Ok(Some(snap))
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
        name: page::get_text(&g.header.name),
        limit_text: page::get_text(&g.header.limit_text),
        devices,
        members,
    }
}
