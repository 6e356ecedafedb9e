//! STUB of the parking gate (issue 34, design item 6) with the names of the
//! parking core's `engine/park/gate.rs` (branch `park`), so that the
//! forwarders (`boundary/forward.rs`) and their test switch
//! (`boundary/test_gate.rs`) build before it is merged. At the merge those
//! two files' `use crate::park_gate as gate;` becomes `use
//! crate::engine::park::gate;`, and this file and its `mod` line go (tried
//! on a merge of both branches: it builds, and tests/forward.rs and
//! tests/park.rs pass).
//!
//! - [`GATE`]: the parking state as a word; [`RUNNING`] (0) is open.
//! - [`ACTIVE`]: set by calls that pass; the worker clears it each tick.
//! - [`gate`]: 0 to go on, or the error the call answers instead.
//! - [`gate_slow`]: waits (futex, no spinning) while the state is neither
//!   `RUNNING` nor [`FAILED`].
//! - [`set_state`]: sets the word and wakes the waiters.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The parking state as a word; 0 (`RUNNING`) is open.
pub static GATE: AtomicU32 = AtomicU32::new(RUNNING);
/// Set by calls that pass the gate.
pub static ACTIVE: AtomicBool = AtomicBool::new(true);

pub const RUNNING: u32 = 0;
pub const FAILED: u32 = 4;
/// What a call answers when the process cannot continue.
pub const CUDA_ERROR_ILLEGAL_STATE: i32 = 401;

/// Whether parking is enabled for this process: `VRAMCAP_PARK` set to a
/// non-empty value, read once (the real gate is told by the settings).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("VRAMCAP_PARK").is_some_and(|v| !v.is_empty()))
}

/// Passes the gate: 0 to go on, or the error the call answers instead.
#[inline(always)]
pub fn gate() -> i32 {
    if GATE.load(Ordering::Relaxed) != RUNNING {
        return gate_slow() as i32;
    }
    if !ACTIVE.load(Ordering::Relaxed) {
        ACTIVE.store(true, Ordering::Relaxed);
    }
    0
}

/// Waits until the state is `RUNNING` (0) or `FAILED` (401).
#[cold]
#[inline(never)]
pub extern "C" fn gate_slow() -> u32 {
    loop {
        let word = GATE.load(Ordering::Acquire);
        match word {
            RUNNING => break,
            FAILED => return CUDA_ERROR_ILLEGAL_STATE as u32,
            _ => {}
        }
        // SAFETY: FUTEX_WAIT on a live, aligned u32 with a null timeout;
        // it returns at once if the word is no longer `word`.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                GATE.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                word,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }
    ACTIVE.store(true, Ordering::Relaxed);
    0
}

/// Sets the state word and wakes every waiter.
pub fn set_state(state: u32) {
    GATE.store(state, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a live, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            GATE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}
