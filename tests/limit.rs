//! `VRAMCAP_LIMIT` as the shim, `vramcap run` and `vramcap doctor` read it,
//! against the stand-in driver: a key that names no GPU stops the program
//! (never runs it uncapped) and all three say so in the same line; a
//! misspelt setting is named with the closest one; a limit longer than a
//! group can record is refused everywhere; and, on a few hundred generated
//! values, `vramcap run` refuses exactly what the shim refuses.

use std::process::Command;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::util::*;

const STOP: &str = "; stopping with exit status 2 rather than run without the cap asked for";

/// The stand-in's two devices, as the key check lists them.
const TWO: &str = "this process sees 2: 0 GPU-5ca1ab1e-0000-4000-8000-000000000000 (vramcap stand-in 0), 1 GPU-5ca1ab1e-0000-4000-8000-000000000001 (vramcap stand-in 1)";

/// The one line a process printed on stderr, without its `vramcap[PID]: `.
fn only_line(ran: &Ran) -> String {
    let err = ran.stderr();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err:?}");
    let (prefix, rest) = lines[0].split_once("]: ").expect("a vramcap[PID] prefix");
    assert!(prefix.starts_with("vramcap["), "{err:?}");
    rest.to_string()
}

fn vramcap(args: &[&str]) -> Command {
    let mut cmd = bare(&artefacts().cli);
    cmd.args(args);
    cmd
}

#[test]
fn a_key_that_names_no_gpu_stops_the_program_at_its_first_cap() {
    let cases = [
        (
            "5=1GiB",
            format!(
                "VRAMCAP_LIMIT=\"5=1GiB\": device 5 names no GPU; {TWO}; a device is its index or a prefix of its UUID, e.g. 1=1GiB or GPU-5ca1ab1e-0000-4000-8000-000000000001=1GiB"
            ),
        ),
        (
            "GPU-5ca1ab1e0000=1G",
            format!(
                "VRAMCAP_LIMIT=\"GPU-5ca1ab1e0000=1G\": device GPU-5ca1ab1e0000 names no GPU; {TWO}; a device is its index or a prefix of its UUID, e.g. 1=1GiB or GPU-5ca1ab1e-0000-4000-8000-000000000001=1GiB"
            ),
        ),
        (
            "4GiB,2=1G,GPU-aa=2G",
            format!(
                "VRAMCAP_LIMIT=\"4GiB,2=1G,GPU-aa=2G\": devices 2, GPU-aa name no GPU; {TWO}; a device is its index or a prefix of its UUID, e.g. 1=1GiB or GPU-5ca1ab1e-0000-4000-8000-000000000001=1GiB"
            ),
        ),
    ];
    for (limit, line) in &cases {
        // CUDA is initialised (main ran); the first call that needs a cap
        // stops the process: nothing is allocated uncapped.
        for first in [["alloc", "8G"], ["info", "info"], ["total", "0"]] {
            let ran = client(
                "procaddr",
                &[("VRAMCAP_LIMIT", limit), ("STANDIN_REPORT", "1")],
                &["init", first[0], first[1]],
            );
            ran.expect_code(2);
            assert_eq!(ran.stdout(), "init -> 0\n", "{limit}");
            assert_eq!(only_line(&ran), format!("{line}{STOP}"));
        }
        // Programs linked with -lcuda and dlsym users alike.
        for method in ["linked", "dlsym"] {
            let ran = client(
                method,
                &[("VRAMCAP_LIMIT", limit)],
                &["init", "alloc", "8G"],
            );
            ran.expect_code(2);
            assert_eq!(ran.stdout(), "init -> 0\n");
        }
    }
    // Keys that name the devices run as before.
    client(
        "procaddr",
        &[(
            "VRAMCAP_LIMIT",
            "1=1GiB,GPU-5CA1AB1E-0000-4000-8000-000000000000=2GiB",
        )],
        &["init", "fill", "1G", "ctx", "1", "fill", "1G"],
    )
    .expect_lines(&[
        "init -> 0",
        "fill 1073741824 -> 2 allocs 2147483648 bytes rc=2",
        "ctx 1 -> 0",
        "fill 1073741824 -> 1 allocs 1073741824 bytes rc=2",
    ]);
}

/// A UUID of a GPU that is on the machine but that the process does not
/// see (a setting shared under `CUDA_VISIBLE_DEVICES`) is no error; a UUID
/// of no GPU at all is, and the line lists the machine's others.
#[test]
fn a_uuid_of_a_gpu_the_process_does_not_see_is_no_error() {
    // Four GPUs on the machine, two visible: as on a real machine,
    // CUDA_VISIBLE_DEVICES says which (the CUDA stand-in does not read it,
    // it always has two; `vramcap run` reads it to know what is visible).
    let four = ("STANDIN_NVML_DEVICES", "4");
    let cvd = ("CUDA_VISIBLE_DEVICES", "0,1");
    let shared = "GPU-5ca1ab1e-0000-4000-8000-000000000003=1GiB,0=2GiB";
    client(
        "procaddr",
        &[four, cvd, ("VRAMCAP_LIMIT", shared)],
        &["init", "fill", "1G"],
    )
    .expect_lines(&[
        "init -> 0",
        "fill 1073741824 -> 2 allocs 2147483648 bytes rc=2",
    ]);
    let mut cmd = vramcap(&["run", &format!("--limit={shared}"), "--"]);
    cmd.env(four.0, four.1)
        .env(cvd.0, cvd.1)
        .arg(&artefacts().client)
        .args(["procaddr", "init", "fill", "1G"]);
    run(cmd).expect_lines(&[
        "init -> 0",
        "fill 1073741824 -> 2 allocs 2147483648 bytes rc=2",
    ]);

    let typo = "GPU-5ca1ab1e-0000-4000-8000-000000000007=1GiB";
    let line = format!(
        "VRAMCAP_LIMIT=\"{typo}\": device GPU-5ca1ab1e-0000-4000-8000-000000000007 names no GPU; {TWO}; the machine also has GPU-5ca1ab1e-0000-4000-8000-000000000002 (vramcap stand-in 2), GPU-5ca1ab1e-0000-4000-8000-000000000003 (vramcap stand-in 3); a device is its index or a prefix of its UUID, e.g. 1=1GiB or GPU-5ca1ab1e-0000-4000-8000-000000000001=1GiB"
    );
    let ran = client(
        "procaddr",
        &[four, cvd, ("VRAMCAP_LIMIT", typo)],
        &["init", "alloc", "1G"],
    );
    ran.expect_code(2);
    assert_eq!(only_line(&ran), format!("{line}{STOP}"));
    // `vramcap run` says the same before starting anything.
    let mut cmd = vramcap(&["run", "--limit", typo, "--", "/bin/echo", "ran"]);
    cmd.env(four.0, four.1).env(cvd.0, cvd.1);
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(ran.stdout(), "");
    assert_eq!(ran.stderr(), format!("vramcap: {line}\n"));
}

#[test]
fn run_and_doctor_say_what_the_shim_says() {
    for limit in ["5=1GiB", "GPU-5ca1ab1e0000=1G"] {
        let shim = client(
            "procaddr",
            &[("VRAMCAP_LIMIT", limit)],
            &["init", "alloc", "1M"],
        );
        shim.expect_code(2);
        let line = only_line(&shim);
        let line = line.strip_suffix(STOP).expect("the shim's line");

        let ran = run(vramcap(&[
            "run",
            "--limit",
            limit,
            "--",
            "/bin/echo",
            "ran",
        ]));
        ran.expect_code(2);
        assert_eq!(ran.stdout(), "", "nothing started");
        assert_eq!(ran.stderr(), format!("vramcap: {line}\n"));
        let ran = run(vramcap(&["env", "--limit", limit]));
        ran.expect_code(2);
        assert_eq!(ran.stderr(), format!("vramcap: {line}\n"));

        let dir = scratch_dir();
        let mut cmd = vramcap(&["doctor"]);
        cmd.env("VRAMCAP_STATS_DIR", &dir)
            .env("VRAMCAP_LIMIT", limit);
        let out = stdout_of_failure(cmd);
        assert!(
            out.contains(&format!(
                "FAIL  limit's devices: {line}{STOP} (exit status: 2)\n      fix: name each device by its index"
            )),
            "{out}"
        );
        assert!(out.ends_with("1 problem(s) found\n"), "{out}");
    }
    let dir = scratch_dir_named("ok");
    let mut cmd = vramcap(&["doctor"]);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .env("VRAMCAP_LIMIT", "1=1GiB,GPU-5ca1ab1e=2GiB");
    let lines = run(cmd).ok_lines();
    assert!(
        lines
            .iter()
            .any(|l| l == "ok    limit's devices: every device key names a GPU"),
        "{lines:?}"
    );
    assert_eq!(lines.last().map(String::as_str), Some("no problems found"));
}

#[test]
fn a_misspelt_setting_is_named_with_the_closest_one() {
    let env = [
        ("VRAMCAP_LIMT", "1GiB"),
        ("vramcap_limit", "2GiB"),
        ("Vramcap_Limit", "3GiB"),
    ];
    let want = [
        "VRAMCAP_LIMT=1GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?",
        "vramcap_limit=2GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?",
        "Vramcap_Limit=3GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?",
    ];
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let want_sorted = sorted(want.iter().map(|s| s.to_string()).collect());

    // The shim warns at load (the program runs: it is a warning).
    let ran = client("procaddr", &env, &["init", "alloc", "1G"]);
    assert_eq!(ran.ok_lines(), ["init -> 0", "alloc 1073741824 -> 0 #0"]);
    let got: Vec<String> = ran
        .stderr()
        .lines()
        .map(|l| l.split_once("]: ").unwrap().1.to_string())
        .collect();
    assert_eq!(sorted(got), want_sorted);

    // `vramcap run` warns too, then runs the command (whose shim warns).
    let mut cmd = vramcap(&["run", "--", "/bin/true"]);
    cmd.envs(env);
    let ran = run(cmd);
    ran.expect_code(0);
    let got: Vec<String> = ran
        .stderr()
        .lines()
        .filter_map(|l| l.strip_prefix("vramcap: "))
        .map(str::to_string)
        .collect();
    assert_eq!(sorted(got), want_sorted);

    // `vramcap doctor` fails on them, one problem each.
    let dir = scratch_dir();
    let mut cmd = vramcap(&["doctor"]);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .env("VRAMCAP_LIMT", "1GiB");
    let out = stdout_of_failure(cmd);
    assert!(
        out.contains(
            "FAIL  settings in this environment: VRAMCAP_LIMT=1GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?\n      fix: rename it to the setting you meant (VRAMCAP_LIMIT) or unset it\n"
        ),
        "{out}"
    );
    assert!(out.ends_with("1 problem(s) found\n"), "{out}");
}

/// A group records its limit in 511 bytes; a longer one is refused by the
/// shim and by `vramcap run` alike, rather than cut and read as no cap.
#[test]
fn a_limit_longer_than_a_group_records_is_refused_everywhere() {
    let long: String = (0..12)
        .map(|i| format!("GPU-5ca1ab1e-0000-4000-8000-0000000000{i:02}=1GiB"))
        .collect::<Vec<_>>()
        .join(",");
    let dir = scratch_dir();
    let want = format!(
        "VRAMCAP_LIMIT=\"{}…\" is not a valid limit: the value is 551 bytes long, more than the 511 a limit may have (a UUID key can be a short prefix, e.g. GPU-5ca1ab1e); expected a size or percentage per GPU, e.g. 8GiB, 50%, 0=8GiB,1=4GiB or 4GiB,GPU-5ca1ab1e=2GiB",
        &long[..64]
    );
    let mut cmd = vramcap(&["run", "--group", "g", "--limit", &long, "--"]);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .arg(&artefacts().client)
        .args(["procaddr", "init", "alloc", "8G"]);
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(ran.stdout(), "");
    assert_eq!(ran.stderr(), format!("vramcap: {want}\n"));

    let ran = client(
        "procaddr",
        &[
            ("VRAMCAP_LIMIT", &long),
            ("VRAMCAP_GROUP", "g"),
            ("VRAMCAP_STATS_DIR", dir.to_str().unwrap()),
        ],
        &["init", "alloc", "8G"],
    );
    ran.expect_code(2);
    assert_eq!(ran.stdout(), "", "main must not run");
    assert_eq!(only_line(&ran), want);
    assert!(!dir.join("group-g.grp").exists());
}

/// Limits as people write them, right or wrong: the stand-in's devices
/// and others, UUID prefixes and typos, every unit spelling, bad amounts,
/// stray spaces, and arbitrary text.
fn limit_values() -> impl Strategy<Value = String> {
    use proptest::prelude::*;
    let key = prop_oneof![
        // Keys of the stand-in's two devices.
        4 => prop::sample::select(vec![
            "0",
            "1",
            "GPU-5ca1ab1e",
            "gpu-5CA1AB1E-0000-4000-8000-000000000001",
        ]),
        // Keys that parse but name no GPU.
        2 => prop::sample::select(vec![
            "2",
            "7",
            "63",
            "GPU-5ca1ab1e0000",
            "GPU-5ca1ab1e-0000-4000-8000-000000000002",
            "GPU-0",
        ]),
        // Keys that do not parse.
        1 => prop::sample::select(vec!["00", "64", "x", "", "GPU-", "GPU-zz", "-1"]),
    ];
    let amount = prop_oneof![
        4 => prop::sample::select(vec![
            "1G", "512MiB", "50%", "12.5%", "1.5G", "4096", "2 GiB", "1t", "0.5k", "100%",
        ])
        .prop_map(str::to_string),
        2 => (1u64..1 << 40).prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec![
            "0", "8XB", "101%", "", "-1G", "99999999T", "010", "1.G", "0%",
        ])
        .prop_map(str::to_string),
    ];
    let space = || prop::sample::select(vec!["", "", " "]);
    let keyed = (key, amount.clone(), space()).prop_map(|(k, a, s)| format!("{s}{k}{s}={a}"));
    let default = (amount, space()).prop_map(|(a, s)| format!("{a}{s}"));
    let spec = (
        prop::option::of(default),
        prop::collection::vec(keyed, 0..4),
        prop::bool::ANY,
    )
        .prop_map(|(d, mut items, default_last)| {
            if let Some(d) = d {
                if default_last {
                    items.push(d);
                } else {
                    items.insert(0, d);
                }
            }
            items.join(",")
        });
    prop_oneof![
        6 => spec,
        1 => "\\PC{0,24}",
    ]
}

/// The property: `vramcap run --limit=V` refuses (exit 2, nothing started)
/// exactly when the shim refuses `VRAMCAP_LIMIT=V` (exit 2, before `main`
/// or at the first call that needs a cap), and what `run` accepts runs.
/// 400 values from a fixed seed (so CI sees the same ones every time), in
/// four threads: 800 processes under the shim, 400 of `vramcap run`.
#[test]
fn run_refuses_exactly_the_limits_the_shim_refuses() {
    const CASES: usize = 400;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = limit_values();
    let mut values: Vec<String> = vec![
        "5=1GiB".into(),
        "GPU-5ca1ab1e0000=1G".into(),
        "8GiB".into(),
        format!("{}1G", " ".repeat(509)),
        format!("{}1G", " ".repeat(510)),
    ];
    while values.len() < CASES {
        let v = strategy
            .new_tree(&mut runner)
            .expect("the strategy always yields")
            .current();
        values.push(v);
    }
    let args = ["procaddr", "init", "alloc", "1M"];
    // (value, the shim refused, run refused, run's line named an unmatched key)
    let verdicts: Vec<(String, bool, bool, bool)> = std::thread::scope(|scope| {
        let workers: Vec<_> = values
            .chunks(CASES.div_ceil(4))
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|v| {
                            let shim = client("procaddr", &[("VRAMCAP_LIMIT", v)], &args[1..]);
                            let shim_refused = shim.code() == Some(2);
                            assert!(
                                shim_refused || shim.code() == Some(0),
                                "{v:?}: the shim neither ran nor refused: {}",
                                shim.stderr()
                            );
                            let mut cmd = vramcap(&["run", &format!("--limit={v}"), "--"]);
                            cmd.arg(&artefacts().client).args(args);
                            let ran = run(cmd);
                            let run_refused = ran.code() == Some(2) && ran.stdout().is_empty();
                            let keys = ran.stderr().contains("names no GPU")
                                || ran.stderr().contains("name no GPU");
                            if !run_refused {
                                assert_eq!(
                                    ran.code(),
                                    Some(0),
                                    "{v:?}: accepted by run, yet the program failed: {}",
                                    ran.stderr()
                                );
                            } else {
                                let err = ran.stderr();
                                assert_eq!(err.lines().count(), 1, "{v:?}: {err}");
                                assert!(err.starts_with("vramcap: VRAMCAP_LIMIT="), "{v:?}: {err}");
                            }
                            (v.clone(), shim_refused, run_refused, keys)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker"))
            .collect()
    });
    let differ: Vec<_> = verdicts.iter().filter(|(_, s, r, _)| s != r).collect();
    assert!(
        differ.is_empty(),
        "shim and run disagree (value, shim refused, run refused): {differ:?}"
    );
    let refused = verdicts.iter().filter(|(_, s, _, _)| *s).count();
    let by_keys = verdicts.iter().filter(|(_, _, _, k)| *k).count();
    assert!(
        refused > CASES / 5 && refused < CASES * 4 / 5 && by_keys > CASES / 10,
        "the values test every answer: {refused} of {CASES} refused, {by_keys} for keys that name no GPU"
    );
}
