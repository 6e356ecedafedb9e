//! The CLI's parking requests: `vramcap run --park` checks its value, and
//! `vramcap park`/`resume`/`limit` against pages that do not answer (issue
//! 42, items 8 and 9): forged pages (`readers::forge`, kept live by this
//! test holding their lock, with parking switched on in their header) and
//! processes that cannot answer (stopped, or parked for a `limit`). A dead
//! process's page is not asked, targets are waited for together, a request
//! that timed out is withdrawn, and a park undone at once says so.

use std::path::Path;

use crate::park_util::*;
use crate::util::*;

/// `vramcap run --park` checks the value as the shim will.
#[test]
fn run_park_takes_manual_or_idle_and_refuses_the_rest_in_one_line() {
    let mut cmd = bare(&artefacts().cli);
    cmd.args(["run", "--park", "idle", "--", "true"]);
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        "vramcap: VRAMCAP_PARK=\"idle\" is not valid: expected manual (parked only by vramcap park) or idle:DURATION (also parked when idle that long and a group member needs room), e.g. VRAMCAP_PARK=idle:10m\n"
    );
}

/// Words of a page's header (`vramcap_core::page::Header`).
const PARK_STATE_AT: u64 = 96;
const PARK_REQUESTS_AT: u64 = 104;
const PARK_ACKS_AT: u64 = 112;
const PARK_ASK_AT: u64 = 120;
const PARK_OUTCOME_AT: u64 = 128;
const PARK_MODE_AT: u64 = 936;
const PARKED_AT: u64 = 960;
const LIMIT_REQUESTS_AT: u64 = 80;
const LIMIT_ACKS_AT: u64 = 88;

fn word(file: &std::fs::File, at: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, at).unwrap();
    u64::from_ne_bytes(b)
}

fn put_word(file: &std::fs::File, at: u64, v: u64) {
    use std::os::unix::fs::FileExt;
    file.write_all_at(&v.to_ne_bytes(), at).unwrap();
}

/// A live forged page of `pid` (1 MiB held on GPU 0) started with
/// `VRAMCAP_PARK=manual`, that nobody answers.
fn forge_parkable(dir: &Path, pid: u32) -> crate::readers::Forged {
    let f = crate::readers::forge(dir, &crate::readers::Forge::pid(pid));
    put_word(&f.file, PARK_MODE_AT, u64::MAX);
    f
}

fn page_file(dir: &Path, pid: u32) -> std::fs::File {
    std::fs::File::open(dir.join(format!("{pid}.page"))).unwrap()
}

/// Polls `done` until it holds, failing after 20 s.
fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: signals a child of this test.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// The page of a process that ended (its lock gone): park and resume say
/// so at once, exit 1, and post nothing. They used to wait 10 s and more
/// (1 s per GiB the page claimed) for an answer that could not come.
#[test]
fn a_dead_processs_page_is_not_asked() {
    let dir = scratch_dir();
    drop(forge_parkable(&dir, 980_001));
    let start = std::time::Instant::now();
    for command in ["park", "resume"] {
        let ran = cli(&dir, &[command, "--pid", "980001"]);
        ran.expect_code(1);
        assert_eq!(ran.stdout(), "");
        assert_eq!(
            ran.stderr(),
            "vramcap: 980001 is not running (its page is left from a process that ended); nothing was asked\n"
        );
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let f = page_file(&dir, 980_001);
    assert_eq!(
        (word(&f, PARK_REQUESTS_AT), word(&f, PARK_ASK_AT)),
        (0, 0),
        "nothing was posted"
    );
}

/// Three live pages that never answer, parked with `--all --timeout 1`:
/// all are asked first and waited for together, so the command takes
/// about 1 s, not 3; each gets one line, and each request is withdrawn
/// (its ask put back to 0, its counter raised once), so nothing happens
/// should the process answer later. `--timeout` bounds the wait whatever
/// a page claims to hold.
#[test]
fn targets_that_never_answer_are_waited_for_together_and_withdrawn() {
    let dir = scratch_dir();
    let forged: Vec<_> = (0..3).map(|i| forge_parkable(&dir, 980_010 + i)).collect();
    let start = std::time::Instant::now();
    let ran = cli(&dir, &["park", "--all", "--timeout", "1"]);
    let took = start.elapsed();
    ran.expect_code(1);
    assert_eq!(ran.stdout(), "");
    let want: String = (0..3)
        .map(|i| {
            format!(
                "vramcap: {} did not answer within 1.0s (it is stopped, or its background thread is not running); the request is withdrawn: nothing changes when it runs again\n",
                980_010 + i
            )
        })
        .collect();
    assert_eq!(ran.stderr(), want);
    assert!(
        took >= std::time::Duration::from_secs(1) && took < std::time::Duration::from_millis(2500),
        "{took:?}"
    );
    for f in &forged {
        assert_eq!(word(&f.file, PARK_ASK_AT), 0, "withdrawn");
        assert_eq!(word(&f.file, PARK_REQUESTS_AT), 1, "asked once");
    }
    for bad in ["0", "soon", "1x"] {
        let ran = cli(&dir, &["park", "--all", "--timeout", bad]);
        ran.expect_code(2);
        assert!(
            ran.stderr().contains(&format!(
                "\"{bad}\" is not a duration: expected seconds, greater than 0 (e.g. --timeout 2 or --timeout 0.5)"
            )),
            "{}",
            ran.stderr()
        );
    }
}

/// A stopped process is asked to park and does not answer: the request is
/// withdrawn, and once the process runs again its background thread takes
/// the withdrawn request (acknowledges it) and does not park. It used to
/// park then, long after `vramcap park` had said it failed.
#[test]
fn a_park_that_timed_out_does_not_happen_after_sigcont() {
    let dir = scratch_dir();
    let h = holding_a_mib(&dir);
    let pid = h.pid();
    signal(pid, libc::SIGSTOP);
    let ran = cli(
        &dir,
        &["park", "--pid", &pid.to_string(), "--timeout", "0.5"],
    );
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: {pid} did not answer within 0.5s (it is stopped, or its background thread is not running); the request is withdrawn: nothing changes when it runs again\n"
        )
    );
    signal(pid, libc::SIGCONT);
    let f = page_file(&dir, pid);
    poll_until("the withdrawn request is acknowledged", || {
        word(&f, PARK_ACKS_AT) == word(&f, PARK_REQUESTS_AT)
    });
    assert_eq!(word(&f, PARK_STATE_AT), 0, "still running");
    assert_eq!(stat_device0(&dir, pid)["used_bytes"], 1 << 20);
    assert_eq!(stat_device0(&dir, pid)["parked_bytes"], 0);
    let (_, out) = h.finish();
    assert!(out.status.success(), "{out:?}");
}

/// A parked process does not apply a `limit` (its background thread does
/// no work while parked): the change is withdrawn when `limit` gives up,
/// so the resumed process keeps its cap. It used to take the new cap at
/// resume, and be over it, after `limit` had said it failed.
#[test]
fn a_limit_that_timed_out_on_a_parked_process_is_not_applied_at_resume() {
    let dir = scratch_dir();
    let h = holding_a_mib(&dir);
    let pid = h.pid();
    let p = pid.to_string();
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 1.00 MiB moved to host memory and released"
    )]);
    let ran = cli(&dir, &["limit", "--pid", &p, "--timeout", "0.5", "512KiB"]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: {pid} did not take the change within 0.5s (it is stopped or parked, or its background thread is not running); the change is withdrawn: its cap stays as it was\n"
        )
    );
    cli(&dir, &["resume", "--pid", &p]).expect_lines(&[&format!("{pid}: running, holds 1.00 MiB")]);
    let f = page_file(&dir, pid);
    poll_until("the withdrawn change is acknowledged", || {
        word(&f, LIMIT_ACKS_AT) == word(&f, LIMIT_REQUESTS_AT)
    });
    assert_eq!(stat_device0(&dir, pid)["limit_bytes"], 4 * GIB);
    let (_, out) = h.finish();
    assert!(out.status.success(), "{out:?}");
}

/// A park answered Ok after the process was already running again (a
/// CUDA call of its own resumed it before `park` read the answer): the
/// line says so and what it holds, not "0 B moved". A thread of this test
/// answers for the forged page as the shim would.
#[test]
fn a_park_undone_at_once_by_the_process_says_so() {
    let dir = scratch_dir();
    let forged = forge_parkable(&dir, 980_020);
    let file = forged.file.try_clone().unwrap();
    let answerer = std::thread::spawn(move || {
        poll_until("a park request", || {
            word(&file, PARK_REQUESTS_AT) != word(&file, PARK_ACKS_AT)
        });
        // Parked and resumed already: running, nothing parked.
        put_word(&file, PARK_STATE_AT, 0);
        put_word(&file, PARKED_AT, 0);
        put_word(&file, PARK_OUTCOME_AT, 0);
        put_word(&file, PARK_ACKS_AT, word(&file, PARK_REQUESTS_AT));
    });
    park(&dir, 980_020).expect_lines(&[
        "980020: parked, then resumed at once by a CUDA call of its own; holds 1.00 MiB",
    ]);
    answerer.join().unwrap();
    drop(forged);
}

/// A process with parking on, no cache and a 4 GiB cap, holding 1 MiB at
/// its first `wait`, its page in `dir`.
fn holding_a_mib(dir: &Path) -> Held {
    held_in(
        dir,
        &[
            MANUAL,
            ("VRAMCAP_PARK_MOVE", "checkpoint"),
            NO_CACHE,
            ("VRAMCAP_LIMIT", "4GiB"),
        ],
        &["init", "alloc", "1M", "wait"],
    )
}
