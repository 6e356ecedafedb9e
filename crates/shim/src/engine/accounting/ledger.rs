//! The engine's book of what a process holds beyond its allocations: the
//! pools it allocates from with their charges, and the context
//! measurement's state. The rules are in `held.rs`; this is the data, kept
//! apart so that `state` (the `Accounting`) can own it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use vramcap_core::MAX_DEVICES;

/// What a pool is assumed to grow by at least, per allocation that needs
/// more than its free reserve: the real driver grew a default pool by 32
/// MiB for a 1-byte allocation (H200, driver 580; docs/design/gpu-history.md).
pub const POOL_GRANULE: u64 = 32 << 20;
/// How often the background thread measures the context again.
pub const CONTEXT_EVERY: Duration = Duration::from_secs(1);
/// The least time between two measurements on the refusal path.
pub const CONTEXT_AGAIN: Duration = Duration::from_millis(100);
/// Room a measured context footprint is charged with, for modules the
/// driver loads later (lazily, at a kernel's first launch).
pub const CONTEXT_GROWTH: u64 = 128 << 20;
/// An allocation that would bring the process within this of its cap
/// measures the context first ([`NEAR_AGAIN`] apart at most).
pub const NEAR_CAP: u64 = 256 << 20;
pub const NEAR_AGAIN: Duration = Duration::from_millis(10);
/// Until the context has a real figure, the first this many allocations
/// each try to measure it; after that, one try per [`CONTEXT_AGAIN`].
pub const EAGER_TRIES: u32 = 16;
/// How long a thread that needs the context's first figure waits between
/// looks at another thread's measurement in progress.
pub const WAIT_MEASURING: Duration = Duration::from_micros(200);
/// Processes NVML may list on one device for the measurement to work.
pub const PROCESSES: usize = 128;

/// NVML as the context measurement found it.
pub const NVML_UNTRIED: u8 = 0;
pub const NVML_UP: u8 = 1;
pub const NVML_ABSENT: u8 = 2;

/// One pool the process allocated from.
#[derive(Debug, Clone, Copy)]
pub struct PoolEntry {
    pub pool: usize,
    /// Unique for the engine's life: records name their entry by it, so a
    /// destroyed pool's handle reused by a new pool names the new entry.
    pub serial: u64,
    pub device: u16,
    /// Bytes of the device's budget held for this pool.
    pub charged: u64,
    /// Allocations from it between their estimate and their settling.
    pub inflight: u32,
    /// Bytes of its free reserve that allocations in flight count on.
    pub claimed: u64,
    /// Live allocations charged through it.
    pub live: u64,
    /// Destroyed: `charged` stays until its last allocation is freed.
    pub destroyed: bool,
    /// A pool of host memory: nothing charged.
    pub exempt: bool,
}

impl PoolEntry {
    /// Its charge for a reserve of `r` just read (`held.rs`): `r` when no
    /// allocation from it is in flight, else never below the charge now
    /// (their estimates stay until they settle).
    pub fn charge_for(&self, r: u64) -> u64 {
        if self.inflight == 0 {
            r
        } else {
            r.max(self.charged)
        }
    }

    pub fn new(pool: usize, serial: u64, device: u16, exempt: bool) -> PoolEntry {
        PoolEntry {
            pool,
            serial,
            device,
            charged: 0,
            inflight: 0,
            claimed: 0,
            live: 0,
            destroyed: false,
            exempt,
        }
    }
}

/// An allocation's claim on its pool, between estimate and settling.
#[derive(Debug, Clone, Copy)]
pub struct PoolClaim {
    /// The pool's entry.
    pub serial: u64,
    pub device: u16,
    /// The estimate reserved in the budget.
    pub grow: u64,
    /// What it took from the pool's free reserve.
    pub take: u64,
}

/// A change of a pool's charge from `old` to `new`, applied to the budget
/// (which holds `old + reserved`: `reserved` is an estimate being settled)
/// after the book's lock is released.
#[derive(Debug, Clone, Copy)]
pub struct Change {
    pub device: u16,
    pub old: u64,
    pub new: u64,
    pub reserved: u64,
}

pub struct HeldBook {
    pub pools: Mutex<Vec<PoolEntry>>,
    /// The next [`PoolEntry::serial`].
    pub next_serial: AtomicU64,
    /// Serialises reading a device's graph reserve with moving its charge,
    /// so an older reading is never applied after a newer one.
    pub graphs: Mutex<()>,
    /// Per device: bytes of the own budget that the group's could not take
    /// when a measured figure rose past the group's cap (released from the
    /// own budget only).
    pub owed: [AtomicU64; MAX_DEVICES],
    /// Per device: when the context was last measured with a real figure
    /// (ns on the monotonic clock; 0: not since the process started or a
    /// context went away), when it was last tried, how many tries since
    /// the last real figure, and whether a measurement runs.
    pub measured_ns: [AtomicU64; MAX_DEVICES],
    pub tried_ns: [AtomicU64; MAX_DEVICES],
    pub tries: [AtomicU32; MAX_DEVICES],
    pub measuring: [AtomicBool; MAX_DEVICES],
    pub nvml: AtomicU8,
}

pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

impl HeldBook {
    pub fn new() -> HeldBook {
        HeldBook {
            pools: Mutex::new(Vec::new()),
            next_serial: AtomicU64::new(1),
            graphs: Mutex::new(()),
            owed: [const { AtomicU64::new(0) }; MAX_DEVICES],
            measured_ns: [const { AtomicU64::new(0) }; MAX_DEVICES],
            tried_ns: [const { AtomicU64::new(0) }; MAX_DEVICES],
            tries: [const { AtomicU32::new(0) }; MAX_DEVICES],
            measuring: [const { AtomicBool::new(false) }; MAX_DEVICES],
            nvml: AtomicU8::new(NVML_UNTRIED),
        }
    }

    pub fn book(&self) -> std::sync::MutexGuard<'_, Vec<PoolEntry>> {
        // A panic under the lock leaves plain numbers: still usable.
        self.pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The device a known pool's memory lives on.
    pub fn pool_device(&self, pool: usize) -> Option<u16> {
        self.book()
            .iter()
            .find(|e| e.pool == pool && !e.destroyed)
            .map(|e| e.device)
    }

    /// A fresh [`PoolEntry::serial`].
    pub fn serial(&self) -> u64 {
        self.next_serial.fetch_add(1, Ordering::Relaxed)
    }

    /// Enters a pool made with `cuMemPoolCreate`, on `device` or, for
    /// `exempt`, of host memory.
    pub fn created(&self, pool: usize, device: u16, exempt: bool) {
        let serial = self.serial();
        let mut book = self.book();
        if !book.iter().any(|e| e.pool == pool && !e.destroyed) {
            book.push(PoolEntry::new(pool, serial, device, exempt));
        }
    }

    /// The graph lock (see [`HeldBook::graphs`]).
    pub fn graph_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.graphs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
