//! Finding and reading the statistics pages of live processes.
//!
//! A reader trusts nothing in the directory: each file is opened without
//! following links, must be a regular file of the reading user, and its
//! header is checked (magic, version, sizes, uid, ready) before the page is
//! mapped read-only and read with atomic loads. Writers never shrink a page
//! (they publish new pages by rename), so a mapped page cannot fault.
//! Pages of dead processes, or of an earlier process whose PID was reused
//! (start time differs), are removed and never reported.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::page::{self, HEADER_SIZE, PAGE_SIZE, Page, PageSnapshot};

/// Start time of a process in clock ticks after boot (field 22 of
/// /proc/PID/stat), or `None` when there is no such process.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split(' ').nth(19)?.parse().ok()
}

/// True when a process with this PID exists (whoever owns it).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether some process holds a lock (open-file-description lock) on
/// `len` bytes at `start` of the open file `fd`. Such locks are released by
/// the kernel when their holder dies and are visible from any PID namespace,
/// which makes them the liveness test: PIDs from containers mean nothing
/// outside them.
pub fn ofd_locked(fd: libc::c_int, start: u64, len: u64) -> bool {
    // SAFETY: zeroed flock is a valid argument.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: fd is open; fl is a valid flock for F_OFD_GETLK.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    // If the question cannot be asked, assume the holder lives: never
    // reclaim or prune on doubt.
    rc != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
}

/// Takes an open-file-description write lock on `len` bytes at `start` of
/// `fd` without waiting; false when another holds it.
pub fn ofd_lock(fd: libc::c_int, start: u64, len: u64, lock: bool) -> bool {
    // SAFETY: zeroed flock is a valid argument.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: fd is open; fl is a valid flock for F_OFD_SETLK.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) == 0 }
}

/// Whose pages and group files a reader shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Users {
    /// Only files of this user (owner and the uid written inside agree):
    /// what `stat`, `top` and the exporter read by default.
    Only(u32),
    /// Every user's (`--all-users`, for root reading the directories of
    /// other users or containers, where the uid inside a page may be one
    /// of the container's user namespace).
    All,
}

impl Users {
    fn accepts_owner(self, owner: u32) -> bool {
        match self {
            Users::Only(uid) => uid == owner,
            Users::All => true,
        }
    }

    fn expected(self) -> Option<u32> {
        match self {
            Users::Only(uid) => Some(uid),
            Users::All => None,
        }
    }
}

/// A file that was not shown, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Scan {
    /// Live processes, by PID.
    pub pages: Vec<PageSnapshot>,
    /// Files that look like pages but cannot be shown.
    pub skipped: Vec<Skipped>,
    /// Pages of dead processes that were removed.
    pub pruned: Vec<PathBuf>,
}

enum Outcome {
    Live(PageSnapshot),
    Dead,
    Skip(String),
    /// Still being created, or gone between listing and opening.
    Ignore,
}

/// Reads every page in `dir` that `users` covers. A missing directory is
/// an empty scan; an unreadable one is an error.
pub fn scan(dir: &Path, users: Users) -> io::Result<Scan> {
    let mut out = Scan::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "page"))
        .collect();
    names.sort();
    for path in names {
        match read_one(&path, users) {
            Outcome::Live(mut p) => {
                p.dir = dir.to_path_buf();
                out.pages.push(p)
            }
            Outcome::Dead => {
                if std::fs::remove_file(&path).is_ok() {
                    out.pruned.push(path);
                }
            }
            Outcome::Skip(reason) => out.skipped.push(Skipped { path, reason }),
            Outcome::Ignore => {}
        }
    }
    out.pages.sort_by_key(|p| p.pid);
    Ok(out)
}

fn read_one(path: &Path, users: Users) -> Outcome {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return Outcome::Skip("the name holds a NUL byte".into());
    };
    // SAFETY: a valid NUL-terminated path; O_NOFOLLOW refuses symbolic links.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Outcome::Ignore,
            Some(libc::ELOOP) => Outcome::Skip("a symbolic link, not a page".into()),
            _ => Outcome::Skip(format!("cannot open: {e}")),
        };
    }
    // SAFETY: fd is an open descriptor this function owns from here on.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Outcome::Skip(format!("cannot inspect: {e}")),
    };
    if !meta.is_file() {
        return Outcome::Skip("not a regular file".into());
    }
    if !users.accepts_owner(meta.uid()) {
        return Outcome::Skip(format!("owned by another user (uid {})", meta.uid()));
    }
    let mut head = vec![0u8; HEADER_SIZE];
    let n = match file.read_at(&mut head, 0) {
        Ok(n) => n,
        Err(e) => return Outcome::Skip(format!("cannot read: {e}")),
    };
    head.truncate(n);
    match page::check_header(meta.len(), &head, users.expected()) {
        Ok(()) => {}
        Err(page::PageProblem::Initialising) => return Outcome::Ignore,
        Err(p) => return Outcome::Skip(p.to_string()),
    }
    // SAFETY: the file is at least PAGE_SIZE long (checked) and writers never
    // shrink a page, so every byte of the read-only mapping stays backed.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_SIZE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Outcome::Skip(format!("cannot map: {}", io::Error::last_os_error()));
    }
    // SAFETY: the mapping holds a checked page; it is only read, with atomic
    // loads for the live counters, and unmapped right after.
    let snap = unsafe { (*map.cast::<Page>()).snapshot() };
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(map, PAGE_SIZE) };
    let expected = page::file_name(snap.pid);
    if path
        .file_name()
        .is_none_or(|n| n.as_bytes() != expected.as_bytes())
    {
        return Outcome::Skip(format!(
            "corrupt page (it names pid {}, the file name does not)",
            snap.pid
        ));
    }
    // The shim holds a lock on the page's first byte while the process
    // lives (see the shim's stats module).
    if ofd_locked(fd, 0, 1) {
        Outcome::Live(snap)
    } else {
        Outcome::Dead
    }
}

/// A live process's page mapped for writing (to ask it to trim its cache).
pub struct PageMap {
    ptr: *mut libc::c_void,
}

impl PageMap {
    pub fn page(&self) -> &Page {
        // SAFETY: the mapping holds a checked page for as long as self lives.
        unsafe { &*self.ptr.cast::<Page>() }
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map_for_write` mapped.
        unsafe { libc::munmap(self.ptr, PAGE_SIZE) };
    }
}

/// Maps the page of `pid` in `dir` read-write, after the same checks as a scan.
pub fn map_for_write(dir: &Path, pid: u32, uid: u32) -> Result<PageMap, String> {
    let path = dir.join(page::file_name(pid));
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "bad path".to_string())?;
    // SAFETY: valid path; no symbolic links followed.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::ENOENT) {
            format!("no process {pid} under vramcap in {}", dir.display())
        } else {
            format!("cannot open {}: {e}", path.display())
        });
    }
    // SAFETY: fd is open and owned from here on.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
    if !meta.is_file() || meta.uid() != uid {
        return Err(format!("{} is not a page of this user", path.display()));
    }
    let mut head = vec![0u8; HEADER_SIZE];
    let n = file
        .read_at(&mut head, 0)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    head.truncate(n);
    page::check_header(meta.len(), &head, Some(uid))
        .map_err(|p| format!("{}: {p}", path.display()))?;
    // SAFETY: the file is at least PAGE_SIZE long and never shrinks.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(format!(
            "cannot map {}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(PageMap { ptr })
}

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
    pub name: String,
    pub limit_text: String,
    pub devices: Vec<GroupDeviceSnapshot>,
    pub members: Vec<MemberSnapshot>,
}

/// Reads every group page in `dir`, returning the bytes of members that
/// died to their group's budget on the way (the same reclaim the members
/// do). Files that cannot be read are reported like pages.
pub fn scan_groups(dir: &Path, users: Users) -> io::Result<(Vec<GroupSnapshot>, Vec<Skipped>)> {
    use crate::group::{GROUP_PAGE_SIZE, GroupPage};
    use std::sync::atomic::Ordering;
    let mut groups = Vec::new();
    let mut skipped = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((groups, skipped)),
        Err(e) => return Err(e),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "grp"))
        .collect();
    paths.sort();
    for path in paths {
        let skip = |reason: String| Skipped {
            path: path.clone(),
            reason,
        };
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: a valid path; no symbolic links followed.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            skipped.push(skip(format!("cannot open: {}", io::Error::last_os_error())));
            continue;
        }
        // SAFETY: fd is open and owned here.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let Ok(meta) = file.metadata() else { continue };
        if !meta.is_file() || !users.accepts_owner(meta.uid()) {
            skipped.push(skip(format!("owned by another user (uid {})", meta.uid())));
            continue;
        }
        let mut head = vec![0u8; crate::group::GROUP_HEADER_SIZE];
        let n = file.read_at(&mut head, 0).unwrap_or(0);
        head.truncate(n);
        if let Err(p) = crate::group::check_group_header(meta.len(), &head, users.expected()) {
            if p != page::PageProblem::Initialising {
                skipped.push(skip(p.to_string()));
            }
            continue;
        }
        // SAFETY: a checked group page, at least GROUP_PAGE_SIZE long, never shrunk.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                GROUP_PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            skipped.push(skip(format!("cannot map: {}", io::Error::last_os_error())));
            continue;
        }
        // SAFETY: the mapping holds a checked group page until unmapped below.
        let g = unsafe { &*map.cast::<GroupPage>() };
        let alive = |i: usize, _pid: u32, _start: u64| {
            ofd_locked(fd, crate::group::member_lock_offset(i), 1)
        };
        for i in 0..g.members.len() {
            let _ = g.reclaim_if_dead(i, alive);
        }
        let ready: Vec<usize> = (0..g.devices.len())
            .filter(|&i| g.devices[i].state.load(Ordering::Acquire) == crate::group::DEVICE_READY)
            .collect();
        let devices = ready
            .iter()
            .map(|&i| {
                let d = &g.devices[i];
                let limit = d.limit.load(Ordering::Acquire);
                GroupDeviceSnapshot {
                    uuid: d.uuid_bytes(),
                    limit: (limit != u64::MAX).then_some(limit),
                    used: d.used.load(Ordering::Acquire),
                    peak: d.peak.load(Ordering::Relaxed),
                }
            })
            .collect();
        let members = g
            .live_members()
            .map(|(_, m)| MemberSnapshot {
                pid: m.pid.load(Ordering::Acquire),
                start_time: m.start_time.load(Ordering::Acquire),
                held: ready
                    .iter()
                    .map(|&i| m.held[i].load(Ordering::Acquire))
                    .collect(),
            })
            .collect();
        groups.push(GroupSnapshot {
            name: page::get_text(&g.header.name),
            limit_text: page::get_text(&g.header.limit_text),
            devices,
            members,
        });
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(map, GROUP_PAGE_SIZE) };
    }
    Ok((groups, skipped))
}

/// What [`read_sources`] found in every directory it read.
#[derive(Debug, Default)]
pub struct Reading {
    /// Pages of live processes, by PID (the same PID from two directories,
    /// e.g. two containers, appears twice, in directory order).
    pub scan: Scan,
    pub groups: Vec<GroupSnapshot>,
}

/// Whether a source names directories through `*` components.
pub fn is_pattern(source: &Path) -> bool {
    source.components().any(|c| c.as_os_str() == "*")
}

/// Checks a source as the command line gives it: an absolute path in which
/// `*`, if any, stands alone as a whole component.
pub fn check_source(source: &Path) -> Result<(), String> {
    if !source.is_absolute() {
        return Err(format!(
            "--dir {:?} is not valid: expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
            source
        ));
    }
    let bad = source.components().find(|c| {
        let b = c.as_os_str().as_bytes();
        b != b"*" && b.contains(&b'*')
    });
    if let Some(c) = bad {
        return Err(format!(
            "--dir {:?} is not valid: `*` must be a whole path component (it stands for every subdirectory there), not part of {:?}",
            source,
            c.as_os_str()
        ));
    }
    Ok(())
}

/// Directories (each with whether a `*` matched it) and the matched ones
/// that could not be listed.
type Expanded = (Vec<(PathBuf, bool)>, Vec<Skipped>);

/// The directories `source` names: itself, or for a pattern every match,
/// where a component that is exactly `*` stands for each subdirectory at
/// that level (symbolic links are not followed; names starting with `.`
/// are left out). Each comes with whether a `*` matched it. A directory
/// matched by a `*` that cannot be listed is reported in the skipped list;
/// one the pattern names outright is an error.
fn expand(source: &Path) -> Result<Expanded, (PathBuf, io::Error)> {
    use std::path::Component;
    let mut current = vec![(PathBuf::new(), false)];
    let mut skipped = Vec::new();
    for comp in source.components() {
        if comp.as_os_str() != "*" {
            for (dir, _) in &mut current {
                if !matches!(comp, Component::CurDir) {
                    dir.push(comp);
                }
            }
            continue;
        }
        let mut next = Vec::new();
        for (dir, matched) in current {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) if matched => {
                    skipped.push(Skipped {
                        path: dir,
                        reason: format!("cannot list the directory: {e}"),
                    });
                    continue;
                }
                Err(e) => return Err((dir, e)),
            };
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter(|e| !e.file_name().as_bytes().starts_with(b"."))
                .map(|e| e.path())
                .collect();
            found.sort();
            next.extend(found.into_iter().map(|p| (p, true)));
        }
        current = next;
    }
    Ok((current, skipped))
}

/// Reads the pages and group files of every directory the sources name
/// (see [`expand`]), each directory once. A missing directory is empty; a
/// directory named outright that cannot be read is the error returned,
/// with its path; one matched by a `*` that cannot be read is reported as
/// skipped, so one container's directory never hides the others.
pub fn read_sources(sources: &[PathBuf], users: Users) -> Result<Reading, (PathBuf, io::Error)> {
    let mut out = Reading::default();
    let mut seen = std::collections::HashSet::new();
    for source in sources {
        let (dirs, skipped) = expand(source)?;
        out.scan.skipped.extend(skipped);
        for (dir, matched) in dirs {
            if !seen.insert(dir.clone()) {
                continue;
            }
            let read = scan(&dir, users).and_then(|s| scan_groups(&dir, users).map(|g| (s, g)));
            match read {
                Ok((s, (groups, group_skips))) => {
                    out.scan.pages.extend(s.pages);
                    out.scan.skipped.extend(s.skipped);
                    out.scan.skipped.extend(group_skips);
                    out.scan.pruned.extend(s.pruned);
                    out.groups.extend(groups);
                }
                Err(e) if matched => out.scan.skipped.push(Skipped {
                    path: dir,
                    reason: format!("cannot read the directory: {e}"),
                }),
                Err(e) => return Err((dir, e)),
            }
        }
    }
    out.scan.pages.sort_by_key(|p| p.pid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree(name: &str, dirs: &[&str]) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("vramcap-expand-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        root
    }

    fn names(root: &Path, found: &[(PathBuf, bool)]) -> Vec<(String, bool)> {
        found
            .iter()
            .map(|(p, m)| (p.strip_prefix(root).unwrap().display().to_string(), *m))
            .collect()
    }

    #[test]
    fn a_plain_directory_is_itself_and_stars_match_each_subdirectory() {
        let root = tree(
            "stars",
            &[
                "pods/b/v/s",
                "pods/a/v/s",
                "pods/c/other",
                "pods/.hidden/v/s",
            ],
        );
        std::fs::write(root.join("pods/file"), b"not a directory").unwrap();
        std::os::unix::fs::symlink(root.join("pods/a"), root.join("pods/link")).unwrap();

        let (found, skipped) = expand(&root.join("pods")).unwrap();
        assert_eq!(names(&root, &found), [("pods".to_string(), false)]);
        assert!(skipped.is_empty());

        let (found, _) = expand(&root.join("pods/*")).unwrap();
        let want: Vec<(String, bool)> = ["pods/a", "pods/b", "pods/c"]
            .iter()
            .map(|s| (s.to_string(), true))
            .collect();
        assert_eq!(names(&root, &found), want);

        let (found, _) = expand(&root.join("pods/*/v/s")).unwrap();
        let want: Vec<(String, bool)> = ["pods/a/v/s", "pods/b/v/s", "pods/c/v/s"]
            .iter()
            .map(|s| (s.to_string(), true))
            .collect();
        assert_eq!(names(&root, &found), want, "later components are appended");

        let (found, _) = expand(&root.join("missing/*")).unwrap();
        assert!(found.is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_unreadable_prefix_is_an_error_an_unreadable_match_is_skipped() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Root lists any directory: check the outcome through a file
            // where a directory is expected instead.
            let root = tree("unreadable-root", &["pods/a"]);
            std::fs::write(root.join("flat"), b"x").unwrap();
            let (p, e) = expand(&root.join("flat/*")).unwrap_err();
            assert_eq!(p, root.join("flat"));
            assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
            std::fs::remove_dir_all(&root).unwrap();
            return;
        }
        let root = tree("unreadable", &["pods/a/x", "pods/b/x"]);
        std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let (found, skipped) = expand(&root.join("pods/*/*")).unwrap();
        assert_eq!(names(&root, &found), [("pods/b/x".to_string(), true)]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].path, root.join("pods/a"));
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let (p, _) = expand(&root.join("pods/*")).unwrap_err();
        assert_eq!(p, root.join("pods"));
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sources_are_checked() {
        assert!(check_source(Path::new("/run/vramcap/pods/*")).is_ok());
        assert!(check_source(Path::new("/run/vramcap")).is_ok());
        let e = check_source(Path::new("pods/*")).unwrap_err();
        assert!(e.contains("expected an absolute directory path"), "{e}");
        let e = check_source(Path::new("/run/pods/pod-*")).unwrap_err();
        assert!(e.contains("`*` must be a whole path component"), "{e}");
        assert!(is_pattern(Path::new("/a/*/b")));
        assert!(!is_pattern(Path::new("/a/b")));
    }
}
