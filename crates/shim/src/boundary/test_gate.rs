//! TEST-ONLY: a way for the integration tests to close and open the parking
//! gate of a process from outside, without parking it, so that they can
//! show a forwarded call waiting at a closed gate and going through once
//! it opens (`tests/forward.rs`).
//!
//! `VRAMCAP_TEST_GATE=PATH` (with `VRAMCAP_PARK` set) starts one thread at
//! load that reads PATH (a FIFO the test made and holds open) byte by byte:
//! `c` closes the gate (the state `Parking`: calls wait, asking for no
//! resume), `o` opens it (`Running`), each answered with one line on
//! stderr ("test gate: closed" / "test gate: opened"). A forwarded call that
//! finds the gate closed says "test gate: a forwarded call waits" before
//! it waits. Unset, nothing here runs but one relaxed load per slow path.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::engine::park::gate;

/// The variable that turns the hook on.
pub const TEST_GATE_VAR: &str = "VRAMCAP_TEST_GATE";

/// The state the switch closes the gate with: `Parking` (1), in which
/// calls wait and ask for no resume.
const CLOSED: u32 = 1;

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// How many forwarded calls have found the gate closed (read by unit tests).
pub static WAITS: AtomicUsize = AtomicUsize::new(0);

/// Starts the hook's thread if `VRAMCAP_TEST_GATE` asks for it.
pub fn start() {
    let Some(path) = std::env::var_os(TEST_GATE_VAR) else {
        return;
    };
    if !gate::enabled() {
        crate::log::write_line(format_args!(
            "{TEST_GATE_VAR} is ignored without VRAMCAP_PARK (e.g. VRAMCAP_PARK=manual {TEST_GATE_VAR}=/tmp/gate.fifo)"
        ));
        return;
    }
    ACTIVE.store(true, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("vramcap-test-gate".into())
        .spawn(move || {
            let mut f = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) => {
                    crate::log::write_line(format_args!("test gate: cannot open {path:?}: {e}"));
                    return;
                }
            };
            let mut byte = [0u8; 1];
            while let Ok(1) = f.read(&mut byte) {
                match byte[0] {
                    b'c' => {
                        gate::set_state(CLOSED);
                        crate::log::write_line(format_args!("test gate: closed"));
                    }
                    b'o' => {
                        gate::set_state(gate::RUNNING);
                        crate::log::write_line(format_args!("test gate: opened"));
                    }
                    _ => {}
                }
            }
        });
    if let Err(e) = spawned {
        crate::log::write_line(format_args!("test gate: cannot start its thread: {e}"));
    }
}

/// Called by a forwarder that found the gate closed, before it waits.
pub fn note_wait() {
    WAITS.fetch_add(1, Ordering::Relaxed);
    if ACTIVE.load(Ordering::Relaxed) {
        crate::log::write_line(format_args!("test gate: a forwarded call waits"));
    }
}
