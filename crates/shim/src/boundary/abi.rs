//! The C ABI a program may call to read and change its own caps, declared
//! in `include/vramcap.h` (the Python package `vramcap` calls it through
//! ctypes). A program built without vramcap finds these with
//! `dlsym(RTLD_DEFAULT, "vramcap_set_limit")` when the library is preloaded.
//!
//! Every function runs inside the panic boundary (an internal error answers
//! `-EIO`). With `VRAMCAP_DISABLE=1` they answer `-ENOSYS` (no cap is
//! kept, so none can be changed), `vramcap_get_limit` 0. None is
//! async-signal-safe: `vramcap_set_limit` waits for allocations in flight.
//! With parking on, each passes parking's gate first, as a hooked driver
//! call does: called while the process is parked, it has it resumed
//! (they call the driver, which would hold them for good in a
//! checkpointed process); one that cannot continue answers `-EIO` (0 for
//! `vramcap_get_limit`).

use std::ffi::c_int;

use vramcap_core::budget::NO_CAP;
use vramcap_core::counters::SlotSnapshot;

use super::{boundary, disabled, engine};
use crate::engine::{EINVAL, ENODEV};
use crate::process::gate;

/// The ABI's version: raised when a function is added or changes.
pub const ABI_VERSION: c_int = 1;

/// `struct vramcap_stats` (see the header): every field in bytes but
/// `refusals` and `size`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct VramcapStats {
    /// The size of the struct the library filled (`min` of the caller's and its own).
    pub size: u64,
    /// The cap in force (`UINT64_MAX`: none).
    pub limit: u64,
    /// The soft limit (`UINT64_MAX`: none).
    pub soft_limit: u64,
    /// Everything the cap counts, and its parts.
    pub held: u64,
    pub allocations: u64,
    pub pools: u64,
    pub graphs: u64,
    pub context: u64,
    pub peak: u64,
    pub cached: u64,
    pub spilled: u64,
    pub refusals: u64,
    /// The device's memory, as the driver reports it (without the cap).
    pub total: u64,
    /// The process's own cap (`UINT64_MAX`: none), before a group's makes
    /// it stricter: what `vramcap_set_limit` sets and a restore puts back.
    pub own_limit: u64,
}

const ENOSYS: c_int = -libc::ENOSYS;
const EIO: c_int = -libc::EIO;

/// `int vramcap_version(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn vramcap_version() -> c_int {
    if disabled() { ENOSYS } else { ABI_VERSION }
}

/// `int vramcap_set_limit(int device, uint64_t bytes)`.
#[unsafe(no_mangle)]
pub extern "C" fn vramcap_set_limit(device: c_int, bytes: u64) -> c_int {
    if disabled() {
        return ENOSYS;
    }
    let Ok(_pass) = gate::enter() else {
        return EIO;
    };
    boundary("vramcap_set_limit", EIO, || {
        engine().set_limit_from_program(device, bytes)
    })
}

/// `uint64_t vramcap_get_limit(int device)`: the cap in force, `UINT64_MAX`
/// when the device has none, 0 when its cap is not known (a device the
/// process cannot use, or the library disabled).
#[unsafe(no_mangle)]
pub extern "C" fn vramcap_get_limit(device: c_int) -> u64 {
    if disabled() {
        return 0;
    }
    let Ok(_pass) = gate::enter() else {
        return 0;
    };
    boundary("vramcap_get_limit", 0, || {
        let e = engine();
        if !e.device_exists(device) || e.limit_of(device).is_none() {
            return 0;
        }
        e.slot(device).and_then(|s| s.budget.limit()).unwrap_or(0)
    })
}

/// `int vramcap_memory_stats(int device, struct vramcap_stats *out, size_t size)`.
///
/// # Safety
/// `out` is null or points at `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramcap_memory_stats(
    device: c_int,
    out: *mut VramcapStats,
    size: usize,
) -> c_int {
    if disabled() {
        return ENOSYS;
    }
    if out.is_null() || size < std::mem::size_of::<u64>() {
        return EINVAL;
    }
    let Ok(_pass) = gate::enter() else {
        return EIO;
    };
    boundary("vramcap_memory_stats", EIO, || {
        let e = engine();
        if !e.device_exists(device) || e.limit_of(device).is_none() {
            return ENODEV;
        }
        let Some(slot) = e.slot(device) else {
            return ENODEV;
        };
        let d = u32::try_from(device).unwrap_or(0);
        let s = SlotSnapshot::read(d, slot);
        let beyond = s.pools.saturating_add(s.graphs).saturating_add(s.context);
        let n = size.min(std::mem::size_of::<VramcapStats>());
        let stats = VramcapStats {
            size: n as u64,
            limit: s.limit.unwrap_or(NO_CAP),
            soft_limit: s.soft_limit.unwrap_or(NO_CAP),
            held: s.used,
            allocations: s.used.saturating_sub(beyond),
            pools: s.pools,
            graphs: s.graphs,
            context: s.context,
            peak: s.peak,
            cached: s.cached,
            spilled: s.spilled,
            refusals: s.refusals,
            total: slot.total.load(std::sync::atomic::Ordering::Relaxed),
            own_limit: slot.own.load(std::sync::atomic::Ordering::Relaxed),
        };
        // SAFETY: `out` has `size` writable bytes (the caller's contract)
        // and `n` is at most that; the source is a local of at least `n`.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const stats).cast::<u8>(), out.cast::<u8>(), n);
        }
        0
    })
}

/// `int64_t vramcap_empty_cache(void)`: gives every block the shim keeps
/// cached back to the driver; the bytes released.
#[unsafe(no_mangle)]
pub extern "C" fn vramcap_empty_cache() -> i64 {
    if disabled() {
        return i64::from(ENOSYS);
    }
    let Ok(_pass) = gate::enter() else {
        return i64::from(EIO);
    };
    boundary("vramcap_empty_cache", i64::from(EIO), || {
        i64::try_from(engine().empty_cache()).unwrap_or(i64::MAX)
    })
}

/// The names this module exports (the exported-symbols test lists them).
#[cfg_attr(not(test), allow(dead_code))]
pub const NAMES: [&str; 5] = [
    "vramcap_version",
    "vramcap_set_limit",
    "vramcap_get_limit",
    "vramcap_memory_stats",
    "vramcap_empty_cache",
];
