//! The process's statistics page (layout in `vramcap_core::page`).
//!
//! The page holds the per-device budgets themselves, so the hot path touches
//! one set of atomics. It is created on the first CUDA call that needs it:
//! a temporary file in the stats directory is sized, mapped, filled, marked
//! ready and then renamed to `<pid>.page`, so a reader never sees a partial
//! page, and the page is never shrunk (readers copy pages rather than map
//! them, so even someone else's truncation cannot make them fault). When
//! the page cannot be created (the directory is not usable: the default one
//! must be the user's own with mode 700, see `vramcap_core::stats_dir`;
//! `VRAMCAP_STATS=off`) the same layout lives in private memory: the cap
//! holds either way.
//!
//! Concurrency: the first caller moves the state from NONE to CREATING and
//! builds the page (this allocates: paths, the command line); any other
//! thread arriving meanwhile yields until the pointer is published
//! (creation is a handful of syscalls). After `fork` the child closes its
//! copy of the page's descriptor and unmaps the parent's page (only one
//! thread exists then, see [`PageHandle::forget_after_fork`]); its new
//! engine makes a page of its own, so it never writes the parent's counters.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, AtomicU32, Ordering};

use vramcap_core::page::{self, FILE_SIZE, Page, PageFile, STATE_READY, Tail};
use vramcap_core::settings::default_stats_dir;

use vramcap_core::settings::Settings;

use crate::log::{log_at, log_once};

const NONE: u8 = 0;
const CREATING: u8 = 1;
const READY: u8 = 2;

/// The process's page, created on first use.
pub struct PageHandle {
    page: AtomicPtr<Page>,
    state: AtomicU8,
    /// The page's path when it is a shared file (leaked, NUL-terminated).
    path: AtomicPtr<CString>,
    /// The page's descriptor, holding the liveness lock (-1: none).
    fd: AtomicI32,
    /// The pid that created the shared page (its owner removes it at exit).
    owner: AtomicU32,
}

impl PageHandle {
    pub const fn new() -> PageHandle {
        PageHandle {
            page: AtomicPtr::new(ptr::null_mut()),
            state: AtomicU8::new(NONE),
            path: AtomicPtr::new(ptr::null_mut()),
            fd: AtomicI32::new(-1),
            owner: AtomicU32::new(0),
        }
    }

    /// The page, created on first use.
    #[inline(always)]
    pub fn get(&self, settings: &Settings) -> &'static Page {
        let p = self.page.load(Ordering::Acquire);
        if p.is_null() {
            self.create(settings)
        } else {
            // SAFETY: a published page is mapped (or leaked) for the life
            // of the process (a child after fork never uses this handle
            // again).
            unsafe { &*p }
        }
    }

    /// The words after the page (`vramcap_core::page::Tail`), the page
    /// created on first use: every page this handle makes, shared or
    /// private, is a whole [`PageFile`].
    pub fn tail(&self, settings: &Settings) -> &'static Tail {
        let _ = self.get(settings);
        // The published pointer itself (its provenance covers the whole
        // PageFile), not the `&Page` that `get` answers.
        let p = self.page.load(Ordering::Acquire).cast::<PageFile>();
        // SAFETY: `get` published it (non-null from then on in this
        // process); it is the start of a PageFile (`open_shared` maps
        // FILE_SIZE bytes, `private` allocates one) that lives as long.
        unsafe { &(*p).tail }
    }

    #[cold]
    fn create(&self, settings: &Settings) -> &'static Page {
        if self
            .state
            .compare_exchange(NONE, CREATING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let p = match self.open_shared(settings) {
                Ok(p) => p,
                Err(why) => {
                    if let Some(why) = why {
                        log_once!(
                            Warn,
                            "{why}; counters are not published (the cap still holds)"
                        );
                    }
                    private()
                }
            };
            self.page.store(p, Ordering::Release);
            self.state.store(READY, Ordering::Release);
            // SAFETY: just published, valid for the life of the process.
            return unsafe { &*p };
        }
        loop {
            let p = self.page.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: see `get`.
                return unsafe { &*p };
            }
            std::thread::yield_now();
        }
    }
}

/// A zeroed page and its tail in private memory.
fn private() -> *mut Page {
    // SAFETY: all-zero bytes are a valid PageFile (integers and atomics only).
    let b: Box<PageFile> = unsafe { Box::new_zeroed().assume_init() };
    Box::into_raw(b).cast::<Page>()
}

/// Creates `path` as a new file of this user, mode 600: never follows a
/// link, never reuses a file that exists. The descriptor, or -1 (errno set).
pub fn create_private(path: &CString) -> i32 {
    // SAFETY: a valid NUL-terminated path; O_EXCL|O_NOFOLLOW make it ours.
    unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    }
}

/// Maps `len` bytes of `fd` shared, for reading and writing.
///
/// # Safety
/// `fd` is an open file at least `len` bytes long.
pub unsafe fn map_shared(fd: i32, len: usize) -> Option<*mut libc::c_void> {
    // SAFETY: the caller's contract; the kernel checks the rest.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p)
}

pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn command_line() -> String {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let parts: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    parts.join(" ")
}

pub fn cstring(p: &Path) -> Result<CString, Option<String>> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Some(format!("stats path {p:?} contains a NUL byte")))
}

pub fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Makes sure `dir` exists and may hold pages and group files (see
/// `vramcap_core::stats_dir`): it is made with mode 0700 unless it exists,
/// then opened without following a symbolic link and checked on that
/// descriptor. The default directory must be the user's with no access for
/// others (a directory or link another user planted under its name is
/// refused: nothing is published there); a directory the user named only
/// has to be a directory.
pub fn prepare_dir(dir: &Path, uid: u32, is_default: bool) -> Result<(), Option<String>> {
    use vramcap_core::stats_dir::{self, DirProblem};
    stats_dir::prepare(dir, is_default.then_some(uid)).map_err(|p| {
        Some(match p {
            _ if is_default => p.refusal(dir, uid),
            DirProblem::Io(e) => format!("the stats directory {dir:?}: {e}"),
            DirProblem::SymbolicLink | DirProblem::NotADirectory => {
                format!("the stats directory {dir:?} is not a directory (or is a symbolic link)")
            }
            p => p.describe(dir, uid),
        })
    })
}

impl PageHandle {
    fn open_shared(&self, s: &Settings) -> Result<*mut Page, Option<String>> {
        if !s.stats {
            return Err(None);
        }
        // SAFETY: getuid and getpid cannot fail.
        let (uid, pid) = unsafe { (libc::getuid(), libc::getpid() as u32) };
        let (dir, is_default) = match &s.stats_dir {
            Some(d) => (d.clone(), false),
            None => (default_stats_dir(uid), true),
        };
        prepare_dir(&dir, uid, is_default)?;
        let final_path: PathBuf = dir.join(page::file_name(pid));
        let tmp_path: PathBuf = dir.join(format!(".{pid}.{}.tmp", now_unix_ns()));
        let tmp = cstring(&tmp_path)?;
        let fin = cstring(&final_path)?;
        let fd = create_private(&tmp);
        if fd < 0 {
            return Err(Some(format!(
                "cannot create a page in {dir:?}: {}",
                errno_text()
            )));
        }
        let fail = |what: &str| -> Result<*mut Page, Option<String>> {
            let e = errno_text();
            // SAFETY: fd is open; tmp is a valid path.
            unsafe {
                libc::close(fd);
                libc::unlink(tmp.as_ptr());
            }
            Err(Some(format!("cannot {what} the page {tmp_path:?}: {e}")))
        };
        // SAFETY: fd is an open regular file.
        if unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0 {
            return fail("size");
        }
        // Every byte backed now: a sparse page in a full tmpfs (another
        // user can fill /dev/shm) would fault (SIGBUS) at its first write
        // inside a CUDA call; a full one fails here, cleanly.
        // SAFETY: fd is an open regular file of that size.
        let rc = unsafe { libc::posix_fallocate(fd, 0, FILE_SIZE as libc::off_t) };
        if rc != 0 {
            // posix_fallocate answers the error instead of setting errno.
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = rc };
            return fail("allocate");
        }
        // SAFETY: the file is FILE_SIZE long (the page and its tail).
        let Some(map) = (unsafe { map_shared(fd, FILE_SIZE) }) else {
            return fail("map");
        };
        // The descriptor stays open for the life of the process: its lock on the
        // first byte is how readers tell a live page from a dead process's, in
        // any PID namespace (the kernel drops the lock when the process dies;
        // the descriptor is close-on-exec, so exec drops it too).
        if !vramcap_core::liveness::ofd_lock(fd, 0, 1, true) {
            return fail("lock");
        }
        self.fd.store(fd, Ordering::Release);
        let p = map.cast::<Page>();
        // SAFETY: the fresh file reads as zeroes, a valid Page; nobody else has
        // it mapped yet (its name is private until the rename below).
        let header = unsafe { &mut (*p).header };
        let group = std::env::var("VRAMCAP_GROUP").unwrap_or_default();
        header.fill(
            pid,
            uid,
            vramcap_core::liveness::start_time(pid).unwrap_or(0),
            now_unix_ns(),
            &command_line(),
            &group,
        );
        header.fill_identity(|name| std::env::var(name).ok());
        header.counting = s.counting.page_code();
        header.park_mode = s.park.map_or(vramcap_core::park::MODE_OFF, |m| m.word());
        // The page and its tail: readers read the tail of a page this long.
        header.page_size = FILE_SIZE as u32;
        header.state.store(STATE_READY, Ordering::Release);
        // SAFETY: two valid paths in the same directory.
        if unsafe { libc::rename(tmp.as_ptr(), fin.as_ptr()) } != 0 {
            let e = errno_text();
            // SAFETY: unmapping what we mapped; removing our temporary file.
            unsafe {
                libc::munmap(map, FILE_SIZE);
                libc::unlink(tmp.as_ptr());
            }
            return Err(Some(format!("cannot publish the page {final_path:?}: {e}")));
        }
        self.owner.store(pid, Ordering::Release);
        self.path
            .store(Box::into_raw(Box::new(fin)), Ordering::Release);
        log_at!(Debug, "statistics page: {:?}", final_path);
        Ok(p)
    }

    /// Removes this process's page at normal exit. The mapping stays: code
    /// that runs after this (other libraries' destructors freeing memory)
    /// still updates the counters, just no longer visibly.
    pub fn remove_at_exit(&self) {
        let path = self.path.load(Ordering::Acquire);
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        if !path.is_null() && self.owner.load(Ordering::Acquire) == pid {
            // SAFETY: `path` holds a leaked, valid CString.
            unsafe { libc::unlink((*path).as_ptr()) };
        }
    }

    /// In a child after fork, before anything else runs: drop the inherited
    /// descriptor (it shares the parent's liveness lock, which would make the
    /// parent's page look alive while this child runs) and unmap the parent's
    /// shared page, which the child must never write. The handle is not used
    /// again: the child's new engine has a new one.
    pub fn forget_after_fork(&self) {
        let fd = self.fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: closing our copy of the descriptor; the parent keeps its own.
            unsafe { libc::close(fd) };
        }
        // A stray use of this handle after this (a hook interrupted by a
        // signal handler that forked) makes a private page instead of
        // waiting for one that never comes.
        self.state.store(NONE, Ordering::Release);
        let p = self.page.swap(ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() && !self.path.load(Ordering::Acquire).is_null() {
            // SAFETY: only this thread exists in the child; nothing refers to
            // the mapping once the engine that owns this handle is dropped from use.
            unsafe { libc::munmap(p.cast(), FILE_SIZE) };
        }
    }
}
