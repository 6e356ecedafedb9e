//! `VRAMCAP_PARK_MOVE=shim` (issue 43): the shim parks a process by moving
//! its blocks (allocations of at least the VMM granularity, made as VMM
//! memory) to host memory itself, and back; the rest of the process stays
//! on the GPU, and the driver's checkpoint is never called.

use std::path::Path;

use crate::park_util::{MANUAL, park};
use crate::util::*;

const MOVE: (&str, &str) = ("VRAMCAP_PARK_MOVE", "shim");

/// The stand-in's view of the GPUs and the host after `label`: the lines
/// of `kinds`, as one.
fn kinds_line(lines: &[String], from: usize) -> String {
    lines[from..from + 3].join(" | ")
}

#[test]
fn a_park_moves_the_blocks_and_a_call_brings_them_back_intact() {
    let dir = scratch_dir();
    let env = [
        MANUAL,
        MOVE,
        ("VRAMCAP_LIMIT", "4GiB"),
        ("VRAMCAP_CACHE", "off"),
        ("VRAMCAP_LOG", "info"),
    ];
    let args = [
        "init", "alloc", "64M", "alloc", "1M", "memset32", "0", "64M", "77", "wait", "kinds",
        "ckstate", "read32", "0", "kinds", "counts", "wait", "kinds", "read32", "0", "counts",
        "wait",
    ];
    let mut h = held_in(&dir, &env, &args);
    let done = watchdog(h.pid());
    let pid = h.pid();
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
    let lines = h.lines.clone();
    let (_, out) = h.finish();
    let _ = done.send(());
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
    let vmm_host_after_one = count(&lines[first + 8], "vmm_host");
    assert_eq!(vmm_host_after_one, 1, "{lines:?}");
    let second = first + 11;
    assert_eq!(lines[second - 1], "resumed", "{lines:?}");
    assert_eq!(lines[second + 3], "read32 #0 -> 0 value=77", "{lines:?}");
    assert_eq!(count(&lines[second + 4], "vmm_host"), 1, "{lines:?}");
    assert_eq!(
        stderr.matches("moved to host memory by the shim").count(),
        2,
        "{stderr}"
    );
    assert_eq!(stderr.matches("(moved by the shim)").count(), 2, "{stderr}");
    assert!(!stderr.contains("checkpoint"), "{stderr}");
}

/// Refused at start: the shim's moves only with parking, and not with
/// host spill.
#[test]
fn park_move_shim_needs_parking_and_no_host_spill() {
    for (env, line) in [
        (
            vec![MOVE, ("VRAMCAP_LIMIT", "1GiB")],
            "VRAMCAP_PARK_MOVE=\"shim\" is not valid: expected checkpoint without VRAMCAP_PARK (shim applies to parking only), e.g. VRAMCAP_PARK=manual VRAMCAP_PARK_MOVE=shim",
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

#[allow(dead_code)]
fn unused(_: &Path) {}
