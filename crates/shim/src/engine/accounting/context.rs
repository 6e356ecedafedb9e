//! What the context of a device holds, measured through NVML: its first
//! figure (waited for by the allocations that need it), its refresh, and
//! the fallback where NVML cannot tell (`docs/design/held.md`).

use std::sync::atomic::Ordering;

use vramcap_core::MAX_DEVICES;
use vramcap_core::page::{DeviceSlot, uuid_text};
use vramcap_core::settings::{ContextCharge, Counting};

use crate::engine::accounting::ledger::*;
use crate::engine::accounting::state::Accounting;
use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::{log_at, log_once};

/// A measured footprint with its room to grow ([`CONTEXT_GROWTH`]); none
/// where there is no footprint at all (NVML shows exactly what is counted).
fn with_growth(f: u64) -> u64 {
    if f == 0 {
        0
    } else {
        f.saturating_add(CONTEXT_GROWTH)
    }
}

/// Clears a flag when dropped.
struct Cleared<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Cleared<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<D: Driver> Accounting<D> {
    /// Whether the process has a context on `device`: the calling thread's
    /// current one, or the device's primary context. Before it has one,
    /// NVML does not list it and there is nothing to charge (the CUDA
    /// runtime asks for the device's size before it makes its context).
    pub(in crate::engine) fn has_context_on(&self, device: CUdevice) -> bool {
        self.current().is_some_and(|(_, d)| d == device)
            || self
                .driver
                .primary_ctx_state(device)
                .is_ok_and(|(_, active)| active)
    }

    /// Measures the context's footprint on `device` (module docs) and moves
    /// its charge there. Skipped when another thread is measuring, and
    /// until the process has a context on the device.
    ///
    /// The charge only rises: a measurement can only come out low. It is
    /// set outright by the first measurement after the fallback or after
    /// a context went away (its figure then starts afresh).
    pub fn context_measure(&self, device: CUdevice) {
        if self.settings.counting != Counting::Held {
            return;
        }
        let Some(slot) = self.slot(device) else {
            return;
        };
        let i = usize::try_from(device).unwrap_or(0) % MAX_DEVICES;
        if !self.has_context_on(device) {
            log_at!(Debug, "device {device}: no context yet to measure");
            return;
        }
        while self.held.measuring[i].swap(true, Ordering::Acquire) {
            // Another thread measures. With a real figure already charged,
            // its result will do; without one (the first measurement,
            // which starts NVML and can take a second), an allocation must
            // not go ahead uncounted: wait for it, then measure if it got
            // no real figure.
            if self.held.measured_ns[i].load(Ordering::Relaxed) != 0 {
                return;
            }
            std::thread::sleep(WAIT_MEASURING);
            if self.held.measured_ns[i].load(Ordering::Relaxed) != 0 {
                return;
            }
        }
        // Cleared however this ends, a panic included.
        let _flag = Cleared(&self.held.measuring[i]);
        // No real figure since the start or since a context went away: the
        // next one is taken as it is; after that the charge only rises.
        let fresh = self.held.measured_ns[i].load(Ordering::Relaxed) == 0;
        let current = slot.context.load(Ordering::Acquire);
        let got = match self.settings.context {
            ContextCharge::Bytes(b) => Some(Ok(b)),
            ContextCharge::Auto => self.context_from_nvml(slot, device),
        };
        let now = mono_ns().max(1);
        let charge = match got {
            // The figures moved while read: try again later.
            None => None,
            // No real figure: the provisional one while there is none yet.
            Some(Err(f)) => fresh.then_some(f),
            Some(Ok(f)) if self.settings.context != ContextCharge::Auto => Some(f),
            // A measured figure is charged with room to grow: the driver
            // loads modules lazily, at a kernel's first launch, outside any
            // call the shim sees (PyTorch's grew by 92 MiB at its cap on
            // the H200).
            Some(Ok(f)) if fresh => Some(with_growth(f)),
            Some(Ok(f)) => Some(with_growth(f).max(current)),
        };
        if let Some(f) = charge {
            let old = slot.context.swap(f, Ordering::AcqRel);
            self.apply_raw(slot, device, old, f, "the context");
        }
        if matches!(got, Some(Ok(_))) {
            self.held.measured_ns[i].store(now, Ordering::Relaxed);
            self.held.tries[i].store(0, Ordering::Relaxed);
        } else {
            self.held.tries[i].fetch_add(1, Ordering::Relaxed);
        }
        self.held.tried_ns[i].store(now, Ordering::Relaxed);
    }

    /// NVML's figure for this process on `device` minus what the engine
    /// counts of the rest (`Ok`); a provisional figure (`Err`): the
    /// fallback where NVML cannot tell which process is this one, zero
    /// where it lists no process on the GPU at all; `None` when the
    /// figures moved while read.
    pub(in crate::engine) fn context_from_nvml(
        &self,
        slot: &DeviceSlot,
        device: CUdevice,
    ) -> Option<Result<u64, u64>> {
        let fallback = || {
            log_once!(
                Info,
                "device {device}: NVML cannot tell which process is this one (or is not there); charging {} MiB for the context until it can (set VRAMCAP_CONTEXT=SIZE to choose)",
                ContextCharge::FALLBACK >> 20
            );
            Some(Err(ContextCharge::FALLBACK))
        };
        let state = self.held.nvml.load(Ordering::Acquire);
        if state == NVML_ABSENT {
            return fallback();
        }
        if state == NVML_UNTRIED {
            // Kept initialised for the process's life: re-initialising for
            // every measurement would cost milliseconds each time.
            let up = self.driver.nvml_init();
            self.held
                .nvml
                .store(if up { NVML_UP } else { NVML_ABSENT }, Ordering::Release);
            if !up {
                return fallback();
            }
        }
        let Some(uuid) = uuid_text(&slot.uuid_bytes()) else {
            log_at!(Debug, "device {device}: no UUID to find it in NVML");
            return None;
        };
        let Some(handle) = self.driver.nvml_device_by_uuid(&uuid) else {
            log_at!(Debug, "device {device}: NVML has no GPU {uuid}");
            return fallback();
        };
        let rest = |s: &DeviceSlot| {
            s.budget
                .used()
                .saturating_sub(s.context.load(Ordering::Acquire))
        };
        let moves = |s: &DeviceSlot| {
            (
                s.allocs.load(Ordering::Acquire),
                s.frees.load(Ordering::Acquire),
            )
        };
        let (before, moved) = (rest(slot), moves(slot));
        let mut procs = [(0u32, 0u64); PROCESSES];
        let Some(n) = self.driver.nvml_processes(handle, &mut procs) else {
            log_at!(Debug, "device {device}: NVML lists no processes");
            return fallback();
        };
        let after = rest(slot);
        if before != after || moved != moves(slot) {
            log_at!(
                Debug,
                "device {device}: the figures moved while NVML was read"
            );
            return None;
        }
        if n == 0 {
            // NVML lists nobody on the GPU. With the primary context
            // active, NVML has not caught up with it yet (seen on the H200
            // right after the runtime made its context): the fallback until
            // it does. Without (a context reset and not used since), there
            // is nothing to charge yet. Measured again soon either way.
            log_at!(Debug, "device {device}: NVML lists no process yet");
            let active = self
                .driver
                .primary_ctx_state(device)
                .is_ok_and(|(_, active)| active);
            return if active { fallback() } else { Some(Err(0)) };
        }
        let procs = &procs[..n];
        let pid = std::process::id();
        // NVML's figure, or `u64::MAX` (NVML_VALUE_NOT_AVAILABLE) when it
        // has none for the process.
        let known = |used: u64| (used != u64::MAX).then_some(used);
        if let Some(p) = procs.iter().find(|p| p.0 == pid) {
            let Some(used) = known(p.1) else {
                return fallback();
            };
            let f = used.saturating_sub(after);
            log_at!(
                Debug,
                "device {device}: NVML shows {used} bytes for the process, {after} counted: context {f}"
            );
            return Some(Ok(f));
        }
        if self.driver.initial_pid_namespace() {
            // PIDs are the host's, as NVML's: this process is not listed
            // (yet), and no other entry can be it.
            log_at!(
                Debug,
                "device {device}: none of NVML's {n} processes is this one ({pid})"
            );
            return fallback();
        }
        // In a container NVML lists the host's PIDs. This process, which
        // has a context, is in the list: the only one, or the only one
        // holding at least what it is known to hold. That is a guess (a
        // process of another container can be the one listed while NVML
        // has not caught up with this one), so it stays provisional: it is
        // measured again and may fall.
        let guess = match procs {
            [only] => known(only.1),
            _ => {
                let mut fits = procs
                    .iter()
                    .filter(|p| known(p.1).is_some_and(|u| u >= after));
                match (fits.next(), fits.next()) {
                    (Some(p), None) => Some(p.1),
                    _ => None,
                }
            }
        };
        match guess {
            Some(used) => {
                let f = used.saturating_sub(after);
                log_at!(
                    Debug,
                    "device {device}: in a container, NVML's process holding {used} bytes taken for this one ({after} counted): context {f}, provisional"
                );
                Some(Err(with_growth(f)))
            }
            None => fallback(),
        }
    }
}
