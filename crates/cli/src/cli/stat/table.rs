//! `vramcap stat`'s table: the processes, their devices and notes, and
//! the groups.

use super::*;

pub(super) fn groups_table(groups: &[GroupSnapshot]) -> String {
    if groups.is_empty() {
        return String::new();
    }
    let mut rows = vec![[
        "GROUP".to_string(),
        "GPU".into(),
        "LIMIT".into(),
        "USED".into(),
        "PEAK".into(),
        "MEMBERS".into(),
    ]];
    for g in groups {
        let members = g.members_text(|n, pids| format!("{n} ({pids})"));
        if g.devices.is_empty() {
            rows.push([
                g.name.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                members.clone(),
            ]);
        }
        for d in &g.devices {
            rows.push([
                g.name.clone(),
                uuid_text(&d.uuid).unwrap_or_else(|| "?".into()),
                d.limit.map(human_bytes).unwrap_or_else(|| "-".into()),
                human_bytes(d.used),
                human_bytes(d.peak),
                members.clone(),
            ]);
        }
    }
    let mut width = [0usize; 6];
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::from("\n");
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            if (2..5).contains(&i) {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                if i + 1 < r.len() {
                    line.push_str(&" ".repeat(pad));
                }
            }
            if i + 1 < r.len() {
                line.push_str("  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub(super) struct Style {
    colour: bool,
}

impl Style {
    fn paint(&self, code: &str, text: String) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text
        }
    }
}

pub fn to_table(scan: &Scan, a: &StatArgs, style_colour: bool) -> String {
    let style = Style {
        colour: style_colour,
    };
    let head = [
        "GPU", "PID", "LIMIT", "USED", "PEAK", "CACHED", "POOLS", "GRAPHS", "CONTEXT", "SPILLED",
        "%LIMIT", "OOM", "COMMAND",
    ];
    let mut rows: Vec<(Vec<String>, Option<&str>)> = Vec::new();
    for (p, devs) in filtered(scan, a) {
        for d in devs {
            let pct = d.limit.map(|l| d.used as f64 * 100.0 / l.max(1) as f64);
            let colour = if d.refusals > 0 {
                Some("31")
            } else if pct.is_some_and(|p| p >= 90.0) {
                Some("33")
            } else {
                None
            };
            rows.push((
                vec![
                    d.device.to_string(),
                    p.pid.to_string(),
                    d.limit.map(human_bytes).unwrap_or_else(|| "-".into()),
                    human_bytes(d.used),
                    human_bytes(d.peak),
                    human_bytes(d.cached),
                    human_bytes(d.pools),
                    human_bytes(d.graphs),
                    human_bytes(d.context),
                    human_bytes(d.spilled),
                    pct.map(|p| format!("{p:.1}%"))
                        .unwrap_or_else(|| "-".into()),
                    d.refusals.to_string(),
                    format!("{}{}", p.park.label(now_ns()), p.command),
                ],
                colour,
            ));
        }
    }
    let mut width = head.map(str::len);
    for (r, _) in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                // Numbers right-aligned, except the GPU and PID columns.
                let pad = width[i] - c.chars().count();
                if i >= 2 {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                }
                s.push_str("  ");
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(&head.map(String::from)) + "\n";
    for (r, colour) in &rows {
        let l = line(r);
        out.push_str(&match colour {
            Some(c) => style.paint(c, l),
            None => l,
        });
        out.push('\n');
    }
    for (p, devs) in filtered(scan, a) {
        for d in devs {
            for n in notes(p.pid, &d) {
                out.push_str(&n);
                out.push('\n');
            }
        }
    }
    if rows.is_empty() {
        out.push_str(&format!(
            "(no processes under vramcap in {})\n",
            a.sources.describe()
        ));
    }
    out.push_str(&groups_table(&a.groups));
    out
}

/// The lines under the table for one process's GPU: over its cap (after
/// a cap was lowered below what it holds), above its soft limit.
pub(super) fn notes(pid: u32, d: &SlotSnapshot) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(l) = d.limit.filter(|&l| d.used > l) {
        out.push(format!(
            "{pid} gpu {}: holds {}, over its cap of {} by {}: new allocations are refused until it frees",
            d.device,
            human_bytes(d.used),
            human_bytes(l),
            human_bytes(d.used - l)
        ));
    }
    if let Some(soft) = d.soft_limit {
        let times = match d.soft_events {
            1 => "once".to_string(),
            n => format!("{n} times"),
        };
        if d.used > soft {
            out.push(format!(
                "{pid} gpu {}: above its soft limit of {} by {}{}",
                d.device,
                human_bytes(soft),
                human_bytes(d.used - soft),
                if d.soft_events > 0 {
                    format!(" (went above it {times})")
                } else {
                    String::new()
                }
            ));
        } else if d.soft_events > 0 {
            out.push(format!(
                "{pid} gpu {}: under its soft limit of {}, went above it {times}",
                d.device,
                human_bytes(soft)
            ));
        }
    }
    out
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
