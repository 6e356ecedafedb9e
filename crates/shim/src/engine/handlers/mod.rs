//! The engine's handlers of the hooked driver and NVML functions, one file
//! per API family: `alloc` (plain, pitched and managed memory, and the
//! allocation path the families share), `free` (frees), `queries` (memory
//! queries), `pools` (stream-ordered allocation and pools), `graphs`
//! (instantiation, upload, launch, update of graphs), `vmm`,
//! `arrays`, `lifecycle` (contexts, captures, IPC), `nvml`, `live` (caps
//! changed while the program runs). Tiered spill's handlers are in
//! `tiered`.

pub(super) mod alloc;
pub(super) mod arrays;
pub(super) mod free;
pub(super) mod graphs;
pub(super) mod lifecycle;
pub(super) mod live;
pub(super) mod nvml;
pub(super) mod pools;
pub(super) mod queries;
pub(super) mod vmm;
