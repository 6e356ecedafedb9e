//! Tiered spill (`VRAMCAP_SPILL=tiered`): the blocks kernels use most live
//! on the GPU within the cap, the others in pinned host memory the GPU
//! reads over the link, and a block moves between the two without changing
//! its address. How and why, with the measurements behind the constants:
//! `docs/design/tiered.md`. The locks: `engine/mod.rs`, "Concurrency".
//!
//! # Files
//! - `block`: one block ([`TierBlock`]): its place, its claim for a move,
//!   the spots where uses pointed since the last round.
//! - `registry`: the block map and the per-context and per-round state of
//!   [`Tiers`]; `gate`: the gate that moves close.
//! - `heat` (launch decoding) and `graph_heat` (executable graphs' uses).
//! - `plan`: pure Rust, tested without a driver: a round's heat and score
//!   (`take_round`) and the moves it chooses (`plan`).
//! - `phases`: pure too, issue 44's first step: where a step's launch order
//!   repeats, its phases under a budget, and where a follower of the step
//!   would lock on: what the rounds report at debug level (the staging
//!   forms built over it were measured and deleted: `docs/design/tiered.md`).
//! - `rounds` (the background thread's moves), `bulk` (parking's moves
//!   of every block, `VRAMCAP_PARK_MOVE=shim`), `pages` (the host pages a
//!   parked block's bytes wait in), `budget` (where a block's
//!   bytes are counted: the device's budget or the host's), `handles` (the
//!   program's own `cuMemCreate` handles under tiered spill).
//!
//! # A part
//! [`Tiers`] is its state and [`Tiering`] its methods, which see that
//! state, the accounting's `Accounting` and the host memory's budget
//! ([`HostRoom`], the spill limit's, which the engine answers) and nothing
//! else of the engine. The allocation path and frees of a block are
//! pipeline steps (`engine/pipeline/tiered.rs`); the launch, copy and
//! memset hooks are a family (`handlers/launch.rs`); the program's own
//! handles are the VMM family's (`handlers/vmm_tiered.rs`).
//!
//! # Invariants
//! - A block's place and handle change only in a round or a park's moves, while it is
//!   claimed; a free removes it from the map first and waits for a claim to
//!   end, so a block is never freed during a move, and its bytes are
//!   settled by the place it ends in.
//! - A block's bytes are charged once: reserved under the cap on the
//!   device, counted as spilled on the host.
//! - Nothing moves while a stream capture is in progress or the gate is
//!   open to a hook's driver call.
//! - The launch, copy and memset hooks are handed out only in this mode
//!   (the hook list's `tiered` flag); otherwise the program gets the
//!   driver's own functions and pays nothing.

/// Reads a lock, carrying on after a panic elsewhere (every write is one
/// insert or remove, never left half done).
macro_rules! read {
    ($l:expr) => {
        $l.read().unwrap_or_else(|e| e.into_inner())
    };
}
macro_rules! write {
    ($l:expr) => {
        $l.write().unwrap_or_else(|e| e.into_inner())
    };
}

mod budget;
mod bulk;
pub(super) mod handles;
pub(in crate::engine) mod pages;
mod rounds;

mod block;
mod gate;
mod graph_heat;
mod heat;
// Issue 44's spike, step 1: pure and tested; the rounds report what it
// finds at debug level (docs/design/tiered.md, "Staging ahead").
mod peers;
mod phases;
mod plan;
mod registry;

pub(in crate::engine) use self::block::*;
pub(in crate::engine) use self::graph_heat::*;
pub(in crate::engine) use self::handles::Handles;
pub(in crate::engine) use self::heat::*;
pub(in crate::engine) use self::plan::*;
use self::registry::block_at;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::engine::accounting::state::Accounting;
use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::log_once;

/// The host memory tiered blocks may take: the spill limit's budget,
/// answered by the engine (`spill.rs` keeps it).
pub trait HostRoom: Sync {
    /// The bytes the budget has left.
    fn room(&self) -> u64;
    /// Takes `bytes` from the budget; false when they do not fit.
    fn take(&self, bytes: u64) -> bool;
    /// Gives `bytes` back.
    fn give_back(&self, bytes: u64);
}

/// Tiered spill at work (the module docs' "A part").
/// A round's moves need the `'static` view (a synchronisation runs on a
/// thread of its own).
pub struct Tiering<'a, D: Driver> {
    pub tiers: &'a Tiers,
    pub driver: &'a D,
    pub accounting: &'a Accounting<D>,
    pub host: &'a dyn HostRoom,
}

/// A host block displaces device blocks only when its score per byte is
/// this many times theirs. At 2 a weight-holding block (read by matrix
/// products) could stay on the host beside optimizer state it was not
/// twice as hot as. Training side by side with 2 (docs/design/gpu-history.md),
/// 1.25 ran 1.39x and 1.40x at 1.1x its cap (2: 1.51x, 1.52x) and 2.62x
/// at 1.25x (3.78x), but 8.62x at 1.5x (7.80x), where more blocks swapped.
pub const HYSTERESIS: f64 = 1.25;
/// The launches issue 44's record keeps (at debug level only).
pub const TRACE_LAUNCHES: usize = 16384;
/// What promotions leave free below the target, so that a promotion does
/// not race the program's next allocation for the last bytes. The first
/// cut left 1/64 of the cap, which grows with the cap (1.25 GiB of an
/// 80 GiB one) while the race does not; every byte left free keeps a
/// byte on the host. Side by side in training (docs/design/gpu-history.md,
/// session 10), 8 MiB ran 1.38x at 1.1x its cap and 7.74x at 1.5x, 1/64
/// 1.40x and 8.19x.
pub const PROMOTE_MARGIN: u64 = 8 << 20;
/// Rounds a moved block stays where it went.
pub const MIN_ROUNDS: u64 = 20;
/// The most bytes one round moves (promotions and demotions together).
pub const ROUND_BYTES: u64 = 1 << 30;
/// The most parameter bytes a launch is scanned for.
const SCAN_BYTES: usize = 8192;
/// How long a round waits for the gate before it gives up.
pub const STOP_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a round first waits, with the gate closed, for the GPU to
/// finish the program's work before it gives up. The wait follows the
/// program's work: it is at least twice the longest recent drain (the time
/// a synchronisation took, counting one that finished after its round gave
/// up; each shorter one takes 1/16 off it), and doubles with each give-up
/// in a row (2, 4, then 8 s), at most [`MAX_SYNC_WAIT`]. A give-up before
/// any drain was seen only learns it; after that, moves pause for
/// [`STALL_ROUNDS`] rounds, and three give-ups in a row, or ten in all,
/// stop them for good. A program whose blocks are on the host runs slowly,
/// and its queue can hold seconds of work (training at 1.7x its need waited
/// 2 s and paused: issue 32); work that waits on the held program itself (a
/// stream waiting for a value a held thread would write, a kernel waiting
/// on another GPU's in single-process NCCL) never finishes while it is
/// held, and each try at it holds the program for the wait.
pub const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The longest a round waits for the GPU.
pub const MAX_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// Give-ups in all after which moves stop for good.
const MAX_STALLS: u64 = 10;
/// Rounds moves pause for after a round gave up waiting for the GPU.
pub const STALL_ROUNDS: u64 = 100;
/// The most parameter layouts kept (then they are forgotten and asked again).
const MAX_LAYOUTS: usize = 1 << 16;
/// The most executable graphs whose uses are kept at once (graphs
/// instantiated while that many are kept count no uses).
const MAX_GRAPHS: usize = 1 << 14;

const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `extra` keys of `cuLaunchKernel`.
const CU_LAUNCH_PARAM_END: usize = 0;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// The process's tiered blocks and what decides their place.
pub struct Tiers {
    /// Blocks are made: under tiered spill, and for parking's moves
    /// (`VRAMCAP_PARK_MOVE=shim`).
    on: bool,
    /// Blocks are placed by heat (tiered spill): rounds plan moves and
    /// launches and graphs are decoded; without it, blocks stay where they
    /// are made until parking moves them.
    placing: bool,
    /// Host pages of parked blocks that went back to the GPU (`pages.rs`),
    /// kept for the next park; still charged to the host budget.
    kept: Mutex<Vec<pages::Pages>>,
    /// Issue 44's record (`phases.rs`), kept only while the log is at
    /// debug level: the kernel of each of the last [`TRACE_LAUNCHES`]
    /// launches and the blocks (their addresses) it used.
    recording: AtomicBool,
    trace: Mutex<std::collections::VecDeque<phases::Launched>>,
    blocks: RwLock<BTreeMap<u64, Arc<TierBlock>>>,
    /// Lowest start and highest end of any block ever made: a cheap first
    /// test for the words a launch passes.
    lo: AtomicU64,
    hi: AtomicU64,
    layouts: RwLock<HashMap<usize, Layout>>,
    /// Executable graphs' uses, by handle.
    graphs: RwLock<HashMap<u64, Arc<GraphUses>>>,
    /// (context, its mover stream).
    movers: Mutex<Vec<(usize, usize)>>,
    /// Closed while blocks move (module docs).
    gate: RwLock<()>,
    /// Each device's VMM granularity, 0 until asked (`u64::MAX`: none).
    granularity: [AtomicU64; vramcap_core::MAX_DEVICES],
    /// The devices the program let reach each device's memory
    /// (`cuCtxEnablePeerAccess`; bit p: device p): the driver's peer
    /// mapping covers no VMM memory, so the shim's blocks there are
    /// granted to them too (`peers.rs`). Only ever gains bits.
    peers: [AtomicU64; vramcap_core::MAX_DEVICES],
    round: AtomicU64,
    /// `launches` when scores were last decayed.
    scored: AtomicU64,
    /// Frees made during a capture, left to the next round.
    deferred: Mutex<Vec<(Arc<TierBlock>, crate::engine::accounting::records::Record)>>,
    /// Rounds in a row that gave up waiting for the GPU, and rounds that
    /// gave up in all.
    stalls: AtomicU64,
    stalls_total: AtomicU64,
    /// The last drain seen, in µs (the wait follows it: [`SYNC_WAIT`]), and
    /// the wait before the first one, in µs (a test shortens it).
    drain_us: AtomicU64,
    base_wait_us: AtomicU64,
    /// Threads a round started to synchronise contexts that may still be
    /// in the driver (one outlives a round that gave up waiting for it).
    quiescing: AtomicU32,
    /// Held shared by a placement round throughout, exclusively by the
    /// program's context destroy and primary-context release or reset
    /// (`lifecycle.rs`), so that no round uses a context being destroyed.
    /// Nothing else takes it: a program thread that a destroy waits for
    /// (through the GPU's work) never waits on it.
    running: RwLock<()>,
    /// A destroy gave up waiting for `quiescing` once: such a thread may
    /// never return, and later ones do not wait for it again.
    quiesce_abandoned: AtomicBool,
    /// The rounds moves still pause for (`u64::MAX`: for good).
    pause: AtomicU64,
    /// Launches seen (a graph's launch counts each of its kernels), and
    /// words in them that named a tiered block (a graph's merged words
    /// count once each launch).
    launches: AtomicU64,
    hits: AtomicU64,
}
