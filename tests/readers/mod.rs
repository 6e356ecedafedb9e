//! The readers (`stat`, `top`, `trim`, `doctor`; the exporter's cases are
//! in `exporter::hostile`) against what another user or tenant can do from
//! outside: squat the default directory, truncate a page or group file
//! while it is read, plant thousands of live pages, put escape sequences
//! in anything a page holds. Forged pages are real pages' bytes with
//! fields changed, kept "live" by this test process holding their lock.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::util::*;
use serde_json::Value;

/// The page file the shim writes: the page (17408 bytes) and its tail.
pub const FILE_SIZE: usize = 17664;
const HEADER: usize = 1024;
const SLOT: usize = 256;

/// The bytes of a real page (a client's, allocating 1 MiB on GPU 0).
pub fn template() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = fresh_dir("readers-template");
        let h = held_in(
            &dir,
            &[("VRAMCAP_LIMIT", "1GiB")],
            &["init", "alloc", "1M", "wait"],
        );
        let bytes = std::fs::read(dir.join(format!("{}.page", h.pid()))).unwrap();
        h.finish();
        assert_eq!(bytes.len(), FILE_SIZE);
        bytes
    })
}

/// What a forged page claims.
pub struct Forge<'a> {
    pub pid: u32,
    /// GPUs it claims to use (each holding 1 MiB).
    pub devices: usize,
    pub command: &'a [u8],
    pub group: &'a [u8],
    pub pod: &'a [u8],
    pub namespace: &'a [u8],
}

impl Forge<'_> {
    pub fn pid(pid: u32) -> Forge<'static> {
        Forge {
            pid,
            devices: 1,
            command: b"forged",
            group: b"",
            pod: b"",
            namespace: b"",
        }
    }

    /// A page of `pid` on one GPU with [`HOSTILE_COMMAND`] for its command
    /// and these group, pod and namespace.
    pub fn hostile<'a>(pid: u32, group: &'a [u8], pod: &'a [u8], namespace: &'a [u8]) -> Forge<'a> {
        Forge {
            pid,
            devices: 1,
            command: HOSTILE_COMMAND,
            group,
            pod,
            namespace,
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut b = template().to_vec();
        b[28..32].copy_from_slice(&self.pid.to_ne_bytes());
        let put = |b: &mut Vec<u8>, at: usize, len: usize, text: &[u8]| {
            b[at..at + len].fill(0);
            b[at..at + text.len()].copy_from_slice(text);
        };
        put(&mut b, 136, 64, self.group);
        put(&mut b, 200, 512, self.command);
        put(&mut b, 712, 96, self.pod);
        put(&mut b, 808, 64, self.namespace);
        let slot0: Vec<u8> = b[HEADER..HEADER + SLOT].to_vec();
        for i in 0..64 {
            let at = HEADER + i * SLOT;
            if i < self.devices {
                b[at..at + SLOT].copy_from_slice(&slot0);
            } else {
                b[at..at + SLOT].fill(0);
            }
        }
        b
    }
}

/// A forged page in a directory, live while this value lives (the test
/// process holds the lock on its first byte).
pub struct Forged {
    pub file: File,
    pub bytes: Vec<u8>,
}

/// `n` live pages forged in `dir` for PIDs from `first_pid` on, each
/// claiming all 64 GPUs (the most a page holds).
pub fn forge_full_pages(dir: &Path, first_pid: u32, n: u32) -> Vec<Forged> {
    (0..n)
        .map(|i| {
            let mut f = Forge::pid(first_pid + i);
            f.devices = 64;
            forge(dir, &f)
        })
        .collect()
}

pub fn forge(dir: &Path, f: &Forge) -> Forged {
    let path = dir.join(format!("{}.page", f.pid));
    let bytes = f.bytes();
    std::fs::write(&path, &bytes).unwrap();
    let file = File::options().read(true).write(true).open(&path).unwrap();
    lock(&file, 0);
    Forged { file, bytes }
}

/// Takes an open-file-description lock on one byte at `at`, as the shim
/// does for liveness.
pub fn lock(file: &File, at: i64) {
    // SAFETY: zeroed flock is a valid argument.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = at;
    fl.l_len = 1;
    // SAFETY: an open descriptor and a valid flock.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    assert_eq!(rc, 0, "lock: {}", std::io::Error::last_os_error());
}

/// More than `least` truncations happened while the reads ran: they
/// overlapped.
fn assert_overlapped(rounds: u64, least: u64) {
    assert!(
        rounds > least,
        "the truncations overlapped the reads: {rounds}"
    );
}

/// Truncates and restores `file` (to `bytes`) over and over, in several
/// steps (empty, one 4 KiB page, the whole length of zeroes, the bytes),
/// until dropped; returns how many rounds it made.
pub struct Truncator {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Truncator {
    pub fn start(file: &File, bytes: &[u8]) -> Truncator {
        let file = file.try_clone().unwrap();
        let bytes = bytes.to_vec();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !s.load(Ordering::Relaxed) {
                file.set_len(0).unwrap();
                file.set_len(4096).unwrap();
                file.set_len(bytes.len() as u64).unwrap();
                file.write_all_at(&bytes, 0).unwrap();
                rounds += 1;
            }
            rounds
        });
        Truncator {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(|t| t.join().unwrap()).unwrap_or(0)
    }
}

impl Drop for Truncator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn cli(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).args(args);
    cmd
}

/// Asserts a reader ended by itself with status 0, not by a signal.
fn exited_0(ran: &Ran) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        (ran.out.status.signal(), ran.code()),
        (None, Some(0)),
        "{}",
        ran.stderr()
    );
}

// ---- Truncation: readers copy pages and guard the mappings they keep ----

/// `stat` reads a page (its own uid's) that is truncated and restored
/// without pause: every refresh either shows it with its exact bytes or
/// skips it as truncated, and stat is never killed (it used to map the
/// page and die of SIGBUS).
#[test]
fn a_page_truncated_while_stat_reads_it_never_kills_stat() {
    let dir = scratch_dir();
    let page = forge(&dir, &Forge::pid(910_001));
    let t = Truncator::start(&page.file, &page.bytes);
    let ran = run(cli(
        &dir,
        &["stat", "--json", "--loop", "0.0005", "--count", "400"],
    ));
    let rounds = t.finish();
    exited_0(&ran);
    let docs = ran.ok_lines();
    assert_eq!(docs.len(), 400);
    let mut shown = 0;
    for d in &docs {
        let j: Value = serde_json::from_str(d).unwrap();
        for p in j["processes"].as_array().unwrap() {
            shown += 1;
            assert_eq!(p["pid"], 910_001, "{j}");
            let devs = p["devices"].as_array().unwrap();
            // A read between the restore and the rewrite may see the header
            // with its slots still zero; never another value.
            assert!(devs.len() <= 1, "{j}");
            if let Some(d) = devs.first() {
                assert_eq!(d["used_bytes"], 1u64 << 20, "{j}");
            }
        }
    }
    eprintln!("{rounds} truncations; the page was shown in {shown} of 400 refreshes");
    assert_overlapped(rounds, 100);
}

/// The reader's own group file is mapped (to return dead members'
/// bytes): truncated under that mapping, stat says so and lives on.
#[test]
fn a_group_file_truncated_while_stat_reclaims_it_never_kills_stat() {
    let src = scratch_dir();
    let h = held_in(
        &src,
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_GROUP", "g")],
        &["init", "alloc", "1M", "wait"],
    );
    let bytes = std::fs::read(src.join("group-g.grp")).unwrap();
    h.finish();
    // A copy: no member holds its locks, so every reader reclaims its
    // members' bytes, writing through the mapping.
    let dir = scratch_dir_named("group");
    let path = dir.join("group-g.grp");
    std::fs::write(&path, &bytes).unwrap();
    let file = File::options().read(true).write(true).open(&path).unwrap();
    let t = Truncator::start(&file, &bytes);
    let ran = run(cli(
        &dir,
        &["stat", "--json", "--loop", "0.0005", "--count", "300"],
    ));
    let rounds = t.finish();
    exited_0(&ran);
    assert_eq!(ran.ok_lines().len(), 300);
    eprintln!("{rounds} truncations of the group file");
    assert_overlapped(rounds, 50);
}

/// `trim` keeps the page of the process it asks mapped while it waits for
/// the answer; a truncation meanwhile is reported, not a SIGBUS.
#[test]
fn trim_says_so_when_the_page_is_truncated_while_it_waits() {
    let dir = scratch_dir();
    let mut bytes = Forge::pid(910_002).bytes();
    // Something cached on GPU 0 (slot word 4), so trim asks and waits.
    bytes[HEADER + 32..HEADER + 40].copy_from_slice(&(1u64 << 20).to_ne_bytes());
    let path = dir.join("910002.page");
    std::fs::write(&path, &bytes).unwrap();
    let file = File::options().read(true).write(true).open(&path).unwrap();
    lock(&file, 0);
    let mut cmd = cli(&dir, &["trim", "910002", "--timeout", "30"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // Wait until the request is in the page (trim_requests, offset 56),
    // then truncate it under trim's mapping.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut w = [0u8; 8];
        file.read_exact_at(&mut w, 56).unwrap();
        if u64::from_ne_bytes(w) == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "trim never asked");
        std::thread::yield_now();
    }
    file.set_len(0).unwrap();
    let out = child.wait_with_output().unwrap();
    let ran = Ran {
        what: "vramcap trim 910002".into(),
        out,
    };
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        "vramcap: 910002: its page was truncated while trim waited for an answer (by its owner or root); nothing more can be asked of it\n"
    );
}

/// A forged page whose trim counters stand at `u64::MAX`, and no process
/// behind it to answer: `trim` asks request number 0 and waits for its
/// own answer, then says none came (it used to panic on the overflow).
#[test]
fn trim_asks_across_the_counters_wrap() {
    let dir = crate::util::scratch_dir();
    let mut bytes = Forge::pid(910_003).bytes();
    // Something cached on GPU 0 (slot word 4); trim_requests (56) and
    // trim_acks (64) at u64::MAX.
    bytes[HEADER + 32..HEADER + 40].copy_from_slice(&(1u64 << 20).to_ne_bytes());
    bytes[56..64].copy_from_slice(&u64::MAX.to_ne_bytes());
    bytes[64..72].copy_from_slice(&u64::MAX.to_ne_bytes());
    let path = dir.join("910003.page");
    std::fs::write(&path, &bytes).unwrap();
    let file = File::options().read(true).write(true).open(&path).unwrap();
    lock(&file, 0);
    let ran = run(cli(&dir, &["trim", "910003", "--timeout", "0.2"]));
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        "vramcap: 910003 did not answer within 0.2s (its cache thread is not running; it still caches 1.00 MiB)\n"
    );
    let mut w = [0u8; 8];
    file.read_exact_at(&mut w, 56).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 0, "the request went in as number 0");
}

// ---- Bounds ----

/// The peak resident set (VmHWM) of a running process.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kib << 10
}

/// Raises this process's open-file limit to hold `n` more descriptors.
pub fn room_for_files(n: u64) {
    // SAFETY: zeroed rlimit is a valid out-buffer.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    if r.rlim_cur < n + 512 {
        r.rlim_cur = r.rlim_max.min(n + 4096);
        // SAFETY: a valid rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
    }
    assert!(
        r.rlim_cur >= n + 512,
        "open-file limit too low: {}",
        r.rlim_cur
    );
}

/// 2000 forged live pages, each claiming all 64 GPUs: `stat --json` shows
/// the first 4096 process-GPU rows (64 pages), says in one line how many
/// it left out, and stays small (it used to take 680 MB).
#[test]
fn two_thousand_forged_pages_cost_stat_a_bounded_amount() {
    const N: u32 = 2000;
    room_for_files(N as u64);
    let dir = scratch_dir();
    let forged = forge_full_pages(&dir, 920_000, N);
    // The first refresh is printed, then stat sleeps: its peak memory is
    // read then, while it still runs.
    let start = std::time::Instant::now();
    let mut cmd = cli(&dir, &["stat", "--json", "--loop", "60"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let took = start.elapsed();
    let maxrss = peak_rss(child.id());
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let ran = Ran {
        what: "vramcap stat --json --loop 60".into(),
        out: std::process::Output {
            stdout: first.into_bytes(),
            ..out
        },
    };
    let j: Value = serde_json::from_str(&ran.stdout()).unwrap();
    let procs = j["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 64);
    let rows: usize = procs
        .iter()
        .map(|p| p["devices"].as_array().unwrap().len())
        .sum();
    assert_eq!(rows, 4096);
    assert_eq!(
        j["skipped"],
        serde_json::json!([{
            "file": dir.display().to_string(),
            "reason": "1936 pages not shown: past this directory's share of the 4096 process-GPU rows a scan shows",
        }])
    );
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: skipping {}: 1936 pages not shown: past this directory's share of the 4096 process-GPU rows a scan shows\n",
            dir.display()
        )
    );
    eprintln!(
        "stat --json over {N} forged pages: {took:?} to the first document, peak RSS {} MiB",
        maxrss >> 20
    );
    assert!(maxrss < 64 << 20, "max RSS {maxrss}");
    drop(forged);
}

// ---- Text from pages ----

/// What a hostile page can hold in its text fields: a window-title change,
/// a screen clear, a bell, a bidirectional override, bytes that are not
/// UTF-8; and a file name with an escape sequence.
pub const HOSTILE_COMMAND: &[u8] =
    b"python \x1b]0;owned\x07 \x1b[2J\x1b[H\xff\xfe evil\xe2\x80\xaeyx";
pub const SHOWN_COMMAND: &str = "python \\x1b]0;owned\\x07 \\x1b[2J\\x1b[H\\xff\\xfe evil\\u202eyx";

/// Every string from a page or a file name is escaped in the table, in
/// JSON and on stderr: no control character reaches the terminal.
#[test]
fn escape_sequences_in_pages_and_file_names_are_shown_escaped() {
    let dir = scratch_dir();
    let page = forge(
        &dir,
        &Forge::hostile(930_001, b"g\x1b[31m", b"pod\n\"x\"", b"ns\xc2\x9b"),
    );
    std::fs::write(dir.join("\x1b]0;owned\x07.page"), b"junk, not a page").unwrap();
    let no_controls = |what: &str, bytes: &[u8]| {
        let bad: Vec<u8> = bytes
            .iter()
            .copied()
            .filter(|&b| b < 0x20 && b != b'\n' || b == 0x7f)
            .collect();
        assert!(
            bad.is_empty(),
            "{what} holds control bytes {bad:?}: {bytes:?}"
        );
    };

    let table = run(cli(&dir, &["stat"]));
    no_controls("stat's table", &table.out.stdout);
    no_controls("stat's warnings", &table.out.stderr);
    let lines = table.ok_lines();
    assert!(
        lines[1].ends_with(&format!("  {SHOWN_COMMAND}")),
        "{lines:?}"
    );
    assert_eq!(
        table.stderr(),
        format!(
            "vramcap: skipping {}/\\x1b]0;owned\\x07.page: not a vramcap page (wrong magic)\n",
            dir.display()
        )
    );

    let json = run(cli(&dir, &["stat", "--json"]));
    no_controls("stat --json", &json.out.stdout);
    let j: Value = serde_json::from_str(&json.ok_lines().join("")).unwrap();
    let p = &j["processes"][0];
    assert_eq!(p["command"], SHOWN_COMMAND);
    assert_eq!(p["group"], "g\\x1b[31m");
    assert_eq!(p["pod"], "pod\\x0a\"x\"");
    assert_eq!(p["namespace"], "ns\\u009b");
    assert_eq!(
        j["skipped"][0]["file"],
        format!("{}/\\x1b]0;owned\\x07.page", dir.display())
    );

    // `top` without a terminal prints the same table.
    let top = run(cli(&dir, &["top", "--count", "1", "--interval", "0.01"]));
    no_controls("top's table", &top.out.stdout);
    assert!(
        top.ok_lines()[2].ends_with(&format!("  {SHOWN_COMMAND}")),
        "{}",
        top.stdout()
    );
    drop(page);
}

// ---- The default directory: the user's own, never someone else's ----

mod dirs;
