//! docs/statistics.md documents `vramcap stat --json`'s schema and the
//! exporter's metrics; these tests hold both to what the code prints, so
//! adding a counter (crates/core/src/counters.rs) without its lines there
//! fails here, and says which lines to write.

use std::path::PathBuf;

use vramcap_core::counters::PageSnapshot;
use vramcap_core::counters::{COUNTERS, SlotSnapshot};

use super::stat::{Sources, StatArgs, to_json};
use crate::read::{GroupSnapshot, Scan, Skipped, Users};

/// The page that holds the schema and the metric table.
const PAGE: &str = "docs/statistics.md";

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/statistics.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// A document with one of everything: a process with one device, a group
/// with one device and one member, one skipped file.
fn sample_json() -> serde_json::Value {
    use crate::read::{GroupDeviceSnapshot, MemberSnapshot};
    let scan = Scan {
        pages: vec![PageSnapshot {
            pid: 1,
            uid: 0,
            start_time: 0,
            created_unix_ns: 0,
            command: String::new(),
            group: String::new(),
            pod: String::new(),
            namespace: String::new(),
            container: String::new(),
            devices: vec![SlotSnapshot::default()],
            dir: PathBuf::from("/d"),
            park: Default::default(),
        }],
        skipped: vec![Skipped {
            path: PathBuf::from("/d/x.page"),
            reason: String::new(),
            count: 1,
        }],
        pruned: Vec::new(),
    };
    let args = StatArgs {
        groups: vec![GroupSnapshot {
            dir: PathBuf::from("/d"),
            name: "g".into(),
            limit_text: String::new(),
            devices: vec![GroupDeviceSnapshot {
                uuid: [0; 16],
                limit: None,
                used: 0,
                peak: 0,
            }],
            members: vec![MemberSnapshot {
                pid: 1,
                start_time: 0,
                held: vec![0],
            }],
        }],
        json: true,
        interval: None,
        count: None,
        pids: Vec::new(),
        gpus: Vec::new(),
        csv: None,
        sources: Sources {
            dirs: vec![PathBuf::from("/d")],
            users: Users::All,
            private_to: None,
            named: false,
        },
    };
    to_json(&scan, &args)
}

/// Every key of `v`, depth first, in the order printed.
fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// The page's `text` block that holds the stat schema.
fn schema_block(readme: &str) -> &str {
    let start = readme
        .find("```text\n{ \"schema\": \"vramcap.stat\"")
        .unwrap_or_else(|| panic!("{PAGE} has the vramcap.stat schema in a ```text block"));
    let body = &readme[start + "```text\n".len()..];
    &body[..body.find("```").expect("the schema block ends")]
}

/// The `"key": type` pairs of the schema block, in order.
fn schema_keys(block: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = block;
    while let Some(open) = rest.find('"') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('"') else { break };
        let name = &after[..close];
        rest = &after[close + 1..];
        if let Some(ty) = rest.strip_prefix(": ") {
            let end = ty.find([',', ' ', '\n']).unwrap_or(ty.len());
            out.push((name.to_string(), ty[..end].to_string()));
        }
    }
    out
}

#[test]
fn readme_schema_is_what_stat_json_prints() {
    let readme = readme();
    let documented = schema_keys(schema_block(&readme));
    let mut printed = Vec::new();
    keys(&sample_json(), &mut printed);
    let names: Vec<&str> = documented.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names, printed,
        "{PAGE}'s `vramcap stat --json` schema is not what stat prints, key by key"
    );
    // Each device value is documented with its type.
    let default = SlotSnapshot::default();
    for c in COUNTERS {
        let ty = if (c.value)(&default).is_some() {
            "u64"
        } else {
            "u64|null"
        };
        let line = format!("\"{}\": {ty}", c.json);
        assert!(
            documented
                .iter()
                .any(|(k, t)| k == c.json && t.trim_end_matches(['}', ']']) == ty),
            "{PAGE}'s schema should have {line}"
        );
    }
}

#[test]
fn readme_metric_table_is_what_the_exporter_serves() {
    let text = super::exporter::render_metrics(&[], &[], 0);
    let mut want = Vec::new();
    let mut help = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), h.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            want.push(format!(
                "| `{name}` | {kind} | {} |",
                help.get(name).map_or("", String::as_str)
            ));
        }
    }
    assert_eq!(want.len(), 30, "{text}");
    let readme = readme();
    let rows: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `vramcap_"))
        .collect();
    assert_eq!(
        rows,
        want,
        "{PAGE}'s metric table is not what the exporter serves; its rows should be:\n{}",
        want.join("\n")
    );
}
