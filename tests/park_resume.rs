//! Resuming: never a restore without room (with the GPU full, `vramcap
//! resume` refuses and the program's next call waits, saying so once), and
//! the free-memory check behind it: nvidia-smi, run in a child, sees the
//! real free memory even under the shim; a GPU that cannot be measured is
//! no parking; a program that ignores SIGCHLD resumes all the same.

use crate::park_util::*;
use crate::util::*;

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
        ("VRAMCAP_PARK_MOVE", "checkpoint"),
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
        &[
            MANUAL,
            ("VRAMCAP_PARK_MOVE", "checkpoint"),
            NO_CACHE,
            ("STANDIN_SMI_FAIL", "1"),
        ],
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
        &[MANUAL, ("VRAMCAP_PARK_MOVE", "checkpoint"), NO_CACHE],
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
