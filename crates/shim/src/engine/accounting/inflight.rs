//! Allocations in flight, counted for cap changes (`live.rs`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The allocations between their reservation and their driver call's
/// end, so that a change of a cap is applied only once every allocation
/// that may have read the old cap is done: after it, the driver never
/// holds more than the new cap because of an allocation granted under the
/// old one. Two counters by epoch parity, as read-copy-update does: an
/// allocation counts itself in the current epoch's; a change stores the
/// new cap, moves to the next epoch and waits for the previous epoch's
/// counter to empty. Sequentially consistent fences on both sides make
/// sure that an allocation the change does not wait for reads the new cap.
/// Changes are serialised by a mutex (they are rare); allocations take no
/// lock, only two atomic additions on the driver-allocation path (never
/// on a cache hit).
pub struct InFlight {
    epoch: AtomicU64,
    pending: [AtomicU64; 2],
    changing: Mutex<()>,
}

/// One allocation in flight; counted out when dropped.
pub struct Pending<'a>(&'a AtomicU64);

impl Drop for Pending<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InFlight {
    pub const fn new() -> InFlight {
        InFlight {
            epoch: AtomicU64::new(0),
            pending: [AtomicU64::new(0), AtomicU64::new(0)],
            changing: Mutex::new(()),
        }
    }

    /// Counts an allocation in, before it reads the cap. Counted in the
    /// epoch it saw, and again in the next if a change moved the epoch in
    /// between (else a second change right after the first could miss it).
    #[inline(always)]
    pub fn enter(&self) -> Pending<'_> {
        let e = self.epoch.load(Ordering::SeqCst);
        let c = &self.pending[(e & 1) as usize];
        c.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.epoch.load(Ordering::SeqCst) == e {
            Pending(c)
        } else {
            self.enter_again(c)
        }
    }

    /// [`InFlight::enter`] after a change moved the epoch: counted out of
    /// `c`, and in again in the epoch now.
    #[cold]
    fn enter_again(&self, c: &AtomicU64) -> Pending<'_> {
        c.fetch_sub(1, Ordering::SeqCst);
        loop {
            let e = self.epoch.load(Ordering::SeqCst);
            let c = &self.pending[(e & 1) as usize];
            c.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == e {
                return Pending(c);
            }
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Serialises cap changes: held across reading the caps, storing the
    /// new ones and [`InFlight::drain`], so no change is lost to another.
    pub fn changing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After a new cap was stored: waits until every allocation that may
    /// have read the old one is done (yielding; each is one driver call).
    /// The caller holds [`InFlight::changing`].
    pub fn drain(&self) {
        fence(Ordering::SeqCst);
        let e = self.epoch.fetch_add(1, Ordering::SeqCst);
        let c = &self.pending[(e & 1) as usize];
        while c.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}
