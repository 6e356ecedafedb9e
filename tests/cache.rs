//! The freed-block cache against the stand-in driver: what reaches the
//! driver, the bound, eviction under the cap, idle release, trim, IPC,
//! capture and contexts going away. Every case is a fresh process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::*;
use serde_json::Value;

fn counts_line(lines: &[String]) -> &str {
    lines
        .iter()
        .find(|l| l.starts_with("counts "))
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no counts line: {lines:?}"))
}

/// Runs the client through cuGetProcAddress under a 1 GiB cap; its stdout
/// lines (it must exit 0).
fn lines_under_1gib(args: &[&str]) -> Vec<String> {
    under_1gib(args).ok_lines()
}

/// Runs the client through cuGetProcAddress under a 1 GiB cap.
fn under_1gib(args: &[&str]) -> Ran {
    capped("procaddr", "1GiB", args)
}

/// The `counts` line starts with `counts alloc=ALLOC free=FREE ` and, where
/// `sync` is given, holds ` sync=SYNC ` (synchronisations) and ends with
/// ` event=EVENT` (events recorded, the cache's orderings on the legacy
/// stream).
fn assert_counts(lines: &[String], alloc: u64, free: u64, sync: Option<(u64, u64)>) {
    let counts = counts_line(lines);
    assert!(
        counts.starts_with(&format!("counts alloc={alloc} free={free} ")),
        "{lines:?}"
    );
    if let Some((sync, event)) = sync {
        assert!(counts.contains(&format!(" sync={sync} ")), "{lines:?}");
        assert!(counts.ends_with(&format!(" event={event}")), "{lines:?}");
    }
}

#[test]
fn pairs_of_one_size_reach_the_driver_once() {
    let lines = lines_under_1gib(&["init", "pairs", "1000", "1M", "counts"]);
    assert_eq!(lines[1], "pairs 1000 1048576 -> ok=1000 rc=0");
    // One real allocation; every reuse of a block freed since the last
    // ordering costs one event on the legacy stream (the stream-safety
    // rule) and no wait: no non-blocking stream exists.
    assert_counts(&lines, 1, 0, Some((0, 999)));

    let lines = client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "off")],
        &["init", "pairs", "1000", "1M", "counts"],
    )
    .ok_lines();
    assert_counts(&lines, 1000, 1000, Some((0, 0)));
}

/// Once the program asks for a non-blocking stream (which the legacy
/// stream does not order), each burst of reuse waits for a
/// synchronisation instead; a blocking stream changes nothing. The page
/// counts both ways.
#[test]
fn reuse_waits_only_once_a_non_blocking_stream_exists() {
    for (make, sync, event) in [
        ("stream", 0, 3),
        ("stream-nb", 3, 0),
        ("stream-prio-nb", 3, 0),
    ] {
        let dir = scratch_dir();
        let h = held_in(
            &dir,
            &[("VRAMCAP_LIMIT", "1GiB")],
            &["init", make, "pairs", "4", "1M", "counts", "wait"],
        );
        let d = stat_device0(&dir, h.pid());
        let (lines, _) = h.finish();
        assert_eq!(lines[1], format!("{make} -> 0"), "{lines:?}");
        assert_counts(&lines, 1, 0, Some((sync, event)));
        assert_eq!(
            (d["cache_waits"].as_u64(), d["cache_ordered"].as_u64()),
            (Some(sync), Some(event)),
            "{make}: {d}"
        );
    }
    // Made after an ordering, the stream first waits for it: a block that
    // ordering made safe (the second here) may meet work on the new
    // stream, which the legacy stream does not order.
    let dir = scratch_dir_named("late-stream");
    let h = held_in(
        &dir,
        &[("VRAMCAP_LIMIT", "1GiB")],
        &[
            "init",
            "alloc",
            "1M",
            "alloc",
            "1M",
            "free",
            "0",
            "free",
            "1",
            "alloc",
            "1M",
            "stream-nb",
            "alloc",
            "1M",
            "counts",
            "wait",
        ],
    );
    let d = stat_device0(&dir, h.pid());
    let (lines, _) = h.finish();
    assert_counts(&lines, 2, 0, Some((0, 1)));
    assert_eq!(
        (d["cache_waits"].as_u64(), d["cache_ordered"].as_u64()),
        (Some(1), Some(1)),
        "{d}"
    );
    // Made after some reuse, the stream turns the next burst into a wait.
    let lines = lines_under_1gib(&[
        "init",
        "pairs",
        "3",
        "1M",
        "stream-nb",
        "pairs",
        "3",
        "1M",
        "counts",
    ]);
    assert_counts(&lines, 1, 0, Some((3, 2)));
}

#[test]
fn blocks_freed_before_a_synchronisation_are_reused_without_another() {
    // Four blocks freed, one synchronisation makes all four safe.
    let lines = client(
        "linked",
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "100%")],
        &[
            "init", "alloc", "1M", "alloc", "1M", "alloc", "1M", "alloc", "1M", "freeall", "alloc",
            "1M", "alloc", "1M", "alloc", "1M", "alloc", "1M", "counts",
        ],
    )
    .ok_lines();
    assert_counts(&lines, 4, 0, Some((0, 1)));
}

#[test]
fn a_reused_block_is_the_same_driver_allocation() {
    let lines = lines_under_1gib(&[
        "init", "alloc", "1M", "ptr", "0", "free", "0", "alloc", "1000000", "ptr", "1",
    ]);
    let addr = |l: &str| l.rsplit_once(" = ").unwrap().1.to_string();
    assert_eq!(addr(&lines[2]), addr(&lines[5]), "{lines:?}");
    assert_eq!(
        lines[4], "alloc 1000000 -> 0 #1",
        "within the slack: reused"
    );
}

#[test]
fn the_cap_counts_cached_bytes_and_releases_them_when_needed() {
    let gib = 1u64 << 30;
    client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "100%")],
        &[
            "init", "fill", "256M", "freeall", "standin", "info", "fill", "512M", "standin",
            "info", "freeall",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        "freeall -> 4 freed rc=0",
        // All four blocks cached: the driver still holds them, the program may
        // have all of it.
        &format!("standin dev=0 used={gib} peak={gib}"),
        "standin dev=1 used=0 peak=0",
        &format!("info -> 0 free={gib} total={gib}"),
        // Another size still reaches the full cap: the cache makes room.
        "fill 536870912 -> 2 allocs 1073741824 bytes rc=2",
        &format!("standin dev=0 used={gib} peak={gib}"),
        "standin dev=1 used=0 peak=0",
        &format!("info -> 0 free=0 total={gib}"),
        "freeall -> 2 freed rc=0",
    ]);
}

#[test]
fn the_cache_stays_within_its_bound() {
    let mib = 1u64 << 20;
    for (setting, kept) in [("300MiB", 300 * mib), ("10%", 100 * mib), ("off", 0)] {
        client(
            "procaddr",
            &[("VRAMCAP_LIMIT", "1000MiB"), ("VRAMCAP_CACHE", setting)],
            &["init", "fill", "100M", "freeall", "standin"],
        )
        .expect_lines(&[
            "init -> 0",
            "fill 104857600 -> 10 allocs 1048576000 bytes rc=2",
            "freeall -> 10 freed rc=0",
            &format!("standin dev=0 used={kept} peak={}", 1000 * mib),
            "standin dev=1 used=0 peak=0",
        ]);
    }
}

#[test]
fn bad_cache_settings_are_refused() {
    for (var, value, msg) in [
        (
            "VRAMCAP_CACHE",
            "lots",
            "VRAMCAP_CACHE=\"lots\" is not valid: expected a size (e.g. 2GiB), a percentage of each GPU's cap (e.g. 25%), or off",
        ),
        (
            "VRAMCAP_CACHE_IDLE",
            "0",
            "VRAMCAP_CACHE_IDLE=\"0\" is not valid: expected a duration greater than zero, e.g. 5s, 500ms, 2m (a bare number is seconds)",
        ),
    ] {
        let ran = client("procaddr", &[(var, value)], &["init"]);
        ran.expect_code(2);
        assert_eq!(ran.stdout(), "");
        assert!(
            ran.stderr().ends_with(&format!("]: {msg}\n")),
            "{}",
            ran.stderr()
        );
    }
}

/// Polls `stat` until `cond` holds (the process acts on its own clock);
/// fails after 10 seconds.
fn poll_until(dir: &Path, pid: u32, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let d = stat_device0(dir, pid);
        if cond(&d) {
            return d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what} did not happen: {d}"
        );
        std::thread::yield_now();
    }
}

fn held(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Held {
    held_in(dir, env, args)
}

/// A client under a 1 GiB cap with `VRAMCAP_CACHE_IDLE=idle` holding one
/// freed (so cached) 256 MiB block at its `wait`, its page in the test's
/// fresh directory; after the wait it prints the stand-in's usage.
fn one_cached_block(idle: &str) -> (PathBuf, Held) {
    let dir = scratch_dir();
    let h = held(
        &dir,
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE_IDLE", idle)],
        &["init", "alloc", "256M", "free", "0", "wait", "standin"],
    );
    (dir, h)
}

#[test]
fn idle_blocks_go_back_to_the_driver() {
    let (dir, h) = one_cached_block("200ms");
    let d = poll_until(&dir, h.pid(), "idle release", |d| d["cached_bytes"] == 0);
    assert_eq!(d["used_bytes"], 0);
    assert_eq!(d["evictions"], 1);
    let (lines, _) = h.finish();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("standin dev=1 used=0 peak=0")
    );
    assert_eq!(
        lines[lines.len() - 2],
        "standin dev=0 used=0 peak=268435456"
    );
}

#[test]
fn trim_empties_a_quiet_process_cache() {
    let (dir, h) = one_cached_block("1h");
    let pid = h.pid();
    let d = stat_device0(&dir, pid);
    assert_eq!(
        (d["cached_bytes"].as_u64(), d["used_bytes"].as_u64()),
        (Some(256 << 20), Some(256 << 20))
    );
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .args(["trim", &pid.to_string()]);
    run(cmd).expect_lines(&[&format!("{pid}: released 256 MiB (0 B still cached)")]);
    let d = stat_device0(&dir, pid);
    assert_eq!(
        (
            d["cached_bytes"].as_u64(),
            d["used_bytes"].as_u64(),
            d["trims"].as_u64()
        ),
        (Some(0), Some(0), Some(1))
    );
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir).args(["trim", "--all"]);
    run(cmd).expect_lines(&[&format!("{pid}: nothing cached")]);
    let (lines, _) = h.finish();
    assert_eq!(
        lines[lines.len() - 2],
        "standin dev=0 used=0 peak=268435456"
    );

    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir).args(["trim", "1"]);
    let ran = run(cmd);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!("vramcap: no process 1 under vramcap in {}\n", dir.display())
    );
}

#[test]
fn stat_shows_cache_counters() {
    let dir = scratch_dir();
    let h = held(
        &dir,
        &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "300MiB")],
        &[
            "init", "pairs", "10", "1M", "alloc", "200M", "alloc", "200M", "freeall", "wait",
        ],
    );
    let d = stat_device0(&dir, h.pid());
    // 10 pairs: 1 miss + 9 hits; two 200 MiB misses; freeing both keeps one
    // (300 MiB bound) and evicts the older plus the 1 MiB block.
    assert_eq!(d["cache_hits"], 9, "{d}");
    assert_eq!(d["cache_misses"], 3, "{d}");
    assert_eq!(d["cached_bytes"], 200u64 << 20, "{d}");
    assert_eq!(d["used_bytes"], 200u64 << 20, "{d}");
    assert_eq!(d["evictions"], 2, "{d}");
    assert_eq!(d["allocations"], 12, "{d}");
    assert_eq!(d["frees"], 12, "{d}");
    h.finish();
}

#[test]
fn ipc_exported_blocks_are_never_cached() {
    let lines = lines_under_1gib(&[
        "init", "alloc", "64M", "ipc", "0", "free", "0", "standin", "alloc", "64M", "counts",
    ]);
    assert_eq!(lines[2], "ipc #0 -> 0");
    assert_eq!(lines[4], "standin dev=0 used=0 peak=67108864", "{lines:?}");
    assert_counts(&lines, 2, 1, None);
}

#[test]
fn no_synchronisation_while_a_capture_runs() {
    let lines = lines_under_1gib(&[
        "init",
        "stream",
        "alloc",
        "1M",
        "free",
        "0",
        "capture-begin",
        "alloc",
        "1M",
        "capture-end",
        "alloc",
        "1M",
        "counts",
    ]);
    assert_eq!(lines[4], "capture-begin -> 0", "{lines:?}");
    assert_eq!(lines[5], "alloc 1048576 -> 0 #1");
    assert_eq!(
        lines[6], "capture-end -> 0",
        "the capture was not invalidated: {lines:?}"
    );
    // The allocation during capture was fresh; after it the cached block is
    // reused, ordered with an event (the capture stream is a blocking one).
    assert_counts(&lines, 2, 0, Some((0, 1)));
}

#[test]
fn memory_of_a_destroyed_context_returns_to_the_budget() {
    under_1gib(&[
        "init",
        "ctxcreate",
        "alloc",
        "256M",
        "free",
        "0",
        "alloc",
        "512M",
        "ctxdestroy",
        "ctx",
        "0",
        "info",
        "standin",
        "fill",
        "256M",
    ])
    .expect_sized(&[
        "init -> 0",
        "ctxcreate -> 0",
        "alloc 268435456 -> 0 #0",
        "free #0 -> 0",
        "alloc 536870912 -> 0 #1",
        "ctxdestroy -> 0",
        "ctx 0 -> 0",
        "info -> 0 free=1G total=1G",
        "standin dev=0 used=0 peak=768M",
        "standin dev=1 used=0 peak=0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
    ]);
    // The primary context reset drops its allocations and its cache.
    under_1gib(&[
        "init", "alloc", "256M", "alloc", "256M", "free", "0", "reset", "0", "init", "info",
        "standin",
    ])
    .expect_sized(&[
        "init -> 0",
        "alloc 268435456 -> 0 #0",
        "alloc 268435456 -> 0 #1",
        "free #0 -> 0",
        "reset 0 -> 0",
        "init -> 0",
        "info -> 0 free=1G total=1G",
        "standin dev=0 used=0 peak=512M",
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn threads_near_the_cap_with_the_cache_end_with_nothing_held() {
    let cap = 256u64 << 20;
    let lines = client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "256MiB"), ("VRAMCAP_CACHE", "100%")],
        &["init", "threads", "16", "2000", "16M", "info", "standin"],
    )
    .ok_lines();
    assert!(lines[1].ends_with(" other=0"), "{lines:?}");
    assert_eq!(
        lines[2],
        format!("info -> 0 free={cap} total={cap}"),
        "cached bytes are the program's to reuse"
    );
    let peak: u64 = lines[3].rsplit_once("peak=").unwrap().1.parse().unwrap();
    assert!(peak <= cap, "{lines:?}");
}

/// A second free of a block the cache holds is answered as the driver
/// answers a free of freed memory, and changes nothing: the block is not
/// freed behind the cache's back (which would hand out memory the driver
/// may give to someone else) and stays counted once.
#[test]
fn a_second_free_is_refused_and_the_cached_block_stays_counted_once() {
    under_1gib(&[
        "init", "alloc", "8M", "free", "0", "free", "0", "standin", "alloc", "8M", "info",
        "standin",
    ])
    .expect_sized(&[
        "init -> 0",
        "alloc 8388608 -> 0 #0",
        "free #0 -> 0",
        "free #0 -> 1",
        "standin dev=0 used=8M peak=8M",
        "standin dev=1 used=0 peak=0",
        "alloc 8388608 -> 0 #1",
        "info -> 0 free=1016M total=1G",
        "standin dev=0 used=8M peak=8M",
        "standin dev=1 used=0 peak=0",
    ]);
}
