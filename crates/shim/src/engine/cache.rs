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
//!   allocating thread takes a new ticket, makes the work before it
//!   harmless to what comes after (below), records `done`, and every block
//!   freed before that ticket becomes safe at once: once per burst of
//!   reuse, not once per block.
//! - Making it harmless without waiting: the legacy stream is ordered with
//!   every *blocking* stream of its context (all streams but those created
//!   `CU_STREAM_NON_BLOCKING`, per-thread default streams included): work on
//!   it starts after the work queued before it on those streams, and work
//!   queued on them after it starts after it. So an event recorded on the
//!   legacy stream (`cuEventRecord(ev, CU_STREAM_LEGACY)`, one event per
//!   context, never waited for) orders every later use of the block after
//!   every earlier one, and the CPU goes on at once. The shim sees every
//!   stream creation (`cuStreamCreate`, `…WithPriority`,
//!   `cuGreenCtxStreamCreate`); once a non-blocking stream was asked for,
//!   the flag is set (before the stream exists, for good) and the ticket
//!   is made safe the old way: `cuCtxSynchronize` (the driver's free would
//!   have cost at least that). The flag is read after the ticket is taken,
//!   hence after the frees it covers: a block used on a non-blocking
//!   stream was freed after that stream was asked for, so the flag is seen.
//!   Blocks an ordering made safe before the flag was set (and blocks
//!   handed out since) may meet work on the new stream: so setting it first
//!   waits for every context's ordering event (`wait_for_orderings`), and
//!   it is set with the ordering lock held exclusively, which a reuse holds
//!   shared from its capture check to its `done` (no ordering can fall
//!   between the wait and the flag). A failed record falls back to the
//!   synchronisation, except a capture error: then the block goes back.
//!   The page counts both ways (`cache_ordered`, `cache_waits`).
//! - Another context's work (peer access) or a device outside CUDA (RDMA)
//!   using a block is ordered by neither way, as it was not by the
//!   driver's `cuCtxSynchronize` of this context.
//! - While any stream capture is in progress the cache neither records nor
//!   synchronises (either would invalidate the capture): an unsafe block
//!   goes back and the allocation is a fresh one. Captures begin under the
//!   ordering lock held exclusively, so none begins between a reuse's check
//!   and its record.
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
//! One mutex per device guards its pool, tickets and contexts' events; it
//! is held for map operations only, never across a driver call (blocks are
//! taken out under the lock, then ordered, synchronised or freed outside it;
//! an event is created outside it and, when another thread stored one for
//! the context meanwhile, destroyed again), and never while another lock is
//! held, except the ordering lock, which comes first (a reuse: ordering
//! shared, then the device mutex briefly; the flag's first setting and a
//! capture's beginning: ordering exclusive, then device mutexes briefly).
//! The non-blocking-stream flag is one atomic, set before the stream exists
//! and read after the ticket is taken. Keeping a block allocates (the pool's maps). The
//! background thread (idle release and `vramcap trim`, see `worker`) is
//! started by the engine when the first block is kept. After `fork` the
//! child's new engine has fresh, empty caches: the parent's blocks belong to
//! the parent's contexts, which the child cannot use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use vramcap_core::MAX_DEVICES;
use vramcap_core::cache::{Block, Pool, PtrHash, Want};
use vramcap_core::page::DeviceSlot;

use crate::engine::accounting::state::{Accounting, CU_STREAM_LEGACY};
use crate::engine::driver::{Driver, Flavour};
use crate::ffi::{CU_EVENT_DISABLE_TIMING, CUDA_SUCCESS, CUresult};
use crate::log::{log_at, log_once};

#[derive(Default)]
struct Tickets {
    started: u64,
    done: u64,
}

#[derive(Default)]
struct Inner {
    pool: Pool,
    tickets: HashMap<usize, Tickets, PtrHash>,
    /// Each context's event for ordering on the legacy stream, with the
    /// context's `cuCtxGetId` when the driver gives one: a context
    /// destroyed through a call the hooks do not see leaves its entry, and
    /// a new context at the same address has another ID, so the stale
    /// handle is never recorded.
    events: HashMap<usize, (usize, Option<u64>), PtrHash>,
}

struct DeviceCache {
    inner: Mutex<Inner>,
    /// Bytes this device may keep; 0 = not caching (also before the cap is known).
    bound: AtomicU64,
}

impl DeviceCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way that matters more than refusing to cache: carry on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The freed-block caches of every device.
pub struct Cache {
    devices: [DeviceCache; MAX_DEVICES],
    start: OnceLock<Instant>,
    /// Held shared by a reuse from its capture check to the end of its
    /// ordering (or synchronisation), and exclusively by what must not
    /// happen in between: a stream capture beginning (recording on the
    /// legacy stream would invalidate it) and the first non-blocking
    /// stream being asked for ([`Cache::wait_for_orderings`]).
    ordering: RwLock<()>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    Evicted,
    Trimmed,
    Idle,
}

impl Cache {
    pub fn new() -> Cache {
        Cache {
            devices: std::array::from_fn(|_| DeviceCache {
                inner: Mutex::new(Inner::default()),
                bound: AtomicU64::new(0),
            }),
            start: OnceLock::new(),
            ordering: RwLock::new(()),
        }
    }

    /// The ordering lock, shared (a reuse) or exclusive (see [`Cache::ordering`]).
    pub fn ordering_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.ordering.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ordering_exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.ordering.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for every context's last ordering event, the caller holding
    /// the ordering lock exclusively: blocks made safe by an ordering (and
    /// those handed out since) may then be used on any stream. Called once,
    /// when the first non-blocking stream is asked for. Counted as waits.
    pub fn wait_for_orderings<D: Driver>(&self, driver: &D, accounting: &Accounting<D>) {
        for (dev, c) in self.devices.iter().enumerate() {
            let events: Vec<usize> = c.lock().events.values().map(|&(e, _)| e).collect();
            for e in &events {
                let rc = driver.event_synchronize(*e);
                if rc != CUDA_SUCCESS {
                    log_once!(
                        Warn,
                        "cuEventSynchronize of the cache's ordering event returned {rc}"
                    );
                }
            }
            if !events.is_empty()
                && let Some(s) = accounting.slot(dev as i32)
            {
                DeviceSlot::add(&s.cache_waits, events.len() as u64);
            }
        }
    }

    fn device(&self, dev: u16) -> Option<&DeviceCache> {
        self.devices.get(usize::from(dev))
    }

    fn now_ns(&self) -> u64 {
        self.start.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    /// Sets a device's bound once its cap is known (`bytes`: the cache
    /// setting resolved against the cap, or the device's memory when it has
    /// none).
    pub fn set_bound(&self, dev: u16, bytes: u64) {
        if let Some(c) = self.device(dev) {
            c.bound.store(bytes, Ordering::Relaxed);
        }
        log_at!(Debug, "device {dev}: cache bound {bytes} bytes");
    }

    /// Whether any device's cache holds the block at `ptr` (freed by the
    /// program, still allocated in the driver).
    pub fn holds(&self, ptr: u64) -> bool {
        self.devices
            .iter()
            .filter(|c| c.bound.load(Ordering::Relaxed) > 0)
            .any(|c| c.lock().pool.contains(ptr))
    }

    pub fn caching(&self, dev: u16) -> bool {
        self.device(dev)
            .is_some_and(|c| c.bound.load(Ordering::Relaxed) > 0)
    }

    /// A block for `want` in context `ctx` on `dev`, safe to use, if the
    /// cache has one.
    pub fn reuse<D: Driver>(
        &self,
        driver: &D,
        accounting: &Accounting<D>,
        dev: u16,
        ctx: usize,
        want: Want,
    ) -> Option<Block> {
        let c = self.device(dev)?;
        let (block, safe) = {
            let mut g = c.lock();
            let b = g.pool.take(ctx, want)?;
            let done = g.tickets.get(&ctx).map_or(0, |t| t.done);
            (b, done > b.ticket)
        };
        if safe {
            return Some(block);
        }
        // Until `done` is recorded: no capture may begin, and the
        // non-blocking-stream flag does not change.
        let _order = self.ordering_shared();
        if accounting.capture_in_progress() {
            self.put_back(accounting, dev, block);
            return None;
        }
        let ticket = {
            let mut g = c.lock();
            let t = g.tickets.entry(ctx).or_default();
            t.started += 1;
            t.started
        };
        let slot = accounting.slot(i32::from(dev));
        let ordered = if accounting.nonblocking_streams() {
            Err(CUDA_SUCCESS)
        } else {
            self.order_on_legacy(driver, c, ctx)
        };
        if let Err(rc) = ordered
            && is_capture_error(rc)
        {
            // A capture the hooks did not see: neither record nor wait.
            self.put_back(accounting, dev, block);
            return None;
        }
        if ordered.is_ok() {
            if let Some(s) = slot {
                DeviceSlot::add(&s.cache_ordered, 1);
            }
        } else {
            let rc = driver.ctx_synchronize();
            if rc != CUDA_SUCCESS {
                log_once!(
                    Warn,
                    "cuCtxSynchronize returned {rc} before reusing a cached block; allocating afresh instead"
                );
                self.put_back(accounting, dev, block);
                return None;
            }
            if let Some(s) = slot {
                DeviceSlot::add(&s.cache_waits, 1);
            }
        }
        let mut g = c.lock();
        let t = g.tickets.entry(ctx).or_default();
        t.done = t.done.max(ticket);
        Some(block)
    }

    /// Records context `ctx`'s event (created at its first use) on the
    /// legacy stream, `ctx` being current; the driver's error when that
    /// failed.
    fn order_on_legacy<D: Driver>(
        &self,
        driver: &D,
        c: &DeviceCache,
        ctx: usize,
    ) -> Result<(), CUresult> {
        let id = driver.ctx_get_id(ctx).ok();
        let current = |entry: Option<&(usize, Option<u64>)>| {
            // The entry is this context's unless both IDs are known and differ.
            entry.and_then(|&(e, known)| match (known, id) {
                (Some(a), Some(b)) if a != b => None,
                _ => Some(e),
            })
        };
        let known = current(c.lock().events.get(&ctx));
        let event = match known {
            Some(e) => e,
            None => {
                // A stale entry's handle belongs to a context that is gone
                // (or by now to someone else's event): dropped, not destroyed.
                let e = driver.event_create(CU_EVENT_DISABLE_TIMING)?;
                let mut g = c.lock();
                match current(g.events.get(&ctx)) {
                    Some(other) => {
                        drop(g);
                        let _ = driver.event_destroy(e);
                        other
                    }
                    None => {
                        g.events.insert(ctx, (e, id));
                        e
                    }
                }
            }
        };
        let rc = driver.event_record(event, CU_STREAM_LEGACY, Flavour::Legacy);
        if rc != CUDA_SUCCESS {
            log_once!(
                Warn,
                "cuEventRecord on the legacy stream returned {rc} before reusing a cached block; synchronising instead"
            );
            return Err(rc);
        }
        Ok(())
    }

    fn put_back<D: Driver>(&self, accounting: &Accounting<D>, dev: u16, block: Block) {
        let Some(c) = self.device(dev) else { return };
        // It was within the bound a moment ago; keeping it cannot evict
        // much, and whatever it evicts is released like any eviction.
        let bound = c.bound.load(Ordering::Relaxed).max(block.bytes);
        let out = c.lock().pool.put(block, bound);
        self.release(accounting, dev, out, Why::Evicted);
    }

    /// Keeps a freed block. Returns false when the device is not caching.
    pub fn keep<D: Driver>(&self, accounting: &Accounting<D>, dev: u16, mut block: Block) -> bool {
        let Some(c) = self.device(dev) else {
            return false;
        };
        if accounting.capturing() {
            return false; // keeping could evict, and evicting frees: not now
        }
        let bound = c.bound.load(Ordering::Relaxed);
        if bound == 0 {
            return false;
        }
        if let Some(s) = accounting.slot(i32::from(dev)) {
            DeviceSlot::add(&s.cached, block.bytes);
        }
        block.freed_ns = self.now_ns();
        let out = {
            let mut g = c.lock();
            block.ticket = g.tickets.get(&block.ctx).map_or(0, |t| t.started);
            g.pool.put(block, bound)
        };
        self.release(accounting, dev, out, Why::Evicted);
        true
    }

    /// Releases cached blocks of `dev` until `need` bytes are out. Returns
    /// the bytes released.
    pub fn evict<D: Driver>(&self, accounting: &Accounting<D>, dev: u16, need: u64) -> u64 {
        let Some(c) = self.device(dev) else { return 0 };
        if accounting.capturing() {
            return 0; // no frees of our own while a capture runs
        }
        let out = {
            let mut g = c.lock();
            let keep = g.pool.total().saturating_sub(need);
            g.pool.evict_until_room(keep)
        };
        self.release(accounting, dev, out, Why::Evicted)
    }

    /// Releases every cached block of context `ctx` (before it is destroyed).
    pub fn drain_ctx<D: Driver>(&self, driver: &D, accounting: &Accounting<D>, ctx: usize) {
        for (dev, c) in self.devices.iter().enumerate() {
            let (out, event) = {
                let mut g = c.lock();
                (g.pool.drain_ctx(ctx), g.events.remove(&ctx))
            };
            // The context still lives: its event is destroyed now, not
            // left to a later context at the same handle.
            if let Some((e, _)) = event {
                let _ = driver.event_destroy(e);
            }
            if !out.is_empty() {
                self.release(accounting, dev as u16, out, Why::Evicted);
            }
        }
    }

    /// Forgets every cached block of a context the driver already
    /// destroyed: the memory is gone, only the accounting is left to settle.
    pub fn forget_ctx<D: Driver>(&self, accounting: &Accounting<D>, ctx: usize) {
        for (dev, c) in self.devices.iter().enumerate() {
            let out = {
                let mut g = c.lock();
                g.events.remove(&ctx);
                g.pool.drain_ctx(ctx)
            };
            for b in out {
                if let Some(s) = accounting.slot(dev as i32) {
                    s.cached.fetch_sub(b.bytes, Ordering::Relaxed);
                    accounting.release_on(s, dev as i32, b.bytes);
                }
            }
        }
    }

    /// Frees blocks of device `dev` for real (each in its own context) and
    /// settles the counters. A block the driver would not free (a capture
    /// began meanwhile, say) goes back to the pool, still counted.
    fn release<D: Driver>(
        &self,
        accounting: &Accounting<D>,
        dev: u16,
        blocks: Vec<Block>,
        why: Why,
    ) -> u64 {
        let mut total = 0;
        for b in blocks {
            let rc = accounting.free_in_ctx(b.ptr, b.ctx);
            if rc != CUDA_SUCCESS {
                log_once!(
                    Warn,
                    "releasing a cached block failed with {rc}; keeping it cached"
                );
                if let Some(c) = self.device(dev) {
                    let _ = c.lock().pool.put(b, u64::MAX);
                }
                continue;
            }
            if let Some(s) = accounting.slot(i32::from(dev)) {
                s.cached.fetch_sub(b.bytes, Ordering::Relaxed);
                accounting.release_on(s, i32::from(dev), b.bytes);
                match why {
                    Why::Evicted | Why::Idle => DeviceSlot::add(&s.evictions, 1),
                    Why::Trimmed => {}
                }
            }
            total += b.bytes;
        }
        total
    }

    /// Empties every cache (a `vramcap trim`). Returns the bytes released.
    pub fn trim_all<D: Driver>(&self, accounting: &Accounting<D>) -> u64 {
        let mut total = 0;
        for (dev, c) in self.devices.iter().enumerate() {
            let out = c.lock().pool.drain();
            total += self.release(accounting, dev as u16, out, Why::Trimmed);
        }
        total
    }

    /// Releases blocks unused for `idle`.
    pub fn release_idle<D: Driver>(&self, accounting: &Accounting<D>, idle: Duration) {
        let Some(cutoff) = self.now_ns().checked_sub(idle.as_nanos() as u64) else {
            return;
        };
        for (dev, c) in self.devices.iter().enumerate() {
            let out = c.lock().pool.evict_idle(cutoff);
            if !out.is_empty() {
                self.release(accounting, dev as u16, out, Why::Idle);
            }
        }
    }
}

/// `CUDA_ERROR_STREAM_CAPTURE_*` (900..=908): a capture is in progress.
fn is_capture_error(rc: CUresult) -> bool {
    (900..=908).contains(&rc)
}
