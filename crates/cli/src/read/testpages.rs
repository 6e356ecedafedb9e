//! Pages and group files made by the tests, as the shim would make them.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use vramcap_core::page::{FLAG_ACTIVE, PAGE_SIZE, Page, STATE_READY};

/// A fresh, empty directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramcap-read-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The bytes of a ready page of this user for `pid`, using `devices` GPUs.
pub fn page_bytes(pid: u32, devices: usize, command: &str) -> Vec<u8> {
    // SAFETY: all-zero bytes are a valid Page (integers and atomics only).
    let mut page: Box<Page> = unsafe { Box::new_zeroed().assume_init() };
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    page.header.fill(pid, uid, 1, 2, command, "");
    page.header.state.store(STATE_READY, Ordering::Relaxed);
    for s in page.slots.iter().take(devices) {
        s.flags.store(FLAG_ACTIVE, Ordering::Relaxed);
        let _ = s.budget.try_reserve(1 << 20, u64::MAX);
    }
    // SAFETY: a Page is PAGE_SIZE bytes of plain data.
    unsafe { std::slice::from_raw_parts((&*page as *const Page).cast::<u8>(), PAGE_SIZE) }.to_vec()
}

/// Writes a page for `pid` into `dir` and holds its liveness lock for as
/// long as the returned file is open.
pub fn write_page(dir: &Path, pid: u32, devices: usize, command: &str) -> File {
    let path = dir.join(format!("{pid}.page"));
    std::fs::write(&path, page_bytes(pid, devices, command)).unwrap();
    let f = File::options().read(true).write(true).open(&path).unwrap();
    assert!(vramcap_core::liveness::ofd_lock(f.as_raw_fd(), 0, 1, true));
    f
}
