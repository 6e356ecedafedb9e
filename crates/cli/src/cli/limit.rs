//! `vramcap limit`: change the caps of running processes. For each GPU a
//! process uses, the new own cap (the `VRAMCAP_LIMIT` grammar resolved for
//! that GPU: its index, its UUID, a percentage of its memory) goes into the
//! slot's `requested` word; then the header's `limit_requests` is raised
//! and the shim's background thread applies it within a tick (100 ms) and
//! acknowledges (see the shim's `engine/live.rs`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vramcap_core::budget::NO_CAP;
use vramcap_core::human_bytes;
use vramcap_core::limit::{Amount, LIMIT_VAR, LimitSpec, parse_limit};
use vramcap_core::mailbox::Mailbox;
use vramcap_core::page::{FLAG_ACTIVE, Page, uuid_text};

use super::stat::StatsDirs;
use super::trim::{find, targets, usable};
use crate::read::Users;

/// What the SPEC asks for.
pub enum Want {
    /// `none`: lift the cap.
    Lift,
    Spec(LimitSpec),
}

/// Parses SPEC: `none` or the `VRAMCAP_LIMIT` grammar.
pub fn parse_want(spec: &str) -> Result<Want, String> {
    if spec.trim().is_empty() {
        return Err("SPEC is empty; give a cap as VRAMCAP_LIMIT takes it, or none, e.g. vramcap limit --pid 4242 2GiB".into());
    }
    if spec.trim().eq_ignore_ascii_case("none") {
        return Ok(Want::Lift);
    }
    let parsed = parse_limit(spec).map_err(|e| {
        format!(
            "{}; SPEC is a cap as {LIMIT_VAR} takes it or none, e.g. vramcap limit --pid 4242 2GiB",
            e.to_string().replacen(&format!("{LIMIT_VAR}="), "SPEC ", 1)
        )
    })?;
    if parsed.is_unlimited() {
        return Err(format!(
            "SPEC {spec:?} names no cap; e.g. vramcap limit --pid 4242 2GiB, or none to lift it"
        ));
    }
    Ok(Want::Spec(parsed))
}

/// The new own cap of slot `index` (with `uuid` and `total` bytes), or
/// `None` when SPEC leaves that GPU as it is.
fn resolve(want: &Want, index: u32, uuid: Option<&str>, total: u64) -> Option<u64> {
    match want {
        Want::Lift => Some(NO_CAP),
        Want::Spec(spec) => match spec.amount_for(index, uuid)? {
            Amount::Bytes(b) => Some(b.max(1)),
            a @ Amount::Percent(_) => (total > 0).then(|| a.resolve(total).max(1)),
        },
    }
}

fn shown(limit: u64) -> String {
    if limit == NO_CAP {
        "none".to_string()
    } else {
        human_bytes(limit)
    }
}

/// The options of `vramcap limit`.
pub struct LimitArgs<'a> {
    pub pids: &'a [u32],
    pub all: bool,
    /// A group whose limits change (for all its members at once).
    pub group: Option<&'a str>,
    pub spec: &'a str,
    /// How long to wait for each process to take the change.
    pub timeout: Duration,
    /// With a value: wait until each target holds at most its new cap.
    pub wait: Option<Duration>,
    /// `-i/--id`: only these GPUs of each process (all when empty).
    pub gpus: &'a [super::stat::GpuSel],
}

/// Runs `vramcap limit`; the exit status: 0 when every target took the
/// change (and, with `--wait`, is under it), 1 when some could not, 2 for a
/// bad SPEC.
pub fn run(dirs: &StatsDirs, users: Users, a: &LimitArgs) -> u8 {
    let want = match parse_want(a.spec) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("vramcap: {e}");
            return 2;
        }
    };
    let usable = usable(dirs);
    if let Some(name) = a.group {
        return match change_group(&usable, users, name, &want, a.spec) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
                0
            }
            Err((code, e)) => {
                eprintln!("vramcap: {e}");
                code
            }
        };
    }
    let targets = match targets(dirs, users, a.pids, a.all) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut failed = false;
    for pid in targets {
        match change(&usable, users, pid, &want, a) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
            }
            Err(e) => {
                eprintln!("vramcap: {e}");
                failed = true;
            }
        }
    }
    u8::from(failed)
}

/// Changes one process's caps; its report lines.
fn change(
    dirs: &[std::path::PathBuf],
    users: Users,
    pid: u32,
    want: &Want,
    a: &LimitArgs,
) -> Result<Vec<String>, String> {
    let map = find(dirs, pid, users)?;
    let page = map.page();
    // (slot, old cap in force, new own cap)
    let mut asked = Vec::new();
    for (i, s) in page.slots.iter().enumerate() {
        if s.flags.load(Ordering::Relaxed) & FLAG_ACTIVE == 0 {
            continue;
        }
        if !a.gpus.is_empty() {
            let snap = vramcap_core::counters::SlotSnapshot::read(i as u32, s);
            if !a.gpus.iter().any(|g| g.matches(&snap)) {
                continue;
            }
        }
        let uuid = uuid_text(&s.uuid_bytes());
        let Some(new) = resolve(
            want,
            i as u32,
            uuid.as_deref(),
            s.total.load(Ordering::Relaxed),
        ) else {
            continue;
        };
        let old = s.budget.limit().unwrap_or(NO_CAP);
        s.requested.store(new, Ordering::Release);
        asked.push((i, old, new));
    }
    if asked.is_empty() {
        return Err(if a.gpus.is_empty() {
            format!("{pid}: SPEC {:?} names no GPU this process uses", a.spec)
        } else {
            format!(
                "{pid}: SPEC {:?} with -i names no GPU this process uses",
                a.spec
            )
        });
    }
    let mailbox = Mailbox::limit(&page.header);
    let ticket = mailbox.ask();
    let start = Instant::now();
    while !mailbox.answered(ticket) {
        if map.shrank() {
            return Err(format!(
                "{pid}: its page was truncated while limit waited for an answer; nothing more can be asked of it"
            ));
        }
        if start.elapsed() >= a.timeout {
            return Err(timed_out(pid, page, &asked, a.timeout));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(wait) = a.wait {
        let start = Instant::now();
        while !under(page, &asked) {
            if map.shrank() || start.elapsed() >= wait {
                let mut lines = report(pid, page, &asked);
                lines.push(format!(
                    "{pid}: still over its new cap after {:.1}s",
                    wait.as_secs_f64()
                ));
                return Err(lines.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(report(pid, page, &asked))
}

/// The error of a change not taken in time, after trying to withdraw it:
/// the shim takes each slot's `requested` word by swapping it to 0 (0
/// changes nothing), so putting 0 back in place of each new cap (a
/// compare-and-swap) before the shim takes it means it will never apply
/// it. When a swap fails the shim has taken that cap (it is being
/// applied) or another `limit` replaced it: it may still take effect, for
/// instance when a parked or stopped process runs again.
fn timed_out(pid: u32, page: &Page, asked: &[(usize, u64, u64)], timeout: Duration) -> String {
    let mut withdrawn = true;
    for &(i, _, new) in asked {
        withdrawn &= page.slots[i]
            .requested
            .compare_exchange(new, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
    }
    let secs = timeout.as_secs_f64();
    if withdrawn {
        format!(
            "{pid} did not take the change within {secs:.1}s (it is stopped or parked, or its background thread is not running); the change is withdrawn: its cap stays as it was"
        )
    } else {
        format!(
            "{pid} did not take the change within {secs:.1}s; the change is still pending and may take effect when it next runs"
        )
    }
}

/// Whether every changed GPU holds at most its cap in force.
fn under(page: &Page, asked: &[(usize, u64, u64)]) -> bool {
    asked.iter().all(|&(i, _, _)| {
        let s = &page.slots[i];
        s.budget.used() <= s.budget.limit().unwrap_or(NO_CAP)
    })
}

/// One line per changed GPU: old and new cap, what the process holds.
fn report(pid: u32, page: &Page, asked: &[(usize, u64, u64)]) -> Vec<String> {
    asked
        .iter()
        .map(|&(i, old, _)| {
            let s = &page.slots[i];
            let now = s.budget.limit().unwrap_or(NO_CAP);
            let held = s.budget.used();
            let mut line = format!(
                "{pid} gpu {i}: limit {} -> {}, holds {}",
                shown(old),
                shown(now),
                human_bytes(held)
            );
            if held > now {
                line.push_str(&format!(
                    ", over the new cap by {}: new allocations are refused until it frees",
                    human_bytes(held - now)
                ));
            }
            line
        })
        .collect()
}

/// Changes group `name`'s limits: each of its GPUs that SPEC names (by
/// UUID, or its default) at once, in the group file; every member's next
/// reservation is held to the new limit, and their caps in force follow
/// within a tick. Its report lines, or the exit status and message.
fn change_group(
    dirs: &[std::path::PathBuf],
    users: Users,
    name: &str,
    want: &Want,
    spec: &str,
) -> Result<Vec<String>, (u8, String)> {
    if !vramcap_core::group::valid_name(name) {
        return Err((
            2,
            format!(
                "--group {name:?}: a group name is 1 to 63 letters, digits, '.', '_' or '-' (e.g. --group train-42)"
            ),
        ));
    }
    if let Want::Spec(s) = want {
        let percent = s
            .default
            .iter()
            .chain(s.entries.iter().map(|(_, a)| a))
            .any(|a| matches!(a, Amount::Percent(_)));
        if percent {
            return Err((
                2,
                format!(
                    "SPEC {spec:?}: a group's limit takes a size (the group file does not record its GPUs' memory), e.g. vramcap limit --group {name} 8GiB"
                ),
            ));
        }
    }
    let mut first = None;
    let map = dirs
        .iter()
        .find_map(|d| match crate::read::map_group_for_write(d, name, users) {
            Ok(m) => Some(m),
            Err(e) => {
                first.get_or_insert(e);
                None
            }
        })
        .ok_or_else(|| {
            (
                1,
                first.unwrap_or_else(|| format!("no group {name:?} (no statistics directory)")),
            )
        })?;
    let page = map.page();
    // Every GPU resolved before any is changed: a SPEC that is wrong for
    // one changes none.
    let mut changes = Vec::new();
    for (i, d) in page.devices.iter().enumerate() {
        let (Some(bytes), Some(old)) = (d.uuid_bytes(), d.limit()) else {
            continue;
        };
        let uuid = uuid_text(&bytes);
        let new = match want {
            Want::Lift => NO_CAP,
            // A group's GPUs are known by UUID only: index keys never match.
            Want::Spec(s) => match s.amount_for(u32::MAX, uuid.as_deref()) {
                None => continue,
                Some(Amount::Bytes(b)) => b.max(1),
                Some(Amount::Percent(_)) => {
                    return Err((
                        2,
                        format!(
                            "SPEC {spec:?}: a group's limit takes a size (the group file does not record its GPUs' memory), e.g. vramcap limit --group {name} 8GiB"
                        ),
                    ));
                }
            },
        };
        changes.push((i, uuid, old, new));
    }
    let mut lines = Vec::new();
    for (i, uuid, old, new) in changes {
        let _ = page.devices[i].change_limit(new);
        lines.push(format!(
            "group {name} {}: limit {} -> {}, holds {}",
            uuid.unwrap_or_else(|| format!("gpu entry {i}")),
            shown(old),
            shown(new),
            human_bytes(page.used(i))
        ));
    }
    if map.shrank() {
        return Err((
            1,
            format!("group {name:?}: its file was truncated while being changed"),
        ));
    }
    if lines.is_empty() {
        return Err((
            1,
            format!(
                "SPEC {spec:?} names no GPU of group {name:?} (a group's GPUs are named by UUID, e.g. GPU-5ca1ab1e=8GiB, or a plain size)"
            ),
        ));
    }
    Ok(lines)
}
