//! Property tests of the page and group readers: files built from a real
//! page's bytes (or random bytes), mutated at random offsets, cut at
//! random lengths, locked or not, and rewritten or truncated by another
//! thread while they are read. Whatever the bytes: no panic, no fault,
//! every read ends quickly, and a file is shown as a live page (or group)
//! exactly when its header is valid, its name is its PID's and its lock is
//! held, with the values its bytes hold and only printable text.
//!
//! Case counts are fixed (`CASES`, below) so a run is repeatable and takes
//! a few seconds on two cores.

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use vramcap_core::group::{GROUP_HEADER_SIZE, GROUP_PAGE_SIZE, GroupPage, member_lock_offset};
use vramcap_core::page::{self, FLAG_ACTIVE, HEADER_SIZE, PAGE_SIZE, SLOT_SIZE, SLOTS};

use super::Users;
use super::dir::Dir;
use super::groups::read_group;
use super::pages::{Outcome, read_one};
use super::testpages::{page_bytes, scratch};

/// Cases per property (the changing-bytes ones read each file many times).
const PAGE_CASES: u32 = 3000;
const GROUP_CASES: u32 = 300;
const CHANGING_CASES: u32 = 64;
/// No single read may take longer than this, whatever the file holds.
const READ_BOUND: Duration = Duration::from_millis(500);

fn me() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Text that could drive a terminal: what no shown string may hold.
fn printable(s: &str) -> bool {
    !s.chars().any(|c| c.is_control() || c == '\u{202e}')
}

fn word32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn word64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A page's bytes: a real one for a random pid and GPU count, or random
/// bytes; then random bytes overwritten and a random length.
fn page_file() -> impl Strategy<Value = (u32, Vec<u8>)> {
    let base = prop_oneof![
        4 => (1u32..4_000_000, 0usize..=SLOTS, proptest::collection::vec(any::<u8>(), 0..600))
            .prop_map(|(pid, devices, cmd)| {
                let mut b = page_bytes(pid, devices, "");
                // Any bytes in the command field, NUL-terminated or not.
                let n = cmd.len().min(page::COMMAND_LEN);
                b[200..200 + n].copy_from_slice(&cmd[..n]);
                (pid, b)
            }),
        1 => proptest::collection::vec(any::<u8>(), 0..PAGE_SIZE + 64).prop_map(|b| (7, b)),
    ];
    let edits = proptest::collection::vec((0usize..PAGE_SIZE + 64, any::<u8>()), 0..24);
    let cut = prop_oneof![
        3 => Just(None),
        1 => (0usize..PAGE_SIZE + 4096).prop_map(Some),
    ];
    (base, edits, cut).prop_map(|((pid, mut b), edits, cut)| {
        for (at, v) in edits {
            if at < b.len() {
                b[at] = v;
            }
        }
        if let Some(len) = cut {
            b.resize(len, 0);
        }
        (pid, b)
    })
}

fn write(path: &Path, bytes: &[u8]) -> std::fs::File {
    std::fs::write(path, bytes).unwrap();
    std::fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// What a reader must say of a page file of these bytes, named for
/// `name_pid`, locked or not: `Some(live)` when it is a page of this user
/// (`live`: its lock is held), `None` when it must not be shown.
fn expected_page(bytes: &[u8], name_pid: u32, locked: bool) -> Option<bool> {
    let head = &bytes[..bytes.len().min(HEADER_SIZE)];
    page::check_header(bytes.len() as u64, head, Some(me())).ok()?;
    (bytes.len() >= PAGE_SIZE && word32(bytes, 28) == name_pid).then_some(locked)
}

/// Checks what a reader showed of a page against the page's bytes.
fn check_shown(
    snap: &vramcap_core::counters::PageSnapshot,
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    prop_assert_eq!(snap.pid, word32(bytes, 28));
    prop_assert_eq!(snap.uid, me());
    let active: Vec<u32> = (0..SLOTS)
        .filter(|&i| word64(bytes, HEADER_SIZE + i * SLOT_SIZE + 24) & FLAG_ACTIVE != 0)
        .map(|i| i as u32)
        .collect();
    let shown: Vec<u32> = snap.devices.iter().map(|d| d.device).collect();
    prop_assert_eq!(shown, active);
    for d in &snap.devices {
        let at = HEADER_SIZE + d.device as usize * SLOT_SIZE;
        prop_assert_eq!(d.used, word64(bytes, at + 8));
        prop_assert!(d.peak >= d.used);
    }
    for s in [
        &snap.command,
        &snap.group,
        &snap.pod,
        &snap.namespace,
        &snap.container,
    ] {
        prop_assert!(printable(s), "{:?}", s);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: PAGE_CASES, ..ProptestConfig::default() })]

    /// A page file of any bytes, read once.
    #[test]
    fn a_page_of_any_bytes_is_shown_exactly_when_it_is_one(
        (pid, bytes) in page_file(),
        locked in any::<bool>(),
        misnamed in prop::bool::weighted(0.1),
    ) {
        let dir = scratch(&format!("fuzz-page-{:?}", std::thread::current().id()));
        let name_pid = if misnamed { pid.wrapping_add(1) } else { pid };
        let name = format!("{name_pid}.page");
        let file = write(&dir.join(&name), &bytes);
        if locked {
            prop_assert!(vramcap_core::liveness::ofd_lock(file.as_raw_fd(), 0, 1, true));
        }
        let d = Dir::open(&dir).unwrap();
        let start = Instant::now();
        let got = read_one(&d, name.as_ref(), Users::Only(me()));
        prop_assert!(start.elapsed() < READ_BOUND);
        let want = expected_page(&bytes, name_pid, locked);
        match got {
            Outcome::Live(snap) => {
                prop_assert_eq!(want, Some(true));
                check_shown(&snap, &bytes)?;
            }
            Outcome::Dead(_) => prop_assert_eq!(want, Some(false)),
            Outcome::Skip(why) => {
                prop_assert_eq!(want, None, "skipped a page: {}", why);
                prop_assert!(printable(&why));
            }
            Outcome::Ignore => {
                // Only a page still being created (the state word not yet
                // ready, everything else valid).
                let head = &bytes[..bytes.len().min(HEADER_SIZE)];
                prop_assert_eq!(
                    page::check_header(bytes.len() as u64, head, Some(me())),
                    Err(page::PageProblem::Initialising)
                );
            }
        }
        drop(file);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A group file's bytes: a valid header (or random bytes), random bytes
/// overwritten anywhere (devices and members included) and a random length.
fn group_file() -> impl Strategy<Value = Vec<u8>> {
    let edits = proptest::collection::vec((0usize..GROUP_PAGE_SIZE, any::<u8>()), 0..64);
    let fills =
        proptest::collection::vec((0usize..GROUP_PAGE_SIZE, 1usize..4096, any::<u8>()), 0..4);
    let cut = prop_oneof![
        3 => Just(None),
        1 => (0usize..GROUP_PAGE_SIZE + 4096).prop_map(Some),
    ];
    (any::<bool>(), edits, fills, cut).prop_map(|(random, edits, fills, cut)| {
        let mut b = if random {
            vec![0x5a; GROUP_PAGE_SIZE]
        } else {
            group_bytes()
        };
        for (at, n, v) in fills {
            let end = (at + n).min(b.len());
            b[at..end].fill(v);
        }
        for (at, v) in edits {
            b[at] = v;
        }
        if let Some(len) = cut {
            b.resize(len, 0);
        }
        b
    })
}

/// A ready group file of this user with no device and no member.
fn group_bytes() -> Vec<u8> {
    // SAFETY: all-zero bytes are a valid GroupPage (integers and atomics).
    let mut g: Box<GroupPage> = unsafe { Box::new_zeroed().assume_init() };
    g.header.fill(me(), 1, "g", "1GiB");
    g.header
        .state
        .store(page::STATE_READY, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: a GroupPage is GROUP_PAGE_SIZE bytes of plain data.
    unsafe { std::slice::from_raw_parts((&*g as *const GroupPage).cast::<u8>(), GROUP_PAGE_SIZE) }
        .to_vec()
}

/// Whether a member slot that counts (below the high-water mark, owned by
/// a pid that is neither free nor joining) holds more bytes than a u64
/// counts: no real group can, and the reader refuses such a file as forged.
fn forged_ledger(bytes: &[u8]) -> bool {
    use std::mem::{offset_of, size_of};
    use vramcap_core::group::{
        GROUP_DEVICES, GroupHeader, LEDGER_SIZE, MEMBER_SIZE, MEMBERS, Member, counts,
    };
    let hwm = (word32(bytes, offset_of!(GroupHeader, members_hwm)) as usize).min(MEMBERS);
    let members = offset_of!(GroupPage, members);
    let ledgers = offset_of!(GroupPage, ledgers);
    debug_assert_eq!(size_of::<Member>(), MEMBER_SIZE);
    (0..hwm).any(|i| {
        counts(word64(bytes, members + i * MEMBER_SIZE))
            && (0..GROUP_DEVICES)
                .try_fold(0u64, |sum, d| {
                    sum.checked_add(word64(bytes, ledgers + (d * MEMBERS + i) * LEDGER_SIZE))
                })
                .is_none()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: GROUP_CASES, ..ProptestConfig::default() })]

    /// A group file of any bytes, of this user (mapped, guarded, and
    /// written to when members are reclaimed), with some member locks
    /// held: shown exactly when its header is valid, with no more members
    /// than hold their locks, and only printable text.
    #[test]
    fn a_group_file_of_any_bytes_is_shown_exactly_when_it_is_one(
        bytes in group_file(),
        locks in proptest::collection::vec(0usize..vramcap_core::group::MEMBERS, 0..8),
    ) {
        let dir = scratch(&format!("fuzz-group-{:?}", std::thread::current().id()));
        let file = write(&dir.join("group-g.grp"), &bytes);
        for &i in &locks {
            prop_assert!(vramcap_core::liveness::ofd_lock(file.as_raw_fd(), member_lock_offset(i), 1, true));
        }
        let d = Dir::open(&dir).unwrap();
        let start = Instant::now();
        let got = read_group(&d, "group-g.grp".as_ref(), Users::Only(me()));
        prop_assert!(start.elapsed() < READ_BOUND);
        let head = &bytes[..bytes.len().min(GROUP_HEADER_SIZE)];
        let mut want = vramcap_core::group::check_group_header(bytes.len() as u64, head, Some(me()))
            .map_err(|p| p.to_string());
        if want.is_ok() && forged_ledger(&bytes) {
            want = Err("forged".into());
        }
        match got {
            Ok(Some(g)) => {
                prop_assert_eq!(want, Ok(()));
                let mut held = locks.clone();
                held.sort();
                held.dedup();
                prop_assert!(g.members.len() <= held.len());
                prop_assert!(printable(&g.name) && printable(&g.limit_text));
                prop_assert!(g.devices.len() <= vramcap_core::group::GROUP_DEVICES);
                for m in &g.members {
                    prop_assert_eq!(m.held.len(), g.devices.len());
                }
            }
            Ok(None) => prop_assert_eq!(want, Err(vramcap_core::group::GroupProblem::Initialising.to_string())),
            Err(why) => {
                prop_assert!(want.is_err(), "skipped a valid group file: {}", why);
                prop_assert!(printable(&why));
            }
        }
        drop(file);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// One thread's random writes, truncations and regrowths of a file, from
/// `ops` (offset, byte; a zero byte at an even offset truncates there).
fn churn(file: std::fs::File, full: Vec<u8>, ops: Vec<(usize, u8)>, rounds: usize) {
    for _ in 0..rounds {
        for &(at, v) in &ops {
            if v == 0 && at % 2 == 0 {
                let _ = file.set_len(at as u64);
            } else if at < full.len() {
                let _ = file.set_len(full.len() as u64);
                let _ = file.write_all_at(&[v], at as u64);
            }
        }
        let _ = file.write_all_at(&full, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CHANGING_CASES, ..ProptestConfig::default() })]

    /// A live page and a group file rewritten, cut and regrown by another
    /// thread while each is read 20 times: no panic, no fault, every read
    /// ends quickly, and whatever is shown is well formed.
    #[test]
    fn files_changing_while_read_never_break_a_reader(
        devices in 0usize..=SLOTS,
        page_ops in proptest::collection::vec((0usize..PAGE_SIZE + 64, any::<u8>()), 1..48),
        group_ops in proptest::collection::vec((0usize..GROUP_PAGE_SIZE, any::<u8>()), 1..48),
    ) {
        let dir = scratch(&format!("fuzz-changing-{:?}", std::thread::current().id()));
        let pid = 4242;
        let full = page_bytes(pid, devices, "python x.py");
        let file = write(&dir.join("4242.page"), &full);
        prop_assert!(vramcap_core::liveness::ofd_lock(file.as_raw_fd(), 0, 1, true));
        let gfull = group_bytes();
        let gfile = write(&dir.join("group-g.grp"), &gfull);
        let writers = [
            {
                let f = file.try_clone().unwrap();
                let full = full.clone();
                std::thread::spawn(move || churn(f, full, page_ops, 40))
            },
            {
                let f = gfile.try_clone().unwrap();
                std::thread::spawn(move || churn(f, gfull, group_ops, 4))
            },
        ];
        let d = Dir::open(&dir).unwrap();
        for _ in 0..20 {
            let start = Instant::now();
            match read_one(&d, "4242.page".as_ref(), Users::Only(me())) {
                Outcome::Live(snap) => {
                    prop_assert_eq!(snap.pid, pid);
                    prop_assert_eq!(snap.uid, me());
                    prop_assert!(snap.devices.len() <= SLOTS);
                    prop_assert!(printable(&snap.command));
                }
                Outcome::Dead(_) => prop_assert!(false, "the lock is held throughout"),
                Outcome::Skip(why) => prop_assert!(printable(&why)),
                Outcome::Ignore => {}
            }
            if let Ok(Some(g)) = read_group(&d, "group-g.grp".as_ref(), Users::Only(me())) {
                prop_assert!(printable(&g.name) && g.members.is_empty());
            }
            prop_assert!(start.elapsed() < READ_BOUND);
        }
        for w in writers {
            w.join().unwrap();
        }
        drop((file, gfile));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
