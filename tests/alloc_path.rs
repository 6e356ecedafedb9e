//! The `cuMemAlloc_v2` path measured from the code (issue 41): valgrind's
//! callgrind traces one cache-miss allocation through the debug shim (no
//! inlining but `#[inline(always)]`, which `tests/layout.rs` keeps to short
//! fast paths), and the files of the shim whose functions it entered are
//! exactly those ARCHITECTURE.md lists, at most ten.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::util::*;

/// The shim's source files (relative to `crates/shim/src`) that define a
/// function callgrind saw run, from a callgrind output file: each `fn=`
/// line belongs to the last `fl=` file (`fi=`/`fe=` name inlined code, and
/// `cfl=`/`cfn=` the callees, which appear with their own `fn=` too).
/// Names are compressed: `(N) name` the first time, `(N)` after.
fn shim_files(out: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let mut fns: BTreeMap<String, String> = BTreeMap::new();
    let name = |table: &mut BTreeMap<String, String>, v: &str| -> String {
        let v = v.trim();
        match v.strip_prefix('(').and_then(|r| r.split_once(')')) {
            Some((id, rest)) => {
                let rest = rest.trim();
                if !rest.is_empty() {
                    table.insert(id.to_string(), rest.to_string());
                }
                table.get(id).cloned().unwrap_or_default()
            }
            None => v.to_string(),
        }
    };
    let mut file = String::new();
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in out.lines() {
        if let Some(v) = line.strip_prefix("fl=") {
            file = name(&mut files, v);
        } else if let Some(v) = line
            .strip_prefix("fi=")
            .or_else(|| line.strip_prefix("fe="))
            .or_else(|| line.strip_prefix("cfi="))
            .or_else(|| line.strip_prefix("cfl="))
        {
            name(&mut files, v);
        } else if let Some(v) = line.strip_prefix("fn=") {
            let f = name(&mut fns, v);
            if let Some((_, rel)) = file.split_once("crates/shim/src/") {
                seen.entry(rel.to_string()).or_default().insert(f);
            }
        } else if let Some(v) = line.strip_prefix("cfn=") {
            name(&mut fns, v);
        }
    }
    seen
}

/// ARCHITECTURE.md's list: the line `cuMemAlloc_v2 path: A → B → …`.
fn documented() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    text.lines()
        .find_map(|l| l.strip_prefix("cuMemAlloc_v2 path: "))
        .expect("ARCHITECTURE.md has a line `cuMemAlloc_v2 path: A → B → …`")
        .split('→')
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn the_parser_reads_compressed_names_and_skips_other_crates() {
    let out = "fl=(1) /w/crates/shim/src/engine/pipeline.rs\nfn=(1) capped_alloc\n\
               cfl=(2) /w/crates/core/src/budget.rs\ncfn=(2) reserve\ncalls=1 0\n\
               fl=(2)\nfn=(2)\nfl=(1)\nfi=(3) /w/crates/shim/src/log.rs\nfn=(3) insert\n";
    let got = shim_files(out);
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        vec![(
            "engine/pipeline.rs".to_string(),
            BTreeSet::from(["capped_alloc".to_string(), "insert".to_string()])
        )]
    );
}

#[test]
fn a_cache_miss_alloc_enters_the_documented_files_at_most_ten() {
    let a = artefacts();
    let program = a.standin_lib.with_file_name("bin").join("one-alloc");
    let dir = scratch_dir();
    let out_file = dir.join("callgrind.out");
    let mut cmd = shimmed(Path::new("valgrind"));
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .env("VRAMCAP_STATS_DIR", &dir)
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--collect-atstart=no")
        .arg("--toggle-collect=one_alloc_measured")
        .arg(&program);
    let ran = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run valgrind ({e}): install it (scripts/test.sh installs it as root, or: apt-get install valgrind)")
    });
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success() && stdout.trim() == "one_alloc -> 0 0 0",
        "one-alloc under callgrind: {}\nstdout: {stdout}\nstderr: {}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );
    let text = std::fs::read_to_string(&out_file).expect("callgrind's output");
    let measured = shim_files(&text);
    let entered: BTreeSet<&str> = measured.keys().map(String::as_str).collect();
    let listed = documented();
    let listed: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    assert_eq!(
        entered, listed,
        "the files a cache-miss cuMemAlloc_v2 enters (left, with their functions: {measured:#?}) \
         are not ARCHITECTURE.md's list (right)"
    );
    assert!(
        entered.len() <= 10,
        "a cache-miss cuMemAlloc_v2 crosses {} files of the shim: {entered:?}",
        entered.len()
    );
    // The steps that must be on it: the gate, the pipeline, the cache.
    for f in [
        "process/gate.rs",
        "engine/pipeline/mod.rs",
        "engine/cache.rs",
    ] {
        assert!(entered.contains(f), "{f} is not on the path: {entered:?}");
    }
    // The call reads the device's slot and cap once (`cap_of_call`); the
    // cap was worked out at the device's first allocation, not again.
    let all: Vec<&String> = measured.values().flatten().collect();
    assert!(all.iter().any(|f| f.ends_with("::cap_of_call")), "{all:?}");
    assert!(
        !all.iter().any(|f| f.ends_with("::compute_limit")),
        "the cap was worked out again: {all:?}"
    );
}
