//! The [`Engine`]: one process's shim state, owning every part below it
//! (see the module docs of `engine`), and what concerns all of them: the
//! cap of a device worked out once, the background thread's round, exit
//! and fork.

use std::ops::Deref;
use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::{Counting, Settings};

use super::base::Base;
use super::cache::Cache;
use super::driver::Driver;
use super::inflight::InFlight;
use super::records::{Object, Record, Registry, registry};
use super::spill::Spill;
use super::tier::{Handles, Tiers};
use crate::ffi::CUdevice;
use crate::log::log_at;

/// All the state of one process's shim (one per process; a test makes its own).
pub struct Engine<D: Driver> {
    pub(super) base: Base<D>,
    pub(super) cache: Cache,
    pub(super) spill: Spill,
    pub(super) tiers: Tiers,
    /// The program's `cuMemCreate` handles under tiered spill.
    pub(super) handles: Handles,
    /// Live allocations by device address.
    pub(super) table: Registry<Record>,
    /// `cuMemCreate` allocations by handle.
    pub(super) vmm: Registry<Object>,
    /// Arrays and mipmapped arrays by handle.
    pub(super) arrays: Registry<Object>,
    /// VMM mappings by start address: (the counted handle, size).
    pub(super) maps: Registry<(u64, u64)>,
    /// The VMM handles this process exported as POSIX file descriptors
    /// (outside tiered spill).
    pub(super) exports: super::exports::Exports,
    /// Instantiated graphs by handle: how much graph memory their last
    /// launch that grew it added, and their allocation nodes' bytes when
    /// their instantiation was seen (`held.rs`).
    pub(super) graph_growth: Registry<u64>,
    pub(super) graph_size: Registry<u64>,
    /// Allocations in flight, for cap changes (`live.rs`).
    pub(super) inflight: InFlight,
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
            tiers: Tiers::new(settings.spill == vramcap_core::settings::Spill::Tiered),
            handles: Handles::default(),
            table: registry(),
            vmm: registry(),
            arrays: registry(),
            maps: registry(),
            exports: Default::default(),
            graph_growth: registry(),
            graph_size: registry(),
            inflight: InFlight::new(),
        }
    }

    /// The cap of `device` in bytes ([`NO_CAP`] for none), worked out on
    /// first use (which also sets the device's cache bound and, in a group,
    /// joins it). `None` when it cannot be worked out: callers then refuse.
    /// The first call checks that every device key of `VRAMCAP_LIMIT`
    /// names a GPU, before the page or the group is touched, and stops the
    /// process when one does not (`accounting.rs`).
    pub fn limit_of(&'static self, device: CUdevice) -> Option<u64> {
        if !self.limit_keys_match() {
            return None;
        }
        let s = self.slot(device)?;
        if let Some(l) = self.cap_in_force(s, device) {
            return Some(l);
        }
        let l = self.compute_limit(device, s);
        if self.group.configured() {
            // Reclaims dead members, even when this device could not be
            // attached to the group (its allocations are refused then).
            self.start_worker();
        }
        let l = l?;
        let total = self.driver.device_total_mem(device).unwrap_or(0);
        s.total.store(total, Ordering::Relaxed);
        s.budget.set_limit(l);
        s.mark_active();
        let base = if l == NO_CAP { total } else { l };
        self.cache
            .set_bound(device as u16, self.settings.cache.resolve(base));
        if self.settings.counting == Counting::Held {
            // The background thread keeps the context's figure current.
            self.context_measure(device);
        }
        // It also answers `vramcap limit` (which asks only for devices in
        // use, so nothing can be pending for this one yet).
        self.start_worker();
        Some(l)
    }

    /// Starts the background thread if it is not running.
    pub(super) fn start_worker(&'static self) {
        self.worker.ensure(move || self.background_round());
    }

    /// One round of the background thread.
    fn background_round(&'static self) {
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
        self.apply_limit_requests();
        self.follow_group_caps();
        self.cache
            .release_idle(&self.base, self.settings.cache_idle);
        self.spill.reap(&self.base);
        self.tier_round();
        self.held_round();
        self.group.tick();
    }

    /// At normal exit: leave the group and remove the statistics page.
    pub fn at_exit(&self) {
        self.group.leave();
        self.page.remove_at_exit();
    }

    /// In a child after fork, before anything else runs: close the
    /// descriptors whose locks say the parent is alive, unmap the parent's
    /// page, and close the descriptors kept of the parent's exports (each
    /// would hold the parent's memory allocated for the child's life). The
    /// engine is not used again.
    pub fn forget_after_fork(&self) {
        self.page.forget_after_fork();
        self.group.forget_after_fork();
        self.handles.close_kept_after_fork();
        self.exports.close_kept_after_fork();
    }
}
