//! The block map and the per-context and per-round state of `Tiers`: the
//! blocks by address, the mover streams, deferred frees, stalls and each
//! device's granularity.

#[allow(unused_imports)]
use super::*;

impl Tiers {
    /// Launches seen (a graph's launch counts each of its kernels).
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Words in launches that named a tiered block.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn new(on: bool, placing: bool) -> Tiers {
        Tiers {
            on: on || placing,
            placing,
            kept: Mutex::new(Vec::new()),
            recording: AtomicBool::new(false),
            trace: Mutex::new(std::collections::VecDeque::new()),
            blocks: RwLock::new(BTreeMap::new()),
            lo: AtomicU64::new(u64::MAX),
            hi: AtomicU64::new(0),
            layouts: RwLock::new(HashMap::new()),
            graphs: RwLock::new(HashMap::new()),
            movers: Mutex::new(Vec::new()),
            gate: RwLock::new(()),
            granularity: [const { AtomicU64::new(0) }; vramcap_core::MAX_DEVICES],
            peers: [const { AtomicU64::new(0) }; vramcap_core::MAX_DEVICES],
            round: AtomicU64::new(0),
            scored: AtomicU64::new(0),
            deferred: Mutex::new(Vec::new()),
            stalls: AtomicU64::new(0),
            stalls_total: AtomicU64::new(0),
            drain_us: AtomicU64::new(0),
            base_wait_us: AtomicU64::new(SYNC_WAIT.as_micros() as u64),
            quiescing: AtomicU32::new(0),
            running: RwLock::new(()),
            quiesce_abandoned: AtomicBool::new(false),
            pause: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// Whether blocks are made (tiered spill, or parking's moves).
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on
    }

    /// Whether blocks are placed by heat (tiered spill).
    pub fn placing(&self) -> bool {
        self.placing
    }

    /// Kept host pages of exactly `bytes` (a park's), if any.
    pub(super) fn take_kept(&self, bytes: u64) -> Option<pages::Pages> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let i = kept.iter().position(|p| p.bytes == bytes)?;
        Some(kept.swap_remove(i))
    }

    /// Keeps host pages for the next park.
    pub(super) fn keep(&self, p: pages::Pages) {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).push(p);
    }

    /// All the kept host pages, taken out.
    pub(super) fn take_all_kept(&self) -> Vec<pages::Pages> {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The sizes of the kept host pages, one entry each.
    pub(super) fn kept_sizes(&self) -> Vec<u64> {
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| p.bytes)
            .collect()
    }

    /// The bytes of host memory kept now.
    pub fn kept_bytes(&self) -> u64 {
        self.kept_sizes().iter().sum()
    }

    /// The round now: a new block is made in it ([`TierBlock::new`]).
    pub(in crate::engine) fn round_now(&self) -> u64 {
        self.round.load(Ordering::Relaxed)
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

    /// A round gave up waiting for the GPU: whether moves stopped for good
    /// ([`SYNC_WAIT`]); otherwise they pause for [`STALL_ROUNDS`].
    pub(in crate::engine) fn stall(&self) -> bool {
        let n = self.stalls.fetch_add(1, Ordering::Relaxed) + 1;
        let total = self.stalls_total.fetch_add(1, Ordering::Relaxed) + 1;
        let for_good = n >= 3 || total >= MAX_STALLS;
        let rounds = if for_good { u64::MAX } else { STALL_ROUNDS };
        self.pause.store(rounds, Ordering::Relaxed);
        for_good
    }

    /// A synchronisation of the program's contexts took `took` (whether or
    /// not its round still waited for it): the wait follows it.
    pub(in crate::engine) fn drained(&self, took: std::time::Duration) {
        // At least 1 µs: a drain was seen.
        let took = (took.as_micros().min(u128::from(u64::MAX)) as u64).max(1);
        let _ = self
            .drain_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(took.max(last - last / 16))
            });
    }

    /// Whether any synchronisation's drain was seen.
    pub(in crate::engine) fn drain_seen(&self) -> bool {
        self.drain_us.load(Ordering::Relaxed) > 0
    }

    /// A round's wait for the GPU ended in time: give-ups in a row start
    /// again from none.
    pub(in crate::engine) fn quiesced(&self) {
        self.stalls.store(0, Ordering::Relaxed);
    }

    /// How long this round's stop waits for the GPU ([`SYNC_WAIT`]).
    pub(in crate::engine) fn sync_wait(&self) -> std::time::Duration {
        let base = self.base_wait_us.load(Ordering::Relaxed);
        let doubled = base << self.stalls.load(Ordering::Relaxed).min(3);
        let follows = self.drain_us.load(Ordering::Relaxed).saturating_mul(2);
        std::time::Duration::from_micros(doubled.max(follows)).min(MAX_SYNC_WAIT)
    }

    /// Shortens the first wait (tests only: the real one is seconds).
    #[cfg(test)]
    pub(in crate::engine) fn set_base_wait(&self, wait: std::time::Duration) {
        self.base_wait_us
            .store(wait.as_micros() as u64, Ordering::Relaxed);
    }

    /// Whether moves pause in this round, which then counts as one of the
    /// pause's rounds. (Counting by the round number, which paused rounds
    /// do not advance, paused moves for good at the first give-up.)
    pub(in crate::engine) fn paused(&self) -> bool {
        self.pause
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| match left {
                0 => None,
                u64::MAX => Some(u64::MAX),
                n => Some(n - 1),
            })
            .is_ok()
    }

    /// Whether a round's synchronisation thread is still in the driver.
    pub(in crate::engine) fn syncing(&self) -> bool {
        self.quiescing.load(Ordering::SeqCst) > 0
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
                    .vmm_granularity(location(Place::Device, device))
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
pub(super) fn block_at(map: &BTreeMap<u64, Arc<TierBlock>>, addr: u64) -> Option<&Arc<TierBlock>> {
    map.range(..=addr)
        .next_back()
        .map(|(_, b)| b)
        .filter(|b| addr < b.ptr.saturating_add(b.bytes))
}
