//! Finding and reading the statistics pages of live processes.
//!
//! A reader trusts nothing in the directory, which other users or
//! containers may control. Directories are opened once and everything in
//! them is opened relative to that descriptor, never by path again; below a
//! `*` of a pattern no symbolic link is followed. A file is first opened
//! with `O_PATH` and checked to be a regular file (a FIFO or device planted
//! under a page's name is never opened for reading), then reopened through
//! `/proc/self/fd` so the inode checked is the one read. Its owner and
//! header are checked (magic, version, sizes, uid, ready). The reader's own
//! files are mapped read-only and read with atomic loads (writers never
//! shrink a page, so a mapped page cannot fault); anyone else's (with
//! `Users::All`) are copied out with `pread` until two reads agree, because
//! their owner could truncate a mapping under the reader. Pages of dead
//! processes are removed (`unlinkat`, only if the name still leads to the
//! file that was read) and never reported. Group files are handled the same
//! way; only the reader's own are mapped for writing, to return dead
//! members' bytes.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use vramcap_core::liveness::ofd_locked;
use vramcap_core::page::{self, HEADER_SIZE, PAGE_SIZE, Page, PageSnapshot};

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
    /// The page of a process that died: its file, to remove.
    Dead(FileId),
    Skip(String),
    /// Still being created, or gone between listing and opening.
    Ignore,
}

/// Which file a name led to (device and inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

/// What an opened file is.
struct FileInfo {
    id: FileId,
    uid: u32,
    size: u64,
}

/// Why a file was not opened.
enum NotOpened {
    /// Gone since it was listed.
    Gone,
    Skip(String),
}

/// An open directory and the path it was reached by (for messages and
/// snapshots). Everything below it is opened relative to the descriptor,
/// never by path again, so a directory replaced by a symbolic link after it
/// was opened changes nothing.
pub(crate) struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

fn c_name(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a name"))
}

/// Takes ownership of a descriptor a call just returned (or its error).
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Dir {
    /// The directory at `path`, symbolic links in it followed: the path is
    /// the reader's own choice.
    fn open(path: &Path) -> io::Result<Dir> {
        let c = c_name(path.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        let fd = owned(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The subdirectory `name`; a symbolic link is refused (ELOOP or
    /// ENOTDIR), whoever controls this directory.
    fn sub(&self, name: &OsStr) -> io::Result<Dir> {
        let c = c_name(name.as_bytes())?;
        // SAFETY: an open directory and a valid name.
        let fd = owned(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir {
            fd,
            path: self.path.join(name),
        })
    }

    /// The names in the directory (not `.` and `..`), sorted.
    fn names(&self) -> io::Result<Vec<OsString>> {
        // fdopendir takes its descriptor over: give it a duplicate, and
        // rewind, as the duplicate shares the position of ours.
        // SAFETY: duplicating an open descriptor.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(last_error());
        }
        // SAFETY: dup is an open directory descriptor that the stream owns
        // from here on (closedir closes it).
        let stream = unsafe { libc::fdopendir(dup) };
        if stream.is_null() {
            let e = last_error();
            // SAFETY: fdopendir failed, so dup is still ours to close.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // SAFETY: a valid stream.
        unsafe { libc::rewinddir(stream) };
        let mut names = Vec::new();
        let result = loop {
            // SAFETY: errno is thread-local; clearing it tells the end of
            // the directory (NULL, errno 0) from an error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: a valid stream, used by this thread only.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let e = last_error();
                break if e.raw_os_error().unwrap_or(0) == 0 {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: readdir returned a valid entry with a NUL-terminated name.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_os_string());
            }
        };
        // SAFETY: closing the stream opened above (and its descriptor).
        unsafe { libc::closedir(stream) };
        result?;
        names.sort();
        Ok(names)
    }

    /// Opens the regular file `name` without following a link, checking its
    /// type before anything else: a device node or FIFO planted under a
    /// page's name is never opened for reading. The inode checked is the
    /// one opened (through /proc/self/fd), whatever happens to the name
    /// meanwhile. `write(info)` says, once the file is known, whether to
    /// open it for writing.
    fn open_file(
        &self,
        name: &OsStr,
        write: impl FnOnce(&FileInfo) -> bool,
    ) -> Result<(std::fs::File, FileInfo), NotOpened> {
        let c = c_name(name.as_bytes())
            .map_err(|_| NotOpened::Skip("the name holds a NUL byte".into()))?;
        // SAFETY: an open directory and a valid name; O_PATH opens nothing
        // but the name's inode.
        let path_fd = match owned(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        }) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(NotOpened::Gone),
            Err(e) => return Err(NotOpened::Skip(format!("cannot open: {e}"))),
        };
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: an open descriptor and a valid out-buffer.
        if unsafe { libc::fstat(path_fd.as_raw_fd(), &mut st) } != 0 {
            return Err(NotOpened::Skip(format!("cannot inspect: {}", last_error())));
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFLNK => return Err(NotOpened::Skip("a symbolic link, not a page".into())),
            _ => return Err(NotOpened::Skip("not a regular file".into())),
        }
        let info = FileInfo {
            id: FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            uid: st.st_uid,
            size: st.st_size as u64,
        };
        let again = c_name(format!("/proc/self/fd/{}", path_fd.as_raw_fd()).as_bytes())
            .map_err(|e| NotOpened::Skip(e.to_string()))?;
        let mode = if write(&info) {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        // SAFETY: a valid path naming the inode held by path_fd.
        let fd = owned(unsafe {
            libc::open(
                again.as_ptr(),
                mode | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY,
            )
        })
        .map_err(|e| NotOpened::Skip(format!("cannot open: {e}")))?;
        Ok((std::fs::File::from(fd), info))
    }

    /// Removes `name` if it is still the file `st` describes.
    fn remove_if_same(&self, name: &OsStr, id: FileId) -> bool {
        let Ok(c) = c_name(name.as_bytes()) else {
            return false;
        };
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut now: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: an open directory, a valid name and out-buffer.
        let same = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut now,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        } == 0
            && now.st_dev == id.dev
            && now.st_ino == id.ino;
        // SAFETY: an open directory and a valid name.
        same && unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } == 0
    }
}

/// The reader's effective uid: files it owns are mapped (only it and root
/// can shrink them); anyone else's are copied out with `pread`, because
/// their owner could truncate a mapped file and make the reader fault.
fn reader_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Types that every byte pattern of their size is a valid value of.
///
/// # Safety
/// Implement only for `repr(C)` types made of integers, atomics of integers
/// and arrays of those.
unsafe trait AnyBytes: Sized {}
// SAFETY: a page is integers, atomic integers and byte arrays (page.rs).
unsafe impl AnyBytes for Page {}
// SAFETY: a group page is integers, atomic integers and byte arrays (group.rs).
unsafe impl AnyBytes for vramcap_core::group::GroupPage {}

/// A private copy of the `T` at the start of `file`, read with `pread`
/// until two reads agree (at most 8), so a copy is not torn by a writer in
/// the middle of an update (the last read is kept if they never agree).
fn stable_copy<T: AnyBytes>(file: &std::fs::File) -> Result<Box<T>, String> {
    let size = std::mem::size_of::<T>();
    let read = |buf: &mut Vec<u8>| {
        file.read_exact_at(buf, 0)
            .map_err(|e| format!("cannot read: {e} (the file shrank while being read)"))
    };
    let (mut a, mut b) = (vec![0u8; size], vec![0u8; size]);
    read(&mut a)?;
    for _ in 0..8 {
        read(&mut b)?;
        if a == b {
            break;
        }
        std::mem::swap(&mut a, &mut b);
    }
    let mut boxed = Box::<T>::new_uninit();
    // SAFETY: `a` holds exactly size_of::<T>() bytes and the box has room
    // for them; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), boxed.as_mut_ptr().cast::<u8>(), size) };
    // SAFETY: every byte is initialised and, T being AnyBytes, any bytes
    // are a valid T.
    Ok(unsafe { boxed.assume_init() })
}

/// Maps `len` bytes of `fd` shared (read-only unless `write`), or `None`.
///
/// # Safety
/// `fd` must be an open file at least `len` bytes long that nobody shrinks
/// while the mapping lives (the reader's own pages and group files).
unsafe fn map_shared(fd: libc::c_int, len: usize, write: bool) -> Option<*mut libc::c_void> {
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: as the caller promises.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    (map != libc::MAP_FAILED).then_some(map)
}

/// Reads every page in `dir` that `users` covers. A missing directory is
/// an empty scan; an unreadable one is an error.
pub fn scan(dir: &Path, users: Users) -> io::Result<Scan> {
    match Dir::open(dir) {
        Ok(d) => scan_dir(&d, users),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Scan::default()),
        Err(e) => Err(e),
    }
}

/// The names in `names` with this extension.
fn with_extension<'a>(names: &'a [OsString], ext: &'a str) -> impl Iterator<Item = &'a OsString> {
    names
        .iter()
        .filter(move |n| Path::new(n).extension().is_some_and(|x| x == ext))
}

fn scan_dir(dir: &Dir, users: Users) -> io::Result<Scan> {
    Ok(scan_names(dir, &dir.names()?, users))
}

/// The pages among `names` (the directory's listing).
fn scan_names(dir: &Dir, names: &[OsString], users: Users) -> Scan {
    let mut out = Scan::default();
    for name in with_extension(names, "page") {
        let path = dir.path.join(name);
        match read_one(dir, name, users) {
            Outcome::Live(mut p) => {
                p.dir = dir.path.clone();
                out.pages.push(p)
            }
            Outcome::Dead(id) => {
                if dir.remove_if_same(name, id) {
                    out.pruned.push(path);
                }
            }
            Outcome::Skip(reason) => out.skipped.push(Skipped { path, reason }),
            Outcome::Ignore => {}
        }
    }
    out.pages.sort_by_key(|p| p.pid);
    out
}

fn read_one(dir: &Dir, name: &OsStr, users: Users) -> Outcome {
    let (file, info) = match dir.open_file(name, |_| false) {
        Ok(x) => x,
        Err(NotOpened::Gone) => return Outcome::Ignore,
        Err(NotOpened::Skip(why)) => return Outcome::Skip(why),
    };
    if !users.accepts_owner(info.uid) {
        return Outcome::Skip(format!("owned by another user (uid {})", info.uid));
    }
    let mut head = vec![0u8; HEADER_SIZE];
    let n = match file.read_at(&mut head, 0) {
        Ok(n) => n,
        Err(e) => return Outcome::Skip(format!("cannot read: {e}")),
    };
    head.truncate(n);
    match page::check_header(info.size, &head, users.expected()) {
        Ok(()) => {}
        Err(page::PageProblem::Initialising) => return Outcome::Ignore,
        Err(p) => return Outcome::Skip(p.to_string()),
    }
    let snap = if info.uid == reader_uid() {
        // SAFETY: the file is at least PAGE_SIZE long (checked), is the
        // reader's own, and writers never shrink a page, so every byte of
        // the read-only mapping stays backed.
        let Some(map) = (unsafe { map_shared(file.as_raw_fd(), PAGE_SIZE, false) }) else {
            return Outcome::Skip(format!("cannot map: {}", last_error()));
        };
        // SAFETY: the mapping holds a checked page; it is only read, with
        // atomic loads for the live counters, and unmapped right after.
        let snap = unsafe { (*map.cast::<Page>()).snapshot() };
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(map, PAGE_SIZE) };
        snap
    } else {
        match stable_copy::<Page>(&file) {
            Ok(copy) => copy.snapshot(),
            Err(e) => return Outcome::Skip(e),
        }
    };
    let expected = page::file_name(snap.pid);
    if name.as_bytes() != expected.as_bytes() {
        return Outcome::Skip(format!(
            "corrupt page (it names pid {}, the file name does not)",
            snap.pid
        ));
    }
    // The shim holds a lock on the page's first byte while the process
    // lives (see the shim's stats module).
    if ofd_locked(file.as_raw_fd(), 0, 1) {
        Outcome::Live(snap)
    } else {
        Outcome::Dead(info.id)
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
    let Some(ptr) = (unsafe { map_shared(fd, PAGE_SIZE, true) }) else {
        return Err(format!("cannot map {}: {}", path.display(), last_error()));
    };
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
    /// The directory the group file was read from.
    pub dir: PathBuf,
    pub name: String,
    pub limit_text: String,
    pub devices: Vec<GroupDeviceSnapshot>,
    pub members: Vec<MemberSnapshot>,
}

/// The group files among `names` (the directory's listing).
fn groups_names(dir: &Dir, names: &[OsString], users: Users) -> (Vec<GroupSnapshot>, Vec<Skipped>) {
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
        Err(page::PageProblem::Initialising) => return Ok(None),
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

/// The group's values; members are those whose lock is held.
fn group_snapshot(
    g: &vramcap_core::group::GroupPage,
    alive: impl Fn(usize) -> bool,
) -> GroupSnapshot {
    use std::sync::atomic::Ordering;
    let ready: Vec<usize> = (0..g.devices.len())
        .filter(|&i| {
            g.devices[i].state.load(Ordering::Acquire) == vramcap_core::group::DEVICE_READY
        })
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
        .filter(|(i, _)| alive(*i))
        .map(|(_, m)| MemberSnapshot {
            pid: m.pid.load(Ordering::Acquire),
            start_time: m.start_time.load(Ordering::Acquire),
            held: ready
                .iter()
                .map(|&i| m.held[i].load(Ordering::Acquire))
                .collect(),
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

/// Checks a source as the command line gives it: an absolute path without
/// `..`, in which `*`, if any, stands alone as a whole component.
pub fn check_source(source: &Path) -> Result<(), String> {
    use std::path::Component;
    if !source.is_absolute() {
        return Err(format!(
            "--dir {:?} is not valid: expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
            source
        ));
    }
    if source.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "--dir {:?} is not valid: `..` is not allowed (name the directory itself)",
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

/// An open directory a source names, and whether a `*` matched it.
struct Found {
    dir: Dir,
    matched: bool,
}

/// Directories a source names, and matched ones that could not be listed.
type Expanded = (Vec<Found>, Vec<Skipped>);

/// The directories `source` names: itself, or for a pattern every match,
/// where a component that is exactly `*` stands for each subdirectory at
/// that level (names starting with `.` are left out). The part before the
/// first `*` is opened as a path, symbolic links followed (it is the
/// reader's choice); from the first `*` on, every component is opened
/// relative to its parent without following a symbolic link, since others
/// may control those directories. A directory matched by a `*` that cannot
/// be listed is reported in the skipped list; an error opening the part the
/// source names outright is returned.
fn expand(source: &Path) -> Result<Expanded, (PathBuf, io::Error)> {
    use std::path::Component;
    let comps: Vec<Component> = source.components().collect();
    let first_star = comps
        .iter()
        .position(|c| c.as_os_str() == "*")
        .unwrap_or(comps.len());
    let prefix: PathBuf = comps[..first_star].iter().collect();
    let root = match Dir::open(&prefix) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err((prefix, e)),
    };
    let mut current = vec![Found {
        dir: root,
        matched: false,
    }];
    let mut skipped = Vec::new();
    for comp in &comps[first_star..] {
        let mut next = Vec::new();
        for found in current {
            if comp.as_os_str() != "*" {
                // Gone, or not a directory (a symbolic link among them):
                // nothing to read there.
                if let Ok(dir) = found.dir.sub(comp.as_os_str()) {
                    next.push(Found {
                        dir,
                        matched: found.matched,
                    });
                }
                continue;
            }
            let names = match found.dir.names() {
                Ok(n) => n,
                Err(e) if found.matched => {
                    skipped.push(Skipped {
                        path: found.dir.path.clone(),
                        reason: format!("cannot list the directory: {e}"),
                    });
                    continue;
                }
                Err(e) => return Err((found.dir.path.clone(), e)),
            };
            for name in names.iter().filter(|n| !n.as_bytes().starts_with(b".")) {
                if let Ok(dir) = found.dir.sub(name) {
                    next.push(Found { dir, matched: true });
                }
            }
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
        let (found, skipped) = expand(source)?;
        out.scan.skipped.extend(skipped);
        for Found { dir, matched } in found {
            if !seen.insert(dir.path.clone()) {
                continue;
            }
            // One listing serves the pages and the group files.
            let read = dir.names().map(|names| {
                (
                    scan_names(&dir, &names, users),
                    groups_names(&dir, &names, users),
                )
            });
            match read {
                Ok((s, (groups, group_skips))) => {
                    out.scan.pages.extend(s.pages);
                    out.scan.skipped.extend(s.skipped);
                    out.scan.skipped.extend(group_skips);
                    out.scan.pruned.extend(s.pruned);
                    out.groups.extend(groups);
                }
                Err(e) if matched => out.scan.skipped.push(Skipped {
                    path: dir.path,
                    reason: format!("cannot read the directory: {e}"),
                }),
                Err(e) => return Err((dir.path, e)),
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

    fn names(root: &Path, found: &[Found]) -> Vec<(String, bool)> {
        found
            .iter()
            .map(|f| {
                let rel = f.dir.path.strip_prefix(root).unwrap().display().to_string();
                (rel, f.matched)
            })
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

        // After a `*`, a component that is a symbolic link is not followed
        // (pods/c/v links to pods/a/v); a missing one is nothing.
        std::os::unix::fs::symlink(root.join("pods/a/v"), root.join("pods/c/v")).unwrap();
        let (found, _) = expand(&root.join("pods/*/v/s")).unwrap();
        let want: Vec<(String, bool)> = ["pods/a/v/s", "pods/b/v/s"]
            .iter()
            .map(|s| (s.to_string(), true))
            .collect();
        assert_eq!(
            names(&root, &found),
            want,
            "later components are opened in turn"
        );

        // Before the first `*`, the path is the reader's: links are followed.
        std::os::unix::fs::symlink(root.join("pods"), root.join("via")).unwrap();
        let (found, _) = expand(&root.join("via/*")).unwrap();
        assert_eq!(found.len(), 3);

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
            let (p, e) = expand(&root.join("flat/*")).map(|_| ()).unwrap_err();
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
        let (p, _) = expand(&root.join("pods/*")).map(|_| ()).unwrap_err();
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
        let e = check_source(Path::new("/run/vramcap/pods/*/../..")).unwrap_err();
        assert!(e.contains("`..` is not allowed"), "{e}");
        assert!(is_pattern(Path::new("/a/*/b")));
        assert!(!is_pattern(Path::new("/a/b")));
    }
}
