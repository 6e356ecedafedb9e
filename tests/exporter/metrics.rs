//! What a scrape holds: the pages' exact values and labels, dead and
//! unreadable pages, groups, escaping, and the directories `--dir` names.

use super::*;

#[test]
fn a_scrape_has_the_pages_exact_bytes_and_labels() {
    let dir = scratch_dir();
    let a = held(
        &dir,
        Some("1GiB"),
        &[
            ("POD_NAME", "trainer-0"),
            ("POD_NAMESPACE", "ml"),
            ("CONTAINER_NAME", "main"),
        ],
        &[
            "init", "alloc", "300M", "ctx", "1", "alloc", "1G", "alloc", "1G", "wait",
        ],
    );
    // Uncapped, outside Kubernetes: no limit sample, no pod labels.
    // Its second 64 MiB comes from the cache and goes back to it.
    let b = held(
        &dir,
        None,
        &[],
        &[
            "init", "alloc", "64M", "free", "0", "alloc", "64M", "free", "1", "wait",
        ],
    );
    let ex = Exporter::start(&dir);
    let m = ex.scrape();
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());

    for name in GAUGES.iter().chain(&COUNTERS).chain(&[
        "vramcap_group_memory_limit_bytes",
        "vramcap_group_memory_used_bytes",
        "vramcap_group_members",
        "vramcap_pages_skipped",
    ]) {
        assert!(
            m.scrape.docs.contains_key(*name),
            "no HELP for {name}\n{}",
            m.text
        );
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        assert!(
            m.text.contains(&format!("\n# TYPE {name} {kind}\n")),
            "no TYPE for {name}"
        );
    }

    let a0 = [("pid", pa.as_str()), ("gpu", "0"), ("UUID", UUID0)];
    let a1 = [("pid", pa.as_str()), ("gpu", "1"), ("UUID", UUID1)];
    let v = |metric, labels: &[(&str, &str)]| m.value(metric, labels);
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &a0), Some(300 * MIB));
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &a0), Some(314_572_800));
    assert_eq!(
        v("vramcap_gpu_memory_limit_bytes", &a0),
        Some(1_073_741_824)
    );
    assert_eq!(v("vramcap_gpu_memory_peak_bytes", &a0), Some(300 * MIB));
    assert_eq!(v("vramcap_gpu_memory_cached_bytes", &a0), Some(0));
    assert_eq!(v("vramcap_gpu_memory_spilled_bytes", &a0), Some(0));
    assert_eq!(v("vramcap_allocations_total", &a0), Some(1));
    assert_eq!(v("vramcap_frees_total", &a0), Some(0));
    assert_eq!(v("vramcap_refusals_total", &a0), Some(0));
    assert_eq!(v("vramcap_cache_misses_total", &a0), Some(1));
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &a1), Some(GIB));
    assert_eq!(v("vramcap_gpu_memory_limit_bytes", &a1), Some(GIB));
    assert_eq!(v("vramcap_allocations_total", &a1), Some(1));
    assert_eq!(v("vramcap_refusals_total", &a1), Some(1));
    assert_eq!(v("vramcap_cache_misses_total", &a1), Some(2));
    assert_eq!(v("vramcap_spill_allocations_total", &a1), Some(0));

    // Every label, the command cut to 128 characters.
    let s = m.find("vramcap_gpu_memory_used_bytes", &a0)[0];
    let command: String = format!(
        "{} procaddr init alloc 300M ctx 1 alloc 1G alloc 1G wait",
        artefacts().client.display()
    )
    .chars()
    .take(128)
    .collect();
    let dir_text = dir.display().to_string();
    let mut want = vec![
        ("UUID", UUID0),
        ("command", command.as_str()),
        ("container", "main"),
        ("dir", dir_text.as_str()),
        ("gpu", "0"),
        ("group", ""),
        ("namespace", "ml"),
        ("pid", pa.as_str()),
        ("pod", "trainer-0"),
    ];
    want.sort();
    let mut got: Vec<(&str, &str)> = s
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    got.sort();
    assert_eq!(got, want);

    // The uncapped client: no limit sample, no Kubernetes labels.
    let b0 = [("pid", pb.as_str()), ("gpu", "0")];
    assert_eq!(v("vramcap_gpu_memory_limit_bytes", &b0), None);
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &b0), Some(64 * MIB));
    assert_eq!(v("vramcap_gpu_memory_cached_bytes", &b0), Some(64 * MIB));
    assert_eq!(v("vramcap_gpu_memory_peak_bytes", &b0), Some(64 * MIB));
    assert_eq!(v("vramcap_allocations_total", &b0), Some(2));
    assert_eq!(v("vramcap_frees_total", &b0), Some(2));
    assert_eq!(v("vramcap_cache_hits_total", &b0), Some(1));
    assert_eq!(v("vramcap_cache_misses_total", &b0), Some(1));
    let sb = m.find("vramcap_gpu_memory_used_bytes", &b0)[0];
    for k in ["pod", "namespace", "container"] {
        assert_eq!(sb.labels.get(k), None, "{k}");
    }
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));
    assert_eq!(m.pids(), {
        let mut v = vec![pa.clone(), pb.clone()];
        v.sort();
        v
    });
    matches_stat(&m, &stat_json(&dir));

    ex.stop();
    a.finish();
    b.finish();
}

#[test]
fn a_client_killed_between_scrapes_is_absent_from_the_next() {
    let dir = scratch_dir();
    let mut doomed = held(&dir, Some("1GiB"), &[], &["init", "alloc", "128M", "wait"]);
    let stays = held(&dir, Some("1GiB"), &[], &["init", "alloc", "32M", "wait"]);
    let ex = Exporter::start(&dir);
    let (pd, ps) = (doomed.pid().to_string(), stays.pid().to_string());
    let m = ex.scrape();
    assert_eq!(
        m.value("vramcap_gpu_memory_used_bytes", &[("pid", &pd)]),
        Some(128 * MIB)
    );
    assert_eq!(
        m.value("vramcap_gpu_memory_used_bytes", &[("pid", &ps)]),
        Some(32 * MIB)
    );

    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let page = dir.join(format!("{pd}.page"));
    assert!(page.exists(), "SIGKILL leaves the page behind");

    let m = ex.scrape(); // asserts 200
    assert_eq!(m.pids(), [ps.as_str()], "{}", m.text);
    assert_eq!(
        m.value("vramcap_gpu_memory_used_bytes", &[("pid", &ps)]),
        Some(32 * MIB)
    );
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));
    assert!(!page.exists(), "the dead page is pruned");
    matches_stat(&m, &stat_json(&dir));

    // A client that ends normally is gone too; then nothing is left.
    stays.finish();
    let m = ex.scrape();
    assert_eq!(m.pids(), Vec::<String>::new(), "{}", m.text);
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));
    ex.stop();
}

#[test]
fn unreadable_pages_are_counted_not_errors() {
    let dir = scratch_dir();
    let h = held(&dir, Some("1GiB"), &[], &["init", "alloc", "1M", "wait"]);
    std::fs::write(dir.join("1.page"), b"not a page").unwrap();
    std::fs::write(dir.join("2.page"), []).unwrap();
    std::fs::write(dir.join("group-x.grp"), b"not a group").unwrap();
    std::fs::write(dir.join("notes.txt"), b"ignored").unwrap();
    let ex = Exporter::start(&dir);
    for _ in 0..2 {
        let m = ex.scrape();
        assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(3), "{}", m.text);
        assert_eq!(m.pids(), [h.pid().to_string()]);
        assert_eq!(
            m.value("vramcap_gpu_memory_used_bytes", &[("gpu", "0")]),
            Some(MIB)
        );
    }
    ex.stop();
    h.finish();
}

#[test]
fn groups_have_their_budget_and_members() {
    let dir = scratch_dir();
    let env = [("VRAMCAP_GROUP", "train"), ("VRAMCAP_CACHE", "off")];
    let a = held(&dir, Some("1GiB"), &env, &["init", "alloc", "256M", "wait"]);
    let b = held(&dir, Some("1GiB"), &env, &["init", "alloc", "128M", "wait"]);
    let ex = Exporter::start(&dir);
    let m = ex.scrape();
    let g = [("group", "train"), ("UUID", UUID0)];
    assert_eq!(
        m.value("vramcap_group_memory_limit_bytes", &g),
        Some(GIB),
        "{}",
        m.text
    );
    assert_eq!(
        m.value("vramcap_group_memory_used_bytes", &g),
        Some(384 * MIB)
    );
    assert_eq!(m.value("vramcap_group_members", &g), Some(2));
    for s in m.find("vramcap_group_members", &[]) {
        let mut keys: Vec<&String> = s.labels.keys().collect();
        keys.sort();
        assert_eq!(keys, ["UUID", "dir", "group"]);
        assert_eq!(
            s.labels.get("dir"),
            Some(dir.display().to_string().as_str())
        );
    }
    let pa = a.pid().to_string();
    assert_eq!(
        m.value(
            "vramcap_gpu_memory_used_bytes",
            &[("pid", &pa), ("group", "train")]
        ),
        Some(256 * MIB)
    );
    matches_stat(&m, &stat_json(&dir));

    a.finish();
    let m = ex.scrape();
    assert_eq!(
        m.value("vramcap_group_memory_used_bytes", &g),
        Some(128 * MIB)
    );
    assert_eq!(m.value("vramcap_group_members", &g), Some(1));
    ex.stop();
    b.finish();
}

/// Quotes, backslashes and newlines in the command (here in the program's
/// name) and in the environment come out escaped, one sample per line.
#[test]
fn label_values_are_escaped() {
    let dir = scratch_dir();
    let link = dir.join("we\"ird\\na\nme");
    std::os::unix::fs::symlink(&artefacts().client, &link).unwrap();
    let pages = dir.join("pages");
    let h = held_program(
        &link,
        &pages,
        Some("1GiB"),
        &[
            ("POD_NAME", "p\"o\\d\n1"),
            ("KUBERNETES_POD_NAME", "ignored"),
        ],
        &["init", "alloc", "2M", "wait"],
    );
    let ex = Exporter::start(&pages);
    let r = ex.get("/metrics");
    assert_eq!(r.status, 200);
    // A newline is a control character: made printable (`\x0a`) before
    // the format's own escapes double its backslash.
    let escaped_command = format!("{} procaddr init alloc 2M wait", link.display())
        .replace('\n', "\\x0a")
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    let line = r
        .body
        .lines()
        .find(|l| l.starts_with("vramcap_gpu_memory_used_bytes{"))
        .unwrap_or_else(|| panic!("{}", r.body));
    assert_eq!(
        line,
        format!(
            "vramcap_gpu_memory_used_bytes{{gpu=\"0\",UUID=\"{UUID0}\",pid=\"{}\",command=\"{escaped_command}\",group=\"\",dir=\"{}\",pod=\"p\\\"o\\\\d\\\\x0a1\"}} 2097152",
            h.pid(),
            pages.display()
        )
    );
    // The escapes keep every sample on one line.
    Metrics::parse(&r.body);
    ex.stop();
    h.finish();
}

/// The Kubernetes layout (deploy/): every container's shim makes its own
/// directory under one shared parent, and one exporter reads them all
/// through `--dir PARENT/*`, labelling each process with its pod.
#[test]
fn one_exporter_reads_a_directory_per_container_through_a_pattern() {
    let root = scratch_dir();
    let a_dir = root.join("0b7f-uid-a_main");
    let b_dir = root.join("91c2-uid-b_main");
    let a = held(
        &a_dir,
        Some("1GiB"),
        &[
            ("POD_NAME", "trainer-0"),
            ("POD_NAMESPACE", "ml"),
            ("CONTAINER_NAME", "main"),
        ],
        &["init", "alloc", "300M", "wait"],
    );
    let b = held(
        &b_dir,
        Some("2GiB"),
        &[
            ("POD_NAME", "infer-1"),
            ("POD_NAMESPACE", "serve"),
            ("CONTAINER_NAME", "main"),
        ],
        &["init", "alloc", "700M", "wait"],
    );
    // The shim made each directory itself, closed to others.
    for d in [&a_dir, &b_dir] {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o700, "{}", d.display());
    }
    // Neither a hidden directory nor a file is a container's directory, and
    // an empty one (a container that has not used CUDA yet) is no error.
    std::fs::create_dir(root.join(".staging")).unwrap();
    std::fs::write(root.join("README"), b"not a directory").unwrap();
    std::fs::create_dir(root.join("c3d4-uid-c_main")).unwrap();

    let pattern = format!("{}/*", root.display());
    // The environment's directory is not read when --dir is given.
    let elsewhere = scratch_dir_named("unused");
    let ex = Exporter::start_with(&elsewhere, &["--dir", &pattern]);
    let m = ex.scrape();
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let mut want = vec![pa.clone(), pb.clone()];
    want.sort();
    assert_eq!(m.pids(), want, "{}", m.text);
    for (pid, pod, ns, used, limit) in [
        (&pa, "trainer-0", "ml", 300u64 << 20, 1u64 << 30),
        (&pb, "infer-1", "serve", 700 << 20, 2 << 30),
    ] {
        let labels = [
            ("pid", pid.as_str()),
            ("gpu", "0"),
            ("UUID", UUID0),
            ("pod", pod),
            ("namespace", ns),
            ("container", "main"),
        ];
        assert_eq!(
            m.value("vramcap_gpu_memory_used_bytes", &labels),
            Some(used),
            "{}",
            m.text
        );
        assert_eq!(
            m.value("vramcap_gpu_memory_limit_bytes", &labels),
            Some(limit),
            "{}",
            m.text
        );
    }
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0), "{}", m.text);

    // `stat` reads the same way and says where each page was found.
    let mut cmd: Command = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &elsewhere)
        .args(["stat", "--json", "--dir", &pattern]);
    let j: Json = serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap();
    assert_eq!(j["dir"], pattern.as_str());
    assert_eq!(j["dirs"], serde_json::json!([pattern]));
    let procs = j["processes"].as_array().unwrap();
    let dir_of = |pid: &str| {
        procs
            .iter()
            .find(|p| p["pid"].as_u64().map(|n| n.to_string()).as_deref() == Some(pid))
            .map(|p| p["dir"].as_str().unwrap().to_string())
    };
    assert_eq!(dir_of(&pa), Some(a_dir.display().to_string()));
    assert_eq!(dir_of(&pb), Some(b_dir.display().to_string()));

    // A container that ends is gone from the next scrape.
    let (_, out) = a.finish();
    assert!(out.status.success());
    assert_eq!(ex.scrape().pids(), std::slice::from_ref(&pb));
    b.finish();
    ex.stop();
}

/// A pattern whose fixed part is missing (say, a kubelet that keeps its
/// pods elsewhere) is said once at start, not left to look like "no
/// processes".
#[test]
fn a_pattern_under_a_missing_directory_is_said_at_start() {
    let dir = scratch_dir();
    let missing = dir.join("no-such-kubelet/pods");
    let pattern = format!("{}/*/volumes", missing.display());
    let ex = Exporter::start_with(&dir, &["--dir", &pattern]);
    assert_eq!(
        ex.before,
        [format!(
            "vramcap: --dir {pattern}: {} is not a directory, so nothing matches the pattern until it is",
            missing.display()
        )]
    );
    assert_eq!(ex.scrape().pids(), Vec::<String>::new());
    ex.stop();
}

/// `--dir` values: absolute, and `*` only as a whole component.
#[test]
fn bad_dir_values_exit_2_with_one_line() {
    let dir = scratch_dir();
    for (sub, bad, want) in [
        (
            "exporter",
            "pods/*",
            "expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
        ),
        (
            "stat",
            "/run/vramcap/pod-*",
            "`*` must be a whole path component (it stands for every subdirectory there), not part of \"pod-*\"",
        ),
        (
            "top",
            "run/vramcap",
            "expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
        ),
    ] {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", &dir).args([sub, "--dir", bad]);
        let ran = run(cmd);
        ran.expect_code(2);
        let err = ran.stderr();
        assert!(
            err.starts_with(&format!("vramcap: --dir \"{bad}\" is not valid: "))
                && err.trim_end().ends_with(want)
                && err.lines().count() == 1,
            "{err}"
        );
    }
}
