//! Tiered spill of the memory a program makes itself with `cuMemCreate`
//! and maps at its own addresses, as PyTorch's allocator does with
//! `expandable_segments:True` (one handle a 2 or 20 MiB page, each mapped
//! whole, once).
//!
//! # How
//! - **Handles stand in for the memory.** Under `VRAMCAP_SPILL=tiered`
//!   every `cuMemCreate` on a device answers a handle of the engine's, not
//!   the driver's: a tiered block's memory is replaced when it moves, and
//!   the program's handle must go on naming it. The engine keeps the
//!   physical allocation behind it. Within the cap that is what the
//!   program asked for (its own properties); past it, pinned host memory
//!   of the same size, counted as spilled (the spill limit bounds it). A
//!   handle's value is the address of a heap cell the engine owns while
//!   the handle lives: no two live ones are equal, and none equals a live
//!   driver handle if the driver's are addresses of its own objects in
//!   the same heap (their values are not documented; a driver handle the
//!   program got elsewhere, an import, is looked up and passed through).
//! - **Mapped whole, once: a block.** `cuMemMap` of a whole handle at
//!   offset 0, while the handle has no other mapping and a context is
//!   current, makes a tiered block at that address (`engine/tiered/`), which
//!   moves as the engine's own blocks do once the program has granted
//!   access to it (`cuMemSetAccess`, whose descriptors a move grants
//!   again). Any other mapping, and an export, pins the handle where it
//!   is: the block stops moving and keeps its memory. So does access
//!   granted to another device (whose work a move does not wait for) or
//!   to part of the page (a move grants what it keeps over the whole
//!   page), and a dma-buf of its range (`cuMemGetHandleForAddressRange`,
//!   `lifecycle.rs`). A block's heat is
//!   read with its neighbours' (`tier::take_round`): a tensor may span
//!   pages mapped end to end.
//! - **Translated calls.** `cuMemMap`, `cuMemRelease`,
//!   `cuMemExportToShareableHandle` and
//!   `cuMemGetAllocationPropertiesFromHandle` reach the driver with the
//!   physical handle (the properties then name the device the program
//!   asked for); `cuMemRetainAllocationHandle` of a mapped address answers
//!   the program's handle with one more reference; importing a descriptor
//!   open on the file description this process exported a handle as
//!   (`kcmp` against a copy the engine keeps: the driver's descriptors are
//!   all open on one device file, so neither the number nor the file tells
//!   them apart) answers that handle; where `kcmp` is refused, the
//!   program gets the driver's handle to the same, pinned, memory. Memory
//!   made past the cap or moved is made
//!   without the handle types the program asked for, so its export fails
//!   (with a line in the log). The handle and its
//!   bytes go when it is released and unmapped everywhere, as the
//!   driver's do. `cuMemMapArrayAsync` and `cuMulticastBindMem` are not
//!   translated: sparse arrays and multicast objects cannot be backed by
//!   the engine's handles.
//! - A context that goes away leaves the memory mapped (VMM memory belongs
//!   to no context): its blocks stop moving, the handles stay.
//!
//! # Concurrency
//! - The handles are a map under one `Mutex`, held for one lookup or
//!   update, never across a driver call, never with another lock (the
//!   blocks' map is taken after it is let go). A call reads what it needs,
//!   lets go, calls the driver, and takes it again to settle: a handle's
//!   mapping count is raised before the driver maps and lowered if that
//!   fails, so no release in between can take the memory away.
//! - A handle keeps its block (an `Arc`) while it is one, and the block's
//!   handle is the physical one then. A block is pinned before its
//!   physical handle is read for a second mapping or an export
//!   (`TierBlock::pin` waits for a move in progress), held still for a
//!   properties query, pinned as soon as it is made if another thread
//!   pinned its handle meanwhile, and detached before the program's
//!   `cuMemUnmap` reaches the driver (as a free is: it waits for a move in
//!   progress), so no move swaps memory the program is about to use
//!   elsewhere or unmap. Only then does the handle take the block's
//!   memory back. `cuMemSetAccess` passes the gate, and the access a move
//!   grants again is kept before it lets go.
//! - What allocates: a handle's heap cell and map entry, a block's insert
//!   and its access descriptors, a kept descriptor for each export.
//! - Killed at any instruction: nothing here outlives the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::engine::tiered::{Place, TierBlock};
use crate::ffi::*;

/// One of the program's `cuMemCreate` handles under tiered spill
/// (`engine/tiered/handles.rs`): where its memory is while no block holds it.
pub(in crate::engine) struct Handle {
    /// The engine's cell whose address is the handle's value.
    pub(in crate::engine) _cell: Box<u64>,
    pub(in crate::engine) device: u16,
    pub(in crate::engine) bytes: u64,
    /// The physical allocation, when it is not a block (a block's own
    /// handle is the one in force while it is one).
    pub(in crate::engine) real: u64,
    pub(in crate::engine) place: Place,
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
    /// an import of it (`engine/tiered/handles.rs`).
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

    /// Calls `f` with the entry of the program's live handle `h`: `None`
    /// when `h` is not the program's, `Err` (the driver's answer for it)
    /// when it was released.
    pub(in crate::engine) fn with_live<R>(
        &self,
        h: u64,
        f: impl FnOnce(&mut Handle) -> R,
    ) -> Option<Result<R, CUresult>> {
        let mut m = self.lock();
        let x = m.get_mut(&h)?;
        Some(if x.refs == 0 {
            Err(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(f(x))
        })
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
