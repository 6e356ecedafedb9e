use super::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

fn page() -> Box<GroupPage> {
    // SAFETY: all-zero bytes are a valid GroupPage (integers and atomics).
    unsafe { Box::new_zeroed().assume_init() }
}

fn always(_: usize) -> bool {
    true
}

fn never(_: usize) {}

#[test]
fn layout_is_pinned() {
    assert_eq!(offset_of!(GroupHeader, version), 8);
    assert_eq!(offset_of!(GroupHeader, uid), 28);
    assert_eq!(offset_of!(GroupHeader, state), 32);
    assert_eq!(offset_of!(GroupHeader, members_hwm), 36);
    assert_eq!(offset_of!(GroupHeader, created_unix_ns), 40);
    assert_eq!(offset_of!(GroupHeader, name), 48);
    assert_eq!(offset_of!(GroupHeader, limit_text), 112);
    assert_eq!(offset_of!(GroupDevice, key), 0);
    assert_eq!(offset_of!(GroupDevice, limit), 24);
    assert_eq!(offset_of!(GroupDevice, peak), 32);
    assert_eq!(offset_of!(Member, owner), 0);
    assert_eq!(offset_of!(Member, start_time), 8);
    assert_eq!(offset_of!(Ledger, held), 0);
    assert_eq!(offset_of!(Ledger, pending), 8);
    assert_eq!(offset_of!(GroupPage, devices), 4096);
    assert_eq!(offset_of!(GroupPage, members), 4096 + 64 * 64);
    assert_eq!(offset_of!(GroupPage, ledgers), 4096 + 64 * 64 + 1024 * 16);
    assert_eq!(GROUP_PAGE_SIZE, 4096 + 64 * 64 + 1024 * 16 + 64 * 1024 * 16);
    assert_eq!(member_lock_offset(3), (4096 + 64 * 64 + 3 * 16) as u64);
}

#[test]
fn names() {
    for ok in ["train", "job-1", "a.b_c", "X"] {
        assert!(valid_name(ok), "{ok}");
    }
    for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(64), "ü"] {
        assert!(!valid_name(bad), "{bad}");
    }
}

#[test]
fn temporary_names() {
    for ok in [
        ".123.1733000000000000000.tmp",
        ".group-train.77.5.tmp",
        ".group-a.b.c.1.2.tmp",
    ] {
        assert!(is_temp_name(ok.as_bytes()), "{ok}");
    }
    for bad in [
        "123.page",
        "group-train.grp",
        ".123.tmp",
        ".x.1.2.tmp",
        ".1.2.tmpx",
        "..1.2.tmp",
        ".group-.1.x.tmp",
        ".1.2",
    ] {
        assert!(!is_temp_name(bad.as_bytes()), "{bad}");
    }
}

#[test]
fn keys_and_limits_round_trip() {
    for uuid in [[0u8; 16], [0xff; 16], *b"0123456789abcdef", {
        let mut u = [0u8; 16];
        u[0] = 0x80;
        u[15] = 1;
        u
    }] {
        let key = uuid_key(uuid);
        assert!(key.iter().all(|&w| w & LIMIT_SET != 0), "no word is 0");
        assert_eq!(key_uuid(key), uuid);
    }
    let g = page();
    let d = g.device_for([9; 16], || 12345).unwrap();
    assert_eq!(g.devices[d].limit(), Some(12345));
    assert_eq!(g.devices[d].uuid_bytes(), Some([9; 16]));
    let e = g.device_for([8; 16], || u64::MAX).unwrap();
    assert_eq!(g.devices[e].limit(), Some(u64::MAX), "no cap");
    assert_ne!(d, e);
}

#[test]
fn members_share_and_the_dead_are_reclaimed_once() {
    let g = page();
    let d = g.device_for([1; 16], || 1000).unwrap();
    assert_eq!(
        g.device_for([1; 16], || panic!("the limit is set already")),
        Some(d),
        "found, limit untouched"
    );
    assert_eq!(g.devices[d].limit(), Some(1000));
    let a = g.join(10, 1, always, never).unwrap();
    let b = g.join(20, 2, always, never).unwrap();
    assert_ne!(a.slot, b.slot);
    g.reserve(d, a, 768).unwrap();
    assert_eq!(g.reserve(d, b, 300), Err(Refusal::Full { used: 768 }));
    g.reserve(d, b, 232).unwrap();
    assert_eq!(g.used(d), 1000);
    // Member 10 dies: its 768 bytes stop counting exactly once.
    let alive = |_, pid: u32, _| pid != 10;
    assert_eq!(g.reclaim_if_dead(a.slot, alive), Some(768));
    assert_eq!(g.reclaim_if_dead(a.slot, alive), None);
    assert_eq!(g.reclaim_if_dead(b.slot, alive), None);
    assert_eq!(g.used(d), 232);
    assert_eq!(g.devices[d].peak.load(Relaxed), 1000);
    assert_eq!(g.live_members().count(), 1);
    assert!(!g.release(d, a, 1), "a reclaimed seat changes nothing");
    assert_eq!(g.reserve(d, a, 1), Err(Refusal::Unseated));
    let c = g.join(30, 3, always, never).unwrap();
    assert_eq!(c.slot, a.slot, "the slot is free again");
    assert_ne!(c.owner, a.owner, "in a new generation");
    assert_eq!(g.held(d, c.slot), 0);
    assert_eq!(
        g.join(40, 4, |_| false, never),
        None,
        "no slot without its lock"
    );
    // Leaving gives everything back at once.
    g.reserve(d, c, 700).unwrap();
    assert!(g.leave(c));
    assert!(!g.leave(c));
    assert_eq!(g.used(d), 232);
    assert!(g.release(d, b, 232));
    assert_eq!(g.used(d), 0);
}

#[test]
fn a_dead_members_announcement_is_in_the_way_only_until_it_is_reclaimed() {
    let g = page();
    let d = g.device_for([1; 16], || 100).unwrap();
    let a = g.join(10, 1, always, never).unwrap();
    let b = g.join(20, 2, always, never).unwrap();
    // `a` announced 60 and died before deciding.
    g.ledgers[d][a.slot].pending.fetch_add(60, SeqCst);
    assert_eq!(g.reserve(d, b, 50), Err(Refusal::Contended { used: 0 }));
    assert_eq!(g.reserve(d, b, 101), Err(Refusal::Full { used: 0 }));
    assert_eq!(g.reclaim_if_dead(a.slot, |i, _, _| i != a.slot), Some(0));
    g.reserve(d, b, 100).unwrap();
    // A joiner in a's old slot starts from zero.
    let c = g.join(30, 3, always, never).unwrap();
    assert_eq!(c.slot, a.slot);
    assert_eq!(g.ledgers[d][c.slot].pending.load(SeqCst), 0);
    assert_eq!(g.used(d), 100);
}

#[test]
fn a_half_written_entry_is_completed_by_its_gpu_and_skipped_by_others() {
    let g = page();
    let (a, b) = ([1u8; 16], [2u8; 16]);
    // A member with GPU `a` died after writing one key word.
    g.devices[0].key[0].store(uuid_key(a)[0], SeqCst);
    assert!(!g.devices[0].ready());
    assert_eq!(g.device_for(b, || 5), Some(1), "another GPU skips it");
    assert_eq!(g.device_for(a, || 7), Some(0), "its GPU completes it");
    assert_eq!(g.devices[0].uuid_bytes(), Some(a));
    assert_eq!(g.devices[0].limit(), Some(7));
    // Every entry holding another GPU: none for a new one, at once.
    for (i, d) in g.devices.iter().enumerate().skip(2) {
        d.key[0].store(uuid_key([i as u8 + 10; 16])[0], SeqCst);
    }
    assert_eq!(g.device_for([3; 16], || 1), None);
}

#[test]
fn headers_of_other_layouts_are_refused_by_version() {
    let mut head = vec![0u8; GROUP_HEADER_SIZE];
    head[..8].copy_from_slice(&GROUP_MAGIC);
    head[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // Version 1 was shorter: still, the version is what is reported.
    let p = check_group_header(548_672, &head, None).unwrap_err();
    assert_eq!(p, GroupProblem::OtherLayout { version: 1 });
    assert_eq!(
        p.to_string(),
        "group layout version 1, made by an older vramcap; this one uses version 2 and cannot share it: remove the file once no process of the older vramcap is in the group"
    );
    head[8..12].copy_from_slice(&3u32.to_ne_bytes());
    assert!(
        check_group_header(GROUP_PAGE_SIZE as u64, &head, None)
            .unwrap_err()
            .to_string()
            .contains("made by a newer vramcap")
    );
    let g = page();
    // SAFETY: a GroupHeader is plain bytes and atomics; reading its bytes.
    let bytes = |g: &GroupPage| unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(&g.header).cast::<u8>(),
            GROUP_HEADER_SIZE,
        )
        .to_vec()
    };
    let mut g = g;
    g.header.fill(5, 1, "x", "1GiB");
    assert_eq!(
        check_group_header(GROUP_PAGE_SIZE as u64, &bytes(&g), Some(5)),
        Err(GroupProblem::Initialising)
    );
    g.header.state.store(crate::page::STATE_READY, SeqCst);
    assert_eq!(
        check_group_header(GROUP_PAGE_SIZE as u64, &bytes(&g), Some(5)),
        Ok(())
    );
    assert_eq!(
        check_group_header(GROUP_PAGE_SIZE as u64 - 1, &bytes(&g), Some(5)),
        Err(GroupProblem::Truncated {
            len: GROUP_PAGE_SIZE as u64 - 1
        })
    );
    assert_eq!(
        check_group_header(GROUP_PAGE_SIZE as u64, &bytes(&g), Some(6)),
        Err(GroupProblem::OtherUser { uid: 5 })
    );
}

/// Real threads, really concurrent: what they hold (counted after a
/// reservation returns, uncounted before a release starts) never passes
/// the limit, and everything comes back.
#[test]
fn threads_never_pass_the_group_limit() {
    let g: &'static GroupPage = Box::leak(page());
    let d = g.device_for([7; 16], || 10_000).unwrap();
    let holding: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let handles: Vec<_> = (0..8u32)
        .map(|t| {
            std::thread::spawn(move || {
                let me = g.join(100 + t, 0, always, never).unwrap();
                let mut x = u64::from(t) * 2654435761 + 1;
                let mut ok = 0;
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let n = x % 3000 + 1;
                    // As the shim does: a reservation in the way of others'
                    // announcements is tried again (on two cores, threads
                    // preempted between announcing and retracting can stand
                    // in one thread's way for all its tries otherwise).
                    let mut tries = 0;
                    let got = loop {
                        match g.reserve(d, me, n) {
                            Err(Refusal::Contended { .. }) if tries < 1000 => {
                                tries += 1;
                                std::thread::yield_now();
                            }
                            r => break r.is_ok(),
                        }
                    };
                    if got {
                        ok += 1;
                        let now = holding.fetch_add(n, SeqCst) + n;
                        assert!(now <= 10_000, "{now} held together");
                        holding.fetch_sub(n, SeqCst);
                        assert!(g.release(d, me, n));
                    }
                }
                assert!(ok > 0);
                assert!(g.leave(me));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(g.used(d), 0);
    assert!(g.devices[d].peak.load(Relaxed) <= 10_000);
    assert_eq!(g.live_members().count(), 0);
}

mod stepped;
