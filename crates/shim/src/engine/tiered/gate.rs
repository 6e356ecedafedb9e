//! The gate that moves close: the launch, copy and memset hooks hold it
//! shared across their driver call, a round's move exclusively
//! (`engine/mod.rs` has the lock order).

#[allow(unused_imports)]
use super::*;

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
}
