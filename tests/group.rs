//! One budget for a group of processes, against the stand-in driver: members
//! share it exactly, other groups are independent, a killed member's bytes
//! come back, and many processes joining, allocating and dying at random
//! never pass the budget and end at zero.

use std::path::Path;
use std::process::Command;

use crate::util::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn member(dir: &Path, group: &str, limit: &str, args: &[&str]) -> Command {
    let mut cmd = shimmed(&artefacts().client);
    cmd.env("VRAMCAP_STATS_DIR", dir)
        .env("VRAMCAP_GROUP", group)
        .env("VRAMCAP_LIMIT", limit)
        .env("VRAMCAP_CACHE", "off")
        .arg("procaddr")
        .args(args);
    cmd
}

fn stat_json(dir: &Path) -> Value {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).args(["stat", "--json"]);
    serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap()
}

fn group<'a>(j: &'a Value, name: &str) -> &'a Value {
    j["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no group {name}: {j}"))
}

#[test]
fn members_share_one_budget_and_get_a_killed_members_share_back() {
    let dir = fresh_dir("group-share");
    let mut a = Held::spawn(member(
        &dir,
        "train",
        "1GiB",
        &["init", "alloc", "768M", "wait"],
    ));
    a.until("wait");
    // The second member gets exactly what is left; another group is independent.
    let mut b = Held::spawn(member(
        &dir,
        "train",
        "1GiB",
        &[
            "init", "fill", "256M", "wait", "freeall", "fill", "256M", "info",
        ],
    ));
    b.until("wait");
    assert_eq!(
        b.lines[1],
        "fill 268435456 -> 1 allocs 268435456 bytes rc=2"
    );
    run(member(&dir, "other", "1GiB", &["init", "fill", "256M"])).expect_lines(&[
        "init -> 0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
    ]);

    let j = stat_json(&dir);
    let g = group(&j, "train");
    assert_eq!(g["limit"], "1GiB");
    assert_eq!(g["devices"][0]["limit_bytes"], 1u64 << 30);
    assert_eq!(g["devices"][0]["used_bytes"], 1u64 << 30);
    let mut pids: Vec<u64> = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_u64().unwrap())
        .collect();
    pids.sort();
    let mut want = vec![u64::from(a.pid()), u64::from(b.pid())];
    want.sort();
    assert_eq!(pids, want);

    // SIGKILL the holder: the other member then gets the full budget.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let (lines, out) = b.finish();
    assert!(out.status.success());
    assert_eq!(lines[3], "resumed");
    assert_eq!(lines[4], "freeall -> 1 freed rc=0");
    assert_eq!(
        lines[5], "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        "{lines:?}"
    );
    assert_eq!(lines[6], "info -> 0 free=0 total=1073741824");
    let j = stat_json(&dir);
    let g = group(&j, "train");
    assert_eq!(
        g["devices"][0]["used_bytes"], 0,
        "members gone, budget whole: {g}"
    );
    assert_eq!(g["members"], serde_json::json!([]));
}

#[test]
fn a_later_member_with_another_limit_follows_the_group() {
    let dir = fresh_dir("group-limit");
    let mut a = Held::spawn(member(&dir, "g", "512MiB", &["init", "info", "wait"]));
    a.until("wait");
    let ran = run(member(&dir, "g", "2GiB", &["init", "info"]));
    assert_eq!(
        ran.ok_lines(),
        [
            "init -> 0",
            &format!("info -> 0 free={0} total={0}", 512 * MIB)
        ]
    );
    assert!(
        ran.stderr().contains("group \"g\" has the limit \"512MiB\", set by its first member; this process's VRAMCAP_LIMIT=\"2GiB\" does not apply"),
        "{}",
        ran.stderr()
    );
    a.finish();
}

#[test]
fn bad_group_names_and_corrupt_group_pages_are_refused() {
    let ran = run(member(&fresh_dir("group-bad"), "a/b", "1GiB", &["init"]));
    ran.expect_code(2);
    assert!(
        ran.stderr()
            .contains("VRAMCAP_GROUP=\"a/b\" is not valid: expected 1 to 63 letters"),
        "{}",
        ran.stderr()
    );

    let dir = fresh_dir("group-corrupt");
    std::fs::write(dir.join("group-x.grp"), b"not a group page").unwrap();
    let ran = run(member(&dir, "x", "1GiB", &["init", "alloc", "1M"]));
    assert_eq!(
        ran.ok_lines(),
        ["init -> 0", "alloc 1048576 -> 2"],
        "no group budget, no allocation"
    );
    assert!(ran.stderr().contains("is unusable: not a vramcap page (wrong magic) (remove it when no member runs); refusing allocations rather than running without the group's limit"), "{}", ran.stderr());
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir).args(["stat", "--json"]);
    let ran = run(cmd);
    assert!(
        ran.stderr()
            .contains("group-x.grp: not a vramcap page (wrong magic)"),
        "{}",
        ran.stderr()
    );
}

/// Many members, several threads each, allocating and freeing at random;
/// three of them killed mid-way. The group's peak never passes the budget,
/// every member slot comes back, and what is left of the budget is at most
/// what the killed members had in flight: a member killed between the two
/// steps of an allocation or a free leaves that allocation's bytes in the
/// budget (src/group.rs: the budget errs low, never high), at most one per
/// thread, each at most 32 MiB.
#[test]
fn random_members_and_kills_never_pass_the_budget() {
    const KILL_EVERY: usize = 8;
    let dir = fresh_dir("group-stress");
    let budget = 512 * MIB;
    let mut members: Vec<Held> = (0..24)
        .map(|i| {
            let mut h = Held::spawn(member(
                &dir,
                "stress",
                "512MiB",
                &[
                    "init",
                    "wait",
                    "threads",
                    "4",
                    if i % KILL_EVERY == 0 { "200000" } else { "300" },
                    "32M",
                    "standin",
                ],
            ));
            h.until("wait");
            h
        })
        .collect();
    for m in &mut members {
        m.resume();
    }
    // Kill every eighth member while it is busy (it runs far longer than
    // the others), the rest finish on their own.
    for (i, m) in members.iter_mut().enumerate() {
        if i % KILL_EVERY == 0 {
            m.child.kill().unwrap();
        }
    }
    for m in members {
        let (lines, out) = m.finish();
        if out.status.success() {
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with("threads -> ") && l.ends_with(" other=0")),
                "{lines:?}"
            );
        }
    }
    let j = stat_json(&dir);
    let g = group(&j, "stress");
    let peak = g["devices"][0]["peak_bytes"].as_u64().unwrap();
    assert!(peak <= budget && peak > 0, "{g}");
    let left = g["devices"][0]["used_bytes"].as_u64().unwrap();
    let killed = 24_u64.div_ceil(KILL_EVERY as u64);
    let in_flight = killed * 4 * 32 * MIB;
    assert!(in_flight < budget, "the bound says something");
    assert!(left <= in_flight && left.is_multiple_of(MIB), "{g}");
    assert_eq!(g["members"], serde_json::json!([]));
}

/// 64 processes joining at once all become members.
#[test]
fn sixty_four_processes_join_at_once() {
    let dir = fresh_dir("group-join");
    let mut members: Vec<Held> = (0..64)
        .map(|_| {
            Held::spawn(member(
                &dir,
                "many",
                "64GiB",
                &["init", "alloc", "1M", "wait"],
            ))
        })
        .collect();
    for m in &mut members {
        m.until("wait");
    }
    let j = stat_json(&dir);
    let g = group(&j, "many");
    assert_eq!(g["members"].as_array().unwrap().len(), 64);
    assert_eq!(g["devices"][0]["used_bytes"], 64 * MIB);
    for m in members {
        assert!(m.finish().1.status.success());
    }
    let j = stat_json(&dir);
    assert_eq!(group(&j, "many")["devices"][0]["used_bytes"], 0);
}
