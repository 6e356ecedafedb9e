//! `vramcap size`: the size grammar of `--limit`, for scripts (the GPU
//! checks read their `CAP` through it).

use std::path::Path;
use std::process::Command;

use crate::util::{artefacts, bare, run, scratch_dir};

fn size(arg: &str) -> crate::util::Ran {
    let mut cmd = bare(&artefacts().cli);
    cmd.args(["size", arg]);
    run(cmd)
}

#[test]
fn size_prints_the_byte_count() {
    for (arg, want) in [
        ("4GiB", "4294967296"),
        ("4gb", "4294967296"),
        ("4 G", "4294967296"),
        ("1920MiB", "2013265920"),
        ("1.5GiB", "1610612736"),
        ("4096", "4096"),
        ("1T", "1099511627776"),
    ] {
        size(arg).expect_lines(&[want]);
    }
}

#[test]
fn size_refuses_bad_input_with_one_line_and_an_example() {
    for arg in [
        "8XB",
        "",
        "0",
        "04GiB",
        "50%",
        "-1",
        "99999999999999999999GiB",
    ] {
        let r = size(arg);
        r.expect_code(2);
        assert_eq!(r.stdout(), "", "nothing on stdout for {arg:?}");
        let err = r.stderr();
        assert_eq!(err.lines().count(), 1, "one line for {arg:?}: {err:?}");
        assert!(
            err.contains(&format!("\"{arg}\"")),
            "the line names {arg:?}: {err:?}"
        );
        assert!(
            err.contains("vramcap size 4GiB"),
            "the line shows a correct example: {err:?}"
        );
    }
}

/// Small things a first try found: a negative --limit gets the limit's own
/// message (not clap's `-- -1` tip), a timeout of 0 a timeout's example,
/// `trim` alone names --all, `--dir` of a missing directory is said, the
/// library goes into LD_PRELOAD once however often `env` is evaluated, and
/// a closed pipe ends `doctor` without a panic.
#[test]
fn first_try_papercuts() {
    let a = artefacts();
    // vramcap ARGS, which must exit with CODE.
    let cli = |args: &[&str], code: i32| {
        let mut cmd = bare(&a.cli);
        cmd.args(args);
        let ran = run(cmd);
        ran.expect_code(code);
        ran
    };
    let ran = cli(&["run", "--limit", "-1", "--", "true"], 2);
    assert!(
        ran.stderr()
            .starts_with("vramcap: VRAMCAP_LIMIT=\"-1\" is not a valid limit"),
        "{}",
        ran.stderr()
    );
    let ran = cli(&["trim", "--timeout", "0", "1"], 2);
    assert!(
        ran.stderr().contains("(e.g. --timeout 2 or --timeout 0.5)"),
        "{}",
        ran.stderr()
    );
    let ran = cli(&["trim"], 2);
    assert_eq!(
        ran.stderr(),
        "vramcap: trim needs the processes to trim or --all, e.g. vramcap trim 4242 or vramcap trim --all\n"
    );
    let ran = cli(&["stat", "--dir", "/nonexistent/vramcap"], 0);
    assert_eq!(
        ran.stderr(),
        "vramcap: --dir /nonexistent/vramcap: no such directory (yet); nothing is shown from it until a process under vramcap writes there\n"
    );
    let mut cmd = bare(&a.cli);
    let twice = format!("{}:/opt/other.so:{}", a.shim.display(), a.shim.display());
    cmd.args(["env", "--limit", "1GiB"])
        .env("LD_PRELOAD", &twice);
    let ran = run(cmd);
    assert_eq!(
        ran.ok_lines()[0],
        format!("export LD_PRELOAD='{}:/opt/other.so'", a.shim.display())
    );
    let doctor = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "\"{}\" doctor | head -c 1 >/dev/null; echo \"${{PIPESTATUS:-done}}\"",
            a.cli.display()
        ))
        .output()
        .expect("sh runs");
    assert_eq!(
        (
            String::from_utf8_lossy(&doctor.stdout).as_ref(),
            String::from_utf8_lossy(&doctor.stderr).as_ref()
        ),
        ("done\n", ""),
        "doctor into a closed pipe ends quietly"
    );
}

/// An inherited `VRAMCAP_DISABLE` does not turn off the cap `run --limit`
/// (or `--group`) asks for: `run` clears it, `env` prints `unset`, and
/// each says so in one line. (It used to run uncapped, silently: the
/// 256 MiB chunks filled the 16 GiB stand-in.)
#[test]
fn run_and_env_clear_an_inherited_disable_switch() {
    let a = artefacts();
    for on in ["1", " 1 "] {
        let mut cmd = bare(&a.cli);
        cmd.env("VRAMCAP_DISABLE", on)
            .args(["run", "--limit", "1GiB", "--cache", "off", "--"])
            .arg(&a.client)
            .args(["procaddr", "init", "fill", "256M"]);
        let ran = run(cmd);
        ran.expect_lines(&[
            "init -> 0",
            "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        ]);
        // Then the shim's line for the refused fifth chunk.
        assert_eq!(
            ran.stderr().lines().next(),
            Some(format!(
                "vramcap: VRAMCAP_DISABLE={on:?} in the environment would turn vramcap off; run clears it, since --limit asks for a cap (to run uncapped, leave out --limit, e.g. vramcap run -- python train.py)"
            ).as_str())
        );
    }
    let mut cmd = bare(&a.cli);
    cmd.env("VRAMCAP_DISABLE", "1")
        .args(["env", "--group", "train"]);
    let ran = run(cmd);
    let lines = ran.ok_lines();
    assert!(
        lines.contains(&"unset VRAMCAP_DISABLE".to_string()),
        "{lines:?}"
    );
    assert_eq!(
        ran.stderr(),
        "vramcap: VRAMCAP_DISABLE=\"1\" in the environment would turn vramcap off; env clears it, since --group asks for a cap (to run uncapped, leave out --group, e.g. vramcap env)\n"
    );
    // Without --limit or --group the switch is the user's to keep.
    let mut cmd = bare(&a.cli);
    cmd.env("VRAMCAP_DISABLE", "1").arg("env");
    let ran = run(cmd);
    assert!(!ran.ok_lines().iter().any(|l| l.starts_with("unset")));
    assert_eq!(ran.stderr(), "");
}

/// `run` refuses, in one line and with status 126, a program the loader
/// would run in secure-execution mode, where it drops `LD_PRELOAD`: one
/// set-user-ID or set-group-ID to someone else, or (for a caller other
/// than root) one with file capabilities. It used to run them uncapped,
/// silently; under no_new_privs, which makes exec grant nothing, it runs
/// them, capped. (Needs root, to give a copy of the client away, and fails under
/// no_new_privs or with an /etc/ld.so.preload.)
#[test]
#[ignore = "needs root"]
fn run_refuses_a_program_that_would_drop_the_shim() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    crate::util::needs_root();
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 };
    assert!(
        !nnp && !Path::new("/etc/ld.so.preload").exists(),
        "this test needs a process without no_new_privs and no /etc/ld.so.preload (under either, exec grants nothing and run lets the program go)"
    );
    let a = artefacts();
    let lib = std::fs::canonicalize(&a.shim).unwrap();
    let dir = scratch_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = |name: &str, uid: u32, gid: u32, mode: u32| {
        let p = dir.join(name);
        std::fs::copy(&a.client, &p).unwrap();
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    };
    let line = |p: &Path, why: &str| {
        format!(
            "vramcap: {} is {why}: the loader runs it in secure-execution mode and drops LD_PRELOAD, so it would run uncapped; run a program that is not, or have the loader preload the shim for every program (e.g. echo {} >> /etc/ld.so.preload, as root)\n",
            p.display(),
            lib.display()
        )
    };
    let refused = |mut cmd: Command, p: &Path, why: &str| {
        cmd.args(["run", "--limit", "1GiB", "--"])
            .arg(p)
            .args(["procaddr", "init"]);
        let ran = run(cmd);
        ran.expect_code(126);
        assert_eq!(ran.stdout(), "");
        assert_eq!(ran.stderr(), line(p, why));
    };
    let setuid = copy("setuid", 65534, 0, 0o4755);
    refused(bare(&a.cli), &setuid, "set-user-ID to user 65534");
    let setgid = copy("setgid", 0, 65534, 0o2755);
    refused(bare(&a.cli), &setgid, "set-group-ID to group 65534");
    // Found through PATH as exec finds it.
    let mut cmd = bare(&a.cli);
    cmd.env("PATH", format!("{}:/usr/bin:/bin", dir.display()));
    cmd.args(["run", "--", "setuid"]);
    let ran = run(cmd);
    ran.expect_code(126);
    assert_eq!(ran.stderr(), line(&setuid, "set-user-ID to user 65534"));
    // A set-group-ID bit without group execute is no set-group-ID
    // program, and one's own set-user-ID program gains nothing: both run.
    for (name, uid, gid, mode) in [("locking", 0, 65534, 0o2745), ("own", 0, 0, 0o4755)] {
        let p = copy(name, uid, gid, mode);
        let mut cmd = bare(&a.cli);
        cmd.args(["run", "--limit", "1GiB", "--"])
            .arg(&p)
            .args(["procaddr", "init", "info"]);
        run(cmd).expect_lines(&["init -> 0", "info -> 0 free=1073741824 total=1073741824"]);
    }
    // Under no_new_privs (Kubernetes' allowPrivilegeEscalation: false)
    // exec grants nothing and the loader keeps LD_PRELOAD: it runs, capped.
    let mut cmd = bare(Path::new("setpriv"));
    cmd.arg("--no-new-privs")
        .arg(&a.cli)
        .args(["run", "--limit", "1GiB", "--"])
        .arg(&setuid)
        .args(["procaddr", "init", "info"]);
    run(cmd).expect_lines(&["init -> 0", "info -> 0 free=1073741824 total=1073741824"]);
    // File capabilities (CAP_NET_BIND_SERVICE, effective), run by a user
    // other than root: refused too.
    let capped = copy("capabilities", 0, 0, 0o755);
    // struct vfs_cap_data, revision 2: magic | effective, then the
    // permitted and inheritable words of the two halves.
    let mut caps = Vec::new();
    for w in [0x0200_0001u32, 1 << 10, 0, 0, 0] {
        caps.extend_from_slice(&w.to_le_bytes());
    }
    let c = std::ffi::CString::new(capped.as_os_str().as_bytes()).unwrap();
    // SAFETY: C strings and a buffer of caps.len() bytes.
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            caps.as_ptr().cast(),
            caps.len(),
            0,
        )
    };
    if rc != 0 {
        eprintln!(
            "file capabilities not checked: setxattr: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let mut cmd = bare(Path::new("setpriv"));
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&a.cli);
    refused(
        cmd,
        &capped,
        "given file capabilities (security.capability)",
    );
}
