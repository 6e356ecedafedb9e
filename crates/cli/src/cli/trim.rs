//! `vramcap trim`: ask processes to give their cached blocks back to the
//! driver. The request is a counter in the process's page; the shim's cache
//! thread (which runs whenever the process has cached anything) answers
//! within a tick (100 ms) by releasing everything and acknowledging.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::stat::StatsDirs;
use crate::read::{Bounds, PageMap, Scope, Users, map_for_write, read_sources};
use vramcap_core::human_bytes;
use vramcap_core::mailbox::Mailbox;
use vramcap_core::text;

/// `--dir` and `--all-users` of `trim` and `limit`, the commands that
/// write to pages.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct WriteOptions {
    /// Find the processes' pages in DIR instead of VRAMCAP_STATS_DIR or the
    /// default; repeatable
    #[arg(long = "dir", value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Act on every user's processes, not only yours (root only)
    #[arg(long)]
    pub all_users: bool,
}

impl WriteOptions {
    /// The directories and whose pages may be changed, for a caller of
    /// real user `uid`; `command` names it in the messages.
    pub fn resolve(&self, uid: u32, command: &str) -> Result<(StatsDirs, Users), String> {
        let users = if !self.all_users {
            Users::Only(uid)
        } else if uid == 0 {
            Users::All
        } else {
            // Each command's own way to name a process: trim takes PIDs,
            // limit, park and resume take --pid (main.rs).
            return Err(format!(
                "--all-users is for root (it changes other users' processes); without it, vramcap {command} acts on your own, e.g. vramcap {command} {}",
                match command {
                    "limit" => "--pid 4242 2GiB",
                    "park" | "resume" => "--pid 4242",
                    _ => "4242",
                }
            ));
        };
        let dirs = if self.dirs.is_empty() {
            super::stat::stats_dirs(uid)?
        } else {
            for d in &self.dirs {
                if !d.is_absolute() {
                    return Err(format!(
                        "--dir {}: expected an absolute directory path, e.g. --dir /run/vramcap",
                        text::path(d)
                    ));
                }
            }
            StatsDirs {
                dirs: self.dirs.clone(),
                private_to: None,
            }
        };
        Ok((dirs, users))
    }
}

/// The directories of `dirs` that may be used: all of them, or for the
/// default ones those that are the user's own.
pub fn usable(dirs: &StatsDirs) -> Vec<PathBuf> {
    dirs.dirs
        .iter()
        .filter(|d| {
            dirs.private_to
                .is_none_or(|uid| vramcap_core::stats_dir::open_dir(d, Some(uid)).is_ok())
        })
        .cloned()
        .collect()
}

/// The page of `pid` in the first of `dirs` that has it.
pub fn find(dirs: &[PathBuf], pid: u32, users: Users) -> Result<PageMap, String> {
    let mut first = None;
    for d in dirs {
        match map_for_write(d, pid, users) {
            Ok(m) => return Ok(m),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first
        .unwrap_or_else(|| format!("no process {pid} under vramcap (no statistics directory)")))
}

/// The processes a command is for: `pids`, or with `all` every process of
/// `uid` the directories hold. `Err` with the exit status when there are
/// none (0, said on stdout) or the directories cannot be read (1).
pub fn targets(dirs: &StatsDirs, users: Users, pids: &[u32], all: bool) -> Result<Vec<u32>, u8> {
    let targets: Vec<u32> = if all {
        let scope = Scope {
            users,
            private_to: dirs.private_to,
            bounds: Bounds::DEFAULT,
        };
        match read_sources(&dirs.dirs, &scope) {
            Ok(r) => r.scan.pages.iter().map(|p| p.pid).collect(),
            Err((dir, e)) => {
                eprintln!(
                    "vramcap: cannot read the stats directory {}: {e}",
                    text::path(&dir)
                );
                return Err(1);
            }
        }
    } else {
        pids.to_vec()
    };
    if targets.is_empty() {
        let shown: Vec<String> = dirs.dirs.iter().map(|d| text::path(d)).collect();
        println!("no processes under vramcap in {}", shown.join(", "));
        return Err(0);
    }
    Ok(targets)
}

pub fn run(dirs: &StatsDirs, users: Users, pids: &[u32], all: bool, timeout: Duration) -> u8 {
    let usable = usable(dirs);
    let targets = match targets(dirs, users, pids, all) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut failed = false;
    for pid in targets {
        let map = match find(&usable, pid, users) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("vramcap: {e}");
                failed = true;
                continue;
            }
        };
        let page = map.page();
        let cached = |p: &vramcap_core::page::Page| -> u64 {
            p.slots
                .iter()
                .map(|s| s.cached.load(Ordering::Relaxed))
                .sum()
        };
        let before = cached(page);
        // Host memory kept for parks (`VRAMCAP_PARK_MOVE=shim`) goes too,
        // from a running process: a parked one answers no trim (its kept
        // memory goes at its resume's next trim, or at exit).
        let running = page.header.park_state.load(Ordering::Acquire)
            == vramcap_core::park::ParkState::Running as u64;
        let kept = if running { map.host_kept() } else { 0 };
        if before == 0 && kept == 0 {
            println!("{pid}: nothing cached");
            continue;
        }
        let mailbox = Mailbox::trim(&page.header);
        let ticket = mailbox.ask();
        let start = Instant::now();
        loop {
            if map.shrank() {
                eprintln!(
                    "vramcap: {pid}: its page was truncated while trim waited for an answer (by its owner or root); nothing more can be asked of it"
                );
                failed = true;
                break;
            }
            if mailbox.answered(ticket) {
                let after = if map.shrank() { kept } else { map.host_kept() };
                let host = match kept.saturating_sub(after) {
                    0 => String::new(),
                    n => format!(
                        "; gave back {} of host memory kept for parks",
                        human_bytes(n)
                    ),
                };
                println!(
                    "{pid}: released {} ({} still cached){host}",
                    human_bytes(before.saturating_sub(cached(page))),
                    human_bytes(cached(page))
                );
                break;
            }
            if start.elapsed() >= timeout {
                eprintln!(
                    "vramcap: {pid} did not answer within {:.1}s (its cache thread is not running; it still caches {})",
                    timeout.as_secs_f64(),
                    human_bytes(cached(page))
                );
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    u8::from(failed)
}
