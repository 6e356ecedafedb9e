//! The entry gate of parking: every driver entry point the program can
//! reach passes it first when parking is enabled (the hooked exports, and
//! the forwarders of unhooked functions).
//!
//! - [`GATE`] is the process's parking state as a word
//!   (`vramcap_core::park::ParkState as u32`): 0 (`Running`) is open, any
//!   other value is closed. [`gate_as`]'s fast path is one `Relaxed` load of
//!   it; only a closed gate takes the slow path.
//! - The slow path waits (a condvar, no spinning) until the state is
//!   `Running` again, asking for a resume when it finds `Parked`; it
//!   answers 0 to go on, or `CUDA_ERROR_ILLEGAL_STATE` (401) when a restore
//!   failed and the process cannot continue (`Failed`).
//! - At exit (the background thread stopped by its `atexit` handler) a
//!   closed gate answers `CUDA_ERROR_DEINITIALIZED` (4) at once: nothing
//!   resumes the process any more, and restoring its memory only to free
//!   it would cost seconds per GiB and room the GPU may not have. The
//!   runtime's exit handlers take 4 as the driver shutting down; the parked
//!   memory goes with the process, as at a kill.
//! - [`ACTIVE`] is the activity flag: set by every call that passes, swapped
//!   to false each tick by the background thread, which then writes the
//!   page's `last_activity` (design item 7).
//! - [`enter_known`] is the gate of the calls whose answer is known while
//!   parked (queries and synchronisations: the park waited for the work
//!   submitted before it, and none can be submitted while parked): a parked
//!   process answers them `CUDA_SUCCESS` and stays parked, and they never
//!   count as activity (issue 43: an idle runtime that polls stays idle).
//!
//! Only the background thread changes the state ([`set_state`]), and it
//! never passes the gate (it calls the real driver). The waiters' count
//! tells it that a thread of the program is waiting (such a process is not
//! idle). Process-wide statics: one per process; a child after fork resets
//! them ([`reset_after_fork`]).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::log::{log_at, log_once};

/// The parking state as a word; 0 (`Running`) = open.
pub static GATE: AtomicU32 = AtomicU32::new(0);
/// Set by calls that pass the gate; swapped to false by the background thread each tick.
pub static ACTIVE: AtomicBool = AtomicBool::new(true);
/// A program thread found the process parked and wants it back.
pub static RESUME_WANTED: AtomicBool = AtomicBool::new(false);
/// Program threads waiting at the gate now.
pub static WAITERS: AtomicUsize = AtomicUsize::new(0);

/// A park leaves the driver usable (`VRAMCAP_PARK_MOVE=shim`: no
/// checkpoint locks it): a forwarded call that needs nothing of the GPU's
/// memory may then go through a closed gate ([`pass_quiet`]).
static DRIVER_LIVE: AtomicBool = AtomicBool::new(false);

/// Parking is enabled in this process (`VRAMCAP_PARK`): the hooked exports
/// pass [`enter`]; otherwise they skip it (one load).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Program threads inside a hooked export now (only counted when enabled):
/// the background thread parks only once it is 0 with the gate closed, so
/// no hook's accounting runs beside the ledgers' release.
pub static INSIDE: AtomicUsize = AtomicUsize::new(0);

static LOCK: Mutex<()> = Mutex::new(());
static CHANGED: Condvar = Condvar::new();

/// The state words (the values of `vramcap_core::park::ParkState`).
pub const RUNNING: u32 = 0;
pub const PARKED: u32 = 2;
pub const FAILED: u32 = 4;
/// What a call gets when the process cannot continue (a restore failed).
pub const CUDA_ERROR_ILLEGAL_STATE: i32 = 401;
/// What a call gets at exit while the process is parked.
pub const CUDA_ERROR_DEINITIALIZED: i32 = 4;

/// The gate's error `code` as an NVML function answers it:
/// `NVML_ERROR_UNINITIALIZED` (1) at exit while parked,
/// `NVML_ERROR_UNKNOWN` (999) when the process cannot continue (NVML's
/// callers know nothing of CUDA's codes).
pub const fn nvml_code(code: i32) -> i32 {
    if code == CUDA_ERROR_DEINITIALIZED {
        1
    } else {
        999
    }
}

/// Passes the gate for the function `who` (named in the log if it asks
/// for a resume: the forwarders' slow path): 0 to go on into the driver,
/// or the error the call must answer instead. The fast path is one
/// `Relaxed` load.
#[inline(always)]
pub fn gate_as(who: &'static str) -> i32 {
    if GATE.load(Ordering::Relaxed) != RUNNING {
        return gate_slow_as(who) as i32;
    }
    if !ACTIVE.load(Ordering::Relaxed) {
        ACTIVE.store(true, Ordering::Relaxed);
    }
    0
}

/// Turns the gate on for this process (the settings, once).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Says whether a park leaves the driver usable (the settings, once).
pub fn set_driver_live(live: bool) {
    DRIVER_LIVE.store(live, Ordering::Relaxed);
}

/// The gate of a forwarded call that needs nothing of the GPU's memory (a
/// context or device query, `cuCtxSetCurrent`: `forward.rs`'s quiet
/// slots): `None` when the park locks the driver (the call then passes
/// the gate as any other); else the answer at once, without waiting,
/// without asking for a resume and without counting as activity: 0 to go
/// on into the driver, which the park left usable, or
/// `CUDA_ERROR_ILLEGAL_STATE` when the process cannot continue (issue 43:
/// JAX's runtime sets its context now and then while the program idles).
pub fn pass_quiet() -> Option<i32> {
    if !DRIVER_LIVE.load(Ordering::Relaxed) {
        return None;
    }
    Some(match GATE.load(Ordering::Acquire) {
        FAILED => CUDA_ERROR_ILLEGAL_STATE,
        _ => 0,
    })
}

/// Whether parking is enabled in this process (for the forwarders of
/// unhooked functions, branch `parkfwd`).
#[allow(dead_code)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A hooked export's pass: counted in [`INSIDE`] until dropped.
pub struct Inside(bool);

impl Drop for Inside {
    fn drop(&mut self) {
        if self.0 {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What a hooked export calls first: without parking, nothing (one load);
/// with it, [`gate_as`], then counts the thread inside until the pass is
/// dropped. `Err(code)` is the answer the call must give instead.
#[inline(always)]
pub fn enter() -> Result<Inside, i32> {
    enter_as("a call of the shim's C ABI")
}

/// [`enter`] for the export `who` (named in the log if it asks for a
/// resume).
#[inline(always)]
pub fn enter_as(who: &'static str) -> Result<Inside, i32> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(Inside(false));
    }
    enter_counted(who)
}

#[inline(never)]
fn enter_counted(who: &'static str) -> Result<Inside, i32> {
    loop {
        if GATE.load(Ordering::Relaxed) != RUNNING {
            let rc = gate_slow_as(who);
            if rc != 0 {
                return Err(rc as i32);
            }
        } else if !ACTIVE.load(Ordering::Relaxed) {
            ACTIVE.store(true, Ordering::Relaxed);
        }
        // Counted, then the gate read again (both SeqCst, as the parker's
        // close and read of INSIDE are): either the parker sees this
        // thread inside, or this thread sees the gate closed and backs out.
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if GATE.load(Ordering::SeqCst) == RUNNING {
            return Ok(Inside(true));
        }
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The slow path: waits for `Running`, asking for a resume if parked and
/// naming `who` in the log as what asked.
#[cold]
#[inline(never)]
fn gate_slow_as(who: &'static str) -> u32 {
    let answer = wait_at_gate(false, who);
    ACTIVE.store(true, Ordering::Relaxed);
    answer
}

/// What [`wait_at_gate`] answers a call whose answer is known while
/// parked, once the process is parked: `CUDA_SUCCESS`, without the driver.
const KNOWN: u32 = u32::MAX;

/// Waits at a closed gate until the call may go on (0), or must answer an
/// error instead. `known`: the call's answer is known while parked
/// ([`enter_known`]), so a parked process answers it ([`KNOWN`]) and is
/// not asked to resume.
fn wait_at_gate(known: bool, who: &'static str) -> u32 {
    WAITERS.fetch_add(1, Ordering::SeqCst);
    let answer = loop {
        let s = GATE.load(Ordering::Acquire);
        match s {
            RUNNING => break 0,
            FAILED => break CUDA_ERROR_ILLEGAL_STATE as u32,
            _ if super::exiting() => {
                log_once!(
                    Info,
                    "exiting while parked: the parked GPU memory is discarded with the process, not restored"
                );
                break CUDA_ERROR_DEINITIALIZED as u32;
            }
            // At exit, as every other call (above): the driver shutting down.
            PARKED if known => break KNOWN,
            // The first call to ask is named (what woke an idle process:
            // issue 43); the others find the resume asked for.
            PARKED if !RESUME_WANTED.swap(true, Ordering::SeqCst) => {
                log_at!(Info, "parking: {who} resumes this process");
            }
            _ => {}
        }
        let held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        if GATE.load(Ordering::Acquire) == s {
            // The timeout only bounds a missed wake-up; the state is
            // re-read each time.
            let _ = CHANGED.wait_timeout(held, Duration::from_millis(500));
        }
    };
    WAITERS.fetch_sub(1, Ordering::SeqCst);
    answer
}

/// What a hooked export whose answer is known while parked calls first
/// (the hook list's `known` entries: queries and synchronisations of work
/// submitted before the park, which the park waited for): as [`enter`],
/// but a parked process answers `Err(0)`, `CUDA_SUCCESS`, at once, without
/// the driver and without resuming; and the call does not count as
/// activity (it needs no GPU: a program that only polls is idle).
#[inline(always)]
pub fn enter_known() -> Result<Inside, i32> {
    if !ENABLED.load(Ordering::Relaxed) {
        return Ok(Inside(false));
    }
    enter_known_counted()
}

#[inline(never)]
fn enter_known_counted() -> Result<Inside, i32> {
    loop {
        if GATE.load(Ordering::SeqCst) != RUNNING {
            match wait_at_gate(true, "") {
                0 => {}
                KNOWN => return Err(0),
                rc => return Err(rc as i32),
            }
        }
        // As in `enter_counted`: counted, then the gate read again.
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if GATE.load(Ordering::SeqCst) == RUNNING {
            return Ok(Inside(true));
        }
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Unit tests that change the process-wide gate (the forwarders', the
/// engine's parking tests) take this first: one at a time.
#[cfg(test)]
pub static TESTS: Mutex<()> = Mutex::new(());

/// Sets the state word and wakes the waiters (the background thread only).
pub fn set_state(state: u32) {
    let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    GATE.store(state, Ordering::SeqCst);
    if state == RUNNING {
        RESUME_WANTED.store(false, Ordering::SeqCst);
    }
    CHANGED.notify_all();
}

/// Wakes the waiters to read the state again (at exit).
pub fn wake_all() {
    let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    CHANGED.notify_all();
}

/// The state word now.
pub fn state() -> u32 {
    GATE.load(Ordering::Acquire)
}

/// In a child after fork: the child has no parked memory and no waiters.
pub fn reset_after_fork() {
    GATE.store(RUNNING, Ordering::Release);
    RESUME_WANTED.store(false, Ordering::Release);
    WAITERS.store(0, Ordering::Release);
    INSIDE.store(0, Ordering::Release);
    ACTIVE.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: a call whose answer is known is answered `CUDA_SUCCESS`
    /// by a parked gate without asking for a resume, never counts as
    /// activity, goes into the driver (counted inside) once running, and
    /// gets the failure of a stuck process; an ordinary call counts.
    #[test]
    fn known_calls_answer_a_parked_gate_and_are_no_activity() {
        let _one = TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let was = enabled();
        enable(true);
        set_state(PARKED);
        ACTIVE.store(false, Ordering::SeqCst);
        assert_eq!(enter_known().err(), Some(0));
        assert!(!RESUME_WANTED.load(Ordering::SeqCst));
        assert!(!ACTIVE.load(Ordering::SeqCst));
        assert_eq!(WAITERS.load(Ordering::SeqCst), 0);
        set_state(RUNNING);
        let inside = enter_known().expect("running: the driver answers");
        assert_eq!(INSIDE.load(Ordering::SeqCst), 1);
        drop(inside);
        assert_eq!(INSIDE.load(Ordering::SeqCst), 0);
        assert!(!ACTIVE.load(Ordering::SeqCst));
        drop(enter().expect("running"));
        assert!(ACTIVE.load(Ordering::SeqCst));
        set_state(FAILED);
        assert_eq!(enter_known().err(), Some(CUDA_ERROR_ILLEGAL_STATE));
        set_state(RUNNING);
        enable(was);
    }
}
