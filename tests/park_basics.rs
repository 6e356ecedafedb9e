//! Parking's core: `vramcap park` releases the process's page and its
//! group member ledger, and its next CUDA call resumes it with the exact
//! bytes re-reserved and its data and handles intact; a process that
//! cannot be parked safely (or whose checkpoint call fails) is refused
//! with one line and goes on; a parked member killed leaves the group's
//! ledger exact; with parking on, a launch is handed out through the gate.

use crate::park_util::*;
use crate::util::*;

/// Parking on, no cache, a cap and a group.
fn grouped(limit: &'static str, group: &'static str) -> [(&'static str, &'static str); 5] {
    [
        MANUAL,
        ("VRAMCAP_PARK_MOVE", "checkpoint"),
        NO_CACHE,
        ("VRAMCAP_LIMIT", limit),
        ("VRAMCAP_GROUP", group),
    ]
}

/// Parked, the process's page and its group member ledger hold nothing of
/// it; its next CUDA call resumes it, its pointer and the stand-in's block
/// unchanged (no allocation made or freed), and the ledgers hold the exact
/// bytes again.
#[test]
fn parked_releases_the_ledgers_and_the_next_call_resumes_with_data_intact() {
    let dir = scratch_dir();
    let env = grouped("4GiB", "pk");
    let mut h = held_in(
        &dir,
        &env,
        &[
            "init", "alloc", "1G", "ptr", "0", "wait", "ptr", "0", "info", "standin", "ckstate",
            "counts", "wait",
        ],
    );
    let pid = h.pid();
    let before = h.lines[2].clone();
    assert_eq!(stat_device0(&dir, pid)["used_bytes"], GIB);
    assert_eq!(group_used(&dir), (GIB, vec![GIB]));

    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 1.00 GiB moved to host memory and released"
    )]);
    assert_eq!(stat_device0(&dir, pid)["used_bytes"], 0);
    assert_eq!(stat_device0(&dir, pid)["parked_bytes"], GIB);
    assert_eq!(group_used(&dir), (0, vec![0]));
    let j = &stat(&dir)["processes"][0]["park"];
    assert_eq!(j["mode"], "manual");
    assert_eq!(j["state"], "parked");
    assert_eq!(j["parked_bytes"], GIB);
    assert!(j["parked_seconds"].as_f64().unwrap() >= 0.0, "{j}");
    let table = cli(&dir, &["stat"]).ok_lines();
    assert!(table[1].contains(" [parked 1.00 GiB, "), "{table:?}");
    // Parking twice is no change.
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 1.00 GiB moved to host memory and released"
    )]);

    h.resume();
    h.until("wait");
    let n = h.lines.len();
    assert_eq!(
        h.lines[n - 8..n - 1],
        [
            "resumed".to_string(),
            before,
            format!("info -> 0 free={} total={}", 3 * GIB, 4 * GIB),
            format!("standin dev=0 used={GIB} peak={GIB}"),
            "standin dev=1 used=0 peak=0".to_string(),
            "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0".to_string(),
            "counts alloc=1 free=0 getprocaddress=24 alias=0 sync=0 capture=0 ipc=0 async=0 vmm=0 vmm_host=0 array=0 host_bytes=0 managed_host_bytes=0 host_register=0 event=0".to_string(),
        ][..]
    );
    assert_eq!(stat_device0(&dir, pid)["used_bytes"], GIB);
    assert_eq!(stat_device0(&dir, pid)["parked_bytes"], 0);
    assert_eq!(stat(&dir)["processes"][0]["park"]["state"], "running");
    assert_eq!(group_used(&dir), (GIB, vec![GIB]));
    let (_, out) = h.finish();
    assert!(out.status.success());
}

/// A process that cannot be parked safely is refused with one line, in
/// the CLI (exit 1) and in the process's own stderr, and keeps running.
#[test]
fn refusals_say_why_in_one_line_and_the_process_goes_on() {
    let dir = scratch_dir();
    let cases: [(&[&str], &str); 3] = [
        (
            &["init", "managed", "64M", "wait", "standin"],
            "it holds managed (unified) memory, which neither the driver's checkpoint nor the shim's moves take",
        ),
        (
            &["init", "alloc", "1M", "ipc", "0", "wait", "standin"],
            "it exported GPU memory to other processes (an IPC or shareable handle), which the driver cannot checkpoint",
        ),
        (
            &[
                "init",
                "alloc",
                "1M",
                "stream",
                "capture-begin",
                "wait",
                "capture-end",
                "standin",
            ],
            "a stream capture is in progress",
        ),
    ];
    for (args, why) in cases {
        let mut h = held_in(&dir, &[MANUAL, ("VRAMCAP_PARK_MOVE", "checkpoint")], args);
        assert_refused(&dir, &mut h, why);
        h.resume();
        let (lines, out) = h.finish();
        assert!(out.status.success(), "{lines:?}");
        assert!(
            lines.last().unwrap().starts_with("standin dev=1"),
            "{lines:?}"
        );
    }
    // NCCL loaded (a library of that name mapped: a copy of the test's
    // libescape.so, preloaded after the shim) and two GPUs in use. NCCL
    // loaded with one GPU is no refusal (every PyTorch process maps it):
    // that process parks.
    let nccl = dir.join("libnccl.so.2");
    std::fs::copy(artefacts().standin_lib.join("libescape.so"), &nccl).unwrap();
    let preload = format!("{} {}", artefacts().shim.display(), nccl.display());
    let env = [
        MANUAL,
        ("VRAMCAP_PARK_MOVE", "checkpoint"),
        ("LD_PRELOAD", preload.as_str()),
    ];
    let h = held_in(&dir, &env, &["init", "alloc", "1M", "wait"]);
    let pid = h.pid();
    park(&dir, pid).expect_lines(&[&format!(
        "{pid}: parked, 1.00 MiB moved to host memory and released"
    )]);
    let (_, out) = h.finish();
    assert!(out.status.success());
    let mut h = held_in(
        &dir,
        &env,
        &["init", "alloc", "1M", "ctx", "1", "alloc", "1M", "wait"],
    );
    let why = "it has NCCL loaded and uses more than one GPU (NCCL's peer transfers cannot be checkpointed)";
    assert_refused(&dir, &mut h, why);
    let (_, out) = h.finish();
    assert!(out.status.success());
    // Not started with parking.
    let h = held_in(&dir, &[], &["init", "alloc", "1M", "wait"]);
    let pid = h.pid();
    park_refused(
        &dir,
        pid,
        &format!(
            "vramcap: process {pid} was not started with parking (VRAMCAP_PARK); start it as vramcap run --park manual …"
        ),
    );
    let (_, out) = h.finish();
    assert!(out.status.success());
    let ran = cli(&dir, &["park", "--pid", "1", "--idle", "soon"]);
    ran.expect_code(2);
    assert!(
        ran.stderr()
            .contains("\"soon\" is not a duration; e.g. 10m, 30s or 500ms"),
        "{}",
        ran.stderr()
    );
}

/// A parked member killed: the group's ledger holds exactly what the
/// living members hold, and they get the whole rest of the budget.
#[test]
fn a_parked_member_killed_leaves_the_group_ledger_exact() {
    let dir = scratch_dir();
    let env = grouped("2GiB", "kp");
    let a = held_in(&dir, &env, &["init", "alloc", "1G", "wait"]);
    let mut b = held_in(
        &dir,
        &env,
        &["init", "alloc", "512M", "wait", "fill", "64M", "wait"],
    );
    park(&dir, a.pid()).ok_lines();
    assert_eq!(group_used(&dir).0, 512 * MIB);
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    b.resume();
    b.until("wait");
    assert_eq!(
        b.lines[b.lines.len() - 2],
        format!("fill {} -> 24 allocs {} bytes rc=2", 64 * MIB, 1536 * MIB)
    );
    assert_eq!(group_used(&dir).0, 2 * GIB);
    let (_, out) = b.finish();
    assert!(out.status.success());
}

/// A member killed while a park holds it in the driver's lock (the
/// stand-in's `STANDIN_CHECKPOINT_HOLD`), with the driver's checkpoint and
/// with the shim's moves before it: the asker is answered, and the group's
/// ledger holds exactly what the living member holds, which then gets the
/// whole rest of the budget.
#[test]
fn a_member_killed_while_it_is_parked_leaves_the_group_ledger_exact() {
    for (mode, group) in [("checkpoint", "kc"), ("shim+checkpoint", "ks")] {
        let dir = scratch_dir();
        let fifo = dir.join("hold");
        let c = std::ffi::CString::new(fifo.to_str().expect("a UTF-8 path")).expect("no NUL");
        // SAFETY: a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        // Read and write, never written: the stand-in's Lock waits on it.
        let _hold = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .expect("open the FIFO");
        let fifo_text = fifo.to_str().expect("a UTF-8 path").to_string();
        let env = [
            grouped("2GiB", group).as_slice(),
            &[
                ("VRAMCAP_PARK_MOVE", mode),
                ("STANDIN_CHECKPOINT_HOLD", fifo_text.as_str()),
            ],
        ]
        .concat();
        let mut a = held_in(&dir, &env, &["init", "alloc", "1G", "wait"]);
        let mut b = held_in(
            &dir,
            &grouped("2GiB", group),
            &["init", "alloc", "512M", "wait", "fill", "64M", "wait"],
        );
        let pid = a.pid();
        let parker = {
            let dir = dir.clone();
            std::thread::spawn(move || park(&dir, pid))
        };
        stderr_until(&mut a, "standin: lock held");
        a.child.kill().expect("kill the member");
        a.child.wait().expect("reap it");
        let asked = parker.join().expect("the park was answered");
        asked.expect_code(1);
        assert_eq!(
            asked.stderr(),
            format!("vramcap: {pid} ended before it answered; nothing more can be asked of it\n"),
            "{mode}"
        );
        b.resume();
        b.until("wait");
        assert_eq!(
            b.lines[b.lines.len() - 2],
            format!("fill {} -> 24 allocs {} bytes rc=2", 64 * MIB, 1536 * MIB),
            "{mode}"
        );
        assert_eq!(group_used(&dir).0, 2 * GIB, "{mode}");
        let (_, out) = b.finish();
        assert!(out.status.success(), "{mode}");
    }
}

/// With parking on, `cuGetProcAddress` hands out the shim's forwarder for
/// a launch (a hook only under tiered spill), so that a parked process's
/// launch reaches the gate before the driver's lock (tests/forward.rs
/// tells a forwarder from a hook).
#[test]
fn with_parking_a_launch_is_handed_out_by_the_shim_so_it_passes_the_gate() {
    let args = ["init", "resolve", "cuLaunchKernel", "13000", "0"];
    client(
        "procaddr",
        &[MANUAL, ("VRAMCAP_PARK_MOVE", "checkpoint")],
        &args,
    )
    .expect_lines(&[
        "init -> 0",
        "resolve cuLaunchKernel 13000 0 -> 0 status=0 lib=libvramcap.so",
    ]);
    client("procaddr", &[], &args).expect_lines(&[
        "init -> 0",
        "resolve cuLaunchKernel 13000 0 -> 0 status=0 lib=libcuda.so.1",
    ]);
}

/// A checkpoint that fails, then an unlock that fails too: the driver
/// holds the process for good. The park is refused as stuck, the state is
/// `failed`, and the program's next call answers `CUDA_ERROR_ILLEGAL_STATE`
/// (401) instead of waiting in the locked driver for ever.
#[test]
fn a_failed_checkpoint_whose_unlock_fails_leaves_the_process_failed_not_hung() {
    let dir = scratch_dir();
    let fail = [("STANDIN_CHECKPOINT_FAIL", "checkpoint,unlock")];
    let env = [grouped("4GiB", "fu").as_slice(), &fail].concat();
    let mut h = held_in(&dir, &env, &["init", "alloc", "1G", "wait", "alloc", "1M"]);
    let pid = h.pid();
    park_refused(
        &dir,
        pid,
        &format!(
            "vramcap: {pid}: cannot park: the driver's restore or unlock failed (error 999): the process is stuck and cannot continue"
        ),
    );
    assert_eq!(stat(&dir)["processes"][0]["park"]["state"], "failed");
    h.resume();
    let (lines, out) = h.finish();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("alloc 1048576 -> 401"),
        "{lines:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr
            .matches("its CUDA calls answer CUDA_ERROR_ILLEGAL_STATE from now on")
            .count(),
        1,
        "{stderr}"
    );
}

/// A checkpoint call that fails (the stand-in's STANDIN_CHECKPOINT_FAIL):
/// refused with the driver's error, nothing released, the process
/// unlocked and running on.
#[test]
fn a_failing_checkpoint_call_releases_nothing_and_unlocks() {
    for call in ["lock", "checkpoint"] {
        let dir = scratch_dir();
        let fail = [("STANDIN_CHECKPOINT_FAIL", call)];
        let env = [grouped("4GiB", "fl").as_slice(), &fail].concat();
        let mut h = held_in(
            &dir,
            &env,
            &["init", "alloc", "1G", "wait", "info", "ckstate"],
        );
        let pid = h.pid();
        park_refused(
            &dir,
            pid,
            &format!(
                "vramcap: {pid}: cannot park: the driver's checkpoint call failed (error 999)"
            ),
        );
        assert_eq!(stat_device0(&dir, pid)["used_bytes"], GIB);
        assert_eq!(group_used(&dir), (GIB, vec![GIB]));
        assert_eq!(stat(&dir)["processes"][0]["park"]["state"], "running");
        h.resume();
        let (lines, out) = h.finish();
        assert!(out.status.success(), "{lines:?}");
        assert_eq!(
            lines[lines.len() - 2..],
            [
                format!("info -> 0 free={} total={}", 3 * GIB, 4 * GIB),
                "ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0".to_string(),
            ][..],
            "{call}"
        );
    }
}
