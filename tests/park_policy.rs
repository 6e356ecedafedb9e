//! The idle policy (`VRAMCAP_PARK=idle:…`,
//! `crates/shim/src/engine/park/policy.rs`): an allocation that a group's
//! budget or a full GPU would refuse parks a process idle past its
//! threshold, and a parked one's resume does the same, so that two members
//! take turns; a process that holds too little to make the room, or that
//! waits inside an allocation, is never parked; a refusal to the policy is
//! said once.

use crate::park_util::*;
use crate::util::*;

/// The idle policy: in a group whose budget is full, an allocation that
/// would be refused parks the member idle past its threshold and succeeds;
/// the parked member, calling CUDA again, waits for room in the group and
/// resumes once the other frees. Without a parkable member it is refused.
#[test]
fn an_allocation_the_group_would_refuse_parks_the_idle_member() {
    let dir = scratch_dir();
    let group = [
        NO_CACHE,
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", "pol"),
    ];
    // No member can be parked: refused, as without parking.
    let b = held_in(&dir, &group, &["init", "alloc", "1536M", "wait"]);
    let a = held_in(&dir, &group, &["init", "alloc", "1G", "wait"]);
    assert_eq!(a.lines.last().unwrap(), "wait");
    assert_eq!(a.lines[a.lines.len() - 2], format!("alloc {GIB} -> 2"));
    drop((a.finish(), b.finish()));

    let idle = [
        group.as_slice(),
        &[
            ("VRAMCAP_PARK", "idle:200ms"),
            ("VRAMCAP_PARK_MOVE", "checkpoint"),
        ],
    ]
    .concat();
    let mut b = held_in(
        &dir,
        &idle,
        &["init", "alloc", "1536M", "wait", "info", "ckstate", "wait"],
    );
    // The allocating member waits (VRAMCAP_PARK_WAIT) until the other has
    // been idle 200 ms, parks it, and gets its gigabyte.
    let waiting = [group.as_slice(), &[("VRAMCAP_PARK_WAIT", "10s")]].concat();
    let mut a = held_in(
        &dir,
        &waiting,
        &["init", "alloc", "1G", "wait", "free", "0", "wait"],
    );
    assert_eq!(a.lines[a.lines.len() - 2], format!("alloc {GIB} -> 0 #0"));
    assert_eq!(stat_device0(&dir, b.pid())["used_bytes"], 0);
    assert_eq!(group_used(&dir).0, GIB);
    // The parked member calls CUDA: no room in the group, it waits.
    b.resume();
    b.until("resumed");
    let line = stderr_until(&mut b, "waiting for");
    assert!(
        line.ends_with("waiting for 1.5 GiB on GPU 0 to resume"),
        "{line}"
    );
    a.resume();
    a.until("wait");
    b.until("ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0");
    assert_eq!(group_used(&dir).0, 1536 * MIB);
    drop((a.finish(), b.finish()));
}

/// Sharing a GPU without a group: with the GPU full (the stand-in's
/// `STANDIN_FOREIGN_FILE` stands for the other process's memory, one file
/// each), an allocation the driver refuses parks the same user's process
/// idle longest on that GPU and gets its memory once the room is there;
/// the parked one, calling CUDA again with the GPU full, parks the first,
/// idle by then, and resumes once the room is there.
#[test]
fn on_a_full_gpu_an_allocation_or_a_resume_parks_the_idle_process_on_it() {
    let dir = scratch_dir();
    let (fa, fb) = (dir.join("foreign-a"), dir.join("foreign-b"));
    std::fs::write(&fa, "0").unwrap();
    std::fs::write(&fb, "0").unwrap();
    let (sa, sb) = (fa.to_str().unwrap(), fb.to_str().unwrap());
    let env = |f| {
        [
            NO_CACHE,
            ("VRAMCAP_PARK", "idle:200ms"),
            ("VRAMCAP_PARK_MOVE", "checkpoint"),
            ("VRAMCAP_PARK_WAIT", "30s"),
            ("VRAMCAP_LOG", "info"),
            ("STANDIN_FOREIGN_FILE", f),
        ]
    };
    let mut a = held_in(
        &dir,
        &env(sa),
        &["init", "alloc", "12G", "wait", "info", "ckstate", "wait"],
    );
    // B sees A's 12 GiB as another process's: 4 GiB free of 16.
    std::fs::write(&fb, "12288").unwrap();
    let mut b = held_in(
        &dir,
        &env(sb),
        &["init", "wait", "alloc", "8G", "wait", "ckstate", "wait"],
    );
    let (pa, pb) = (a.pid(), b.pid());
    let done = [watchdog(pa), watchdog(pb)];
    b.resume();
    let line = stderr_until(&mut b, "parking idle process");
    assert!(
        line.contains(&format!(
            "GPU 0 is full; parking idle process {pa}: done in "
        )),
        "{line}"
    );
    assert_eq!(stat_device0(&dir, pa)["parked_bytes"], 12 * GIB);
    std::fs::write(&fb, "0").unwrap(); // A's memory is on the host now
    b.until("wait");
    assert_eq!(
        b.lines[b.lines.len() - 2],
        format!("alloc {} -> 0 #0", 8 * GIB)
    );

    // A calls CUDA: 8 of 16 GiB free is too little for its 12; B, idle,
    // is parked for it.
    std::fs::write(&fa, "8192").unwrap();
    a.resume();
    a.until("resumed");
    let line = stderr_until(&mut a, "parking idle process");
    assert!(
        line.contains(&format!(
            "GPU 0 is full to resume; parking idle process {pb}: done in "
        )),
        "{line}"
    );
    std::fs::write(&fa, "0").unwrap(); // B's memory is on the host now
    a.until("wait");
    let n = a.lines.len();
    assert_eq!(
        a.lines[n - 3..n - 1],
        [
            format!("info -> 0 free={} total={}", 4 * GIB, 16 * GIB),
            "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0".to_string(),
        ][..]
    );
    assert_eq!(stat_device0(&dir, pb)["parked_bytes"], 8 * GIB);
    b.resume();
    b.until("ckstate state=2 checkpoints=1 restores=0 failures=0 parked=8589934592");
    drop((a.finish(), b.finish()));
    for d in done {
        let _ = d.send(());
    }
}

/// On a full GPU only a process that holds what is missing is parked:
/// one idle with 1 GiB is left running when 4 GiB are missing, and the
/// allocation is refused once `VRAMCAP_PARK_WAIT` is over.
#[test]
fn on_a_full_gpu_a_process_holding_too_little_to_make_the_room_is_not_parked() {
    let dir = scratch_dir();
    let fb = dir.join("foreign-b");
    std::fs::write(&fb, "12288").unwrap(); // 4 of 16 GiB free for B
    let idle = [
        NO_CACHE,
        ("VRAMCAP_PARK", "idle:200ms"),
        ("VRAMCAP_PARK_MOVE", "checkpoint"),
    ];
    let mut a = held_in(&dir, &idle, &["init", "alloc", "1G", "wait", "ckstate"]);
    let b = held_in(
        &dir,
        &[
            NO_CACHE,
            ("VRAMCAP_PARK_WAIT", "1s"),
            ("STANDIN_FOREIGN_FILE", fb.to_str().unwrap()),
        ],
        &["init", "alloc", "8G", "wait"],
    );
    assert_eq!(
        b.lines[b.lines.len() - 2],
        format!("alloc {} -> 2", 8 * GIB)
    );
    assert_eq!(stat_device0(&dir, a.pid())["parked_bytes"], 0);
    a.resume();
    a.until("ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0");
    drop((a.finish(), b.finish()));
}

/// No cache, a group of 2 GiB named `group` (the group is the machine's:
/// callers make the name unique per run), the shim's Info lines.
fn logged_group(group: &str) -> [(&str, &str); 4] {
    [
        NO_CACHE,
        ("VRAMCAP_LIMIT", "2GiB"),
        ("VRAMCAP_GROUP", group),
        ("VRAMCAP_LOG", "info"),
    ]
}

/// A parked member's turn: its next calls (`info`, `ckstate`) resume it
/// (once restored) and it sees `free` bytes left of the group's 2 GiB.
fn turn(h: &mut Held, free: u64) {
    h.resume();
    h.until("wait");
    let n = h.lines.len();
    assert_eq!(
        h.lines[n - 4..],
        [
            "resumed".to_string(),
            format!("info -> 0 free={free} total={}", 2 * GIB),
            "ckstate state=0 checkpoints=1 restores=1 failures=0 parked=0".to_string(),
            "wait".to_string(),
        ][..]
    );
}

/// `line` less its closing " in 0.123s" (the time must be there).
fn timed(line: &str) -> &str {
    let (head, secs) = line.rsplit_once(" in ").expect("a timed line");
    let secs = secs.strip_suffix('s').and_then(|n| n.parse::<f64>().ok());
    assert!(secs.is_some_and(|n| n >= 0.0), "{line}");
    head
}

/// Issue 34's done-when 2 with the stand-in: two members of one group
/// whose budget (2 GiB) is smaller than both (1.5 GiB and 1 GiB), both
/// `idle:300ms`, take turns at their idle points. B's allocation waits
/// until A is idle, parks it and succeeds; A's next call waits until B is
/// idle, parks it (the resume's policy) and resumes; B's next call parks A
/// back. Nobody is refused, the ledgers are exact at each turn, and each
/// side's checkpoint counters show its own turns.
#[test]
fn two_idle_members_take_turns_a_resume_parks_the_idle_other() {
    let dir = scratch_dir();
    let group = format!("turns{}", std::process::id());
    let idle = [
        ("VRAMCAP_PARK", "idle:300ms"),
        ("VRAMCAP_PARK_MOVE", "checkpoint"),
        ("VRAMCAP_PARK_WAIT", "10s"),
    ];
    let env = [&logged_group(&group)[..], &idle].concat();
    let calls = ["info", "ckstate", "wait"];
    let mut a = held_in(
        &dir,
        &env,
        &[
            &["init", "alloc", "1536M", "wait"][..],
            &calls,
            &["ckstate"],
        ]
        .concat(),
    );
    let mut b = held_in(
        &dir,
        &env,
        &[&["init", "alloc", "1G", "wait"][..], &calls].concat(),
    );
    let (pa, pb) = (a.pid(), b.pid());
    // B's allocation parked A (idle 300 ms) and got its gigabyte.
    assert_eq!(b.lines[1], format!("alloc {GIB} -> 0 #0"));
    assert_eq!(
        timed(&stderr_until(&mut b, "parking idle member")),
        format!(
            "vramcap[{pb}]: group {group}: {} more bytes needed on device 0; parking idle member {pa}: done",
            512 * MIB
        )
    );
    // The group's bytes on GPU 0 and each member's, by PID.
    let ledger = || {
        let j = stat(&dir);
        let g = j["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == group.as_str());
        let g = g.expect("the group is listed");
        let mut members: Vec<(u32, u64)> = g["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["pid"].as_u64().unwrap() as u32,
                    m["held_bytes"][0].as_u64().unwrap(),
                )
            })
            .collect();
        members.sort_unstable();
        (g["devices"][0]["used_bytes"].as_u64().unwrap(), members)
    };
    let by_pid = |m: [(u32, u64); 2]| {
        let mut m = m.to_vec();
        m.sort_unstable();
        m
    };
    let parked = |pid: u32, bytes: u64| {
        let d = stat_device0(&dir, pid);
        (
            d["used_bytes"].as_u64().unwrap(),
            d["parked_bytes"].as_u64().unwrap(),
        ) == (0, bytes)
    };
    assert!(parked(pa, 1536 * MIB));
    assert_eq!(stat_device0(&dir, pb)["used_bytes"], GIB);
    assert_eq!(ledger(), (GIB, by_pid([(pa, 0), (pb, GIB)])));

    // A calls CUDA: its resume finds no room, waits until B is idle, parks it.
    turn(&mut a, 512 * MIB);
    assert_eq!(
        timed(&stderr_until(&mut a, "to resume; parking idle member")),
        format!(
            "vramcap[{pa}]: group {group}: {} more bytes needed on device 0 to resume; parking idle member {pb}: done",
            512 * MIB
        )
    );
    assert!(parked(pb, GIB));
    assert_eq!(stat_device0(&dir, pa)["used_bytes"], 1536 * MIB);
    assert_eq!(ledger(), (1536 * MIB, by_pid([(pa, 1536 * MIB), (pb, 0)])));

    // B calls CUDA: it parks A, idle again, the same way.
    turn(&mut b, GIB);
    assert!(parked(pa, 1536 * MIB));
    assert_eq!(ledger(), (GIB, by_pid([(pa, 0), (pb, GIB)])));
    let (lines, out) = b.finish();
    assert!(out.status.success(), "{lines:?}");
    // A, parked a second time, exits without calling CUDA again.
    let (lines, out) = a.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines.last().unwrap(),
        &format!(
            "ckstate state=2 checkpoints=2 restores=1 failures=0 parked={}",
            1536 * MIB
        )
    );
}

/// The guard of the policy: a member waiting inside an allocation for room
/// is not idle, however short its threshold (`idle:1ms`, below the tick at
/// which its activity is stamped, so the page alone would call it idle).
/// Asked to park, it checks for itself and answers "not idle"; it is never
/// parked, and its allocation goes on once room comes.
#[test]
fn a_member_waiting_inside_an_allocation_is_never_parked() {
    let dir = scratch_dir();
    let group = format!("guard{}", std::process::id());
    let base = logged_group(&group);
    let holder = held_in(&dir, &base, &["init", "alloc", "1G", "wait"]);
    let waiting = [
        ("VRAMCAP_PARK", "idle:1ms"),
        ("VRAMCAP_PARK_MOVE", "checkpoint"),
        ("VRAMCAP_PARK_WAIT", "30s"),
    ];
    let mut w = held_in(
        &dir,
        &[&base[..], &waiting].concat(),
        &["init", "alloc", "1G", "wait", "alloc", "512M", "ckstate"],
    );
    let pw = w.pid();
    w.resume();
    // W is inside its allocation, waiting for room.
    stderr_until(&mut w, "waiting up to 30s (VRAMCAP_PARK_WAIT)");
    // Q's allocation is refused by the group; it asks W, which says no.
    let asker = [&base[..], &[("VRAMCAP_PARK_WAIT", "1s")]].concat();
    let mut q = held_in(&dir, &asker, &["init", "alloc", "1M", "wait"]);
    assert_eq!(q.lines[1], format!("alloc {MIB} -> 2"));
    assert_eq!(
        timed(&stderr_until(&mut q, "parking idle member")),
        format!(
            "vramcap[{}]: group {group}: {MIB} more bytes needed on device 0; parking idle member {pw}: it is not idle (it called CUDA within its VRAMCAP_PARK=idle threshold, or a call of it is waiting)",
            q.pid()
        )
    );
    let d = stat_device0(&dir, pw);
    assert_eq!(
        (d["used_bytes"].as_u64(), d["parked_bytes"].as_u64()),
        (Some(GIB), Some(0))
    );
    drop(q.finish());
    // The holder leaves: W's allocation gets its room, W was never parked.
    drop(holder.finish());
    let (lines, out) = w.finish();
    assert!(out.status.success(), "{lines:?}");
    assert_eq!(
        lines[lines.len() - 2..],
        [
            format!("alloc {} -> 0 #1", 512 * MIB),
            "ckstate state=0 checkpoints=0 restores=0 failures=0 parked=0".to_string(),
        ][..]
    );
}

/// The policy asks again each tick: a member that cannot be parked (here:
/// it holds managed memory) says why once, and the asker says its answer
/// once, however many times it asked in its second of waiting.
#[test]
fn a_refusal_to_the_policy_is_said_once_in_a_row() {
    let dir = scratch_dir();
    let group = format!("once{}", std::process::id());
    let base = logged_group(&group);
    let x_env = [
        &base[..],
        &[
            ("VRAMCAP_PARK", "idle:1ms"),
            ("VRAMCAP_PARK_MOVE", "checkpoint"),
        ],
    ]
    .concat();
    let x = held_in(
        &dir,
        &x_env,
        &["init", "alloc", "1G", "managed", "64M", "wait"],
    );
    let q_env = [&base[..], &[("VRAMCAP_PARK_WAIT", "1s")]].concat();
    let q = held_in(&dir, &q_env, &["init", "alloc", "1G", "wait"]);
    assert_eq!(q.lines[1], format!("alloc {GIB} -> 2"));
    let (px, pq) = (x.pid(), q.pid());
    let (_, q_out) = q.finish();
    let (_, x_out) = x.finish();
    let why = "it holds managed (unified) memory, which neither the driver's checkpoint nor the shim's moves take";
    let said = |out: &std::process::Output, what: &str| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains(what))
            .map(|l| timed(l).to_string())
            .collect::<Vec<_>>()
    };
    // (Its first ask may find X active still: "not idle", said once too.)
    assert_eq!(
        said(&q_out, why),
        [format!(
            "vramcap[{pq}]: group {group}: {} more bytes needed on device 0; parking idle member {px}: {why}",
            64 * MIB
        )]
    );
    assert!(said(&q_out, "parking idle member").len() <= 2);
    let x_said: Vec<String> = String::from_utf8_lossy(&x_out.stderr)
        .lines()
        .filter(|l| l.contains("cannot park"))
        .map(str::to_string)
        .collect();
    assert_eq!(x_said, [format!("vramcap[{px}]: cannot park: {why}")]);
}
