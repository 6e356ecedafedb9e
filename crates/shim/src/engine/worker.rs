//! The engine's background thread: started on first need (the first block
//! kept in the cache, the first deferred free of spilled memory, joining a
//! group), it wakes every [`TICK`] to release idle cached blocks, answer
//! `vramcap trim`, reap deferred frees and reclaim dead group members. Its
//! exit is the process's (`process/mod.rs`): the exit handler stops it
//! before the driver's own run.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::log::log_once;
use crate::process as exit;
pub use crate::process::TICK;

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
        exit::register_once();
        let spawned = std::thread::Builder::new()
            .name("vramcap-cache".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    let mut ran = Ok(());
                    let going = exit::round(|| {
                        ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&round));
                    });
                    if !going {
                        return;
                    }
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
