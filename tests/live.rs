//! Caps changed while the program runs (`crates/shim/src/engine/live.rs`):
//! from inside through the C ABI (`include/vramcap.h`) and from outside
//! with `vramcap limit`. Exact bytes against the stand-in; one fresh
//! process per case.

use std::path::Path;
use std::process::Command;

use crate::util::*;

pub(crate) const ONE_GIB: (&str, &str) = ("VRAMCAP_LIMIT", "1GiB");
const NO_CACHE: (&str, &str) = ("VRAMCAP_CACHE", "off");

/// The program lowers its cap below its start, gets exactly the room it
/// left, raises it back, may not go above where it started, and reads its
/// figures.
#[test]
fn the_program_lowers_and_raises_its_cap_through_the_c_abi() {
    client(
        "procaddr",
        &[ONE_GIB, NO_CACHE],
        &[
            "init", "alloc", "256M", "setlimit", "0", "512M", "info", "fill", "16M", "setlimit",
            "0", "1G", "fill", "16M", "setlimit", "0", "2G", "setlimit", "0", "max", "getlimit",
            "0", "abistats", "0", "setlimit", "-2", "256M", "setlimit", "7", "256M", "abiversion",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "alloc 256M -> 0 #0",
        "setlimit 0 512M -> 0",
        "info -> 0 free=256M total=512M",
        "fill 16M -> 16 allocs 256M bytes rc=2",
        "setlimit 0 1G -> 0",
        "fill 16M -> 32 allocs 512M bytes rc=2",
        // Never above the cap it started with.
        "setlimit 0 2G -> -1",
        "setlimit 0 max -> -1",
        "getlimit 0 -> 1G",
        &format!(
            "abistats 0 -> 0 size=96 limit={GIB} soft=18446744073709551615 held={GIB} allocations={GIB} pools=0 graphs=0 context=0 peak={GIB} cached=0 refusals=2"
        ),
        "setlimit -2 256M -> -22",
        "setlimit 7 256M -> -19",
        "abiversion -> 1",
        "standin dev=0 used=1G peak=1G",
        "standin dev=1 used=0 peak=0",
    ]);
}

/// Lowered below what it holds: cached blocks go back, new allocations
/// are refused until it frees, then granted; the cache gives back what it
/// keeps on request.
#[test]
fn lowered_below_what_it_holds_the_program_is_refused_until_it_frees() {
    client(
        "procaddr",
        &[ONE_GIB],
        &[
            "init", "alloc", "768M", "alloc", "64M", "free", "1", "setlimit", "0", "512M", "alloc",
            "1M", "free", "0", "alloc", "256M", "emptycache", "abistats", "0",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "alloc 768M -> 0 #0",
        "alloc 64M -> 0 #1",
        "free #1 -> 0",
        "setlimit 0 512M -> 0",
        "alloc 1M -> 2",
        "free #0 -> 0",
        "alloc 256M -> 0 #2",
        "emptycache -> 0",
        &format!(
            "abistats 0 -> 0 size=96 limit={} soft=18446744073709551615 held={} allocations={} pools=0 graphs=0 context=0 peak={} cached=0 refusals=1",
            512 * MIB,
            256 * MIB,
            256 * MIB,
            832 * MIB
        ),
    ]);
}

/// The lines of `vramcap stat --pid PID` (the table and its notes).
fn stat_lines(dir: &Path, pid: &str) -> Vec<String> {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir)
        .args(["stat", "--pid", pid]);
    run(cmd).ok_lines()
}

pub(crate) fn limit(dir: &Path, args: &[&str]) -> Ran {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).arg("limit").args(args);
    run(cmd)
}

/// From outside: lowered, the process gets exactly the room left and sees
/// the new total; raised again, the rest.
#[test]
fn vramcap_limit_lowers_and_raises_a_running_process() {
    let dir = scratch_dir();
    let mut h = capped_1gib(
        &dir,
        &[
            "init", "alloc", "256M", "wait", "info", "fill", "16M", "wait", "fill", "16M",
        ],
    );
    let pid = h.pid();
    let p = pid.to_string();
    limit(&dir, &["--pid", &p, "512MiB"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 1.00 GiB -> 512 MiB, holds 256 MiB"
    )]);
    h.resume();
    h.until("wait");
    limit(&dir, &["--pid", &p, "1GiB"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 512 MiB -> 1.00 GiB, holds 512 MiB"
    )]);
    let (lines, out) = h.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines[lines.len() - 5..],
        [
            format!("info -> 0 free={} total={}", 256 * MIB, 512 * MIB),
            format!("fill {} -> 16 allocs {} bytes rc=2", 16 * MIB, 256 * MIB),
            "wait".to_string(),
            "resumed".to_string(),
            format!("fill {} -> 32 allocs {} bytes rc=2", 16 * MIB, 512 * MIB),
        ]
    );
}

/// The client under a 1 GiB cap with the cache off, run up to its first
/// `wait`.
fn capped_1gib(dir: &Path, args: &[&str]) -> Held {
    held_in(dir, &[ONE_GIB, NO_CACHE], args)
}

/// A client under a 1 GiB cap (cache off) holding 256 MiB at its first
/// `wait`, with a second `wait` after an `info`.
fn holding_256m(dir: &Path) -> Held {
    capped_1gib(dir, &["init", "alloc", "256M", "wait", "info", "wait"])
}

/// A page whose request counters stand at `u64::MAX`: the next request is
/// number 0, and `vramcap limit` waits for the process to take it (it used
/// to take the acknowledgement of the one before, u64::MAX, for its own and
/// report "1.00 GiB -> 1.00 GiB", a change the process never took).
#[test]
fn vramcap_limit_waits_for_its_own_answer_across_the_counters_wrap() {
    use std::os::unix::fs::FileExt;
    let dir = crate::util::scratch_dir();
    let mut h = holding_256m(&dir);
    let pid = h.pid();
    let p = pid.to_string();
    let page = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(format!("{pid}.page")))
        .unwrap();
    // limit_requests (offset 80), then limit_acks (88): the shim answers
    // a difference by acknowledging what it saw, so the two end equal.
    page.write_all_at(&u64::MAX.to_ne_bytes(), 80).unwrap();
    page.write_all_at(&u64::MAX.to_ne_bytes(), 88).unwrap();
    limit(&dir, &["--pid", &p, "512MiB"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 1.00 GiB -> 512 MiB, holds 256 MiB"
    )]);
    h.resume();
    h.until("wait");
    assert_eq!(
        h.lines[h.lines.len() - 2],
        format!("info -> 0 free={} total={}", 256 * MIB, 512 * MIB)
    );
    h.finish();
}

/// Lowered below what it holds: `vramcap limit` says so, `--wait` gives up
/// with exit 1; `none` lifts the cap from outside; bad input gets its exit
/// code and one line.
#[test]
fn vramcap_limit_reports_over_cap_waits_lifts_and_refuses_bad_input() {
    let dir = scratch_dir();
    let mut h = capped_1gib(
        &dir,
        &["init", "alloc", "768M", "wait", "alloc", "1M", "wait"],
    );
    let pid = h.pid();
    let p = pid.to_string();
    let over = format!(
        "{pid} gpu 0: limit 1.00 GiB -> 512 MiB, holds 768 MiB, over the new cap by 256 MiB: new allocations are refused until it frees"
    );
    // -i names the GPUs to change, as nvidia-smi -i does: this process
    // uses only GPU 0.
    let ran = limit(&dir, &["--pid", &p, "-i", "1", "512MiB"]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!("vramcap: {pid}: SPEC \"512MiB\" with -i names no GPU this process uses\n")
    );
    limit(&dir, &["--pid", &p, "-i", "GPU-5ca1ab1e", "512MiB"]).expect_lines(&[&over]);
    // `stat` says so under its table.
    assert!(
        stat_lines(&dir, &p).contains(&format!(
            "{pid} gpu 0: holds 768 MiB, over its cap of 512 MiB by 256 MiB: new allocations are refused until it frees"
        )),
        "{:?}",
        stat_lines(&dir, &p)
    );
    let ran = limit(&dir, &["--pid", &p, "--wait", "0.2", "512MiB"]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: {}\n{pid}: still over its new cap after 0.2s\n",
            over.replace("limit 1.00 GiB", "limit 512 MiB")
        )
    );
    h.resume();
    h.until("wait");
    limit(&dir, &["--pid", &p, "none"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 512 MiB -> none, holds 768 MiB"
    )]);

    let ran = limit(&dir, &["--pid", &p, "8XB"]);
    ran.expect_code(2);
    assert!(
        ran.stderr()
            .starts_with("vramcap: SPEC \"8XB\" is not a valid limit: unknown unit"),
        "{}",
        ran.stderr()
    );
    assert!(
        ran.stderr().ends_with(
            "SPEC is a cap as VRAMCAP_LIMIT takes it or none, e.g. vramcap limit --pid 4242 2GiB\n"
        ),
        "{}",
        ran.stderr()
    );
    let ran = limit(&dir, &["--pid", "999999", "1GiB"]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!(
            "vramcap: no process 999999 under vramcap in {}\n",
            dir.display()
        )
    );
    let (lines, out) = h.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines[lines.len() - 3..],
        [
            format!("alloc {MIB} -> 2"),
            "wait".to_string(),
            "resumed".to_string()
        ]
    );
}

/// The Python package through the preloaded library: reads, lowers,
/// restores with the context manager, refuses a raise above the start, and
/// says how to start the program when it is not under vramcap.
#[test]
fn the_python_package_reads_and_changes_the_cap() {
    let script = r#"
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import vramcap
if not vramcap.is_active():
    print("inactive")
    try:
        vramcap.get_limit(0)
    except vramcap.NotActive as e:
        print("NotActive:", e)
    sys.exit(0)
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
print(vramcap.get_limit(0))
vramcap.set_limit(0, "512MiB")
print(vramcap.get_limit(0))
with vramcap.limit(0, 256 << 20):
    print(vramcap.get_limit(0))
print(vramcap.get_limit(0))
try:
    vramcap.set_limit(0, "2GiB")
except PermissionError as e:
    print("PermissionError:", e)
s = vramcap.memory_stats(0)
print(s["limit"], s["held"], s["soft_limit"], s["total"])
print(vramcap.empty_cache())
try:
    with vramcap.limit(0, "128MiB"):
        raise KeyError("the block's own error")
except KeyError as e:
    print("restored", vramcap.get_limit(0), e)
"#;
    let pkg = root().join("python");
    let mut cmd = shimmed(Path::new("python3"));
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .env("VRAMCAP_STATS", "off")
        .args(["-c", script])
        .arg(&pkg);
    run(cmd).expect_sized(&[
        &GIB.to_string(),
        &(512 * MIB).to_string(),
        &(256 * MIB).to_string(),
        &(512 * MIB).to_string(),
        "PermissionError: set_limit(0, '2GiB'): above the cap this process started with (VRAMCAP_LIMIT); a program may lower its cap and raise it back, never above that",
        "512M 0 None 16G",
        "0",
        &format!("restored {} \"the block's own error\"", 512 * MIB),
    ]);
    let mut cmd = bare(Path::new("python3"));
    cmd.args(["-c", script]).arg(&pkg);
    run(cmd).expect_lines(&[
        "inactive",
        "NotActive: libvramcap.so is not loaded in this process: start it under vramcap, e.g. `vramcap run --limit 8GiB -- python train.py`, or with LD_PRELOAD=/path/to/libvramcap.so",
    ]);
}

/// 16 threads churn allocations under 1 GiB while the cap is lowered to
/// 256 MiB: from the moment the change is acknowledged (the call
/// returns), no allocation takes the driver past the new cap.
#[test]
fn a_cap_lowered_during_churn_holds_from_the_acknowledgement() {
    for _ in 0..3 {
        client(
            "procaddr",
            &[ONE_GIB, NO_CACHE],
            &["init", "churnlimit", "16", "3000", "16M", "256M"],
        )
        .expect_lines(&["init -> 0", "churnlimit -> rc=0 past=0 other=0 oom=some"]);
    }
}

/// `vramcap limit --group`: the group's limit changes for every member at
/// once (the next reservation of each is held to it); percentages and
/// index keys are refused for a group, whose GPUs are known by UUID.
#[test]
fn vramcap_limit_changes_a_groups_budget_for_all_members_at_once() {
    let dir = scratch_dir();
    let env = [ONE_GIB, NO_CACHE, ("VRAMCAP_GROUP", "g")];
    let mut a = held_in(
        &dir,
        &env,
        &["init", "alloc", "256M", "wait", "fill", "16M", "wait"],
    );
    let mut b = held_in(
        &dir,
        &env,
        &["init", "alloc", "256M", "wait", "alloc", "16M"],
    );
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir).args(["stat", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap();
    let uuid = j["groups"][0]["devices"][0]["uuid"]
        .as_str()
        .expect("the group's GPU has a UUID")
        .to_string();
    limit(&dir, &["--group", "g", "768MiB"]).expect_lines(&[&format!(
        "group g {uuid}: limit 1.00 GiB -> 768 MiB, holds 512 MiB"
    )]);
    a.resume();
    a.until("wait");
    // While the first member holds its share, the second is refused.
    b.resume();
    let (lines, out) = b.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(lines.last().unwrap(), &format!("alloc {} -> 2", 16 * MIB));
    let (lines, out) = a.finish();
    assert!(out.status.success(), "{lines:?}");
    assert!(
        lines.contains(&format!(
            "fill {} -> 16 allocs {} bytes rc=2",
            16 * MIB,
            256 * MIB
        )),
        "{lines:?}"
    );

    let ran = limit(&dir, &["--group", "g", "50%"]);
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        "vramcap: SPEC \"50%\": a group's limit takes a size (the group file does not record its GPUs' memory), e.g. vramcap limit --group g 8GiB\n"
    );
    let ran = limit(&dir, &["--group", "g", "1=1GiB"]);
    ran.expect_code(1);
    assert!(
        ran.stderr().contains("names no GPU of group \"g\""),
        "{}",
        ran.stderr()
    );
    let ran = limit(&dir, &["--group", "nope", "1GiB"]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!("vramcap: no group \"nope\" in {}\n", dir.display())
    );
}

/// Above the soft limit the cache gives back what passes it and the event
/// is counted; with spill on, an allocation that would pass it goes to
/// host memory instead (the cap is the hard limit).
#[test]
fn above_the_soft_limit_the_cache_shrinks_and_spill_is_preferred() {
    let soft = ("VRAMCAP_SOFT_LIMIT", "512MiB");
    // `stat` says when a process is above its soft limit, and how often
    // it went there.
    let dir = scratch_dir();
    let mut h = held_in(
        &dir,
        &[ONE_GIB, NO_CACHE, soft],
        &["init", "alloc", "600M", "wait", "free", "0", "wait"],
    );
    let p = h.pid().to_string();
    let notes = |lines: Vec<String>| -> Vec<String> { lines.into_iter().skip(2).collect() };
    assert_eq!(
        notes(stat_lines(&dir, &p)),
        [format!(
            "{p} gpu 0: above its soft limit of 512 MiB by 88.0 MiB (went above it once)"
        )]
    );
    h.resume();
    h.until("wait");
    assert_eq!(
        notes(stat_lines(&dir, &p)),
        [format!(
            "{p} gpu 0: under its soft limit of 512 MiB, went above it once"
        )]
    );
    h.finish();
    client(
        "procaddr",
        &[ONE_GIB, soft],
        &[
            "init", "alloc", "256M", "alloc", "128M", "free", "0", "free", "1", "alloc", "400M",
            "abistats", "0",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "alloc 256M -> 0 #0",
        "alloc 128M -> 0 #1",
        "free #0 -> 0",
        "free #1 -> 0",
        "alloc 400M -> 0 #2",
        &format!(
            "abistats 0 -> 0 size=96 limit={GIB} soft={} held={} allocations={} pools=0 graphs=0 context=0 peak={} cached=0 refusals=0",
            512 * MIB,
            400 * MIB,
            400 * MIB,
            // The cache (a quarter of the cap) kept the 128 MiB block; the
            // 400 MiB allocation took the process to 528 MiB, past the
            // soft limit, and the cache gave the block back.
            528 * MIB
        ),
    ]);
    let ran = client(
        "procaddr",
        &[
            ONE_GIB,
            soft,
            ("VRAMCAP_SPILL", "host"),
            ("VRAMCAP_LOG", "info"),
        ],
        &[
            "init", "alloc", "400M", "alloc", "200M", "ptrkind", "1", "alloc", "100M", "ptrkind",
            "2",
        ],
    );
    // The log says which limit sent it to host memory.
    assert!(
        ran.stderr().contains(
            "cuMemAlloc: the soft limit of device 0 (VRAMCAP_SOFT_LIMIT) is reached; spilling to host memory (host)"
        ),
        "{}",
        ran.stderr()
    );
    ran.expect_sized(&[
        "init -> 0",
        "alloc 400M -> 0 #0",
        "alloc 200M -> 0 #1",
        "ptrkind #1 = host",
        "alloc 100M -> 0 #2",
        "ptrkind #2 = device",
    ]);
    let ran = client(
        "procaddr",
        &[ONE_GIB, ("VRAMCAP_SOFT_LIMIT", "lots")],
        &["init"],
    );
    ran.expect_code(2);
    assert!(
        ran.stderr().contains(
            "VRAMCAP_SOFT_LIMIT=\"lots\" is not valid: expected a soft limit in the grammar of VRAMCAP_LIMIT"
        ),
        "{}",
        ran.stderr()
    );
}

/// With `VRAMCAP_DISABLE=1` the ABI says so (`-ENOSYS`), so a program (and
/// the Python package) knows no cap is kept.
#[test]
fn a_disabled_shim_answers_enosys() {
    client(
        "procaddr",
        &[ONE_GIB, ("VRAMCAP_DISABLE", "1")],
        &[
            "init",
            "abiversion",
            "setlimit",
            "0",
            "512M",
            "getlimit",
            "0",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "abiversion -> -38",
        "setlimit 0 512M -> -38",
        "getlimit 0 -> 0",
    ]);
}

/// `--all-users` from anyone but root is refused with one line, before
/// anything is read (as root, the CLI runs as uid 4242 through setpriv).
#[test]
fn all_users_is_refused_to_anyone_but_root() {
    let dir = scratch_dir();
    // Each example is the command's own syntax (park takes --pid).
    let cases: [(&[&str], &str); 2] = [
        (
            &["limit", "--all-users", "--pid", "1", "2GiB"],
            "limit --pid 4242 2GiB",
        ),
        (&["park", "--all-users", "--pid", "1"], "park --pid 4242"),
    ];
    for (args, example) in cases {
        let mut cmd = if is_root() {
            let mut cmd = Command::new("setpriv");
            cmd.args(["--reuid=4242", "--regid=4242", "--clear-groups"])
                .arg(&artefacts().cli);
            cmd
        } else {
            bare(&artefacts().cli)
        };
        cmd.args(args).env("VRAMCAP_STATS_DIR", &dir);
        let ran = run(cmd);
        ran.expect_code(2);
        assert_eq!(ran.stdout(), "");
        let command = args[0];
        assert_eq!(
            ran.stderr(),
            format!(
                "vramcap: --all-users is for root (it changes other users' processes); without it, vramcap {command} acts on your own, e.g. vramcap {example}\n"
            )
        );
    }
}

/// Another user's process takes a change only from root with
/// `--all-users` (the page given to uid 4242 with chown).
#[test]
#[ignore = "needs root"]
fn another_users_process_takes_a_change_only_from_root_with_all_users() {
    needs_root();
    let dir = scratch_dir();
    let mut h = holding_256m(&dir);
    let pid = h.pid();
    let p = pid.to_string();
    let page = dir.join(format!("{pid}.page"));
    std::os::unix::fs::chown(&page, Some(4242), Some(4242)).unwrap();
    let ran = limit(&dir, &["--pid", &p, "512MiB"]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!("vramcap: {} is not a page of this user\n", page.display())
    );
    limit(&dir, &["--all-users", "--pid", &p, "512MiB"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 1.00 GiB -> 512 MiB, holds 256 MiB"
    )]);
    h.resume();
    h.until("wait");
    assert_eq!(
        h.lines.last().map(String::as_str),
        Some("wait"),
        "{:?}",
        h.lines
    );
    let info = &h.lines[h.lines.len() - 2];
    assert_eq!(
        info,
        &format!("info -> 0 free={} total={}", 256 * MIB, 512 * MIB)
    );
    // `trim` the same way.
    let trim = |args: &[&str]| {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", &dir).arg("trim").args(args);
        run(cmd)
    };
    trim(&[&p]).expect_code(1);
    trim(&["--all-users", &p]).expect_lines(&[&format!("{pid}: nothing cached")]);
    h.finish();
}
