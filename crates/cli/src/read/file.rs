//! Reading a file the walker opened, by who owns it.
//!
//! The reader's own files are mapped (read-only for pages, which are read
//! with atomic loads): only it and root can shrink them, and writers never
//! shrink a page, so a mapped page cannot fault. Anyone else's (with
//! `Users::All`) are copied out with `pread` until two reads agree, because
//! their owner could truncate a mapping under the reader and make it fault.

use std::os::unix::fs::FileExt;

use vramcap_core::page::Page;

/// The reader's effective uid: files it owns are mapped (only it and root
/// can shrink them); anyone else's are copied out with `pread`, because
/// their owner could truncate a mapped file and make the reader fault.
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

/// A private copy of the `T` at the start of `file`, read with `pread`
/// until two reads agree (at most 8), so a copy is not torn by a writer in
/// the middle of an update (the last read is kept if they never agree).
pub(super) fn stable_copy<T: AnyBytes>(file: &std::fs::File) -> Result<Box<T>, String> {
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
pub(super) unsafe fn map_shared(
    fd: libc::c_int,
    len: usize,
    write: bool,
) -> Option<*mut libc::c_void> {
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: as the caller promises.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    (map != libc::MAP_FAILED).then_some(map)
}
