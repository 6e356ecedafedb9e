//! Reading a file the walker opened.
//!
//! Pages, and the group files of other users, are copied out with `pread`
//! until two reads agree, never mapped: whoever can write the file (its
//! owner, root, a container's root, which is the exporter's own uid) could
//! truncate a mapping under the reader and kill it with SIGBUS. A
//! truncated file only makes a read come up short, which is reported as
//! the file having shrunk. The cost is two 17 KiB copies per page per
//! refresh (a few microseconds; `top` redraws once a second), against a
//! mapping's `mmap`, page faults and `munmap`, which cost about the same.
//! What must be changed in place is mapped through [`super::guard`].

use std::os::unix::fs::FileExt;

use vramcap_core::page::Page;

/// The reader's effective uid: its own group files are mapped (guarded)
/// to return dead members' bytes; anyone else's are only copied.
pub(super) fn reader_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Types that every byte pattern of their size is a valid value of.
///
/// # Safety
/// Implement only for `repr(C)` types made of integers, atomics of integers
/// and arrays of those.
pub(super) unsafe trait AnyBytes: Sized {}
// SAFETY: a page is integers, atomic integers and byte arrays (page.rs).
unsafe impl AnyBytes for Page {}
// SAFETY: a group page is integers, atomic integers and byte arrays (group.rs).
unsafe impl AnyBytes for vramcap_core::group::GroupPage {}

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
pub(super) enum CopyError<E> {
    /// `check` refused the first read.
    Refused(E),
    /// A read failed, or came up short (the file shrank).
    Read(String),
}

/// A private copy of the `T` at the start of `file`. The first read is
/// given to `check` (all of it, which is fewer than `size_of::<T>()`
/// bytes when the file is shorter); once accepted, reads are repeated
/// until two agree (at most 8 more), so a copy is not torn by a writer in
/// the middle of an update (the last is kept if they never agree: every
/// field is still a value some writer stored).
pub(super) fn stable_copy<T: AnyBytes, E>(
    file: &std::fs::File,
    check: impl FnOnce(&[u8]) -> Result<(), E>,
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
    let mut boxed = Box::<T>::new_uninit();
    // SAFETY: `a` holds exactly size_of::<T>() bytes and the box has room
    // for them; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), boxed.as_mut_ptr().cast::<u8>(), size) };
    // SAFETY: every byte is initialised and, T being AnyBytes, any bytes
    // are a valid T.
    Ok(unsafe { boxed.assume_init() })
}
