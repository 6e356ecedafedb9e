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

/// Opens `path`, one of this user's own files that is to be changed in
/// place, read-write without following a link: the file, its length and
/// its first `head` bytes (fewer when it is shorter). `missing` is the
/// message when there is no such file; `what` names the kind of file in
/// the one when it is not a regular file of `uid`'s.
pub(super) fn open_own_for_write(
    path: &std::path::Path,
    users: super::Users,
    head: usize,
    what: &str,
    missing: impl FnOnce() -> String,
) -> Result<(std::fs::File, u64, Vec<u8>), String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let shown = vramcap_core::text::path(path);
    let c =
        std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| "bad path".to_string())?;
    // SAFETY: a valid path; no symbolic link is followed.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::ENOENT) {
            missing()
        } else {
            format!("cannot open {shown}: {e}")
        });
    }
    // SAFETY: fd is open and owned from here on.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot inspect {shown}: {e}"))?;
    if !meta.is_file() || !users.accepts_owner(meta.uid()) {
        return Err(format!("{shown} is not {what} of this user"));
    }
    let mut bytes = vec![0u8; head];
    let n = file
        .read_at(&mut bytes, 0)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    bytes.truncate(n);
    Ok((file, meta.len(), bytes))
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
pub(super) fn stable_copy<T: AnyBytes, E>(
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
