//! Parking's host pages (`VRAMCAP_PARK_MOVE=shim`, issue 43): where a
//! parked block's bytes wait. Anonymous memory with transparent huge
//! pages, made resident by several threads at once, then pinned and
//! device-mapped (`cuMemHostRegister`), so that the copy engines write it
//! directly. Measured on the H200 (session 17, `research/host_create.cu`,
//! 8 GiB): 0.041 s per GiB with 8 threads, against 0.23 for the driver's
//! host memory (`cuMemCreate` on the host, what tiered spill maps behind a
//! block), which no number of threads speeds up. A parked block has
//! nothing mapped at its address (nothing runs while a process is
//! parked), so its host memory need not be VMM memory.
//!
//! # Invariants
//! - [`Pages`] are mapped, pinned and charged to the host budget from
//!   [`make_all`] to [`free`]; nothing else unmaps them.
//! - A child after `fork` never inherits them (`MADV_DONTFORK`): pinned
//!   memory shared copy-on-write would be the parent's.
//! - Their device address is the driver's answer
//!   (`cuMemHostGetDevicePointer`), never assumed equal to the host's.
//! - Made on the background thread only (threads of its own touch the
//!   pages, and are joined before it goes on); allocation is allowed there.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::log_at;

/// One area of host pages for one block's bytes.
#[derive(Debug)]
pub struct Pages {
    /// Where it is mapped in the process.
    pub host: usize,
    /// Its device address.
    pub dev: u64,
    pub bytes: u64,
    /// The context it was registered in (pushed again to unregister).
    pub ctx: usize,
}

/// The granularity of transparent huge pages (x86_64, aarch64 with 4 KiB
/// base pages): areas start on it, so that every page can be huge.
const HUGE: usize = 2 << 20;
/// The base page: every one is touched (a huge page is faulted by its
/// first, the others then cost a store each).
const PAGE: usize = 4096;
/// At most this many threads make pages resident (the probe's best).
const THREADS: usize = 8;

static SAID_NO_HUGE: AtomicBool = AtomicBool::new(false);

/// Makes host pages for each of `sizes` (bytes, and the context to
/// register them in), resident and pinned: each one's pages, or the
/// driver's or the system's error (`CUDA_ERROR_OUT_OF_MEMORY` when the
/// mapping was refused). The touching and then the pinning run on up to
/// [`THREADS`] threads (the probe's figure is of both done in parallel).
pub fn make_all<D: Driver>(driver: &D, sizes: &[(u64, usize)]) -> Vec<Result<Pages, CUresult>> {
    let mapped: Vec<Option<usize>> = sizes.iter().map(|&(b, _)| map(b as usize)).collect();
    touch(
        &mapped
            .iter()
            .zip(sizes)
            .filter_map(|(m, &(b, _))| m.map(|a| (a, b as usize)))
            .collect::<Vec<_>>(),
    );
    let pin = |i: usize| -> Result<Pages, CUresult> {
        let (bytes, ctx) = sizes[i];
        let host = mapped[i].ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        match register(driver, host, bytes, ctx) {
            Ok(dev) => Ok(Pages {
                host,
                dev,
                bytes,
                ctx,
            }),
            Err(rc) => {
                unmap(host, bytes as usize);
                Err(rc)
            }
        }
    };
    let threads = thread_count(sizes.len());
    let mut out: Vec<Option<Result<Pages, CUresult>>> = (0..sizes.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let pin = &pin;
        let handles: Vec<_> = (1..threads)
            .map(|t| {
                std::thread::Builder::new()
                    .name("vramcap-pages".into())
                    .spawn_scoped(s, move || {
                        (t..sizes.len())
                            .step_by(threads)
                            .map(|i| (i, pin(i)))
                            .collect::<Vec<_>>()
                    })
            })
            .collect();
        for (i, r) in (0..sizes.len()).step_by(threads).map(|i| (i, pin(i))) {
            out[i] = Some(r);
        }
        for (t, h) in handles.into_iter().enumerate() {
            // A thread that could not start leaves its areas to this one;
            // one that panicked (a bug) leaves them mapped, unpinned and
            // refused.
            let done = match h {
                Ok(h) => h.join().unwrap_or_default(),
                Err(_) => (t + 1..sizes.len())
                    .step_by(threads)
                    .map(|i| (i, pin(i)))
                    .collect(),
            };
            for (i, r) in done {
                out[i] = Some(r);
            }
        }
    });
    out.into_iter()
        .map(|r| r.unwrap_or(Err(CUDA_ERROR_OUT_OF_MEMORY)))
        .collect()
}

/// How many threads work on `n` pieces: up to [`THREADS`], the machine's
/// cores, at least one.
fn thread_count(n: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |c| c.get())
        .clamp(1, THREADS)
        .min(n.max(1))
}

/// Unpins and unmaps `p` (its context current for the unpinning when it
/// still exists; the engine gives back a context's pages before it is
/// destroyed).
pub fn free<D: Driver>(driver: &D, p: Pages) {
    let pushed = driver.ctx_push_current(p.ctx) == CUDA_SUCCESS;
    let _ = driver.host_unregister(p.host);
    if pushed {
        let _ = driver.ctx_pop_current();
    }
    unmap(p.host, p.bytes as usize);
}

/// Memory the system can still make resident for pages, less a margin
/// ([`MARGIN`]): the least of `MemAvailable` and the room under this
/// process's cgroup's `memory.max` (cgroup v2); `None` when neither can
/// be read (no bound known).
pub fn system_room() -> Option<u64> {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_available(&m));
    least_room(available, cgroup_room())
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// The least of the known rooms, less [`MARGIN`].
fn least_room(available: Option<u64>, cgroup: Option<u64>) -> Option<u64> {
    let least = match (available, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    };
    least.map(|r| r.saturating_sub(MARGIN))
}

/// Left to the rest of the system when pages are made.
const MARGIN: u64 = 512 << 20;

/// `memory.max - memory.current` of this process's cgroup (v2), when it
/// has a limit.
fn cgroup_room() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    // The path is the kernel's; it names a directory under the mount.
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    cgroup_room_of(&read("memory.max")?, &read("memory.current")?)
}

/// The room under a cgroup's `memory.max` text (`max`: no limit) above its
/// `memory.current`.
fn cgroup_room_of(max: &str, current: &str) -> Option<u64> {
    let max = max.trim().parse::<u64>().ok()?;
    let current = current.trim().parse::<u64>().ok()?;
    Some(max.saturating_sub(current))
}

/// An anonymous private mapping of `bytes` starting on [`HUGE`], asked to
/// use huge pages and not to be inherited; `None` when the system refused.
fn map(bytes: usize) -> Option<usize> {
    let span = bytes.checked_add(HUGE)?;
    // SAFETY: a fresh anonymous mapping; no memory of anyone else's.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE);
    // SAFETY: the head and tail cut off lie inside the mapping just made.
    unsafe {
        if aligned > start {
            libc::munmap(raw, aligned - start);
        }
        let end = aligned + bytes;
        let tail = start + span - end;
        if tail > 0 {
            libc::munmap(end as *mut libc::c_void, tail);
        }
        let p = aligned as *mut libc::c_void;
        let _ = libc::madvise(p, bytes, libc::MADV_DONTFORK);
        // madvise succeeds even where the system never gives huge pages.
        let refused = libc::madvise(p, bytes, libc::MADV_HUGEPAGE) != 0;
        let never = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|m| m.contains("[never]"));
        if (refused || never) && !SAID_NO_HUGE.swap(true, Ordering::Relaxed) {
            log_at!(
                Info,
                "parking: no transparent huge pages here ({}); making host memory for a first park costs about 0.2 s per GiB more",
                if never {
                    "/sys/kernel/mm/transparent_hugepage/enabled is never".to_string()
                } else {
                    std::io::Error::last_os_error().to_string()
                }
            );
        }
    }
    Some(aligned)
}

fn unmap(host: usize, bytes: usize) {
    // SAFETY: `host` is a mapping of `bytes` made by `map` and not yet unmapped.
    unsafe {
        libc::munmap(host as *mut libc::c_void, bytes);
    }
}

/// Makes every page of `areas` (address, bytes) resident: one store per
/// base page, [`HUGE`] stripes dealt out to the threads in turn.
fn touch(areas: &[(usize, usize)]) {
    let stripes: Vec<(usize, usize)> = areas
        .iter()
        .flat_map(|&(a, b)| (0..b).step_by(HUGE).map(move |o| (a + o, HUGE.min(b - o))))
        .collect();
    let threads = thread_count(stripes.len());
    let work = |t: usize| {
        for &(a, len) in stripes.iter().skip(t).step_by(threads) {
            for o in (0..len).step_by(PAGE) {
                // SAFETY: inside a private mapping this thread alone writes
                // (stripes do not overlap); nothing reads it yet.
                unsafe { std::ptr::write_volatile((a + o) as *mut u8, 0) };
            }
        }
    };
    std::thread::scope(|s| {
        for t in 1..threads {
            // A thread that cannot start leaves its stripes to this one.
            if std::thread::Builder::new()
                .name("vramcap-pages".into())
                .spawn_scoped(s, move || work(t))
                .is_err()
            {
                work(t);
            }
        }
        work(0);
    });
}

/// Pins `bytes` at `host` with `ctx` current: its device address.
fn register<D: Driver>(driver: &D, host: usize, bytes: u64, ctx: usize) -> Result<u64, CUresult> {
    let rc = driver.ctx_push_current(ctx);
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let out = match driver.host_register(host, bytes) {
        CUDA_SUCCESS => match driver.mem_host_get_device_pointer(host) {
            Ok(d) => Ok(d),
            Err(rc) => {
                let _ = driver.host_unregister(host);
                Err(rc)
            }
        },
        rc => Err(rc),
    };
    let _ = driver.ctx_pop_current();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_is_the_least_known_less_the_margin() {
        let meminfo =
            "MemTotal:       131072000 kB\nMemFree:  1 kB\nMemAvailable:   100000000 kB\n";
        assert_eq!(mem_available(meminfo), Some(100_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
        assert_eq!(cgroup_room_of("max\n", "5\n"), None);
        assert_eq!(
            cgroup_room_of("8589934592\n", "1073741824\n"),
            Some(7 << 30)
        );
        assert_eq!(cgroup_room_of("100\n", "200\n"), Some(0));
        assert_eq!(
            least_room(Some(10 << 30), Some(7 << 30)),
            Some((7 << 30) - MARGIN)
        );
        assert_eq!(least_room(None, Some(100)), Some(0));
        assert_eq!(least_room(None, None), None);
    }
}
