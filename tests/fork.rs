//! `fork` under the shim: the child's handler never blocks, whatever the
//! parent's threads hold at the fork, and the child drops the parent's
//! liveness lock, so the parent's page dies with the parent.

use std::path::Path;

use serde_json::Value;

use crate::util::*;

/// Four threads allocate and free through the shim without end while the
/// main thread forks 50 times; every child gets through the shim's fork
/// handler and its dlsym answer and exits 0 within the deadline.
#[test]
fn forks_while_threads_are_busy_inside_the_shim_never_hang() {
    capped(
        "procaddr",
        "64MiB",
        &["init", "forkbusy", "4", "50", "info"],
    )
    .expect_lines(&[
        "init -> 0",
        "forkbusy -> forks=50 ok=50 hung=0",
        &format!("info -> 0 free={0} total={0}", 64 * MIB),
    ]);
}

fn pids_in(dir: &Path) -> Vec<u64> {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).args(["stat", "--json"]);
    let ran = run(cmd);
    let j: Value = serde_json::from_str(&ran.ok_lines().join("")).expect("stat --json");
    j["processes"]
        .as_array()
        .expect("a process list")
        .iter()
        .map(|p| p["pid"].as_u64().expect("a pid"))
        .collect()
}

/// The child of a fork keeps the parent's descriptors, the page's among
/// them; the shim closes its copy in the child, so a reader sees the page
/// of a killed parent as dead even while the child lives.
#[test]
fn a_forked_child_does_not_keep_its_killed_parent_alive() {
    let dir = scratch_dir();
    let mut h = held_in(
        &dir,
        &[("VRAMCAP_LIMIT", "1GiB")],
        &["init", "alloc", "64M", "forkhold", "wait"],
    );
    let parent = h.pid();
    let child: i32 = h
        .lines
        .iter()
        .find_map(|l| l.strip_prefix("forkhold -> child "))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {:?}", h.lines));
    assert_eq!(pids_in(&dir), vec![u64::from(parent)]);
    h.child.kill().expect("SIGKILL the parent");
    h.child.wait().expect("reap the parent");
    let seen = pids_in(&dir);
    // SAFETY: signalling a child process this test started.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert_eq!(seen, Vec::<u64>::new(), "the dead parent's page is shown");
    assert!(!dir.join(format!("{parent}.page")).exists());
}
