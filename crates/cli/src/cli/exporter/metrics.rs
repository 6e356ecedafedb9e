//! The metrics of one scrape, in the text exposition format 0.0.4.
//!
//! Per process and GPU, one sample of each metric in
//! `vramcap_core::counters::COUNTERS` that has one (a GPU without a cap has
//! no limit sample), labelled
//!
//! - `gpu`: the device index as the process sees it (after
//!   `CUDA_VISIBLE_DEVICES`);
//! - `UUID`: the GPU's UUID (`GPU-…`), the label name dcgm-exporter uses, so
//!   queries can join on it; empty when unknown;
//! - `pid`; `command`: the command line, cut to its first 128 characters;
//! - `group`: the process's `VRAMCAP_GROUP`, empty when none;
//! - `dir`: the directory the page was read from. With one directory per
//!   container (`--dir PARENT/*`) it tells containers apart: their PIDs may
//!   be equal, and it is the one identity a process cannot choose;
//! - `pod`, `namespace`, `container`: only when the process's environment
//!   held them when its page was made (the shim records them in the page,
//!   which is right from any PID namespace); the variables are `POD_NAME`
//!   (or else `KUBERNETES_POD_NAME`), `POD_NAMESPACE` and `CONTAINER_NAME`
//!   respectively, non-empty — the names a Kubernetes Downward API `env`
//!   block would set.
//!
//! Per group and GPU, labels `group`, `UUID` and `dir` (groups of the same
//! name in two directories are two groups): [`GROUP_FAMILIES`] (a group that
//! has no GPU yet has one sample with `UUID=""` and no limit or used
//! sample). Last, `vramcap_pages_skipped` (no labels): files in the
//! directories that look like pages or group files but could not be read
//! (foreign, corrupt or of another layout version), and files a scan's
//! bounds left out; `vramcap stat` names them.
//!
//! Every family is one `# HELP` line, one `# TYPE` line, then its samples
//! together. Label values are printable text (`vramcap_core::text`: the
//! reader escaped control characters, text-hiding characters and bytes
//! that are not UTF-8 in everything taken from a page, a group file or a
//! file name; [`escape`] applies it again, so no label value can hold one),
//! then escaped as the format requires (`\\`, `\"`, `\n`). docs/statistics.md's
//! metric table lists every family; a test (`cli::readme`) holds it to
//! [`render`].

use vramcap_core::counters::PageSnapshot;
use vramcap_core::counters::{COUNTERS, SlotSnapshot};
use vramcap_core::page::uuid_text;
use vramcap_core::text;

use crate::read::GroupSnapshot;

/// The `Content-Type` of the exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Characters of the command line kept in the `command` label.
const COMMAND_CHARS: usize = 128;

/// The `pod`, `namespace` and `container` labels the page recorded.
fn identity_labels(page: &PageSnapshot) -> impl Iterator<Item = (&'static str, String)> + '_ {
    [
        ("pod", &page.pod),
        ("namespace", &page.namespace),
        ("container", &page.container),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| (k, v.clone()))
}

/// A label value escaped for the exposition format (made printable first).
fn escape(value: &str) -> String {
    let value = text::printable(value);
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

type Labels = Vec<(&'static str, String)>;

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
}

/// `{k="v",…}` for these labels, values escaped ("" for none): made once
/// per row, written before the value of each of its samples.
fn label_text(labels: &Labels) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut out = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        out.push_str(&escape(v));
        out.push('"');
    }
    out.push('}');
    out
}

fn sample(out: &mut String, name: &str, labels: &str, value: u64) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = writeln!(out, "{name}{labels} {value}");
}

struct Family<T> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&T) -> Option<u64>,
}

/// One GPU of a group (`limit` and `used` are `None` while it has none).
struct GroupGpu {
    limit: Option<u64>,
    used: Option<u64>,
    members: u64,
}

const GROUP_FAMILIES: [Family<GroupGpu>; 3] = [
    Family {
        name: "vramcap_group_memory_limit_bytes",
        kind: "gauge",
        help: "Bytes the processes of the group may hold together on the GPU (no sample without a cap).",
        value: |g| g.limit,
    },
    Family {
        name: "vramcap_group_memory_used_bytes",
        kind: "gauge",
        help: "Bytes the processes of the group hold together on the GPU.",
        value: |g| g.used,
    },
    Family {
        name: "vramcap_group_members",
        kind: "gauge",
        help: "Live processes in the group (the same on each of its GPUs).",
        value: |g| Some(g.members),
    },
];

/// Parking's families, per process and GPU of the processes started with
/// parking (the others have nothing to show, and a scrape stays small):
/// the bytes parked, whether it is parked, and for how long.
fn park_families(out: &mut String, rows: &[(String, &SlotSnapshot, &PageSnapshot)]) {
    let rows: Vec<_> = rows
        .iter()
        .filter(|(_, _, p)| p.park.mode.is_some())
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    family(
        out,
        "vramcap_gpu_memory_parked_bytes",
        "gauge",
        "Bytes of the process's GPU memory parked in host memory (vramcap park).",
    );
    for (labels, d, p) in &rows {
        sample(
            out,
            "vramcap_gpu_memory_parked_bytes",
            labels,
            p.park.on(d.device),
        );
    }
    family(
        out,
        "vramcap_process_parked",
        "gauge",
        "1 while the process is parked, 0 otherwise (2 while parking or resuming, 3 when a restore or unlock failed).",
    );
    for (labels, _, p) in &rows {
        let v = match p.park.state {
            vramcap_core::park::ParkState::Running => 0,
            vramcap_core::park::ParkState::Parked => 1,
            vramcap_core::park::ParkState::Failed => 3,
            _ => 2,
        };
        sample(out, "vramcap_process_parked", labels, v);
    }
    family(
        out,
        "vramcap_process_park_host_kept_bytes",
        "gauge",
        "Bytes of host memory the shim's parking moves keep for the next park (VRAMCAP_PARK_MOVE=shim, the default, or shim+checkpoint; vramcap trim gives them back; the same on each of the process's GPUs).",
    );
    for (labels, _, p) in &rows {
        sample(
            out,
            "vramcap_process_park_host_kept_bytes",
            labels,
            p.park.host_kept,
        );
    }
    family(
        out,
        "vramcap_process_parked_seconds",
        "gauge",
        "Seconds the process has been parked (only while parked).",
    );
    for (labels, _, p) in &rows {
        if let Some(s) = p.park.seconds(now) {
            sample(out, "vramcap_process_parked_seconds", labels, s as u64);
        }
    }
}

/// The exposition text for these pages and groups.
pub fn render(pages: &[PageSnapshot], groups: &[GroupSnapshot], skipped: usize) -> String {
    let mut rows: Vec<(String, &SlotSnapshot, &PageSnapshot)> = Vec::new();
    for p in pages {
        let command: String = p.command.chars().take(COMMAND_CHARS).collect();
        for d in &p.devices {
            let mut labels: Labels = vec![
                ("gpu", d.device.to_string()),
                ("UUID", uuid_text(&d.uuid).unwrap_or_default()),
                ("pid", p.pid.to_string()),
                ("command", command.clone()),
                ("group", p.group.clone()),
                ("dir", text::path(&p.dir)),
            ];
            labels.extend(identity_labels(p));
            rows.push((label_text(&labels), d, p));
        }
    }
    let mut out = String::new();
    for c in COUNTERS {
        let Some(m) = c.metric else { continue };
        family(&mut out, m.name, m.kind.as_str(), m.help);
        for (labels, d, _) in &rows {
            if let Some(v) = (c.value)(d) {
                sample(&mut out, m.name, labels, v);
            }
        }
    }
    park_families(&mut out, &rows);
    let mut group_rows: Vec<(String, GroupGpu)> = Vec::new();
    for g in groups {
        let members = g.members.len() as u64;
        let label = |uuid: String| {
            label_text(&vec![
                ("group", g.name.clone()),
                ("UUID", uuid),
                ("dir", text::path(&g.dir)),
            ])
        };
        if g.devices.is_empty() {
            let none = GroupGpu {
                limit: None,
                used: None,
                members,
            };
            group_rows.push((label(String::new()), none));
        }
        for d in &g.devices {
            let gpu = GroupGpu {
                limit: d.limit,
                used: Some(d.used),
                members,
            };
            group_rows.push((label(uuid_text(&d.uuid).unwrap_or_default()), gpu));
        }
    }
    for f in &GROUP_FAMILIES {
        family(&mut out, f.name, f.kind, f.help);
        for (labels, g) in &group_rows {
            if let Some(v) = (f.value)(g) {
                sample(&mut out, f.name, labels, v);
            }
        }
    }
    family(
        &mut out,
        "vramcap_pages_skipped",
        "gauge",
        "Files in the statistics directories that could not be read as pages, or that a scan's bounds left out (vramcap stat names them).",
    );
    sample(&mut out, "vramcap_pages_skipped", "", skipped as u64);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("plain ü"), "plain ü");
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
        // Control characters never reach a label: made printable first.
        assert_eq!(escape("a\nb\x1b[2J"), "a\\\\x0ab\\\\x1b[2J");
    }

    fn slot(device: u32, limit: Option<u64>) -> SlotSnapshot {
        SlotSnapshot {
            device,
            limit,
            used: 10,
            peak: 20,
            cached: 3,
            pools: 14,
            soft_limit: Some(17),
            soft_events: 18,
            operator_limit: None,
            graphs: 15,
            context: 16,
            spilled: 4,
            allocs: 5,
            frees: 6,
            refusals: 7,
            cache_hits: 8,
            cache_misses: 9,
            cache_waits: 19,
            cache_ordered: 21,
            evictions: 11,
            trims: 12,
            spill_allocs: 13,
            promotions: 22,
            demotions: 23,
            moved_bytes: 24,
            uuid: [0; 16],
        }
    }

    #[test]
    fn rendering() {
        let pages = [PageSnapshot {
            pid: 42,
            uid: 1,
            start_time: 0,
            created_unix_ns: 0,
            command: format!("a\"b\\c\n{}", "x".repeat(200)),
            group: String::new(),
            pod: "p\"1".to_string(),
            namespace: String::new(),
            container: String::new(),
            devices: vec![slot(0, Some(100)), slot(3, None)],
            dir: std::path::PathBuf::from("/run/vramcap"),
            park: Default::default(),
        }];
        let text = render(&pages, &[], 2);
        let cmd = format!("a\\\"b\\\\c\\\\x0a{}", "x".repeat(122));
        let labels0 = format!(
            "{{gpu=\"0\",UUID=\"\",pid=\"42\",command=\"{cmd}\",group=\"\",dir=\"/run/vramcap\",pod=\"p\\\"1\"}}"
        );
        let labels3 = labels0.replace("gpu=\"0\"", "gpu=\"3\"");
        assert!(
            text.contains(&format!("\nvramcap_gpu_memory_limit_bytes{labels0} 100\n")),
            "{text}"
        );
        assert!(!text.contains(&format!("vramcap_gpu_memory_limit_bytes{labels3}")));
        assert!(text.contains(&format!("\nvramcap_spill_allocations_total{labels3} 13\n")));
        assert!(text.contains(&format!("\nvramcap_spill_promotions_total{labels3} 22\n")));
        assert!(text.contains(&format!("\nvramcap_spill_demotions_total{labels3} 23\n")));
        assert!(text.contains(&format!("\nvramcap_spill_moved_bytes_total{labels3} 24\n")));
        assert!(text.contains("\n# TYPE vramcap_frees_total counter\n"));
        assert!(text.contains("\n# TYPE vramcap_group_members gauge\n"));
        assert!(text.ends_with("\nvramcap_pages_skipped 2\n"), "{text}");
        // Every family: HELP, TYPE, then its samples together.
        let mut seen = Vec::new();
        for line in text.lines() {
            let name = if let Some(rest) = line.strip_prefix("# HELP ") {
                rest.split(' ').next().unwrap()
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                rest.split(' ').next().unwrap()
            } else {
                line.split(['{', ' ']).next().unwrap()
            };
            if seen.last() != Some(&name) {
                assert!(!seen.contains(&name), "{name} is not contiguous");
                seen.push(name);
            }
        }
        assert_eq!(seen.len(), 30);
    }

    /// A parked process started with parking: its parked bytes per GPU,
    /// its state and time parked; a process without parking shows none.
    #[test]
    fn parked_processes_show_their_bytes_state_and_time() {
        use vramcap_core::park::{ParkMode, ParkSnapshot, ParkState};
        let parked = vec![5, 0, 0, 0, 0, 0, 0, 0];
        let page = |mode| PageSnapshot {
            pid: 7,
            uid: 1,
            start_time: 0,
            created_unix_ns: 0,
            command: "nb".into(),
            group: String::new(),
            pod: String::new(),
            namespace: String::new(),
            container: String::new(),
            devices: vec![slot(0, None)],
            dir: std::path::PathBuf::from("/d"),
            park: Box::new(ParkSnapshot {
                mode,
                state: ParkState::Parked,
                since_unix_ns: 1,
                parked: parked.clone(),
                host_kept: 7 << 20,
            }),
        };
        let text = render(&[page(Some(ParkMode::Manual))], &[], 0);
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")))
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
        };
        assert_eq!(
            value("vramcap_gpu_memory_parked_bytes").as_deref(),
            Some("5")
        );
        assert_eq!(value("vramcap_process_parked").as_deref(), Some("1"));
        assert!(value("vramcap_process_parked_seconds").is_some());
        assert_eq!(
            value("vramcap_process_park_host_kept_bytes").as_deref(),
            Some("7340032")
        );
        let text = render(&[page(None)], &[], 0);
        assert!(!text.contains("vramcap_process_parked{"), "{text}");
    }
}
