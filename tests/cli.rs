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
