//! A tiered block: where it is, its claim for a move, and the spots where
//! uses pointed since the last round (`tiered/mod.rs` says how they are read).

#[allow(unused_imports)]
use super::*;

pub(in crate::engine) use crate::engine::accounting::records::Place;

/// One tiered allocation.
pub struct TierBlock {
    pub ptr: u64,
    /// Rounded up to the granularity: what is mapped and charged.
    pub bytes: u64,
    pub device: u16,
    pub ctx: usize,
    /// The physical allocation mapped at `ptr` now.
    pub(in crate::engine) handle: AtomicU64,
    /// Its [`Place`]; changes only in a round, while the block is claimed.
    place: AtomicU8,
    pub(super) moving: AtomicBool,
    pub(super) freed: AtomicBool,
    /// The program's handle when the block is memory the program made
    /// with `cuMemCreate` and mapped itself (`engine/tiered/handles.rs`); 0 for
    /// the engine's own blocks.
    pub program_handle: u64,
    /// Never moves again (a page mapped a second time, or exported).
    pub(super) pinned: AtomicBool,
    /// May move: the engine's blocks from the start, the program's once
    /// it has granted access to them (the move's copy reads them).
    pub(super) ready: AtomicBool,
    /// What access the program granted to its block, given again after a
    /// move (whose mapping grants only the block's device read-write).
    pub(in crate::engine) access: Mutex<Vec<CUmemAccessDesc>>,
    /// Where in the block uses pointed since the last round, and their
    /// weight there: what a use touches is taken to reach from its offset
    /// to the next offset used (module docs).
    pub(super) spots: [Spot; SPOTS],
    /// The weight of uses that found no free spot.
    pub(super) unplaced: AtomicU32,
    /// The weight of the uses seen up to the last round (only rounds
    /// write it).
    pub(in crate::engine) weight: AtomicU64,
    /// f64 bits; only rounds touch it.
    pub(in crate::engine) score: AtomicU64,
    /// The round that last moved it.
    pub(in crate::engine) moved: AtomicU64,
    /// The last round a launch named an offset in it (0: none yet).
    pub(super) named: AtomicU64,
    /// Moved to the host by a park (`VRAMCAP_PARK_MOVE=shim`), to go back
    /// at the resume.
    pub(super) parked: AtomicBool,
    /// While parked: the host pages its bytes wait in (nothing is mapped
    /// at `ptr` then, and `handle` is 0).
    pub(super) pages: Mutex<Option<pages::Pages>>,
}

impl TierBlock {
    pub fn on_device(&self) -> bool {
        self.place() == Place::Device
    }
    /// Where the block's memory is now.
    pub fn place(&self) -> Place {
        if self.place.load(Ordering::SeqCst) == Place::Device as u8 {
            Place::Device
        } else {
            Place::Host
        }
    }
    /// Records where a move put the block's memory.
    pub(in crate::engine) fn set_place(&self, place: Place) {
        self.place.store(place as u8, Ordering::SeqCst);
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
    pub(super) fn density(&self) -> f64 {
        self.score()
    }
    /// Whether a round may move it (not pinned, and ready).
    pub(in crate::engine) fn movable(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.pinned.load(Ordering::SeqCst)
    }
    /// Whether [`TierBlock::claim`] would claim it now (not moving, not
    /// being freed, movable): what a park makes host pages for.
    pub(in crate::engine) fn claimable(&self) -> bool {
        !self.moving.load(Ordering::SeqCst) && !self.freed.load(Ordering::SeqCst) && self.movable()
    }
    /// Claims the block for a move: `None` when it is being freed, is
    /// pinned, or is moved already. The claim ends when the [`BlockClaim`] is
    /// dropped, on a panic's unwinding too, so a free never waits on a
    /// move that died.
    pub(in crate::engine) fn claim(self: &Arc<Self>) -> Option<BlockClaim> {
        if self.moving.swap(true, Ordering::SeqCst) {
            return None;
        }
        if self.freed.load(Ordering::SeqCst) || !self.movable() {
            self.moving.store(false, Ordering::SeqCst);
            return None;
        }
        Some(BlockClaim(self.clone()))
    }
    /// The block as memory the program made with `cuMemCreate` and mapped
    /// whole (`engine/tiered/handles.rs`), under its handle `h`: it may move once
    /// the program grants access to it.
    pub(in crate::engine) fn of_program(mut self, h: u64) -> Self {
        self.program_handle = h;
        self.ready = AtomicBool::new(false);
        self
    }
    /// Holds the block where it is for as long as the [`BlockClaim`] lives,
    /// waiting for a move in progress to end: `None` when it is freed.
    pub(in crate::engine) fn hold(self: &Arc<Self>) -> Option<BlockClaim> {
        while self.moving.swap(true, Ordering::SeqCst) {
            std::thread::yield_now();
        }
        if self.freed.load(Ordering::SeqCst) {
            self.moving.store(false, Ordering::SeqCst);
            return None;
        }
        Some(BlockClaim(self.clone()))
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
    /// The program granted this access to its block (`engine/tiered/handles.rs`):
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
pub(in crate::engine) struct BlockClaim(Arc<TierBlock>);

impl std::ops::Deref for BlockClaim {
    type Target = TierBlock;
    fn deref(&self) -> &TierBlock {
        &self.0
    }
}

impl Drop for BlockClaim {
    fn drop(&mut self) {
        self.0.moving.store(false, Ordering::SeqCst);
    }
}

/// Distinct offsets a block keeps per round.
pub const SPOTS: usize = 16;

/// One offset uses pointed at: `at` is the offset plus one (0: free).
#[derive(Default)]
pub(super) struct Spot {
    pub(super) at: AtomicU64,
    pub(super) weight: AtomicU32,
}

impl TierBlock {
    pub(in crate::engine) fn new(
        ptr: u64,
        bytes: u64,
        device: u16,
        ctx: usize,
        handle: u64,
        place: Place,
        round: u64,
    ) -> Self {
        TierBlock {
            ptr,
            bytes,
            device,
            ctx,
            handle: AtomicU64::new(handle),
            place: AtomicU8::new(place as u8),
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
            parked: AtomicBool::new(false),
            pages: Mutex::new(None),
        }
    }

    /// A use of `weight` at `offset` into the block. Lock-free: a spot is
    /// taken by one compare-and-swap; a race with a round's reset at worst
    /// moves one use's weight to another offset.
    pub(super) fn note(&self, offset: u64, weight: u32) {
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
    pub(super) fn take_spots(&self) -> ([(u64, u32); SPOTS], usize, u32) {
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
    pub(super) fn take_passes(self: &Arc<Self>) -> (f64, u64) {
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
    pub(super) fn heat(&self) -> u64 {
        let placed: u64 = self
            .spots
            .iter()
            .map(|s| u64::from(s.weight.load(Ordering::Relaxed)))
            .sum();
        placed + u64::from(self.unplaced.load(Ordering::Relaxed))
    }
}

/// The location of physical memory at `place`, for `device`.
pub(in crate::engine) fn location(place: Place, device: CUdevice) -> CUmemLocation {
    match place {
        Place::Host => CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        Place::Device => CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
    }
}

/// Makes physical memory of `bytes` on the host or `device` and maps it at
/// `ptr` for the device: the handle, with nothing left behind on failure.
pub(in crate::engine) fn make_mapped<D: Driver>(
    driver: &D,
    ptr: u64,
    bytes: u64,
    place: Place,
    device: CUdevice,
) -> Result<u64, CUresult> {
    let h = driver.vmm_create(bytes, location(place, device))?;
    let rc = driver.vmm_map(ptr, bytes, h, device);
    if rc != CUDA_SUCCESS {
        let _ = driver.vmm_release(h);
        return Err(rc);
    }
    Ok(h)
}

impl TierBlock {
    /// Unmaps a detached block and releases its memory and address.
    pub(in crate::engine) fn release_vmm<D: Driver>(&self, driver: &D) -> CUresult {
        let rc = driver.vmm_unmap(self.ptr, self.bytes);
        if rc == CUDA_SUCCESS {
            let _ = driver.vmm_release(self.handle());
            let _ = driver.vmm_free_address(self.ptr, self.bytes);
        }
        rc
    }
}
