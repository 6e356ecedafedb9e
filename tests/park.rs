//! Parking (`crates/shim/src/engine/park/`, docs/parking.md) against the
//! stand-in's checkpoint model (`tests/standin/checkpoint_standin.c`):
//! the ledgers released and re-reserved exactly, the data and handles
//! intact across a transparent resume, the refusals with their lines, and
//! a resume that never restores without room. One fresh process per case.

use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::util::*;

const MANUAL: (&str, &str) = ("VRAMCAP_PARK", "manual");
const NO_CACHE: (&str, &str) = ("VRAMCAP_CACHE", "off");

/// Parking on, no cache, a cap and a group.
fn grouped(limit: &'static str, group: &'static str) -> [(&'static str, &'static str); 4] {
    [
        MANUAL,
        NO_CACHE,
        ("VRAMCAP_LIMIT", limit),
        ("VRAMCAP_GROUP", group),
    ]
}

/// `vramcap park --pid PID`.
fn park(dir: &Path, pid: u32) -> Ran {
    cli(dir, &["park", "--pid", &pid.to_string()])
}

/// `vramcap park --pid PID` exits 1 with `line` alone on stderr; the run,
/// for more checks.
fn park_refused(dir: &Path, pid: u32, line: &str) -> Ran {
    let ran = park(dir, pid);
    ran.expect_code(1);
    assert_eq!(ran.stderr(), format!("{line}\n"));
    ran
}

/// `vramcap park --pid` of `h` is refused with `why`: exit 1, nothing on
/// stdout, one line on stderr, and the same line on the process's stderr.
fn assert_refused(dir: &Path, h: &mut Held, why: &str) {
    let pid = h.pid();
    let ran = park_refused(dir, pid, &format!("vramcap: {pid}: cannot park: {why}"));
    assert_eq!(ran.stdout(), "");
    assert_eq!(
        stderr_until(h, "cannot park"),
        format!("vramcap[{pid}]: cannot park: {why}")
    );
}

fn cli(dir: &Path, args: &[&str]) -> Ran {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).args(args);
    run(cmd)
}

fn stat(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&cli(dir, &["stat", "--json"]).ok_lines().join("")).unwrap()
}

/// The group's bytes held on its first GPU, and each member's ledger.
fn group_used(dir: &Path) -> (u64, Vec<u64>) {
    let j = stat(dir);
    let g = &j["groups"][0];
    let members = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["held_bytes"][0].as_u64().unwrap())
        .collect();
    (g["devices"][0]["used_bytes"].as_u64().unwrap(), members)
}

/// Reads `h`'s stderr until a line containing `want`; returns the line.
fn stderr_until(h: &mut Held, want: &str) -> String {
    let err = h.child.stderr.as_mut().expect("piped stderr");
    let mut r = BufReader::new(err);
    loop {
        let mut l = String::new();
        assert!(
            r.read_line(&mut l).expect("read stderr") > 0,
            "stderr ended before {want:?}"
        );
        if l.contains(want) {
            return l.trim_end().to_string();
        }
    }
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
            "counts alloc=1 free=0 getprocaddress=22 alias=0 sync=0 capture=0 ipc=0 async=0 vmm=0 vmm_host=0 array=0 host_bytes=0 managed_host_bytes=0 event=0".to_string(),
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
            "it holds managed (unified) memory, which the driver's checkpoint refuses",
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
        let mut h = held_in(&dir, &[MANUAL], args);
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
    let env = [MANUAL, ("LD_PRELOAD", preload.as_str())];
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

/// With the GPU full (other processes hold it: the stand-in's
/// STANDIN_FOREIGN_FILE), `vramcap resume` refuses, with `--wait` too once
/// the time is up, and the program's next call waits, saying so once; the
/// stand-in's restore is never tried without room (no failure, never
/// stuck), and once room comes the process resumes by itself.
#[test]
fn resume_without_room_waits_or_refuses_and_never_restores() {
    let dir = scratch_dir();
    let foreign = dir.join("foreign-mib");
    std::fs::write(&foreign, "0").unwrap();
    let foreign_env = foreign.to_str().unwrap().to_string();
    let env = [
        MANUAL,
        NO_CACHE,
        ("STANDIN_FOREIGN_FILE", foreign_env.as_str()),
    ];
    let mut h = held_in(
        &dir,
        &env,
        &["init", "alloc", "1G", "wait", "ckstate", "info", "ckstate"],
    );
    let pid = h.pid().to_string();
    park(&dir, h.pid()).ok_lines();
    // 16 GiB devices: 15.5 GiB held by others leaves less than 1 GiB + 64 MiB.
    std::fs::write(&foreign, "15872").unwrap();
    for extra in [&[][..], &["--wait", "300ms"][..]] {
        let mut args = vec!["resume", "--pid", pid.as_str()];
        args.extend_from_slice(extra);
        let ran = cli(&dir, &args);
        ran.expect_code(1);
        assert_eq!(
            ran.stderr(),
            format!("vramcap: {pid}: cannot resume: no room on GPU 0 for its parked memory\n")
        );
    }
    // The program calls CUDA: it waits at the gate, and says why once.
    h.resume();
    h.until("resumed");
    let line = stderr_until(&mut h, "waiting for");
    assert!(
        line.starts_with(&format!("vramcap[{pid}]: this process was parked "))
            && line.ends_with("ago; waiting for 1.0 GiB on GPU 0 to resume"),
        "{line}"
    );
    // `ckstate` is the stand-in's inspection export, no driver call: the
    // process is still checkpointed, nothing failed.
    h.until("ckstate state=2 checkpoints=1 restores=0 failures=0 parked=1073741824");
    std::fs::write(&foreign, "0").unwrap();
    let (lines, out) = h.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines[lines.len() - 2..],
        [
            "info -> 0 free=16106127360 total=17179869184".to_string(),
            "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0".to_string(),
        ][..]
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

/// The idle policy: in a group whose budget is full, an allocation that
/// would be refused parks the member idle past its threshold and succeeds;
/// the parked member, calling CUDA again, waits for room in the group and
/// resumes once the other frees. Without a parkable member it is refused.
#[test]
fn an_allocation_the_group_would_refuse_parks_the_idle_member() {
    let dir = scratch_dir();
    let group = [
        NO_CACHE,
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", "pol"),
    ];
    // No member can be parked: refused, as without parking.
    let b = held_in(&dir, &group, &["init", "alloc", "1536M", "wait"]);
    let a = held_in(&dir, &group, &["init", "alloc", "1G", "wait"]);
    assert_eq!(a.lines.last().unwrap(), "wait");
    assert_eq!(a.lines[a.lines.len() - 2], format!("alloc {GIB} -> 2"));
    drop((a.finish(), b.finish()));

    let idle = [group.as_slice(), &[("VRAMCAP_PARK", "idle:200ms")]].concat();
    let mut b = held_in(
        &dir,
        &idle,
        &["init", "alloc", "1536M", "wait", "info", "ckstate", "wait"],
    );
    // The allocating member waits (VRAMCAP_PARK_WAIT) until the other has
    // been idle 200 ms, parks it, and gets its gigabyte.
    let waiting = [group.as_slice(), &[("VRAMCAP_PARK_WAIT", "10s")]].concat();
    let mut a = held_in(
        &dir,
        &waiting,
        &["init", "alloc", "1G", "wait", "free", "0", "wait"],
    );
    assert_eq!(a.lines[a.lines.len() - 2], format!("alloc {GIB} -> 0 #0"));
    assert_eq!(stat_device0(&dir, b.pid())["used_bytes"], 0);
    assert_eq!(group_used(&dir).0, GIB);
    // The parked member calls CUDA: no room in the group, it waits.
    b.resume();
    b.until("resumed");
    let line = stderr_until(&mut b, "waiting for");
    assert!(
        line.ends_with("waiting for 1.5 GiB on GPU 0 to resume"),
        "{line}"
    );
    a.resume();
    a.until("wait");
    b.until("ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0");
    assert_eq!(group_used(&dir).0, 1536 * MIB);
    drop((a.finish(), b.finish()));
}

/// Sharing a GPU without a group: with the GPU full (the stand-in's
/// `STANDIN_FOREIGN_FILE` stands for the other process's memory, one file
/// each), an allocation the driver refuses parks the same user's process
/// idle longest on that GPU and gets its memory once the room is there;
/// the parked one, calling CUDA again with the GPU full, parks the first,
/// idle by then, and resumes once the room is there.
#[test]
fn on_a_full_gpu_an_allocation_or_a_resume_parks_the_idle_process_on_it() {
    let dir = scratch_dir();
    let (fa, fb) = (dir.join("foreign-a"), dir.join("foreign-b"));
    std::fs::write(&fa, "0").unwrap();
    std::fs::write(&fb, "0").unwrap();
    let (sa, sb) = (fa.to_str().unwrap(), fb.to_str().unwrap());
    let env = |f| {
        [
            NO_CACHE,
            ("VRAMCAP_PARK", "idle:200ms"),
            ("VRAMCAP_PARK_WAIT", "30s"),
            ("VRAMCAP_LOG", "info"),
            ("STANDIN_FOREIGN_FILE", f),
        ]
    };
    let mut a = held_in(
        &dir,
        &env(sa),
        &["init", "alloc", "12G", "wait", "info", "ckstate", "wait"],
    );
    // B sees A's 12 GiB as another process's: 4 GiB free of 16.
    std::fs::write(&fb, "12288").unwrap();
    let mut b = held_in(
        &dir,
        &env(sb),
        &["init", "wait", "alloc", "8G", "wait", "ckstate", "wait"],
    );
    let (pa, pb) = (a.pid(), b.pid());
    let done = [watchdog(pa), watchdog(pb)];
    b.resume();
    let line = stderr_until(&mut b, "parking idle process");
    assert!(
        line.contains(&format!(
            "GPU 0 is full; parking idle process {pa}: done in "
        )),
        "{line}"
    );
    assert_eq!(stat_device0(&dir, pa)["parked_bytes"], 12 * GIB);
    std::fs::write(&fb, "0").unwrap(); // A's memory is on the host now
    b.until("wait");
    assert_eq!(
        b.lines[b.lines.len() - 2],
        format!("alloc {} -> 0 #0", 8 * GIB)
    );

    // A calls CUDA: 8 of 16 GiB free is too little for its 12; B, idle,
    // is parked for it.
    std::fs::write(&fa, "8192").unwrap();
    a.resume();
    a.until("resumed");
    let line = stderr_until(&mut a, "parking idle process");
    assert!(
        line.contains(&format!(
            "GPU 0 is full to resume; parking idle process {pb}: done in "
        )),
        "{line}"
    );
    std::fs::write(&fa, "0").unwrap(); // B's memory is on the host now
    a.until("wait");
    let n = a.lines.len();
    assert_eq!(
        a.lines[n - 3..n - 1],
        [
            format!("info -> 0 free={} total={}", 4 * GIB, 16 * GIB),
            "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0".to_string(),
        ][..]
    );
    assert_eq!(stat_device0(&dir, pb)["parked_bytes"], 8 * GIB);
    b.resume();
    b.until("ckstate state=2 checkpoints=1 restores=0 failures=0 parked=8589934592");
    drop((a.finish(), b.finish()));
    for d in done {
        let _ = d.send(());
    }
}

/// On a full GPU only a process that holds what is missing is parked:
/// one idle with 1 GiB is left running when 4 GiB are missing, and the
/// allocation is refused once `VRAMCAP_PARK_WAIT` is over.
#[test]
fn on_a_full_gpu_a_process_holding_too_little_to_make_the_room_is_not_parked() {
    let dir = scratch_dir();
    let fb = dir.join("foreign-b");
    std::fs::write(&fb, "12288").unwrap(); // 4 of 16 GiB free for B
    let idle = [NO_CACHE, ("VRAMCAP_PARK", "idle:200ms")];
    let mut a = held_in(&dir, &idle, &["init", "alloc", "1G", "wait", "ckstate"]);
    let b = held_in(
        &dir,
        &[
            NO_CACHE,
            ("VRAMCAP_PARK_WAIT", "1s"),
            ("STANDIN_FOREIGN_FILE", fb.to_str().unwrap()),
        ],
        &["init", "alloc", "8G", "wait"],
    );
    assert_eq!(
        b.lines[b.lines.len() - 2],
        format!("alloc {} -> 2", 8 * GIB)
    );
    assert_eq!(stat_device0(&dir, a.pid())["parked_bytes"], 0);
    a.resume();
    a.until("ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0");
    drop((a.finish(), b.finish()));
}

/// The resume's free-memory check runs nvidia-smi marked
/// `VRAMCAP_FREE_PROBE=1`: a shim loaded into it all the same (through
/// /etc/ld.so.preload, as the device plugin's hosts do) answers NVML's
/// memory queries as the driver does, not capped, which would keep a
/// process parked near its cap for good.
#[test]
fn the_resume_s_nvidia_smi_sees_the_real_free_memory_even_under_the_shim() {
    let smi = artefacts()
        .standin_lib
        .with_file_name("bin")
        .join("nvidia-smi");
    let query = |probe: bool| {
        let mut cmd = shimmed(&smi);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .env("VRAMCAP_STATS", "off")
            .args([
                "--query-gpu=uuid,memory.free",
                "--format=csv,noheader,nounits",
            ]);
        if probe {
            cmd.env("VRAMCAP_FREE_PROBE", "1");
        }
        run(cmd).ok_lines()[0].clone()
    };
    assert!(query(false).ends_with(", 1024"), "{}", query(false));
    assert!(query(true).ends_with(", 16384"), "{}", query(true));
}

/// Where the GPUs' free memory cannot be measured (nvidia-smi failing),
/// parking is refused with its line: parked, the process could never be
/// let resume. It keeps running.
#[test]
fn a_process_whose_gpu_cannot_be_measured_is_not_parked() {
    let dir = scratch_dir();
    let mut h = held_in(
        &dir,
        &[MANUAL, NO_CACHE, ("STANDIN_SMI_FAIL", "1")],
        &["init", "alloc", "1G", "wait", "info", "ckstate"],
    );
    assert_refused(
        &dir,
        &mut h,
        "the free memory of GPU 0 cannot be measured, so it could never resume (a resume runs nvidia-smi: put it on the process's PATH, or in /usr/bin)",
    );
    h.resume();
    h.until("ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0");
    let (_, out) = h.finish();
    assert!(out.status.success());
}

/// A program that ignores SIGCHLD (its children reaped by the kernel)
/// resumes all the same: the free-memory check reads nvidia-smi's answer
/// to its end, and a status no longer there to read is no failure.
#[test]
fn a_process_that_ignores_sigchld_resumes() {
    let dir = scratch_dir();
    let mut h = held_in(
        &dir,
        &[MANUAL, NO_CACHE],
        &["init", "nochld", "alloc", "1G", "wait", "info", "ckstate"],
    );
    let done = watchdog(h.pid());
    park(&dir, h.pid()).ok_lines();
    h.resume();
    h.until("ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0");
    let (_, out) = h.finish();
    let _ = done.send(());
    assert!(out.status.success());
}

/// With parking on, `cuGetProcAddress` hands out the shim's forwarder for
/// a launch (a hook only under tiered spill), so that a parked process's
/// launch reaches the gate before the driver's lock (tests/forward.rs
/// tells a forwarder from a hook).
#[test]
fn with_parking_a_launch_is_handed_out_by_the_shim_so_it_passes_the_gate() {
    let args = ["init", "resolve", "cuLaunchKernel", "13000", "0"];
    client("procaddr", &[MANUAL], &args).expect_lines(&[
        "init -> 0",
        "resolve cuLaunchKernel 13000 0 -> 0 status=0 lib=libvramcap.so",
    ]);
    client("procaddr", &[], &args).expect_lines(&[
        "init -> 0",
        "resolve cuLaunchKernel 13000 0 -> 0 status=0 lib=libcuda.so.1",
    ]);
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

/// A parked process that exits without calling CUDA again ends normally,
/// and its page goes with it.
#[test]
fn a_parked_process_exits_normally() {
    let dir = scratch_dir();
    let h = held_in(&dir, &[MANUAL], &["init", "alloc", "1G", "wait"]);
    let pid = h.pid();
    park(&dir, pid).ok_lines();
    let (lines, out) = h.finish();
    assert!(out.status.success(), "{lines:?}");
    assert!(!dir.join(format!("{pid}.page")).exists());
}

/// A parked process whose exit handler calls the driver (as the runtime's
/// does) ends at once and without a restore: at exit nothing resumes a
/// process, so the call answers `CUDA_ERROR_DEINITIALIZED` (4) instead of
/// waiting for good, and the parked memory goes with the process. Both
/// orders: the handler registered before the shim's background thread
/// started (as cudart's is), and after it (a library loaded later), with
/// the GPU full, where a resume would wait for good.
#[test]
fn a_parked_process_whose_exit_handler_calls_the_driver_ends_without_a_restore() {
    let dir = scratch_dir();
    let foreign = dir.join("foreign-mib");
    std::fs::write(&foreign, "0").unwrap();
    let env = [
        MANUAL,
        ("VRAMCAP_LOG", "info"),
        ("STANDIN_FOREIGN_FILE", foreign.to_str().unwrap()),
    ];
    for args in [
        ["init", "atexit-sync", "alloc", "1G", "wait"],
        ["init", "alloc", "1G", "atexit-sync", "wait"],
    ] {
        let h = held_in(&dir, &env, &args);
        let pid = h.pid();
        let done = watchdog(pid);
        park(&dir, pid).ok_lines();
        // 16 GiB devices: 15.5 GiB held by others leaves no room for 1 GiB.
        std::fs::write(&foreign, "15872").unwrap();
        let (lines, out) = h.finish();
        let _ = done.send(());
        std::fs::write(&foreign, "0").unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            lines[lines.len() - 2..],
            ["resumed".to_string(), "atexit sync -> 4".to_string()][..],
            "{args:?} {stderr}"
        );
        assert!(out.status.success(), "{:?} {stderr}", out.status);
        assert_eq!(
            stderr
                .matches("exiting while parked: the parked GPU memory is discarded with the process, not restored")
                .count(),
            1,
            "{stderr}"
        );
        assert!(!stderr.contains("resumed: "), "{stderr}");
        assert!(!dir.join(format!("{pid}.page")).exists());
    }
}

/// No cache, a group of 2 GiB named `group` (the group is the machine's:
/// callers make the name unique per run), the shim's Info lines.
fn logged_group(group: &str) -> [(&str, &str); 4] {
    [
        NO_CACHE,
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", group),
        ("VRAMCAP_LOG", "info"),
    ]
}

/// A parked member's turn: its next calls (`info`, `ckstate`) resume it
/// (once restored) and it sees `free` bytes left of the group's 2 GiB.
fn turn(h: &mut Held, free: u64) {
    h.resume();
    h.until("wait");
    let n = h.lines.len();
    assert_eq!(
        h.lines[n - 4..],
        [
            "resumed".to_string(),
            format!("info -> 0 free={free} total={}", 2 * GIB),
            "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0".to_string(),
            "wait".to_string(),
        ][..]
    );
}

/// `line` less its closing " in 0.123s" (the time must be there).
fn timed(line: &str) -> &str {
    let (head, secs) = line.rsplit_once(" in ").expect("a timed line");
    let secs = secs.strip_suffix('s').and_then(|n| n.parse::<f64>().ok());
    assert!(secs.is_some_and(|n| n >= 0.0), "{line}");
    head
}

/// Issue 34's done-when 2 with the stand-in: two members of one group
/// whose budget (2 GiB) is smaller than both (1.5 GiB and 1 GiB), both
/// `idle:300ms`, take turns at their idle points. B's allocation waits
/// until A is idle, parks it and succeeds; A's next call waits until B is
/// idle, parks it (the resume's policy) and resumes; B's next call parks A
/// back. Nobody is refused, the ledgers are exact at each turn, and each
/// side's checkpoint counters show its own turns.
#[test]
fn two_idle_members_take_turns_a_resume_parks_the_idle_other() {
    let dir = scratch_dir();
    let group = format!("turns{}", std::process::id());
    let idle = [("VRAMCAP_PARK", "idle:300ms"), ("VRAMCAP_PARK_WAIT", "10s")];
    let env = [&logged_group(&group)[..], &idle].concat();
    let calls = ["info", "ckstate", "wait"];
    let mut a = held_in(
        &dir,
        &env,
        &[
            &["init", "alloc", "1536M", "wait"][..],
            &calls,
            &["ckstate"],
        ]
        .concat(),
    );
    let mut b = held_in(
        &dir,
        &env,
        &[&["init", "alloc", "1G", "wait"][..], &calls].concat(),
    );
    let (pa, pb) = (a.pid(), b.pid());
    // B's allocation parked A (idle 300 ms) and got its gigabyte.
    assert_eq!(b.lines[1], format!("alloc {GIB} -> 0 #0"));
    assert_eq!(
        timed(&stderr_until(&mut b, "parking idle member")),
        format!(
            "vramcap[{pb}]: group {group}: {} more bytes needed on device 0; parking idle member {pa}: done",
            512 * MIB
        )
    );
    // The group's bytes on GPU 0 and each member's, by PID.
    let ledger = || {
        let j = stat(&dir);
        let g = j["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == group.as_str());
        let g = g.expect("the group is listed");
        let mut members: Vec<(u32, u64)> = g["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["pid"].as_u64().unwrap() as u32,
                    m["held_bytes"][0].as_u64().unwrap(),
                )
            })
            .collect();
        members.sort_unstable();
        (g["devices"][0]["used_bytes"].as_u64().unwrap(), members)
    };
    let by_pid = |m: [(u32, u64); 2]| {
        let mut m = m.to_vec();
        m.sort_unstable();
        m
    };
    let parked = |pid: u32, bytes: u64| {
        let d = stat_device0(&dir, pid);
        (
            d["used_bytes"].as_u64().unwrap(),
            d["parked_bytes"].as_u64().unwrap(),
        ) == (0, bytes)
    };
    assert!(parked(pa, 1536 * MIB));
    assert_eq!(stat_device0(&dir, pb)["used_bytes"], GIB);
    assert_eq!(ledger(), (GIB, by_pid([(pa, 0), (pb, GIB)])));

    // A calls CUDA: its resume finds no room, waits until B is idle, parks it.
    turn(&mut a, 512 * MIB);
    assert_eq!(
        timed(&stderr_until(&mut a, "to resume; parking idle member")),
        format!(
            "vramcap[{pa}]: group {group}: {} more bytes needed on device 0 to resume; parking idle member {pb}: done",
            512 * MIB
        )
    );
    assert!(parked(pb, GIB));
    assert_eq!(stat_device0(&dir, pa)["used_bytes"], 1536 * MIB);
    assert_eq!(ledger(), (1536 * MIB, by_pid([(pa, 1536 * MIB), (pb, 0)])));

    // B calls CUDA: it parks A, idle again, the same way.
    turn(&mut b, GIB);
    assert!(parked(pa, 1536 * MIB));
    assert_eq!(ledger(), (GIB, by_pid([(pa, 0), (pb, GIB)])));
    let (lines, out) = b.finish();
    assert!(out.status.success(), "{lines:?}");
    // A, parked a second time, exits without calling CUDA again.
    let (lines, out) = a.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines.last().unwrap(),
        &format!(
            "ckstate state=2 checkpoints=2 restores=1 failures=0 parked={}",
            1536 * MIB
        )
    );
}

/// The guard of the policy: a member waiting inside an allocation for room
/// is not idle, however short its threshold (`idle:1ms`, below the tick at
/// which its activity is stamped, so the page alone would call it idle).
/// Asked to park, it checks for itself and answers "not idle"; it is never
/// parked, and its allocation goes on once room comes.
#[test]
fn a_member_waiting_inside_an_allocation_is_never_parked() {
    let dir = scratch_dir();
    let group = format!("guard{}", std::process::id());
    let base = logged_group(&group);
    let holder = held_in(&dir, &base, &["init", "alloc", "1G", "wait"]);
    let waiting = [("VRAMCAP_PARK", "idle:1ms"), ("VRAMCAP_PARK_WAIT", "30s")];
    let mut w = held_in(
        &dir,
        &[&base[..], &waiting].concat(),
        &["init", "alloc", "1G", "wait", "alloc", "512M", "ckstate"],
    );
    let pw = w.pid();
    w.resume();
    // W is inside its allocation, waiting for room.
    stderr_until(&mut w, "waiting up to 30s (VRAMCAP_PARK_WAIT)");
    // Q's allocation is refused by the group; it asks W, which says no.
    let asker = [&base[..], &[("VRAMCAP_PARK_WAIT", "1s")]].concat();
    let mut q = held_in(&dir, &asker, &["init", "alloc", "1M", "wait"]);
    assert_eq!(q.lines[1], format!("alloc {MIB} -> 2"));
    assert_eq!(
        timed(&stderr_until(&mut q, "parking idle member")),
        format!(
            "vramcap[{}]: group {group}: {MIB} more bytes needed on device 0; parking idle member {pw}: it is not idle (it called CUDA within its VRAMCAP_PARK=idle threshold, or a call of it is waiting)",
            q.pid()
        )
    );
    let d = stat_device0(&dir, pw);
    assert_eq!(
        (d["used_bytes"].as_u64(), d["parked_bytes"].as_u64()),
        (Some(GIB), Some(0))
    );
    drop(q.finish());
    // The holder leaves: W's allocation gets its room, W was never parked.
    drop(holder.finish());
    let (lines, out) = w.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines[lines.len() - 2..],
        [
            format!("alloc {} -> 0 #1", 512 * MIB),
            "ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0".to_string(),
        ][..]
    );
}

/// The policy asks again each tick: a member that cannot be parked (here:
/// it holds managed memory) says why once, and the asker says its answer
/// once, however many times it asked in its second of waiting.
#[test]
fn a_refusal_to_the_policy_is_said_once_in_a_row() {
    let dir = scratch_dir();
    let group = format!("once{}", std::process::id());
    let base = logged_group(&group);
    let x_env = [&base[..], &[("VRAMCAP_PARK", "idle:1ms")]].concat();
    let x = held_in(
        &dir,
        &x_env,
        &["init", "alloc", "1G", "managed", "64M", "wait"],
    );
    let q_env = [&base[..], &[("VRAMCAP_PARK_WAIT", "1s")]].concat();
    let q = held_in(&dir, &q_env, &["init", "alloc", "1G", "wait"]);
    assert_eq!(q.lines[1], format!("alloc {GIB} -> 2"));
    let (px, pq) = (x.pid(), q.pid());
    let (_, q_out) = q.finish();
    let (_, x_out) = x.finish();
    let why = "it holds managed (unified) memory, which the driver's checkpoint refuses";
    let said = |out: &std::process::Output, what: &str| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains(what))
            .map(|l| timed(l).to_string())
            .collect::<Vec<_>>()
    };
    // (Its first ask may find X active still: "not idle", said once too.)
    assert_eq!(
        said(&q_out, why),
        [format!(
            "vramcap[{pq}]: group {group}: {} more bytes needed on device 0; parking idle member {px}: {why}",
            64 * MIB
        )]
    );
    assert!(said(&q_out, "parking idle member").len() <= 2);
    let x_said: Vec<String> = String::from_utf8_lossy(&x_out.stderr)
        .lines()
        .filter(|l| l.contains("cannot park"))
        .map(str::to_string)
        .collect();
    assert_eq!(x_said, [format!("vramcap[{px}]: cannot park: {why}")]);
}

// `vramcap park`/`resume` against pages that do not answer (issue 42,
// items 8 and 9): forged pages (`readers::forge`, kept live by this test
// holding their lock, with parking switched on in their header) and
// processes that cannot answer (stopped, or parked for a `limit`).

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
    let h = held_in(
        &dir,
        &[MANUAL, NO_CACHE, ("VRAMCAP_LIMIT", "4GiB")],
        &["init", "alloc", "1M", "wait"],
    );
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
    let h = held_in(
        &dir,
        &[MANUAL, NO_CACHE, ("VRAMCAP_LIMIT", "4GiB")],
        &["init", "alloc", "1M", "wait"],
    );
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
