//! `vramcap park` and `vramcap resume`: ask running processes (started with
//! `VRAMCAP_PARK`) to move their GPU memory to host memory, or back. Like
//! `vramcap limit`: what is asked goes into the page's header (`park_ask`),
//! the request counter is raised, and the shim's background thread acts
//! within a tick and acknowledges with an outcome (`vramcap_core::park`).
//! Only a user who may write the page (its owner, or root) can ask.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vramcap_core::human_bytes;
use vramcap_core::mailbox::{Mailbox, post_park, withdraw_park};
use vramcap_core::page::{FLAG_ACTIVE, Page, get_text};
use vramcap_core::park::{Ask, Outcome, ParkMode, ParkState};

use super::stat::StatsDirs;
use super::trim::{find, targets, usable};
use crate::read::{PageMap, Users};

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
    /// How long to wait for each process to answer (default: 10 s and 1 s per GiB it holds, at most 300 s); all are waited for together
    #[arg(long, value_name = "SECONDS", value_parser = super::stat::parse_seconds)]
    pub timeout: Option<Duration>,
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
    /// `--timeout`: how long each process's answer is waited for (else
    /// [`bound`]'s default).
    pub timeout: Option<Duration>,
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
            timeout: self.timeout,
        }
    }
}

/// The most a process's answer is waited for by default, however much
/// its page says it holds (a page's words are whatever its writer put
/// there): `--timeout` sets another bound.
pub const MAX_DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a waiting target's liveness is checked again.
const ALIVE_EVERY: Duration = Duration::from_millis(100);

/// Runs `vramcap park` (`ask` Park) or `vramcap resume`; the exit status:
/// 0 when every target did it, 1 when some could not (refused, no room, no
/// answer), as `vramcap limit`.
///
/// Every target is asked first (a dead one is not asked at all), then all
/// the answers are waited for together, each within its own bound (see
/// [`bound`]), so one target that never answers costs its bound once, not
/// once per target after it. The lines come out in the targets' order.
pub fn run(dirs: &StatsDirs, users: Users, ask: Ask, a: &ParkArgs) -> u8 {
    let usable = usable(dirs);
    let all = a.all || a.group.is_some();
    let targets = match targets(dirs, users, a.pids, all) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut slots: Vec<Slot> = targets
        .into_iter()
        .map(|pid| match prepare(&usable, users, pid, ask, a) {
            Ok(None) => Slot::Done(None),
            Ok(Some(p)) => Slot::Waiting(p),
            Err(e) => Slot::Done(Some(Err(e))),
        })
        .collect();
    let mut failed = false;
    let mut matched = 0;
    let mut shown = 0;
    loop {
        let mut waiting = false;
        for slot in &mut slots {
            if let Slot::Waiting(p) = slot {
                match poll(p, ask, a) {
                    Some(r) => *slot = Slot::Done(Some(r)),
                    None => waiting = true,
                }
            }
        }
        while let Some(Slot::Done(r)) = slots.get(shown) {
            match r {
                None => {}
                Some(Ok(line)) => {
                    matched += 1;
                    println!("{line}");
                }
                Some(Err(e)) => {
                    matched += 1;
                    eprintln!("vramcap: {e}");
                    failed = true;
                }
            }
            shown += 1;
        }
        if !waiting {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
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

/// A target: asked and waited for, or done (`None`: not a target).
enum Slot {
    Waiting(Pending),
    Done(Option<Result<String, String>>),
}

/// A request posted to one process, its answer not yet read.
struct Pending {
    pid: u32,
    map: PageMap,
    ticket: u64,
    /// When this request was posted, and the first (a resume without
    /// room asks again while `--wait` lasts).
    asked: Instant,
    first: Instant,
    bound: Duration,
    /// A resume without room: when to ask again.
    again_at: Option<Instant>,
    alive_checked: Instant,
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
        .fold(0u64, |sum, w| sum.saturating_add(w.load(Ordering::Acquire)))
}

fn held_bytes(page: &Page) -> u64 {
    page.slots
        .iter()
        .fold(0u64, |sum, s| sum.saturating_add(s.budget.used()))
}

/// How long one answer is waited for: `--timeout`, else 10 s and 1 s per
/// GiB the process holds or has parked (parking copies every byte), at
/// most [`MAX_DEFAULT_TIMEOUT`] whatever the page claims.
fn bound(page: &Page, timeout: Option<Duration>) -> Duration {
    timeout.unwrap_or_else(|| {
        let gib = held_bytes(page)
            .saturating_add(parked_bytes(page))
            .div_ceil(1 << 30);
        Duration::from_secs(10u64.saturating_add(gib)).min(MAX_DEFAULT_TIMEOUT)
    })
}

/// One process: `Ok(None)` when it is not a target (another group, other
/// GPUs, not idle long enough), else its request posted, or its error (a
/// dead process is not asked: nobody would answer).
fn prepare(
    dirs: &[std::path::PathBuf],
    users: Users,
    pid: u32,
    ask: Ask,
    a: &ParkArgs,
) -> Result<Option<Pending>, String> {
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
    if ParkMode::from_word(h.park_mode).is_none() {
        if a.pids.is_empty() {
            return Ok(None);
        }
        return Err(format!(
            "process {pid} was not started with parking (VRAMCAP_PARK); start it as vramcap run --park manual …"
        ));
    }
    if !map.alive() {
        return Err(format!(
            "{pid} is not running (its page is left from a process that ended); nothing was asked"
        ));
    }
    if let (Ask::Park, Some(idle)) = (ask, a.idle) {
        let last = h.last_activity.load(Ordering::Acquire);
        let since = Duration::from_nanos(now_ns().saturating_sub(last));
        if last != 0 && since < idle {
            return Ok(None);
        }
    }
    let now = Instant::now();
    let mut p = Pending {
        pid,
        bound: bound(page, a.timeout),
        map,
        ticket: 0,
        asked: now,
        first: now,
        again_at: None,
        alive_checked: now,
    };
    post(&mut p, ask);
    Ok(Some(p))
}

fn post(p: &mut Pending, ask: Ask) {
    let h = &p.map.page().header;
    p.ticket = post_park(h, ask);
    p.asked = Instant::now();
}

/// One look at a pending request: its line or error once it is answered
/// (or cannot be), `None` while it is still waited for.
fn poll(p: &mut Pending, ask: Ask, a: &ParkArgs) -> Option<Result<String, String>> {
    let pid = p.pid;
    let page = p.map.page();
    let h = &page.header;
    if let Some(at) = p.again_at {
        if Instant::now() >= at {
            p.again_at = None;
            post(p, ask);
        }
        return None;
    }
    if p.map.shrank() {
        return Some(Err(format!(
            "{pid}: its page was truncated while {} waited for an answer",
            verb(ask)
        )));
    }
    if Mailbox::park(h).answered(p.ticket) {
        let outcome = Outcome::from_word(h.park_outcome.load(Ordering::Acquire));
        return match (ask, outcome) {
            (Ask::Park, Outcome::Ok) => Some(Ok(parked_line(pid, page))),
            (Ask::Resume, Outcome::Ok) => Some(Ok(format!(
                "{pid}: running, holds {}",
                human_bytes(held_bytes(page))
            ))),
            (Ask::Resume, Outcome::NoRoom(_)) if p.first.elapsed() < a.wait => {
                p.again_at = Some(Instant::now() + Duration::from_millis(200));
                None
            }
            (_, o) => Some(Err(format!("{pid}: cannot {}: {o}", verb(ask)))),
        };
    }
    if p.alive_checked.elapsed() >= ALIVE_EVERY {
        p.alive_checked = Instant::now();
        if !p.map.alive() {
            return Some(Err(format!(
                "{pid} ended before it answered; nothing more can be asked of it"
            )));
        }
    }
    if p.asked.elapsed() >= p.bound {
        return Some(Err(timed_out(p, ask)));
    }
    None
}

/// What a park that was answered Ok did, as the page shows it now.
fn parked_line(pid: u32, page: &Page) -> String {
    let h = &page.header;
    match ParkState::from_word(h.park_state.load(Ordering::Acquire)) {
        // A call of its own resumed it before the answer was read: what
        // was moved is back, and no longer counted as parked.
        state @ (ParkState::Running | ParkState::Resuming) => format!(
            "{pid}: parked, then {} at once by a CUDA call of its own; holds {}",
            if state == ParkState::Running {
                "resumed"
            } else {
                "resuming"
            },
            human_bytes(held_bytes(page))
        ),
        _ => format!(
            "{pid}: parked, {} moved to host memory and released",
            human_bytes(parked_bytes(page))
        ),
    }
}

/// The error of a request not answered in time, after trying to withdraw
/// it (`vramcap_core::mailbox::withdraw_park`): withdrawn, the shim never
/// acts on it. When that fails the shim has taken it (it is being carried
/// out) or another request replaced it: either way it may still take
/// effect.
fn timed_out(p: &Pending, ask: Ask) -> String {
    let withdrawn = withdraw_park(&p.map.page().header, ask);
    let secs = p.bound.as_secs_f64();
    let pid = p.pid;
    if withdrawn {
        format!(
            "{pid} did not answer within {secs:.1}s (it is stopped, or its background thread is not running); the request is withdrawn: nothing changes when it runs again"
        )
    } else {
        format!(
            "{pid} did not answer within {secs:.1}s; the request is still pending and may take effect when it next runs (vramcap {} --pid {pid} undoes it)",
            match ask {
                Ask::Resume => "park",
                Ask::Park | Ask::ParkIfIdle => "resume",
            }
        )
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default wait is the CLI's, whatever the page claims: 10 s and
    /// 1 s per GiB held or parked, at most 300 s, the sums saturating; a
    /// `--timeout` is used as given.
    #[test]
    fn the_default_bound_does_not_follow_the_page_past_its_limit() {
        // SAFETY: a page is plain words; all zeroes is a valid one.
        let page: Box<Page> = unsafe { Box::new_zeroed().assume_init() };
        assert_eq!(bound(&page, None), Duration::from_secs(10));
        page.header.parked[0].store(3 << 30, Ordering::Relaxed);
        assert_eq!(bound(&page, None), Duration::from_secs(13));
        for w in &page.header.parked {
            w.store(u64::MAX, Ordering::Relaxed);
        }
        assert_eq!(parked_bytes(&page), u64::MAX);
        assert_eq!(bound(&page, None), MAX_DEFAULT_TIMEOUT);
        assert_eq!(MAX_DEFAULT_TIMEOUT, Duration::from_secs(300));
        assert_eq!(
            bound(&page, Some(Duration::from_millis(500))),
            Duration::from_millis(500)
        );
    }
}
