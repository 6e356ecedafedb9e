//! The engine's background thread: started on first need (the first block
//! kept in the cache, the first deferred free of spilled memory, joining a
//! group), it wakes every [`TICK`] to release idle cached blocks, answer
//! `vramcap trim`, reap deferred frees and reclaim dead group members.
//!
//! At exit an `atexit` handler stops it before the driver's own exit
//! handlers run (handlers run in reverse order of registration, and the
//! driver registers its own at `cuInit`, earlier), waiting for a round in
//! flight to end. Each parking registers it again ([`stop_first_at_exit`]),
//! so that it also runs before the handlers registered since (a library
//! loaded later): once it has run, parking's gate answers instead of
//! asking for a resume. These flags are process-wide; a child after `fork` has no
//! thread and resets them ([`reset_after_fork`]).

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::log::log_once;

/// How often the background thread wakes.
pub const TICK: Duration = Duration::from_millis(100);

static AT_EXIT: Once = Once::new();
static EXITING: AtomicBool = AtomicBool::new(false);
/// Rounds in flight, over every engine's thread (one per process outside
/// tests).
static BUSY: AtomicUsize = AtomicUsize::new(0);

/// Registers [`stop_at_exit`].
fn register() {
    // SAFETY: registering a plain function with no preconditions; a
    // child after fork inherits the registration.
    unsafe { libc::atexit(stop_at_exit) };
}

extern "C" fn stop_at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    // A program thread waiting at parking's gate answers now instead of
    // waiting for a resume that no thread will run.
    crate::engine::park::gate::wake_all();
    // Wait for a round in flight: the driver's exit handlers run after this.
    while BUSY.load(Ordering::SeqCst) > 0 {
        std::thread::yield_now();
    }
}

/// How many times [`stop_first_at_exit`] may register the handler again.
const MAX_REREGISTRATIONS: usize = 16;
static REREGISTERED: AtomicUsize = AtomicUsize::new(0);

/// Registers the exit handler once more (at a parking; at most
/// [`MAX_REREGISTRATIONS`] times a process), so that it runs before every
/// exit handler registered until now. Running it twice is harmless.
pub fn stop_first_at_exit() {
    if REREGISTERED.fetch_add(1, Ordering::Relaxed) < MAX_REREGISTRATIONS {
        register();
    }
}

/// Whether the process is in its exit handlers (the background thread has
/// stopped, or is about to: nothing resumes a parked process any more).
pub fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// Whether an engine's thread has been started.
pub struct Worker {
    started: AtomicBool,
}

impl Worker {
    pub const fn new() -> Worker {
        Worker {
            started: AtomicBool::new(false),
        }
    }

    /// Starts the thread once, running `round` every [`TICK`] until exit.
    pub fn ensure(&self, round: impl Fn() + Send + 'static) {
        if self.started.load(Ordering::Relaxed) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        // The engine's unit tests run the rounds by hand (engine/tests): a
        // thread running them too would race the tests' own rounds (a
        // tiered test failed about one run in ten that way).
        if cfg!(test) {
            return;
        }
        AT_EXIT.call_once(register);
        let spawned = std::thread::Builder::new()
            .name("vramcap-cache".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    BUSY.fetch_add(1, Ordering::SeqCst);
                    if EXITING.load(Ordering::SeqCst) {
                        BUSY.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&round));
                    BUSY.fetch_sub(1, Ordering::SeqCst);
                    if ran.is_err() {
                        // A bug. What the round held was let go by
                        // unwinding (locks carry on past poisoning; a block
                        // claimed for a move is unclaimed), so the next
                        // rounds run: they apply limits asked from outside
                        // and keep the group's membership alive.
                        log_once!(
                            Error,
                            "the background thread's round panicked (a vramcap bug: please report it, with this log); rounds go on"
                        );
                    }
                }
            });
        if let Err(e) = spawned {
            log_once!(
                Error,
                "cannot start the cache's background thread ({e}); idle blocks stay cached until memory is needed"
            );
        }
    }
}

/// In a child after fork: no thread runs, none is exiting.
pub fn reset_after_fork() {
    BUSY.store(0, Ordering::Release);
    EXITING.store(false, Ordering::Release);
}
