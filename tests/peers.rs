//! Parking's policy against pages planted in the statistics directory
//! (issue 42, item 2): a capped process reads other processes' pages only
//! with parking on, only its own user's files that no one else can write,
//! never through a link, waits for an answer no longer than its own bound
//! and asks a member that says "parked" but makes no room a bounded number
//! of times.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use vramcap_core::page::{PAGE_SIZE, Page, STATE_READY};
use vramcap_core::park::{Outcome, ParkMode};

use crate::util::*;

/// A live process for a forged page to name (killed when dropped).
struct Alive(std::process::Child);

impl Alive {
    fn new() -> Alive {
        Alive(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("start sleep"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A page as a forger writes it for the live process `pid` (so the
/// liveness check passes), in `group`, started with `VRAMCAP_PARK=idle:1ms`
/// and idle since ever, saying it holds `held` bytes on device 0; the
/// word inside says uid `uid`.
fn forged(pid: u32, group: &str, held: u64, uid: u32) -> Vec<u8> {
    // SAFETY: all-zero bytes are a valid Page (integers and atomics only).
    let mut page: Box<Page> = unsafe { Box::new_zeroed().assume_init() };
    let start = vramcap_core::liveness::start_time(pid).expect("a live process");
    page.header.fill(pid, uid, start, 1, "forged", group);
    page.header.park_mode = ParkMode::Idle(std::time::Duration::from_millis(1)).word();
    let _ = page.slots[0].budget.try_reserve(held, u64::MAX);
    page.header.state.store(STATE_READY, Ordering::Relaxed);
    // SAFETY: a Page is PAGE_SIZE bytes of plain data.
    unsafe { std::slice::from_raw_parts((&*page as *const Page).cast::<u8>(), PAGE_SIZE) }.to_vec()
}

/// Writes `bytes` as `dir/NAME.page` with `mode` (and `owner`, as root).
fn plant(dir: &Path, name: u32, bytes: &[u8], mode: u32, owner: Option<u32>) -> PathBuf {
    let p = dir.join(format!("{name}.page"));
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
    }
    p
}

/// In group `pp` under a 2 GiB budget of which another member (no
/// parking) holds 1.5 GiB, a member that asks for 1 GiB, with `env` added,
/// pages in `dir`: its output, once it was refused.
fn refused_in(dir: &Path, env: &[(&str, &str)]) -> Ran {
    let group = [
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", "pp"),
        ("STANDIN_TOTAL_MIB", "2048"),
    ];
    let b = held_in(dir, &group, &["init", "alloc", "1536M", "wait"]);
    let stats = [("VRAMCAP_STATS_DIR", dir.to_str().unwrap())];
    let ran = client(
        "procaddr",
        &[&group[..], &stats, env].concat(),
        &["init", "alloc", "1G"],
    );
    drop(b.finish());
    assert_eq!(
        ran.ok_lines(),
        ["init -> 0".to_string(), format!("alloc {GIB} -> 2")]
    );
    ran
}

/// Without `VRAMCAP_PARK` nothing of the policy runs: a same-user page
/// that would be a parkable member is not read, let alone asked.
#[test]
fn without_parking_no_page_is_read_or_asked() {
    let dir = scratch_dir();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let a = Alive::new();
    let bytes = forged(a.pid(), "pp", GIB, uid);
    let p = plant(&dir, a.pid(), &bytes, 0o600, None);
    refused_in(&dir, &[]);
    assert!(std::fs::read(&p).unwrap() == bytes, "the page was written");
}

/// A forged member playing the shim's answering side on its page, on a
/// thread: `answer(header)` runs in a loop until the member is dropped.
struct Member {
    map: *mut libc::c_void,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    fn play(page: &Path, answer: fn(&vramcap_core::page::Header)) -> Member {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(page)
            .unwrap();
        // SAFETY: a shared mapping of PAGE_SIZE bytes of a file that long.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let addr = map as usize;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // SAFETY: the mapping lives until this thread is joined.
                let page = unsafe { &*(addr as *const Page) };
                while !stop.load(Ordering::Relaxed) {
                    answer(&page.header);
                    std::thread::yield_now();
                }
            })
        };
        Member {
            map,
            stop,
            thread: Some(thread),
        }
    }

    /// The page's header now.
    fn header(&self) -> &vramcap_core::page::Header {
        // SAFETY: mapped until drop.
        unsafe { &(*(self.map as *const Page)).header }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: unmapping what `play` mapped, its thread joined.
        unsafe { libc::munmap(self.map, PAGE_SIZE) };
    }
}

/// The seconds the policy's log line says it waited for member `pid`.
fn waited_for(err: &str, pid: u32) -> f64 {
    let line = err
        .lines()
        .find(|l| l.contains("parking idle member"))
        .unwrap_or_else(|| panic!("no ask in {err}"));
    let (_, secs) = line
        .split_once(&format!("parking idle member {pid}: no answer in "))
        .unwrap_or_else(|| panic!("{line}"));
    secs.trim_end_matches('s').parse().expect("seconds")
}

/// A page's word cannot stretch the wait for its answer. A member that
/// never takes its request (stopped, or a page with no process behind
/// it) is waited for 2 s, then the ask is withdrawn; one that takes it and
/// never answers, saying it holds 2^62 bytes, is waited for 2 s and 1 s
/// per GiB of the GPU's own size (2 GiB here). Either way the allocation
/// is then refused, and the request was posted once.
#[test]
fn a_member_that_never_answers_is_waited_for_the_gpu_s_size_at_most() {
    let dir = scratch_dir();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let a = Alive::new();
    let p = plant(
        &dir,
        a.pid(),
        &forged(a.pid(), "pp", 1 << 62, uid),
        0o600,
        None,
    );
    let logged = [("VRAMCAP_PARK", "idle:1h"), ("VRAMCAP_LOG", "info")];
    let untaken = Member::play(&p, |_| {});
    let secs = waited_for(&refused_in(&dir, &logged).stderr(), a.pid());
    assert!((2.0..4.0).contains(&secs), "{secs}");
    assert_eq!(untaken.header().park_requests.load(Ordering::Acquire), 1);
    assert_eq!(untaken.header().park_ask.load(Ordering::Acquire), 0);
    drop(untaken);
    let taker = Member::play(&p, |h| {
        h.park_ask.swap(0, Ordering::AcqRel);
    });
    let secs = waited_for(&refused_in(&dir, &logged).stderr(), a.pid());
    assert!((4.0..30.0).contains(&secs), "{secs}");
    assert_eq!(taker.header().park_requests.load(Ordering::Acquire), 2);
}

/// A member that answers every request "parked" but makes no room is
/// asked exactly four times (the policy's rounds for one allocation),
/// then the allocation is refused, not retried for ever.
#[test]
fn a_member_that_says_parked_but_frees_nothing_is_asked_four_times() {
    let dir = scratch_dir();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let a = Alive::new();
    let p = plant(&dir, a.pid(), &forged(a.pid(), "pp", GIB, uid), 0o600, None);
    let member = Member::play(&p, |h| {
        let asked = h.park_requests.load(Ordering::Acquire);
        if h.park_acks.load(Ordering::Acquire) != asked {
            h.park_ask.swap(0, Ordering::AcqRel);
            h.park_outcome.store(Outcome::Ok.word(), Ordering::Release);
            h.park_acks.store(asked, Ordering::Release);
        }
    });
    refused_in(&dir, &[("VRAMCAP_PARK", "idle:1h")]);
    assert_eq!(member.header().park_requests.load(Ordering::Acquire), 4);
}

/// As root, with parking on: a page another user owns (whatever uid it
/// says inside), one that anyone may write, and a link (to a page root
/// owns) are neither asked nor written; 300 files another user planted do
/// not use up the scan's bound; the allocation is refused at once.
#[test]
#[ignore = "needs root"]
fn pages_another_user_could_write_are_never_asked() {
    needs_root();
    let dir = scratch_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let alive = [Alive::new(), Alive::new(), Alive::new()];
    let bytes: Vec<Vec<u8>> = alive
        .iter()
        .map(|a| forged(a.pid(), "pp", GIB, 0))
        .collect();
    let foreign = plant(&dir, alive[0].pid(), &bytes[0], 0o644, Some(65534));
    let open = plant(&dir, alive[1].pid(), &bytes[1], 0o666, None);
    let elsewhere = scratch_dir_named("target");
    let target = plant(&elsewhere, alive[2].pid(), &bytes[2], 0o600, None);
    std::os::unix::fs::symlink(&target, dir.join(format!("{}.page", alive[2].pid()))).unwrap();
    // Files another user plants do not use up the scan's bound.
    for i in 0..300 {
        let junk = dir.join(format!("{}.page", 3_000_000 + i));
        std::fs::write(&junk, b"not a page").unwrap();
        std::os::unix::fs::chown(&junk, Some(65534), Some(65534)).unwrap();
    }
    let ran = refused_in(
        &dir,
        &[("VRAMCAP_PARK", "idle:1h"), ("VRAMCAP_LOG", "info")],
    );
    assert!(
        !ran.stderr().contains("parking idle member")
            && !ran.stderr().contains("holds more files than one look"),
        "{}",
        ran.stderr()
    );
    for (p, b) in [&foreign, &open, &target].into_iter().zip(&bytes) {
        assert!(
            &std::fs::read(p).unwrap() == b,
            "{} was written",
            p.display()
        );
    }
}

/// The scan is bounded whatever is planted: 300 files named as pages
/// (more than the 256 one look reads) cost one look 256 reads, and the
/// shim says once that it left the rest out.
#[test]
fn one_look_reads_at_most_256_pages() {
    let dir = scratch_dir();
    for i in 0..300 {
        std::fs::write(dir.join(format!("{}.page", 3_000_000 + i)), b"not a page").unwrap();
    }
    let err = refused_in(&dir, &[("VRAMCAP_PARK", "idle:1h")]).stderr();
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("holds more files than one look"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].ends_with(&format!(
            "parking: {} holds more files than one look for an idle process reads (4096 entries, 256 pages); the rest are not considered",
            dir.display()
        )),
        "{}",
        said[0]
    );
}
