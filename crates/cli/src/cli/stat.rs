//! `vramcap stat`: the pages of live processes as a table or as JSON.
//!
//! JSON schema `vramcap.stat` version 1 (one document per refresh; with
//! `--loop`, one per line): docs/statistics.md documents it, key by key, and a test
//! (`cli::readme`) holds that to what [`to_json`] prints. A device's values
//! are those of `vramcap_core::counters::COUNTERS`, in their order. `dirs`
//! lists the directories as given (`--dir`, patterns unexpanded; else the
//! one from `VRAMCAP_STATS_DIR`, else the default ones), `dir` is the
//! first of them, and each process's `dir` is the directory its page was
//! read from. Every string from a page, a group file or a file name is
//! printable text already (see `vramcap_core::text`); paths are shown
//! through `vramcap_core::text::path`.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::read::{Bounds, GroupSnapshot, Reading, Scan, Scope, Users, check_source, read_sources};
use serde_json::{Value, json};
use vramcap_core::counters::PageSnapshot;
use vramcap_core::counters::{COUNTERS, SlotSnapshot};
use vramcap_core::human_bytes;
use vramcap_core::page::uuid_text;
use vramcap_core::text;

mod table;
pub use self::table::to_table;

/// `--dir` and `--all-users`, shared by `stat`, `top` and `exporter`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ReadOptions {
    /// Read pages from DIR instead of VRAMCAP_STATS_DIR or the default;
    /// repeatable. A `*` component stands for every subdirectory there,
    /// e.g. --dir '/run/vramcap/pods/*' reads one directory per container
    #[arg(long = "dir", value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Show the pages of every user, not only yours (for root reading other
    /// users' or containers' directories)
    #[arg(long)]
    pub all_users: bool,
}

/// The directories to read and whose pages to show.
#[derive(Clone, Debug)]
pub struct Sources {
    pub dirs: Vec<PathBuf>,
    pub users: Users,
    /// `Some(uid)`: `dirs` are the default directories, read only when
    /// they are this user's own (see `read::Scope::private_to`).
    pub private_to: Option<u32>,
    /// The directories were named with `--dir`.
    pub named: bool,
}

impl Sources {
    /// From the options: the `--dir` values (checked), else
    /// `VRAMCAP_STATS_DIR`, else the default directories.
    pub fn new(opts: &ReadOptions, uid: u32) -> Result<Sources, String> {
        let (dirs, private_to) = if opts.dirs.is_empty() {
            let d = stats_dirs(uid)?;
            (d.dirs, d.private_to)
        } else {
            for d in &opts.dirs {
                check_source(d)?;
            }
            (opts.dirs.clone(), None)
        };
        let users = if opts.all_users {
            Users::All
        } else {
            Users::Only(uid)
        };
        Ok(Sources {
            dirs,
            users,
            private_to,
            named: !opts.dirs.is_empty(),
        })
    }

    /// Every page and group the directories hold now, within the bounds of
    /// one scan; the error names the directory that could not be read.
    pub fn read(&self) -> Result<Reading, String> {
        let scope = Scope {
            users: self.users,
            private_to: self.private_to,
            bounds: Bounds::DEFAULT,
        };
        read_sources(&self.dirs, &scope).map_err(|(dir, e)| {
            format!("cannot read the stats directory {}: {e}", text::path(&dir))
        })
    }

    /// A warning for each pattern whose part before the first `*` is not
    /// a directory: nothing can match it until it is (a wrong path, such
    /// as a kubelet that keeps its pods elsewhere, would otherwise read as
    /// "no processes").
    /// A named `--dir` that is no directory (yet) is said too.
    pub fn warnings(&self) -> Vec<String> {
        self.dirs
            .iter()
            .filter_map(|d| {
                if !crate::read::is_pattern(d) {
                    return (self.named && !d.is_dir()).then(|| {
                        format!(
                            "vramcap: --dir {}: no such directory (yet); nothing is shown from it until a process under vramcap writes there",
                            text::path(d)
                        )
                    });
                }
                let prefix: PathBuf = d.components().take_while(|c| c.as_os_str() != "*").collect();
                (!prefix.is_dir()).then(|| {
                    format!(
                        "vramcap: --dir {}: {} is not a directory, so nothing matches the pattern until it is",
                        text::path(d),
                        text::path(&prefix)
                    )
                })
            })
            .collect()
    }

    /// The directories as the user named them, for messages.
    pub fn describe(&self) -> String {
        let all: Vec<String> = self.dirs.iter().map(|d| text::path(d)).collect();
        all.join(", ")
    }
}

pub struct StatArgs {
    /// Filled in on each refresh.
    pub groups: Vec<GroupSnapshot>,
    pub json: bool,
    pub interval: Option<Duration>,
    pub count: Option<u64>,
    pub pids: Vec<u32>,
    pub gpus: Vec<GpuSel>,
    /// `--format csv[,noheader][,nounits]`.
    pub csv: Option<CsvFormat>,
    pub sources: Sources,
}

/// A time (nanoseconds since the Unix epoch) as RFC 3339 in UTC, to the
/// millisecond: `2026-12-01T16:50:00.123Z`.
pub fn rfc3339(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let ms = (ns / 1_000_000) % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// `--format csv[,noheader][,nounits]`, as nvidia-smi's `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvFormat {
    pub header: bool,
    pub units: bool,
}

/// Parses `--format`.
pub fn parse_format(text: &str) -> Result<CsvFormat, String> {
    let mut parts = text.split(',').map(str::trim);
    let bad = || {
        format!(
            "{text:?} is not a format: csv, optionally with noheader and nounits, e.g. --format csv,noheader,nounits"
        )
    };
    if parts.next() != Some("csv") {
        return Err(bad());
    }
    let mut f = CsvFormat {
        header: true,
        units: true,
    };
    for p in parts {
        match p {
            "noheader" => f.header = false,
            "nounits" => f.units = false,
            _ => return Err(bad()),
        }
    }
    Ok(f)
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The CSV form: one line per process and GPU, sizes in whole MiB
/// (rounded down) with ` MiB` unless `nounits`, `[N/A]` for no limit.
pub fn to_csv(scan: &Scan, a: &StatArgs, f: CsvFormat) -> String {
    let mib = |b: u64| {
        if f.units {
            format!("{} MiB", b >> 20)
        } else {
            (b >> 20).to_string()
        }
    };
    let unit = if f.units { " [MiB]" } else { "" };
    let mut out = String::new();
    if f.header {
        out.push_str(&format!(
            "gpu, uuid, pid, limit{unit}, used{unit}, peak{unit}, cached{unit}, pools{unit}, graphs{unit}, context{unit}, spilled{unit}, refusals, command\n"
        ));
    }
    for (p, devs) in filtered(scan, a) {
        for d in devs {
            let cells = [
                d.device.to_string(),
                vramcap_core::page::uuid_text(&d.uuid).unwrap_or_else(|| "[N/A]".into()),
                p.pid.to_string(),
                d.limit.map_or_else(|| "[N/A]".into(), mib),
                mib(d.used),
                mib(d.peak),
                mib(d.cached),
                mib(d.pools),
                mib(d.graphs),
                mib(d.context),
                mib(d.spilled),
                d.refusals.to_string(),
                csv_field(&text::printable(&p.command)),
            ];
            out.push_str(&cells.join(", "));
            out.push('\n');
        }
    }
    out
}

/// A GPU as `-i/--id` names it, as `nvidia-smi -i` does: an index as the
/// process sees it, or a UUID prefix (`GPU-5ca1ab1e`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSel {
    Index(u32),
    Uuid(String),
}

impl GpuSel {
    pub fn matches(&self, d: &SlotSnapshot) -> bool {
        match self {
            GpuSel::Index(i) => d.device == *i,
            GpuSel::Uuid(prefix) => vramcap_core::page::uuid_text(&d.uuid)
                .is_some_and(|u| u.to_ascii_lowercase().starts_with(prefix)),
        }
    }
}

/// Parses one item of `-i/--id`.
pub fn parse_gpu(text: &str) -> Result<GpuSel, String> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse()
            .map(GpuSel::Index)
            .map_err(|_| format!("{text:?} is too large for a GPU index"));
    }
    let lower = t.to_ascii_lowercase();
    if (lower.starts_with("gpu-") || lower.starts_with("mig-")) && lower.len() > 4 {
        return Ok(GpuSel::Uuid(lower));
    }
    Err(format!(
        "{text:?} names no GPU: give indices or UUID prefixes, comma-separated, e.g. -i 0,1 or -i GPU-5ca1ab1e"
    ))
}

fn filtered(scan: &Scan, a: &StatArgs) -> Vec<(PageSnapshot, Vec<SlotSnapshot>)> {
    scan.pages
        .iter()
        .filter(|p| a.pids.is_empty() || a.pids.contains(&p.pid))
        .map(|p| {
            let devs = p
                .devices
                .iter()
                .filter(|d| a.gpus.is_empty() || a.gpus.iter().any(|g| g.matches(d)))
                .copied()
                .collect();
            (p.clone(), devs)
        })
        .filter(|(_, devs): &(PageSnapshot, Vec<SlotSnapshot>)| {
            a.gpus.is_empty() || !devs.is_empty()
        })
        .collect()
}

/// One device of a process: its index, UUID, then every value of
/// [`COUNTERS`], in their order.
fn device_json(d: &SlotSnapshot, park: &vramcap_core::park::ParkSnapshot) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("gpu".into(), json!(d.device));
    out.insert("uuid".into(), json!(uuid_text(&d.uuid)));
    for c in COUNTERS {
        out.insert(c.json.into(), json!((c.value)(d)));
    }
    out.insert("parked_bytes".into(), json!(park.on(d.device)));
    Value::Object(out)
}

/// A process's parking: whether it may be parked (`mode`: null, "manual"
/// or the idle threshold in seconds), its state, the bytes parked and
/// since when.
fn park_json(p: &vramcap_core::park::ParkSnapshot, now: u64) -> Value {
    use vramcap_core::park::ParkMode;
    json!({
        "mode": match p.mode {
            None => Value::Null,
            Some(ParkMode::Manual) => json!("manual"),
            Some(ParkMode::Idle(t)) => json!(format!("idle:{}s", t.as_secs_f64())),
        },
        "state": p.state.name(),
        "parked_bytes": p.bytes(),
        "parked_since_unix_ns": (p.since_unix_ns != 0).then_some(p.since_unix_ns),
        "parked_seconds": p.seconds(now),
        "host_kept_bytes": p.host_kept,
    })
}

fn groups_json(groups: &[GroupSnapshot]) -> Vec<Value> {
    groups
        .iter()
        .map(|g| {
            json!({
                "name": g.name,
                "limit": g.limit_text,
                "devices": g.devices.iter().map(|d| json!({
                    "uuid": uuid_text(&d.uuid),
                    "limit_bytes": d.limit,
                    "used_bytes": d.used,
                    "peak_bytes": d.peak,
                })).collect::<Vec<_>>(),
                "members": g.members.iter().map(|m| json!({
                    "pid": m.pid,
                    "start_time_ticks": m.start_time,
                    "held_bytes": m.held,
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

pub fn to_json(scan: &Scan, a: &StatArgs) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let processes: Vec<Value> = filtered(scan, a)
        .iter()
        .map(|(p, devs)| {
            json!({
                "pid": p.pid,
                "start_time_ticks": p.start_time,
                "command": p.command,
                "group": if p.group.is_empty() { Value::Null } else { Value::from(p.group.clone()) },
                "pod": if p.pod.is_empty() { Value::Null } else { Value::from(p.pod.clone()) },
                "namespace": if p.namespace.is_empty() { Value::Null } else { Value::from(p.namespace.clone()) },
                "container": if p.container.is_empty() { Value::Null } else { Value::from(p.container.clone()) },
                "dir": text::path(&p.dir),
                "devices": devs.iter().map(|d| device_json(d, &p.park)).collect::<Vec<_>>(),
                "park": park_json(&p.park, now),
            })
        })
        .collect();
    json!({
        "schema": "vramcap.stat",
        "version": 1,
        "time_unix_ns": now,
        "time_unix_ms": now / 1_000_000,
        "time": rfc3339(now),
        "dir": text::path(&a.sources.dirs[0]),
        "dirs": a.sources.dirs.iter().map(|d| text::path(d)).collect::<Vec<_>>(),
        "processes": processes,
        "groups": groups_json(&a.groups),
        "skipped": scan.skipped.iter().map(|s| json!({"file": text::path(&s.path), "reason": s.reason})).collect::<Vec<_>>(),
    })
}

/// Runs `stat`; returns the exit code.
pub fn run(a: &mut StatArgs) -> u8 {
    for w in a.sources.warnings() {
        eprintln!("{w}");
    }
    let mut warned: HashSet<(PathBuf, String)> = HashSet::new();
    let tty = std::io::stdout().is_terminal();
    let colour = tty && std::env::var_os("NO_COLOR").is_none();
    let mut n = 0u64;
    loop {
        let Reading {
            scan: s, groups, ..
        } = match a.sources.read() {
            Ok(x) => x,
            Err(e) => {
                eprintln!("vramcap: {e}");
                return 1;
            }
        };
        a.groups = groups;
        for sk in &s.skipped {
            if warned.insert((sk.path.clone(), sk.reason.clone())) {
                eprintln!("vramcap: skipping {}: {}", text::path(&sk.path), sk.reason);
            }
        }
        let mut stdout = std::io::stdout().lock();
        let text = if a.json {
            format!("{}\n", to_json(&s, a))
        } else if let Some(f) = a.csv {
            to_csv(&s, a, f)
        } else {
            let clear = if a.interval.is_some() && tty {
                "\x1b[H\x1b[2J"
            } else {
                ""
            };
            // With --loop, each refresh starts with its time.
            let stamp = if a.interval.is_some() {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                format!("# {}\n", rfc3339(now))
            } else {
                String::new()
            };
            format!("{clear}{stamp}{}", to_table(&s, a, colour))
        };
        if stdout
            .write_all(text.as_bytes())
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return 0; // a closed pipe ends the loop quietly
        }
        drop(stdout);
        n += 1;
        if a.interval.is_none() {
            // Processes asked for by PID that are not there: said, and
            // the exit status is 1, as for `vramcap trim`.
            let missing: Vec<String> = a
                .pids
                .iter()
                .filter(|pid| !s.pages.iter().any(|p| p.pid == **pid))
                .map(u32::to_string)
                .collect();
            if !missing.is_empty() {
                eprintln!(
                    "vramcap: no process {} under vramcap in {}",
                    missing.join(", "),
                    a.sources.describe()
                );
                return 1;
            }
        }
        match a.interval {
            Some(d) if a.count.is_none_or(|c| n < c) => std::thread::sleep(d),
            _ => return 0,
        }
    }
}

/// Parses a duration in seconds for `--timeout` and `--wait`.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "\"{text}\" is not a duration: expected seconds, greater than 0 (e.g. --timeout 2 or --timeout 0.5)"
        )),
    }
}

pub fn parse_interval(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "\"{text}\" is not a refresh interval: expected seconds, greater than 0 (e.g. --loop 1 or --loop 0.5)"
        )),
    }
}

/// The directories pages are read from when no `--dir` is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsDirs {
    pub dirs: Vec<PathBuf>,
    /// `Some(uid)` for the default directories: each is read only when it
    /// is this user's own, as the shim writes only there.
    pub private_to: Option<u32>,
}

/// `VRAMCAP_STATS_DIR`, else every default directory a writer of this
/// user may have chosen (`vramcap_core::stats_dir::reader_dirs`: the one
/// this environment's programs choose first).
pub fn stats_dirs(uid: u32) -> Result<StatsDirs, String> {
    match std::env::var_os("VRAMCAP_STATS_DIR") {
        Some(d) if Path::new(&d).is_absolute() => Ok(StatsDirs {
            dirs: vec![PathBuf::from(d)],
            private_to: None,
        }),
        Some(d) => Err(format!(
            "VRAMCAP_STATS_DIR=\"{}\" is not valid: expected an absolute directory path",
            d.to_string_lossy()
        )),
        None => Ok(StatsDirs {
            dirs: vramcap_core::stats_dir::reader_dirs(
                uid,
                std::env::var_os(vramcap_core::stats_dir::RUNTIME_VAR).as_deref(),
            ),
            private_to: Some(uid),
        }),
    }
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn rfc3339_is_utc_to_the_millisecond() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::rfc3339(951_782_400_123_000_000),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            super::rfc3339(1_796_083_200_000_000_000 + 59_999_999_999),
            "2026-12-01T00:00:59.999Z"
        );
    }
}
