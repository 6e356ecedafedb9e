//! Tiered spill (`VRAMCAP_SPILL=tiered`): the blocks kernels use most live
//! on the GPU within the cap, the others in pinned host memory the GPU
//! reads over the link, and a block moves between the two without changing
//! its address.
//!
//! # How
//! - **Blocks.** A plain `cuMemAlloc_v2` of at least the device's VMM
//!   granularity (2 MiB) becomes a reserved address range with one
//!   physical allocation mapped behind it (`cuMemAddressReserve`,
//!   `cuMemCreate`, `cuMemMap`, `cuMemSetAccess` for the device), its size
//!   rounded up to the granularity, which is what is charged. Within the
//!   cap the physical memory is the device's and is reserved under the
//!   cap; past it, it is pinned host memory (`CU_MEM_LOCATION_TYPE_HOST`)
//!   and counts as spilled. The program's own `cuMemCreate` memory, mapped
//!   whole at its own address, is a block too (`engine/handles.rs`: the
//!   engine answers handles of its own, so the memory behind one can
//!   change). Smaller allocations, pitched, stream-ordered and array
//!   memory stay as they are and never move.
//!   Managed memory was measured first and is not used: the driver keeps a
//!   managed block's device pages allocated after they move to the host
//!   (docs/gpu-results.md), so it cannot keep a cap.
//! - **Heat.** Every kernel launch (`cuLaunchKernel`, `cuLaunchKernelEx`,
//!   `cuLaunchCooperativeKernel` and their `_ptsz` forms) is decoded: the
//!   function's parameter layout (`cuFuncGetParamInfo`, or
//!   `cuKernelGetParamInfo` for a `CUkernel` handle; asked once per
//!   function and kept) gives each parameter's bytes, or the `extra`
//!   buffer is taken whole, and every 8-byte word that falls inside a
//!   tiered block is a use of it at that offset. A block keeps the
//!   distinct offsets of a round's uses ([`SPOTS`] of them) and their
//!   weight; a use is taken to touch the bytes from its offset to the next
//!   offset used (or the block's end), as element-wise kernels touch a
//!   whole tensor and PyTorch's segments hold tensors end to end. The
//!   round's heat of a block is then its cost on the host in passes over
//!   each of its bytes. (Counting uses alone made a segment of many small
//!   tensors look hotter than one large tensor read as often; measured in
//!   docs/gpu-results.md.) Pointers inside device-side structures and
//!   copies are not seen.
//! - **Graphs.** When an executable graph is instantiated its kernel nodes
//!   are read (`cuGraphKernelNodeGetParams_v2`, child graphs included) and
//!   decoded as launches are; the words that name a tiered block are kept
//!   (one entry a word, weights summed), and each `cuGraphLaunch` counts
//!   them as uses, found by address then, and its kernels as launches for
//!   the scores' decay. Only blocks that exist when it is instantiated are
//!   looked for. An executable graph updated with `cuGraphExecUpdate` is
//!   read again from its new graph; one whose kernel node is changed in
//!   place (`cuGraphExecKernelNodeSetParams`, `cuGraphExecNodeSetParams`)
//!   counts no uses from then on, rather than the old parameters' uses.
//!   The bodies of conditional nodes are not read, and at most
//!   [`MAX_GRAPHS`] executable graphs are kept at once. A launch on a
//!   capturing stream counts once as it is captured, though nothing runs.
//! - **Placement.** Each round of the background thread (every
//!   [`TICK`](crate::engine::worker::TICK)), outside stream captures, folds the
//!   heat into a decaying score and ranks blocks by it. Hot host blocks
//!   are promoted into the room under the cap (less [`PROMOTE_MARGIN`]),
//!   then swapped with device blocks colder by more than [`HYSTERESIS`];
//!   a process above its cap (lowered while it runs) demotes its coldest
//!   blocks until it is under. A block moved stays put for [`MIN_ROUNDS`]
//!   rounds, and a round moves at most [`ROUND_BYTES`].
//! - **Moves.** A move makes the new physical memory (a promotion reserves
//!   its bytes under the cap first) and maps it at a scratch address. Then
//!   the world stops: the gate that every launch, copy, memset and stream
//!   memory operation hook passes is closed, and every context that owns
//!   tiered blocks is synchronised (on a thread of its own, for at most
//!   [`SYNC_WAIT`], doubled each time it was not enough: work waiting on
//!   something the held program would do never finishes, and then the
//!   round gives up and moves pause), so
//!   nothing the program issued can be touching the block. The data is
//!   copied, the block's address is unmapped and mapped to the new memory,
//!   and the old memory is released (a demotion's bytes leave the
//!   reservation only then). The gate opens again. Copies and memsets are
//!   hooked only for this gate.
//! - **Frees.** `cuMemFree` of a tiered block synchronises its context
//!   first, as the driver's does (unmapping memory a kernel still uses
//!   faults the kernel); during a capture it is left to the next round. A
//!   context that goes away does not take VMM memory with it: its blocks
//!   are unmapped and released then. Parameter layouts are forgotten when
//!   a module or library is unloaded (its handles come back).
//! - The launch, copy and memset hooks are handed out by `cuGetProcAddress`
//!   and `dlsym` only in this mode (`boundary/resolve.rs`); otherwise the
//!   program gets the driver's own functions and pays nothing.
//!
//! # Concurrency
//! - The blocks are an ordered map (start address → `Arc<TierBlock>`) under
//!   an `RwLock`: launches take it shared for one lookup pass; allocation
//!   and free take it exclusively for one insert or remove. The parameter
//!   layouts are a map under their own `RwLock`, written once per
//!   function, and the executable graphs' uses another, written once per
//!   instantiation and destruction (a graph launch clones its entry's
//!   `Arc` and lets go before it takes the blocks' lock). None is held
//!   across a driver call or with another lock.
//! - The gate is an `RwLock<()>`: hooks hold it shared across their driver
//!   call, a round's stop holds it exclusively. The round takes it with
//!   `try_write` in a yielding loop for at most [`STOP_WAIT`] and gives up
//!   the round otherwise, so a program thread that blocks inside a gated
//!   call on something another thread would do after its next gated call
//!   cannot deadlock with it. Lock order: the cache's ordering lock, then
//!   the gate; hooks take only the gate.
//! - A block's spots are atomics, with no lock: a use takes a free spot
//!   with one compare-and-swap (from zero to its offset plus one) and adds
//!   its weight there, its only write to the block (the round sums the
//!   weights it reads into the block's total); a round swaps every spot
//!   back to zero as it reads it. A launch racing that reset can add one
//!   use's weight to a spot another offset then takes, or to one the round
//!   has just freed (that weight is then lost): a heuristic's error, never
//!   a torn value.
//! - A block's place (`state`, `handle`) changes only in a round, while the
//!   block is claimed (`moving`). A free first removes the block from the
//!   map and sets `freed`, then waits (yielding) while it is claimed; a
//!   round sets `moving`, then skips the block if `freed` is set. Both
//!   orders are sequentially consistent, so either the round sees the free
//!   or the free waits for the move: a block is never freed during a move,
//!   and its bytes are settled by the place it ends in.
//! - A round holds the cache's ordering lock shared, so no capture begins
//!   while it makes driver calls (captures begin under that lock held
//!   exclusively), and it makes none while a capture is in progress.
//! - A round also holds `running` shared. The program's `cuCtxDestroy`
//!   and primary-context release or reset hold it exclusively around the
//!   driver's call, and first wait for any thread a round left
//!   synchronising contexts (`quiescing`, at most 10 s, once), so no round
//!   uses a context the driver is destroying. Lock order: `running`, then
//!   the cache's ordering lock, then the gate. Nothing a program thread
//!   does besides that teardown takes `running`, so a destroy that waits
//!   for the GPU, and the GPU for a program thread, cannot hold that
//!   thread up.
//! - What allocates: a block's insert, a function's layout, an executable
//!   graph's uses (at its instantiation, never at its launch), a round's
//!   snapshot, its lists of a region's uses (made once a round) and plan,
//!   the first mover stream of a context.
//! - Killed at any instruction: nothing here outlives the process.

pub(super) mod handles;
mod placement;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::engine::driver::Driver;
use crate::ffi::*;
use crate::log::log_once;

pub(in crate::engine) const ON_DEVICE: u8 = 0;
pub(in crate::engine) const ON_HOST: u8 = 1;

/// A block's score halves every this many launches (not rounds: a score
/// then covers the same stretch of a program's work at any speed).
pub(in crate::engine) const HALF_LIFE_LAUNCHES: f64 = 4000.0;
/// A host block displaces device blocks only when its score per byte is
/// this many times theirs. At 2 a weight-holding block (read by matrix
/// products) could stay on the host beside optimizer state it was not
/// twice as hot as. Training side by side with 2 (docs/gpu-results.md),
/// 1.25 ran 1.39x and 1.40x at 1.1x its cap (2: 1.51x, 1.52x) and 2.62x
/// at 1.25x (3.78x), but 8.62x at 1.5x (7.80x), where more blocks swapped.
pub const HYSTERESIS: f64 = 1.25;
/// What promotions leave free below the target, so that a promotion does
/// not race the program's next allocation for the last bytes. The first
/// cut left 1/64 of the cap, which grows with the cap (1.25 GiB of an
/// 80 GiB one) while the race does not; every byte left free keeps a
/// byte on the host. Side by side in training (docs/gpu-results.md,
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
/// finish the program's work before it gives up; each time it gave up the
/// wait doubles (2, 4, then 8 s), and after three moves stop for good. A
/// program whose blocks are on the host runs slowly, and its queue can hold
/// seconds of work (training at 1.5x its cap, 2.8 s a step, gave up at a
/// fixed 2 s: docs/gpu-results.md); work that waits on the held program
/// itself (a stream waiting for a value a held thread would write, a
/// kernel waiting on another GPU's in single-process NCCL) never finishes,
/// and each try at it holds the program for the wait.
pub const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Rounds moves pause for after a round gave up waiting for the GPU.
const STALL_ROUNDS: u64 = 100;
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

/// One tiered allocation.
pub struct TierBlock {
    pub ptr: u64,
    /// Rounded up to the granularity: what is mapped and charged.
    pub bytes: u64,
    pub device: u16,
    pub ctx: usize,
    /// The physical allocation mapped at `ptr` now.
    pub(in crate::engine) handle: AtomicU64,
    pub(in crate::engine) state: AtomicU8,
    moving: AtomicBool,
    freed: AtomicBool,
    /// The program's handle when the block is memory the program made
    /// with `cuMemCreate` and mapped itself (`engine/handles.rs`); 0 for
    /// the engine's own blocks.
    pub program_handle: u64,
    /// Never moves again (a page mapped a second time, or exported).
    pinned: AtomicBool,
    /// May move: the engine's blocks from the start, the program's once
    /// it has granted access to them (the move's copy reads them).
    ready: AtomicBool,
    /// What access the program granted to its block, given again after a
    /// move (whose mapping grants only the block's device read-write).
    pub(in crate::engine) access: Mutex<Vec<CUmemAccessDesc>>,
    /// Where in the block uses pointed since the last round, and their
    /// weight there: what a use touches is taken to reach from its offset
    /// to the next offset used (module docs).
    spots: [Spot; SPOTS],
    /// The weight of uses that found no free spot.
    unplaced: AtomicU32,
    /// The weight of the uses seen up to the last round (only rounds
    /// write it).
    pub(in crate::engine) weight: AtomicU64,
    /// f64 bits; only rounds touch it.
    pub(in crate::engine) score: AtomicU64,
    /// The round that last moved it.
    pub(in crate::engine) moved: AtomicU64,
    /// The last round a launch named an offset in it (0: none yet).
    named: AtomicU64,
}

impl TierBlock {
    pub fn on_device(&self) -> bool {
        self.state.load(Ordering::SeqCst) == ON_DEVICE
    }
    /// The physical allocation mapped at the block now.
    pub fn handle(&self) -> u64 {
        self.handle.load(Ordering::SeqCst)
    }
    pub(in crate::engine) fn score(&self) -> f64 {
        f64::from_bits(self.score.load(Ordering::Relaxed))
    }
    /// What keeping the block on the host costs per byte: its score is
    /// already in passes over each byte.
    fn density(&self) -> f64 {
        self.score()
    }
    /// Whether a round may move it (not pinned, and ready).
    pub(in crate::engine) fn movable(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.pinned.load(Ordering::SeqCst)
    }
    /// Claims the block for a move: `None` when it is being freed, is
    /// pinned, or is moved already. The claim ends when the [`Claim`] is
    /// dropped, on a panic's unwinding too, so a free never waits on a
    /// move that died.
    pub(in crate::engine) fn claim(self: &Arc<Self>) -> Option<Claim> {
        if self.moving.swap(true, Ordering::SeqCst) {
            return None;
        }
        if self.freed.load(Ordering::SeqCst) || !self.movable() {
            self.moving.store(false, Ordering::SeqCst);
            return None;
        }
        Some(Claim(self.clone()))
    }
    /// The block as memory the program made with `cuMemCreate` and mapped
    /// whole (`engine/handles.rs`), under its handle `h`: it may move once
    /// the program grants access to it.
    pub(in crate::engine) fn of_program(mut self, h: u64) -> Self {
        self.program_handle = h;
        self.ready = AtomicBool::new(false);
        self
    }
    /// Holds the block where it is for as long as the [`Claim`] lives,
    /// waiting for a move in progress to end: `None` when it is freed.
    pub(in crate::engine) fn hold(self: &Arc<Self>) -> Option<Claim> {
        while self.moving.swap(true, Ordering::SeqCst) {
            std::thread::yield_now();
        }
        if self.freed.load(Ordering::SeqCst) {
            self.moving.store(false, Ordering::SeqCst);
            return None;
        }
        Some(Claim(self.clone()))
    }
    /// Keeps the block where it is from now on, once any move of it has
    /// ended: its handle is then final. The same handshake as a free's
    /// (`pinned` set before `moving` is read, `moving` set before a claim
    /// reads `pinned`).
    pub(in crate::engine) fn pin(&self) {
        self.pinned.store(true, Ordering::SeqCst);
        while self.moving.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }
    /// The program granted this access to its block (`engine/handles.rs`):
    /// it may move now, and a move grants it again.
    /// Each descriptor replaces the one for its location, if any: a
    /// program may grant its devices one call each (PyTorch does).
    pub(in crate::engine) fn granted(&self, access: &[CUmemAccessDesc]) {
        let mut kept = self.access.lock().unwrap_or_else(|e| e.into_inner());
        for d in access {
            match kept.iter_mut().find(|k| k.location == d.location) {
                Some(k) => *k = *d,
                None => kept.push(*d),
            }
        }
        self.ready.store(true, Ordering::SeqCst);
    }
    /// No move of it from now on (it is being freed or unmapped): waits for
    /// a move in progress to end, after which its handle is final.
    pub(in crate::engine) fn stop(&self) {
        self.freed.store(true, Ordering::SeqCst);
        while self.moving.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }
}

/// A block claimed for a move ([`TierBlock::claim`]).
pub(in crate::engine) struct Claim(Arc<TierBlock>);

impl std::ops::Deref for Claim {
    type Target = TierBlock;
    fn deref(&self) -> &TierBlock {
        &self.0
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.moving.store(false, Ordering::SeqCst);
    }
}

/// Distinct offsets a block keeps per round.
pub const SPOTS: usize = 16;

/// One offset uses pointed at: `at` is the offset plus one (0: free).
#[derive(Default)]
struct Spot {
    at: AtomicU64,
    weight: AtomicU32,
}

impl TierBlock {
    fn new(
        ptr: u64,
        bytes: u64,
        device: u16,
        ctx: usize,
        handle: u64,
        state: u8,
        round: u64,
    ) -> Self {
        TierBlock {
            ptr,
            bytes,
            device,
            ctx,
            handle: AtomicU64::new(handle),
            state: AtomicU8::new(state),
            moving: AtomicBool::new(false),
            freed: AtomicBool::new(false),
            program_handle: 0,
            pinned: AtomicBool::new(false),
            ready: AtomicBool::new(true),
            access: Mutex::new(Vec::new()),
            spots: Default::default(),
            unplaced: AtomicU32::new(0),
            weight: AtomicU64::new(0),
            score: AtomicU64::new(0f64.to_bits()),
            moved: AtomicU64::new(round),
            named: AtomicU64::new(0),
        }
    }

    /// A use of `weight` at `offset` into the block. Lock-free: a spot is
    /// taken by one compare-and-swap; a race with a round's reset at worst
    /// moves one use's weight to another offset.
    fn note(&self, offset: u64, weight: u32) {
        let key = offset + 1;
        for s in &self.spots {
            let mut at = s.at.load(Ordering::Relaxed);
            if at == 0 {
                at = match s
                    .at
                    .compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => key,
                    Err(now) => now,
                };
            }
            if at == key {
                s.weight.fetch_add(weight, Ordering::Relaxed);
                return;
            }
        }
        self.unplaced.fetch_add(weight, Ordering::Relaxed);
    }

    /// The round's uses of the block, resetting its spots for the next
    /// round: the distinct offsets used with their weight (sorted by
    /// offset), and the weight of the uses that found no spot.
    fn take_spots(&self) -> ([(u64, u32); SPOTS], usize, u32) {
        let mut seen: [(u64, u32); SPOTS] = [(0, 0); SPOTS];
        let mut n = 0;
        for s in &self.spots {
            let at = s.at.swap(0, Ordering::Relaxed);
            let w = s.weight.swap(0, Ordering::Relaxed);
            if at != 0 && w != 0 {
                seen[n] = (at - 1, w);
                n += 1;
            }
        }
        seen[..n].sort_unstable();
        (seen, n, self.unplaced.swap(0, Ordering::Relaxed))
    }

    /// [`take_round`] of this block alone.
    #[cfg(test)]
    fn take_passes(self: &Arc<Self>) -> (f64, u64) {
        let mut out = [(0f64, 0u64)];
        take_region(
            std::slice::from_ref(self),
            &[0],
            0,
            &mut out,
            &mut Scratch::default(),
        );
        out[0]
    }

    /// The weight of the uses since the last round, its spots left as
    /// they are.
    #[cfg(test)]
    fn heat(&self) -> u64 {
        let placed: u64 = self
            .spots
            .iter()
            .map(|s| u64::from(s.weight.load(Ordering::Relaxed)))
            .sum();
        placed + u64::from(self.unplaced.load(Ordering::Relaxed))
    }
}

/// What the engine knows of a launched function: its parameters' (offset,
/// size), `None` when the driver would not say; and what one use by it
/// weighs.
struct Kernel {
    params: Option<Box<[(u32, u32)]>>,
    weight: u32,
}

type Layout = Arc<Kernel>;

/// What the kernel nodes of an executable graph name in tiered blocks:
/// each word once, with the weights of its uses summed; and how many
/// kernel nodes it has.
pub struct GraphUses {
    kernels: u64,
    words: Box<[(u64, u32)]>,
}

/// What a use by a matrix product or convolution weighs against one by
/// any other kernel. Such kernels read their operands many times over
/// (once per tile), so an operand in host memory costs them many trips
/// over the link, where an element-wise kernel reads it once.
pub const PRODUCT_WEIGHT: u32 = 32;

/// Whether a kernel's (mangled) name is that of a matrix product or a
/// convolution, by the words cuBLAS, CUTLASS, cuDNN and Triton put there.
pub fn is_product(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "gemm",
        "gemv",
        "xmma",
        "cutlass",
        "convolve",
        "convolution",
        "fprop",
        "dgrad",
        "wgrad",
        "matmul",
        "_mm_",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// The process's tiered blocks and what decides their place.
pub struct Tiers {
    on: bool,
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
    pub(in crate::engine) round: AtomicU64,
    /// `launches` when scores were last decayed.
    pub(in crate::engine) scored: AtomicU64,
    /// Frees made during a capture, left to the next round.
    deferred: Mutex<Vec<(Arc<TierBlock>, crate::engine::accounting::records::Record)>>,
    /// Rounds that gave up waiting for the GPU, and the round moves resume.
    stalls: AtomicU64,
    /// Threads a round started to synchronise contexts that may still be
    /// in the driver (one outlives a round that gave up waiting for it).
    pub(in crate::engine) quiescing: AtomicU32,
    /// Held shared by a placement round throughout, exclusively by the
    /// program's context destroy and primary-context release or reset
    /// (`lifecycle.rs`), so that no round uses a context being destroyed.
    /// Nothing else takes it: a program thread that a destroy waits for
    /// (through the GPU's work) never waits on it.
    pub(in crate::engine) running: RwLock<()>,
    /// A destroy gave up waiting for `quiescing` once: such a thread may
    /// never return, and later ones do not wait for it again.
    pub(in crate::engine) quiesce_abandoned: AtomicBool,
    resume: AtomicU64,
    /// Launches seen (a graph's launch counts each of its kernels), and
    /// words in them that named a tiered block (a graph's merged words
    /// count once each launch).
    pub launches: AtomicU64,
    pub hits: AtomicU64,
}

/// One of the program's `cuMemCreate` handles under tiered spill
/// (`engine/handles.rs`): where its memory is while no block holds it.
pub(in crate::engine) struct Handle {
    /// The engine's cell whose address is the handle's value.
    pub(in crate::engine) _cell: Box<u64>,
    pub(in crate::engine) device: u16,
    pub(in crate::engine) bytes: u64,
    /// The physical allocation, when it is not a block (a block's own
    /// handle is the one in force while it is one).
    pub(in crate::engine) real: u64,
    pub(in crate::engine) on_device: bool,
    /// The program's references (create, retain, import of its export).
    pub(in crate::engine) refs: u32,
    /// Its live mappings.
    pub(in crate::engine) maps: u32,
    /// The block it is mapped as.
    pub(in crate::engine) block: Option<Arc<TierBlock>>,
    /// Mapped in part, twice, or exported: never a moving block again.
    pub(in crate::engine) pinned: bool,
    /// Descriptors of the engine's own, each open on the file description
    /// the handle was exported as (closed when the handle goes), to know
    /// an import of it (`engine/handles.rs`).
    pub(in crate::engine) exported: Vec<std::os::fd::OwnedFd>,
}

/// The program's handles under tiered spill, by value.
#[derive(Default)]
pub struct Handles {
    map: Mutex<HashMap<u64, Handle>>,
}

impl Handles {
    pub(in crate::engine) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Handle>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `h` is one of the program's handles the engine answered.
    pub fn contains(&self, h: u64) -> bool {
        self.lock().contains_key(&h)
    }

    /// In a child after fork (one thread): closes the descriptors kept of
    /// the parent's exports, which would keep the parent's memory
    /// allocated as long as the child lives. Only when the map is free: a
    /// lock another thread of the parent held at the fork is never let go
    /// in the child, and the map is not read then.
    pub fn close_kept_after_fork(&self) {
        if let Ok(mut m) = self.map.try_lock() {
            for x in m.values_mut() {
                x.exported.clear();
            }
        }
    }
}

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

impl Tiers {
    pub fn new(on: bool) -> Tiers {
        Tiers {
            on,
            blocks: RwLock::new(BTreeMap::new()),
            lo: AtomicU64::new(u64::MAX),
            hi: AtomicU64::new(0),
            layouts: RwLock::new(HashMap::new()),
            graphs: RwLock::new(HashMap::new()),
            movers: Mutex::new(Vec::new()),
            gate: RwLock::new(()),
            granularity: [const { AtomicU64::new(0) }; vramcap_core::MAX_DEVICES],
            round: AtomicU64::new(0),
            scored: AtomicU64::new(0),
            deferred: Mutex::new(Vec::new()),
            stalls: AtomicU64::new(0),
            quiescing: AtomicU32::new(0),
            running: RwLock::new(()),
            quiesce_abandoned: AtomicBool::new(false),
            resume: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// Whether tiered spill is on.
    pub fn on(&self) -> bool {
        self.on
    }

    /// A new block, made in this round (for [`Tiers::insert`]).
    pub(in crate::engine) fn make(
        &self,
        ptr: u64,
        bytes: u64,
        device: u16,
        ctx: usize,
        handle: u64,
        on_device: bool,
    ) -> TierBlock {
        TierBlock::new(
            ptr,
            bytes,
            device,
            ctx,
            handle,
            if on_device { ON_DEVICE } else { ON_HOST },
            self.round.load(Ordering::Relaxed),
        )
    }

    /// Tracks block `b`.
    pub(in crate::engine) fn insert(&self, b: TierBlock) -> Arc<TierBlock> {
        let (ptr, end) = (b.ptr, b.ptr.saturating_add(b.bytes));
        let b = Arc::new(b);
        write!(self.blocks).insert(ptr, b.clone());
        self.lo.fetch_min(ptr, Ordering::Relaxed);
        self.hi.fetch_max(end, Ordering::Relaxed);
        b
    }

    /// The blocks that lie wholly in `[lo, hi)`.
    pub(in crate::engine) fn blocks_within(&self, lo: u64, hi: u64) -> Vec<Arc<TierBlock>> {
        read!(self.blocks)
            .range(lo..hi)
            .map(|(_, b)| b)
            .filter(|b| b.ptr.saturating_add(b.bytes) <= hi)
            .cloned()
            .collect()
    }

    /// The blocks with any byte in `[lo, hi)`.
    pub(in crate::engine) fn blocks_overlapping(&self, lo: u64, hi: u64) -> Vec<Arc<TierBlock>> {
        let blocks = read!(self.blocks);
        let before = blocks
            .range(..lo)
            .next_back()
            .filter(|(_, b)| b.ptr.saturating_add(b.bytes) > lo);
        before
            .into_iter()
            .chain(blocks.range(lo..hi))
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// The program's blocks mapped in context `ctx` (their start addresses).
    pub(in crate::engine) fn mapped_in(&self, ctx: usize) -> Vec<u64> {
        read!(self.blocks)
            .values()
            .filter(|b| b.program_handle != 0 && b.ctx == ctx)
            .map(|b| b.ptr)
            .collect()
    }

    /// Takes the block at `ptr` out for a free, once no move holds it.
    pub fn detach(&self, ptr: u64) -> Option<Arc<TierBlock>> {
        let b = write!(self.blocks).remove(&ptr)?;
        b.stop();
        Some(b)
    }

    /// The heat of the block at `ptr` since the last round.
    #[cfg(test)]
    pub(in crate::engine) fn heat_of(&self, ptr: u64) -> Option<u64> {
        read!(self.blocks).get(&ptr).map(|b| b.heat())
    }

    /// Whether `addr` lies in a tiered block.
    pub fn contains(&self, addr: u64) -> bool {
        block_at(&read!(self.blocks), addr).is_some()
    }

    /// Puts a detached block back (its free failed).
    pub fn reattach(&self, b: Arc<TierBlock>) {
        b.freed.store(false, Ordering::SeqCst);
        write!(self.blocks).insert(b.ptr, b);
    }

    /// The parameter layout of `func`, asked of the driver once.
    fn layout<D: Driver>(&self, driver: &D, func: usize) -> Layout {
        if let Some(l) = read!(self.layouts).get(&func) {
            return l.clone();
        }
        let mut params = Vec::new();
        while params.len() < 4096 {
            match driver.param_info(func, params.len()) {
                Ok((off, size)) => params.push((off as u32, size as u32)),
                Err(_) => break,
            }
        }
        let weight = match driver.func_name(func) {
            Some(n) if is_product(&n) => PRODUCT_WEIGHT,
            _ => 1,
        };
        let l: Layout = Arc::new(Kernel {
            params: (!params.is_empty()).then(|| params.into()),
            weight,
        });
        if l.params.is_none() {
            log_once!(
                Info,
                "tiered spill: the driver gives no parameter layout for some kernels (cuFuncGetParamInfo); their launches do not count as uses"
            );
        }
        let mut layouts = write!(self.layouts);
        if layouts.len() >= MAX_LAYOUTS {
            layouts.clear();
        }
        layouts.insert(func, l.clone());
        l
    }

    /// A kernel launch: counts a use of every tiered block a parameter word
    /// points into.
    ///
    /// # Safety
    /// `params` and `extra` are what the program passed to a launch: null,
    /// or as the driver's launch functions require.
    pub unsafe fn note_launch<D: Driver>(
        &self,
        driver: &D,
        func: usize,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        let (lo, hi) = self.span();
        if lo >= hi || func == 0 {
            return;
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let kernel = self.layout(driver, func);
        let mut words: [u64; 64] = [0; 64];
        let mut n = 0usize;
        let mut hits = 0u64;
        // SAFETY: the caller's contract.
        unsafe {
            scan(&kernel, params, extra, lo, hi, |w| {
                words[n] = w;
                n += 1;
                if n == words.len() {
                    hits += self.note_words(&words, kernel.weight);
                    n = 0;
                }
            })
        };
        if n > 0 {
            hits += self.note_words(&words[..n], kernel.weight);
        }
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
    }

    /// The lowest start and highest end of any block ever made.
    fn span(&self) -> (u64, u64) {
        (
            self.lo.load(Ordering::Relaxed),
            self.hi.load(Ordering::Relaxed),
        )
    }

    /// A use of `weight` of every block a word points into: how many did.
    fn note_words(&self, words: &[u64], weight: u32) -> u64 {
        let map = read!(self.blocks);
        words.iter().filter(|&&w| note_in(&map, w, weight)).count() as u64
    }

    /// `exec` was instantiated from `graph`, or updated to follow it: what
    /// its kernel nodes' words name in tiered blocks now is kept, to count
    /// as uses at each launch (the driver copies a graph's parameters into
    /// the executable graph as it is instantiated).
    pub fn graph_instantiated<D: Driver>(&self, driver: &D, exec: u64, graph: usize) {
        let (lo, hi) = self.span();
        if lo >= hi {
            // No tiered block yet: nothing the graph names can be one.
            write!(self.graphs).remove(&exec);
            return;
        }
        let mut kernels = 0u64;
        let mut words: Vec<(u64, u32)> = Vec::new();
        let whole = driver.graph_kernels(graph, &mut |func, params, extra| {
            kernels += 1;
            if func == 0 {
                return;
            }
            let k = self.layout(driver, func);
            // SAFETY: the driver's own parameters of the node, laid out as
            // a launch's.
            unsafe { scan(&k, params, extra, lo, hi, |w| words.push((w, k.weight))) };
        });
        if !whole {
            log_once!(
                Info,
                "tiered spill: the driver would not say what some graph holds (its nodes, a kernel node's parameters, or a conditional node's body): what it did not say counts no uses"
            );
        }
        // One entry a word, weights summed; only words in a block now.
        words.sort_unstable();
        words.dedup_by(|next, kept| {
            next.0 == kept.0 && {
                kept.1 = kept.1.saturating_add(next.1);
                true
            }
        });
        {
            let map = read!(self.blocks);
            words.retain(|&(w, _)| block_at(&map, w).is_some());
        }
        let uses = Arc::new(GraphUses {
            kernels,
            words: words.into(),
        });
        let mut graphs = write!(self.graphs);
        if graphs.len() >= MAX_GRAPHS && !graphs.contains_key(&exec) {
            drop(graphs);
            log_once!(
                Info,
                "tiered spill: more than {MAX_GRAPHS} executable graphs at once; the launches of those made after count no uses"
            );
            return;
        }
        graphs.insert(exec, uses);
    }

    /// A launch of `exec`: its kernels' uses ([`Tiers::graph_instantiated`]),
    /// and its kernels count as launches for the scores' decay.
    pub fn note_graph(&self, exec: u64) {
        let Some(g) = read!(self.graphs).get(&exec).cloned() else {
            return;
        };
        self.launches.fetch_add(g.kernels, Ordering::Relaxed);
        let map = read!(self.blocks);
        let hits = g
            .words
            .iter()
            .filter(|&&(w, weight)| note_in(&map, w, weight))
            .count() as u64;
        drop(map);
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
    }

    /// `exec` is being destroyed: its uses, to put back if that fails.
    pub fn take_graph(&self, exec: u64) -> Option<Arc<GraphUses>> {
        write!(self.graphs).remove(&exec)
    }

    /// Puts back what [`Tiers::take_graph`] took (the destroy failed).
    pub fn put_graph(&self, exec: u64, uses: Arc<GraphUses>) {
        write!(self.graphs).entry(exec).or_insert(uses);
    }

    /// The mover stream of `ctx`, made on first use.
    pub(in crate::engine) fn mover<D: Driver>(&self, driver: &D, ctx: usize) -> Option<usize> {
        let mut movers = self.movers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, s)) = movers.iter().find(|(c, _)| *c == ctx) {
            return Some(s);
        }
        if driver.ctx_push_current(ctx) != CUDA_SUCCESS {
            return None;
        }
        let made = driver.stream_create(CU_STREAM_NON_BLOCKING);
        let _ = driver.ctx_pop_current();
        match made {
            Ok(s) => {
                movers.push((ctx, s));
                Some(s)
            }
            Err(rc) => {
                log_once!(
                    Warn,
                    "tiered spill: cannot make a stream to move blocks on ({rc}); blocks stay where they are"
                );
                None
            }
        }
    }

    /// A context went away: its mover stream with it.
    pub fn forget_ctx(&self, ctx: usize) {
        self.movers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(c, _)| *c != ctx);
    }

    pub(in crate::engine) fn snapshot(&self) -> Vec<Arc<TierBlock>> {
        read!(self.blocks).values().cloned().collect()
    }

    /// Leaves a detached block's free to the next round.
    pub(in crate::engine) fn defer_free(
        &self,
        b: Arc<TierBlock>,
        r: crate::engine::accounting::records::Record,
    ) {
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((b, r));
    }

    /// The frees left to this round.
    pub(in crate::engine) fn take_deferred(
        &self,
    ) -> Vec<(Arc<TierBlock>, crate::engine::accounting::records::Record)> {
        std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A round gave up waiting for the GPU: how many have.
    pub(in crate::engine) fn stall(&self, round: u64) -> u64 {
        let n = self.stalls.fetch_add(1, Ordering::Relaxed) + 1;
        let until = if n >= 3 {
            u64::MAX
        } else {
            round + STALL_ROUNDS
        };
        self.resume.store(until, Ordering::Relaxed);
        n
    }

    /// How long this round's stop waits for the GPU ([`SYNC_WAIT`]).
    pub(in crate::engine) fn sync_wait(&self) -> std::time::Duration {
        SYNC_WAIT * (1u32 << self.stalls.load(Ordering::Relaxed).min(3))
    }

    /// Whether moves pause in this round.
    pub(in crate::engine) fn stalled(&self, round: u64) -> bool {
        round < self.resume.load(Ordering::Relaxed)
    }

    /// The contexts that own tiered blocks (those with a mover stream).
    pub(in crate::engine) fn contexts(&self) -> Vec<usize> {
        self.movers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(c, _)| *c)
            .collect()
    }

    /// Modules or libraries were unloaded: their functions' handles may
    /// come back for other functions, so every layout is asked again.
    pub fn forget_layouts(&self) {
        write!(self.layouts).clear();
    }

    /// Passes the gate: held for a gated driver call.
    pub fn enter(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        self.on.then(|| read!(self.gate))
    }

    /// Closes the gate, waiting at most [`STOP_WAIT`].
    pub(in crate::engine) fn stop(&self) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        let until = std::time::Instant::now() + STOP_WAIT;
        loop {
            match self.gate.try_write() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// The VMM granularity of `device`, asked once; `None` when the driver
    /// has no VMM there.
    pub(in crate::engine) fn granularity<D: Driver>(
        &self,
        driver: &D,
        device: CUdevice,
    ) -> Option<u64> {
        let slot = self.granularity.get(usize::try_from(device).ok()?)?;
        let g = match slot.load(Ordering::Relaxed) {
            0 => {
                let g = driver
                    .vmm_granularity(location(false, device))
                    .ok()
                    .filter(|g| g.is_power_of_two())
                    .unwrap_or(u64::MAX);
                if g == u64::MAX {
                    log_once!(
                        Warn,
                        "tiered spill: device {device} has no virtual memory management; its allocations do not move"
                    );
                }
                slot.store(g, Ordering::Relaxed);
                g
            }
            g => g,
        };
        (g != u64::MAX).then_some(g)
    }
}

/// The block of `map` that `addr` points into, if any.
fn block_at(map: &BTreeMap<u64, Arc<TierBlock>>, addr: u64) -> Option<&Arc<TierBlock>> {
    map.range(..=addr)
        .next_back()
        .map(|(_, b)| b)
        .filter(|b| addr < b.ptr.saturating_add(b.bytes))
}

/// A use of `weight` of the block of `map` that `w` points into, if any.
fn note_in(map: &BTreeMap<u64, Arc<TierBlock>>, w: u64, weight: u32) -> bool {
    let Some(b) = block_at(map, w) else {
        return false;
    };
    b.note(w - b.ptr, weight);
    true
}

/// Calls `each` with every 8-byte word in `[lo, hi)` of a launch's
/// parameters: those the layout of `kernel` gives (`params`), or the
/// `extra` buffer whole; at most [`SCAN_BYTES`] of them.
///
/// # Safety
/// `params` and `extra` are a launch's: null, or as the driver's launch
/// functions require.
unsafe fn scan(
    kernel: &Kernel,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    lo: u64,
    hi: u64,
    mut each: impl FnMut(u64),
) {
    let mut push = |w: u64| {
        if w >= lo && w < hi {
            each(w);
        }
    };
    if !params.is_null() {
        let Some(layout) = kernel.params.as_deref() else {
            return;
        };
        let mut budget = SCAN_BYTES;
        for (i, &(_, size)) in layout.iter().enumerate() {
            let size = size as usize;
            if size < 8 {
                continue;
            }
            // SAFETY: the launch passes one pointer per parameter.
            let p = unsafe { *params.add(i) } as *const u8;
            if p.is_null() {
                continue;
            }
            let take = size.min(budget);
            budget -= take;
            for k in 0..take / 8 {
                // SAFETY: parameter i holds `size` bytes at `p`.
                push(unsafe { p.add(k * 8).cast::<u64>().read_unaligned() });
            }
            if budget == 0 {
                break;
            }
        }
    } else if !extra.is_null() {
        let (mut buf, mut len) = (std::ptr::null::<u8>(), 0usize);
        let mut i = 0;
        while i < 64 {
            // SAFETY: `extra` is a key/value list ending in CU_LAUNCH_PARAM_END.
            let key = unsafe { *extra.add(i) } as usize;
            if key == CU_LAUNCH_PARAM_END {
                break;
            }
            // SAFETY: as above: every key but the end has a value.
            let value = unsafe { *extra.add(i + 1) };
            match key {
                CU_LAUNCH_PARAM_BUFFER_POINTER => buf = value as *const u8,
                CU_LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                    // SAFETY: the size's value points to a size_t.
                    len = unsafe { *(value as *const usize) }
                }
                _ => {}
            }
            i += 2;
        }
        if !buf.is_null() {
            for k in 0..len.min(SCAN_BYTES) / 8 {
                // SAFETY: the buffer holds `len` bytes.
                push(unsafe { buf.add(k * 8).cast::<u64>().read_unaligned() });
            }
        }
    }
}

pub(in crate::engine) fn location(host: bool, device: CUdevice) -> CUmemLocation {
    if host {
        CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        }
    } else {
        CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        }
    }
}

/// One round's moves for a device.
#[derive(Default)]
pub(in crate::engine) struct Plan {
    pub(in crate::engine) demote: Vec<Arc<TierBlock>>,
    pub(in crate::engine) promote: Vec<Arc<TierBlock>>,
}

/// Rounds a page that launches named counts as one where tensors start
/// ([`take_round`]).
pub const NAMED_ROUNDS: u64 = 50;

/// The round's cost of keeping each block on the host, in weighted passes
/// over each of its bytes, and the weight of its uses, in `blocks`' order;
/// resets the blocks' spots for the next round. Every use counts the bytes
/// from its offset to the next offset used, as element-wise kernels touch
/// a whole tensor and PyTorch's segments hold tensors end to end; uses
/// that found no spot count a [`SPOTS`]th of their block. The engine's
/// blocks are each a region of their own. The blocks a program mapped
/// itself end to end (its pages: one device, each starting where the one
/// before it ends) are read as one region: a tensor may span pages and a
/// launch names only the page it starts in, so a use reaches on into the
/// pages after its own, up to the next offset used anywhere in the region,
/// the region's end, or the first page that launches named in the last
/// [`NAMED_ROUNDS`] rounds (tensors start there: a page holding only the
/// rest of a large tensor is never named). `round`: this round.
pub(in crate::engine) fn take_round(blocks: &[Arc<TierBlock>], round: u64) -> Vec<(f64, u64)> {
    let mut out = vec![(0f64, 0u64); blocks.len()];
    let mut scratch = Scratch::default();
    let mut pages = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        if b.program_handle == 0 {
            take_region(blocks, &[i], round, &mut out, &mut scratch);
        } else {
            pages.push(i);
        }
    }
    pages.sort_unstable_by_key(|&i| blocks[i].ptr);
    let mut start = 0;
    while start < pages.len() {
        let mut end = start + 1;
        while end < pages.len() {
            let (a, b) = (&blocks[pages[end - 1]], &blocks[pages[end]]);
            if a.device != b.device || a.ptr.saturating_add(a.bytes) != b.ptr {
                break;
            }
            end += 1;
        }
        take_region(blocks, &pages[start..end], round, &mut out, &mut scratch);
        start = end;
    }
    out
}

/// The lists [`take_region`] fills, made once a round for all regions.
#[derive(Default)]
struct Scratch {
    /// The region's uses: (offset in the region, weight).
    uses: Vec<(u64, u32)>,
    /// The weighted bytes each of its blocks is passed over.
    bytes: Vec<f64>,
}

/// [`take_round`] for one region: `run` indexes `blocks`, in address
/// order, each block starting where the one before it ends. The uses'
/// reaches are disjoint, so the walk touches each page at most once per
/// use that reaches it: linear in pages plus uses.
fn take_region(
    blocks: &[Arc<TierBlock>],
    run: &[usize],
    round: u64,
    out: &mut [(f64, u64)],
    scratch: &mut Scratch,
) {
    let base = blocks[run[0]].ptr;
    let at = |k: usize| blocks[run[k]].ptr - base;
    let last = &blocks[run[run.len() - 1]];
    let len = last.ptr + last.bytes - base;
    let Scratch { uses, bytes } = scratch;
    uses.clear();
    bytes.clear();
    bytes.resize(run.len(), 0.0);
    for (k, &i) in run.iter().enumerate() {
        let b = &blocks[i];
        let (seen, n, unplaced) = b.take_spots();
        uses.extend(
            seen[..n]
                .iter()
                .map(|&(off, w)| (at(k) + off.min(b.bytes), w)),
        );
        bytes[k] += f64::from(unplaced) * (b.bytes / SPOTS as u64) as f64;
        out[i].1 = seen[..n].iter().map(|&(_, w)| u64::from(w)).sum::<u64>() + u64::from(unplaced);
        if out[i].1 > 0 {
            b.named.store(round, Ordering::Relaxed);
        }
    }
    let starts = |j: usize| {
        let named = blocks[run[j]].named.load(Ordering::Relaxed);
        named != 0 && round.saturating_sub(named) < NAMED_ROUNDS
    };
    let mut k = 0;
    for (u, &(off, w)) in uses.iter().enumerate() {
        let end = uses.get(u + 1).map_or(len, |n| n.0);
        while k + 1 < run.len() && at(k + 1) <= off {
            k += 1;
        }
        let mut j = k;
        while j < run.len() && at(j) < end && (j == k || !starts(j)) {
            let (lo, hi) = (at(j), at(j) + blocks[run[j]].bytes);
            bytes[j] += f64::from(w) * hi.min(end).saturating_sub(lo.max(off)) as f64;
            j += 1;
        }
    }
    for (k, &i) in run.iter().enumerate() {
        out[i].0 = bytes[k] / blocks[i].bytes.max(1) as f64;
    }
}

/// Chooses the moves for the blocks of one device. `over`: bytes reserved
/// above the device's target (demoted, coldest first, when positive);
/// `room`: bytes promotions may still take (the target less
/// [`PROMOTE_MARGIN`], less what is reserved); `host_room`: bytes the
/// spill limit still allows on the host.
pub(in crate::engine) fn plan(
    blocks: &[Arc<TierBlock>],
    over: i128,
    room: i128,
    host_room: u64,
    round: u64,
) -> Plan {
    let settled =
        |b: &TierBlock| round.saturating_sub(b.moved.load(Ordering::Relaxed)) >= MIN_ROUNDS;
    let movable = || blocks.iter().filter(|b| b.movable());
    let mut dev: Vec<&Arc<TierBlock>> = movable().filter(|b| b.on_device()).collect();
    let mut host: Vec<&Arc<TierBlock>> = movable()
        .filter(|b| !b.on_device() && b.score() > 0.0 && settled(b))
        .collect();
    // Coldest device blocks first, hottest host blocks first.
    dev.sort_by(|a, b| a.density().total_cmp(&b.density()));
    host.sort_by(|a, b| b.density().total_cmp(&a.density()));
    let mut out = Plan::default();
    let mut room = room;
    let mut over = over;
    let mut host_room = i128::from(host_room);
    let mut budget = i128::from(ROUND_BYTES);
    let mut next = 0usize; // the next device block to demote
    // Above the target: demote the coldest until under, settled or not.
    while over > 0 && next < dev.len() && budget > 0 {
        let b = dev[next];
        next += 1;
        if i128::from(b.bytes) > host_room {
            continue;
        }
        over -= i128::from(b.bytes);
        room += i128::from(b.bytes);
        host_room -= i128::from(b.bytes);
        budget -= i128::from(b.bytes);
        out.demote.push(b.clone());
    }
    if over > 0 {
        return out;
    }
    room = room.max(0);
    let full = i128::from(ROUND_BYTES);
    for h in host {
        let bytes = i128::from(h.bytes);
        // A block larger than a round's budget moves alone in a round.
        if bytes > budget && budget < full {
            continue;
        }
        if bytes <= room {
            room -= bytes;
            host_room += bytes;
            budget -= bytes;
            out.promote.push(h.clone());
            continue;
        }
        // Swap: colder settled device blocks make the room.
        let mut gain = 0i128;
        let mut j = next;
        let mut taken = Vec::new();
        while room + gain < bytes && j < dev.len() {
            let d = dev[j];
            j += 1;
            if d.density() * HYSTERESIS >= h.density() {
                break;
            }
            if !settled(d) {
                continue;
            }
            gain += i128::from(d.bytes);
            taken.push(d.clone());
        }
        let moved: i128 = gain + bytes;
        if room + gain < bytes || (moved > budget && budget < full) || gain - bytes > host_room {
            continue;
        }
        next = j;
        room += gain - bytes;
        host_room -= gain - bytes;
        budget -= moved;
        out.demote.extend(taken);
        out.promote.push(h.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ptr: u64, bytes: u64, on_device: bool, score: f64, moved: u64) -> Arc<TierBlock> {
        let b = TierBlock::new(
            ptr,
            bytes,
            0,
            1,
            0,
            if on_device { ON_DEVICE } else { ON_HOST },
            moved,
        );
        b.score.store(score.to_bits(), Ordering::Relaxed);
        Arc::new(b)
    }

    /// A use reaches across the pages a program mapped end to end (a tensor
    /// may span them), up to the next use or a page launches name (where
    /// tensors start); never into the engine's own block beside them, nor
    /// into a page apart.
    #[test]
    fn a_use_reaches_across_the_pages_a_program_mapped_end_to_end() {
        const MIB: u64 = 1 << 20;
        let mk = |ptr: u64, program: u64| {
            let mut b = TierBlock::new(ptr, 4 * MIB, 0, 1, 0, ON_DEVICE, 0);
            b.program_handle = program;
            Arc::new(b)
        };
        let blocks = [
            mk(0x1080_0000, 3),
            mk(0x1000_0000, 1),
            mk(0x1040_0000, 2),
            mk(0x2000_0000, 4),
            mk(0x10c0_0000, 0),
        ];
        blocks[1].note(0, 1); // stops where the next named page starts
        blocks[2].note(2 * MIB, 3); // reaches on to the region's end
        blocks[4].note(0, 5);
        let got = take_round(&blocks, 1);
        assert_eq!(got, [(3.0, 0), (1.0, 1), (1.5, 3), (0.0, 0), (5.0, 5)]);
        // The spots were reset for the next round.
        assert_eq!(take_round(&blocks, 2), [(0.0, 0); 5]);
        // A page named within NAMED_ROUNDS still stops a reach; then not.
        blocks[1].note(0, 1);
        assert_eq!(
            take_round(&blocks, NAMED_ROUNDS)[1..3],
            [(1.0, 1), (0.0, 0)]
        );
        blocks[1].note(0, 1);
        let later = take_round(&blocks, NAMED_ROUNDS + 1);
        assert_eq!(later[1..3], [(1.0, 1), (1.0, 0)]);
        assert_eq!(later[0], (1.0, 0));
    }

    #[test]
    fn a_use_touches_up_to_the_next_offset_used() {
        let b = block(1 << 40, 32 * M, false, 0.0, 0);
        // One use at the start of the block: one pass over it.
        b.note(0, 1);
        assert_eq!(b.take_passes(), (1.0, 1));
        // Taken: the spots start again.
        assert_eq!(b.take_passes(), (0.0, 0));
        // Two tensors end to end, the second used three times (once by a
        // matrix product): (1 x 16 MiB + (1 + 1 + 32) x 16 MiB) / 32 MiB.
        b.note(0, 1);
        b.note(16 * M, 1);
        b.note(16 * M, 1);
        b.note(16 * M, PRODUCT_WEIGHT);
        assert_eq!(b.heat(), 3 + 32);
        assert_eq!(b.take_passes(), ((16.0 + 34.0 * 16.0) / 32.0, 3 + 32));
        assert_eq!(b.heat(), 0);
    }

    #[test]
    fn uses_past_the_spots_count_a_share_of_the_block() {
        let b = block(1 << 40, 32 * M, false, 0.0, 0);
        for i in 0..=SPOTS as u64 {
            b.note(i * M, 1);
        }
        // Spots 0..15 reach 1 MiB each but the last, which reaches the end
        // (17 MiB); the use that found no spot counts 32 MiB / 16.
        assert_eq!(b.take_passes(), ((15.0 + 17.0 + 2.0) / 32.0, 17));
    }

    #[test]
    fn a_claim_ends_when_a_move_panics() {
        let t = Tiers::new(true);
        let _ = t.insert(t.make(1 << 40, 4 * M, 0, 1, 0, true));
        let b = t.snapshot().pop().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _c = b.claim().unwrap();
            assert!(b.claim().is_none(), "one claim at a time");
            panic!("a bug in a move");
        }));
        assert!(r.is_err());
        // The free does not wait for ever: the claim ended with the unwinding.
        assert!(t.detach(1 << 40).is_some());
        assert!(b.claim().is_none(), "a freed block is not claimed");
    }

    #[test]
    fn products_are_told_by_their_names() {
        for n in [
            "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3",
            "ampere_sgemm_128x64_nn",
            "_ZN7cutlass6KernelI...",
            "gemv2T_kernel_val",
            "cudnn::detail::implicit_convolve_sgemm",
            "triton_tem_fused_mm_0_matmul",
        ] {
            assert!(is_product(n), "{n}");
        }
        for n in [
            "_ZN2at6native29vectorized_elementwise_kernel",
            "multi_tensor_apply_kernel",
            "softmax_warp_forward",
            "reduce_kernel",
            "layer_norm_kernel_gamma_beta",
            "unrolled_elementwise_kernel_convert",
        ] {
            assert!(!is_product(n), "{n}");
        }
    }

    fn ptrs(v: &[Arc<TierBlock>]) -> Vec<u64> {
        v.iter().map(|b| b.ptr).collect()
    }

    const M: u64 = 1 << 20;

    #[test]
    fn hot_host_blocks_fill_the_room_first() {
        let b = [
            block(1, 100 * M, false, 10.0, 0),
            block(2, 100 * M, false, 50.0, 0),
            block(3, 100 * M, false, 0.0, 0),
        ];
        let p = plan(&b, 0, i128::from(150 * M), u64::MAX, 100);
        assert_eq!(ptrs(&p.promote), vec![2]);
        assert!(p.demote.is_empty());
    }

    #[test]
    fn swaps_need_the_hysteresis_margin() {
        // Device block 1 has density 10/100M; host block 2 has 12.4/100M:
        // not 1.25x hotter, so nothing moves; host block 3 (12.6/100M) is.
        assert_eq!(HYSTERESIS, 1.25);
        let b = [
            block(1, 100 * M, true, 10.0, 0),
            block(2, 100 * M, false, 12.4, 0),
        ];
        let p = plan(&b, 0, 0, u64::MAX, 100);
        assert!(p.promote.is_empty() && p.demote.is_empty());
        let b = [
            block(1, 100 * M, true, 10.0, 0),
            block(3, 100 * M, false, 12.6, 0),
        ];
        let p = plan(&b, 0, 0, u64::MAX, 100);
        assert_eq!((ptrs(&p.demote), ptrs(&p.promote)), (vec![1], vec![3]));
    }

    #[test]
    fn recently_moved_blocks_stay() {
        let b = [
            block(1, 100 * M, true, 1.0, 90),
            block(2, 100 * M, false, 50.0, 0),
        ];
        let p = plan(&b, 0, 0, u64::MAX, 100);
        assert!(p.promote.is_empty() && p.demote.is_empty());
        let b = [
            block(1, 100 * M, true, 1.0, 0),
            block(2, 100 * M, false, 50.0, 85),
        ];
        let p = plan(&b, 0, 0, u64::MAX, 100);
        assert!(p.promote.is_empty() && p.demote.is_empty());
    }

    #[test]
    fn above_the_target_the_coldest_go_first() {
        let b = [
            block(1, 100 * M, true, 9.0, 99),
            block(2, 100 * M, true, 1.0, 99),
            block(3, 100 * M, true, 5.0, 99),
        ];
        let p = plan(&b, i128::from(150 * M), 0, u64::MAX, 100);
        assert_eq!(ptrs(&p.demote), vec![2, 3]);
        assert!(p.promote.is_empty());
    }

    #[test]
    fn the_spill_limit_bounds_demotions() {
        let b = [
            block(1, 100 * M, true, 1.0, 0),
            block(2, 100 * M, false, 50.0, 0),
        ];
        // A swap moves no bytes to the host on balance: allowed with no room.
        let p = plan(&b, 0, 0, 0, 100);
        assert_eq!((ptrs(&p.demote), ptrs(&p.promote)), (vec![1], vec![2]));
        let b = [block(1, 100 * M, true, 1.0, 0)];
        let p = plan(&b, 1, 0, 0, 100);
        assert!(p.demote.is_empty());
    }

    #[test]
    fn a_block_larger_than_a_rounds_budget_moves_alone() {
        let b = [
            block(1, 3 * ROUND_BYTES, false, 1000.0, 0),
            block(2, 512 * M, false, 50.0, 0),
        ];
        let p = plan(&b, 0, i128::from(8 * ROUND_BYTES), u64::MAX, 100);
        assert_eq!(ptrs(&p.promote), vec![1]);
    }

    #[test]
    fn a_round_moves_at_most_its_budget() {
        let b: Vec<_> = (0..10)
            .map(|i| block(i + 1, 512 * M, false, 100.0, 0))
            .collect();
        let p = plan(&b, 0, i128::from(100 * 512 * M), u64::MAX, 100);
        let moved: u64 = p.promote.iter().map(|b| b.bytes).sum();
        assert_eq!(moved, ROUND_BYTES);
    }
}
