//! The cap's bookkeeping: per-device budgets (atomics in the statistics
//! page, see `vramcap_core::budget`), the group's budget on top, and the cap
//! of each device, worked out once on first use.
//!
//! A reservation is made before the driver call that allocates (by
//! compare-and-swap: it either fits under the cap or is refused, and two
//! threads can never both take the last bytes), then settled to the size
//! the driver really chose, or given back if the call failed. In a group
//! the process's own budget is reserved first, then the group's; a release
//! goes the other way.

use vramcap_core::budget::{NO_CAP, Refused};
use vramcap_core::limit::Amount;
use vramcap_core::page::DeviceSlot;

use super::base::Base;
use super::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUdevice, CUresult, CUuuid};
use super::driver::Driver;
use crate::log::{log_at, log_once};

impl<D: Driver> Base<D> {
    /// The counters of `device` in the statistics page.
    pub fn slot(&self, device: CUdevice) -> Option<&'static DeviceSlot> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.page.get(self.settings).slots.get(d))
    }

    /// Reserves `bytes` on `device`: in the process's own budget against
    /// `limit` and, in a group, in the group's budget for that GPU.
    pub fn reserve_on(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
        bytes: u64,
        limit: u64,
    ) -> Result<(), Refused> {
        slot.budget.try_reserve(bytes, limit)?;
        if let Err(used) = self.group.reserve(device, bytes) {
            slot.budget.release(bytes);
            return Err(Refused { used, limit });
        }
        Ok(())
    }

    /// Gives `bytes` on `device` back (group first, then the process's own
    /// budget). False when the process's budget held less (a bookkeeping bug).
    pub fn release_on(&self, slot: &DeviceSlot, device: CUdevice, bytes: u64) -> bool {
        self.group.release(device, bytes);
        slot.budget.release(bytes)
    }

    /// [`Base::release_on`] for a device by number, counting one free.
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

    /// Bytes held against the cap of `device`: the group's, in a group.
    pub fn held_on(&self, slot: &DeviceSlot, device: CUdevice) -> u64 {
        self.group
            .used(device)
            .unwrap_or_else(|| slot.budget.used())
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
                self.refused(what, device, actual, r.used, limit);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        } else {
            self.release_on(slot, device, estimate - actual);
        }
        Ok(())
    }

    /// Says why an allocation was refused (once as a warning, then at info).
    pub fn refused(&self, what: &str, device: CUdevice, bytes: u64, used: u64, limit: u64) {
        match self.settings.group.as_deref() {
            Some(g) => log_once!(
                Warn,
                "{what}: refused {bytes} bytes on device {device}: group {g:?} holds {used} of its {limit}-byte budget (VRAMCAP_GROUP, VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
            ),
            None => log_once!(
                Warn,
                "{what}: refused {bytes} bytes on device {device}: {used} of the {limit}-byte cap in use (VRAMCAP_LIMIT); the program sees CUDA_ERROR_OUT_OF_MEMORY"
            ),
        }
        log_at!(
            Info,
            "{what}: refused {bytes} bytes on device {device} ({used} of {limit} in use)"
        );
    }

    /// Works out the cap of `device` in bytes ([`NO_CAP`] for none) and
    /// publishes its UUID in the page. `None` when it cannot be worked out
    /// (the driver would not say how big the device is or what its UUID
    /// is, or the group cannot be used): callers then refuse, keeping the
    /// cap conservative.
    pub fn compute_limit(&self, device: CUdevice, slot: &DeviceSlot) -> Option<u64> {
        let settings = self.settings;
        // In a group, its first member's limit applies (joining happens here).
        let spec = if settings.group.is_some() {
            self.group.spec()?
        } else {
            &settings.limit
        };
        // The UUID is published in the page whenever the driver gives it; it
        // is required only when a UUID entry of the limit must be matched.
        let uuid = self.driver.device_uuid(device);
        if let Ok(bytes) = uuid {
            slot.set_uuid(bytes);
        }
        if spec.is_unlimited() && settings.group.is_none() {
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
        let limit = match spec.amount_for(ordinal, uuid_text) {
            None => NO_CAP,
            Some(Amount::Bytes(b)) => b,
            Some(a @ Amount::Percent(_)) => match self.driver.device_total_mem(device) {
                Ok(total) => a.resolve(total),
                Err(rc) => {
                    log_once!(
                        Error,
                        "cannot read the memory size of device {device} (error {rc}) to apply a percentage limit; refusing its allocations"
                    );
                    return None;
                }
            },
        };
        let limit = match self.group.attach(device, uuid.ok(), limit) {
            Ok(Some(group_limit)) => group_limit,
            Ok(None) => limit,
            Err(()) => return None,
        };
        if limit == NO_CAP {
            log_at!(Info, "device {device}: no cap");
        } else {
            log_at!(Info, "device {device}: cap {limit} bytes");
        }
        Some(limit)
    }
}
