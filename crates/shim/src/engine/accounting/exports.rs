//! Knowing an import of this process's own export: the descriptors the
//! driver exports VMM memory as (`cuMemExportToShareableHandle`, POSIX file
//! descriptors) are all open on one device file (`/dev/nvidiactl`: one
//! device and inode on the H200), and a number is reused as soon as it is
//! closed. So an export is remembered by a descriptor of the engine's own
//! open on the same file description, and a later import is compared with
//! it by `kcmp`, which tells file descriptions apart. The kept descriptors
//! are closed when the memory goes, and in a child after fork (each would
//! keep the parent's memory allocated for the child's life).
//!
//! # Concurrency
//! - The ordinary path's exports are a list under one `Mutex`, held for
//!   one scan or push, never across a driver call. Under it the VMM
//!   registry is asked only whether a handle is in it (a shard's lock for
//!   one lookup); no code takes the list while it holds a registry entry.

use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// `kcmp`'s comparison of open files.
const KCMP_FILE: libc::c_int = 0;

/// A descriptor of the engine's own open on the same file description as
/// `fd` (close-on-exec); `None` when none can be had (not a descriptor of
/// this process, or none left).
pub fn keep(fd: c_int) -> Option<OwnedFd> {
    // SAFETY: fcntl with F_DUPFD_CLOEXEC makes a new descriptor or fails.
    let kept = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    // SAFETY: a descriptor just made, owned by nobody else.
    (kept >= 0).then(|| unsafe { OwnedFd::from_raw_fd(kept) })
}

/// Whether descriptors `a` and `b` of this process are open on the same
/// file description; `None` when the kernel will not say (no `kcmp`, a
/// seccomp filter that refuses it, or a descriptor that is not open).
pub fn same_file(a: c_int, b: &OwnedFd) -> Option<bool> {
    // SAFETY: getpid cannot fail; kcmp only compares, and fails cleanly on
    // a bad descriptor.
    let r = unsafe {
        let pid = libc::getpid();
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            pid,
            KCMP_FILE,
            a as libc::c_ulong,
            b.as_raw_fd() as libc::c_ulong,
        )
    };
    match r {
        0 => Some(true),
        1..=3 => Some(false),
        _ => None,
    }
}

/// One export of the ordinary path: the descriptor the program got, the
/// engine's own on its file (when one could be had), and the handle.
struct Export {
    fd: c_int,
    kept: Option<OwnedFd>,
    handle: u64,
}

/// The VMM handles this process exported as descriptors, outside tiered
/// spill (whose handles keep their own: `engine/tiered/handles.rs`).
#[derive(Default)]
pub struct Exports {
    list: Mutex<Vec<Export>>,
}

impl Exports {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Export>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `handle` was exported as `fd`. `live` says which handles remembered
    /// so far still exist; the others are forgotten (their descriptors
    /// closed) now.
    pub fn add(&self, fd: c_int, handle: u64, live: impl Fn(u64) -> bool) {
        let kept = keep(fd);
        let mut list = self.lock();
        list.retain(|x| live(x.handle));
        list.push(Export { fd, kept, handle });
    }

    /// The handle whose export `fd` is open on: by its file description
    /// where the kernel can compare them, else by its number (a descriptor
    /// that could not be kept, or no `kcmp`), as an export is most often
    /// imported with the number it was given. The most recent first.
    pub fn of(&self, fd: c_int) -> Option<u64> {
        self.lock()
            .iter()
            .rev()
            .find(|x| {
                x.kept
                    .as_ref()
                    .and_then(|k| same_file(fd, k))
                    .unwrap_or(x.fd == fd)
            })
            .map(|x| x.handle)
    }

    /// In a child after fork (one thread): closes the kept descriptors,
    /// when no thread of the parent held the list at the fork.
    pub fn close_kept_after_fork(&self) {
        if let Ok(mut list) = self.list.try_lock() {
            for x in list.iter_mut() {
                x.kept = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> c_int {
        // SAFETY: open of a literal path.
        unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) }
    }

    /// An export is known by its open file: a copy of its descriptor is
    /// it, another file at its number (once it was closed) is not; a
    /// number that was never a descriptor is matched by number; exports
    /// of handles gone are forgotten at the next export.
    #[test]
    fn an_export_is_known_by_its_file_and_else_by_its_number() {
        let x = Exports::default();
        let fd = devnull();
        x.add(fd, 1, |_| true);
        // SAFETY: our own descriptors.
        let copy = unsafe { libc::dup(fd) };
        assert_eq!(x.of(copy), Some(1));
        assert_eq!(x.of(fd), Some(1));
        // The number now names another file (dup2 replaces it at once).
        // SAFETY: our own descriptors.
        unsafe {
            let other = devnull();
            assert_eq!(libc::dup2(other, fd), fd);
            libc::close(other);
        }
        assert_eq!(x.of(fd), None);
        // Not a descriptor of this process (the stand-in's exports): by number.
        x.add(1 << 20, 2, |_| true);
        assert_eq!(x.of(1 << 20), Some(2));
        assert_eq!(x.of((1 << 20) + 1), None);
        // Handle 1 is gone: forgotten at the next export, its copy closed.
        x.add(1 << 21, 3, |h| h != 1);
        assert_eq!(x.of(copy), None);
        assert_eq!(x.lock().len(), 2);
        x.close_kept_after_fork();
        assert!(x.lock().iter().all(|e| e.kept.is_none()));
        // SAFETY: our own descriptors.
        unsafe {
            libc::close(copy);
            libc::close(fd);
        }
    }
}
