//! `VRAMCAP_PARK_MOVE=shim` (issue 43): the shim parks a process by moving
//! its blocks (allocations of at least the VMM granularity, made as VMM
//! memory) to host memory itself, and back; the rest of the process stays
//! on the GPU, and the driver's checkpoint is never called.

use crate::park_util::{MANUAL, Watched, park};
use crate::util::*;

const MOVE: (&str, &str) = ("VRAMCAP_PARK_MOVE", "shim");

/// Parking by the shim's moves under a 4 GiB cap, the cache off, and
/// `extra`.
fn moved_env<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        MANUAL,
        MOVE,
        ("VRAMCAP_LIMIT", "4GiB"),
        ("VRAMCAP_CACHE", "off"),
    ];
    env.extend_from_slice(extra);
    env
}

/// The stand-in's view of the GPUs and the host after `label`: the lines
/// of `kinds`, as one.
fn kinds_line(lines: &[String], from: usize) -> String {
    lines[from..from + 3].join(" | ")
}

/// `stderr` holds `text` exactly `times` times.
fn said(stderr: &str, text: &str, times: usize) {
    assert_eq!(stderr.matches(text).count(), times, "{stderr}");
}

/// The host memory kept for parks that `stat --json` shows for the one
/// process publishing in `dir`.
fn host_kept(dir: &std::path::Path) -> u64 {
    crate::park_util::stat(dir)["processes"][0]["park"]["host_kept_bytes"]
        .as_u64()
        .expect("host_kept_bytes")
}

/// [`moved_env`] with `VRAMCAP_PARK_MOVE=mode`.
fn move_env<'a>(mode: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = moved_env(extra);
    env.retain(|(k, _)| *k != MOVE.0);
    env.push((MOVE.0, mode));
    env
}

/// The client with `env` and `args` (one `wait` after its allocations),
/// parked once (the park's answer is `PID: parked, {moved} moved to host
/// memory and released`), then let go so that its next call resumes it:
/// its lines after `resumed`, and its stderr. It must end well.
fn parked_once(env: &[(&str, &str)], args: &[&str], moved: &str) -> (Vec<String>, String) {
    parked_once_by("procaddr", env, args, moved)
}

/// [`parked_once`] with the client reaching the driver by `method`.
fn parked_once_by(
    method: &str,
    env: &[(&str, &str)],
    args: &[&str],
    moved: &str,
) -> (Vec<String>, String) {
    let dir = scratch_dir();
    let mut h = Watched::start_by(method, &dir, env, args);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, {moved} moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
    let first = lines.iter().position(|l| l == "resumed").expect("resumed") + 1;
    (
        lines[first..].to_vec(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_park_moves_the_blocks_and_a_call_brings_them_back_intact() {
    let dir = scratch_dir();
    let env = moved_env(&[("VRAMCAP_LOG", "info")]);
    let args = [
        "init", "alloc", "64M", "alloc", "1M", "memset32", "0", "64M", "77", "wait", "kinds",
        "ckstate", "read32", "0", "kinds", "counts", "wait", "kinds", "read32", "0", "counts",
        "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 64.0 MiB moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    // Parked again: the second park copies into the host memory the first
    // one kept (no new host memory is made).
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 64.0 MiB moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = |l: &str| {
        lines
            .iter()
            .position(|x| x == l)
            .unwrap_or_else(|| panic!("{l}: {lines:?}"))
    };
    let first = at("resumed") + 1;
    // Parked: the 64 MiB block is host memory, the 1 MiB allocation (below
    // the granularity) stays on the GPU; no checkpoint was made.
    assert_eq!(
        kinds_line(&lines, first),
        "kinds dev=0 device=1048576 managed_host=0 | kinds dev=1 device=0 managed_host=0 | kinds host=0",
        "{lines:?}"
    );
    assert_eq!(
        lines[first + 3],
        "ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0"
    );
    // Its next call brought it back, contents intact.
    assert_eq!(lines[first + 4], "read32 #0 -> 0 value=77");
    assert_eq!(
        kinds_line(&lines, first + 5),
        "kinds dev=0 device=68157440 managed_host=0 | kinds dev=1 device=0 managed_host=0 | kinds host=0",
        "{lines:?}"
    );
    let count = |l: &str, key: &str| -> u64 {
        l.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {l}"))
    };
    // The park made host pages once (registered), no VMM host memory.
    assert_eq!(count(&lines[first + 8], "host_register"), 1, "{lines:?}");
    assert_eq!(count(&lines[first + 8], "vmm_host"), 0, "{lines:?}");
    let second = first + 11;
    assert_eq!(lines[second - 1], "resumed", "{lines:?}");
    assert_eq!(lines[second + 3], "read32 #0 -> 0 value=77", "{lines:?}");
    assert_eq!(count(&lines[second + 4], "host_register"), 1, "{lines:?}");
    said(&stderr, "moved to host memory by the shim", 2);
    said(
        &stderr,
        "(moved by the shim; 64.0 MiB of host memory kept for the next park, until `vramcap trim` or exit)",
        2,
    );
    assert!(!stderr.contains("checkpoint"), "{stderr}");
}

/// With `VRAMCAP_PARK_MOVE` unset, parking moves by the shim: the block
/// leaves, the small allocation stays, no checkpoint is made. With host
/// spill the driver's checkpoint stays the default (the shim's moves do
/// not spill): it takes everything.
#[test]
fn the_default_move_is_the_shims_and_the_checkpoint_with_host_spill() {
    let args = [
        "init", "alloc", "64M", "alloc", "1M", "wait", "kinds", "ckstate", "read32", "0", "wait",
    ];
    for (spill, device_parked, ckstate) in [
        ("off", 1048576, "state=0 checkpoints=0"),
        ("host", 0, "state=2 checkpoints=1"),
    ] {
        let dir = scratch_dir();
        let env = [
            MANUAL,
            ("VRAMCAP_LIMIT", "4GiB"),
            ("VRAMCAP_CACHE", "off"),
            ("VRAMCAP_SPILL", spill),
        ];
        let mut h = Watched::start(&dir, &env, &args);
        let pid = h.pid;
        park(&dir, pid).expect_code(0);
        h.resume();
        h.until("wait");
        let (lines, out) = h.end();
        assert!(out.status.success(), "{lines:?}");
        let first = lines.iter().position(|l| l == "resumed").expect("resumed") + 1;
        assert!(
            lines[first].starts_with(&format!("kinds dev=0 device={device_parked} ")),
            "VRAMCAP_SPILL={spill}: {lines:?}"
        );
        assert!(
            lines[first + 3].starts_with(&format!("ckstate {ckstate} ")),
            "VRAMCAP_SPILL={spill}: {lines:?}"
        );
        assert_eq!(lines[first + 4], "read32 #0 -> 0 value=0", "{lines:?}");
    }
}

/// Peer access: once the program lets another GPU reach this one's memory
/// (`cuCtxEnablePeerAccess`), the blocks here, which are VMM memory that
/// the driver's peer mapping does not cover, are granted to that GPU too:
/// those made before, those made after, and again when a resume maps them
/// afresh. Before it, only their own GPU has them.
#[test]
fn blocks_are_granted_to_a_gpu_given_peer_access_before_and_after_a_park() {
    let dir = scratch_dir();
    let env = moved_env(&[]);
    // #0 on GPU 0; GPU 1 given access to GPU 0 (asked twice: the driver's
    // 704 the second time); #1 made on GPU 1 right after (the context the
    // shim pushed to ask the peer's GPU is popped: GPU 1 is still
    // current), which GPU 0 was not given; #2 on GPU 0.
    let args = [
        "init", "ctx", "0", "alloc", "64M", "access", "0", "1", "ctx", "1", "peer", "0", "peer",
        "0", "alloc", "64M", "access", "1", "1", "access", "1", "0", "ctx", "0", "access", "0",
        "1", "alloc", "64M", "access", "2", "1", "access", "2", "0", "wait", "access", "0", "1",
        "access", "1", "0", "access", "2", "1", "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 192 MiB moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
    let from = lines.iter().position(|l| l == "ctx 0 -> 0").expect("ctx 0");
    assert_eq!(
        lines[from..].to_vec(),
        [
            "ctx 0 -> 0",
            "alloc 67108864 -> 0 #0",
            "access #0 dev=1 -> 0 flags=0",
            "ctx 1 -> 0",
            "peer 0 -> 0",
            "peer 0 -> 704",
            "alloc 67108864 -> 0 #1",
            "access #1 dev=1 -> 0 flags=3",
            "access #1 dev=0 -> 0 flags=0",
            "ctx 0 -> 0",
            "access #0 dev=1 -> 0 flags=3",
            "alloc 67108864 -> 0 #2",
            "access #2 dev=1 -> 0 flags=3",
            "access #2 dev=0 -> 0 flags=3",
            "wait",
            "resumed",
            "access #0 dev=1 -> 0 flags=3",
            "access #1 dev=0 -> 0 flags=0",
            "access #2 dev=1 -> 0 flags=3",
            "wait",
        ],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A question the driver answers from an address's mapping (a pointer
/// query, `cuMemGetAddressRange`) has no true answer while a park has the
/// block unmapped (on r580 they answer 1 and 500). Asked by a parked
/// process, whether it is linked with -lcuda (the shim's exports) or
/// looks the functions up, it resumes the process first and gets the
/// answer it got running; without parking the export answers as the
/// driver does.
#[test]
fn an_address_query_resumes_a_parked_process_first() {
    let running = "ptrquery #0 -> 0 dev=0 start=+0; range -> 0 base=+0 size=67108864";
    // Without parking, the export answers as the driver does.
    client(
        "linked",
        &[("VRAMCAP_LIMIT", "4GiB")],
        &["init", "alloc", "64M", "ptrquery", "0"],
    )
    .expect_lines(&["init -> 0", "alloc 67108864 -> 0 #0", running]);
    // Each export's gate, its call the first after the park.
    let cases = [
        (
            "linked",
            &["ptrquery", "0"][..],
            running,
            "cuPointerGetAttribute",
        ),
        (
            "procaddr",
            &["ptrquery", "0"],
            running,
            "cuPointerGetAttribute",
        ),
        (
            "dlsym",
            &["ptrquery", "0"],
            running,
            "cuPointerGetAttribute",
        ),
        (
            "linked",
            &["range", "0"],
            "range #0 -> 0 base=+0 size=67108864",
            "cuMemGetAddressRange_v2",
        ),
        (
            "linked",
            &["access", "0", "0"],
            "access #0 dev=0 -> 0 flags=3",
            "cuMemGetAccess",
        ),
    ];
    for (method, call, answer, export) in cases {
        let env = moved_env(&[("VRAMCAP_LOG", "info")]);
        let mut args = vec!["init", "alloc", "64M", "wait"];
        args.extend_from_slice(call);
        args.push("wait");
        let (after, stderr) = parked_once_by(method, &env, &args, "64.0 MiB");
        assert_eq!(after, [answer, "wait"], "{method} {call:?}: {stderr}");
        said(
            &stderr,
            &format!("parking: {export} resumes this process"),
            1,
        );
    }
}

/// Refused at start: the shim's moves only with parking, and not with
/// host spill.
#[test]
fn park_move_shim_needs_parking_and_no_host_spill() {
    for (env, line) in [
        (
            vec![MOVE, ("VRAMCAP_LIMIT", "1GiB")],
            "VRAMCAP_PARK_MOVE=\"shim\" is not valid: expected checkpoint without VRAMCAP_PARK (the shim's moves apply to parking only), e.g. VRAMCAP_PARK=manual VRAMCAP_PARK_MOVE=shim",
        ),
        (
            vec![MANUAL, MOVE, ("VRAMCAP_SPILL", "host")],
            "VRAMCAP_PARK_MOVE=\"shim\" is not valid: expected checkpoint with VRAMCAP_SPILL=host (the shim's moves do not spill yet), e.g. VRAMCAP_PARK_MOVE=shim with VRAMCAP_SPILL=off or tiered",
        ),
    ] {
        let ran = client("procaddr", &env, &["init"]);
        assert!(ran.stderr().contains(line), "{}", ran.stderr());
    }
}

/// Issue 43, done-when 7 on the stand-in: parked and resumed 100 times,
/// the block keeps its contents, the host memory is made once and kept,
/// and the ledgers come back exact (the page's `used` as before, nothing
/// spilled, nothing parked).
#[test]
fn a_hundred_cycles_lose_nothing_and_make_host_memory_once() {
    let dir = scratch_dir();
    let env = moved_env(&[]);
    let mut args = vec!["init", "alloc", "64M", "memset32", "0", "64M", "77"];
    for _ in 0..100 {
        args.extend_from_slice(&["wait", "read32", "0"]);
    }
    args.extend_from_slice(&["counts", "abistats", "0", "wait"]);
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    for _ in 0..100 {
        park(&dir, pid).expect_lines(&[&format!(
            "{pid}: parked, 64.0 MiB moved to host memory and released"
        )]);
        h.resume();
        h.until("wait");
    }
    let (lines, out) = h.end();
    assert!(
        out.status.success(),
        "{:?}",
        &lines[lines.len().saturating_sub(8)..]
    );
    let reads: Vec<&String> = lines.iter().filter(|l| l.starts_with("read32")).collect();
    assert_eq!(reads.len(), 100);
    assert!(
        reads.iter().all(|l| *l == "read32 #0 -> 0 value=77"),
        "{reads:?}"
    );
    let n = lines.len();
    let counts = &lines[n - 3];
    assert!(
        counts.contains(" vmm_host=0 ") && counts.contains(" host_register=1 "),
        "{counts}"
    );
    let stats = &lines[n - 2];
    assert!(stats.starts_with("abistats 0 -> 0 size="), "{stats}");
    assert!(
        stats.contains(&format!(" allocations={} ", 64 * MIB)),
        "{stats}"
    );
}

/// A resume is all or nothing (the review of 1f13993): with room on the GPU
/// for one of two parked 1 GiB blocks, `vramcap resume` is refused and
/// nothing comes back (the GPU shows none of them, the budget holds none);
/// once the room is there, the next call brings both back intact.
#[test]
fn a_resume_without_room_for_every_block_moves_none() {
    let dir = scratch_dir();
    let foreign = dir.join("foreign-mib");
    std::fs::write(&foreign, "0").unwrap();
    let env = moved_env(&[("STANDIN_FOREIGN_FILE", foreign.to_str().unwrap())]);
    let args = [
        "init", "alloc", "1G", "alloc", "1G", "memset32", "0", "1G", "5", "memset32", "1", "1G",
        "6", "wait", "kinds", "wait", "read32", "0", "read32", "1", "kinds", "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 2.00 GiB moved to host memory and released"
    )]);
    // 16 GiB devices: 14.5 GiB held by others leaves room for one block.
    std::fs::write(&foreign, "14848").unwrap();
    let ran = crate::park_util::cli(&dir, &["resume", "--pid", &pid.to_string()]);
    ran.expect_code(1);
    assert_eq!(
        ran.stderr(),
        format!("vramcap: {pid}: cannot resume: no room on GPU 0 for its parked memory\n")
    );
    // The process's page: nothing held on the GPU, all of it parked.
    let j = crate::park_util::stat(&dir);
    let d = &j["processes"][0]["devices"][0];
    assert_eq!(
        (d["used_bytes"].as_u64(), d["parked_bytes"].as_u64()),
        (Some(0), Some(2 * GIB)),
        "{d}"
    );
    h.resume();
    h.until("wait");
    std::fs::write(&foreign, "0").unwrap();
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
    let first = lines.iter().position(|l| l == "resumed").unwrap() + 1;
    assert_eq!(
        lines[first], "kinds dev=0 device=0 managed_host=0",
        "nothing came back: {lines:?}"
    );
    let second = first + 5;
    assert_eq!(lines[second - 1], "resumed", "{lines:?}");
    assert_eq!(
        lines[second..second + 3],
        [
            "read32 #0 -> 0 value=5",
            "read32 #1 -> 0 value=6",
            "kinds dev=0 device=2147483648 managed_host=0",
        ],
        "{lines:?}"
    );
}

/// A group's budget lowered below what a parked member moved out (as the
/// driver's checkpoint path does): its next call brings the blocks back
/// over the budget (said once), and new allocations are refused while it
/// is over.
#[test]
fn a_resume_over_a_group_budget_lowered_meanwhile() {
    let dir = scratch_dir();
    let group = format!("moved{}", std::process::id());
    let env = [
        MANUAL,
        MOVE,
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", group.as_str()),
        ("VRAMCAP_LOG", "warn"),
    ];
    let mut h = Watched::start(
        &dir,
        &env,
        &[
            "init", "alloc", "1G", "memset32", "0", "1G", "9", "wait", "read32", "0", "alloc",
            "64M", "wait",
        ],
    );
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 1.00 GiB moved to host memory and released"
    )]);
    let ran = crate::park_util::cli(&dir, &["limit", "--group", &group, "512MiB"]);
    assert!(ran.out.status.success(), "{}", ran.stderr());
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    let n = lines.len();
    assert_eq!(
        lines[n - 3..],
        [
            "read32 #0 -> 0 value=9".to_string(),
            format!("alloc {} -> 2", 64 * MIB),
            "wait".to_string(),
        ],
        "{lines:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    said(
        &err,
        &format!(
            "device 0: resuming over the group's cap of 536870912 bytes: the process held {GIB} bytes when it was parked"
        ),
        1,
    );
}

/// Kept host memory of a size no block has any more is given back at the
/// next park (the review of 1f13993): under a 192 MiB spill limit, a
/// 64 MiB block's kept memory does not stop a later 128 MiB one from
/// moving.
#[test]
fn kept_host_memory_of_sizes_gone_is_given_back() {
    let dir = scratch_dir();
    let env = moved_env(&[("VRAMCAP_SPILL_LIMIT", "192MiB")]);
    let args = [
        "init", "alloc", "64M", "wait", "free", "0", "alloc", "128M", "wait", "free", "1", "alloc",
        "96M", "wait", "counts", "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    for mib in ["64.0", "128", "96.0"] {
        park(&dir, pid).expect_lines(&[&format!(
            "{pid}: parked, {mib} MiB moved to host memory and released"
        )]);
        h.resume();
        h.until("wait");
    }
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
}

/// A park with no block to move still waits for the process's work, so
/// that the answers it gives its queries while parked are true: the
/// stand-in counts the synchronisation.
#[test]
fn a_park_with_nothing_to_move_still_waits_for_the_work() {
    let dir = scratch_dir();
    let env = moved_env(&[]);
    let mut h = Watched::start(
        &dir,
        &env,
        &["init", "alloc", "1M", "counts", "wait", "counts", "wait"],
    );
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 0 B moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
    let sync = |l: &str| -> u64 {
        l.split(' ')
            .find_map(|kv| kv.strip_prefix("sync="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{l}"))
    };
    let before = lines.iter().find(|l| l.starts_with("counts")).unwrap();
    let after = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("counts"))
        .unwrap();
    assert!(sync(after) > sync(before), "{before} / {after}");
}

/// Parked by the shim's moves, a process whose exit handler calls the
/// driver ends at once and without moving anything back (the handler's
/// call answers `CUDA_ERROR_DEINITIALIZED`, as with the driver's
/// checkpoint), and its page goes with it.
#[test]
fn a_process_parked_by_the_shim_exits_without_moving_back() {
    let dir = scratch_dir();
    let env = moved_env(&[("VRAMCAP_LOG", "info")]);
    let h = Watched::start(&dir, &env, &["init", "atexit-sync", "alloc", "64M", "wait"]);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 64.0 MiB moved to host memory and released"
    )]);
    let (lines, out) = h.end_all();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{lines:?} {stderr}");
    assert_eq!(
        lines[lines.len() - 2..],
        ["resumed", "atexit sync -> 4"],
        "{stderr}"
    );
    assert!(!stderr.contains("resumed: "), "{stderr}");
    assert!(!dir.join(format!("{pid}.page")).exists());
}

/// Tiered spill and the shim's moves in one process: a block tiered spill
/// put on the host stays there through a park and a resume (only what a
/// park moved comes back), the other comes back, both keep their contents,
/// and the ledgers end where they began.
#[test]
fn tiered_spill_and_the_shims_park_share_the_blocks() {
    let dir = scratch_dir();
    let env = [
        MANUAL,
        MOVE,
        ("VRAMCAP_SPILL", "tiered"),
        ("VRAMCAP_LIMIT", "96MiB"),
        ("VRAMCAP_CACHE", "off"),
    ];
    // The context is charged 0 on the stand-in: 64 MiB fits under the cap,
    // the next 64 MiB goes to the host (tiered spill's placement).
    let args = [
        "init", "alloc", "64M", "alloc", "64M", "memset32", "0", "64M", "3", "memset32", "1",
        "64M", "4", "kinds", "wait", "read32", "0", "read32", "1", "kinds", "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 64.0 MiB moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
    let at = lines.iter().position(|l| l == "resumed").unwrap();
    assert_eq!(
        lines[5], "kinds dev=0 device=67108864 managed_host=0",
        "{lines:?}"
    );
    assert_eq!(
        lines[at + 1..at + 4],
        [
            "read32 #0 -> 0 value=3",
            "read32 #1 -> 0 value=4",
            "kinds dev=0 device=67108864 managed_host=0",
        ],
        "{lines:?}"
    );
}

/// The resume's policy with the shim's moves (as
/// `park_policy::two_idle_members_take_turns_a_resume_parks_the_idle_other`
/// with the driver's checkpoint, an eighth of its sizes: the host pages are
/// real memory here): two members of a 256 MiB group, idle after 300 ms,
/// holding 192 MiB and 128 MiB. B's allocation parks A; A's next
/// call, refused by the group, parks B (idle) and comes back; the ledgers
/// are exact at each turn and A's contents intact.
#[test]
fn two_members_take_turns_a_resume_parks_the_idle_other() {
    let dir = scratch_dir();
    let group = format!("moveturns{}", std::process::id());
    let env = [
        ("VRAMCAP_PARK", "idle:300ms"),
        ("VRAMCAP_PARK_WAIT", "10s"),
        MOVE,
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_LIMIT", "256MiB"),
        ("VRAMCAP_GROUP", group.as_str()),
        ("VRAMCAP_LOG", "info"),
    ];
    let mut a = Watched::start(
        &dir,
        &env,
        &[
            "init", "alloc", "192M", "memset32", "0", "192M", "8", "wait", "read32", "0", "wait",
        ],
    );
    let b = Watched::start(
        &dir,
        &env,
        &["init", "alloc", "128M", "wait", "info", "wait"],
    );
    let (pa, pb) = (a.pid, b.pid);
    assert_eq!(b.lines[1], format!("alloc {} -> 0 #0", 128 * MIB));
    let device0 = |pid: u32| {
        let j = crate::park_util::stat(&dir);
        let p = j["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .cloned()
            .expect("listed");
        let d = &p["devices"][0];
        (
            d["used_bytes"].as_u64().unwrap(),
            d["parked_bytes"].as_u64().unwrap(),
        )
    };
    assert_eq!(device0(pa), (0, 192 * MIB));
    assert_eq!(device0(pb), (128 * MIB, 0));
    // A calls CUDA: its resume is refused by the group, parks B (idle).
    a.resume();
    a.until("wait");
    let n = a.lines.len();
    assert_eq!(
        a.lines[n - 3..],
        ["resumed", "read32 #0 -> 0 value=8", "wait"],
        "{:?}",
        a.lines
    );
    assert_eq!(device0(pa), (192 * MIB, 0));
    assert_eq!(device0(pb), (0, 128 * MIB));
    let (lines, out) = a.end();
    assert!(out.status.success(), "{lines:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "group {group}: {} more bytes needed on device 0 to resume; parking idle member {pb}: done",
            64 * MIB
        )),
        "{err}"
    );
    let (lines, out) = b.end();
    assert!(out.status.success(), "{lines:?}");
}

/// `VRAMCAP_PARK_MOVE=shim+checkpoint` (issue 43's leave-nothing mode): the
/// shim moves the 64 MiB block, then the driver's checkpoint takes the
/// rest (the 1 MiB allocation below the granularity), so the GPU shows
/// nothing of the process; its next call has the driver restore the rest,
/// then the shim move the block back, contents intact and ledgers exact.
#[test]
fn shim_then_checkpoint_leaves_nothing_on_the_gpu() {
    let env = move_env("shim+checkpoint", &[("VRAMCAP_LOG", "info")]);
    let args = [
        "init", "alloc", "64M", "alloc", "1M", "memset32", "0", "64M", "77", "wait", "kinds",
        "ckstate", "read32", "0", "kinds", "ckstate", "abistats", "0", "wait",
    ];
    let (lines, stderr) = parked_once(&env, &args, "65.0 MiB");
    let first = 0;
    assert_eq!(
        kinds_line(&lines, first),
        "kinds dev=0 device=0 managed_host=0 | kinds dev=1 device=0 managed_host=0 | kinds host=0",
        "{lines:?}"
    );
    assert_eq!(
        lines[first + 3],
        "ckstate state=2 checkpoints=1 restores=0 failures=0 parked=1048576",
        "{lines:?}"
    );
    assert_eq!(lines[first + 4], "read32 #0 -> 0 value=77", "{lines:?}");
    assert_eq!(
        kinds_line(&lines, first + 5),
        "kinds dev=0 device=68157440 managed_host=0 | kinds dev=1 device=0 managed_host=0 | kinds host=0",
        "{lines:?}"
    );
    assert_eq!(
        lines[first + 8],
        "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0",
        "{lines:?}"
    );
    // The ledgers hold both allocations again, nothing more.
    let stats = &lines[first + 9];
    assert!(stats.starts_with("abistats 0 -> 0 size="), "{stats}");
    assert!(
        stats.contains(&format!(" allocations={} ", 65 * MIB)),
        "{stats}"
    );
    assert!(
        stderr.contains("parked: 67108864 bytes moved to host memory by the shim and 1048576 by the driver's checkpoint"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the blocks come back next") && stderr.contains("(moved by the shim; "),
        "{stderr}"
    );
}

/// With `shim+checkpoint`, a checkpoint the driver refuses leaves the park
/// as the shim's moves made it (the rest stays on the GPU, said once), and
/// the next call brings the block back without a restore.
#[test]
fn shim_then_a_refused_checkpoint_parks_as_shim_does() {
    let env = move_env(
        "shim+checkpoint",
        &[
            ("VRAMCAP_LOG", "info"),
            ("STANDIN_CHECKPOINT_FAIL", "checkpoint"),
        ],
    );
    let args = [
        "init", "alloc", "64M", "alloc", "1M", "memset32", "0", "64M", "77", "wait", "kinds",
        "ckstate", "read32", "0", "ckstate", "wait",
    ];
    let (lines, stderr) = parked_once(&env, &args, "64.0 MiB");
    let first = 0;
    assert_eq!(
        kinds_line(&lines, first),
        "kinds dev=0 device=1048576 managed_host=0 | kinds dev=1 device=0 managed_host=0 | kinds host=0",
        "{lines:?}"
    );
    assert_eq!(
        lines[first + 3],
        "ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0"
    );
    assert_eq!(lines[first + 4], "read32 #0 -> 0 value=77", "{lines:?}");
    assert_eq!(
        lines[first + 5],
        "ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0"
    );
    said(
        &stderr,
        "the driver's checkpoint of the rest was refused",
        1,
    );
    assert!(stderr.contains("(moved by the shim; "), "{stderr}");
}

/// A group budget lowered while parked below the blocks and what the
/// process still holds, but not below the blocks alone (the review of
/// 09e3a45): the next call resumes it over the budget in every mode,
/// contents intact; it never waits for room no other process can make.
/// With `shim`, the rest stayed charged; with `shim+checkpoint` it was
/// restored first.
fn resumes_over_a_group_lowered_below_blocks_and_rest(mode: &str) {
    let dir = scratch_dir();
    let group = format!("low{}-{}", mode.len(), std::process::id());
    let env = [
        MANUAL,
        (MOVE.0, mode),
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", group.as_str()),
        ("VRAMCAP_LOG", "info"),
    ];
    let args = [
        "init", "alloc", "1G", "alloc", "1M", "memset32", "0", "1G", "9", "wait", "read32", "0",
        "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    let _ = park(&dir, pid);
    let ran = crate::park_util::cli(&dir, &["limit", "--group", &group, "1GiB"]);
    assert!(ran.out.status.success(), "{}", ran.stderr());
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{mode}: {lines:?} {stderr}");
    // The stand-in gives a plain 1 GiB allocation no memory (it reads
    // zeros); the shim's VMM blocks keep their contents.
    let want = if mode == "checkpoint" {
        "read32 #0 -> 0 value=0"
    } else {
        "read32 #0 -> 0 value=9"
    };
    assert!(
        lines.iter().any(|l| l == want),
        "{mode}: {lines:?} {stderr}"
    );
    assert_eq!(
        stderr
            .matches("resuming over the group's cap of 1073741824 bytes")
            .count(),
        1,
        "{mode}: {stderr}"
    );
}

#[test]
fn shim_then_checkpoint_resumes_over_a_group_lowered_below_blocks_and_rest() {
    resumes_over_a_group_lowered_below_blocks_and_rest("shim+checkpoint");
}

#[test]
fn shim_resumes_over_a_group_lowered_below_blocks_and_rest() {
    resumes_over_a_group_lowered_below_blocks_and_rest("shim");
}

#[test]
fn checkpoint_resumes_over_a_group_lowered_below_everything_held() {
    resumes_over_a_group_lowered_below_blocks_and_rest("checkpoint");
}

/// With `shim+checkpoint`, a process whose ledger holds nothing but its
/// block parks with no rest (the review of 09e3a45); its resume still
/// measures the GPU's free memory before the driver's restore, and on a
/// full GPU it waits, restoring nothing, until the room is there.
#[test]
fn shim_then_checkpoint_checks_room_for_the_blocks_before_restoring() {
    let dir = scratch_dir();
    let foreign = dir.join("foreign-mib");
    std::fs::write(&foreign, "0").expect("write the foreign MiB");
    let f = foreign.to_str().expect("a UTF-8 path").to_string();
    let env = [
        MANUAL,
        (MOVE.0, "shim+checkpoint"),
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_LIMIT", "4GiB"),
        ("VRAMCAP_LOG", "info"),
        ("STANDIN_FOREIGN_FILE", f.as_str()),
    ];
    let mut h = Watched::start(
        &dir,
        &env,
        &["init", "alloc", "64M", "wait", "read32", "0", "wait"],
    );
    let pid = h.pid;
    let _ = park(&dir, pid);
    std::fs::write(&foreign, "16380").expect("fill the GPU");
    let refused = crate::park_util::cli(&dir, &["resume", "--pid", &pid.to_string()]);
    assert_eq!(refused.out.status.code(), Some(1), "{}", refused.stderr());
    std::fs::write(&foreign, "0").expect("empty the GPU");
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{lines:?} {stderr}");
    assert!(
        lines.iter().any(|l| l == "read32 #0 -> 0 value=0"),
        "{lines:?}"
    );
    said(&stderr, "the driver's restore and unlock took", 1);
}

/// The host memory kept for parks is on the page (its tail): `stat --json`
/// shows it once a resume is done, the table says it beside the command,
/// and `vramcap trim` gives it back and shows 0 (issue 43: how much is
/// held, and when it is given back).
#[test]
fn host_memory_kept_for_parks_shows_in_stat_until_a_trim() {
    let dir = scratch_dir();
    let env = moved_env(&[]);
    let args = [
        "init", "alloc", "64M", "wait", "read32", "0", "wait", "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    assert_eq!(host_kept(&dir), 0);
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 64.0 MiB moved to host memory and released"
    )]);
    // Parked: the host memory holds the block; none is kept aside.
    assert_eq!(host_kept(&dir), 0);
    h.resume();
    h.until("wait");
    assert_eq!(host_kept(&dir), 64 * MIB);
    let table = crate::park_util::cli(&dir, &["stat"]).ok_lines().join("\n");
    assert!(
        table.contains("[64.0 MiB host memory kept for parking] "),
        "{table}"
    );
    crate::park_util::cli(&dir, &["trim", &pid.to_string()]).expect_lines(&[&format!(
        "{pid}: released 0 B (0 B still cached); gave back 64.0 MiB of host memory kept for parks"
    )]);
    assert_eq!(host_kept(&dir), 0);
    h.resume();
    h.until("wait");
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
}

/// Host pages kept for parks are pinned in a context: a reset of that
/// (primary) context gives them back first, while it can still unpin
/// them, and `stat` says none is kept.
#[test]
fn kept_host_pages_go_with_their_context() {
    let dir = scratch_dir();
    let env = moved_env(&[]);
    let args = [
        "init", "alloc", "64M", "wait", "read32", "0", "wait", "reset", "0", "wait",
    ];
    let mut h = Watched::start(&dir, &env, &args);
    let pid = h.pid;
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 64.0 MiB moved to host memory and released"
    )]);
    h.resume();
    h.until("wait");
    assert_eq!(host_kept(&dir), 64 * MIB);
    h.resume();
    h.until("wait");
    assert_eq!(h.lines[h.lines.len() - 2], "reset 0 -> 0", "{:?}", h.lines);
    assert_eq!(host_kept(&dir), 0);
    let (lines, out) = h.end();
    assert!(out.status.success(), "{lines:?}");
}

/// Under the shim's moves, a block is VMM memory, which cannot be shared
/// with another process: `cuIpcGetMemHandle` on it is refused with
/// `CUDA_ERROR_INVALID_VALUE` and one line that names the setting and the
/// way out; an allocation below the granularity is shared as before.
#[test]
fn ipc_of_a_block_is_refused_naming_the_park_move() {
    let dir = scratch_dir();
    let mut env = moved_env(&[]);
    let dir_text = dir.to_str().expect("a UTF-8 path").to_string();
    env.push(("VRAMCAP_STATS_DIR", dir_text.as_str()));
    let out = client(
        "procaddr",
        &env,
        &[
            "init", "alloc", "64M", "alloc", "1M", "ipc", "0", "ipc", "1",
        ],
    );
    let lines = out.ok_lines();
    assert_eq!(lines[3..], ["ipc #0 -> 1", "ipc #1 -> 0"][..], "{lines:?}");
    let stderr = out.stderr();
    said(
        &stderr,
        "is VMM memory for the shim's parking moves (VRAMCAP_PARK_MOVE=shim, the default with VRAMCAP_PARK, or shim+checkpoint), which cannot be shared with other processes; use VRAMCAP_PARK_MOVE=checkpoint to share memory",
        1,
    );
}

/// Host memory refused (the stand-in's `STANDIN_HOST_REGISTER_FAIL`, as a
/// locked-memory or container limit makes the driver do): the block stays
/// on the GPU, the process says why once, and its contents and ledger are
/// untouched.
#[test]
fn host_memory_refused_leaves_the_block_on_the_gpu_and_says_why() {
    let env = moved_env(&[("VRAMCAP_LOG", "info"), ("STANDIN_HOST_REGISTER_FAIL", "1")]);
    let args = [
        "init", "alloc", "64M", "memset32", "0", "64M", "5", "wait", "kinds", "read32", "0",
        "abistats", "0", "wait",
    ];
    let (lines, stderr) = parked_once(&env, &args, "0 B");
    let first = 0;
    assert_eq!(
        lines[first], "kinds dev=0 device=67108864 managed_host=0",
        "{lines:?}"
    );
    assert_eq!(lines[first + 3], "read32 #0 -> 0 value=5", "{lines:?}");
    assert!(
        lines[first + 4].contains(&format!(" allocations={} ", 64 * MIB)),
        "{lines:?}"
    );
    said(
        &stderr,
        "parking: the driver gave no host memory for a block of 67108864 bytes (error 2: a locked-memory limit, `ulimit -l`, or a container's memory limit refuses pinned memory); such blocks stay on the GPU",
        1,
    );
}

/// A park whose blocks do not all fit in the host memory allowed for parked
/// blocks (`VRAMCAP_SPILL_LIMIT`) moves those that fit, leaves the others
/// on the GPU and says so once, naming the setting (the H200 found a
/// 40 GiB notebook parked 31 GiB under the old default, silently).
#[test]
fn blocks_past_the_host_limit_stay_and_the_park_says_so() {
    let env = moved_env(&[("VRAMCAP_LOG", "info"), ("VRAMCAP_SPILL_LIMIT", "96MiB")]);
    let args = [
        "init", "alloc", "64M", "alloc", "64M", "memset32", "0", "64M", "5", "memset32", "1",
        "64M", "6", "wait", "read32", "0", "read32", "1", "wait",
    ];
    let (lines, stderr) = parked_once(&env, &args, "64.0 MiB");
    assert_eq!(
        lines[..2],
        ["read32 #0 -> 0 value=5", "read32 #1 -> 0 value=6"],
        "{lines:?}"
    );
    said(
        &stderr,
        "parking: 1 block (67108864 bytes) stay on GPU 0: the host memory for parked blocks is used up (VRAMCAP_SPILL_LIMIT; e.g. VRAMCAP_SPILL_LIMIT=90% allows more)",
        1,
    );
}

/// The program's own VMM memory (PyTorch's expandable segments, XLA's
/// allocators): mapped whole and granted access through the functions
/// `cuGetProcAddress` hands out, it parks and comes back like a block,
/// its contents kept. The H200 found a JAX process parked with nothing
/// moved (session 17): `cuMemSetAccess` was handed out only under tiered
/// spill, so such memory was never marked movable.
#[test]
fn the_programs_own_vmm_memory_parks_and_comes_back() {
    let env = moved_env(&[]);
    let args = [
        "init", "vmm", "64M", "vmmmap", "%0", "memset32", "%0", "64M", "9", "wait", "read32", "%0",
        "wait",
    ];
    let (lines, _) = parked_once(&env, &args, "64.0 MiB");
    assert_eq!(lines[0], "read32 %0 -> 0 value=9", "{lines:?}");
}
