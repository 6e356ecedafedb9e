//! Peer access to blocks. `cuCtxEnablePeerAccess` maps a peer GPU's
//! `cuMemAlloc` memory for the calling context's GPU, but no VMM memory:
//! that needs `cuMemSetAccess`. A block is VMM memory where the program
//! asked for a plain allocation, so once the program lets GPU `p` reach
//! GPU `d`'s memory, every block on `d` is granted to `p` as well: those
//! mapped now (`grant_existing`), and each mapping made later, when a
//! block is made or a move maps it afresh (`grant_peers`).
//!
//! - **Invariant:** after `grant_existing(d, p)` returns, every block on `d`
//!   mapped at its address grants `p` read-write, except one whose grant
//!   the driver refused (said once).
//! - **Ordering:** the bit is set (SeqCst) before the walk of the block
//!   map; a block made reads the bits (SeqCst) after it is in the map, and
//!   a move maps a block already there and reads the bits after mapping:
//!   so the walk finds the block, or the block's own read sees the bit. A
//!   grant on a block not mapped at that moment (being moved, parked)
//!   fails and is ignored; its next mapping grants it.
//! - The walk holds the block map's read lock throughout, so a block freed
//!   meanwhile (detached from the map before its memory and address go) is
//!   either granted while still mapped or not seen: a grant never lands
//!   on an address reused by other memory.
//! - Bits are never cleared: `cuCtxDisablePeerAccess` leaves a grant the
//!   program no longer uses, which costs nothing.
//! - The program's own `cuMemCreate` memory is not touched: the program
//!   grants its own access, and a move maps it again with that access.

use super::*;

use crate::log::log_once;

impl Tiers {
    /// Records that `peer` may reach `device`'s memory: whether that is new.
    pub(in crate::engine) fn add_peer(&self, device: CUdevice, peer: CUdevice) -> bool {
        let (Some(slot), Ok(bit)) = (self.peers.get(device as usize), u32::try_from(peer)) else {
            return false;
        };
        if peer == device || bit >= 64 {
            return false;
        }
        slot.fetch_or(1 << bit, Ordering::SeqCst) & (1 << bit) == 0
    }

    /// The access a mapping on `device` gives: the device itself, and the
    /// peers the program let reach it (empty when none: the mapping's own
    /// grant is all).
    fn peer_access(&self, device: CUdevice) -> Vec<CUmemAccessDesc> {
        let bits = self
            .peers
            .get(device as usize)
            .map_or(0, |p| p.load(Ordering::SeqCst));
        if bits == 0 {
            return Vec::new();
        }
        std::iter::once(device)
            .chain(
                (0..64)
                    .filter(|b| bits & (1u64 << b) != 0)
                    .map(|b| b as CUdevice),
            )
            .map(CUmemAccessDesc::read_write)
            .collect()
    }

    /// Grants the peers of `device` the range just mapped at `ptr` (a
    /// block made, or mapped again by a move). A refusal is said once; the
    /// block still works on its own device.
    pub(in crate::engine) fn grant_peers<D: Driver>(
        &self,
        driver: &D,
        ptr: u64,
        bytes: u64,
        device: CUdevice,
    ) {
        let access = self.peer_access(device);
        if access.is_empty() {
            return;
        }
        let rc = driver.vmm_set_access(ptr, bytes, &access);
        if rc != CUDA_SUCCESS {
            log_once!(
                Warn,
                "peer access: the driver refused to grant other GPUs the shim's block at {ptr:#x} on GPU {device} (error {rc}); a kernel on another GPU that reads it faults"
            );
        }
    }

    /// Grants `device`'s blocks mapped now to its peers (after
    /// [`add_peer`](Self::add_peer)): see the module docs.
    pub(in crate::engine) fn grant_existing<D: Driver>(&self, driver: &D, device: CUdevice) {
        let access = self.peer_access(device);
        if access.is_empty() {
            return;
        }
        let blocks = read!(self.blocks);
        for b in blocks.values() {
            if CUdevice::from(b.device) != device || b.program_handle != 0 {
                continue;
            }
            // Not mapped now (moving, parked): refused, and its next
            // mapping grants it.
            let _ = driver.vmm_set_access(b.ptr, b.bytes, &access);
        }
    }
}
