//! A parked process that exits: normally, its page going with it, or
//! through an exit handler that calls the driver, which ends at once and
//! without a restore, the parked memory discarded with the process.

use crate::park_util::*;
use crate::util::*;

/// A parked process that exits without calling CUDA again ends normally,
/// and its page goes with it.
#[test]
fn a_parked_process_exits_normally() {
    let dir = scratch_dir();
    let h = held_in(&dir, &[MANUAL], &["init", "alloc", "1G", "wait"]);
    let pid = h.pid();
    park(&dir, pid).ok_lines();
    let (lines, out) = h.finish();
    assert!(out.status.success(), "{lines:?}");
    assert!(!dir.join(format!("{pid}.page")).exists());
}

/// A parked process whose exit handler calls the driver (as the runtime's
/// does) ends at once and without a restore: at exit nothing resumes a
/// process, so the call answers `CUDA_ERROR_DEINITIALIZED` (4) instead of
/// waiting for good, and the parked memory goes with the process. Both
/// orders: the handler registered before the shim's background thread
/// started (as cudart's is), and after it (a library loaded later), with
/// the GPU full, where a resume would wait for good.
#[test]
fn a_parked_process_whose_exit_handler_calls_the_driver_ends_without_a_restore() {
    let dir = scratch_dir();
    let foreign = dir.join("foreign-mib");
    std::fs::write(&foreign, "0").unwrap();
    let env = [
        MANUAL,
        ("VRAMCAP_LOG", "info"),
        ("STANDIN_FOREIGN_FILE", foreign.to_str().unwrap()),
    ];
    for args in [
        ["init", "atexit-sync", "alloc", "1G", "wait"],
        ["init", "alloc", "1G", "atexit-sync", "wait"],
    ] {
        let h = held_in(&dir, &env, &args);
        let pid = h.pid();
        let done = watchdog(pid);
        park(&dir, pid).ok_lines();
        // 16 GiB devices: 15.5 GiB held by others leaves no room for 1 GiB.
        std::fs::write(&foreign, "15872").unwrap();
        let (lines, out) = h.finish();
        let _ = done.send(());
        std::fs::write(&foreign, "0").unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            lines[lines.len() - 2..],
            ["resumed".to_string(), "atexit sync -> 4".to_string()][..],
            "{args:?} {stderr}"
        );
        assert!(out.status.success(), "{:?} {stderr}", out.status);
        assert_eq!(
            stderr
                .matches("exiting while parked: the parked GPU memory is discarded with the process, not restored")
                .count(),
            1,
            "{stderr}"
        );
        assert!(!stderr.contains("resumed: "), "{stderr}");
        assert!(!dir.join(format!("{pid}.page")).exists());
    }
}
