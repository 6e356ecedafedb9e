//! Parking's steps against the fake's checkpoint calls (issue 41, done-when
//! 5): a park asked through the page's mailbox releases the budget exactly
//! and a resume takes it back; the refusals (no checkpoint calls, a GPU
//! that cannot be measured, a driver error, no room) leave the process
//! running or parked as it was; a cap lowered below the parked bytes is
//! resumed over. The gate is process-wide: each test holds
//! `process::gate::TESTS` and leaves the gate open.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use vramcap_core::mailbox::{Mailbox, post_park, withdraw_park};
use vramcap_core::park::{Ask, Outcome};

use super::*;
use crate::process::gate;

/// Holds the gate's test lock; opens the gate again when dropped.
struct Gate(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Gate {
    fn take() -> Gate {
        let g = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        gate::set_state(gate::RUNNING);
        Gate(g)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        gate::set_state(gate::RUNNING);
    }
}

/// A fake with the checkpoint calls, whose GPUs have `free` bytes free as
/// another process measures them (`None`: not measurable).
fn checkpointing(free: Option<u64>) -> Fake {
    Fake {
        ck: Ck {
            on: true,
            free: Mutex::new(free),
            ..Ck::default()
        },
        ..Fake::default()
    }
}

/// An engine with parking on (`manual`) by the driver's checkpoint, no
/// cache and a cap of `cap`.
fn parking(fake: Fake, cap: &str) -> &'static Engine<Fake> {
    engine_with(
        fake,
        &[
            ("VRAMCAP_PARK", "manual"),
            ("VRAMCAP_PARK_MOVE", "checkpoint"),
            NO_CACHE,
            ("VRAMCAP_LIMIT", cap),
        ],
    )
}

/// Asks `what` through the page's park mailbox and runs one background
/// round; the answer, which the round must have given.
fn ask(e: &'static Engine<Fake>, what: Ask) -> Outcome {
    let h = &e.accounting.page().get(e.settings).header;
    let ticket = post_park(h, what);
    e.park_round();
    assert!(Mailbox::park(h).answered(ticket), "no answer in the round");
    Outcome::from_word(h.park_outcome.load(Ordering::Acquire))
}

fn steps(e: &'static Engine<Fake>) -> Vec<&'static str> {
    e.driver.ck.steps.lock().unwrap().clone()
}

fn parked_bytes(e: &'static Engine<Fake>) -> u64 {
    e.accounting.page().get(e.settings).header.parked[0].load(Ordering::Acquire)
}

#[test]
fn a_park_releases_the_budget_exactly_and_a_resume_takes_it_back() {
    let _g = Gate::take();
    let e = parking(checkpointing(Some(16 * GIB)), "4GiB");
    let p = alloc(e, GIB).unwrap();
    assert_eq!(ask(e, Ask::Park), Outcome::Ok);
    assert_eq!(steps(e), ["lock", "save"]);
    assert_eq!(gate::state(), gate::PARKED);
    assert_eq!(used(e), 0);
    assert_eq!(parked_bytes(e), GIB);
    // Parking twice is no change.
    assert_eq!(ask(e, Ask::Park), Outcome::Ok);
    assert_eq!(steps(e), ["lock", "save"]);
    assert_eq!(ask(e, Ask::Resume), Outcome::Ok);
    assert_eq!(steps(e), ["lock", "save", "restore", "unlock"]);
    assert_eq!(gate::state(), gate::RUNNING);
    assert_eq!(used(e), GIB);
    assert_eq!(parked_bytes(e), 0);
    assert_eq!(free(e, p), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

#[test]
fn a_park_the_driver_or_the_machine_cannot_do_leaves_it_running() {
    let _g = Gate::take();
    // No checkpoint calls: told so, nothing asked of the driver.
    let e = parking(Fake::default(), "4GiB");
    alloc(e, GIB).unwrap();
    assert_eq!(ask(e, Ask::Park), Outcome::NoCheckpointApi);
    assert_eq!((gate::state(), used(e)), (gate::RUNNING, GIB));
    // Its GPU's free memory cannot be measured: never parked (it could
    // never be let resume).
    let e = parking(checkpointing(None), "4GiB");
    alloc(e, GIB).unwrap();
    assert_eq!(ask(e, Ask::Park), Outcome::Unmeasured(0));
    assert_eq!(steps(e), Vec::<&str>::new());
    assert_eq!((gate::state(), used(e)), (gate::RUNNING, GIB));
    // The driver's checkpoint fails: unlocked again, running, nothing
    // released.
    let fake = checkpointing(Some(16 * GIB));
    *fake.ck.fail.lock().unwrap() = Some("save");
    let e = parking(fake, "4GiB");
    alloc(e, GIB).unwrap();
    assert_eq!(ask(e, Ask::Park), Outcome::DriverError(999));
    assert_eq!(steps(e), ["lock", "save", "unlock"]);
    assert_eq!((gate::state(), used(e)), (gate::RUNNING, GIB));
}

#[test]
fn a_resume_without_room_on_the_gpu_keeps_it_parked_and_restores_nothing() {
    let _g = Gate::take();
    let e = parking(checkpointing(Some(16 * GIB)), "4GiB");
    alloc(e, GIB).unwrap();
    assert_eq!(ask(e, Ask::Park), Outcome::Ok);
    *e.driver.ck.free.lock().unwrap() = Some(GIB);
    // 1 GiB free is short of 1 GiB and the margin.
    assert_eq!(ask(e, Ask::Resume), Outcome::NoRoom(0));
    assert_eq!(steps(e), ["lock", "save"]);
    assert_eq!(
        (gate::state(), used(e), parked_bytes(e)),
        (gate::PARKED, 0, GIB)
    );
}

#[test]
fn a_cap_lowered_below_the_parked_bytes_is_resumed_over() {
    let _g = Gate::take();
    let e = parking(checkpointing(Some(16 * GIB)), "4GiB");
    let p = alloc(e, GIB).unwrap();
    assert_eq!(ask(e, Ask::Park), Outcome::Ok);
    e.set_own_limit(0, 512 * MIB);
    assert_eq!(ask(e, Ask::Resume), Outcome::Ok);
    assert_eq!((gate::state(), used(e)), (gate::RUNNING, GIB));
    // Over its cap: new allocations are refused until it frees.
    assert_eq!(alloc(e, MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(free(e, p), CUDA_SUCCESS);
    assert!(alloc(e, MIB).is_ok());
}

/// A request withdrawn before it was taken is answered "withdrawn", not
/// "done" (a racing or withdrawn ask must never read as parked), and
/// nothing is done for it.
#[test]
fn a_withdrawn_request_is_answered_withdrawn_and_nothing_is_done() {
    let _g = Gate::take();
    let e = parking(checkpointing(Some(16 * GIB)), "4GiB");
    alloc(e, GIB).unwrap();
    let h = &e.accounting.page().get(e.settings).header;
    let ticket = post_park(h, Ask::Park);
    assert!(withdraw_park(h, Ask::Park));
    e.park_round();
    assert!(Mailbox::park(h).answered(ticket));
    assert_eq!(
        Outcome::from_word(h.park_outcome.load(Ordering::Acquire)),
        Outcome::Withdrawn
    );
    assert_eq!(steps(e), Vec::<&str>::new());
    assert_eq!((gate::state(), used(e)), (gate::RUNNING, GIB));
}
