//! The statistics pages: each file's owner and header are checked (magic,
//! version, sizes, uid, ready) before anything else in it is trusted, and
//! its name must be the one its PID gives. A page whose process died (the
//! shim's lock on its first byte is gone) is removed, only if the name
//! still leads to the file that was read, and never reported.

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use vramcap_core::counters::PageSnapshot;
use vramcap_core::liveness::ofd_locked;
use vramcap_core::page::{self, FILE_SIZE, HEADER_SIZE, PAGE_SIZE, Page, Tail};
use vramcap_core::text;

use super::dir::{Dir, FileId, NotOpened};
use super::file::{CopyError, open_own_for_write, stable_copy};
use super::guard::Guarded;
use super::{Skipped, Users};

#[derive(Debug, Default)]
pub struct Scan {
    /// Live processes, by PID.
    pub pages: Vec<PageSnapshot>,
    /// Files that look like pages but cannot be shown, and directories
    /// with files past a bound of the scan.
    pub skipped: Vec<Skipped>,
    /// Pages of dead processes, and temporary files of dead writers, that
    /// were removed.
    pub pruned: Vec<PathBuf>,
}

impl Scan {
    /// Files not shown: each skipped file, and every file a bound left out.
    pub fn skipped_files(&self) -> usize {
        self.skipped.iter().map(|s| s.count).sum()
    }
}

pub(super) enum Outcome {
    Live(PageSnapshot),
    /// The page of a process that died: its file, to remove.
    Dead(FileId),
    Skip(String),
    /// Still being created, or gone between listing and opening.
    Ignore,
}

/// The values of a checked page, every text field made printable (a page
/// may hold anything: escape sequences, bytes that are not UTF-8).
pub(super) fn shown(copy: &Page) -> PageSnapshot {
    let h = &copy.header;
    PageSnapshot {
        command: text::field(&h.command),
        group: text::field(&h.group),
        pod: text::field(&h.pod),
        namespace: text::field(&h.namespace),
        container: text::field(&h.container),
        ..copy.snapshot()
    }
}

/// One file named like a page: opened without following a link, its
/// owner and header checked, copied (never mapped: see `file`), then told
/// live or dead by its lock.
pub(super) fn read_one(dir: &Dir, name: &OsStr, users: Users) -> Outcome {
    let (file, info) = match dir.open_file(name, |_| false) {
        Ok(x) => x,
        Err(NotOpened::Gone) => return Outcome::Ignore,
        Err(NotOpened::Skip(why)) => return Outcome::Skip(why),
    };
    if !users.accepts_owner(info.uid) {
        return Outcome::Skip(format!("owned by another user (uid {})", info.uid));
    }
    let check = |bytes: &[u8]| {
        let head = &bytes[..bytes.len().min(HEADER_SIZE)];
        page::check_header(info.size, head, users.expected())
    };
    let copy = match stable_copy::<Page, _>(&file, check) {
        Ok(c) => c,
        Err(CopyError::Refused(page::PageProblem::Initialising)) => return Outcome::Ignore,
        Err(CopyError::Refused(p)) => return Outcome::Skip(p.to_string()),
        Err(CopyError::Read(e)) => return Outcome::Skip(e),
    };
    let mut snap = shown(&copy);
    snap.park.host_kept = tail_word(&file, &copy, std::mem::offset_of!(Tail, park_host_kept));
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

/// The tail's word at `offset` (`page::Tail`) of a checked page whose
/// `page_size` covers the tail; 0 for a page of an earlier layout (no
/// tail) or a file that shrank meanwhile.
fn tail_word(file: &std::fs::File, copy: &Page, offset: usize) -> u64 {
    if (copy.header.page_size as usize) < FILE_SIZE {
        return 0;
    }
    let mut w = [0u8; 8];
    match std::os::unix::fs::FileExt::read_exact_at(file, &mut w, (PAGE_SIZE + offset) as u64) {
        Ok(()) => u64::from_ne_bytes(w),
        Err(_) => 0,
    }
}

/// A live process's page mapped for writing (to ask it to trim its
/// cache), guarded: if the file is truncated meanwhile, [`PageMap::shrank`]
/// says so and the page reads as zeroes, never a crash.
pub struct PageMap {
    map: Guarded,
    /// The page's file, kept open to ask whether its process lives.
    file: std::fs::File,
}

impl PageMap {
    pub fn page(&self) -> &Page {
        // SAFETY: the guarded mapping is PAGE_SIZE long (a checked page, or
        // private zeroes once the file shrank) for as long as self lives.
        unsafe { &*self.map.ptr().cast::<Page>() }
    }

    /// The host memory the process keeps for parks (the page's tail; 0
    /// for a page without one).
    pub fn host_kept(&self) -> u64 {
        tail_word(
            &self.file,
            self.page(),
            std::mem::offset_of!(Tail, park_host_kept),
        )
    }

    /// Whether the file shrank under the mapping (what `page` reads is
    /// then not the process's).
    pub fn shrank(&self) -> bool {
        self.map.faulted()
    }

    /// Whether the page's process is alive: it holds the lock on the
    /// page's first byte while it lives (the kernel drops it when it
    /// ends), as a scan tells live pages from dead ones.
    pub fn alive(&self) -> bool {
        ofd_locked(self.file.as_raw_fd(), 0, 1)
    }
}

/// Maps the page of `pid` in `dir` read-write, after the same checks as a scan.
pub fn map_for_write(dir: &Path, pid: u32, users: Users) -> Result<PageMap, String> {
    let path = dir.join(page::file_name(pid));
    let shown = text::path(&path);
    let (file, len, head) = open_own_for_write(&path, users, HEADER_SIZE, "a page", || {
        format!("no process {pid} under vramcap in {}", text::path(dir))
    })?;
    page::check_header(len, &head, users.expected()).map_err(|p| format!("{shown}: {p}"))?;
    let map =
        Guarded::map(file.as_raw_fd(), PAGE_SIZE, true).map_err(|e| format!("{shown}: {e}"))?;
    Ok(PageMap { map, file })
}
