//! Whose limit applies: keys that must name a GPU, and a group that can
//! only make a member's cap stricter.

use super::*;

/// `cuMemGetInfo_v2` through the engine: (free, total), the fake's device
/// reporting `real_free` of its 16 GiB.
fn mem_info(e: &'static Engine<Fake>, real_free: u64) -> (u64, u64) {
    e.mem_info(real_free, 16 * GIB)
        .unwrap_or((real_free, 16 * GIB))
}

fn exits(e: &'static Engine<Fake>) -> Vec<c_int> {
    e.driver.exits.lock().unwrap().clone()
}

#[test]
fn a_key_that_names_no_gpu_stops_the_process_at_the_first_cap() {
    let two = || Machine {
        visible: 2,
        nvml: None,
    };
    // An index beyond the two devices: stopped (status 2) at the first
    // call that needs a cap, and every call after that is refused too.
    let e = engine_on(two(), &[("VRAMCAP_LIMIT", "5=1GiB"), NO_CACHE]);
    assert!(
        exits(e).is_empty(),
        "nothing is checked before CUDA is used"
    );
    assert_eq!(alloc(e, MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(exits(e), [2]);
    assert_eq!(alloc(e, MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(exits(e), [2], "checked once");
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 0);
    assert_eq!(
        e.driver.nvml_inits.load(Ordering::SeqCst),
        0,
        "an index needs no NVML"
    );

    // Keys that name the devices are fine.
    let e = engine_on(
        two(),
        &[("VRAMCAP_LIMIT", "1=2GiB,GPU-01010101=1GiB"), NO_CACHE],
    );
    let p = alloc(e, GIB).unwrap();
    assert_eq!(alloc(e, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(free(e, p), CUDA_SUCCESS);
    assert!(exits(e).is_empty());

    // A UUID typo: no visible device and no GPU NVML lists has it.
    let nvml = || Machine {
        visible: 2,
        nvml: Some(vec![fake_uuid(0), fake_uuid(1), fake_uuid(2)]),
    };
    let e = engine_on(nvml(), &[("VRAMCAP_LIMIT", "GPU-0404=1GiB")]);
    assert_eq!(alloc(e, MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(exits(e), [2]);
    assert_eq!(e.driver.nvml_inits.load(Ordering::SeqCst), 1);
    assert_eq!(e.driver.nvml_shutdowns.load(Ordering::SeqCst), 1);

    // A GPU of the machine this process does not see: not an error (a
    // setting shared under CUDA_VISIBLE_DEVICES); the visible devices have
    // no cap from it.
    let e = engine_on(nvml(), &[("VRAMCAP_LIMIT", "GPU-0303=1GiB"), NO_CACHE]);
    let p = alloc(e, 2 * GIB).unwrap();
    assert!(exits(e).is_empty());
    assert_eq!(free(e, p), CUDA_SUCCESS);
    assert_eq!(e.driver.nvml_shutdowns.load(Ordering::SeqCst), 1);

    // Without keys, nothing is asked of the driver for the check.
    let e = engine_on(two(), &[("VRAMCAP_LIMIT", "1GiB")]);
    assert_eq!(mem_info(e, 16 * GIB), (GIB, GIB));
    assert_eq!(e.driver.device_counts.load(Ordering::SeqCst), 0);
    // A memory query needs the cap too: it stops as an allocation does.
    let e = engine_on(two(), &[("VRAMCAP_LIMIT", "2=1GiB")]);
    assert_eq!(mem_info(e, 16 * GIB), (16 * GIB, 16 * GIB));
    assert_eq!(exits(e), [2]);
}

/// A directory of its own for one test's group file.
fn group_dir(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("vramcap-unit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d.display().to_string()
}

fn member(dir: &str, group: &str, limit: Option<&str>) -> &'static Engine<Fake> {
    let mut vars = vec![
        ("VRAMCAP_GROUP", group),
        ("VRAMCAP_STATS_DIR", dir),
        NO_CACHE,
    ];
    if let Some(l) = limit {
        vars.push(("VRAMCAP_LIMIT", l));
    }
    engine(&vars)
}

#[test]
fn a_group_without_a_limit_never_lifts_a_members_own() {
    let dir = group_dir("no-limit");
    // The first member sets no limit: the group has no cap.
    let a = member(&dir, "g", None);
    let pa = alloc(a, 4 * GIB).unwrap();
    // A later member with its own 1 GiB holds at most that, and says so.
    let b = member(&dir, "g", Some("1GiB"));
    assert_eq!(mem_info(b, 12 * GIB), (GIB, GIB));
    let pb = alloc(b, GIB).unwrap();
    assert_eq!(alloc(b, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(mem_info(b, 11 * GIB), (0, GIB));
    let s = b.slot(0).unwrap();
    assert_eq!((s.budget.used(), s.budget.limit()), (GIB, Some(GIB)));
    assert_eq!(s.refusals.load(Ordering::Relaxed), 1);
    // The group still counts both (its budget is uncapped).
    assert_eq!(b.accounting.group().used(0), Some(5 * GIB));
    assert_eq!(free(b, pb), CUDA_SUCCESS);
    assert_eq!(free(a, pa), CUDA_SUCCESS);
    assert_eq!(b.accounting.group().used(0), Some(0));
}

#[test]
fn a_stricter_group_applies_on_top_and_both_rooms_are_reported() {
    let dir = group_dir("stricter");
    let a = member(&dir, "h", Some("1GiB"));
    let pa = alloc(a, 768 * MIB).unwrap();
    // B's own cap is 512 MiB, the group's 1 GiB with 768 MiB held: total
    // is the smaller cap, free the smaller room.
    let b = member(&dir, "h", Some("512MiB"));
    assert_eq!(mem_info(b, 15 * GIB), (256 * MIB, 512 * MIB));
    let pb = alloc(b, 256 * MIB).unwrap();
    // The group is full: refused there, B's own budget left as it was.
    assert_eq!(alloc(b, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(b.slot(0).unwrap().budget.used(), 256 * MIB);
    assert_eq!(mem_info(b, 15 * GIB), (0, 512 * MIB));
    // The group has room again: now B's own cap is what stops it.
    assert_eq!(free(a, pa), CUDA_SUCCESS);
    assert_eq!(mem_info(b, 15 * GIB), (256 * MIB, 512 * MIB));
    let pc = alloc(b, 256 * MIB).unwrap();
    assert_eq!(alloc(b, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(b.accounting.group().used(0), Some(512 * MIB));
    assert_eq!(mem_info(b, 15 * GIB), (0, 512 * MIB));
    assert_eq!(mem_info(a, 15 * GIB), (512 * MIB, GIB));
    // cuDeviceTotalMem reports the stricter cap as well.
    assert_eq!(b.device_total(0, 16 * GIB), 512 * MIB);
    assert_eq!(free(b, pb), CUDA_SUCCESS);
    assert_eq!(free(b, pc), CUDA_SUCCESS);
    assert_eq!(
        (b.accounting.group().used(0), a.accounting.group().used(0)),
        (Some(0), Some(0))
    );
}

#[test]
fn an_unreadable_group_limit_is_refused_not_taken_for_no_cap() {
    let dir = group_dir("unparsable");
    let a = member(&dir, "u", Some("1GiB"));
    alloc(a, MIB).unwrap();
    // Corrupt the recorded limit text (at offset 112 of the group file,
    // pinned by vramcap_core::group's layout test).
    let path = std::path::Path::new(&dir).join("group-u.grp");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[112..117].copy_from_slice(b"8XB\0\0");
    std::fs::write(&path, &bytes).unwrap();
    let b = member(&dir, "u", None);
    assert_eq!(alloc(b, MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(b.driver.live.load(Ordering::SeqCst), 0);
}
