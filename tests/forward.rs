//! The forwarders (issue 34): with parking enabled, driver functions that
//! are no hooks are handed out, through `dlsym` on the driver and through
//! `cuGetProcAddress`, as trampolines that pass the parking gate; without
//! it the program gets the driver's own functions, as before. The gate is
//! held closed by a real park that the stand-in's checkpoint lock holds
//! in its first step (`STANDIN_CHECKPOINT_HOLD`): the shipped library has
//! no switch of its own for it.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use crate::util::{bare, run, scratch_dir, shimmed, spawn_piped, watchdog};

fn forward_program() -> PathBuf {
    PathBuf::from(env!("STANDIN_DIR")).join("bin/forward")
}

const PARK: (&str, &str) = ("VRAMCAP_PARK", "manual");

/// The calls' lines: exactly what the stand-in answers without the shim.
const CALLS: [&str; 6] = [
    "init -> 0",
    "ctxdev -> 0 dev=0",
    "name -> 0 vramcap stand-in 0",
    "launch -> 0 dims=3,5,7,11,13,17 shared=19 stream=0x2",
    "clamp -> 0 0 min=0.5 max=-1.25",
    "dark -> 0 0 out=7028,1007 calls=2",
];

/// The export tables' lines: each table stays where the driver made it
/// (`at=internal`); with `gated` the functions of all but the integrity
/// check's are forwarders, and size words are never touched.
fn tables(gated: bool) -> Vec<String> {
    let f = if gated { "forwarder" } else { "internal" };
    vec![
        format!("table standin -> 0 at=internal slots=size,{f},{f}"),
        format!("table cls -> 0 at=internal slots={f},{f}"),
        "table integrity -> 0 at=internal slots=size,internal,internal".to_string(),
    ]
}

/// The lookups' lines when unhooked functions are answered with `k`
/// through dlsym and `pa` through cuGetProcAddress (`real`: the driver's
/// export of the name, `internal`: another of its addresses, `forwarder`)
/// and `cuMemAlloc_v2` with `alloc`; `equal`: whether the two answers are
/// one address.
fn lookups(k: &str, pa: &str, alloc: &str, equal: &str) -> Vec<String> {
    let line = |name: &str, k: &str, pa: &str, eq: &str| {
        format!("resolve {name} dlsym={k} again=same procaddr={pa} again=same equal={eq}")
    };
    vec![
        line("cuCtxGetDevice", k, pa, equal),
        line("cuDeviceGetName", k, pa, equal),
        line("cuCtxGetCurrent", k, pa, equal),
        // A hook that only tiered spill hands out: without it, unhooked.
        line("cuLaunchKernel", k, pa, equal),
        line("cuMemAlloc_v2", alloc, alloc, "yes"),
        // Reached through dlsym only (the stand-in's resolver lacks it).
        line("cuTexRefSetMipmapLevelClamp", k, "null", "no"),
    ]
}

fn expected(k: &str, pa: &str, alloc: &str, equal: &str) -> Vec<String> {
    let mut want = lookups(k, pa, alloc, equal);
    want.extend(tables(k == "forwarder"));
    want.extend(CALLS.map(String::from));
    want
}

/// The client's lines under the shim with `env`.
fn shimmed_lines(env: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = shimmed(&forward_program());
    cmd.envs(env.iter().copied());
    run(cmd).ok_lines()
}

/// The stand-in's resolver answers internal entry points, not its exports.
const ALIASES: (&str, &str) = ("STANDIN_PROCADDR_ALIASES", "1");

#[test]
fn without_the_shim_the_client_sees_the_driver() {
    let ran = run(bare(&forward_program()));
    assert_eq!(ran.ok_lines(), expected("real", "real", "real", "yes"));
}

#[test]
fn without_parking_the_program_gets_the_driver_s_own_functions() {
    let want = expected("real", "real", "hook", "yes");
    assert_eq!(shimmed_lines(&[]), want);
    // Internal pointers from the resolver: handed out as they are.
    let want = expected("real", "internal", "hook", "no");
    assert_eq!(shimmed_lines(&[ALIASES]), want);
}

#[test]
fn with_parking_unhooked_functions_are_forwarders_that_call_exactly() {
    let want = expected("forwarder", "forwarder", "hook", "yes");
    assert_eq!(shimmed_lines(&[PARK]), want);
}

#[test]
fn forwarders_are_one_address_exactly_when_the_driver_s_functions_are() {
    // Two addresses of one function (dlsym's export, the resolver's
    // internal entry point) stay two forwarders.
    let want = expected("forwarder", "forwarder", "hook", "no");
    assert_eq!(shimmed_lines(&[PARK, ALIASES]), want);
}

/// The shim's stderr lines without their `vramcap[PID]: ` prefix, read on
/// a thread so that a missing line fails after a while instead of hanging.
fn stderr_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let err = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in err.lines().map_while(Result::ok) {
            let l = match l.split_once("]: ") {
                Some((p, rest)) if p.starts_with("vramcap[") => rest.to_string(),
                _ => l,
            };
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// Reads `rx` until a line that starts with `want`; fails at the end of
/// stderr or after a minute without it.
fn wait_for(rx: &mpsc::Receiver<String>, want: &str, seen: &mut Vec<String>) {
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.starts_with(want) => return,
            Ok(l) => seen.push(l),
            Err(e) => panic!("no {want:?} on stderr ({e}); it had {seen:?}"),
        }
    }
}

/// The next line of the client's stdout (empty at its end).
fn next(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut l = String::new();
    out.read_line(&mut l).expect("read stdout");
    l.trim_end().to_string()
}

/// A park held in its first step (the stand-in's checkpoint lock waits
/// for a byte on a FIFO: `STANDIN_CHECKPOINT_HOLD`) keeps the gate closed:
/// a forwarded call made then waits at it (the shim says so at debug
/// level) and answers nothing; let go, the park completes, the waiting
/// call has the process resumed and answers exactly what the driver does.
#[test]
fn a_closed_gate_holds_a_forwarded_call_until_it_opens() {
    let dir = scratch_dir();
    let fifo = dir.join("hold");
    let c = std::ffi::CString::new(fifo.to_str().expect("a UTF-8 path")).expect("no NUL");
    // SAFETY: a NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // Read and write: opening never blocks, and the stand-in's reader
    // finds a writer at once.
    let mut hold = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("open the FIFO");
    let mut cmd = shimmed(&forward_program());
    cmd.env(PARK.0, PARK.1)
        .env("VRAMCAP_PARK_MOVE", "checkpoint")
        .env("VRAMCAP_STATS_DIR", &dir)
        .env("VRAMCAP_LOG", "debug")
        .env("STANDIN_CHECKPOINT_HOLD", &fifo)
        .arg("wait");
    let mut child = spawn_piped(&mut cmd);
    let pid = child.id();
    let done = watchdog(pid);
    let err = stderr_lines(&mut child);
    let mut stdin = child.stdin.take().expect("piped stdin");
    let out = child.stdout.take().expect("piped stdout");
    let fd = out.as_raw_fd();
    let mut out = BufReader::new(out);
    let mut got: Vec<String> = (0..11).map(|_| next(&mut out)).collect();
    assert_eq!(got.pop().as_deref(), Some("ready"));
    assert_eq!(
        got,
        lookups("forwarder", "forwarder", "hook", "yes")
            .into_iter()
            .chain(tables(true))
            .chain(["init -> 0".into()])
            .collect::<Vec<_>>()
    );
    let mut seen = Vec::new();
    for (what, want) in [
        ("launch", CALLS[3]),
        ("clamp", CALLS[4]),
        ("dark", "dark -> 0 0 out=7028,1007 calls=2"),
        ("name", CALLS[2]),
        ("ctxdev", CALLS[1]),
    ] {
        let parker = {
            let dir = dir.clone();
            std::thread::spawn(move || park_forward(&dir, pid))
        };
        wait_for(&err, "standin: lock held", &mut seen);
        writeln!(stdin, "{what}").expect("ask for the call");
        assert_eq!(next(&mut out), format!("calling {what}"));
        wait_for(
            &err,
            "parking: a forwarded call waits at the gate",
            &mut seen,
        );
        // The call is at the gate: nothing of its answer is out.
        assert!(out.buffer().is_empty(), "{what} answered at a closed gate");
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let ready = unsafe { libc::poll(&mut p, 1, 0) };
        assert_eq!(ready, 0, "{what} answered at a closed gate");
        hold.write_all(b"o").expect("let the park go on");
        assert_eq!(next(&mut out), want);
        parker.join().expect("the park was answered");
    }
    drop(stdin);
    let status = child.wait().expect("wait for the client");
    let _ = done.send(());
    assert!(status.success(), "{status}; stderr had {seen:?}");
}

/// The forward client under the shim with parking on, at its "ready"
/// (`lines`: its first eleven), killed by the watchdog unless `done` is sent.
struct Ready {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
    lines: Vec<String>,
    done: mpsc::Sender<()>,
}

fn ready_with_parking(dir: &std::path::Path) -> Ready {
    ready_with_parking_moved(dir, "checkpoint")
}

/// [`ready_with_parking`] with `VRAMCAP_PARK_MOVE=move`.
fn ready_with_parking_moved(dir: &std::path::Path, park_move: &str) -> Ready {
    let mut cmd = shimmed(&forward_program());
    cmd.env(PARK.0, PARK.1)
        .env("VRAMCAP_PARK_MOVE", park_move)
        .env("VRAMCAP_STATS_DIR", dir)
        .env("VRAMCAP_LOG", "info")
        .arg("wait");
    let mut child = spawn_piped(&mut cmd);
    let done = watchdog(child.id());
    let stdin = child.stdin.take().expect("piped stdin");
    let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let lines: Vec<String> = (0..11).map(|_| next(&mut out)).collect();
    assert_eq!(lines[10], "ready", "{lines:?}");
    Ready {
        child,
        stdin,
        out,
        lines,
        done,
    }
}

/// `vramcap park --pid PID` answers that it parked it.
fn park_forward(dir: &std::path::Path, pid: u32) {
    let mut park = bare(&crate::util::artefacts().cli);
    park.env("VRAMCAP_STATS_DIR", dir)
        .args(["park", "--pid", &pid.to_string()]);
    let parked = run(park).ok_lines();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert!(
        parked[0].starts_with(&format!("{pid}: parked, ")),
        "{parked:?}"
    );
}

/// Parked for real (the stand-in's checkpoint lock holds every driver
/// call), the process's next call through an export table, which no
/// `dlsym` or `cuGetProcAddress` answer covers, waits at the gate, has
/// the process resumed, and then answers exactly: it never reaches the
/// driver's lock, where it would wait for good.
#[test]
fn a_call_through_an_export_table_resumes_a_parked_process_first() {
    let (lines, waker) = resumed_by("dark", "dark -> 0 0 out=7028,1007 calls=2");
    assert_eq!(lines[6..9], tables(true)[..]);
    assert!(
        waker.starts_with("parking: function 1 of the driver's export table ")
            && waker.ends_with(" resumes this process"),
        "{waker}"
    );
}

/// Parked for real, the process's next call of a function the shim only
/// forwards (`cuCtxGetDevice`, from `cuGetProcAddress`) has it resumed, and
/// the log names that function (issue 43: what wakes an idle process), as
/// it was looked up; the call then answers exactly.
#[test]
fn an_unhooked_call_that_resumes_a_parked_process_is_named() {
    let (_, waker) = resumed_by("ctxdev", CALLS[1]);
    assert!(
        waker == "parking: cuCtxGetDevice, which the shim only forwards, resumes this process",
        "{waker}"
    );
}

/// The forward client parked for real, then asked for `what`, which has it
/// resumed and answers `answer`; ended. Its first eleven lines, and the one
/// stderr line that names what resumed it.
fn resumed_by(what: &str, answer: &str) -> (Vec<String>, String) {
    resumed_after("checkpoint", &[(what, answer)])
}

/// [`resumed_by`] with `VRAMCAP_PARK_MOVE=park_move` and the calls
/// `asked` (each with its answer) in turn, the last of which resumes it.
fn resumed_after(park_move: &str, asked: &[(&str, &str)]) -> (Vec<String>, String) {
    let dir = scratch_dir();
    let Ready {
        mut child,
        mut stdin,
        mut out,
        lines,
        done,
    } = ready_with_parking_moved(&dir, park_move);
    let err = stderr_lines(&mut child);
    park_forward(&dir, child.id());
    let mut seen = Vec::new();
    wait_for(&err, "parked: ", &mut seen);
    for (what, answer) in asked {
        writeln!(stdin, "{what}").expect("ask for the call");
        assert_eq!(next(&mut out), format!("calling {what}"));
        assert_eq!(next(&mut out), *answer);
    }
    wait_for(
        &err,
        "resumed: the parked memory is back on the GPU",
        &mut seen,
    );
    let waker: Vec<&String> = seen
        .iter()
        .filter(|l| l.contains("resumes this process"))
        .collect();
    assert_eq!(waker.len(), 1, "{seen:?}");
    let waker = waker[0].clone();
    drop(stdin);
    let status = child.wait().expect("wait for the client");
    let _ = done.send(());
    assert!(status.success(), "{status}; stderr had {seen:?}");
    (lines, waker)
}

/// Issue 43: with the shim's moves the driver stays usable while a
/// process is parked, so a context query it only forwards
/// (`cuCtxGetDevice`, as JAX's runtime sets its context while idle) and
/// `cuStreamIsCapturing` (which woke an idle JAX process on the H200 at
/// b6c8f10) answer at once and leave the process parked; its next launch
/// is what resumes it, and is named. Under the driver's checkpoint the
/// same query resumes it (the test above).
#[test]
fn a_context_query_leaves_a_process_parked_by_the_shim_s_moves_parked() {
    let (_, waker) = resumed_after(
        "shim",
        &[
            ("ctxdev", CALLS[1]),
            ("capturing", "capturing -> 0 status=0"),
            ("launch", CALLS[3]),
        ],
    );
    assert!(
        waker.starts_with("parking: cuLaunchKernel") && waker.ends_with(" resumes this process"),
        "{waker}"
    );
}

/// Issue 43, done-when 5: with the shim's moves a context query (as JAX's
/// runtime makes while its program idles) is no activity, so `vramcap park
/// --idle 1s` picks a process that made only such calls for 3 s; a launch
/// is activity, and the same ask finds nothing to park. (The 3 s of calls
/// are the condition itself: thirty of the background thread's ticks.)
#[test]
fn context_queries_are_no_activity_so_the_idle_policy_picks_the_process() {
    for (call, answer, parks) in [("ctxdev", CALLS[1], true), ("launch", CALLS[3], false)] {
        let dir = scratch_dir();
        let Ready {
            child,
            mut stdin,
            mut out,
            done,
            ..
        } = ready_with_parking_moved(&dir, "shim");
        let pid = child.id();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            writeln!(stdin, "{call}").expect("ask for the call");
            assert_eq!(next(&mut out), format!("calling {call}"));
            assert_eq!(next(&mut out), answer);
        }
        let mut park = bare(&crate::util::artefacts().cli);
        park.env("VRAMCAP_STATS_DIR", &dir).args([
            "park",
            "--idle",
            "1s",
            "--pid",
            &pid.to_string(),
        ]);
        let said = run(park).ok_lines();
        assert_eq!(said.len(), 1, "{call}: {said:?}");
        if parks {
            assert!(said[0].starts_with(&format!("{pid}: parked, ")), "{said:?}");
        } else {
            assert_eq!(said[0], "no process to park", "{call}");
        }
        drop(stdin);
        let output = child.wait_with_output().expect("wait for the client");
        let _ = done.send(());
        assert!(output.status.success(), "{call}: {:?}", output.status);
    }
}

/// Parked, a process whose exit handler calls through an export table
/// gets `CUDA_ERROR_DEINITIALIZED` (4) there, as from a driver shut down at
/// exit, without entering the driver (whose lock would hold it for good),
/// and ends normally.
#[test]
fn an_export_table_call_at_exit_while_parked_answers_4_and_the_process_ends() {
    let dir = scratch_dir();
    let Ready {
        child,
        mut stdin,
        mut out,
        done,
        ..
    } = ready_with_parking(&dir);
    writeln!(stdin, "atexit-dark").expect("ask for the handler");
    assert_eq!(next(&mut out), "calling atexit-dark");
    assert_eq!(next(&mut out), "atexit-dark -> registered");
    park_forward(&dir, child.id());
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read stdout");
    let output = child.wait_with_output().expect("wait for the client");
    let _ = done.send(());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        rest, "dark at exit\ndark -> 4 4 out=0,0 calls=0\n",
        "{stderr}"
    );
    assert!(output.status.success(), "{:?} {stderr}", output.status);
    assert_eq!(
        stderr.matches("exiting while parked: the parked GPU memory is discarded with the process, not restored").count(),
        1,
        "{stderr}"
    );
}
