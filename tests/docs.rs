//! The user guide's links: every relative link in README.md, ARCHITECTURE.md
//! and docs/**/*.md names a file or folder that exists, and an anchor
//! (`page.md#section`, `#section`) names a heading of that page, as GitHub
//! makes its anchors. Links to other sites are not followed. A backticked
//! path (`crates/shim/src/engine/cache.rs`, `design/parking.md`) names a
//! file or folder of the repository. Every page of the guide is reachable
//! from README.md. Every variable the core reads has its row in
//! docs/configuration.md. (The `vramcap stat --json` schema
//! and the metric table of docs/statistics.md are held to the code by
//! `cli::readme` in crates/cli, and the dashboard's and rules' metric names
//! by scripts/check-monitoring.sh.)

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use crate::util::root;

/// README.md, ARCHITECTURE.md and every `.md` file under docs/, relative to
/// the workspace's root.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut out = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    walk(&root.join("docs"), &mut out);
    out.into_iter()
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect()
}

/// The text outside fenced code blocks and inline code spans, line by line
/// (a link inside code is an example, not a link).
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push((n + 1, kept));
    }
    out
}

/// The targets of inline links and images, `[text](target)` and
/// `![alt](target "title")`, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let inner = &after[..end];
            let target = match inner.strip_prefix('<') {
                Some(r) => r.split('>').next().unwrap_or(""),
                None => inner.split_whitespace().next().unwrap_or(""),
            };
            out.push((n, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, everything
/// but letters, digits, `-` and `_` dropped; a repeated one gets `-1`, `-2`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// `base`'s folder joined with `rel`, `..` resolved (without touching the
/// file system, so a link that climbs out of the repository fails).
fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in base
        .parent()
        .unwrap_or(Path::new(""))
        .join(rel)
        .components()
    {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    Some(out)
}

fn external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

#[test]
fn every_relative_link_in_the_guide_resolves() {
    let root = root();
    let pages = pages();
    assert!(pages.len() > 10, "{pages:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        for (line, target) in links(&text) {
            if target.is_empty() || external(&target) {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let Some(rel) = (if file.is_empty() {
                Some(page.clone())
            } else {
                resolve(page, file)
            }) else {
                broken.push(format!(
                    "{}:{line}: {target}: outside the repository",
                    page.display()
                ));
                continue;
            };
            let path = root.join(&rel);
            if !path.exists() {
                broken.push(format!(
                    "{}:{line}: {target}: no such file ({})",
                    page.display(),
                    rel.display()
                ));
                continue;
            }
            if let Some(a) = anchor
                && path.extension().is_some_and(|x| x == "md")
            {
                let known = anchors(&std::fs::read_to_string(&path).unwrap());
                if !known.contains(a) {
                    broken.push(format!(
                        "{}:{line}: {target}: {} has no heading with the anchor #{a}",
                        page.display(),
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found");
    assert!(
        broken.is_empty(),
        "links that do not resolve:\n{}",
        broken.join("\n")
    );
}

/// Every page of the guide (docs/**/*.md) can be reached from README.md by
/// following relative links.
#[test]
fn every_page_of_the_guide_is_reachable_from_the_readme() {
    let root = root();
    let mut seen = BTreeSet::from([PathBuf::from("README.md")]);
    let mut todo = vec![PathBuf::from("README.md")];
    while let Some(page) = todo.pop() {
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        for (_, target) in links(&text) {
            let file = target.split('#').next().unwrap_or("");
            if file.is_empty() || external(file) || !file.ends_with(".md") {
                continue;
            }
            if let Some(rel) = resolve(&page, file)
                && root.join(&rel).is_file()
                && seen.insert(rel.clone())
            {
                todo.push(rel);
            }
        }
    }
    let unreachable: Vec<String> = pages()
        .into_iter()
        .filter(|p| !seen.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        unreachable.is_empty(),
        "pages no link from README.md leads to: {unreachable:?}"
    );
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let a = anchors(
        "# vramcap\n## `vramcap stat --json`\n## Tiered spill (`VRAMCAP_SPILL=tiered`, experimental)\n\
         ## The operator's cap and NVIDIA's limit\n## Notes\n## Notes\n```sh\n# not a heading\n```\n#not one either\n",
    );
    let want: BTreeSet<String> = [
        "vramcap",
        "vramcap-stat---json",
        "tiered-spill-vramcap_spilltiered-experimental",
        "the-operators-cap-and-nvidias-limit",
        "notes",
        "notes-1",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(a, want);
    assert_eq!(
        links("[a](b.md) `[c](d.md)` ![e](img/f.png \"t\") [g](<h i.md>)\n```\n[j](k.md)\n```\n"),
        [
            (1, "b.md".to_string()),
            (1, "img/f.png".to_string()),
            (1, "h i.md".to_string())
        ]
    );
}

/// The inline code spans outside fenced code blocks, with the line each
/// starts on. A span may run on over a line break (it then holds a space,
/// so it is no path); a blank line ends it, as it ends a paragraph.
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut open: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            open = None;
            continue;
        }
        if fenced || line.trim().is_empty() {
            open = None;
            continue;
        }
        if let Some((_, span)) = open.as_mut() {
            span.push(' ');
        }
        for c in line.chars() {
            match (c, open.as_mut()) {
                ('`', None) => open = Some((n + 1, String::new())),
                ('`', Some(_)) => out.push(open.take().unwrap()),
                (c, Some((_, span))) => span.push(c),
                (_, None) => {}
            }
        }
    }
    out
}

/// The endings that make a backticked word a file's name.
const FILE_ENDINGS: &[&str] = &[
    ".md", ".rs", ".py", ".sh", ".c", ".h", ".cu", ".cuh", ".toml", ".yaml", ".yml", ".json",
    ".proto", ".png",
];

/// Whether an inline code span reads as a path in the repository: it has
/// a `/` or a file's ending, and none of what makes it something else: a
/// space (a command), `*` (a pattern), `<…>` (a placeholder), `=`, `:`,
/// `(` (a setting, an image's tag, a call), a leading `/` (a path on the
/// machine, such as `/run/vramcap/stats`), `-` (an option), `$` or `~`, a
/// URL; nor is `PREFIX/lib` (a folder in capitals is a placeholder) or
/// `vramcap.io/gpu-memory` (a name under a domain: a label, a resource).
fn path_like(span: &str) -> bool {
    if !(span.contains('/') || FILE_ENDINGS.iter().any(|e| span.ends_with(e))) {
        return false;
    }
    if span.contains("://") || span.starts_with(['/', '-', '$', '~']) {
        return false;
    }
    if !span
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-+/".contains(c))
    {
        return false;
    }
    let first = span.split('/').next().unwrap_or("");
    if span.contains('/') {
        if !first.is_empty() && first.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            return false;
        }
        if first != ".." && first.get(1..).is_some_and(|r| r.contains('.')) {
            return false;
        }
    }
    true
}

/// Every file and folder of the repository, relative to its root, leaving
/// out build outputs (`target/`), `.git` and other hidden folders.
fn repository_files(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy();
            if name.starts_with('.') || name == "target" || name == "__pycache__" {
                continue;
            }
            out.insert(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// Whether a backticked path names something in the repository: from the
/// root (`crates/shim/src/engine/cache.rs`) or from the page's folder
/// (`design/parking.md` in docs/). A source file may also be named from
/// its crate's source folder or by its file name alone, as ARCHITECTURE.md
/// names modules (`process/gate.rs`, `vars.rs`): then some file of
/// the repository must end in it. A page of the guide (`.md`), or a path
/// that starts with a folder of the root, must resolve exactly.
fn names_a_repository_file(root: &Path, page: &Path, path: &str, files: &BTreeSet<String>) -> bool {
    let path = path.trim_end_matches('/');
    if root.join(path).exists() {
        return true;
    }
    if let Some(rel) = resolve(page, path)
        && root.join(rel).exists()
    {
        return true;
    }
    let first = path.split('/').next().unwrap_or("");
    if path.ends_with(".md") || first == ".." || root.join(first).exists() {
        return false;
    }
    let tail = format!("/{path}");
    files.iter().any(|f| f == path || f.ends_with(&tail))
}

/// Backticked paths that are not the repository's, page by page.
const NOT_REPOSITORY_PATHS: &[(&str, &[&str])] = &[
    // Files of other projects' repositories, each cited with its project
    // (ZLUDA, Wine's nvcuda, cuda_deduplicator, HAMi-core, cuda-samples,
    // CRIU).
    (
        "docs/design/parking-resume.md",
        &[
            "dark_api/src/lib.rs",
            "zluda/src/impl/driver.rs",
            "dlls/nvcuda/internal.c",
            "src/tests/GetExportTableTest.cpp",
            "zluda_trace/src/dark_api.rs",
            "zluda_trace/src/lib.rs",
            "zluda_trace/src/os_unix.rs",
            "src/cuda/hook.c",
            "hook.c",
            "context.c",
            "python/2_CoreConcepts/processCheckpoint/processCheckpoint.py",
            "plugins/cuda/cuda_plugin.c",
        ],
    ),
    // Files of the kubelet's, NVIDIA's, Aliyun's and HAMi's repositories,
    // the sources of the page's facts.
    (
        "docs/device-plugin.md",
        &[
            "pkg/apis/deviceplugin/v1beta1/api.proto",
            "cmd/nvidia-device-plugin/main.go",
            "internal/plugin/server.go",
            "internal/rm/health.go",
            "internal/rm/devices.go",
            "pkg/gpu/nvidia/",
            "charts/hami",
            "pkg/device-plugin",
        ],
    ),
    // The user's own Prometheus configuration.
    ("docs/kubernetes.md", &["prometheus.yml"]),
    // A Jupyter kernelspec's file, which `vramcap kernel install` writes.
    ("docs/python.md", &["kernel.json"]),
];

/// Made by the build (cargo, scripts/package.sh, scripts/test.sh's
/// tools), never kept in the repository.
const BUILD_OUTPUTS: &str = "target/";

/// The GPU runs' record: it names files as they were at each run's
/// commit, and some have since moved or gone.
const RECORDS: &[&str] = &["docs/design/gpu-history.md"];

/// The backticked paths of one page that name nothing in the repository.
fn dead_paths(root: &Path, page: &Path, text: &str, files: &BTreeSet<String>) -> Vec<String> {
    let allowed: &[&str] = NOT_REPOSITORY_PATHS
        .iter()
        .find(|(p, _)| Path::new(p) == page)
        .map_or(&[], |(_, list)| list);
    code_spans(text)
        .into_iter()
        .filter(|(_, span)| path_like(span))
        .filter(|(_, span)| !span.starts_with(BUILD_OUTPUTS) && !allowed.contains(&span.as_str()))
        .filter(|(_, span)| !names_a_repository_file(root, page, span, files))
        .map(|(line, span)| format!("{}:{line}: `{span}`", page.display()))
        .collect()
}

/// Every backticked path in README.md, ARCHITECTURE.md and docs/**/*.md
/// names a file or folder of the repository (see `path_like` for what
/// counts as a path and `names_a_repository_file` for where it may be).
#[test]
fn every_backticked_path_in_the_guide_exists() {
    let root = root();
    let files = repository_files(&root);
    let mut dead = Vec::new();
    for page in pages() {
        if RECORDS.iter().any(|r| Path::new(r) == page) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        dead.extend(dead_paths(&root, &page, &text, &files));
    }
    assert!(
        dead.is_empty(),
        "backticked paths that name no file of the repository:\n{}",
        dead.join("\n")
    );
}

/// The check itself: a planted dead path is found wherever it is written,
/// and what is no path is left alone.
#[test]
fn a_dead_backticked_path_is_found() {
    let root = root();
    let files = repository_files(&root);
    let text = "A `docs/parking.md`, `parking.md`, `process/gate.rs`, `vars.rs`,\n\
                `target/release/vramcap` and `tests/standin/`.\n\
                Dead: `docs/no-such-page.md`, `groups.md`, `engine/handles.rs`, `no_such.rs`,\n\
                `scripts/gpu-held.sh` and `crates/core/src/group.rs`.\n\
                No paths: `/run/vramcap/stats`, `vramcap.io/gpu-memory`, `PREFIX/lib/vramcap/`,\n\
                `--limit 8GiB`, `python/*.py`, `<dir>/x.md`, `VRAMCAP_LIBRARY=/opt/x.so`,\n\
                `https://example.com/a.md`, `cudaMalloc(T/2)`, `nvidia.com/gpu`, `read/write`x\n\
                ```sh\n`fenced/no-such.rs`\n```\n";
    let dead = dead_paths(&root, Path::new("docs/design/parking.md"), text, &files);
    let spans: Vec<&str> = dead.iter().map(|d| d.split('`').nth(1).unwrap()).collect();
    assert_eq!(
        spans,
        [
            "docs/no-such-page.md",
            "groups.md",
            "engine/handles.rs",
            "no_such.rs",
            "scripts/gpu-held.sh",
            "crates/core/src/group.rs",
            "read/write",
        ],
        "{dead:?}"
    );
    assert_eq!(dead[0], "docs/design/parking.md:3: `docs/no-such-page.md`");
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every variable the core reads (a `const …: &str = "VRAMCAP_…"` or
/// `"NVIDIA_…"` name anywhere in crates/core/src) has a row in
/// docs/configuration.md's table with what it takes, a default and an
/// example; the names of vramcap's own tools (`TOOL_VARS`) are named on
/// the page too. A variable added without its row fails here.
#[test]
fn every_variable_has_a_row_with_a_default_and_an_example() {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("crates/core/src"), &mut files);
    let mut vars = BTreeSet::new();
    let mut tools = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for line in text.lines() {
            let line = line.trim();
            if (line.starts_with("pub const ") || line.starts_with("const "))
                && let Some((_, v)) = line.split_once(": &str = \"")
            {
                let name = v.trim_end_matches("\";");
                // A variable's name, not a message that starts with one.
                let is_name = name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
                if is_name && (name.starts_with("VRAMCAP_") || name.starts_with("NVIDIA_")) {
                    vars.insert(name.to_string());
                }
            }
        }
        if let Some(i) = text.find("pub const TOOL_VARS: &[&str] = &[") {
            let block = &text[i..i + text[i..].find("];").unwrap()];
            for part in block.split('"').skip(1).step_by(2) {
                tools.insert(part.to_string());
            }
        }
    }
    assert!(
        vars.contains("VRAMCAP_LIMIT") && vars.len() >= 15,
        "{vars:?}"
    );
    assert!(tools.contains("VRAMCAP_DEMO_LIMIT"), "{tools:?}");

    let page = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let mut rows: HashMap<String, Vec<String>> = HashMap::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let Some((name, _)) = rest.split_once('`') else {
            continue;
        };
        let cells: Vec<String> = line
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect();
        rows.insert(name.to_string(), cells);
    }
    let mut wrong = Vec::new();
    for v in &vars {
        match rows.get(v) {
            None => wrong.push(format!("{v}: no row")),
            // variable | what it takes | default | example | `vramcap run`
            Some(cells) if cells.len() != 5 => {
                wrong.push(format!("{v}: {} cells, not 5: {cells:?}", cells.len()))
            }
            Some(cells) if cells[1].is_empty() || cells[2].is_empty() => {
                wrong.push(format!("{v}: no description or default"))
            }
            Some(cells) if !cells[3].contains(v.as_str()) => {
                wrong.push(format!("{v}: the example {:?} does not set it", cells[3]))
            }
            Some(_) => {}
        }
    }
    for t in &tools {
        if !page.contains(&format!("`{t}`")) {
            wrong.push(format!("{t}: a tool's name the page does not mention"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md's variables:\n{}",
        wrong.join("\n")
    );
}
