//! The process's own state: the only process-wide statics of the shim
//! besides the engine cell and the settings (`boundary/mod.rs`).
//!
//! - [`gate`]: parking's entry gate, the word every driver entry point
//!   reads first, its waiters and the activity flag.
//! - Here: the exit flag and the exit handler that stops the background
//!   thread before the driver's own exit handlers run. Handlers run in
//!   reverse order of registration, and the driver registers its own at
//!   `cuInit`, earlier: ours is registered when the background thread
//!   starts ([`register_once`]), and again at each parking
//!   ([`stop_first_at_exit`]) so that it also runs before the handlers
//!   registered since (a library loaded later). Once it has run, the gate
//!   answers instead of asking for a resume, and the handler waits for a
//!   round of the background thread in flight ([`round`]).
//!
//! Both are reset in a child after `fork` ([`reset_after_fork`]). The
//! engine's parts read them; they read nothing of the engine.

pub mod gate;

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
    gate::wake_all();
    // Wait for a round in flight: the driver's exit handlers run after this.
    while BUSY.load(Ordering::SeqCst) > 0 {
        std::thread::yield_now();
    }
}

/// Registers the exit handler the first time (when the background thread
/// starts).
pub fn register_once() {
    AT_EXIT.call_once(register);
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

/// Runs one round of the background thread unless the process is
/// exiting, counted in flight so that the exit handler waits for it; false
/// when exiting (the thread then ends).
pub fn round(f: impl FnOnce()) -> bool {
    BUSY.fetch_add(1, Ordering::SeqCst);
    if EXITING.load(Ordering::SeqCst) {
        BUSY.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    f();
    BUSY.fetch_sub(1, Ordering::SeqCst);
    true
}

/// How often the background thread wakes (and how often a waiting
/// allocation looks again).
pub const TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// In a child after fork: the gate open, no waiters, no thread, not
/// exiting.
pub fn reset_after_fork() {
    gate::reset_after_fork();
    BUSY.store(0, Ordering::Release);
    EXITING.store(false, Ordering::Release);
}
