//! The engine's handlers of the hooked driver and NVML functions, one file
//! per API family: `alloc` (plain, pitched and managed memory, and the
//! allocation path the families share), `free` (frees), `queries` (memory
//! queries), `pools` (stream-ordered allocation and pools), `graphs`
//! (instantiation, upload, launch, update of graphs), `vmm`,
//! `arrays`, `lifecycle` (contexts, captures, IPC), `nvml`, `live` (caps
//! changed while the program runs), `launch` (launches, copies and memsets,
//! handed out only under tiered spill), `vmm_tiered` (the VMM family under
//! tiered spill: the program's own `cuMemCreate` handles).

pub(super) mod alloc;
pub(super) mod arrays;
pub(super) mod free;
pub(super) mod graphs;
pub(super) mod launch;
pub(super) mod lifecycle;
pub(super) mod live;
pub(super) mod nvml;
pub(super) mod pools;
pub(super) mod queries;
pub(super) mod vmm;
pub(super) mod vmm_tiered;

use crate::ffi::{CUDA_SUCCESS, CUresult};

/// `rc`, a real call's answer, after `then` (what the engine records of a
/// call that worked; what it returns is not needed) when it is success.
fn on_success<T>(rc: CUresult, then: impl FnOnce() -> T) -> CUresult {
    if rc == CUDA_SUCCESS {
        then();
    }
    rc
}
