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

/// The stricter of a member's own limit and the group's applies: a group
/// can only make a member's cap stricter.
#[test]
fn the_stricter_of_a_members_limit_and_the_groups_applies() {
    // The group's 512 MiB is stricter than the member's 2 GiB.
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
        ran.stderr().contains("group \"g\" has the limit \"512MiB\", set by its first member; it applies on top of this process's VRAMCAP_LIMIT=\"2GiB\" (the stricter wins on each GPU)"),
        "{}",
        ran.stderr()
    );
    a.finish();

    // The member's own 512 MiB is stricter than the group's 2 GiB, and
    // both rooms show: 1792 MiB of the group's are held by the first, so
    // the group's room (256 MiB) binds first, then the member's own cap.
    let dir = fresh_dir("group-limit-own");
    let mut a = Held::spawn(member(
        &dir,
        "g",
        "2GiB",
        &["init", "alloc", "1792M", "wait"],
    ));
    a.until("wait");
    let mut b = Held::spawn(member(
        &dir,
        "g",
        "512MiB",
        &[
            "init", "info", "fill", "128M", "info", "nvml", "wait", "fill", "128M", "info",
        ],
    ));
    b.until("wait");
    let cap = 512 * MIB;
    assert_eq!(
        b.lines,
        [
            "init -> 0".to_string(),
            format!("info -> 0 free={} total={cap}", 256 * MIB),
            format!("fill {} -> 2 allocs {} bytes rc=2", 128 * MIB, 256 * MIB),
            format!("info -> 0 free=0 total={cap}"),
            format!(
                "nvml dev=0 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000000 total={cap} free=0 used={cap} v2total={cap} v2free=0 v2used={cap} v2reserved=0"
            ),
            // Device 1 is not used through CUDA yet: the member's own cap.
            format!(
                "nvml dev=1 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000001 total={cap} free={cap} used=0 v2total={cap} v2free={cap} v2used=0 v2reserved=0"
            ),
            "wait".to_string(),
        ]
    );
    // With the first member gone the group has room, but the member's own
    // cap still holds it at 512 MiB.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let (lines, out) = b.finish();
    assert!(out.status.success());
    assert_eq!(
        lines[7..],
        [
            "resumed".to_string(),
            format!("fill {} -> 2 allocs {} bytes rc=2", 128 * MIB, 256 * MIB),
            format!("info -> 0 free=0 total={cap}"),
        ]
    );
}

/// A group file made by a member without a limit (a group with no cap)
/// never lifts a later member's own: alone, with `--limit 1GiB`, it holds
/// at most 1 GiB.
#[test]
fn a_group_without_a_limit_never_uncaps_a_later_member() {
    let dir = fresh_dir("group-no-limit");
    let mut first = member(&dir, "open", "", &["init", "alloc", "1M"]);
    first.env_remove("VRAMCAP_LIMIT");
    run(first).expect_lines(&["init -> 0", "alloc 1048576 -> 0 #0"]);
    assert!(dir.join("group-open.grp").exists());
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .env("VRAMCAP_CACHE", "off")
        .args(["run", "--limit", "1GiB", "--group", "open", "--"])
        .arg(&artefacts().client)
        .args(["procaddr", "init", "fill", "256M", "info", "total", "0"]);
    run(cmd).expect_lines(&[
        "init -> 0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        &format!("info -> 0 free=0 total={GIB}"),
        &format!("total 0 -> 0 bytes={GIB}"),
    ]);
    let j = stat_json(&dir);
    assert_eq!(group(&j, "open")["limit"], "");
}

/// A recorded limit that does not parse is refused, never read as "no cap".
#[test]
fn an_unparsable_recorded_limit_is_refused() {
    use std::os::unix::fs::FileExt;
    let dir = fresh_dir("group-unparsable");
    run(member(&dir, "u", "1GiB", &["init", "alloc", "1M"]))
        .expect_lines(&["init -> 0", "alloc 1048576 -> 0 #0"]);
    // The limit text lies at offset 112 (pinned by the group layout test).
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("group-u.grp"))
        .unwrap()
        .write_all_at(b"8XB\0\0", 112)
        .unwrap();
    let mut later = member(&dir, "u", "", &["init", "alloc", "1M"]);
    later.env_remove("VRAMCAP_LIMIT");
    let ran = run(later);
    assert_eq!(ran.ok_lines(), ["init -> 0", "alloc 1048576 -> 2"]);
    assert!(
        ran.stderr().contains("the group's recorded limit is unusable (VRAMCAP_LIMIT=\"8XB\" is not a valid limit: unknown unit \"XB\""),
        "{}",
        ran.stderr()
    );
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
