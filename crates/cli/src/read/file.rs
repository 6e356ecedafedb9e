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
//! The copy itself is core's ([`vramcap_core::peers::stable_copy`]), which
//! the shim's parking policy reads peers' pages with too.

use std::os::unix::fs::FileExt;

pub(super) use vramcap_core::peers::{CopyError, stable_copy};

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
    use std::os::unix::fs::MetadataExt;
    let shown = vramcap_core::text::path(path);
    let file = vramcap_core::peers::open_no_follow(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOENT) {
            missing()
        } else {
            format!("cannot open {shown}: {e}")
        }
    })?;
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
