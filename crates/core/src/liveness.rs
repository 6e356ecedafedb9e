//! Is a process, or the holder of a page or a group slot, still alive?
//!
//! PIDs mean nothing across PID namespaces, so liveness is an
//! open-file-description lock that the kernel drops when its holder dies;
//! PIDs and start times only label what a lock says.

/// Start time of a process in clock ticks after boot (field 22 of
/// /proc/PID/stat), or `None` when there is no such process.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split(' ').nth(19)?.parse().ok()
}

/// Whether some process holds a lock (open-file-description lock) on
/// `len` bytes at `start` of the open file `fd`. Such locks are released by
/// the kernel when their holder dies and are visible from any PID namespace,
/// which makes them the liveness test: PIDs from containers mean nothing
/// outside them.
pub fn ofd_locked(fd: libc::c_int, start: u64, len: u64) -> bool {
    // SAFETY: zeroed flock is a valid argument.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: fd is open; fl is a valid flock for F_OFD_GETLK.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    // If the question cannot be asked, assume the holder lives: never
    // reclaim or prune on doubt.
    rc != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
}

/// Takes an open-file-description write lock on `len` bytes at `start` of
/// `fd` without waiting; false when another holds it.
pub fn ofd_lock(fd: libc::c_int, start: u64, len: u64, lock: bool) -> bool {
    // SAFETY: zeroed flock is a valid argument.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: fd is open; fl is a valid flock for F_OFD_SETLK.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) == 0 }
}
