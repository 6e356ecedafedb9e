//! The engine: everything the shim decides, in plain Rust. It knows no
//! exports, no `dlsym` and no function-pointer tables: the boundary layer
//! calls one of its handlers per hooked driver function, passing the
//! caller's arguments and a closure that makes the real call; every other
//! driver function it needs comes through the [`Driver`] trait. Its unit
//! tests (`tests/`) run it against a fake driver.
//!
//! # Parts, bottom up (no module imports one above it)
//! - `driver`, `records`, `ledger`, `inflight`, `worker`, `exports`
//!   (over the C types of `crate::ffi`): the driver trait, the records of live allocations,
//!   the book of pools and the context's measurement, the allocations in
//!   flight, the background thread, and how an import is known to be of
//!   this process's own export.
//! - `page`, `group`: the statistics page and the group membership.
//! - `base` (+ `accounting`, `held`): what every part stands on, the
//!   budgets, and what a process holds beyond its allocations (pools,
//!   graph memory, the context).
//! - `cache`, `spill`, `tier`: the freed-block cache, spill to host memory
//!   and tiered spill's blocks, heat, plan and gate.
//! - `state`: the [`Engine`], which owns all of the above.
//! - the handlers, by family: `alloc` (plain, pitched and managed memory,
//!   frees, memory queries), `pools` (stream-ordered), `vmm`, `arrays`,
//!   `lifecycle` (contexts, captures, IPC), `nvml`, `live` (caps changed
//!   while the program runs), `placement` (tiered spill's allocation,
//!   frees, rounds and launch, copy and memset hooks), `handles` (tiered
//!   spill of the program's own `cuMemCreate` memory).
//!
//! # Concurrency
//! - Budgets, counters, the capture count and every lazily made pointer are
//!   atomics. A reservation is a compare-and-swap under the cap.
//! - Locks: the record maps' shard locks (`records`), one mutex per device
//!   cache (`cache`), the spill's deferred-free list (`spill`), the book of
//!   pools and the graph-reserve mutex (`ledger`, `held`), and `OnceLock`s
//!   of values made once. Each is held for a map or list operation only,
//!   never across `dlopen` or `dlsym`, and never two at once (the list of
//!   exports asks the VMM records whether a handle is live under its
//!   mutex: one shard lookup, and no code takes the list holding a
//!   record): there is no lock order, except under tiered spill (`tier`:
//!   rounds against context teardown, then the cache's ordering lock, then
//!   its gate, which a round holds across the driver calls of a move). Only the book of pools and the graph-reserve mutex are
//!   held across driver calls, the attribute reads whose figures they
//!   apply, which call nothing the shim hooks and never wait on the GPU. The page
//!   and the group membership are made by one thread while others yield
//!   (`page`, `group`); an allocation that needs the context's first figure
//!   while another thread measures it sleeps until it is there (`held`); a
//!   cap change waits (yielding) for the allocations in flight under the
//!   old cap to finish their driver calls (`live`), which never wait on it.
//! - What allocates: making the engine (first hook), the page and the group
//!   membership (first use of a device), the check that the limit's device
//!   keys name GPUs (first use of any device, only when it names devices),
//!   record inserts, keeping a cached block and a context's first ticket,
//!   the lists an eviction, a context teardown or an unmap releases,
//!   deferring and reaping spilled frees, NVML's UUID text, a pool's first
//!   entry in the book, the list of pools a refresh walks, a graph's node
//!   list when it is sized. Logging never allocates. ARCHITECTURE.md has the whole list.
//! - `fork`: the boundary's child handler closes the inherited page and
//!   group descriptors ([`Engine::forget_after_fork`]) and drops the engine
//!   from use without touching its maps or locks (a parent thread may have
//!   held one at the fork); the child's first hook makes a fresh engine,
//!   with a page and membership of its own. Settings are kept.
//! - Killed at any instruction: the page and group files hold only atomics
//!   and are published complete (temporary file, then rename or link); a
//!   dead process's liveness locks go with it, and a dead group member's
//!   bytes with its slot (`vramcap_core::group`).
//! - Waiting: nothing waits on another process. At exit, leaving the group
//!   waits for this process's own group calls in flight (a few atomics
//!   each); a group reservation that other members' reservations in flight
//!   are in the way of yields and retries for at most
//!   `group::CONTENDED_FOR`.

pub mod driver;

mod accounting;
mod alloc;
mod arrays;
mod base;
mod cache;
mod exports;
mod group;
mod handles;
mod held;
mod inflight;
mod ledger;
mod lifecycle;
mod live;
mod nvml;
mod page;
mod placement;
mod pools;
mod records;
mod spill;
mod state;
mod tier;
mod vmm;
mod worker;

#[cfg(test)]
mod tests;

pub use self::driver::{Driver, Flavour};
pub use self::live::{EINVAL, ENODEV};
pub use self::state::Engine;
pub use self::worker::reset_after_fork as reset_worker_after_fork;
