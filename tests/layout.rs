//! The source tree as documents describe it: no import circle between the
//! modules of any crate, and no path in ARCHITECTURE.md that does not exist.
//! Both read files only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under a crate's `src` (`lib.rs` and `main.rs`
/// are the root, `a/mod.rs` is `a`, `a/b.rs` is `a::b`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a file without its comments and its test module at the end.
fn code(text: &str) -> String {
    let text = text
        .find("\n#[cfg(test)]\nmod ")
        .map_or(text, |i| &text[..i]);
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The path of names `a::b::c` at the start of `s` (stopping at a name
/// followed by anything but `::`, or at a `{` list).
fn names(s: &str) -> (Vec<String>, &str) {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        let n = ident(rest);
        if n.is_empty() {
            return (out, rest);
        }
        out.push(n.to_string());
        rest = &rest[n.len()..];
        match rest.strip_prefix("::") {
            Some(r) if !r.starts_with('{') && !ident(r).is_empty() => rest = r,
            Some(r) if r.starts_with('{') => return (out, &rest[2..]),
            _ => return (out, rest),
        }
    }
}

/// The module paths `text` names through `crate::`, `$crate::`, `super::`
/// and `self::`, as seen from module `me`: each whole path (`crate::a::b::C`
/// is `a::b::C`; the caller keeps the part that names modules), and in a
/// `{…}` list each item's path after the list's prefix (one level).
fn references(me: &[String], text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let (mut base, mut after) = if starts_word && rest.starts_with("crate::") {
            (Vec::new(), &rest["crate::".len()..])
        } else if starts_word && rest.starts_with("self::") {
            (me.to_vec(), &rest["self::".len()..])
        } else if starts_word && rest.starts_with("super::") {
            (
                me[..me.len().saturating_sub(1)].to_vec(),
                &rest["super::".len()..],
            )
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        while let Some(r) = after.strip_prefix("super::") {
            base.pop();
            after = r;
        }
        let (path, tail) = names(after);
        base.extend(path);
        if let Some(list) = tail.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            for item in list[..end].split(',') {
                let (p, _) = names(item.trim());
                if p.first().is_some_and(|n| n != "self") {
                    let mut target = base.clone();
                    target.extend(p);
                    out.push(target);
                } else if !base.is_empty() {
                    out.push(base.clone());
                }
            }
        } else if !base.is_empty() {
            out.push(base);
        }
        i += rest.len() - after.len();
    }
    out
}

/// The first import circle between the modules of the crate whose
/// sources are under `src`, as "a -> b -> a", if any; and how many modules
/// it read. Paths are read whole (`crate::a::b::C` is an edge to `a::b`
/// from a module outside `a`, and to `a::b` from `a::c`).
fn circle_in(src: &Path) -> (Option<String>, usize) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    // Edges between siblings: a use of `a::b::x` from `a::c::y` is an
    // edge `a::c` -> `a::b`.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (me, file) in &modules {
        if me.iter().any(|p| p == "tests") {
            continue;
        }
        let text = code(&std::fs::read_to_string(file).expect("a source file"));
        for mut target in references(me, &text) {
            // The part of the path that names modules.
            while !target.is_empty() && !modules.contains_key(&target) {
                target.pop();
            }
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= me.len() || common >= target.len() {
                continue;
            }
            let from = me[..=common].to_vec();
            let to = target[..=common].to_vec();
            if modules.contains_key(&to) {
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    fn visit(
        n: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<String> {
        if done.contains(n) {
            return None;
        }
        if path.contains(n) {
            let names: Vec<String> = path.iter().chain([n]).map(|p| p.join("::")).collect();
            return Some(names.join(" -> "));
        }
        path.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.clone());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, &edges, &mut Vec::new(), &mut done) {
            return (Some(c), modules.len());
        }
    }
    (None, modules.len())
}

#[test]
fn no_import_circle_in_any_crate() {
    let mut checked = 0;
    for krate in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let src = krate.expect("an entry").path().join("src");
        if !src.is_dir() {
            continue;
        }
        let (circle, n) = circle_in(&src);
        assert_eq!(circle, None, "import circle in {}", src.display());
        checked += n;
    }
    assert!(checked > 50, "the crates' files were not found ({checked})");
}

/// The check sees a circle written with whole paths (the one it missed
/// when it read only the first name after `crate::`: `engine::accounting
/// -> engine::worker -> engine::park -> engine::accounting`, e446e89), and
/// one through a `{…}` list and `super::`; a tree without one passes.
#[test]
fn a_planted_circle_is_found() {
    let src = crate::util::scratch_dir().join("src");
    let write = |path: &str, text: &str| {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod engine;\n");
    write("engine/mod.rs", "mod accounting;\nmod park;\nmod worker;\n");
    write(
        "engine/accounting.rs",
        "use crate::engine::worker::Worker;\n",
    );
    write(
        "engine/worker.rs",
        "// crate::engine::accounting in a comment is no edge\n",
    );
    write(
        "engine/park.rs",
        "use crate::engine::accounting::Refusal;\n",
    );
    assert_eq!(circle_in(&src).0, None);
    write(
        "engine/worker.rs",
        "fn f() { crate::engine::park::gate::wake_all(); }\n",
    );
    assert_eq!(
        circle_in(&src).0.as_deref(),
        Some("engine::accounting -> engine::worker -> engine::park -> engine::accounting")
    );
    write("engine/worker.rs", "use super::{park::gate, x};\n");
    assert_eq!(
        circle_in(&src).0.as_deref(),
        Some("engine::accounting -> engine::worker -> engine::park -> engine::accounting")
    );
}

/// Where a path that ARCHITECTURE.md names may be: from the repository's
/// root, or shortened (`engine/…`, `boundary/…` under the shim's `src`,
/// `core/src/…` under `crates/`).
fn exists(path: &str) -> bool {
    let root = root();
    let path = path.trim_end_matches(['.', ',', ':', ')']);
    [
        root.clone(),
        root.join("crates"),
        root.join("crates/shim/src"),
        root.join("crates/cli/src"),
    ]
    .iter()
    .any(|base| base.join(path).exists())
}

#[test]
fn architecture_names_only_paths_that_exist() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let prefixes = [
        "crates/",
        "engine/",
        "boundary/",
        "core/src/",
        "tests/",
        "docs/",
        "scripts/",
        "python/",
        "include/",
    ];
    let mut named = 0;
    let mut missing = Vec::new();
    for word in
        text.split(|c: char| c.is_whitespace() || matches!(c, '`' | '(' | '"' | '[' | ']' | '|'))
    {
        if !prefixes.iter().any(|p| word.starts_with(p)) {
            continue;
        }
        named += 1;
        if !exists(word) {
            missing.push(word.to_string());
        }
    }
    assert!(named > 10, "ARCHITECTURE.md names paths: found {named}");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// ARCHITECTURE.md's `cuMemAlloc_v2` path names files of the shim, each
/// once, and the steps it places in them are there (`tests/alloc_path.rs`
/// measures that the path enters exactly these files).
#[test]
fn mem_alloc_path_names_its_files_and_steps() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("cuMemAlloc_v2 path: "))
        .expect("ARCHITECTURE.md has a line `cuMemAlloc_v2 path: A → B → …`");
    let files: Vec<&str> = line.split('→').map(str::trim).collect();
    let src = root().join("crates/shim/src");
    for f in &files {
        assert!(
            src.join(f).is_file(),
            "the path names {f}, not a file of crates/shim/src"
        );
    }
    let mut distinct = files.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), files.len(), "a file named twice: {files:?}");
    assert_eq!(files.first(), Some(&"boundary/macros.rs"));
    // The steps the list places in its files.
    for (file, steps) in [
        ("engine/handlers/alloc.rs", &["fn mem_alloc("][..]),
        (
            "engine/pipeline/mod.rs",
            &[
                "fn capped_alloc(",
                "fn cap_of_call(",
                "fn reserve_evicting_at(",
                "fn call_with_retry<",
                "fn insert(",
            ][..],
        ),
        ("process/gate.rs", &["fn enter("][..]),
        (
            "engine/accounting/mod.rs",
            &[
                "fn current(",
                "fn reserve_on(",
                "fn settle(",
                "fn cap_in_force(",
            ][..],
        ),
        ("engine/cache.rs", &["fn reuse<"][..]),
        ("boundary/allocs.rs", &["fn mem_alloc("][..]),
        (
            "boundary/mod.rs",
            &["fn boundary<", "fn engine(", "fn disabled("][..],
        ),
    ] {
        assert!(
            files.contains(&file),
            "{file} is not on the path: {files:?}"
        );
        let code = std::fs::read_to_string(src.join(file)).expect(file);
        for step in steps {
            assert!(code.contains(step), "{file} has no `{step}`");
        }
    }
}

/// The page's mailboxes (request counters, acknowledgements, parking's ask
/// word) are written in one place, `crates/core/src/mailbox.rs` (issue 41,
/// done-when 4): every asker and answerer goes through it; the page's own
/// definition is the only other file that names the words (test modules
/// and comments aside).
#[test]
fn the_page_mailboxes_are_written_in_core_only() {
    let words = [
        ".trim_requests",
        ".trim_acks",
        ".limit_requests",
        ".limit_acks",
        ".park_requests",
        ".park_acks",
        ".park_ask",
    ];
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    let allowed = [
        root().join("crates/core/src/mailbox.rs"),
        root().join("crates/core/src/page/mod.rs"),
    ];
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !allowed.contains(f)) {
        if f.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = code(&std::fs::read_to_string(f).expect("a source file"));
        for w in words {
            if text.contains(w) {
                found.push(format!("{}: {w}", f.display()));
            }
        }
    }
    assert!(files.len() > 50, "the crates' files were not found");
    assert_eq!(found, Vec::<String>::new());
}

/// The `#[inline(always)]` functions of a source text whose bodies run
/// longer than `most` lines of code (comments and blank lines aside), as
/// `name: lines`. Such a function is a fast path that the measured
/// `cuMemAlloc_v2` path (`tests/alloc_path.rs`) passes through without a
/// call, so it must stay short: real work belongs in a function of its own.
fn long_always_inlined(text: &str, most: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != "#[inline(always)]" {
            continue;
        }
        let Some(sig) = lines[i + 1..].iter().position(|l| l.contains("fn ")) else {
            continue;
        };
        let start = i + 1 + sig;
        let name = ident(lines[start].split("fn ").nth(1).unwrap_or("")).to_string();
        let indent = lines[start].len() - lines[start].trim_start().len();
        let Some(end) = lines[start..].iter().position(|l| {
            l.len() > indent && l.starts_with(&" ".repeat(indent)) && l[indent..].starts_with('}')
                || (indent == 0 && l.starts_with('}'))
        }) else {
            continue;
        };
        let body = lines[start + 1..start + end]
            .iter()
            .filter(|l| !l.trim().is_empty() && !l.trim().starts_with("//"))
            .count();
        if body > most {
            long.push(format!("{name}: {body}"));
        }
    }
    long
}

#[test]
fn always_inlined_functions_are_short_fast_paths() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/shim/src"), &mut files);
    let mut long = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        for l in long_always_inlined(&text, 10) {
            long.push(format!("{}: {l}", f.display()));
        }
    }
    assert!(files.len() > 50, "the shim's files were not found");
    assert!(
        long.is_empty(),
        "#[inline(always)] bodies over ten lines: {long:?}"
    );
    // The check sees a long one.
    let planted = format!(
        "impl X {{\n    #[inline(always)]\n    pub fn f(&self) -> u64 {{\n{}        0\n    }}\n}}\n",
        "        let _ = 1;\n".repeat(10)
    );
    assert_eq!(long_always_inlined(&planted, 10), vec!["f: 11".to_string()]);
    assert!(long_always_inlined(&planted, 11).is_empty());
}

/// The shim's files (relative to `crates/shim/src`) whose code has an
/// `impl … Engine<D>` block.
fn engine_impl_files() -> BTreeSet<String> {
    let src = root().join("crates/shim/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("a source file");
            code(&text).contains("> Engine<D> {")
        })
        .map(|f| {
            f.strip_prefix(&src)
                .expect("under src")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// Issue 41: `impl Engine` only in the engine's own file, the pipeline
/// (`engine/pipeline/`) and the families (`handlers/`); the parts
/// (`park/`, `tiered/`, the cache, spill, accounting) have methods of their
/// own.
#[test]
fn engine_impls_live_in_the_engine_the_pipeline_and_the_families() {
    let found = engine_impl_files();
    let stray: Vec<&String> = found
        .iter()
        .filter(|f| {
            !(f.as_str() == "engine/mod.rs"
                || f.starts_with("engine/pipeline/")
                || f.starts_with("engine/handlers/"))
        })
        .collect();
    assert!(
        stray.is_empty(),
        "impl Engine outside the engine's own file, the pipeline and the families: {stray:?}"
    );
    assert!(
        found.contains("engine/pipeline/mod.rs")
            && found.contains("engine/pipeline/tiered.rs")
            && found.len() > 10,
        "{found:?}"
    );
}

/// The words by which a file of `dir` (under the shim's `engine/`) would
/// name another part of the engine, or the engine itself, as `file: word`.
fn other_parts_named(dir: &str, others: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root().join("crates/shim/src/engine").join(dir), &mut files);
    assert!(files.len() >= 3, "{dir}: {files:?}");
    let mut named = Vec::new();
    for f in &files {
        let text = code(&std::fs::read_to_string(f).expect("a source file"));
        for o in others {
            if text.contains(o) {
                named.push(format!("{}: {o}", f.display()));
            }
        }
    }
    named
}

/// Parking and tiered spill are parts: their files name no other part of
/// the engine (the cache, spill, each other, the records' registries, the
/// pipeline, the families, the engine itself); what they need of them is
/// handed in (`park::Parking`'s closures, tiered spill's `HostRoom`).
#[test]
fn parking_and_tiered_spill_name_no_other_part() {
    let common = [
        "Engine",
        "self.cache",
        "self.table",
        "self.spill",
        "self.inflight",
        "Cache",
        "HostSpill",
        "Registry",
        "handlers::",
        "pipeline::",
        "cache::",
        "spill::",
    ];
    let park: Vec<&str> = common
        .iter()
        .copied()
        .chain(["self.tiers", "self.handles", "Tiers", "tiered::"])
        .collect();
    // `vramcap_core::park` (the page's words) is ground both stand on.
    let tiered: Vec<&str> = common
        .iter()
        .copied()
        .chain(["Parking", "engine::park", "super::park"])
        .collect();
    assert_eq!(other_parts_named("park", &park), Vec::<String>::new());
    assert_eq!(other_parts_named("tiered", &tiered), Vec::<String>::new());
    // The check sees a name.
    assert!(
        !other_parts_named("park", &["Parking"]).is_empty(),
        "park/ names its own Parking"
    );
}
