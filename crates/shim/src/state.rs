//! Per-process state: settings, per-device budgets (which live in the
//! statistics page, see `stats`) and the table of live allocations.
//!
//! Concurrency (see also the crate docs):
//! - Budgets are atomics only ([`vramcap_core::budget`]).
//! - The allocation table is a sharded map (dashmap). Its shard locks are the
//!   only locks in the shim; each is taken for one insert, remove or lookup
//!   and never across a driver call, `dlopen` or `dlsym`, and never while
//!   another is held, so there is no lock order to get wrong.
//! - `fork`: the child keeps one thread, but a parent thread may have held a
//!   shard lock at the moment of `fork`. The child handler therefore never
//!   touches the old table: it swaps in a fresh empty one (leaking the old,
//!   which the child cannot use anyway: CUDA allocations do not survive fork)
//!   and starts a page of its own (budgets included). Settings are kept.

use std::hash::{BuildHasher, Hasher};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use dashmap::DashMap;
use vramcap_core::budget::{NO_CAP, Refused};
use vramcap_core::limit::Amount;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Settings;

use crate::cuda::{CUDA_SUCCESS, CUdevice, CUdeviceptr, CUuuid};
use crate::hooks::REAL;
use crate::log::{log_at, log_once};
use crate::real::call_real;

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// `VRAMCAP_DISABLE=1`: every hook passes straight through.
pub static DISABLED: AtomicBool = AtomicBool::new(false);

/// Reads the settings once. A bad value stops the process with status 2 and
/// one line naming the variable, so a program never runs uncapped by mistake.
pub fn settings() -> &'static Settings {
    SETTINGS.get_or_init(|| match Settings::from_env() {
        Ok(s) => {
            crate::log::set_level(s.log);
            DISABLED.store(s.disabled, Ordering::Relaxed);
            crate::real::set_driver_path(s.cuda_library.as_deref());
            s
        }
        Err(e) => {
            crate::log::write_line(format_args!("{e}"));
            // SAFETY: _exit has no preconditions; no cleanup may run in a
            // half-initialised process.
            unsafe { libc::_exit(2) }
        }
    })
}

/// What the shim knows about a live allocation.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub device: u16,
    /// Exported with `cuIpcGetMemHandle`: never cached.
    pub exported: bool,
    pub bytes: u64,
    /// The context that allocated it.
    pub ctx: usize,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device memory the cache may keep (`cuMemAlloc_v2`, `cuMemAllocPitch_v2`).
    Device(vramcap_core::cache::Shape),
    Managed,
    /// Stream-ordered (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`).
    Async,
    /// Past the cap, in managed memory kept on the host (see `spill`).
    SpillManaged,
    /// Past the cap, in pinned host memory (the host address).
    SpillHost(u64),
}

/// Device pointers are 512-byte aligned and spread over a wide range; a
/// multiplicative hash of the whole word is enough and much cheaper than SipHash.
#[derive(Clone, Copy, Default)]
pub struct PtrHash;

pub struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl BuildHasher for PtrHash {
    type Hasher = PtrHasher;
    fn build_hasher(&self) -> PtrHasher {
        PtrHasher(0)
    }
}

/// A map from a driver handle or address to what the shim knows of it,
/// created on first use and replaced (never touched) in a child after fork.
pub struct Registry<V: 'static> {
    map: AtomicPtr<DashMap<u64, V, PtrHash>>,
}

impl<V: 'static> Registry<V> {
    pub const fn new() -> Registry<V> {
        Registry {
            map: AtomicPtr::new(ptr::null_mut()),
        }
    }

    pub fn get(&self) -> &'static DashMap<u64, V, PtrHash> {
        let p = self.map.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: a published map is leaked and never freed.
            return unsafe { &*p };
        }
        let fresh = Box::into_raw(Box::new(DashMap::with_hasher(PtrHash)));
        match self
            .map
            .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: we just published `fresh`, which is leaked for good.
            Ok(_) => unsafe { &*fresh },
            Err(existing) => {
                // SAFETY: `fresh` was never shared; `existing` is leaked for good.
                unsafe {
                    drop(Box::from_raw(fresh));
                    &*existing
                }
            }
        }
    }

    /// In a child after fork: forget the map without touching it (a parent
    /// thread may have held one of its shard locks at the fork).
    pub fn reset(&self) {
        self.map.store(ptr::null_mut(), Ordering::Release);
    }
}

/// Live allocations by device address.
static TABLE: Registry<Record> = Registry::new();

pub fn table() -> &'static DashMap<CUdeviceptr, Record, PtrHash> {
    TABLE.get()
}

/// Something other than an address that holds device memory: a VMM
/// allocation handle or an array.
#[derive(Debug, Clone, Copy)]
pub struct Object {
    pub device: u16,
    pub bytes: u64,
    /// Handles that refer to it (VMM: create, retain and import each add one).
    pub refs: u32,
    /// VMM: this handle is another handle to the allocation counted under
    /// `alias_of` (an import of this process's own export); 0 otherwise.
    pub alias_of: u64,
}

/// `cuMemCreate` allocations by handle.
pub static VMM: Registry<Object> = Registry::new();
/// Arrays and mipmapped arrays by handle.
pub static ARRAYS: Registry<Object> = Registry::new();
/// VMM mappings by start address: (the counted handle, size).
pub static MAPS: Registry<(u64, u64)> = Registry::new();
/// POSIX file descriptors this process exported VMM handles as, by fd.
pub static EXPORTS: Registry<u64> = Registry::new();

/// Reserves `bytes` on `device`: in the process's own budget against
/// `limit` and, in a group, in the group's budget for that GPU.
pub fn reserve_on(
    slot: &DeviceSlot,
    device: CUdevice,
    bytes: u64,
    limit: u64,
) -> Result<(), Refused> {
    slot.budget.try_reserve(bytes, limit)?;
    if let Err(used) = crate::group::reserve(device, bytes) {
        slot.budget.release(bytes);
        return Err(Refused { used, limit });
    }
    Ok(())
}

/// Gives `bytes` on `device` back (group first, then the process's own
/// budget). False when the process's budget held less (a bookkeeping bug).
pub fn release_on(slot: &DeviceSlot, device: CUdevice, bytes: u64) -> bool {
    crate::group::release(device, bytes);
    slot.budget.release(bytes)
}

/// Bytes held against the cap of `device`: the group's, in a group.
pub fn held_on(slot: &DeviceSlot, device: CUdevice) -> u64 {
    crate::group::used(device).unwrap_or_else(|| slot.budget.used())
}

/// The counters of `device` in the statistics page.
pub fn slot(device: CUdevice) -> Option<&'static DeviceSlot> {
    usize::try_from(device)
        .ok()
        .and_then(|d| crate::stats::page().slots.get(d))
}

/// The cap of `device` in bytes ([`NO_CAP`] for none), worked out on first
/// use. `None` when it cannot be worked out (the driver would not say how big
/// the device is or what its UUID is): callers then refuse, keeping the cap
/// conservative.
pub fn limit_of(device: CUdevice) -> Option<u64> {
    let s = slot(device)?;
    if let Some(l) = s.budget.limit() {
        return Some(l);
    }
    let l = compute_limit(device, s)?;
    s.budget.set_limit(l);
    s.mark_active();
    let base = if l == NO_CAP {
        device_total(device).unwrap_or(0)
    } else {
        l
    };
    crate::cache::set_bound(device as u16, base);
    Some(l)
}

fn device_total(device: CUdevice) -> Option<u64> {
    let mut total: usize = 0;
    let rc = call_real!(
        REAL.cuDeviceTotalMem_v2,
        fn(*mut usize, CUdevice) -> i32,
        &mut total,
        device
    );
    (rc == CUDA_SUCCESS).then_some(total as u64)
}

fn compute_limit(device: CUdevice, slot: &DeviceSlot) -> Option<u64> {
    // In a group, its first member's limit applies (joining happens here).
    let spec = if settings().group.is_some() {
        crate::group::group_spec()?
    } else {
        &settings().limit
    };
    // The UUID is published in the page whenever the driver gives it; it is
    // required only when a UUID entry of the limit must be matched.
    let mut u = CUuuid::default();
    let mut rc = call_real!(
        REAL.cuDeviceGetUuid_v2,
        fn(*mut CUuuid, CUdevice) -> i32,
        &mut u,
        device
    );
    if rc != CUDA_SUCCESS {
        rc = call_real!(
            REAL.cuDeviceGetUuid,
            fn(*mut CUuuid, CUdevice) -> i32,
            &mut u,
            device
        );
    }
    if rc == CUDA_SUCCESS {
        slot.set_uuid(u.bytes);
    }
    if spec.is_unlimited() && settings().group.is_none() {
        return Some(NO_CAP);
    }
    let mut text = [0u8; 40];
    let uuid = if spec.needs_uuid() {
        if rc != CUDA_SUCCESS {
            log_once!(
                Error,
                "cannot read the UUID of device {device} (error {rc}) to match VRAMCAP_LIMIT; refusing its allocations"
            );
            return None;
        }
        u.write_canonical(&mut text);
        // The canonical form is ASCII by construction.
        std::str::from_utf8(&text).ok()
    } else {
        None
    };
    let ordinal = u32::try_from(device).ok()?;
    let limit = match spec.amount_for(ordinal, uuid) {
        None => NO_CAP,
        Some(Amount::Bytes(b)) => b,
        Some(a @ Amount::Percent(_)) => {
            let mut total: usize = 0;
            let rc = call_real!(
                REAL.cuDeviceTotalMem_v2,
                fn(*mut usize, CUdevice) -> i32,
                &mut total,
                device
            );
            if rc != CUDA_SUCCESS {
                log_once!(
                    Error,
                    "cannot read the memory size of device {device} (error {rc}) to apply a percentage limit; refusing its allocations"
                );
                return None;
            }
            a.resolve(total as u64)
        }
    };
    let limit = match crate::group::attach(device, (rc == CUDA_SUCCESS).then_some(u.bytes), limit) {
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

/// Resets all per-process state in a child after `fork`.
pub fn reset_after_fork() {
    TABLE.reset();
    VMM.reset();
    ARRAYS.reset();
    EXPORTS.reset();
    MAPS.reset();
    crate::stats::reset_after_fork();
    crate::cache::reset_after_fork();
    crate::spill::reset_after_fork();
    crate::group::reset_after_fork();
}
