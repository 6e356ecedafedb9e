//! The statistics pages: each file's owner and header are checked (magic,
//! version, sizes, uid, ready) before anything else in it is trusted, and
//! its name must be the one its PID gives. A page whose process died (the
//! shim's lock on its first byte is gone) is removed, only if the name
//! still leads to the file that was read, and never reported.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use vramcap_core::liveness::ofd_locked;
use vramcap_core::page::{self, HEADER_SIZE, PAGE_SIZE, Page, PageSnapshot};

use super::dir::{Dir, FileId, NotOpened, last_error, with_extension};
use super::file::{map_shared, reader_uid, stable_copy};
use super::{Skipped, Users};

#[derive(Debug, Default)]
pub struct Scan {
    /// Live processes, by PID.
    pub pages: Vec<PageSnapshot>,
    /// Files that look like pages but cannot be shown.
    pub skipped: Vec<Skipped>,
    /// Pages of dead processes, and temporary files of dead writers, that
    /// were removed.
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

/// Reads every page in `dir` that `users` covers. A missing directory is
/// an empty scan; an unreadable one is an error.
pub fn scan(dir: &Path, users: Users) -> io::Result<Scan> {
    match Dir::open(dir) {
        Ok(d) => scan_dir(&d, users),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Scan::default()),
        Err(e) => Err(e),
    }
}

fn scan_dir(dir: &Dir, users: Users) -> io::Result<Scan> {
    Ok(scan_names(dir, &dir.names()?, users))
}

/// The pages among `names` (the directory's listing).
pub(super) fn scan_names(dir: &Dir, names: &[OsString], users: Users) -> Scan {
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
    out.pruned.extend(super::temps::remove_stale(dir, names));
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
