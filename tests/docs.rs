//! The user guide's links: every relative link in README.md, ARCHITECTURE.md
//! and docs/**/*.md names a file or folder that exists, and an anchor
//! (`page.md#section`, `#section`) names a heading of that page, as GitHub
//! makes its anchors. Links to other sites are not followed. Every page of
//! the guide is reachable from README.md. Every variable the core reads
//! has its row in docs/configuration.md. (The `vramcap stat --json` schema
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
