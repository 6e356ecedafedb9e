//! The engine: everything the shim decides, in plain Rust. It knows no
//! exports, no `dlsym` and no function-pointer tables: the boundary layer
//! calls one of its handlers per hooked driver function, passing the
//! caller's arguments and a closure that makes the real call; every other
//! driver function it needs comes through the [`Driver`] trait. Its unit
//! tests (`tests.rs`) run it against a fake driver.
//!
//! # Parts, bottom up (no module imports one above it)
//! - `cuda`, `driver`, `records`, `worker`: types, the driver trait, the
//!   records of live allocations, the background thread.
//! - `page`, `group`: the statistics page and the group membership.
//! - `base` (+ `accounting`): what every part stands on, and the budgets.
//! - `cache`, `spill`: the freed-block cache and spill to host memory.
//! - this module: the [`Engine`], which owns all of the above.
//! - the handlers, by family: `alloc` (plain, pitched and managed memory,
//!   frees, memory queries), `pools` (stream-ordered), `vmm`, `arrays`,
//!   `lifecycle` (contexts, captures, IPC), `nvml`.
//!
//! # Concurrency
//! - Budgets, counters, the capture count and every lazily made pointer are
//!   atomics. A reservation is a compare-and-swap under the cap.
//! - Locks: the record maps' shard locks (`records`), one mutex per device
//!   cache (`cache`), the spill's deferred-free list (`spill`). Each is
//!   held for a map or list operation only, never across a driver call,
//!   `dlopen` or `dlsym`, and never two at once: there is no lock order.
//! - What allocates: making the engine (first hook), the page and the group
//!   membership (first use of a device), record inserts, keeping a cached
//!   block, deferring a free, NVML's UUID text. Logging never allocates.
//! - `fork`: the boundary's child handler closes the inherited page and
//!   group descriptors ([`Engine::forget_after_fork`]) and drops the engine
//!   from use without touching its maps or locks (a parent thread may have
//!   held one at the fork); the child's first hook makes a fresh engine,
//!   with a page and membership of its own. Settings are kept.
//! - Killed at any instruction: the page and group files hold only atomics
//!   and are published complete (temporary file, then rename or link); a
//!   dead process's liveness locks go with it.

pub mod cuda;
pub mod driver;

mod accounting;
mod alloc;
mod arrays;
mod base;
mod cache;
mod group;
mod lifecycle;
mod nvml;
mod page;
mod pools;
mod records;
mod spill;
mod vmm;
mod worker;

#[cfg(test)]
mod tests;

use std::ops::Deref;
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Settings;

pub use self::base::Base;
use self::cache::Cache;
use self::cuda::CUdevice;
pub use self::driver::{Driver, Flavour};
use self::records::{Object, Record, Registry, registry};
use self::spill::Spill;
use crate::log::log_at;

pub use self::worker::reset_after_fork as reset_worker_after_fork;

/// All the state of one process's shim (one per process; a test makes its own).
pub struct Engine<D: Driver> {
    base: Base<D>,
    cache: Cache,
    spill: Spill,
    /// Live allocations by device address.
    table: Registry<Record>,
    /// `cuMemCreate` allocations by handle.
    vmm: Registry<Object>,
    /// Arrays and mipmapped arrays by handle.
    arrays: Registry<Object>,
    /// VMM mappings by start address: (the counted handle, size).
    maps: Registry<(u64, u64)>,
    /// POSIX file descriptors this process exported VMM handles as, by fd.
    exports: Registry<u64>,
}

impl<D: Driver> Deref for Engine<D> {
    type Target = Base<D>;
    fn deref(&self) -> &Base<D> {
        &self.base
    }
}

impl<D: Driver> Engine<D> {
    pub fn new(driver: D, settings: &'static Settings) -> Engine<D> {
        Engine {
            base: Base::new(driver, settings),
            cache: Cache::new(),
            spill: Spill::new(),
            table: registry(),
            vmm: registry(),
            arrays: registry(),
            maps: registry(),
            exports: registry(),
        }
    }

    /// The cap of `device` in bytes ([`NO_CAP`] for none), worked out on
    /// first use (which also sets the device's cache bound and, in a group,
    /// joins it). `None` when it cannot be worked out: callers then refuse.
    pub fn limit_of(&'static self, device: CUdevice) -> Option<u64> {
        let s = self.slot(device)?;
        if let Some(l) = s.budget.limit() {
            return Some(l);
        }
        let l = self.compute_limit(device, s)?;
        s.budget.set_limit(l);
        s.mark_active();
        let base = if l == NO_CAP {
            self.driver.device_total_mem(device).unwrap_or(0)
        } else {
            l
        };
        self.cache
            .set_bound(device as u16, self.settings.cache.resolve(base));
        if self.group.configured() {
            self.start_worker(); // reclaims dead members
        }
        Some(l)
    }

    /// Starts the background thread if it is not running.
    fn start_worker(&'static self) {
        self.worker.ensure(move || self.background_round());
    }

    /// One round of the background thread.
    fn background_round(&self) {
        if self.capturing() {
            // Frees from this thread could invalidate the capture: wait.
            return;
        }
        let page = self.page.get(self.settings);
        let asked = page.header.trim_requests.load(Ordering::Acquire);
        if asked != page.header.trim_acks.load(Ordering::Acquire) {
            let bytes = self.cache.trim_all(&self.base);
            for s in page.slots.iter() {
                if s.flags.load(Ordering::Relaxed) != 0 {
                    DeviceSlot::add(&s.trims, 1);
                }
            }
            page.header.trim_acks.store(asked, Ordering::Release);
            log_at!(Info, "trim: released {bytes} cached bytes");
        }
        self.cache
            .release_idle(&self.base, self.settings.cache_idle);
        self.spill.reap(&self.base);
        self.group.tick();
    }

    /// At normal exit: leave the group and remove the statistics page.
    pub fn at_exit(&self) {
        self.group.leave();
        self.page.remove_at_exit();
    }

    /// In a child after fork, before anything else runs: close the
    /// descriptors whose locks say the parent is alive and unmap the
    /// parent's page. The engine is not used again.
    pub fn forget_after_fork(&self) {
        self.page.forget_after_fork();
        self.group.forget_after_fork();
    }
}
