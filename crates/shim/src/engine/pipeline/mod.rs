//! The allocation pipeline: the one place that says in what order an
//! allocation asks the engine's parts, for every allocating family
//! (plain, pitched and managed memory in `handlers/alloc.rs`, pools,
//! graphs, tiered spill's blocks through [`Engine::try_reserve_evicting`]).
//!
//! A call passes parking's gate at the boundary first (`process/gate.rs`,
//! one load when parking is off), then [`Engine::capped_alloc`]:
//! 0. the device's slot and cap, worked out once for the call
//!    ([`Engine::cap_of_call`]; the first time per device also the cache
//!    bound, the group, the background thread);
//! 1. place under tiered spill, when on ([`Engine::tiered_alloc`]);
//! 2. reuse a cached block when the request may have one (a hit costs no
//!    driver allocation and no reservation: its bytes are still reserved);
//! 3. spill past the soft limit, when on;
//! 4. reserve the estimate on the device's budget (and the group's), making
//!    room when the cap would refuse: the cache evicts, pools and graphs
//!    are reclaimed once, then parking's policy may park an idle member
//!    (at most `POLICY_ROUNDS` rounds) ([`Engine::reserve_evicting_at`]);
//!    past the cap: spill, if on, else refuse with out-of-memory;
//! 5. call the driver, once more after releasing the cache if the driver
//!    itself is out of memory, then parking's policy on a full GPU
//!    ([`Engine::call_with_retry`]);
//! 6. settle the reservation to the size the driver chose, and record it.
//!
//! Frees go the other way in `handlers/free.rs`: forget the record, then
//! keep the block in the cache or release it to the driver and the budget.

mod tiered;

use std::sync::atomic::Ordering;

use vramcap_core::budget::NO_CAP;
use vramcap_core::cache::{Shape, Want};
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Counting;

use crate::engine::Engine;
use crate::engine::accounting::Refusal;
use crate::engine::accounting::records::{Kind, Record};
use crate::engine::driver::{Driver, unless_oom};
use crate::engine::park::policy::POLICY_ROUNDS;
use crate::ffi::*;
use crate::log::{log_at, log_once};

/// What an allocation answers: its address, and for a pitched one its
/// pitch (0 otherwise). The boundary writes them to the caller's pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Made {
    pub ptr: CUdeviceptr,
    pub pitch: u64,
}

impl Made {
    /// An address with no pitch.
    pub fn at(ptr: CUdeviceptr) -> Made {
        Made { ptr, pitch: 0 }
    }
}

/// What an allocating handler asks for.
#[derive(Clone, Copy)]
pub enum Request {
    Plain,
    Pitch {
        width: u64,
        height: u64,
        elem: u32,
    },
    /// Managed memory (`cuMemAllocManaged`): never spilled.
    Managed,
    /// Stream-ordered, charged by size (`Kind::Async(None)`).
    Async,
}

impl<D: Driver> Engine<D> {
    /// The cap of `device` in bytes ([`NO_CAP`] for none), worked out on
    /// first use (which also sets the device's cache bound and, in a group,
    /// joins it). `None` when it cannot be worked out: callers then refuse.
    /// The first call checks that every device key of `VRAMCAP_LIMIT`
    /// names a GPU, before the page or the group is touched, and stops the
    /// process when one does not (`accounting.rs`).
    pub fn limit_of(&'static self, device: CUdevice) -> Option<u64> {
        self.cap_of_call(device).map(|(_, l)| l)
    }

    /// [`Engine::limit_of`] with the device's page slot: what one call
    /// works out once and hands down (the cache, the reservation, the
    /// settling all use them).
    pub(in crate::engine) fn cap_of_call(
        &'static self,
        device: CUdevice,
    ) -> Option<(&'static DeviceSlot, u64)> {
        if !self.accounting.limit_keys_match() {
            return None;
        }
        let s = self.accounting.slot(device)?;
        if let Some(l) = self.accounting.cap_in_force(s, device) {
            return Some((s, l));
        }
        let l = self.accounting.compute_limit(device, s);
        if self.accounting.group().configured() {
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
            self.accounting.context_measure(device);
        }
        // It also answers `vramcap limit` (which asks only for devices in
        // use, so nothing can be pending for this one yet).
        self.start_worker();
        Some((s, l))
    }

    /// Reserves `estimate` bytes on `device`, releasing cached blocks of the
    /// device when the cap would refuse, then what pools retain
    /// ([`Accounting::reclaim`](crate::engine::accounting::state::Accounting::reclaim)).
    pub(in crate::engine) fn try_reserve_evicting(
        &'static self,
        device: CUdevice,
        estimate: u64,
    ) -> Result<(&'static DeviceSlot, u64), Option<Refusal>> {
        if self.accounting.slot(device).is_none() {
            log_once!(
                Error,
                "device {device} is beyond the {} devices vramcap tracks; refusing its allocations",
                vramcap_core::MAX_DEVICES
            );
            return Err(None);
        }
        let Some((slot, limit)) = self.cap_of_call(device) else {
            return Err(None);
        };
        self.reserve_evicting_at(slot, limit, device, estimate)
    }

    /// [`Engine::try_reserve_evicting`] with the slot and cap the call
    /// worked out already ([`Engine::cap_of_call`]).
    pub(in crate::engine) fn reserve_evicting_at(
        &'static self,
        slot: &'static DeviceSlot,
        limit: u64,
        device: CUdevice,
        estimate: u64,
    ) -> Result<(&'static DeviceSlot, u64), Option<Refusal>> {
        // The cap word as it is now (one load): a change made since the
        // call began (`vramcap limit`, the program, the group) counts here
        // as it did when the cap was worked out again at this step.
        let limit = self.accounting.cap_in_force(slot, device).unwrap_or(limit);
        self.accounting.context_check(device, slot, estimate, limit);
        let mut reclaimed = false;
        // Rounds of parking's policy this call may take: a member that
        // says it parked but made no room (a forged page, a race) costs
        // a bounded number of tries, never a loop.
        let mut rounds = POLICY_ROUNDS;
        loop {
            match self.accounting.reserve_on(slot, device, estimate, limit) {
                Ok(()) => {
                    self.past_soft(slot, device, estimate);
                    return Ok((slot, limit));
                }
                Err(r) => {
                    let need = r.used.saturating_add(estimate).saturating_sub(r.limit);
                    if self.cache.evict(&self.accounting, device as u16, need) > 0 {
                        continue;
                    }
                    // Once per call: pools trimmed as a synchronisation
                    // would, pools, graphs and the context read again.
                    if reclaimed || self.accounting.reclaim(device) == 0 {
                        // Parking's policy: an idle group member parked
                        // makes room (`park/policy.rs`).
                        if r.group
                            && rounds > 0
                            && self.with_parking(|p| p.park_for_room(device, need, estimate))
                        {
                            rounds -= 1;
                            continue;
                        }
                        return Err(Some(r));
                    }
                    reclaimed = true;
                }
            }
        }
    }

    /// After a reservation of `bytes`: above the soft limit the cache gives
    /// back what passes it, and going above it counts one event.
    pub(in crate::engine) fn past_soft(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64) {
        let soft = slot.soft.load(std::sync::atomic::Ordering::Relaxed);
        if soft == 0 {
            return;
        }
        let used = slot.budget.used();
        if used <= soft {
            return;
        }
        if used.saturating_sub(bytes) <= soft {
            DeviceSlot::add(&slot.soft_events, 1);
            log_once!(
                Info,
                "device {device}: above the soft limit of {soft} bytes (VRAMCAP_SOFT_LIMIT): the cache gives back what passes it{}",
                if self.settings.spill == vramcap_core::settings::Spill::Off {
                    ""
                } else {
                    ", and allocations past it spill"
                }
            );
        }
        self.cache
            .evict(&self.accounting, device as u16, used - soft);
    }

    /// Counts and logs a refusal; the out-of-memory code to return.
    pub(in crate::engine) fn refuse(
        &self,
        what: &str,
        device: CUdevice,
        bytes: u64,
        why: Option<Refusal>,
    ) -> CUresult {
        if let (Some(s), Some(r)) = (self.accounting.slot(device), why) {
            DeviceSlot::add(&s.refusals, 1);
            self.accounting.refused(what, device, bytes, r);
        }
        CUDA_ERROR_OUT_OF_MEMORY
    }

    /// [`Engine::try_reserve_evicting`], refusing with out-of-memory when it
    /// does not fit.
    pub(in crate::engine) fn reserve(
        &'static self,
        what: &str,
        device: CUdevice,
        estimate: u64,
    ) -> Result<(&'static DeviceSlot, u64), CUresult> {
        self.try_reserve_evicting(device, estimate)
            .map_err(|why| self.refuse(what, device, estimate, why))
    }

    /// Runs a driver allocation, once more after releasing the device's
    /// cache when the driver itself is out of memory with blocks parked
    /// there; then, with the GPU still full, parking's policy may park an
    /// idle process on it and try again (`park/policy.rs`); `bytes`: what
    /// the call asks for.
    pub(in crate::engine) fn call_with_retry<T>(
        &'static self,
        device: CUdevice,
        bytes: u64,
        mut alloc: impl FnMut() -> Result<T, CUresult>,
    ) -> Result<T, CUresult> {
        match alloc() {
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                if self.cache.evict(&self.accounting, device as u16, u64::MAX) > 0
                    && let Some(r) = unless_oom(alloc())
                {
                    return r;
                }
                self.with_parking(|p| p.park_for_gpu_room(device, bytes, alloc))
            }
            r => r,
        }
    }

    /// The allocation path shared by the handlers that return a device
    /// address (module docs). `target` is the (context, device) the memory
    /// comes from; `None` (no current context) passes the call to the
    /// driver unchanged. `alloc` makes the real call and answers what it
    /// made; `actual` is the bytes the driver chose for it.
    pub(in crate::engine) fn capped_alloc(
        &'static self,
        what: &'static str,
        estimate: u64,
        request: Request,
        target: Option<(usize, CUdevice)>,
        mut alloc: impl FnMut() -> Result<Made, CUresult>,
        actual: impl FnOnce(Made) -> u64,
    ) -> Result<Made, CUresult> {
        if estimate == 0 {
            return alloc();
        }
        let Some((ctx, device)) = target else {
            // No current context: the driver's own answer, whatever it is.
            return alloc();
        };
        let dev16 = device as u16;
        // Worked out once for the call (the first time, it also sets the
        // device's cache bound).
        let Some((slot, limit)) = self.cap_of_call(device) else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        if matches!(request, Request::Plain)
            && self.tiers.on()
            && let Some(made) = self.tiered_alloc(what, estimate, ctx, device)
        {
            return made;
        }
        let want = match request {
            Request::Plain => Some(Want::Plain { bytes: estimate }),
            Request::Pitch {
                width,
                height,
                elem,
                ..
            } => Some(Want::Pitch {
                width,
                height,
                elem,
            }),
            Request::Managed | Request::Async => None,
        };
        if let Some(want) = want.filter(|_| self.cache.caching(dev16)) {
            if let Some(b) = self
                .cache
                .reuse(self.driver, &self.accounting, dev16, ctx, want)
            {
                let pitch = match (request, b.shape) {
                    (Request::Pitch { .. }, Shape::Pitch { pitch, .. }) => pitch,
                    _ => 0,
                };
                slot.cached
                    .fetch_sub(b.bytes, std::sync::atomic::Ordering::Relaxed);
                DeviceSlot::add(&slot.cache_hits, 1);
                DeviceSlot::add(&slot.allocs, 1);
                self.insert(
                    b.ptr,
                    Record {
                        device: dev16,
                        exported: false,
                        bytes: b.bytes,
                        ctx,
                        kind: Kind::Device(b.shape),
                    },
                );
                log_at!(
                    Debug,
                    "{what}: {} bytes at {:#x} on device {device} from the cache",
                    b.bytes,
                    b.ptr
                );
                return Ok(Made { ptr: b.ptr, pitch });
            }
            DeviceSlot::add(&slot.cache_misses, 1);
        }

        if let Some(made) = self.spill_past_soft(what, estimate, request, ctx, device) {
            return made;
        }
        // Counted in flight until the driver call is settled (`live.rs`).
        let _inflight = self.inflight.enter();
        let (slot, limit) = match self.reserve_evicting_at(slot, limit, device, estimate) {
            Ok(x) => x,
            Err(why) => {
                return self.spill_or_refuse(what, estimate, request, ctx, device, why);
            }
        };
        let made = match self.call_with_retry(device, estimate, alloc) {
            Ok(m) => m,
            Err(rc) => {
                self.accounting.release_on(slot, device, estimate);
                return Err(rc);
            }
        };
        let ptr = made.ptr;
        let bytes = actual(made);
        if let Err(rc) = self
            .accounting
            .settle(what, device, slot, limit, estimate, bytes)
        {
            let _ = self.driver.mem_free(ptr);
            return Err(rc);
        }
        DeviceSlot::add(&slot.allocs, 1);
        let kind = match request {
            Request::Plain => Kind::Device(Shape::Plain),
            Request::Pitch {
                width,
                height,
                elem,
            } => Kind::Device(Shape::Pitch {
                width,
                height,
                elem,
                pitch: made.pitch,
            }),
            Request::Managed => Kind::Managed,
            Request::Async => Kind::Async(None),
        };
        self.insert(
            ptr,
            Record {
                device: dev16,
                exported: false,
                bytes,
                ctx,
                kind,
            },
        );
        log_at!(
            Debug,
            "{what}: {bytes} bytes at {ptr:#x} on device {device}"
        );
        Ok(made)
    }

    /// Past the cap: spill, if on, else refuse.
    pub(in crate::engine) fn spill_or_refuse(
        &self,
        what: &'static str,
        estimate: u64,
        request: Request,
        ctx: usize,
        device: CUdevice,
        why: Option<Refusal>,
    ) -> Result<Made, CUresult> {
        let bytes = match request {
            Request::Pitch { width, height, .. } => {
                width.next_multiple_of(512).saturating_mul(height)
            }
            _ => estimate,
        };
        let managed = matches!(request, Request::Managed);
        if managed && why.is_some() && self.settings.spill != vramcap_core::settings::Spill::Off {
            // Managed memory in host memory is memory the program could
            // move onto the GPU past the cap (docs/design/spill-modes.md).
            log_once!(
                Warn,
                "{what}: managed memory past the cap is not spilled (the program could move it onto the GPU); refusing"
            );
        }
        if why.is_some()
            && !managed
            && let Some((ptr, record)) = self.spill.place(
                self.driver,
                &self.accounting,
                (what, false),
                (device, ctx),
                bytes,
            )
        {
            let pitch = match request {
                Request::Pitch { width, .. } => width.next_multiple_of(512),
                _ => 0,
            };
            self.insert(ptr, record);
            return Ok(Made { ptr, pitch });
        }
        Err(self.refuse(what, device, estimate, why))
    }

    /// Records a live allocation. An address the engine still thought live
    /// was released behind its back: its old record is settled first.
    pub(in crate::engine) fn insert(&self, ptr: CUdeviceptr, record: Record) {
        if let Some(stale) = self.table.insert(ptr, record) {
            if stale.kind == Kind::Tiered {
                self.tier_drop_stale(ptr, &stale);
            } else if matches!(stale.kind, Kind::SpillHost(_)) {
                self.spill.forget(&self.accounting, &stale);
            } else if let Kind::Async(Some(serial)) = stale.kind {
                self.accounting.pool_freed(serial);
            } else if let Some(s) = self.accounting.slot(CUdevice::from(stale.device)) {
                self.accounting
                    .release_on(s, CUdevice::from(stale.device), stale.bytes);
            }
            log_once!(
                Warn,
                "address {ptr:#x} was reused by the driver while vramcap still counted it; counting it once"
            );
        }
    }

    /// With spill on, an allocation that would take the process above its
    /// soft limit goes to host memory first; `None` when it does not (no
    /// soft limit, below it, or spill could not place it).
    pub(in crate::engine) fn spill_past_soft(
        &self,
        what: &'static str,
        estimate: u64,
        request: Request,
        ctx: usize,
        device: CUdevice,
    ) -> Option<Result<Made, CUresult>> {
        // Managed memory is never spilled (docs/design/spill-modes.md).
        if self.settings.spill == vramcap_core::settings::Spill::Off
            || matches!(request, Request::Pitch { .. } | Request::Managed)
        {
            return None;
        }
        let slot = self.accounting.slot(device)?;
        let soft = slot.soft.load(std::sync::atomic::Ordering::Relaxed);
        if soft == 0 || slot.budget.used().saturating_add(estimate) <= soft {
            return None;
        }
        let (ptr, record) = self.spill.place(
            self.driver,
            &self.accounting,
            (what, true),
            (device, ctx),
            estimate,
        )?;
        self.insert(ptr, record);
        Some(Ok(Made::at(ptr)))
    }
}
