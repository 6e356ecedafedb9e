//! The gate that moves close: the launch, copy and memset hooks hold it
//! shared across their driver call, a round's move exclusively
//! (`engine/mod.rs` has the lock order).

#[allow(unused_imports)]
use super::*;

/// How long a context's destroy waits for synchronisations a placement
/// round left running (`Tiers::no_round`): longer than the longest wait
/// of a round (8 s).
const QUIESCE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Tiers {
    /// Passes the gate: held for a gated driver call.
    pub fn enter(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        self.on.then(|| read!(self.gate))
    }

    /// Closes the gate, waiting at most [`STOP_WAIT`].
    pub(in crate::engine) fn stop(&self) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        let until = std::time::Instant::now() + STOP_WAIT;
        loop {
            match self.gate.try_write() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// `Tiers::running` held shared, as a round holds it throughout (the
    /// lock order's first: the engine takes it before the cache's ordering
    /// lock, `Engine::tier_round`).
    pub(in crate::engine) fn round_running(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.running.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Under tiered spill, `Tiers::running` held exclusively: no placement
    /// round runs while it is held (a round holds it shared throughout),
    /// so none is pushing, synchronising or copying on a context the
    /// program is destroying; and no thread a round left synchronising
    /// contexts (it gave up waiting for the GPU) is still in the driver.
    /// Such a thread ends when the GPU's work does, which the driver's
    /// destroy waits for too; after [`QUIESCE_WAIT`] the destroy goes ahead
    /// anyway, with a line in the log, rather than hang on work that waits
    /// for something the program will not do, and later ones no longer
    /// wait for such threads.
    pub(in crate::engine) fn no_round(&self) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        if !self.on() {
            return None;
        }
        let only = self.running.write().unwrap_or_else(|e| e.into_inner());
        let start = std::time::Instant::now();
        while self.quiescing.load(Ordering::SeqCst) > 0
            && !self.quiesce_abandoned.load(Ordering::SeqCst)
        {
            if start.elapsed() > QUIESCE_WAIT {
                self.quiesce_abandoned.store(true, Ordering::SeqCst);
                log_once!(
                    Warn,
                    "tiered spill: a context is destroyed while a synchronisation a move started has not returned after {QUIESCE_WAIT:?}; going ahead"
                );
                break;
            }
            std::thread::yield_now();
        }
        Some(only)
    }
}
