//! Shared mappings that a file shrinking under them cannot crash.
//!
//! Touching a shared mapping past the end of its file raises SIGBUS, and
//! whoever can write the file (its owner, root, a container's root) can
//! shrink it at any moment. Readers copy what they only read
//! ([`super::file::stable_copy`]); what must be changed in place with
//! atomic instructions (a group's budget when dead members' bytes are
//! returned, a page's trim request) is mapped through [`Guarded`].
//!
//! Each guarded mapping is registered in a fixed table (64 slots) that a
//! SIGBUS handler, installed once, consults:
//!
//! - A fault inside a registered range is absorbed: the handler maps
//!   private zeroed memory over the whole range (`mmap` with `MAP_FIXED`,
//!   a plain system call; nothing it does takes a lock or allocates),
//!   marks the slot and returns. The faulting instruction is restarted on
//!   that memory and succeeds; the caller sees [`Guarded::faulted`] and
//!   throws away whatever it read. Writes after the fault land in the
//!   private memory, never in the file.
//! - A SIGBUS anywhere else goes to the handler that was there before
//!   (Rust's stack-overflow handler, which then restores the default), or
//!   the default action is restored and the fault repeats: a real fault
//!   still ends the process as it would have.
//!
//! The table is only atomics: a slot is claimed (compare-and-swap of its
//! start from 0 to [`CLAIMED`]), filled, then published with its start
//! address; it is unpublished before the range is unmapped, so an address
//! reused by a later mapping is never mistaken for a guarded one.
//! Choosing this over copying: an update must be an atomic instruction on
//! the shared file itself, which no copy can do.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// Guarded mappings that can exist at once.
const SLOTS: usize = 64;
/// A slot's start while it is being filled or emptied (no mapping starts
/// at address 1).
const CLAIMED: usize = 1;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        faulted: AtomicBool::new(false),
    }
}; SLOTS];
/// The SIGBUS action before ours (leaked once, never freed).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Restores the default SIGBUS action (the fault then repeats and ends
/// the process).
fn restore_default() {
    // SAFETY: a zeroed sigaction with SIG_DFL is a valid action.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &TABLE {
        let start = slot.start.load(Ordering::Acquire);
        if start <= CLAIMED {
            continue;
        }
        let len = slot.len.load(Ordering::Acquire);
        if addr >= start && addr - start < len {
            // SAFETY: the range is this slot's mapping, which the guarded
            // code is using right now; replacing it with private zeroed
            // memory keeps every address of it valid.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                slot.faulted.store(true, Ordering::SeqCst);
                return;
            }
            break;
        }
    }
    let prev = PREVIOUS.load(Ordering::Acquire);
    if prev.is_null() {
        restore_default();
        return;
    }
    // SAFETY: PREVIOUS holds the action sigaction returned, leaked.
    let prev = unsafe { &*prev };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        restore_default();
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        type Action = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
        // SAFETY: with SA_SIGINFO, sa_sigaction is a three-argument handler.
        let f: Action = unsafe { std::mem::transmute::<usize, Action>(handler) };
        f(sig, info, ctx);
    } else {
        type Handler = extern "C" fn(libc::c_int);
        // SAFETY: without SA_SIGINFO, sa_sigaction is a one-argument handler.
        let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(handler) };
        f(sig);
    }
}

/// Installs the handler once; false when it could not be.
fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: zeroed sigactions are valid out-buffers; ours names a
        // handler of the SA_SIGINFO kind.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let old = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
            PREVIOUS.store(old, Ordering::Release);
            if libc::sigaction(libc::SIGBUS, &new, old) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
    INSTALLED.load(Ordering::Acquire)
}

/// A shared mapping of a file whose faults are absorbed (see the module).
pub struct Guarded {
    ptr: *mut libc::c_void,
    len: usize,
    slot: usize,
}

impl Guarded {
    /// Maps the first `len` bytes of `fd` shared (read-write when
    /// `write`), guarded.
    pub fn map(fd: libc::c_int, len: usize, write: bool) -> Result<Guarded, String> {
        if !install() {
            return Err(format!(
                "cannot install the SIGBUS handler: {}",
                std::io::Error::last_os_error()
            ));
        }
        let len = len.div_ceil(page_size()) * page_size();
        let slot = TABLE
            .iter()
            .position(|s| {
                s.start
                    .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or_else(|| format!("more than {SLOTS} files are mapped at once"))?;
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel; a fault in it is
        // absorbed once the range is published below (nothing touches it
        // before).
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            TABLE[slot].start.store(0, Ordering::Release);
            return Err(format!("cannot map: {e}"));
        }
        let s = &TABLE[slot];
        s.len.store(len, Ordering::Release);
        s.faulted.store(false, Ordering::SeqCst);
        s.start.store(ptr as usize, Ordering::Release);
        Ok(Guarded { ptr, len, slot })
    }

    pub fn ptr(&self) -> *mut libc::c_void {
        self.ptr
    }

    /// Whether the file shrank under the mapping: what was read from it is
    /// not the file's, and must be thrown away.
    pub fn faulted(&self) -> bool {
        TABLE[self.slot].faulted.load(Ordering::SeqCst)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        // Unpublished first: once unmapped, the addresses may be reused.
        s.start.store(CLAIMED, Ordering::SeqCst);
        // SAFETY: unmapping what `map` mapped (or what the handler put in
        // its place); nothing refers to it any more.
        unsafe { libc::munmap(self.ptr, self.len) };
        s.start.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicU64;

    fn file(name: &str, len: u64) -> (std::path::PathBuf, std::fs::File) {
        let p = std::env::temp_dir().join(format!("vramcap-guard-{}-{name}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(len).unwrap();
        (p, f)
    }

    #[test]
    fn a_file_truncated_under_the_mapping_faults_into_zeroes_not_a_crash() {
        let (path, f) = file("shrink", 3 * 4096);
        std::os::unix::fs::FileExt::write_all_at(&f, &7u64.to_ne_bytes(), 8192).unwrap();
        let m = Guarded::map(f.as_raw_fd(), 3 * 4096, true).unwrap();
        // SAFETY: the mapping is 3 pages long and 8-aligned at 8192.
        let word = unsafe { &*(m.ptr().cast::<u8>().add(8192).cast::<AtomicU64>()) };
        assert_eq!(word.load(Ordering::SeqCst), 7);
        assert!(!m.faulted());
        f.set_len(0).unwrap();
        assert_eq!(word.fetch_add(1, Ordering::SeqCst), 0, "private zeroes now");
        assert!(m.faulted());
        assert_eq!(word.load(Ordering::SeqCst), 1);
        drop(m);
        // The slot is free again and the next mapping starts clean.
        f.set_len(4096).unwrap();
        let m = Guarded::map(f.as_raw_fd(), 4096, false).unwrap();
        assert!(!m.faulted());
        drop(m);
        assert_eq!(f.metadata().unwrap().len(), 4096, "nothing wrote the file");
        std::fs::remove_file(path).unwrap();
    }

    /// A SIGBUS outside every guarded range still ends the process (in a
    /// child: a plain mapping of a truncated file, touched).
    #[test]
    fn a_fault_elsewhere_still_kills() {
        let (path, f) = file("elsewhere", 4096);
        let guarded = Guarded::map(f.as_raw_fd(), 4096, false).unwrap();
        // SAFETY: fork in a test: the child only makes system calls and
        // touches memory before it exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: a plain mapping of the file, which is then shrunk and
            // touched: this must raise SIGBUS and kill the child.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                libc::ftruncate(f.as_raw_fd(), 0);
                std::ptr::read_volatile(p.cast::<u8>());
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "status {status:#x}"
        );
        drop(guarded);
        std::fs::remove_file(path).unwrap();
    }
}
