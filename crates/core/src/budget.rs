//! Per-device byte budgets: the atomic heart of the cap.
//!
//! A budget holds the device's limit, the bytes currently reserved (held
//! allocations plus reservations for calls still in flight) and the peak of
//! that figure. An allocation first *reserves* its bytes with a
//! compare-and-swap that fails when `used + bytes` would pass the limit, then
//! calls the driver, and gives the bytes back if the driver refuses. Because
//! the check and the increment are one atomic step, no interleaving of
//! threads lets the sum of reservations pass the limit; the driver can only
//! ever hold less than what is reserved.
//!
//! Orderings: `used` is the only word that decides anything, and every
//! decision is a read-modify-write on it, so `Relaxed` would keep the cap
//! exact; `AcqRel` is used anyway so that a thread seeing freed bytes also
//! sees everything the freeing thread did before (cheap on x86, and it keeps
//! reasoning simple). `peak` is a statistic (`fetch_max`, `Relaxed`). `limit`
//! is written once per process (or after `fork`) with `Release` and read with
//! `Acquire`.

use std::sync::atomic::{AtomicU64, Ordering};

/// `limit` before the device's cap has been worked out.
const UNRESOLVED: u64 = 0;
/// `limit` of a device without a cap.
pub const NO_CAP: u64 = u64::MAX;

/// Three words, in this order, inside the statistics page (see `page`).
#[derive(Debug)]
#[repr(C)]
pub struct DeviceBudget {
    limit: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub used: u64,
    pub limit: u64,
}

impl Default for DeviceBudget {
    fn default() -> Self {
        DeviceBudget::new()
    }
}

impl DeviceBudget {
    pub const fn new() -> DeviceBudget {
        DeviceBudget {
            limit: AtomicU64::new(UNRESOLVED),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// The cap in bytes ([`NO_CAP`] for none), or `None` before it is set.
    pub fn limit(&self) -> Option<u64> {
        match self.limit.load(Ordering::Acquire) {
            UNRESOLVED => None,
            l => Some(l),
        }
    }

    /// Sets the cap; a cap of zero bytes is stored as one byte (refuse all).
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit.max(1), Ordering::Release);
    }

    /// Reserves `bytes` under `limit`, or says how full the budget is.
    pub fn try_reserve(&self, bytes: u64, limit: u64) -> Result<(), Refused> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = match cur.checked_add(bytes) {
                Some(n) if n <= limit => n,
                _ => return Err(Refused { used: cur, limit }),
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives `bytes` back. Returns false (and clamps at zero) when more is
    /// given back than was reserved, which would be a bookkeeping bug.
    pub fn release(&self, bytes: u64) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let (next, ok) = match cur.checked_sub(bytes) {
                Some(n) => (n, true),
                None => (0, false),
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return ok,
                Err(seen) => cur = seen,
            }
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Forgets everything, the limit included (a child after `fork`).
    pub fn reset(&self) {
        self.used.store(0, Ordering::Release);
        self.peak.store(0, Ordering::Relaxed);
        self.limit.store(UNRESOLVED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reserve_and_release() {
        let b = DeviceBudget::new();
        assert_eq!(b.limit(), None);
        b.set_limit(100);
        assert_eq!(b.limit(), Some(100));
        assert_eq!(b.try_reserve(60, 100), Ok(()));
        assert_eq!(
            b.try_reserve(41, 100),
            Err(Refused {
                used: 60,
                limit: 100
            })
        );
        assert_eq!(b.try_reserve(40, 100), Ok(()));
        assert_eq!(b.used(), 100);
        assert!(b.release(100));
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 100);
        assert!(!b.release(1));
        assert_eq!(b.used(), 0);
        assert_eq!(b.try_reserve(u64::MAX, NO_CAP), Ok(()));
        assert!(
            b.try_reserve(1, NO_CAP).is_err(),
            "overflow is refused, not wrapped"
        );
        b.reset();
        assert_eq!((b.used(), b.peak(), b.limit()), (0, 0, None));
        b.set_limit(0);
        assert_eq!(b.limit(), Some(1));
    }

    #[test]
    fn threads_never_pass_the_limit() {
        let b = Arc::new(DeviceBudget::new());
        let limit = 1000;
        let handles: Vec<_> = (0..16u64)
            .map(|t| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    let mut x = t * 2654435761 + 1;
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let n = x % 97 + 1;
                        if held.len() < 4 && b.try_reserve(n, limit).is_ok() {
                            assert!(b.used() <= limit);
                            held.push(n);
                        } else if let Some(n) = held.pop() {
                            assert!(b.release(n));
                        }
                    }
                    for n in held {
                        assert!(b.release(n));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(b.used(), 0);
        assert!(b.peak() <= limit && b.peak() > 0);
    }
}
