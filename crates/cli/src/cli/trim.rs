//! `vramcap trim`: ask processes to give their cached blocks back to the
//! driver. The request is a counter in the process's page; the shim's cache
//! thread (which runs whenever the process has cached anything) answers
//! within a tick (100 ms) by releasing everything and acknowledging.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::read::{Users, map_for_write, scan};
use vramcap_core::human_bytes;

pub fn run(dir: &Path, uid: u32, pids: &[u32], all: bool, timeout: Duration) -> u8 {
    let targets: Vec<u32> = if all {
        match scan(dir, Users::Only(uid)) {
            Ok(s) => s.pages.iter().map(|p| p.pid).collect(),
            Err(e) => {
                eprintln!(
                    "vramcap: cannot read the stats directory {}: {e}",
                    dir.display()
                );
                return 1;
            }
        }
    } else {
        pids.to_vec()
    };
    if targets.is_empty() {
        println!("no processes under vramcap in {}", dir.display());
        return 0;
    }
    let mut failed = false;
    for pid in targets {
        let map = match map_for_write(dir, pid, uid) {
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
        if before == 0 {
            println!("{pid}: nothing cached");
            continue;
        }
        let ticket = page.header.trim_requests.fetch_add(1, Ordering::AcqRel) + 1;
        let start = Instant::now();
        loop {
            if page.header.trim_acks.load(Ordering::Acquire) >= ticket {
                println!(
                    "{pid}: released {} ({} still cached)",
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
