//! The cap's bookkeeping: per-device budgets (atomics in the statistics
//! page, see `vramcap_core::budget`), the group's budget on top, and the cap
//! of each device, worked out once on first use. Whose limit applies, and
//! what happens to keys that name no GPU: `docs/design/accounting.md`.
//!
//! # Invariants
//! - A reservation is made before the driver call that allocates (by
//!   compare-and-swap: it either fits under the cap or is refused, and two
//!   threads can never both take the last bytes), then settled to the size
//!   the driver really chose, or given back if the call failed.
//! - In a group the process's own budget is reserved first, then the
//!   group's; a release goes the other way. A group only makes a cap
//!   stricter.
//! - The files of this folder hold the rest of the accounting: `state` (what
//!   every part stands on), `held` and `ledger`, `records`, `inflight`,
//!   `page`, `group`, `exports`.

pub(super) mod context;
pub(super) mod exports;
pub(super) mod group;
pub(super) mod held;
pub(super) mod inflight;
pub(super) mod ledger;
pub(super) mod page;
pub(super) mod records;
pub(super) mod state;

use std::sync::atomic::Ordering;

use vramcap_core::MAX_DEVICES;
use vramcap_core::budget::NO_CAP;
use vramcap_core::limit::{Amount, Gpu, LIMIT_VAR, LimitSpec};
use vramcap_core::page::{DeviceSlot, uuid_text};
use vramcap_core::settings::{ContextCharge, Counting};

use crate::engine::accounting::ledger::{
    CONTEXT_AGAIN, EAGER_TRIES, NEAR_AGAIN, NEAR_CAP, mono_ns,
};
use crate::engine::accounting::state::Accounting;
use crate::engine::driver::Driver;
use crate::ffi::{CUDA_ERROR_OUT_OF_MEMORY, CUdevice, CUresult, CUuuid};
use crate::log::{log_at, log_once};

/// [`Accounting::keys`]: not checked yet, every key names a GPU, some do not.
const KEYS_UNCHECKED: u8 = 0;
const KEYS_MATCH: u8 = 1;
const KEYS_UNMATCHED: u8 = 2;

/// Why a reservation did not fit, and whose cap refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub used: u64,
    pub limit: u64,
    /// The group's budget refused (the process's own had room).
    pub group: bool,
}

/// Free and total under one cap: total = min(cap, real total); free =
/// min(real free + cached, cap − (held − cached), total): cached blocks
/// are this process's to reuse. Without a cap only the cached bytes are
/// added. [`Accounting::picture`] takes the stricter of the process's and the
/// group's.
pub fn capped_info(total: u64, free: u64, limit: u64, held: u64, cached: u64) -> (u64, u64) {
    let mut f = free.saturating_add(cached).min(total);
    let mut t = total;
    if limit != NO_CAP {
        t = total.min(limit);
        f = f.min(limit.saturating_sub(held.saturating_sub(cached)));
    }
    (t, f.min(t))
}

/// The cap of `device` in a per-device list of caps ([`NO_CAP`] for a
/// device beyond it).
fn cap_of(caps: &[std::sync::atomic::AtomicU64], device: CUdevice) -> u64 {
    usize::try_from(device)
        .ok()
        .and_then(|d| caps.get(d))
        .map_or(NO_CAP, |c| c.load(Ordering::Acquire))
}

impl<D: Driver> Accounting<D> {
    /// The calling thread's current context and its device.
    pub fn current(&self) -> Option<(usize, CUdevice)> {
        let ctx = self.driver.ctx_get_current().ok().filter(|&c| c != 0)?;
        let dev = self.driver.ctx_get_device().ok()?;
        Some((ctx, dev))
    }

    /// The operator's cap of `device` ([`NO_CAP`] for none).
    pub fn operator_cap(&self, device: CUdevice) -> u64 {
        cap_of(&self.operator_caps, device)
    }

    /// Records the operator's cap of `device`: here, and in the page for
    /// readers.
    pub fn set_operator_cap(
        &self,
        slot: &vramcap_core::page::DeviceSlot,
        device: CUdevice,
        cap: u64,
    ) {
        if let Some(c) = usize::try_from(device)
            .ok()
            .and_then(|d| self.operator_caps.get(d))
        {
            c.store(cap, Ordering::Release);
        }
        slot.operator.store(cap, Ordering::Release);
    }

    /// The cap in force on `device` as the page says it, held to the
    /// operator's cap (the page is the user's to write); `None` before it
    /// is worked out.
    pub fn cap_in_force(
        &self,
        slot: &vramcap_core::page::DeviceSlot,
        device: CUdevice,
    ) -> Option<u64> {
        slot.budget
            .limit()
            .map(|l| l.min(self.operator_cap(device)))
    }

    /// The counters of `device` in the statistics page.
    pub fn slot(&self, device: CUdevice) -> Option<&'static DeviceSlot> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.page.get(self.settings).slots.get(d))
    }

    /// The group's cap of `device` ([`NO_CAP`] outside a group or before
    /// the device is attached).
    pub fn group_cap(&self, device: CUdevice) -> u64 {
        cap_of(&self.group_caps, device)
    }

    /// Reserves `bytes` on `device`: in the process's own budget against
    /// `limit` and, in a group, in the group's budget for that GPU (against
    /// the group's cap, kept in the group page).
    pub fn reserve_on(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        bytes: u64,
        limit: u64,
    ) -> Result<(), Refusal> {
        // The cap can change while the process runs (`live.rs`): the word
        // itself decides (held to the operator's cap, whatever the page,
        // which the user can write, says), read again after the
        // reservation so that one made against a cap lowered meanwhile is
        // taken back.
        let limit = self.cap_in_force(slot, device).unwrap_or(limit);
        slot.budget.try_reserve(bytes, limit).map_err(|r| Refusal {
            used: r.used,
            limit: r.limit,
            group: false,
        })?;
        if let Some(now) = self.cap_in_force(slot, device).filter(|&now| now < limit)
            && slot.budget.used() > now
        {
            slot.budget.release(bytes);
            return Err(Refusal {
                used: slot.budget.used(),
                limit: now,
                group: false,
            });
        }
        if let Err(used) = self.group.reserve(device, bytes) {
            slot.budget.release(bytes);
            return Err(Refusal {
                used,
                limit: self.group_cap(device),
                group: true,
            });
        }
        Ok(())
    }

    /// Reserves `bytes` on `device` past any cap, own or group's: what a
    /// parked process held, taken back at its resume when a cap lowered
    /// meanwhile is below those bytes alone (no wait could make the room).
    /// It is then over the cap, as a running process whose cap is lowered
    /// under it, and new allocations are refused until it frees. False
    /// when the group's ledger could not take them (its seat is lost).
    pub fn reserve_over(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64) -> bool {
        if slot.budget.try_reserve(bytes, u64::MAX).is_err() {
            return false;
        }
        if !self.group.take_back(device, bytes) {
            slot.budget.release(bytes);
            return false;
        }
        true
    }

    /// Reserves the `bytes` a resume brings back on `device` under
    /// `limit` (own budget and group). When what the process still holds
    /// itself and those bytes are over the cap that refused them (lowered
    /// since the park), no other process's leaving makes that room: they
    /// are taken back over the cap ([`Accounting::reserve_over`]), said.
    pub fn reserve_to_resume(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        bytes: u64,
        limit: u64,
    ) -> Result<(), Refusal> {
        match self.reserve_on(slot, device, bytes, limit) {
            Ok(()) => Ok(()),
            Err(r)
                if slot.budget.used().saturating_add(bytes) > self.cap_now(device, r)
                    && self.reserve_over(slot, device, bytes) =>
            {
                log_at!(
                    Warn,
                    "device {device}: resuming over the {} cap of {} bytes: the process held {bytes} bytes when it was parked; new allocations are refused until it is under the cap again",
                    if r.group { "group's" } else { "process's" },
                    self.cap_now(device, r)
                );
                Ok(())
            }
            Err(r) => Err(r),
        }
    }

    /// Gives `bytes` on `device` back (group first, then the process's own
    /// budget). False when the process's budget held less (a bookkeeping bug).
    pub fn release_on(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64) -> bool {
        self.group.release(device, bytes);
        slot.budget.release(bytes)
    }

    /// [`Accounting::release_on`] for a device by number, counting one free.
    pub fn give_back(&self, device: u16, bytes: u64) {
        if let Some(s) = self.slot(CUdevice::from(device)) {
            DeviceSlot::add(&s.frees, 1);
            if !self.release_on(s, CUdevice::from(device), bytes) {
                log_once!(
                    Error,
                    "device {device} gave back more bytes than it held; the count is clamped at zero"
                );
            }
        }
    }

    /// (total, free) of `device` as the caps see them, for a device whose
    /// real figures are these: the stricter of the process's own picture
    /// (its cap, the bytes it holds) and, in a group, the group's (the
    /// group's cap, the bytes all members hold). Cached blocks count as
    /// free in both: they are this process's to reuse.
    pub fn picture(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        total: u64,
        free: u64,
    ) -> (u64, u64) {
        let cached = slot.cached.load(Ordering::Relaxed);
        let own = self.cap_in_force(slot, device).unwrap_or(NO_CAP);
        let (mut t, mut f) = capped_info(total, free, own, slot.budget.used(), cached);
        if let Some(used) = self.group.used(device) {
            let (gt, gf) = capped_info(total, free, self.group_cap(device), used, cached);
            (t, f) = (t.min(gt), f.min(gf));
        }
        (t, f)
    }

    /// Settles a reservation of `estimate` to the `actual` size the driver
    /// chose. When the extra bytes do not fit, returns the refusal and leaves
    /// the whole reservation released; the caller frees what it got.
    pub fn settle(
        &self,
        what: &str,
        device: CUdevice,
        slot: &DeviceSlot,
        limit: u64,
        estimate: u64,
        actual: u64,
    ) -> Result<(), CUresult> {
        if actual > estimate {
            if let Err(r) = self.reserve_on(slot, device, actual - estimate, limit) {
                self.release_on(slot, device, estimate);
                DeviceSlot::add(&slot.refusals, 1);
                self.refused(what, device, actual, r);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        } else {
            self.release_on(slot, device, estimate - actual);
        }
        Ok(())
    }

    /// The cap that refused `r` as it is now: the group's read from its
    /// file (a member follows a changed group limit only while running).
    pub fn cap_now(&self, device: CUdevice, r: Refusal) -> u64 {
        match r.group {
            true => self.group.limit_now(device).unwrap_or(r.limit),
            false => r.limit,
        }
    }

    /// Says why an allocation was refused (once as a warning, then at info).
    pub fn refused(&self, what: &str, device: CUdevice, bytes: u64, r: Refusal) {
        let Refusal { used, limit, .. } = r;
        match (r.group, self.settings.group.as_deref()) {
            (true, Some(g)) => log_once!(
                Warn,
                "{what}: refused {bytes} bytes on device {device}: group {g:?} holds {used} of its {limit}-byte budget (VRAMCAP_GROUP, its first member's VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
            ),
            _ => log_once!(
                Warn,
                "{what}: refused {bytes} bytes on device {device}: {used} of the {limit}-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
            ),
        }
        log_at!(
            Info,
            "{what}: refused {bytes} bytes on device {device} ({used} of {limit} in use)"
        );
    }

    /// True when every key of `VRAMCAP_LIMIT` names a GPU (module docs),
    /// checked on the first call; otherwise says so in one line and stops
    /// the process with status 2 (returning false where the driver's
    /// `exit_process` returns, as the tests' fake does: callers then refuse).
    pub fn limit_keys_match(&self) -> bool {
        match self.keys.load(Ordering::Acquire) {
            KEYS_MATCH => return true,
            KEYS_UNMATCHED => return false,
            _ => {}
        }
        let verdict = match self.unmatched_keys() {
            None => KEYS_MATCH,
            Some(line) => {
                crate::log::write_line(format_args!(
                    "{line}; stopping with exit status 2 rather than run without the cap asked for"
                ));
                self.driver.exit_process(2);
                KEYS_UNMATCHED
            }
        };
        // Two threads may both check; they come to the same answer.
        let _ = self.keys.compare_exchange(
            KEYS_UNCHECKED,
            verdict,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        verdict == KEYS_MATCH
    }

    /// The line about the keys of `VRAMCAP_LIMIT` that name no GPU, or
    /// `None` when all do. Allocates only when there are keys.
    fn unmatched_keys(&self) -> Option<String> {
        let spec = &self.settings.limit;
        if spec.entries.is_empty() {
            return None;
        }
        let text = &self.settings.limit_text;
        let count = match self.driver.device_count() {
            Ok(n) => u32::try_from(n).unwrap_or(0),
            Err(rc) => {
                return Some(format!(
                    "{LIMIT_VAR}={text:?} names devices, but the driver will not count its devices to check them (cuDeviceGetCount error {rc}); unset the device keys (e.g. {LIMIT_VAR}=8GiB) or fix the driver"
                ));
            }
        };
        let visible = |names: bool| -> Vec<Gpu> {
            (0..count)
                .map(|i| {
                    let dev = CUdevice::try_from(i).unwrap_or(CUdevice::MAX);
                    Gpu {
                        index: Some(i),
                        uuid: self
                            .driver
                            .device_uuid(dev)
                            .ok()
                            .and_then(|b| uuid_text(&b)),
                        name: names.then(|| self.driver.device_name(dev).ok()).flatten(),
                    }
                })
                .collect()
        };
        let mut gpus = visible(false);
        let Err(first) = spec.check_keys(text, count, &gpus) else {
            return None;
        };
        // Only a UUID key can still name a GPU of the machine that the
        // process does not see: ask NVML for all of them (only now, so a
        // process whose keys match pays nothing for it).
        let mut machine = Vec::new();
        if first.has_uuid_key() {
            machine = self.machine_gpus();
        }
        gpus = visible(true);
        for (uuid, name) in machine {
            if !gpus.iter().any(|g| {
                g.uuid
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(&uuid))
            }) {
                gpus.push(Gpu {
                    index: None,
                    uuid: Some(uuid),
                    name,
                });
            }
        }
        spec.check_keys(text, count, &gpus)
            .err()
            .map(|e| e.to_string())
    }

    /// The GPUs NVML lists (every GPU on the machine), as (UUID, name), or
    /// none without NVML.
    fn machine_gpus(&self) -> Vec<(String, Option<String>)> {
        if !self.driver.nvml_init() {
            return Vec::new();
        }
        let n = self.driver.nvml_device_count().unwrap_or(0);
        let gpus = (0..n)
            .filter_map(|i| self.driver.nvml_device_by_index(i))
            .filter_map(|h| {
                let uuid = self.driver.nvml_device_uuid(h)?;
                Some((uuid, self.driver.nvml_device_name(h)))
            })
            .collect();
        self.driver.nvml_shutdown();
        gpus
    }

    /// The cap `spec` gives `device` (whose UUID the driver gave as `uuid`),
    /// [`NO_CAP`] for none; `None` when it cannot be worked out.
    pub(in crate::engine) fn cap_from(
        &self,
        spec: &LimitSpec,
        device: CUdevice,
        uuid: Result<[u8; 16], CUresult>,
    ) -> Option<u64> {
        if spec.is_unlimited() {
            return Some(NO_CAP);
        }
        let mut text = [0u8; 40];
        let uuid_text = if spec.needs_uuid() {
            let bytes = match uuid {
                Ok(b) => b,
                Err(rc) => {
                    log_once!(
                        Error,
                        "cannot read the UUID of device {device} (error {rc}) to match VRAMCAP_LIMIT; refusing its allocations"
                    );
                    return None;
                }
            };
            CUuuid { bytes }.write_canonical(&mut text);
            // The canonical form is ASCII by construction.
            std::str::from_utf8(&text).ok()
        } else {
            None
        };
        let ordinal = u32::try_from(device).ok()?;
        match spec.amount_for(ordinal, uuid_text) {
            None => Some(NO_CAP),
            Some(Amount::Bytes(b)) => Some(b),
            Some(a @ Amount::Percent(_)) => match self.driver.device_total_mem(device) {
                Ok(total) => Some(a.resolve(total)),
                Err(rc) => {
                    log_once!(
                        Error,
                        "cannot read the memory size of device {device} (error {rc}) to apply a percentage limit; refusing its allocations"
                    );
                    None
                }
            },
        }
    }

    /// Works out the cap of `device` in bytes ([`NO_CAP`] for none): the
    /// process's own `VRAMCAP_LIMIT`, made stricter by its group's (module
    /// docs); records the group's in [`Accounting::group_caps`] and publishes the
    /// UUID in the page. `None` when it cannot be worked out (the driver
    /// would not say how big the device is or what its UUID is, or the
    /// group cannot be used): callers then refuse, keeping the cap
    /// conservative.
    pub fn compute_limit(&self, device: CUdevice, slot: &DeviceSlot) -> Option<u64> {
        let settings = self.settings;
        // The UUID is published in the page whenever the driver gives it; it
        // is required only when a UUID entry of a limit must be matched.
        let uuid = self.driver.device_uuid(device);
        if let Ok(bytes) = uuid {
            slot.set_uuid(bytes);
        }
        let mut own = self.cap_from(&settings.limit, device, uuid)?;
        if let Some(nvidia) = settings.nvidia_limit {
            own = own.min(nvidia);
        }
        let operator = match &settings.operator {
            Some(spec) => self.cap_from(spec, device, uuid)?,
            None => NO_CAP,
        };
        own = own.min(operator);
        self.set_operator_cap(slot, device, operator);
        slot.own.store(own, Ordering::Release);
        slot.ceiling.store(own, Ordering::Release);
        if !settings.soft.is_unlimited() {
            // A soft limit that cannot be worked out is none: it only
            // trims and prefers spill, it never refuses.
            let soft = self
                .cap_from(&settings.soft, device, uuid)
                .unwrap_or(NO_CAP);
            if soft != NO_CAP {
                slot.soft.store(soft.max(1), Ordering::Release);
            }
        }
        let mut limit = own;
        if settings.group.is_some() {
            // Joining happens here; the group's limit is its first member's.
            let spec = self.group.spec()?;
            let claim = self.cap_from(spec, device, uuid)?;
            let group = match self.group.attach(device, uuid.ok(), claim) {
                Ok(Some(g)) => g,
                Ok(None) => NO_CAP,
                Err(()) => return None,
            };
            if let Some(c) = usize::try_from(device)
                .ok()
                .and_then(|d| self.group_caps.get(d))
            {
                c.store(group, Ordering::Release);
            }
            limit = own.min(group);
            let bytes = |c: u64| if c == NO_CAP { None } else { Some(c) };
            log_at!(
                Info,
                "device {device}: own cap {:?} bytes, the group's {:?} (None: no cap)",
                bytes(own),
                bytes(group)
            );
        }
        if limit == NO_CAP {
            log_at!(Info, "device {device}: no cap");
        } else {
            log_at!(Info, "device {device}: cap {limit} bytes");
        }
        Some(limit)
    }

    /// Before an allocation of `estimate` on `device`: measures the context
    /// when it never was (the device's first allocation with a context),
    /// and again when the allocation would bring the process within
    /// [`NEAR_CAP`] of its cap (at most every [`NEAR_AGAIN`]), so that a
    /// footprint grown since (modules loaded at a kernel's first launch)
    /// is charged before the last bytes are granted.
    pub fn context_check(&self, device: CUdevice, slot: &DeviceSlot, estimate: u64, limit: u64) {
        if self.settings.counting != Counting::Held {
            return;
        }
        let i = usize::try_from(device).unwrap_or(0) % MAX_DEVICES;
        let last = self.held.measured_ns[i].load(Ordering::Relaxed);
        let due = if last == 0 {
            // No real figure yet: each of the first allocations tries.
            self.held.tries[i].load(Ordering::Relaxed) < EAGER_TRIES
                || mono_ns().saturating_sub(self.held.tried_ns[i].load(Ordering::Relaxed))
                    >= CONTEXT_AGAIN.as_nanos() as u64
        } else {
            self.settings.context == ContextCharge::Auto
                && limit != NO_CAP
                && slot
                    .budget
                    .used()
                    .saturating_add(estimate)
                    .saturating_add(NEAR_CAP)
                    > limit
                && mono_ns().saturating_sub(last) >= NEAR_AGAIN.as_nanos() as u64
        };
        if due {
            self.context_measure(device);
        }
    }
}
