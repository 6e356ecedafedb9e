//! Parking's moves (`VRAMCAP_PARK_MOVE=shim`, issue 43): every block of
//! the process to host memory at a park, and back at the resume, through
//! the same stage and move as tiered spill's rounds (`rounds.rs`), in bulk.
//! The host memory a block leaves on its way back is kept, still charged
//! to the host budget, so that the next park copies into memory already
//! resident; `vramcap trim` and exit give it back
//! (`docs/design/fast-parking.md`).
//!
//! Called by the background thread with parking's gate closed and no
//! program thread inside the shim, and `Tiers::running` held shared (the
//! engine takes it), so no round runs beside them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use vramcap_core::park::PARK_DEVICES;

use super::{Place, TierBlock, Tiering, pages};
use crate::engine::accounting::Refusal;
use crate::engine::driver::Driver;
use crate::ffi::CUdevice;
use crate::log::{log_at, log_once};

impl<D: Driver> Tiering<'static, D> {
    /// The blocks to move, by device: on `from`, and for the way back only
    /// those a park moved.
    fn by_device(&self, from: Place) -> BTreeMap<u16, Vec<Arc<TierBlock>>> {
        let mut out: BTreeMap<u16, Vec<Arc<TierBlock>>> = BTreeMap::new();
        for b in self.tiers.snapshot() {
            let parked = b.parked.load(Ordering::Relaxed);
            if b.place() == from && (from == Place::Device || parked) {
                out.entry(b.device).or_default().push(b);
            }
        }
        out
    }

    /// Moves every block on a GPU to host pages (kept pages first, the
    /// others made now, all at once: `pages.rs`): the bytes moved per
    /// device, each released from the device's ledger by the move. A block
    /// that cannot move now (claimed, pinned, not granted, no host budget,
    /// no pinned memory) stays, with the rest of the process. Kept pages of
    /// sizes no block has any more are given back first.
    pub fn park_out(&self) -> [u64; PARK_DEVICES] {
        let mut moved = [0u64; PARK_DEVICES];
        let round = self.tiers.round_now();
        let out = self.by_device(Place::Device);
        // Kept pages of sizes no block has now go first, so that they take
        // no room in the host budget from the blocks that do.
        let mut sizes: Vec<u64> = out.values().flatten().map(|b| b.bytes).collect();
        for p in self.tiers.take_all_kept() {
            match sizes.iter().position(|&s| s == p.bytes) {
                Some(i) => {
                    sizes.swap_remove(i);
                    self.tiers.keep(p);
                }
                None => {
                    self.host.give_back(p.bytes);
                    pages::free(self.driver, p);
                }
            }
        }
        self.make_pages(&out);
        for (dev, blocks) in out {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let staged: Vec<_> = blocks
                .into_iter()
                .filter_map(|b| self.stage(slot, device, 0, b, Place::Host, true).ok())
                .collect();
            let (_, bytes) = self.move_staged(slot, device, round, staged);
            if let Some(m) = moved.get_mut(usize::from(dev)) {
                *m = bytes;
            }
        }
        moved
    }

    /// Makes the host pages the blocks of `out` lack (kept pages of their
    /// sizes count), within the host budget, and keeps them for the stage;
    /// says once per device what stays on the GPU for want of budget, and
    /// once per process what the driver refused.
    fn make_pages(&self, out: &BTreeMap<u16, Vec<Arc<TierBlock>>>) {
        let mut have = self.tiers.kept_sizes();
        let mut want: Vec<(u64, usize)> = Vec::new();
        // What the system can still make resident (the memory available,
        // and the cgroup's room): touching more would wake the OOM killer
        // rather than fail.
        let mut system = pages::system_room();
        for (dev, blocks) in out {
            let (mut short, mut short_bytes) = (0usize, 0u64);
            let (mut tight, mut tight_bytes) = (0usize, 0u64);
            // Only blocks a stage could claim get pages (not pinned, not
            // being freed or moved, granted).
            for b in blocks.iter().filter(|b| b.claimable()) {
                if let Some(i) = have.iter().position(|&s| s == b.bytes) {
                    have.swap_remove(i);
                } else if system.is_some_and(|r| r < b.bytes) {
                    tight += 1;
                    tight_bytes += b.bytes;
                } else if self.host.take(b.bytes) {
                    system = system.map(|r| r - b.bytes);
                    want.push((b.bytes, b.ctx));
                } else {
                    short += 1;
                    short_bytes += b.bytes;
                }
            }
            let plural = |n: usize| if n == 1 { "block" } else { "blocks" };
            if short > 0 {
                log_at!(
                    Warn,
                    "parking: {short} {} ({short_bytes} bytes) stay on GPU {dev}: the host memory for parked blocks is used up (VRAMCAP_SPILL_LIMIT; e.g. VRAMCAP_SPILL_LIMIT=90% allows more)",
                    plural(short)
                );
            }
            if tight > 0 {
                log_at!(
                    Warn,
                    "parking: {tight} {} ({tight_bytes} bytes) stay on GPU {dev}: the machine has too little memory available for them (MemAvailable, or this cgroup's memory.max)",
                    plural(tight)
                );
            }
        }
        for (made, &(bytes, _)) in pages::make_all(self.driver, &want).into_iter().zip(&want) {
            match made {
                Ok(p) => self.tiers.keep(p),
                Err(rc) => {
                    self.host.give_back(bytes);
                    log_once!(
                        Warn,
                        "parking: the driver gave no host memory for a block of {bytes} bytes (error {rc}: a locked-memory limit, `ulimit -l`, or a container's memory limit refuses pinned memory); such blocks stay on the GPU, charged to the process, and the park moves the rest"
                    );
                }
            }
        }
    }

    /// Moves every block a park moved back onto its GPU, all or none, and
    /// answers the bytes of host memory now kept for the next park:
    /// first each device's bytes are reserved at once (own budget and
    /// group; over a cap lowered below them since the park, as the
    /// driver's resume does, said once), then every block is given device
    /// memory, then the copies run. `Err`: the first device with no room,
    /// its parked bytes, and the refusal when its budget (own or group's)
    /// refused them (`None`: the GPU had no device memory for them);
    /// nothing moved and nothing is held, so the process stays parked as
    /// it was.
    pub fn park_in(&self) -> Result<u64, (u16, u64, Option<Refusal>)> {
        let round = self.tiers.round_now();
        let parked = self.by_device(Place::Host);
        let mut reserved: Vec<(u16, u64)> = Vec::new();
        let give_back = |reserved: &[(u16, u64)]| {
            for &(d, bytes) in reserved {
                if let Some(s) = self.accounting.slot(CUdevice::from(d)) {
                    self.accounting.release_on(s, CUdevice::from(d), bytes);
                }
            }
        };
        for (&dev, blocks) in &parked {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let bytes: u64 = blocks.iter().map(|b| b.bytes).sum();
            let limit = self
                .accounting
                .cap_in_force(slot, device)
                .unwrap_or(u64::MAX);
            // What the process still holds itself counts (the rest a
            // `shim` park leaves, or a `shim+checkpoint` resume has just
            // restored) when a cap lowered meanwhile is judged.
            if let Err(r) = self
                .accounting
                .reserve_to_resume(slot, device, bytes, limit)
            {
                give_back(&reserved);
                return Err((dev, bytes, Some(r)));
            }
            reserved.push((dev, bytes));
        }
        let mut staged = Vec::new();
        for (&dev, blocks) in &parked {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let mut all = Vec::new();
            for b in blocks {
                match self.stage(slot, device, 0, b.clone(), Place::Device, true) {
                    Ok(m) => all.push(m),
                    Err(_) => {
                        // No device memory for it (the GPU is full): none moves.
                        for (d, ms) in staged.drain(..).chain([(dev, all)]) {
                            let dv = CUdevice::from(d);
                            if let Some(s) = self.accounting.slot(dv) {
                                for m in ms {
                                    self.unstage(s, dv, m);
                                }
                            }
                        }
                        give_back(&reserved);
                        let bytes = reserved
                            .iter()
                            .find(|&&(d, _)| d == dev)
                            .map_or(0, |&(_, b)| b);
                        return Err((dev, bytes, None));
                    }
                }
            }
            staged.push((dev, all));
        }
        let mut short = None;
        for (dev, ms) in staged {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let want: u64 = ms.iter().map(|m| m.bytes()).sum();
            let (_, bytes) = self.move_staged(slot, device, round, ms);
            if bytes < want {
                // A copy or a map the driver refused: those blocks stay
                // on the host, and their reservation goes.
                self.accounting.release_on(slot, device, want - bytes);
                short.get_or_insert(dev);
            }
        }
        match short {
            None => Ok(self.tiers.kept_bytes()),
            // A copy or a map the driver refused: no policy makes that room.
            Some(d) => Err((
                d,
                0,
                Some(Refusal {
                    used: 0,
                    limit: 0,
                    group: false,
                }),
            )),
        }
    }

    /// Waits for the work of every context in `ctxs` to finish (at most
    /// tiered spill's wait for the GPU): a park's answers to the program's
    /// queries say it has (`process/gate.rs`, `enter_known`).
    pub fn sync_contexts(&self, ctxs: &[usize]) -> bool {
        ctxs.is_empty() || self.quiesce(ctxs)
    }

    /// Gives back the host pages kept for parks that were registered in
    /// context `ctx`, which is about to be destroyed (while it still is:
    /// unpinning needs it): the bytes given back.
    pub fn release_kept_of(&self, ctx: usize) -> u64 {
        let mut bytes = 0;
        for p in self.tiers.take_all_kept() {
            if p.ctx != ctx {
                self.tiers.keep(p);
                continue;
            }
            self.host.give_back(p.bytes);
            bytes += p.bytes;
            pages::free(self.driver, p);
        }
        bytes
    }

    /// Gives back the host memory kept for parks (`vramcap trim`): the
    /// bytes given back.
    pub fn release_kept(&self) -> u64 {
        let mut bytes = 0;
        for p in self.tiers.take_all_kept() {
            self.host.give_back(p.bytes);
            bytes += p.bytes;
            pages::free(self.driver, p);
        }
        bytes
    }
}
