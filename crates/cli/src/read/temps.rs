//! Temporary files of writers that died between making a page or group
//! file and publishing it (`.PID.NS.tmp`, `.group-NAME.PID.NS.tmp`; see
//! `vramcap_core::group::is_temp_name`). Each writer takes a lock on its
//! temporary file's first byte right after creating it and holds it until
//! the file is published or removed; one whose lock is free and that was
//! last modified more than [`TEMP_MIN_AGE_SECS`] ago (which covers the
//! moment between creation and lock) belongs to a writer that died, and is
//! removed, only if its name still leads to the file that was looked at.
//! The PID in the name is not used: it means nothing across PID namespaces,
//! the lock does.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use vramcap_core::group::{TEMP_MIN_AGE_SECS, is_temp_name};
use vramcap_core::liveness::ofd_locked;

use super::dir::Dir;

/// Removes the stale temporary files among `names`; returns their paths.
pub(super) fn remove_stale(dir: &Dir, names: &[OsString]) -> Vec<PathBuf> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut removed = Vec::new();
    for name in names.iter().filter(|n| is_temp_name(n.as_bytes())) {
        let Ok((file, info)) = dir.open_file(name, |_| false) else {
            continue;
        };
        let old = file
            .metadata()
            .is_ok_and(|m| now.saturating_sub(m.mtime()) >= TEMP_MIN_AGE_SECS as i64);
        if old && !ofd_locked(file.as_raw_fd(), 0, 1) && dir.remove_if_same(name, info.id) {
            removed.push(dir.path.join(name));
        }
    }
    removed
}
