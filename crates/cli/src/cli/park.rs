//! `vramcap park` and `vramcap resume`: ask running processes (started with
//! `VRAMCAP_PARK`) to move their GPU memory to host memory, or back. Like
//! `vramcap limit`: what is asked goes into the page's header (`park_ask`),
//! the request counter is raised, and the shim's background thread acts
//! within a tick and acknowledges with an outcome (`vramcap_core::park`).
//! Only a user who may write the page (its owner, or root) can ask.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vramcap_core::human_bytes;
use vramcap_core::page::{FLAG_ACTIVE, Page, acknowledged, get_text};
use vramcap_core::park::{Ask, Outcome, ParkMode};

use super::stat::StatsDirs;
use super::trim::{find, next_ticket, targets, usable};
use crate::read::Users;

/// Which processes: the options both commands take (clap).
#[derive(clap::Args)]
pub struct Targets {
    /// Processes (repeatable)
    #[arg(long = "pid", value_name = "PID", required_unless_present_any = ["all", "group"], conflicts_with_all = ["all", "group"])]
    pub pids: Vec<u32>,
    /// Every process of this user started with parking
    #[arg(long, conflicts_with = "group")]
    pub all: bool,
    /// The members of this group
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// Only processes that use one of these GPUs: indices or UUID prefixes
    #[arg(short = 'i', long = "id", value_name = "ID[,ID…]", value_delimiter = ',', value_parser = super::stat::parse_gpu)]
    pub gpus: Vec<super::stat::GpuSel>,
}

/// The options both commands share.
pub struct ParkArgs<'a> {
    pub pids: &'a [u32],
    pub all: bool,
    pub group: Option<&'a str>,
    /// `-i/--id`: only processes that use one of these GPUs.
    pub gpus: &'a [super::stat::GpuSel],
    /// park: only processes idle at least this long.
    pub idle: Option<Duration>,
    /// resume: how long to keep asking while there is no room.
    pub wait: Duration,
}

impl Targets {
    /// The arguments of one run: `idle` for park, `wait` for resume.
    pub fn args(&self, idle: Option<Duration>, wait: Option<Duration>) -> ParkArgs<'_> {
        ParkArgs {
            pids: &self.pids,
            all: self.all,
            group: self.group.as_deref(),
            gpus: &self.gpus,
            idle,
            wait: wait.unwrap_or_default(),
        }
    }
}

/// Runs `vramcap park` (`ask` Park) or `vramcap resume`; the exit status:
/// 0 when every target did it, 1 when some could not (refused, no room, no
/// answer), as `vramcap limit`.
pub fn run(dirs: &StatsDirs, users: Users, ask: Ask, a: &ParkArgs) -> u8 {
    let usable = usable(dirs);
    let all = a.all || a.group.is_some();
    let targets = match targets(dirs, users, a.pids, all) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut failed = false;
    let mut matched = 0;
    for pid in targets {
        match one(&usable, users, pid, ask, a) {
            Ok(None) => {}
            Ok(Some(line)) => {
                matched += 1;
                println!("{line}");
            }
            Err(e) => {
                matched += 1;
                eprintln!("vramcap: {e}");
                failed = true;
            }
        }
    }
    if matched == 0 {
        if let Some(g) = a.group {
            println!("no process of group {g} to {}", verb(ask));
        } else {
            println!("no process to {}", verb(ask));
        }
    }
    u8::from(failed)
}

fn verb(ask: Ask) -> &'static str {
    match ask {
        Ask::Park | Ask::ParkIfIdle => "park",
        Ask::Resume => "resume",
    }
}

fn parked_bytes(page: &Page) -> u64 {
    page.header
        .parked
        .iter()
        .map(|w| w.load(Ordering::Acquire))
        .sum()
}

fn held_bytes(page: &Page) -> u64 {
    page.slots.iter().map(|s| s.budget.used()).sum()
}

/// One process: `Ok(None)` when it is not a target (another group, other
/// GPUs, not idle long enough), else its line or its error.
fn one(
    dirs: &[std::path::PathBuf],
    users: Users,
    pid: u32,
    ask: Ask,
    a: &ParkArgs,
) -> Result<Option<String>, String> {
    let map = find(dirs, pid, users)?;
    let page = map.page();
    let h = &page.header;
    if let Some(g) = a.group
        && get_text(&h.group) != g
    {
        return Ok(None);
    }
    if !a.gpus.is_empty() {
        let uses = page.slots.iter().enumerate().any(|(i, s)| {
            s.flags.load(Ordering::Relaxed) & FLAG_ACTIVE != 0
                && a.gpus
                    .iter()
                    .any(|g| g.matches(&vramcap_core::counters::SlotSnapshot::read(i as u32, s)))
        });
        if !uses {
            return Ok(None);
        }
    }
    let Some(mode) = ParkMode::from_word(h.park_mode) else {
        if a.pids.is_empty() {
            return Ok(None);
        }
        return Err(format!(
            "process {pid} was not started with parking (VRAMCAP_PARK); start it as vramcap run --park manual …"
        ));
    };
    let _ = mode;
    if let (Ask::Park, Some(idle)) = (ask, a.idle) {
        let last = h.last_activity.load(Ordering::Acquire);
        let since = Duration::from_nanos(now_ns().saturating_sub(last));
        if last != 0 && since < idle {
            return Ok(None);
        }
    }
    // Parking copies every byte: 10 s and 1 s per GiB held to answer.
    let timeout =
        Duration::from_secs(10 + (held_bytes(page) + parked_bytes(page)).div_ceil(1 << 30));
    let start = Instant::now();
    loop {
        h.park_ask.store(ask as u64, Ordering::Release);
        let ticket = next_ticket(&h.park_requests);
        let asked = Instant::now();
        while !acknowledged(h.park_acks.load(Ordering::Acquire), ticket) {
            if map.shrank() {
                return Err(format!(
                    "{pid}: its page was truncated while {} waited for an answer",
                    verb(ask)
                ));
            }
            if asked.elapsed() >= timeout {
                return Err(format!(
                    "{pid} did not answer within {:.0}s (it is not running, or its background thread is not)",
                    timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let outcome = Outcome::from_word(h.park_outcome.load(Ordering::Acquire));
        match (ask, outcome) {
            (Ask::Park, Outcome::Ok) => {
                return Ok(Some(format!(
                    "{pid}: parked, {} moved to host memory and released",
                    human_bytes(parked_bytes(page))
                )));
            }
            (Ask::Resume, Outcome::Ok) => {
                return Ok(Some(format!(
                    "{pid}: running, holds {}",
                    human_bytes(held_bytes(page))
                )));
            }
            (Ask::Resume, Outcome::NoRoom(_)) if start.elapsed() < a.wait => {
                std::thread::sleep(Duration::from_millis(200));
            }
            (_, o) => return Err(format!("{pid}: cannot {}: {o}", verb(ask))),
        }
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
