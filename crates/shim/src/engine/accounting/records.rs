//! What the engine knows about the memory a process holds: records of live
//! allocations by address, and of handles (VMM allocations, arrays) that
//! hold device memory, in sharded maps.
//!
//! Concurrency: a [`Registry`] is a dashmap, made with its engine. Its shard
//! locks are taken for one insert, remove, lookup or
//! `retain` and never across a driver call, `dlopen` or `dlsym`; code never
//! holds one entry guard while touching another map. The maps allocate (an
//! insert may grow a shard). A child after `fork` gets a new engine with
//! new registries and never touches the parent's, whose shard locks another
//! parent thread may have held at the fork.

pub use vramcap_core::cache::PtrHash;

use dashmap::DashMap;

/// What the shim knows about a live allocation.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub device: u16,
    /// Exported with `cuIpcGetMemHandle`: never cached.
    pub exported: bool,
    pub bytes: u64,
    /// The context that allocated it.
    pub ctx: usize,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device memory the cache may keep (`cuMemAlloc_v2`, `cuMemAllocPitch_v2`).
    Device(vramcap_core::cache::Shape),
    Managed,
    /// Stream-ordered (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`), with
    /// the serial of the pool entry it is charged through (`held.rs`), or
    /// `None` when it is charged by its own size (`VRAMCAP_COUNT=allocations`,
    /// or a pool the driver would not describe).
    Async(Option<u64>),
    /// Past the cap, in pinned host memory (the host address).
    SpillHost(u64),
    /// Tiered spill: VMM memory the engine made (a reserved range with
    /// physical memory on the device or pinned on the host), where the
    /// block's entry in `tiered` says (it moves).
    Tiered,
    /// A tiered block freed stream-ordered, waiting for its stream (only in
    /// spill's deferred list), and where it was when it was freed.
    TieredFreed {
        place: Place,
        handle: u64,
    },
}

/// Where a tiered block's memory is (kept in the block as a `u8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Place {
    /// The device's memory, reserved under the cap.
    Device = 0,
    /// Pinned host memory the GPU reads over the link, counted as spilled.
    Host = 1,
}

impl Place {
    /// Its name in messages: `device` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            Place::Device => "device",
            Place::Host => "host",
        }
    }
}

/// A map from a driver handle or address to what the engine knows of it.
pub type Registry<V> = DashMap<u64, V, PtrHash>;

/// An empty registry.
pub fn registry<V>() -> Registry<V> {
    DashMap::with_hasher(PtrHash)
}

/// Something other than an address that holds device memory: a VMM
/// allocation handle or an array.
#[derive(Debug, Clone, Copy)]
pub struct Object {
    pub device: u16,
    pub bytes: u64,
    /// Handles that refer to it (VMM: create, retain and import each add one).
    pub refs: u32,
    /// VMM: this handle is another handle to the allocation counted under
    /// `alias_of` (an import of this process's own export); 0 otherwise.
    pub alias_of: u64,
    /// Arrays: the context that made it (its memory goes with the
    /// context); 0 for VMM allocations, which belong to no context.
    pub ctx: usize,
}
