//! `vramcap size`: the size grammar of `--limit`, for scripts (the GPU
//! checks read their `CAP` through it).

use crate::util::{artefacts, bare, run};

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
    let mut cmd = bare(&a.cli);
    cmd.args(["run", "--limit", "-1", "--", "true"]);
    let ran = run(cmd);
    ran.expect_code(2);
    assert!(
        ran.stderr()
            .starts_with("vramcap: VRAMCAP_LIMIT=\"-1\" is not a valid limit"),
        "{}",
        ran.stderr()
    );
    let mut cmd = bare(&a.cli);
    cmd.args(["trim", "--timeout", "0", "1"]);
    let ran = run(cmd);
    ran.expect_code(2);
    assert!(
        ran.stderr().contains("(e.g. --timeout 2 or --timeout 0.5)"),
        "{}",
        ran.stderr()
    );
    let mut cmd = bare(&a.cli);
    cmd.arg("trim");
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        "vramcap: trim needs the processes to trim or --all, e.g. vramcap trim 4242 or vramcap trim --all\n"
    );
    let mut cmd = bare(&a.cli);
    cmd.args(["stat", "--dir", "/nonexistent/vramcap"]);
    let ran = run(cmd);
    ran.expect_code(0);
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
