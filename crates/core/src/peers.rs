//! The same user's pages, opened from inside a capped process (the
//! parking policy) and by the CLI's readers, under one set of rules: a
//! page's directory may be shared, so nothing in it is trusted.
//!
//! - [`open_own_page`]: a name is opened without following a link and
//!   without blocking (`O_NOFOLLOW|O_NONBLOCK`), and kept only when the
//!   descriptor is a regular file of at least a page, owned by the uid
//!   asked for (by `fstat`, never a word in the file) and writable by no
//!   one else. Only such a file is ever mapped: no other user can then
//!   truncate it under the mapping (SIGBUS); its owner could, and its
//!   owner can already do anything to the reader's process.
//! - [`stable_copy`]: what is only read is copied with `pread` until two
//!   reads agree, never mapped: a file that shrinks makes a read come up
//!   short, never a fault.
//! - [`SCAN_ENTRIES`] and [`SCAN_PAGES`]: how much one scan of a
//!   directory may look at, whatever is planted in it.

use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::page::{PAGE_SIZE, Page};

/// Directory entries one scan lists at most.
pub const SCAN_ENTRIES: usize = 4096;
/// Pages one scan opens and reads at most.
pub const SCAN_PAGES: usize = 256;

/// Why [`open_own_page`] gave no file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// No such file (it went away).
    Missing,
    /// A link, a FIFO, a directory, a device: anything but a regular file.
    NotRegular,
    /// Owned by another uid, or writable by group or others.
    NotOwn,
    /// Shorter than a page.
    Short,
    /// Any other error of `open` or `fstat`.
    Os(i32),
}

/// Opens `path` read-write without following a link, blocking (a FIFO)
/// or taking a terminal: what every reader that may change another
/// process's file opens it with, before it checks what it got.
pub fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Opens `path`, one of `uid`'s pages, read-write for its mailbox (module
/// docs): the file and its length.
pub fn open_own_page(path: &Path, uid: u32) -> Result<(std::fs::File, u64), OpenError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let file = open_no_follow(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => OpenError::Missing,
        Some(libc::ELOOP) => OpenError::NotRegular,
        e => OpenError::Os(e.unwrap_or(0)),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| OpenError::Os(e.raw_os_error().unwrap_or(0)))?;
    if !meta.is_file() {
        return Err(OpenError::NotRegular);
    }
    if meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
        return Err(OpenError::NotOwn);
    }
    if meta.len() < PAGE_SIZE as u64 {
        return Err(OpenError::Short);
    }
    Ok((file, meta.len()))
}

/// Types that every byte pattern of their size is a valid value of.
///
/// # Safety
/// Implement only for `repr(C)` types made of integers, atomics of integers
/// and arrays of those.
pub unsafe trait AnyBytes: Sized {}
// SAFETY: a page is integers, atomic integers and byte arrays (page.rs).
unsafe impl AnyBytes for Page {}
// SAFETY: a group page is integers, atomic integers and byte arrays (group.rs).
unsafe impl AnyBytes for crate::group::GroupPage {}

/// Reads from offset 0 until `buf` is full or the file ends; the bytes read.
fn read_from_start(file: &std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Why [`stable_copy`] gave no copy.
#[derive(Debug)]
pub enum CopyError<E> {
    /// `check` refused the first read, or the copy that was kept.
    Refused(E),
    /// A read failed, or came up short (the file shrank).
    Read(String),
}

/// A private copy of the `T` at the start of `file`. The first read is
/// given to `check` (all of it, which is fewer than `size_of::<T>()`
/// bytes when the file is shorter); once accepted, reads are repeated
/// until two agree (at most 8 more), so a copy is not torn by a writer in
/// the middle of an update (the last is kept if they never agree: every
/// field is still a value some writer stored). The copy kept is given to
/// `check` again: a writer may have changed what the first read showed.
pub fn stable_copy<T: AnyBytes, E>(
    file: &std::fs::File,
    check: impl Fn(&[u8]) -> Result<(), E>,
) -> Result<Box<T>, CopyError<E>> {
    let size = std::mem::size_of::<T>();
    let (mut a, mut b) = (vec![0u8; size], vec![0u8; size]);
    let n =
        read_from_start(file, &mut a).map_err(|e| CopyError::Read(format!("cannot read: {e}")))?;
    check(&a[..n]).map_err(CopyError::Refused)?;
    let shrank = || CopyError::Read("cannot read: the file shrank while being read".into());
    if n < size {
        return Err(shrank());
    }
    for _ in 0..8 {
        match read_from_start(file, &mut b) {
            Ok(k) if k == size => {}
            Ok(_) => return Err(shrank()),
            Err(e) => return Err(CopyError::Read(format!("cannot read: {e}"))),
        }
        if a == b {
            break;
        }
        std::mem::swap(&mut a, &mut b);
    }
    check(&a).map_err(CopyError::Refused)?;
    let mut boxed = Box::<T>::new_uninit();
    // SAFETY: `a` holds exactly size_of::<T>() bytes and the box has room
    // for them; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), boxed.as_mut_ptr().cast::<u8>(), size) };
    // SAFETY: every byte is initialised and, T being AnyBytes, any bytes
    // are a valid T.
    Ok(unsafe { boxed.assume_init() })
}
