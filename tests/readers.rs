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

pub const PAGE_SIZE: usize = 17408;
const HEADER: usize = 1024;
const SLOT: usize = 256;

/// The bytes of a real page (a client's, allocating 1 MiB on GPU 0).
pub fn template() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = fresh_dir("readers-template");
        let h = held_in(
            &artefacts().client,
            &dir,
            &[("VRAMCAP_LIMIT", "1GiB")],
            &["init", "alloc", "1M", "wait"],
        );
        let bytes = std::fs::read(dir.join(format!("{}.page", h.pid()))).unwrap();
        h.finish();
        assert_eq!(bytes.len(), PAGE_SIZE);
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
    let dir = fresh_dir("readers-truncate-stat");
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
    assert!(
        rounds > 100,
        "the truncations overlapped the reads: {rounds}"
    );
}

/// The reader's own group file is mapped (to return dead members'
/// bytes): truncated under that mapping, stat says so and lives on.
#[test]
fn a_group_file_truncated_while_stat_reclaims_it_never_kills_stat() {
    let src = fresh_dir("readers-truncate-group-src");
    let h = held_in(
        &artefacts().client,
        &src,
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_GROUP", "g")],
        &["init", "alloc", "1M", "wait"],
    );
    let bytes = std::fs::read(src.join("group-g.grp")).unwrap();
    h.finish();
    // A copy: no member holds its locks, so every reader reclaims its
    // members' bytes, writing through the mapping.
    let dir = fresh_dir("readers-truncate-group");
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
    assert!(
        rounds > 50,
        "the truncations overlapped the reads: {rounds}"
    );
}

/// `trim` keeps the page of the process it asks mapped while it waits for
/// the answer; a truncation meanwhile is reported, not a SIGBUS.
#[test]
fn trim_says_so_when_the_page_is_truncated_while_it_waits() {
    let dir = fresh_dir("readers-truncate-trim");
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
    let dir = fresh_dir("readers-bounded-stat");
    let forged: Vec<Forged> = (0..N)
        .map(|i| {
            let mut f = Forge::pid(920_000 + i);
            f.devices = 64;
            forge(&dir, &f)
        })
        .collect();
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
    let dir = fresh_dir("readers-escapes");
    let page = forge(
        &dir,
        &Forge {
            pid: 930_001,
            devices: 1,
            command: HOSTILE_COMMAND,
            group: b"g\x1b[31m",
            pod: b"pod\n\"x\"",
            namespace: b"ns\xc2\x9b",
        },
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
        top.ok_lines()[1].ends_with(&format!("  {SHOWN_COMMAND}")),
        "{}",
        top.stdout()
    );
    drop(page);
}

// ---- The default directory: the user's own, never someone else's ----

/// Runs `program` as `uid` (this test runs as root), without
/// `VRAMCAP_STATS_DIR`, with `XDG_RUNTIME_DIR` as given.
fn as_user(program: &Path, uid: u32, xdg: Option<&Path>, preload: bool) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = if preload {
        shimmed(program)
    } else {
        bare(program)
    };
    cmd.env_remove("VRAMCAP_STATS_DIR")
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir("/")
        .uid(uid)
        .gid(uid);
    if let Some(x) = xdg {
        cmd.env("XDG_RUNTIME_DIR", x);
    }
    cmd
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `/dev/shm/vramcap-<victim>`, made by `squatter` as a directory (mode
/// 755) or as a symbolic link to a directory of the squatter's; removed
/// when dropped.
struct Squat {
    path: PathBuf,
    target: Option<PathBuf>,
}

impl Squat {
    fn new(victim: u32, squatter: u32, link: bool) -> Squat {
        use std::os::unix::fs::{PermissionsExt, lchown};
        let path = PathBuf::from(format!("/dev/shm/vramcap-{victim}"));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(&path);
        let mut target = None;
        if link {
            let t = PathBuf::from(format!("/dev/shm/vramcap-squat-{squatter}"));
            let _ = std::fs::remove_dir_all(&t);
            std::fs::create_dir(&t).unwrap();
            std::os::unix::fs::chown(&t, Some(squatter), Some(squatter)).unwrap();
            std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::os::unix::fs::symlink(&t, &path).unwrap();
            lchown(&path, Some(squatter), Some(squatter)).unwrap();
            target = Some(t);
        } else {
            std::fs::create_dir(&path).unwrap();
            std::os::unix::fs::chown(&path, Some(squatter), Some(squatter)).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Squat { path, target }
    }
}

impl Drop for Squat {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(t) = &self.target {
            let _ = std::fs::remove_dir_all(t);
        }
    }
}

/// A runtime directory of `uid`'s own (mode 700), as logind makes it.
fn runtime_dir(name: &str, uid: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = fresh_dir(name).join("run-user");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Another user made `/dev/shm/vramcap-<uid>` first (a directory, then a
/// symbolic link). With a runtime directory of its own, the victim's pages
/// and group go there and `stat` finds them, saying in one line why the
/// squatted directory is not read; without one, the shim refuses the
/// squatted directory in one line saying whose it is and what to do, the
/// cap still holds, a group refuses its allocations rather than run
/// without its budget, and `doctor` fails naming the directory.
#[test]
fn a_squatted_default_directory_is_refused_and_the_runtime_directory_is_used() {
    if !is_root() {
        eprintln!("not root: this test needs other uids and did not run");
        return;
    }
    let a = artefacts();
    for (victim, squatter, link) in [(43_101u32, 43_102u32, false), (43_103, 43_104, true)] {
        let squat = Squat::new(victim, squatter, link);
        let shown = squat.path.display().to_string();
        let what = if link {
            "is a symbolic link".to_string()
        } else {
            format!("belongs to uid {squatter} (mode 755), not to you (uid {victim})")
        };
        let fix = if link {
            format!("remove it (rm {shown}; if it is not yours, its owner or root can)")
        } else {
            "someone else made it: have it removed (its owner or root can)".to_string()
        };
        let refusal = format!(
            "the statistics directory {shown} {what}; vramcap uses it only when it is yours with mode 700: {fix}, or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR"
        );

        // No runtime directory: the squatted one is refused, the cap holds.
        let mut cmd = as_user(&a.client, victim, None, true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .args(["procaddr", "init", "fill", "256M"]);
        let ran = run(cmd);
        ran.expect_lines(&[
            "init -> 0",
            "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        ]);
        let err = ran.stderr();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].starts_with("vramcap[")
                && lines[0].ends_with(&format!(
                    "]: {refusal}; counters are not published (the cap still holds)"
                )),
            "{err}"
        );
        assert!(
            lines[1].contains("]: cuMemAlloc: refused 268435456 bytes on device 0"),
            "{err}"
        );
        // A group cannot be joined there: its allocations are refused.
        let mut cmd = as_user(&a.client, victim, None, true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .env("VRAMCAP_GROUP", "g")
            .args(["procaddr", "init", "fill", "256M"]);
        let ran = run(cmd);
        assert_eq!(
            ran.ok_lines(),
            ["init -> 0", "fill 268435456 -> 0 allocs 0 bytes rc=2"]
        );
        assert!(ran.stderr().contains(&refusal), "{}", ran.stderr());
        // Nothing went into the squatter's directory.
        let planted = squat.target.clone().unwrap_or(squat.path.clone());
        assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 0);

        // doctor fails, naming the directory and the fix.
        let mut cmd = as_user(&a.cli, victim, None, false);
        cmd.arg("doctor");
        let ran = run(cmd);
        ran.expect_code(1);
        let out = ran.stdout();
        assert!(
            out.contains(&format!(
                "FAIL  statistics directory: {shown} {what}; nothing is published there and group members refuse their allocations (the cap still holds)\n      fix: {fix}, or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR\n"
            )),
            "{out}"
        );

        // With a runtime directory of its own: pages and the group go there.
        let rt = runtime_dir(&format!("readers-squat-{victim}"), victim);
        let mut cmd = as_user(&a.client, victim, Some(&rt), true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .env("VRAMCAP_GROUP", "g")
            .args(["procaddr", "init", "alloc", "64M", "wait"]);
        let mut h = Held::spawn(cmd);
        h.until("wait");
        let pages = rt.join("vramcap");
        let page = pages.join(format!("{}.page", h.pid()));
        assert!(page.is_file(), "no page in {}", pages.display());
        assert!(pages.join("group-g.grp").is_file());
        let mut cmd = as_user(&a.cli, victim, Some(&rt), false);
        cmd.args(["stat", "--json"]);
        let ran = run(cmd);
        let j: Value = serde_json::from_str(&ran.ok_lines().join("")).unwrap();
        assert_eq!(j["processes"][0]["pid"], h.pid(), "{j}");
        assert_eq!(j["processes"][0]["devices"][0]["used_bytes"], 64u64 << 20);
        assert_eq!(j["groups"][0]["name"], "g");
        assert_eq!(j["dir"], pages.display().to_string());
        assert_eq!(
            j["dirs"],
            serde_json::json!([pages.display().to_string(), shown])
        );
        let not_read = format!(
            "not read: it {what}; a default statistics directory is used only when it is yours with mode 700 (the shim writes nothing there either)"
        );
        assert_eq!(
            j["skipped"],
            serde_json::json!([{"file": shown, "reason": not_read}])
        );
        assert_eq!(
            ran.stderr(),
            format!("vramcap: skipping {shown}: {not_read}\n")
        );
        let (_, out) = h.finish();
        assert!(out.status.success());
        drop(squat);
    }
}

/// With nothing in the way, the runtime directory and `/dev/shm` both
/// work, each made private by the shim, and `stat` from a shell with a
/// runtime directory also finds what a program started without one (a
/// cron job) published in `/dev/shm`.
#[test]
fn readers_find_pages_in_every_default_directory() {
    if !is_root() {
        eprintln!("not root: this test needs another uid and did not run");
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let a = artefacts();
    let uid = 43_105u32;
    let shm = PathBuf::from(format!("/dev/shm/vramcap-{uid}"));
    let _ = std::fs::remove_dir_all(&shm);
    let rt = runtime_dir("readers-defaults", uid);
    let start = |xdg: Option<&Path>| {
        let mut cmd = as_user(&a.client, uid, xdg, true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .args(["procaddr", "init", "alloc", "16M", "wait"]);
        let mut h = Held::spawn(cmd);
        h.until("wait");
        h
    };
    let cron = start(None);
    let shell = start(Some(&rt));
    for d in [&shm, &rt.join("vramcap")] {
        let m = std::fs::symlink_metadata(d).unwrap();
        assert!(m.is_dir());
        assert_eq!((m.uid(), m.permissions().mode() & 0o777), (uid, 0o700));
    }
    let mut cmd = as_user(&a.cli, uid, Some(&rt), false);
    cmd.args(["stat", "--json"]);
    let ran = run(cmd);
    assert_eq!(ran.stderr(), "");
    let j: Value = serde_json::from_str(&ran.ok_lines().join("")).unwrap();
    let mut seen: Vec<(u64, String)> = j["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap(),
                p["dir"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut want = vec![
        (cron.pid() as u64, shm.display().to_string()),
        (shell.pid() as u64, rt.join("vramcap").display().to_string()),
    ];
    want.sort();
    assert_eq!(seen, want);
    let mut cmd = as_user(&a.cli, uid, Some(&rt), false);
    cmd.arg("doctor");
    let ran = run(cmd);
    let out = ran.stdout();
    assert!(
        out.contains(&format!(
            "ok    statistics directory: {} (yours, mode 700)\nok    statistics directory without XDG_RUNTIME_DIR: {} (yours, mode 700)\n",
            rt.join("vramcap").display(),
            shm.display()
        )),
        "{out}"
    );
    cron.finish();
    shell.finish();
    let _ = std::fs::remove_dir_all(&shm);
}
