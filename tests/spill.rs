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

#[test]
fn managed_spill_fills_the_cap_then_the_host() {
    client(
        "procaddr",
        &env("managed"),
        &[
            "init", "fill", "128M", "kinds", "info", "ptrkind", "0", "ptrkind", "15", "freeall",
            "kinds",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        // 8 chunks on the device, 8 spilled, then the spill limit.
        &format!("fill 134217728 -> 16 allocs {} bytes rc=2", 2 * GIB),
        &format!("kinds dev=0 device={GIB} managed_host={GIB}"),
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
        // The device reports its cap, not the spill.
        &format!("info -> 0 free=0 total={GIB}"),
        "ptrkind #0 = device",
        "ptrkind #15 = managed-host",
        "freeall -> 16 freed rc=0",
        "kinds dev=0 device=0 managed_host=0",
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
    ]);
}

/// Host and managed spill take `cudaMalloc` memory only: VMM memory past
/// the cap is refused, with one line that says so and names the mode that
/// spills it; tiered spill makes it host memory instead.
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
        let want = format!(
            "cuMemCreate: VMM memory is not spilled by VRAMCAP_SPILL={mode} (it takes cudaMalloc memory only), so past the cap it is refused; VRAMCAP_SPILL=tiered spills it (PyTorch allocates this way with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
        );
        assert_eq!(ran.stderr().matches(&want).count(), 1, "{}", ran.stderr());
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
    let ran = client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "1GiB")],
        &["init", "vmm", "1G", "vmm", "512M"],
    );
    ran.expect_lines(&["init -> 0", "vmm 1073741824 -> 0 %0", "vmm 536870912 -> 2"]);
    // Only the refusal's own line (after its `vramcap[PID]: `).
    let stderr = ran.stderr();
    let said: Vec<&str> = stderr
        .lines()
        .map(|l| {
            l.strip_prefix("vramcap[")
                .and_then(|l| l.split_once("]: "))
                .map_or(l, |(_, r)| r)
        })
        .collect();
    assert_eq!(
        said,
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
        &env("managed"),
        &[
            "init",
            "alloc",
            "1G",
            "pitch",
            "1000",
            "1024",
            "4",
            "managed",
            "64M",
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
            "3",
            "free",
            "1",
            "free",
            "2",
            "kinds",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "alloc 1073741824 -> 0 #0",
        // Pitched, managed and stream-ordered requests spill...
        "pitch 1000 1024 4 -> 0 pitch=1024 #1",
        "managed 67108864 -> 0 #2",
        "stream -> 0",
        "allocasync 67108864 -> 0 #3",
        // ...VMM handles and arrays cannot.
        "vmm 67108864 -> 2",
        "array 1000 64 0x20 4 -> 2",
        &format!("kinds dev=0 device={GIB} managed_host={}", MIB + 128 * MIB),
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
        // A stream-ordered free of spilled memory is done when the stream
        // gets there (the driver refuses cuMemFreeAsync on managed memory).
        "freeasync #3 -> 0",
        "free #1 -> 0",
        "free #2 -> 0",
        &format!("kinds dev=0 device={GIB} managed_host=0"),
        "kinds dev=1 device=0 managed_host=0",
        "kinds host=0",
    ]);
}

#[test]
fn no_spill_without_concurrent_managed_access() {
    let mut e = env("managed");
    e.push(("STANDIN_CONCURRENT_MANAGED", "0"));
    let ran = client("procaddr", &e, &["init", "fill", "512M"]);
    assert_eq!(
        ran.ok_lines(),
        [
            "init -> 0",
            "fill 536870912 -> 2 allocs 1073741824 bytes rc=2"
        ]
    );
    assert!(
        ran.stderr().contains(
            "device 0 has no concurrent managed access; VRAMCAP_SPILL=managed cannot spill there"
        ),
        "{}",
        ran.stderr()
    );
}

#[test]
fn bad_spill_settings_are_refused() {
    for (var, value, msg) in [
        (
            "VRAMCAP_SPILL",
            "disk",
            "VRAMCAP_SPILL=\"disk\" is not valid: expected off, managed, host or tiered (e.g. VRAMCAP_SPILL=tiered)",
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
    let mut h = Held::spawn(cmd);
    h.until("wait");
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
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .envs(env("managed"))
        .args([
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
    let mut h = Held::spawn(cmd);
    h.until("wait");
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
