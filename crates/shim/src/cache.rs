//! The freed-block cache: `cuMemFree_v2` of device memory keeps the block,
//! and a later allocation of a fitting size in the same context gets it back
//! without a driver round trip (policy in `vramcap_core::cache`).
//!
//! # Stream safety
//! The real `cuMemFree` may wait for work still using the block; a program
//! that launches a kernel on stream A, frees the block and allocates again
//! for stream B is correct only because of that. The cache gives the same
//! guarantee lazily, with synchronisation *tickets* per context:
//! - `started` counts synchronisations begun (`cuCtxSynchronize` calls made
//!   by the cache), `done` is the highest ticket whose synchronisation has
//!   returned. Both live under the device cache's mutex.
//! - A freed block is stamped with `started` as read at the free. Any
//!   synchronisation with a larger ticket began after that read, hence after
//!   the free, hence after every launch that precedes the free in the
//!   program's order; once it returned, that work is complete.
//! - So a block is safe to hand out when `done > block.ticket`. If not, the
//!   allocating thread takes a new ticket, calls `cuCtxSynchronize` (the
//!   driver's free would have cost at least that), records `done`, and every
//!   block freed before that ticket becomes safe at once: one
//!   synchronisation per burst of reuse, not one per block.
//! - While any stream capture is in progress the cache never synchronises
//!   (it would invalidate the capture): an unsafe block goes back and the
//!   allocation is a fresh one.
//! - Blocks are reused only in the context that allocated them, never
//!   split, and a block ever exported with `cuIpcGetMemHandle` is released
//!   for real. Managed memory is never cached.
//!
//! # Accounting
//! Cached bytes stay reserved in the device budget (the cap counts them) and
//! are shown as `cached` in the page. When a reservation would be refused, or
//! the driver itself runs out, cached blocks of that device are released
//! (least recently freed first) and the allocation is retried.
//!
//! # Concurrency and fork
//! One mutex per device guards its pool and tickets; it is held for map
//! operations only, never across a driver call (blocks are taken out under
//! the lock, then synchronised or freed outside it). The background thread
//! (idle release and `vramcap trim`) is started on first use; an `atexit`
//! handler stops it before the driver's own exit handlers run. After `fork`
//! the child gets fresh, empty caches: the parent's blocks belong to the
//! parent's contexts, which the child cannot use.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use vramcap_core::MAX_DEVICES;
use vramcap_core::cache::{Block, Pool, Want};
use vramcap_core::page::DeviceSlot;

use crate::cuda::*;
use crate::hooks::REAL;
use crate::log::{log_at, log_once};
use crate::real::call_real;
use crate::state::release_on;
use crate::state::{settings, slot};

#[derive(Default)]
struct Tickets {
    started: u64,
    done: u64,
}

#[derive(Default)]
struct Inner {
    pool: Pool,
    tickets: HashMap<usize, Tickets>,
}

pub struct DeviceCache {
    inner: Mutex<Inner>,
    /// Bytes this device may keep; 0 = not caching (also before the cap is known).
    bound: AtomicU64,
}

struct Caches {
    devices: [DeviceCache; MAX_DEVICES],
}

static CACHES: AtomicPtr<Caches> = AtomicPtr::new(ptr::null_mut());

fn caches() -> &'static Caches {
    let p = CACHES.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: published caches are leaked, never freed.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Caches {
        devices: std::array::from_fn(|_| DeviceCache {
            inner: Mutex::new(Inner::default()),
            bound: AtomicU64::new(0),
        }),
    }));
    match CACHES.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published; leaked for good.
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

fn device(dev: u16) -> Option<&'static DeviceCache> {
    caches().devices.get(usize::from(dev))
}

impl DeviceCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way that matters more than refusing to cache: carry on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Stream captures in progress in this process (see the capture hooks).
pub static CAPTURES: AtomicI64 = AtomicI64::new(0);

fn now_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Sets a device's bound once its cap is known (`base`: the cap, or the
/// device's memory when it has none).
pub fn set_bound(dev: u16, base: u64) {
    let bytes = settings().cache.resolve(base);
    if let Some(c) = device(dev) {
        c.bound.store(bytes, Ordering::Relaxed);
    }
    log_at!(Debug, "device {dev}: cache bound {bytes} bytes");
}

pub fn caching(dev: u16) -> bool {
    device(dev).is_some_and(|c| c.bound.load(Ordering::Relaxed) > 0)
}

/// True when a synchronisation could invalidate a stream capture.
fn capture_in_progress() -> bool {
    if CAPTURES.load(Ordering::SeqCst) > 0 {
        return true;
    }
    // Captures begun through a path the hooks did not see still show on the
    // legacy stream when they are in global mode.
    let mut status: i32 = 0;
    // CU_STREAM_LEGACY is the handle value 0x1, not a pointer to anything.
    let legacy = std::ptr::without_provenance_mut::<c_void>(1);
    let rc = call_real!(
        REAL.cuStreamIsCapturing,
        fn(*mut c_void, *mut i32) -> CUresult,
        legacy,
        &mut status
    );
    match rc {
        CUDA_SUCCESS => status != 0,
        CUDA_ERROR_NOT_FOUND => false,
        _ => true, // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT or anything unclear: be careful
    }
}

/// A block for `want` in context `ctx` on `dev`, safe to use, if the cache
/// has one.
pub fn reuse(dev: u16, ctx: usize, want: Want) -> Option<Block> {
    let c = device(dev)?;
    let (block, safe) = {
        let mut g = c.lock();
        let b = g.pool.take(ctx, want)?;
        let done = g.tickets.get(&ctx).map_or(0, |t| t.done);
        (b, done > b.ticket)
    };
    if safe {
        return Some(block);
    }
    if capture_in_progress() {
        put_back(dev, c, block);
        return None;
    }
    let ticket = {
        let mut g = c.lock();
        let t = g.tickets.entry(ctx).or_default();
        t.started += 1;
        t.started
    };
    let rc = call_real!(REAL.cuCtxSynchronize, fn() -> CUresult,);
    if rc != CUDA_SUCCESS {
        log_once!(
            Warn,
            "cuCtxSynchronize returned {rc} before reusing a cached block; allocating afresh instead"
        );
        put_back(dev, c, block);
        return None;
    }
    let mut g = c.lock();
    let t = g.tickets.entry(ctx).or_default();
    t.done = t.done.max(ticket);
    Some(block)
}

fn put_back(dev: u16, c: &DeviceCache, block: Block) {
    // It was within the bound a moment ago; keeping it cannot evict much, and
    // whatever it evicts is released like any eviction.
    let bound = c.bound.load(Ordering::Relaxed).max(block.bytes);
    let out = c.lock().pool.put(block, bound);
    release(dev, out, Why::Evicted);
}

/// Keeps a freed block. Returns false when the device is not caching.
pub fn keep(dev: u16, mut block: Block) -> bool {
    let Some(c) = device(dev) else { return false };
    if capturing() {
        return false; // keeping could evict, and evicting frees: not now
    }
    let bound = c.bound.load(Ordering::Relaxed);
    if bound == 0 {
        return false;
    }
    if let Some(s) = slot(i32::from(dev)) {
        DeviceSlot::add(&s.cached, block.bytes);
    }
    block.freed_ns = now_ns();
    let out = {
        let mut g = c.lock();
        block.ticket = g.tickets.get(&block.ctx).map_or(0, |t| t.started);
        g.pool.put(block, bound)
    };
    release(dev, out, Why::Evicted);
    start_thread();
    true
}

/// Releases cached blocks of `dev` until `need` bytes are out. Returns the
/// bytes released.
pub fn evict(dev: u16, need: u64) -> u64 {
    let Some(c) = device(dev) else { return 0 };
    if capturing() {
        return 0; // no frees of our own while a capture runs
    }
    let out = {
        let mut g = c.lock();
        let keep = g.pool.total().saturating_sub(need);
        g.pool.evict_until_room(keep)
    };
    release(dev, out, Why::Evicted)
}

/// Releases every cached block of context `ctx` (before it is destroyed).
pub fn drain_ctx(ctx: usize) {
    for (dev, c) in caches().devices.iter().enumerate() {
        let out = c.lock().pool.drain_ctx(ctx);
        if !out.is_empty() {
            release(dev as u16, out, Why::Evicted);
        }
    }
}

/// Forgets every cached block of a context the driver already destroyed:
/// the memory is gone, only the accounting is left to settle.
pub fn forget_ctx(ctx: usize) {
    for (dev, c) in caches().devices.iter().enumerate() {
        let out = c.lock().pool.drain_ctx(ctx);
        for b in out {
            if let Some(s) = slot(dev as i32) {
                s.cached.fetch_sub(b.bytes, Ordering::Relaxed);
                release_on(s, dev as i32, b.bytes);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    Evicted,
    Trimmed,
    Idle,
}

/// True while a stream capture the hooks saw is in progress: the shim then
/// makes no driver call of its own that could invalidate it (frees,
/// synchronisations).
pub fn capturing() -> bool {
    CAPTURES.load(Ordering::SeqCst) > 0
}

/// Frees blocks of device `dev` for real (each in its own context) and
/// settles the counters. A block the driver would not free (a capture
/// began meanwhile, say) goes back to the pool, still counted.
fn release(dev: u16, blocks: Vec<Block>, why: Why) -> u64 {
    let mut total = 0;
    for b in blocks {
        let rc = free_in_ctx(b.ptr, b.ctx);
        if rc != CUDA_SUCCESS {
            log_once!(
                Warn,
                "releasing a cached block failed with {rc}; keeping it cached"
            );
            if let Some(c) = device(dev) {
                let _ = c.lock().pool.put(b, u64::MAX);
            }
            continue;
        }
        if let Some(s) = slot(i32::from(dev)) {
            s.cached.fetch_sub(b.bytes, Ordering::Relaxed);
            release_on(s, i32::from(dev), b.bytes);
            match why {
                Why::Evicted | Why::Idle => DeviceSlot::add(&s.evictions, 1),
                Why::Trimmed => {}
            }
        }
        total += b.bytes;
    }
    total
}

/// Frees `ptr` with `ctx` current (pushed for the call when it is not).
pub fn free_in_ctx(ptr: CUdeviceptr, ctx: usize) -> CUresult {
    let mut cur: *mut c_void = ptr::null_mut();
    let rc = call_real!(
        REAL.cuCtxGetCurrent,
        fn(*mut *mut c_void) -> CUresult,
        &mut cur
    );
    if rc == CUDA_SUCCESS && cur as usize == ctx {
        return call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, ptr);
    }
    let rc = call_real!(
        REAL.cuCtxPushCurrent_v2,
        fn(*mut c_void) -> CUresult,
        ctx as *mut c_void
    );
    if rc != CUDA_SUCCESS {
        // The owning context is gone, and its memory with it: freeing the
        // address in another context could free someone else's allocation.
        return rc;
    }
    let out = call_real!(REAL.cuMemFree_v2, fn(CUdeviceptr) -> CUresult, ptr);
    let mut popped: *mut c_void = ptr::null_mut();
    let _ = call_real!(
        REAL.cuCtxPopCurrent_v2,
        fn(*mut *mut c_void) -> CUresult,
        &mut popped
    );
    out
}

/// Empties every cache (a `vramcap trim`). Returns the bytes released.
fn trim_all() -> u64 {
    let mut total = 0;
    for (dev, c) in caches().devices.iter().enumerate() {
        let out = c.lock().pool.drain();
        total += release(dev as u16, out, Why::Trimmed);
    }
    total
}

fn release_idle(idle: Duration) {
    let now = now_ns();
    let Some(cutoff) = now.checked_sub(idle.as_nanos() as u64) else {
        return;
    };
    for (dev, c) in caches().devices.iter().enumerate() {
        let out = c.lock().pool.evict_idle(cutoff);
        if !out.is_empty() {
            release(dev as u16, out, Why::Idle);
        }
    }
}

/// The background thread runs in this process (reset in a child after fork).
static THREAD: AtomicBool = AtomicBool::new(false);
static AT_EXIT: Once = Once::new();
static EXITING: AtomicBool = AtomicBool::new(false);
static BUSY: AtomicBool = AtomicBool::new(false);

/// How often the background thread looks for idle blocks and trim requests.
const TICK: Duration = Duration::from_millis(100);

extern "C" fn stop_thread_at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    // Wait for a release in flight: the driver's exit handlers run after this.
    while BUSY.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
}

pub fn start_thread() {
    if THREAD.load(Ordering::Relaxed) || THREAD.swap(true, Ordering::AcqRel) {
        return;
    }
    AT_EXIT.call_once(|| {
        // SAFETY: registering a plain function; handlers run in reverse order
        // of registration, so this one runs before the driver's (registered
        // at cuInit, earlier). A child after fork inherits the registration.
        unsafe { libc::atexit(stop_thread_at_exit) };
    });
    let spawned = std::thread::Builder::new()
        .name("vramcap-cache".into())
        .spawn(background);
    if let Err(e) = spawned {
        log_once!(
            Error,
            "cannot start the cache's background thread ({e}); idle blocks stay cached until memory is needed"
        );
    }
}

fn background() {
    let idle = settings().cache_idle;
    loop {
        std::thread::sleep(TICK);
        BUSY.store(true, Ordering::SeqCst);
        if EXITING.load(Ordering::SeqCst) {
            BUSY.store(false, Ordering::SeqCst);
            return;
        }
        if capturing() {
            // Frees from this thread could invalidate the capture: wait.
            BUSY.store(false, Ordering::SeqCst);
            continue;
        }
        let page = crate::stats::page();
        let asked = page.header.trim_requests.load(Ordering::Acquire);
        if asked != page.header.trim_acks.load(Ordering::Acquire) {
            let bytes = trim_all();
            for s in page.slots.iter() {
                if s.flags.load(Ordering::Relaxed) != 0 {
                    DeviceSlot::add(&s.trims, 1);
                }
            }
            page.header.trim_acks.store(asked, Ordering::Release);
            log_at!(Info, "trim: released {bytes} cached bytes");
        }
        release_idle(idle);
        crate::spill::reap();
        crate::group::tick();
        BUSY.store(false, Ordering::SeqCst);
    }
}

/// In a child after fork: fresh caches, no thread, no captures.
pub fn reset_after_fork() {
    CACHES.store(ptr::null_mut(), Ordering::Release);
    CAPTURES.store(0, Ordering::Release);
    THREAD.store(false, Ordering::Release);
    BUSY.store(false, Ordering::Release);
    EXITING.store(false, Ordering::Release);
}
