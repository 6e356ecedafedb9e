//! Ways around the preload (issue 32): a library loaded with
//! `RTLD_DEEPBIND` or `dlmopen`, and a driver function looked up at a CUDA
//! version newer than the hooks were written for. Under a cap each is
//! capped or refused with one line; without one, nothing changes.

use std::path::PathBuf;

use crate::util::{run, shimmed};

fn escape_program() -> PathBuf {
    PathBuf::from(env!("STANDIN_DIR")).join("bin/escape")
}

fn escape_lib() -> String {
    PathBuf::from(env!("STANDIN_DIR"))
        .join("lib/libescape.so")
        .display()
        .to_string()
}

/// Runs `escape ARGS` under the shim with `env`; stdout's lines and the
/// shim's stderr lines without their `vramcap[PID]: ` prefix.
fn escape(env: &[(&str, &str)], args: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut cmd = shimmed(&escape_program());
    cmd.envs(env.iter().copied()).args(args);
    let ran = run(cmd);
    let out = ran.ok_lines();
    let err = ran
        .stderr()
        .lines()
        .map(|l| match l.split_once("]: ") {
            Some((prefix, rest)) if prefix.starts_with("vramcap[") => rest.to_string(),
            _ => l.to_string(),
        })
        .collect();
    (out, err)
}

const CAP: (&str, &str) = ("VRAMCAP_LIMIT", "512MiB");
const REFUSED: &str = "cuMemAlloc: refused 268435456 bytes on device 0: 536870912 of the 536870912-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY";

/// What the library's four 256 MiB allocations get under the 512 MiB cap.
fn two_of_four() -> Vec<String> {
    let mut lines = vec!["open -> ok".to_string()];
    lines.extend(["0", "0", "2", "2"].map(|rc| format!("alloc 256 MiB -> {rc}")));
    lines
}

#[test]
fn a_library_loaded_plainly_is_capped() {
    let (out, err) = escape(&[CAP], &["plain", &escape_lib(), "4", "256"]);
    assert_eq!(out, two_of_four());
    assert_eq!(err, [REFUSED]);
}

#[test]
fn a_library_loaded_with_deepbind_is_capped_and_told() {
    let lib = escape_lib();
    let (out, err) = escape(&[CAP], &["deepbind", &lib, "4", "256"]);
    assert_eq!(out, two_of_four());
    assert_eq!(
        err,
        [
            format!(
                "{lib:?} is loaded without RTLD_DEEPBIND: with it, the library could call the CUDA driver around the cap. If it needs RTLD_DEEPBIND for other symbols, run it without a limit"
            ),
            REFUSED.to_string()
        ]
    );
}

#[test]
fn deepbind_without_a_cap_is_left_alone() {
    let (out, err) = escape(&[], &["deepbind", &escape_lib(), "2", "256"]);
    assert_eq!(
        out,
        ["open -> ok", "alloc 256 MiB -> 0", "alloc 256 MiB -> 0"]
    );
    assert_eq!(err, Vec::<String>::new());
}

#[test]
fn dlmopen_into_a_new_namespace_is_refused_under_a_cap() {
    let lib = escape_lib();
    let (out, err) = escape(&[CAP], &["dlmopen", &lib, "4", "256"]);
    assert_eq!(out, ["open -> null"]);
    assert_eq!(
        err,
        [
            format!(
                "dlmopen of {lib:?} into another link namespace is refused: the CUDA driver loaded there would not be capped. Load it with dlopen, or run without a limit"
            ),
            "dlerror: vramcap refused dlmopen into a new link namespace (its driver would not be capped): cannot open shared object file: No such file or directory".to_string()
        ]
    );
}

#[test]
fn dlmopen_without_a_cap_loads() {
    let (out, err) = escape(&[], &["dlmopen", &escape_lib(), "1", "256"]);
    assert_eq!(out, ["open -> ok", "alloc 256 MiB -> 0"]);
    assert_eq!(err, Vec::<String>::new());
}

/// A future driver (the stand-in at 14000) answers `cuMemAlloc` at 14000
/// with a function it does not answer at 13000: under a cap the lookup
/// fails, with one line.
#[test]
fn an_unknown_function_at_a_newer_version_is_not_handed_out_under_a_cap() {
    let (out, err) = escape(
        &[CAP, ("STANDIN_DRIVER_VERSION", "14000")],
        &["procaddr", "cuMemAlloc", "14000", "4", "256"],
    );
    assert_eq!(out, ["lookup cuMemAlloc 14000 -> 500 status=1"]);
    assert_eq!(
        err,
        [
            "cuGetProcAddress(\"cuMemAlloc\", 14000) answered a function that vramcap was not written for (it knows CUDA versions up to 13999); calls through it would not be capped, so the lookup fails. Use a vramcap release that knows this CUDA version, or run without a limit"
        ]
    );
}

#[test]
fn an_unknown_function_without_a_cap_is_handed_out_with_a_warning() {
    let (out, err) = escape(
        &[("STANDIN_DRIVER_VERSION", "14000")],
        &["procaddr", "cuMemAlloc", "14000", "1", "256"],
    );
    assert_eq!(
        out,
        [
            "lookup cuMemAlloc 14000 -> 0 status=0",
            "alloc 256 MiB -> 0"
        ]
    );
    assert_eq!(
        err,
        [
            "cuGetProcAddress(\"cuMemAlloc\", 14000) answered a function that vramcap was not written for (it knows CUDA versions up to 13999); calls through it are not counted"
        ]
    );
}

/// The same internal function at 14000 as at 13000 (the stand-in's
/// aliases) is the hooked one: capped.
#[test]
fn a_known_function_at_a_newer_version_is_capped() {
    let (out, err) = escape(
        &[
            CAP,
            ("STANDIN_DRIVER_VERSION", "14000"),
            ("STANDIN_PROCADDR_ALIASES", "1"),
        ],
        &["procaddr", "cuMemAllocPitch", "14000", "4", "256"],
    );
    assert_eq!(
        out,
        [
            "lookup cuMemAllocPitch 14000 -> 0 status=0",
            "alloc 256 MiB -> 0",
            "alloc 256 MiB -> 0",
            "alloc 256 MiB -> 2",
            "alloc 256 MiB -> 2"
        ]
    );
    assert_eq!(err, [REFUSED.replace("cuMemAlloc:", "cuMemAllocPitch:")]);
}

/// A set-user-ID program (issue 42, item 1), as `/etc/ld.so.preload` or a
/// program that loads the shim itself has it: the loader runs it in
/// secure-execution mode, and the shim reads nothing from its
/// environment, which is the invoking user's: no cap, no log level, no
/// driver path, no switch, and no bad value stops it. The cap is the
/// operator's file's. The same program without the bit is capped by the
/// environment, as ever.
#[test]
#[ignore = "needs root"]
fn a_secure_execution_process_takes_nothing_from_the_environment() {
    use std::os::unix::fs::PermissionsExt;
    crate::util::needs_root();
    let a = crate::util::artefacts();
    let dir = crate::util::scratch_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = |name: &str, uid: u32, mode: u32| {
        let p = dir.join(name);
        std::fs::copy(escape_program(), &p).unwrap();
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    };
    let plain = copy("plain", 0, 0o755);
    let setuid = copy("setuid", 65534, 0o4755);
    let driver = a.standin_lib.join("libcuda.so.1");
    let shim = std::fs::canonicalize(&a.shim).unwrap();
    let args = |p: &std::path::Path| {
        let mut cmd = crate::util::bare(p);
        cmd.arg("shim").arg(&driver).arg(&shim).args(["4", "256"]);
        cmd
    };
    let all = || {
        let mut lines = vec!["open -> ok".to_string()];
        lines.extend((0..4).map(|_| "alloc 256 MiB -> 0".to_string()));
        lines
    };
    let debug = ("VRAMCAP_LOG", "debug");

    let mut cmd = args(&plain);
    cmd.env(CAP.0, CAP.1);
    let ran = run(cmd);
    assert_eq!(ran.ok_lines(), two_of_four());
    assert!(
        ran.stderr().ends_with(&format!("{REFUSED}\n")),
        "{}",
        ran.stderr()
    );

    for env in [
        [CAP, debug],
        [("VRAMCAP_LIMIT", "not a size"), debug],
        [CAP, ("VRAMCAP_DISABLE", "perhaps")],
        [CAP, ("VRAMCAP_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")],
    ] {
        let mut cmd = args(&setuid);
        cmd.envs(env);
        let ran = run(cmd);
        assert_eq!(ran.ok_lines(), all(), "{env:?}");
        assert_eq!(ran.stderr(), "", "{env:?}");
    }

    // The operator's file, in a mount namespace of its own, caps it.
    let mut cmd = crate::util::bare(std::path::Path::new("unshare"));
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs none /run && mkdir /run/vramcap && echo 1GiB >/run/vramcap/operator-limit && exec \"$@\"",
        )
        .arg("sh")
        .arg(&setuid)
        .arg("shim")
        .arg(&driver)
        .arg(&shim)
        .args(["4", "256"])
        .env("VRAMCAP_LIMIT", "16GiB");
    let ran = run(cmd);
    assert_eq!(ran.ok_lines(), two_of_four());
    // Its loader ignores LD_LIBRARY_PATH, so no NVML is found and the
    // context is charged 512 MiB: two of the four fit under 1 GiB.
    let err = ran.stderr();
    let lines: Vec<&str> = err
        .lines()
        .map(|l| l.split_once("]: ").map_or(l, |p| p.1))
        .collect();
    assert_eq!(
        lines,
        [
            "cuMemAlloc: refused 268435456 bytes on device 0: 1073741824 of the 1073741824-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
        ]
    );
}

/// A cap set while the program runs (here by the program itself through
/// the C ABI, in a process started without one) engages the loader's
/// guards as a cap set at start does (issue 42, item 3): `RTLD_DEEPBIND`
/// dropped, `dlmopen` refused, a second copy of the driver not reached.
#[test]
fn a_cap_set_while_running_guards_the_loader() {
    let lib = escape_lib();
    let set = "setlimit 512 -> 0".to_string();
    let (out, err) = escape(&[], &["setlimit", "512", "deepbind", &lib, "4", "256"]);
    assert_eq!(out, [vec![set.clone()], two_of_four()].concat());
    assert_eq!(
        err,
        [
            format!(
                "\"{lib}\" is loaded without RTLD_DEEPBIND: with it, the library could call the CUDA driver around the cap. If it needs RTLD_DEEPBIND for other symbols, run it without a limit"
            ),
            REFUSED.to_string(),
        ]
    );
    let (out, _) = escape(&[], &["setlimit", "512", "dlmopen", &lib, "4", "256"]);
    assert_eq!(out, [set.clone(), "open -> null".to_string()]);
    let copy = driver_copy();
    let copy = copy.as_str();
    let (out, _) = escape(&[], &["setlimit", "512", "copy", copy, "cuMemAlloc_v2"]);
    assert_eq!(
        out,
        [set, "dlsym cuMemAlloc_v2 -> null dlerror=set".to_string()]
    );
    // Without a cap the copy is reached (uncounted, with a warning).
    let (out, _) = escape(&[], &["copy", copy, "cuMemAlloc_v2"]);
    assert_eq!(out, ["dlsym cuMemAlloc_v2 -> found dlerror=unset"]);
}

/// A lookup refused in a copy of the driver under a cap leaves `dlerror()`
/// set, as glibc does for a symbol it cannot find (issue 42, item 6):
/// CPython's ctypes read the unset one and crashed. (The driver is loaded
/// first, by `setlimit`'s cuInit: a copy loaded before it, with the same
/// soname, would be the driver the shim uses.)
#[test]
fn a_refused_lookup_sets_dlerror() {
    let copy = driver_copy();
    let copy = copy.as_str();
    let (out, err) = escape(&[CAP], &["setlimit", "256", "copy", copy, "cuMemAlloc_v2"]);
    assert_eq!(
        out,
        [
            "setlimit 256 -> 0",
            "dlsym cuMemAlloc_v2 -> null dlerror=set"
        ]
    );
    assert_eq!(
        err,
        [
            "the program looked up \"cuMemAlloc_v2\" in a library that is not the driver vramcap uses (\"libcuda.so.1\"); calls through it would not be capped, so the lookup fails. Set VRAMCAP_CUDA_LIBRARY to the libcuda.so.1 the program loads, or unset it"
        ]
    );
}

/// A copy of the stand-in driver at another path (its soname the same),
/// in the test's scratch directory.
fn driver_copy() -> String {
    let copy = crate::util::scratch_dir().join("libcuda-copy.so.1");
    std::fs::copy(
        crate::util::artefacts().standin_lib.join("libcuda.so.1"),
        &copy,
    )
    .unwrap();
    copy.to_str().unwrap().to_string()
}
