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

use vramcap_core::park::PARK_DEVICES;

use super::{Place, TierBlock, Tiering};
use crate::engine::driver::Driver;
use crate::ffi::CUdevice;
use crate::log::log_at;

impl<D: Driver> Tiering<'static, D> {
    /// The blocks to move, by device: on `from`, and for the way back only
    /// those a park moved.
    fn by_device(&self, from: Place) -> BTreeMap<u16, Vec<Arc<TierBlock>>> {
        let mut out: BTreeMap<u16, Vec<Arc<TierBlock>>> = BTreeMap::new();
        for b in self.tiers.snapshot() {
            let parked = b.parked.load(std::sync::atomic::Ordering::Relaxed);
            if b.place() == from && (from == Place::Device || parked) {
                out.entry(b.device).or_default().push(b);
            }
        }
        out
    }

    /// Moves every block on a GPU to host memory (kept host memory first):
    /// the bytes moved per device, each released from the device's ledger
    /// by the move. A block that cannot move now (claimed, pinned, not
    /// granted, no host budget) stays, with the rest of the process.
    pub fn park_out(&self) -> [u64; PARK_DEVICES] {
        let mut moved = [0u64; PARK_DEVICES];
        let round = self.tiers.round_now();
        for (dev, blocks) in self.by_device(Place::Device) {
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

    /// Moves every block a park moved back onto its GPU, reserving it
    /// under the cap first (own and group) and making its device memory
    /// (the driver refuses without room, and nothing is lost: the block
    /// stays on the host). `Err(device)`: the first device that had no room
    /// for all of its blocks; the ones that moved stay moved.
    pub fn park_in(&self) -> Result<(), u16> {
        let round = self.tiers.round_now();
        let mut short = None;
        for (dev, blocks) in self.by_device(Place::Host) {
            let device = CUdevice::from(dev);
            let Some(slot) = self.accounting.slot(device) else {
                continue;
            };
            let limit = self
                .accounting
                .cap_in_force(slot, device)
                .unwrap_or(u64::MAX);
            let want = blocks.len();
            let mut staged = Vec::new();
            for b in blocks {
                match self.stage(slot, device, limit, b, Place::Device, true) {
                    Ok(m) => staged.push(m),
                    Err(_) => break,
                }
            }
            let (n, _) = self.move_staged(slot, device, round, staged);
            if n < want {
                short.get_or_insert(dev);
            }
        }
        match short {
            None => {
                log_at!(
                    Debug,
                    "parking: {} bytes of host memory kept for the next park",
                    self.tiers.kept_bytes()
                );
                Ok(())
            }
            Some(d) => Err(d),
        }
    }

    /// Gives back the host memory kept for parks (`vramcap trim`): the
    /// bytes given back.
    pub fn release_kept(&self) -> u64 {
        let mut bytes = 0;
        for (b, h) in self.tiers.take_all_kept() {
            let _ = self.driver.vmm_release(h);
            self.host.give_back(b);
            bytes += b;
        }
        bytes
    }
}
