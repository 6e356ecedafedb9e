//! Caps the program is given rather than sets: NVIDIA's container variable
//! and the operator's file, which only ever make a cap stricter; and a
//! capped program never reaches a driver the shim does not use.

use std::path::Path;
use std::process::Command;

use crate::live::{ONE_GIB, limit};
use crate::util::*;

/// `NVIDIA_GPU_MEMORY_LIMIT` (NVIDIA's container toolkit variable, whole
/// MiB) caps every GPU, alone or with `VRAMCAP_LIMIT` (the stricter
/// applies); a value in another form stops the program with one line.
#[test]
fn nvidias_memory_limit_variable_caps_every_gpu() {
    let nv = |v| ("NVIDIA_GPU_MEMORY_LIMIT", v);
    client(
        "procaddr",
        &[ONE_GIB, nv("512")],
        &["init", "info", "ctx", "1", "info"],
    )
    .expect_lines(&[
        "init -> 0",
        &format!("info -> 0 free={} total={}", 512 * MIB, 512 * MIB),
        "ctx 1 -> 0",
        &format!("info -> 0 free={} total={}", 512 * MIB, 512 * MIB),
    ]);
    client("procaddr", &[nv(" 2048 ")], &["init", "info"]).expect_lines(&[
        "init -> 0",
        &format!("info -> 0 free={} total={}", 2 * GIB, 2 * GIB),
    ]);
    client("procaddr", &[ONE_GIB, nv("4096")], &["init", "info"])
        .expect_lines(&["init -> 0", &format!("info -> 0 free={GIB} total={GIB}")]);
    for bad in ["4Gi", "0", "-1", ""] {
        let ran = client("procaddr", &[nv(bad)], &["init"]);
        ran.expect_code(2);
        assert!(
            ran.stderr().ends_with(&format!(
                "NVIDIA_GPU_MEMORY_LIMIT=\"{bad}\" is not valid: expected a whole number of MiB greater than 0, as NVIDIA's container toolkit takes it (e.g. NVIDIA_GPU_MEMORY_LIMIT=8192)\n"
            )),
            "{}",
            ran.stderr()
        );
    }
}

/// The client under the shim in a private mount namespace whose /run is
/// a fresh tmpfs holding `text` as the operator's cap file (mode `mode`),
/// with `env` added; its output. Root only.
fn with_operator_file(text: &str, mode: &str, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = bare(Path::new("unshare"));
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs none /run && mkdir /run/vramcap && printf '%s' \"$1\" >/run/vramcap/operator-limit \
             && chmod \"$2\" /run/vramcap/operator-limit && shim=$3 && shift 3 && exec env LD_PRELOAD=\"$shim\" \"$@\"",
        )
        .args(["sh", text, mode])
        .arg(&artefacts().shim)
        .arg(&artefacts().client)
        .arg("procaddr")
        .args(args)
        .envs(env.iter().copied());
    cmd
}

/// The operator's cap (`/run/vramcap/operator-limit`, root's, read-only in
/// a container) only makes caps stricter: no variable lifts it
/// (`VRAMCAP_LIMIT`, `VRAMCAP_DISABLE=1`, none at all), no change from
/// inside or outside passes it; a root file that holds no cap stops the
/// program; one anyone may write is ignored with a warning.
#[test]
#[ignore = "needs root"]
fn the_operators_cap_file_holds_whatever_the_environment_says() {
    needs_root();
    let file = "# set by the device plugin\n256MiB\n";
    let quarter = format!("info -> 0 free={} total={}", 256 * MIB, 256 * MIB);
    for env in [
        &[ONE_GIB][..],
        &[],
        &[("VRAMCAP_LIMIT", "16GiB")],
        &[ONE_GIB, ("VRAMCAP_DISABLE", "1")],
        &[ONE_GIB, ("VRAMCAP_COUNT", "allocations")],
        &[ONE_GIB, ("VRAMCAP_CONTEXT", "0")],
        &[
            ONE_GIB,
            ("VRAMCAP_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"),
        ],
    ] {
        let ran = run(with_operator_file(
            file,
            "644",
            env,
            &[
                "init", "info", "setlimit", "0", "1G", "setlimit", "0", "max", "fill", "64M",
            ],
        ));
        ran.expect_lines(&[
            "init -> 0",
            &quarter,
            &format!("setlimit 0 {GIB} -> -1"),
            "setlimit 0 max -> -1",
            &format!("fill {} -> 4 allocs {} bytes rc=2", 64 * MIB, 256 * MIB),
        ]);
        let warned = ran.stderr().contains(" is ignored: ")
            && ran
                .stderr()
                .contains("the operator's cap (/run/vramcap/operator-limit)");
        assert_eq!(warned, env.len() == 2, "{env:?}: {}", ran.stderr());
    }

    // From outside: `vramcap limit` may not raise it past the file either.
    let dir = scratch_dir();
    let mut cmd = with_operator_file(
        file,
        "644",
        &[ONE_GIB],
        &["init", "alloc", "64M", "wait", "alloc", "448M", "info"],
    );
    cmd.env("VRAMCAP_STATS_DIR", &dir);
    let mut h = Held::at_wait(cmd);
    let pid = h.pid();
    limit(&dir, &["--pid", &pid.to_string(), "1GiB"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 256 MiB -> 256 MiB, holds 64.0 MiB"
    )]);
    // Root raises the file (written in place, as through the node's copy
    // of a bind mount): the next change may go up to it, not past it.
    std::fs::write(
        format!("/proc/{pid}/root/run/vramcap/operator-limit"),
        "512MiB\n",
    )
    .unwrap();
    limit(&dir, &["--pid", &pid.to_string(), "1GiB"]).expect_lines(&[&format!(
        "{pid} gpu 0: limit 256 MiB -> 512 MiB, holds 64.0 MiB"
    )]);
    let mut stat = bare(&artefacts().cli);
    stat.env("VRAMCAP_STATS_DIR", &dir)
        .args(["stat", "--json", "--pid", &pid.to_string()]);
    let j: serde_json::Value = serde_json::from_str(&run(stat).ok_lines().join("")).unwrap();
    assert_eq!(
        j["processes"][0]["devices"][0]["operator_limit_bytes"],
        512 * MIB,
        "{j}"
    );
    // The page is the user's: a cap word written there does not pass the
    // operator's cap, which the shim keeps in its own memory too.
    {
        use std::os::unix::fs::FileExt;
        let page = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(format!("{pid}.page")))
            .unwrap();
        page.write_all_at(&u64::MAX.to_ne_bytes(), 1024).unwrap();
    }
    h.resume();
    let (lines, out) = h.finish();
    // 64 MiB held + 448 MiB fits the raised operator's cap exactly; the
    // info line's total is that cap, not what the page's word says.
    assert_eq!(
        &lines[lines.len() - 2..],
        [
            format!("alloc {} -> 0 #1", 448 * MIB),
            format!("info -> 0 free=0 total={}", 512 * MIB)
        ],
        "{lines:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("is above the operator's cap of 536870912 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A root file that is no cap: the program does not run.
    let ran = run(with_operator_file("lots\n", "644", &[ONE_GIB], &["init"]));
    ran.expect_code(2);
    assert!(
        ran.stderr()
            .contains("/run/vramcap/operator-limit: \"lots\" is not a valid limit: ")
            && ran.stderr().ends_with(
                " (the file holds the operator's cap in the grammar of VRAMCAP_LIMIT, with a default and UUID keys only, e.g. a line 8GiB)\n"
            ),
        "{}",
        ran.stderr()
    );
    // Index keys (CUDA_VISIBLE_DEVICES moves them) and a file without a
    // default (a GPU it does not name would be uncapped) do not run either.
    for (text, why) in [
        ("0=256MiB", "\"0=256MiB\" has no default"),
        (
            "256MiB,1=128MiB",
            "\"256MiB,1=128MiB\" names GPU 1 by index",
        ),
        (
            "GPU-5ca1ab1e=256MiB",
            "has no default, so a GPU it does not name would have no cap",
        ),
        ("256MiB\n512MiB\n", "2 values, expected one"),
    ] {
        let ran = run(with_operator_file(text, "644", &[ONE_GIB], &["init"]));
        ran.expect_code(2);
        assert!(ran.stderr().contains(why), "{text:?}: {}", ran.stderr());
    }
    // One anyone may write is not the operator's: ignored, said.
    let ran = run(with_operator_file(
        file,
        "666",
        &[ONE_GIB],
        &["init", "info"],
    ));
    ran.expect_lines(&["init -> 0", &format!("info -> 0 free={GIB} total={GIB}")]);
    assert!(
        ran.stderr().contains(
            "ignoring the operator's cap: /run/vramcap/operator-limit could have been written by this user (owner uid 0, mode 666)"
        ),
        "{}",
        ran.stderr()
    );
}

/// A program that finds the driver in another library than the one
/// `VRAMCAP_CUDA_LIBRARY` names would bypass the hooks: with a cap asked
/// for, its lookup fails (it does not run uncapped); without one, it runs,
/// uncounted, with a warning.
#[test]
fn a_driver_the_shim_does_not_use_is_not_reached_when_a_cap_was_asked_for() {
    let wrong = ("VRAMCAP_CUDA_LIBRARY", "/nonexistent/libcuda.so.1");
    let ran = client("procaddr", &[ONE_GIB, wrong], &["init", "fill", "256M"]);
    ran.expect_code(69);
    assert!(ran.stdout().is_empty(), "{}", ran.stdout());
    assert!(
        ran.stderr().contains(
            "the program looked up \"cuGetProcAddress_v2\" in a library that is not the driver vramcap uses (\"/nonexistent/libcuda.so.1\"); calls through it would not be capped, so the lookup fails"
        ),
        "{}",
        ran.stderr()
    );
    let ran = client("procaddr", &[wrong], &["init"]);
    ran.expect_lines(&["init -> 0"]);
    assert!(
        ran.stderr().contains("calls through it are not counted"),
        "{}",
        ran.stderr()
    );
}
