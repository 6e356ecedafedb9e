//! The accounting part's state: the statistics page with the per-device
//! budgets, the group membership, the caps, the book of what a process
//! holds beyond its allocations, and the count of stream captures in
//! progress. It is handed the driver and the settings, which it uses for
//! its own work and hands to no one: the engine holds them too and hands
//! them to each part that needs them (`Engine::driver`, the parts' views).
//! The cache, spill, parking and tiered spill take a `&Accounting` for the
//! budgets; a handler names it (`self.accounting.reserve_on(..)`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};

use vramcap_core::MAX_DEVICES;
use vramcap_core::budget::NO_CAP;
use vramcap_core::settings::Settings;

use crate::engine::accounting::group::Membership;
use crate::engine::accounting::ledger::HeldBook;
use crate::engine::accounting::page::PageHandle;
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUdeviceptr, CUresult};

/// Its fields are the accounting part's own (`accounting/`); the rest of
/// the engine reads them through the methods below.
pub struct Accounting<D: Driver> {
    pub(super) driver: &'static D,
    pub(super) settings: &'static Settings,
    pub(super) page: PageHandle,
    pub(super) group: Membership,
    /// Stream captures in progress that the capture hooks saw.
    pub(super) captures: AtomicI64,
    /// Whether `VRAMCAP_LIMIT`'s device keys all name a GPU, once checked
    /// (`accounting.rs`).
    pub(super) keys: AtomicU8,
    /// The group's cap of each device, once attached ([`NO_CAP`] outside a
    /// group): the process's own cap is in its page, the group's here.
    pub(super) group_caps: [AtomicU64; MAX_DEVICES],
    /// Pools, graph memory and the context (`held.rs`).
    pub(super) held: HeldBook,
    /// The operator's cap of each device ([`NO_CAP`] for none), kept here
    /// and not only in the page, which the user can write: every
    /// reservation is held to it (`accounting.rs`).
    pub(super) operator_caps: [AtomicU64; MAX_DEVICES],
    /// Set (for good) when the program asked for a stream that is not
    /// ordered with the legacy stream (`CU_STREAM_NON_BLOCKING`, green
    /// context streams): the cache then waits for a synchronisation before
    /// reusing a block (`cache.rs`).
    pub(super) nonblocking_streams: AtomicBool,
}

/// `CU_STREAM_LEGACY`: a handle value, not a pointer to anything.
pub const CU_STREAM_LEGACY: usize = 1;

impl<D: Driver> Accounting<D> {
    pub fn new(driver: &'static D, settings: &'static Settings) -> Accounting<D> {
        Accounting {
            driver,
            settings,
            page: PageHandle::new(),
            group: Membership::new(settings),
            captures: AtomicI64::new(0),
            keys: AtomicU8::new(0),
            group_caps: [const { AtomicU64::new(NO_CAP) }; MAX_DEVICES],
            held: HeldBook::new(),
            operator_caps: [const { AtomicU64::new(NO_CAP) }; MAX_DEVICES],
            nonblocking_streams: AtomicBool::new(false),
        }
    }

    /// The statistics page.
    pub fn page(&self) -> &PageHandle {
        &self.page
    }

    /// The group membership.
    pub fn group(&self) -> &Membership {
        &self.group
    }

    /// The book of pools, graph memory and the context (`held.rs`).
    pub fn held(&self) -> &HeldBook {
        &self.held
    }

    /// The group's cap of each device, as last followed (`handlers/live.rs`).
    pub fn group_caps(&self) -> &[AtomicU64; MAX_DEVICES] {
        &self.group_caps
    }

    /// A stream capture the hooks saw began.
    pub fn capture_began(&self) {
        self.captures.fetch_add(1, Ordering::SeqCst);
    }

    /// A stream capture ended (never below none: an end the hooks saw no
    /// beginning of counts nothing).
    pub fn capture_ended(&self) {
        let _ = self
            .captures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0).then(|| n - 1)
            });
    }

    /// Notes (for good) that a stream unordered with the legacy stream may
    /// exist; true when it was noted before.
    pub fn note_nonblocking_stream(&self) -> bool {
        self.nonblocking_streams.swap(true, Ordering::SeqCst)
    }

    /// Whether a stream unordered with the legacy stream may exist.
    pub fn nonblocking_streams(&self) -> bool {
        self.nonblocking_streams.load(Ordering::SeqCst)
    }

    /// True while a stream capture the hooks saw is in progress: the engine
    /// then makes no driver call of its own that could invalidate it (frees,
    /// synchronisations).
    pub fn capturing(&self) -> bool {
        self.captures.load(Ordering::SeqCst) > 0
    }

    /// True when a synchronisation could invalidate a stream capture: one
    /// the hooks saw, or one begun through a path they did not see that
    /// shows on the legacy stream (global-mode captures do).
    pub fn capture_in_progress(&self) -> bool {
        if self.capturing() {
            return true;
        }
        match self
            .driver
            .stream_is_capturing(CU_STREAM_LEGACY, Flavour::Legacy)
        {
            Ok(status) => status != 0,
            Err(CUDA_ERROR_NOT_FOUND) => false,
            // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT or anything unclear: be careful.
            Err(_) => true,
        }
    }

    /// Frees `ptr` with `ctx` current (pushed for the call when it is not).
    pub fn free_in_ctx(&self, ptr: CUdeviceptr, ctx: usize) -> CUresult {
        if self.driver.ctx_get_current() == Ok(ctx) {
            return self.driver.mem_free(ptr);
        }
        let rc = self.driver.ctx_push_current(ctx);
        if rc != CUDA_SUCCESS {
            // The owning context is gone, and its memory with it: freeing the
            // address in another context could free someone else's allocation.
            return rc;
        }
        let out = self.driver.mem_free(ptr);
        let _ = self.driver.ctx_pop_current();
        out
    }
}
