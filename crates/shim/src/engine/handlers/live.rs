//! Caps that change while the program runs: from outside (`vramcap limit`
//! writes a slot's `requested` word and raises the header's
//! `limit_requests`; the background thread applies it within a tick and
//! acknowledges) and from inside (the C ABI of `boundary/abi.rs`, which
//! calls [`Engine::set_limit_from_program`]).
//!
//! A change sets the process's own cap (`slot.own`); the cap in force
//! (`slot.budget`'s limit) is it made stricter by the group's. The cap word
//! decides every reservation, read again after it (`accounting.rs`), so a
//! reservation made against a cap lowered at the same moment is taken
//! back; and a change is acknowledged only once every allocation that may
//! have read the old cap has finished its driver call ([`InFlight`](crate::engine::accounting::inflight::InFlight)): from
//! the acknowledgement on, no allocation takes the driver past the new cap.
//! What the process holds already is not touched: lowered below it, the
//! shim gives back cached blocks, and new allocations spill (with spill on)
//! or are refused until the process is under the new cap again.
//!
//! Who may raise: from outside, anyone who may write the page (its owner,
//! or root); from inside, up to the cap the process started with
//! (`slot.ceiling`, what its operator set), never above.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use vramcap_core::MAX_DEVICES;
use vramcap_core::budget::NO_CAP;
use vramcap_core::mailbox::Mailbox;
use vramcap_core::page::DeviceSlot;

use crate::engine::Engine;
use crate::engine::driver::Driver;
use crate::ffi::CUdevice;
use crate::log::{log_at, log_once};

/// `-EINVAL`, `-ENODEV`, `-EPERM` as the C ABI answers them.
pub const EINVAL: c_int = -libc::EINVAL;
pub const ENODEV: c_int = -libc::ENODEV;
const EPERM: c_int = -libc::EPERM;

impl<D: Driver> Engine<D> {
    /// Sets the own cap of `device` (resolved) to `own` ([`NO_CAP`]: none)
    /// and says what it did; (old, new) caps in force, or `None` when the
    /// device's cap is not worked out yet. Returns only once no allocation
    /// granted under the old cap is still in flight
    /// ([`InFlight`](crate::engine::accounting::inflight::InFlight)). Never called from inside
    /// an allocation: it may wait for them.
    pub fn set_own_limit(&self, device: CUdevice, own: u64) -> Option<(u64, u64)> {
        self.change_own_limit(device, |_| own)
    }

    /// [`Engine::set_own_limit`] to `own(the own cap now)`, read and
    /// stored under the lock that serialises changes: two changes at once
    /// (`vramcap limit`, the program, a group's new limit) never lose one.
    pub fn change_own_limit(
        &self,
        device: CUdevice,
        own: impl FnOnce(u64) -> u64,
    ) -> Option<(u64, u64)> {
        let s = self.accounting.slot(device)?;
        let _one = self.inflight.changing();
        let old = s.budget.limit()?;
        // Never past the operator's cap, whoever asks; asked for more, the
        // file is read again (root may have raised it since).
        let mut operator = self.accounting.operator_cap(device);
        let asked = own(s.own.load(Ordering::Acquire));
        if asked > operator {
            operator = self.operator_cap_again(device).unwrap_or(operator);
            self.accounting.set_operator_cap(s, device, operator);
        }
        let shown = |b: u64| {
            if b == NO_CAP {
                "none".to_string()
            } else {
                format!("{b} bytes")
            }
        };
        let own = asked.min(operator);
        if own < asked {
            log_at!(
                Warn,
                "device {device}: a cap of {} asked for is above the operator's cap of {operator} bytes ({}): that applies",
                shown(asked),
                vramcap_core::settings::OPERATOR_LIMIT_PATH
            );
        }
        let new = own.min(self.accounting.group_cap(device)).max(1);
        if new != NO_CAP {
            // Before the cap takes effect: from here on the loader's
            // guards (RTLD_DEEPBIND, dlmopen, another copy of the driver)
            // hold as for a cap set at start.
            crate::engine::CAPPED_WHILE_RUNNING.store(true, Ordering::SeqCst);
        }
        s.own.store(own, Ordering::Release);
        s.budget.set_limit(new);
        self.inflight.drain();
        DeviceSlot::add(&s.limit_changes, 1);
        let total = s.total.load(Ordering::Relaxed);
        let base = if new == NO_CAP { total } else { new };
        self.cache
            .set_bound(device as u16, self.settings.cache.resolve(base));
        let used = s.budget.used();
        if used > new {
            self.cache
                .evict(&self.accounting, device as u16, used - new);
        }
        let used = s.budget.used();
        log_at!(
            Info,
            "device {device}: cap changed from {} to {}",
            shown(old),
            shown(new)
        );
        if used > new {
            log_once!(
                Warn,
                "device {device}: the cap is now {new} bytes and the process holds {used}, {} over: new allocations are refused until it frees",
                used - new
            );
        }
        Some((old, new))
    }

    /// The operator's cap of `device` as its file says now; `None` when the
    /// file is gone or unusable (the cap in force then stays: only the
    /// file, which only root writes, may raise it).
    fn operator_cap_again(&self, device: CUdevice) -> Option<u64> {
        use vramcap_core::settings::{OPERATOR_LIMIT_PATH, read_operator_limit};
        match read_operator_limit(std::path::Path::new(OPERATOR_LIMIT_PATH)) {
            Ok(Some(spec)) => {
                self.accounting
                    .cap_from(&spec, device, self.driver.device_uuid(device))
            }
            Ok(None) | Err(_) => {
                log_once!(
                    Warn,
                    "{OPERATOR_LIMIT_PATH} is gone or no longer usable: the operator's cap read at start stays"
                );
                None
            }
        }
    }

    /// The background thread's part: applies what `vramcap limit` asked
    /// for, then acknowledges (it asks only for devices in use).
    pub(in crate::engine) fn apply_limit_requests(&self) {
        let page = self.accounting.page().get(self.settings);
        let mailbox = Mailbox::limit(&page.header);
        let Some(asked) = mailbox.pending() else {
            return;
        };
        for (i, s) in page.slots.iter().enumerate() {
            if s.budget.limit().is_none() {
                continue;
            }
            let want = s.requested.swap(0, Ordering::AcqRel);
            if want != 0 {
                self.set_own_limit(i as CUdevice, want);
            }
        }
        mailbox.answer(asked);
    }

    /// The background thread's part for a group: a group limit changed
    /// (`vramcap limit --group`) becomes this member's cap in force on that
    /// GPU (its own, made stricter by the group's new one). The group's
    /// budget itself follows at once: every reservation reads its limit.
    pub(in crate::engine) fn follow_group_caps(&self) {
        if !self.accounting.group().configured() {
            return;
        }
        for (i, cap) in self.accounting.group_caps().iter().enumerate() {
            let device = i as CUdevice;
            let Some(now) = self.accounting.group().limit_now(device) else {
                continue;
            };
            if cap.swap(now, Ordering::AcqRel) != now {
                // The own cap as it is when the change runs (read under
                // its lock), made stricter by the group's new one.
                self.change_own_limit(device, |own| own);
            }
        }
    }

    /// `vramcap_set_limit(device, bytes)`: `bytes` the new cap
    /// (`UINT64_MAX`: none), for `device` or, for -1, every device the
    /// process uses. 0 or a negative errno: `-EINVAL` for zero bytes or a
    /// device below -1, `-ENODEV` for a device it cannot use (or none used
    /// yet, for -1), `-EPERM` for a cap above the one it started with.
    pub fn set_limit_from_program(&'static self, device: c_int, bytes: u64) -> c_int {
        if bytes == 0 || device < -1 {
            return EINVAL;
        }
        let devices: Vec<CUdevice> = if device == -1 {
            let page = self.accounting.page().get(self.settings);
            (0..MAX_DEVICES)
                .filter(|&i| page.slots[i].budget.limit().is_some())
                .map(|i| i as CUdevice)
                .collect()
        } else {
            // Works out its cap if the program has not used it yet.
            if !self.device_exists(device) || self.limit_of(device).is_none() {
                return ENODEV;
            }
            vec![device]
        };
        if devices.is_empty() {
            return ENODEV;
        }
        // Checked for all before any changes.
        for &d in &devices {
            let Some(s) = self.accounting.slot(d) else {
                return ENODEV;
            };
            let ceiling = s.ceiling.load(Ordering::Acquire);
            if bytes > ceiling {
                log_once!(
                    Warn,
                    "vramcap_set_limit: {bytes} bytes on device {d} is above the {ceiling}-byte cap the process started with (VRAMCAP_LIMIT); a program may lower its cap and raise it back, never above that: refused with -EPERM"
                );
                return EPERM;
            }
        }
        for d in devices {
            self.set_own_limit(d, bytes);
        }
        0
    }
}

impl<D: Driver> Engine<D> {
    /// Whether `device` is one the process sees.
    pub fn device_exists(&self, device: c_int) -> bool {
        device >= 0 && self.driver.device_count().is_ok_and(|n| device < n)
    }

    /// `vramcap_empty_cache`: every cached block back to the driver; the
    /// bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.cache.trim_all(&self.accounting)
    }
}
