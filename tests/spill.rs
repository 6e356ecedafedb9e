//! Spill past the cap into host memory, against the stand-in driver: the
//! device never holds more than the cap, spilled memory is where the mode
//! says, everything comes back on free, and the spill limit holds.

use std::time::{Duration, Instant};

use crate::util::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn env(mode: &str) -> Vec<(&str, &str)> {
    vec![
        ("VRAMCAP_LIMIT", "1GiB"),
        ("VRAMCAP_SPILL", mode),
        ("VRAMCAP_SPILL_LIMIT", "1GiB"),
        ("VRAMCAP_CACHE", "off"),
    ]
}

/// What the shim says, without its `vramcap[PID]: ` prefix, a line each.
fn said(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .map(|l| {
            l.strip_prefix("vramcap[")
                .and_then(|l| l.split_once("]: "))
                .map_or(l, |(_, r)| r)
        })
        .collect()
}

/// The one line for the removed managed mode (docs/design/spill-modes.md).
const MANAGED_AS_HOST: &str = "VRAMCAP_SPILL=managed is taken as host (e.g. VRAMCAP_SPILL=host): managed memory past the cap could be moved onto the GPU by the program, unseen by NVML";

/// `VRAMCAP_SPILL=managed` (a removed mode) is host spill, said in one
/// line at load; `vramcap doctor` says it too.
#[test]
fn managed_is_taken_as_host_with_one_line() {
    let args = [
        "init", "fill", "128M", "kinds", "info", "ptrkind", "0", "ptrkind", "15", "freeall",
        "kinds",
    ];
    let host = client("procaddr", &env("host"), &args);
    host.expect_lines(&[
        "init -> 0",
        // 8 chunks on the device, 8 spilled, then the spill limit.
        &format!("fill 134217728 -> 16 allocs {} bytes rc=2", 2 * GIB),
        &format!("kinds dev=0 device={GIB} managed_host=0"),
        "kinds dev=1 device=0 managed_host=0",
        &format!("kinds host={GIB}"),
        // The device reports its cap, not the spill.
        &format!("info -> 0 free=0 total={GIB}"),
        "ptrkind #0 = device",
        "ptrkind #15 = host",
        "freeall -> 16 freed rc=0",
        "kinds dev=0 device=0 managed_host=0",
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
    ]);
    let managed = client("procaddr", &env("managed"), &args);
    assert_eq!(managed.ok_lines(), host.ok_lines());
    let host_said = host.stderr();
    let mut want = vec![MANAGED_AS_HOST];
    want.extend(said(&host_said));
    assert_eq!(said(&managed.stderr()), want);
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", scratch_dir())
        .env("VRAMCAP_SPILL", "managed")
        .arg("doctor");
    let lines = run(cmd).ok_lines();
    let note = format!("note  spill: {MANAGED_AS_HOST}");
    assert_eq!(lines.iter().filter(|l| **l == note).count(), 1, "{lines:?}");
}

/// Host spill (asked for as host or as managed) takes `cudaMalloc` memory
/// only: VMM memory past the cap is refused, with one line that says so and
/// names the mode that spills it; tiered spill makes it host memory instead.
#[test]
fn vmm_memory_past_the_cap_spills_only_under_tiered_spill() {
    for mode in ["host", "managed"] {
        let ran = client(
            "procaddr",
            &env(mode),
            &["init", "vmm", "512M", "vmm", "512M", "vmm", "512M"],
        );
        ran.expect_lines(&[
            "init -> 0",
            "vmm 536870912 -> 0 %0",
            "vmm 536870912 -> 0 %1",
            "vmm 536870912 -> 2",
        ]);
        let want = "cuMemCreate: VMM memory is not spilled by VRAMCAP_SPILL=host (it takes cudaMalloc memory only), so past the cap it is refused; VRAMCAP_SPILL=tiered spills it (PyTorch allocates this way with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)";
        assert_eq!(ran.stderr().matches(want).count(), 1, "{}", ran.stderr());
    }
    let ran = client(
        "procaddr",
        &env("tiered"),
        &[
            "init", "vmm", "512M", "vmm", "512M", "vmm", "512M", "standin", "counts",
        ],
    );
    let lines = ran.ok_lines();
    assert_eq!(
        lines[..5],
        [
            "init -> 0",
            "vmm 536870912 -> 0 %0",
            "vmm 536870912 -> 0 %1",
            "vmm 536870912 -> 0 %2",
            &format!("standin dev=0 used={} peak={}", GIB, GIB),
        ]
    );
    assert!(lines[6].contains(" vmm=2 vmm_host=1 "), "{}", lines[6]);
    assert_eq!(ran.stderr(), "", "nothing is said of spill");
    // Without spill, only the refusal is said, and nothing of spill.
    let ran = capped("procaddr", "1GiB", &["init", "vmm", "1G", "vmm", "512M"]);
    ran.expect_lines(&["init -> 0", "vmm 1073741824 -> 0 %0", "vmm 536870912 -> 2"]);
    // Only the refusal's own line.
    assert_eq!(
        said(&ran.stderr()),
        [
            "cuMemCreate: refused 536870912 bytes on device 0: 1073741824 of the 1073741824-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
        ],
        "{}",
        ran.stderr()
    );
}

#[test]
fn host_spill_uses_pinned_mapped_memory() {
    client(
        "linked",
        &env("host"),
        &[
            "init", "fill", "128M", "kinds", "ptrkind", "8", "freeall", "kinds",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        &format!("fill 134217728 -> 16 allocs {} bytes rc=2", 2 * GIB),
        &format!("kinds dev=0 device={GIB} managed_host=0"),
        "kinds dev=1 device=0 managed_host=0",
        &format!("kinds host={GIB}"),
        "ptrkind #8 = host",
        "freeall -> 16 freed rc=0",
        "kinds dev=0 device=0 managed_host=0",
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
    ]);
}

#[test]
fn off_spills_nothing() {
    client("procaddr", &env("off"), &["init", "fill", "128M", "kinds"]).expect_lines(&[
        "init -> 0",
        &format!("fill 134217728 -> 8 allocs {GIB} bytes rc=2"),
        &format!("kinds dev=0 device={GIB} managed_host=0"),
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
    ]);
}

#[test]
fn other_paths_spill_or_refuse_as_documented() {
    client(
        "procaddr",
        &env("host"),
        &[
            "init",
            "alloc",
            "1G",
            "pitch",
            "1000",
            "1024",
            "4",
            "stream",
            "allocasync",
            "64M",
            "vmm",
            "64M",
            "array",
            "1000",
            "64",
            "0x20",
            "4",
            "kinds",
            "freeasync",
            "2",
            "free",
            "1",
            "kinds",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "alloc 1073741824 -> 0 #0",
        // Pitched and stream-ordered requests spill...
        "pitch 1000 1024 4 -> 0 pitch=1024 #1",
        "stream -> 0",
        "allocasync 67108864 -> 0 #2",
        // ...VMM handles and arrays cannot.
        "vmm 67108864 -> 2",
        "array 1000 64 0x20 4 -> 2",
        &format!("kinds dev=0 device={GIB} managed_host=0"),
        "kinds dev=1 device=0 managed_host=0",
        &format!("kinds host={}", MIB + 64 * MIB),
        // A stream-ordered free of spilled memory is done when the stream
        // gets there (the driver refuses cuMemFreeAsync on host memory).
        "freeasync #2 -> 0",
        "free #1 -> 0",
        &format!("kinds dev=0 device={GIB} managed_host=0"),
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
    ]);
}

/// The program's own managed memory past the cap is refused in every mode
/// (it could move spilled managed pages onto the GPU, unseen by NVML);
/// where spill is on, one line says why it was not spilled.
#[test]
fn the_programs_managed_memory_past_the_cap_is_refused_in_every_mode() {
    let why = "cuMemAllocManaged: managed memory past the cap is not spilled (the program could move it onto the GPU); refusing";
    for mode in ["off", "host", "tiered", "managed"] {
        let ran = client(
            "procaddr",
            &env(mode),
            &["init", "managed", "768M", "managed", "512M", "kinds"],
        );
        ran.expect_lines(&[
            "init -> 0",
            "managed 805306368 -> 0 #0",
            "managed 536870912 -> 2",
            &format!("kinds dev=0 device={} managed_host=0", 768 * MIB),
            "kinds dev=1 device=0 managed_host=0",
            "kinds host=0",
        ]);
        let want = usize::from(mode != "off");
        assert_eq!(
            ran.stderr().matches(why).count(),
            want,
            "{mode}: {}",
            ran.stderr()
        );
    }
}

#[test]
fn bad_spill_settings_are_refused() {
    for (var, value, msg) in [
        (
            "VRAMCAP_SPILL",
            "disk",
            "VRAMCAP_SPILL=\"disk\" is not valid: expected off, host or tiered (e.g. VRAMCAP_SPILL=host)",
        ),
        (
            "VRAMCAP_SPILL_LIMIT",
            "lots",
            "VRAMCAP_SPILL_LIMIT=\"lots\" is not valid: expected a size (e.g. 8GiB) or a percentage of the machine's memory (e.g. 25%)",
        ),
        (
            "VRAMCAP_SPILL_LIMIT",
            "150%",
            "VRAMCAP_SPILL_LIMIT=\"150%\" is not valid",
        ),
    ] {
        let ran = client("procaddr", &[(var, value)], &["init"]);
        ran.expect_code(2);
        assert!(ran.stderr().contains(msg), "{}", ran.stderr());
    }
}

#[test]
fn spilled_bytes_show_in_stat() {
    let dir = scratch_dir();
    let mut cmd = shimmed(&artefacts().client);
    cmd.env("VRAMCAP_STATS_DIR", &dir).envs(env("host")).args([
        "procaddr", "init", "fill", "256M", "wait", "freeall", "wait",
    ]);
    let mut h = Held::at_wait(cmd);
    let figures = |d: &Value, keys: [&str; 3]| keys.map(|k| d[k].as_u64());
    let d = stat_device0(&dir, h.pid());
    assert_eq!(
        figures(&d, ["used_bytes", "spilled_bytes", "spill_allocations"]),
        [Some(GIB), Some(GIB), Some(4)],
        "{d}"
    );
    assert_eq!(d["allocations"], 8);
    h.resume();
    h.until("wait");
    let d = stat_device0(&dir, h.pid());
    assert_eq!(
        figures(&d, ["used_bytes", "spilled_bytes", "frees"]),
        [Some(0), Some(0), Some(8)],
        "{d}"
    );
    h.finish();
}

/// The deferred stream-ordered free of spilled memory happens from the
/// background thread even when the program makes no more CUDA calls.
#[test]
fn deferred_frees_complete_in_a_quiet_process() {
    let dir = scratch_dir();
    let mut cmd = shimmed(&artefacts().client);
    cmd.env("VRAMCAP_STATS_DIR", &dir).envs(env("host")).args([
        "procaddr",
        "init",
        "alloc",
        "1G",
        "stream",
        "allocasync",
        "256M",
        "freeasync",
        "1",
        "wait",
        "kinds",
    ]);
    let h = Held::at_wait(cmd);
    let start = Instant::now();
    loop {
        let d = stat_device0(&dir, h.pid());
        if d["spilled_bytes"] == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the deferred free never happened: {d}"
        );
        std::thread::yield_now();
    }
    let (lines, _) = h.finish();
    assert_eq!(
        lines[lines.len() - 3],
        format!("kinds dev=0 device={GIB} managed_host=0"),
        "{lines:?}"
    );
}
