//! The engine: everything the shim decides, in plain Rust. It knows no
//! exports, no `dlsym` and no function-pointer tables: the boundary layer
//! calls one of its handlers per hooked driver function, passing the
//! caller's arguments and a closure that makes the real call; every other
//! driver function it needs comes through the [`Driver`] trait. Its unit
//! tests (`tests/`) run it against a fake driver.
//!
//! # Parts, bottom up (no module imports one above it; `tests/layout.rs`
//! checks that no two import each other)
//! - `driver`, `worker`: the driver trait (over the C types of
//!   `crate::ffi`) and the background thread.
//! - `accounting/`: what every part stands on (`state`: the
//!   [`Accounting`] with the page and the group membership; it is handed
//!   the driver and the settings, and the engine hands them, from its own
//!   fields, to each part that needs them), the budgets and caps
//!   (`mod.rs`), what a process holds beyond its allocations (`held`, with
//!   its book of pools and the context's measurement in `ledger`), the
//!   records of live allocations (`records`), the allocations in flight
//!   (`inflight`), the statistics page (`page`), the group membership
//!   (`group`) and the exports this process made (`exports`).
//! - `cache`, `spill`: the freed-block cache and spill to host memory.
//! - `park/`: parking (its state, the checkpoint steps on the background
//!   thread, the idle policy), a part: `Parking` sees its own state and
//!   the accounting's `Accounting`, and [`Engine::with_parking`] hands in what
//!   it needs of the records and the cache.
//! - `tiered/`: tiered spill (its blocks, heat, a pure planner, the gate,
//!   the rounds, where a block's bytes are counted, the program's own
//!   `cuMemCreate` handles under it), a part: `Tiering` sees its own state,
//!   `Accounting` and the host memory's budget, which this file answers
//!   (`HostRoom`).
//! - this file: the [`Engine`], which owns all of the above, the
//!   background round and the glue that hands the parts what they need.
//! - `pipeline/`: the allocation path every allocating family shares, its
//!   steps in their order (`mod.rs`), and tiered spill's placement step
//!   with the frees of blocks (`tiered.rs`).
//! - `handlers/`, by API family: `alloc` (plain, pitched and managed
//!   memory), `free`, `queries` (memory queries), `pools` (stream-ordered),
//!   `vmm` and `vmm_tiered`, `arrays`, `lifecycle` (contexts, captures,
//!   IPC), `nvml`, `live` (caps changed while the program runs), `launch`
//!   (launches, copies and memsets under tiered spill).
//!
//! The rule the parts keep (`tests/layout.rs` checks it): `impl Engine`
//! only here, in the pipeline and in the families; a part's files name no
//! other part.
//!
//! # Concurrency (written here once; ARCHITECTURE.md and the modules point here)
//! - **Atomics:** budgets, counters, the capture count, every lazily made
//!   pointer (driver handle, function slots, the page, the engine), a
//!   tiered block's spots, place and claim; the boundary's forwarders'
//!   slots (claimed by compare-and-swap, never freed: no lock) and the
//!   parking gate's word and activity flag. A reservation is a
//!   compare-and-swap under the cap.
//! - **Locks, and what each guards.** Each is held for one map or list
//!   operation, never across `dlopen` or `dlsym`, and never across a driver
//!   call unless said here.
//!   - `accounting/records.rs`: each registry's shard locks (live
//!     allocations, VMM objects, arrays, mappings, graphs): one entry.
//!   - `cache.rs`: one mutex per device (its blocks, tickets and contexts'
//!     events), and the ordering lock (reuse takes it shared; a capture's
//!     beginning and the non-blocking flag's first setting exclusively).
//!   - `spill.rs`: the deferred-free list.
//!   - `accounting/ledger.rs`, `accounting/held.rs`: the book of pools and
//!     the graph-reserve mutex, the only locks held across a driver call:
//!     the attribute reads whose figures they apply, which call nothing the
//!     shim hooks and never wait on the GPU.
//!   - `accounting/exports.rs`: the list of exports; under it the VMM
//!     registry is asked whether a handle is live (one shard lookup), and
//!     no code takes the list while it holds a registry entry.
//!   - Tiered spill only (`tiered/`): the block map, the parameter layouts
//!     and the executable graphs' uses (`RwLock`s, one lookup pass or one
//!     insert), the mover streams and deferred frees, the program's
//!     `cuMemCreate` handles (`tiered/handles.rs`, never with another
//!     lock), a block's granted access; `Tiers::running` (a round holds it
//!     shared throughout, the program's context destroy and primary-context
//!     release or reset exclusively around the driver's call); and the gate
//!     (`tiered/gate.rs`, an `RwLock<()>`: the launch, copy and memset
//!     hooks hold it shared across their driver call, a round's move
//!     exclusively across the synchronisation, copy and remap; the round
//!     takes it with `try_write` for at most `STOP_WAIT`, 50 ms, and gives
//!     up the round otherwise, so a program thread blocked in a gated call
//!     cannot deadlock with it).
//!   - `process/gate.rs`: parking's gate mutex, taken alone, to change the
//!     state or to wait on its condvar for it (program threads at a closed
//!     gate wait there, outside every other lock).
//!   - `OnceLock`s and `Once`s of values made once (settings, the driver's
//!     path, the spill limit, the group's limit, the cache's clock, the
//!     exit handler).
//! - **The lock order**, the only nestings: `Tiers::running`, then the
//!   cache's ordering lock, then the gate or a device cache's mutex
//!   (briefly); the list of exports, then a VMM registry shard; the
//!   settings' initialiser setting the driver's path, once, before any hook
//!   runs. Hooks take only the gate. Parking's gate mutex is never held
//!   with another lock. Nothing else is held with another lock.
//! - **Waits:** nothing waits on another process, but parking's policy,
//!   only in a process started with `VRAMCAP_PARK` or a `VRAMCAP_PARK_WAIT`
//!   (an allocation the group or the GPU refuses waits, holding no lock,
//!   for an idle member's answer: its request withdrawn if not taken
//!   within 2 s, else at most 2 s and 1 s per GiB of the GPU's own size,
//!   whatever its page says; at most four rounds per allocation; then up
//!   to `VRAMCAP_PARK_WAIT`). With parking on, a program thread at a closed
//!   gate waits on its condvar until the background thread resumes the
//!   process; the background thread waits (at most 10 s) for the threads
//!   inside hooked exports to leave before it parks. The page and the group
//!   membership are made by one thread while others yield (`page`,
//!   `group`); an allocation that needs the context's first figure while
//!   another thread measures it sleeps 200 µs at a time until it is there
//!   (`accounting/context.rs`); a cap change yields until the allocations
//!   in flight under the old cap end their driver calls
//!   (`handlers/live.rs`), which never wait on it; a context's destroy
//!   waits (at most 10 s, once) for a round's synchronising threads; a free
//!   of a tiered block waits (yielding) for a move's claim to end. At exit,
//!   leaving the group waits for this process's own group calls in flight;
//!   a group reservation that other members' reservations are in the way
//!   of yields and retries for at most `group::CONTENDED_FOR`.
//! - **What allocates:** making the engine (the first hook; dashmap reads
//!   the CPU count then), the page and the group membership (a device's
//!   first use), the check of the limit's device keys (the first use of any
//!   device, only when the limit names devices), record inserts, keeping a
//!   cached block and a context's first ticket, the lists of blocks an
//!   eviction or a context teardown releases, the mappings an unmap drops,
//!   deferring and reaping spilled frees, NVML's UUID text and its look-up
//!   of `CUDA_VISIBLE_DEVICES`, a pool's first entry in the book, the list
//!   of pools a refresh walks, a graph's node list when it is sized; under
//!   tiered spill, a block's insert and access descriptors, a function's
//!   layout, an executable graph's uses (at its instantiation, never at its
//!   launch), a round's snapshot, lists and plan, a context's first mover
//!   stream, a program handle's cell and entry; at debug level only, each
//!   launch's list of blocks (issue 44's record, bounded); under
//!   `VRAMCAP_PARK_MOVE=shim`, a park's and a resume's lists of moves and
//!   the kept host memory's entries. A plain allocation or free
//!   that the cache does not touch allocates only its record. Logging
//!   formats into a stack buffer and makes one `write(2)`.
//! - **`fork`:** the process statics (`crate::process`: the gate, the exit
//!   flag, the background thread's count) are reset in the child; the
//!   boundary's child handler closes the inherited page and
//!   group descriptors and the descriptors kept of the parent's exports
//!   ([`Engine::forget_after_fork`]), unmaps the parent's page, and drops
//!   the engine from use without touching its maps or locks (a parent
//!   thread may have held one at the fork); the child's first hook makes a
//!   fresh engine, with a page, membership and caches of its own. Settings
//!   are kept.
//! - **Killed at any instruction:** the page and group files hold only
//!   atomics and are published complete (a temporary file, locked by its
//!   writer, then `rename` or `link`; readers remove the temporary files of
//!   dead writers); a dead process's liveness locks go with it, and a dead
//!   group member's bytes with its slot (`crates/core/src/group/mod.rs` has
//!   the proof sketch). Tiered spill's state does not outlive the process.

pub mod driver;

mod accounting;
mod cache;
mod handlers;
pub mod park;
mod pipeline;
mod spill;
mod tiered;
mod worker;

#[cfg(test)]
mod tests;

pub use self::driver::{Driver, Flavour};
pub use self::handlers::arrays::ArrayDesc;
pub use self::handlers::live::{EINVAL, ENODEV};
pub use self::pipeline::Made;

use self::accounting::inflight::InFlight;
use self::accounting::records::{Object, Record, Registry, registry};
use self::accounting::state::Accounting;
use self::cache::Cache;
use self::spill::HostSpill;
use self::tiered::{Handles, Tiers};
use crate::ffi::CUdevice;
use crate::log::log_at;
use std::sync::atomic::Ordering;
use vramcap_core::page::DeviceSlot;
use vramcap_core::settings::Settings;

/// Set (for good) once a cap came into force after start, from inside or
/// outside (`handlers/live.rs`): the loader's guards read it beside the
/// start settings, so any cap in force engages them
/// (`boundary/resolve.rs`).
pub static CAPPED_WHILE_RUNNING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// All the state of one process's shim (one per process; a test makes its own).
pub struct Engine<D: Driver> {
    /// The driver and the settings, handed to each part that needs them.
    driver: &'static D,
    settings: &'static Settings,
    accounting: Accounting<D>,
    cache: Cache,
    spill: HostSpill,
    tiers: Tiers,
    /// The program's `cuMemCreate` handles under tiered spill.
    handles: Handles,
    /// Live allocations by device address.
    table: Registry<Record>,
    /// `cuMemCreate` allocations by handle.
    vmm: Registry<Object>,
    /// Arrays and mipmapped arrays by handle.
    arrays: Registry<Object>,
    /// VMM mappings by start address: (the counted handle, size).
    maps: Registry<(u64, u64)>,
    /// The VMM handles this process exported as POSIX file descriptors
    /// (outside tiered spill).
    exports: crate::engine::accounting::exports::Exports,
    /// Instantiated graphs by handle: how much graph memory their last
    /// launch that grew it added, and their allocation nodes' bytes when
    /// their instantiation was seen (`held.rs`).
    graph_growth: Registry<u64>,
    graph_size: Registry<u64>,
    /// Allocations in flight, for cap changes (`live.rs`).
    inflight: InFlight,
    /// Parking's state (`park/`).
    park: park::Park,
    /// Whether the background thread was started (`worker.rs`).
    worker: worker::Worker,
}

/// Tiered blocks' host memory is the spill limit's budget (`spill.rs`).
impl<D: Driver> tiered::HostRoom for Engine<D> {
    fn room(&self) -> u64 {
        self.spill.room()
    }
    fn take(&self, bytes: u64) -> bool {
        self.spill.take(bytes)
    }
    fn give_back(&self, bytes: u64) {
        self.spill.give_back(bytes)
    }
}

impl<D: Driver> Engine<D> {
    pub fn new(driver: D, settings: &'static Settings) -> Engine<D> {
        // Made once per process (and per unit test), never dropped.
        let driver: &'static D = Box::leak(Box::new(driver));
        Engine {
            driver,
            settings,
            accounting: Accounting::new(driver, settings),
            cache: Cache::new(),
            spill: HostSpill::new(settings),
            tiers: Tiers::new(
                settings.park.is_some() && settings.park_move.moves_blocks(),
                settings.spill == vramcap_core::settings::Spill::Tiered,
            ),
            handles: Handles::default(),
            table: registry(),
            vmm: registry(),
            arrays: registry(),
            maps: registry(),
            exports: Default::default(),
            graph_growth: registry(),
            graph_size: registry(),
            inflight: InFlight::new(),
            park: park::Park::new(),
            worker: worker::Worker::new(),
        }
    }

    /// The statistics page's slot of `device`, made on first use (`None`
    /// when the page cannot be made): what the C ABI reads.
    pub fn slot(&self, device: CUdevice) -> Option<&'static DeviceSlot> {
        self.accounting.slot(device)
    }

    /// Starts the background thread if it is not running.
    pub(in crate::engine) fn start_worker(&'static self) {
        self.worker.ensure(move || self.background_round());
    }

    /// Parking at work over its state (`park/`), with what it needs of the
    /// other parts handed in: what the records hold, and the cache's
    /// emptying.
    pub(in crate::engine) fn with_parking<T>(
        &'static self,
        f: impl FnOnce(&park::Parking<'_, D>) -> T,
    ) -> T {
        let records = || park::Live {
            managed: self
                .table
                .iter()
                .any(|r| matches!(r.kind, accounting::records::Kind::Managed)),
            exported: self.table.iter().any(|r| r.exported),
        };
        let empty_cache = || self.cache.trim_all(&self.accounting);
        // The shim's moves (`VRAMCAP_PARK_MOVE=shim`, `shim+checkpoint`),
        // with `Tiers::running` held shared as a round holds it. Each says
        // the host memory kept for parks on the page's tail on its way out,
        // even when it panics (parking catches that), before parking
        // answers: a reader sees it once a park or resume is answered.
        struct SayKept<'e, D: Driver>(&'e Engine<D>);
        impl<D: Driver> Drop for SayKept<'_, D> {
            fn drop(&mut self) {
                self.0.say_kept();
            }
        }
        let move_out = || {
            let _no_teardown = self.tiers.round_running();
            let _say = SayKept(self);
            self.tiering().park_out()
        };
        let move_in = || {
            let _no_teardown = self.tiers.round_running();
            let _say = SayKept(self);
            self.tiering().park_in()
        };
        let sync_all = || {
            let mut ctxs: Vec<usize> = self.table.iter().map(|r| r.ctx).collect();
            ctxs.extend(self.tiers.contexts());
            ctxs.sort_unstable();
            ctxs.dedup();
            self.tiering().sync_contexts(&ctxs)
        };
        f(&park::Parking {
            driver: self.driver,
            settings: self.settings,
            park: &self.park,
            accounting: &self.accounting,
            records: &records,
            empty_cache: &empty_cache,
            move_out: &move_out,
            move_in: &move_in,
            sync_all: &sync_all,
        })
    }

    /// The host memory kept for parks (`tiered/bulk.rs`), on the page's tail.
    fn say_kept(&self) {
        let tail = self.accounting.page().tail(self.settings);
        tail.park_host_kept
            .store(self.tiers.kept_bytes(), Ordering::Relaxed);
    }

    /// Tiered spill at work over its state (`tiered/`): the engine answers
    /// its host memory's budget (the spill limit's).
    pub(in crate::engine) fn tiering(&self) -> tiered::Tiering<'_, D> {
        tiered::Tiering {
            driver: self.driver,
            tiers: &self.tiers,
            accounting: &self.accounting,
            host: self,
        }
    }

    /// Tiered spill's part of the background round: with `Tiers::running`
    /// held shared, then the cache's ordering lock (no capture begins
    /// meanwhile), in the lock order.
    pub(in crate::engine) fn tier_round(&'static self) {
        if !self.tiers.on() {
            return;
        }
        let _no_teardown = self.tiers.round_running();
        let _no_capture_begins = self.cache.ordering_shared();
        self.tiering().round();
    }

    /// Parking's part of the background round, first in each: true when
    /// the process is not running (parked, or stuck).
    pub(in crate::engine) fn park_round(&'static self) -> bool {
        self.with_parking(|p| p.park_round())
    }

    /// One round of the background thread.
    fn background_round(&'static self) {
        if self.park_round() {
            // Parked (or stuck): no CUDA work; the group stays alive.
            self.accounting.group().tick();
            return;
        }
        if self.accounting.capturing() {
            // Frees from this thread could invalidate the capture: wait.
            return;
        }
        let page = self.accounting.page().get(self.settings);
        let mailbox = vramcap_core::mailbox::Mailbox::trim(&page.header);
        if let Some(asked) = mailbox.pending() {
            let bytes = self.cache.trim_all(&self.accounting);
            // Host memory kept for parks goes too (`VRAMCAP_PARK_MOVE=shim`).
            let kept = if self.tiers.on() {
                let _no_teardown = self.tiers.round_running();
                let kept = self.tiering().release_kept();
                self.say_kept();
                kept
            } else {
                0
            };
            for s in page.slots.iter() {
                if s.flags.load(Ordering::Relaxed) != 0 {
                    DeviceSlot::add(&s.trims, 1);
                }
            }
            mailbox.answer(asked);
            log_at!(Info, "trim: released {bytes} cached bytes");
            if kept > 0 {
                log_at!(
                    Info,
                    "trim: gave back {kept} bytes of host memory kept for parks"
                );
            }
        }
        self.apply_limit_requests();
        self.follow_group_caps();
        self.cache
            .release_idle(&self.accounting, self.settings.cache_idle);
        self.spill.reap(self.driver, &self.accounting);
        self.tier_round();
        self.accounting.held_round();
        self.accounting.group().tick();
    }

    /// At normal exit: leave the group and remove the statistics page.
    pub fn at_exit(&self) {
        self.accounting.group().leave();
        self.accounting.page().remove_at_exit();
    }

    /// In a child after fork, before anything else runs: close the
    /// descriptors whose locks say the parent is alive, unmap the parent's
    /// page, and close the descriptors kept of the parent's exports (each
    /// would hold the parent's memory allocated for the child's life). The
    /// engine is not used again.
    pub fn forget_after_fork(&self) {
        self.accounting.page().forget_after_fork();
        self.accounting.group().forget_after_fork();
        self.handles.close_kept_after_fork();
        self.exports.close_kept_after_fork();
    }
}
