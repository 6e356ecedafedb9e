//! The intercepted driver functions, and the one table that says which they
//! are: the exports, the answers given to `dlsym` on the driver's handle and
//! the answers given by `cuGetProcAddress*` all come from [`HOOKS`].

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use crate::cuda::*;
use crate::log::{log_at, log_once};
use crate::real::{DynFn, call_real};
use crate::state::DISABLED;
use crate::{alloc, lifecycle, nvml, paths};

/// The driver functions the shim calls, by exact (versioned) name.
pub struct RealFns {
    pub cuMemUnmap: DynFn,
    pub cuMemMap: DynFn,
    pub cuMemExportToShareableHandle: DynFn,
    pub cuDeviceGetAttribute: DynFn,
    pub cuMemAdvise: DynFn,
    pub cuMemAdvise_v2: DynFn,
    pub cuMemHostAlloc: DynFn,
    pub cuMemHostGetDevicePointer_v2: DynFn,
    pub cuMemFreeHost: DynFn,
    pub cuEventCreate: DynFn,
    pub cuEventRecord: DynFn,
    pub cuEventRecord_ptsz: DynFn,
    pub cuEventQuery: DynFn,
    pub cuEventDestroy_v2: DynFn,
    pub cuStreamGetDevice: DynFn,
    pub cuStreamGetDevice_ptsz: DynFn,
    pub cuMemAllocAsync: DynFn,
    pub cuMemAllocAsync_ptsz: DynFn,
    pub cuMemAllocFromPoolAsync: DynFn,
    pub cuMemAllocFromPoolAsync_ptsz: DynFn,
    pub cuMemFreeAsync: DynFn,
    pub cuMemFreeAsync_ptsz: DynFn,
    pub cuMemCreate: DynFn,
    pub cuMemRelease: DynFn,
    pub cuMemRetainAllocationHandle: DynFn,
    pub cuMemImportFromShareableHandle: DynFn,
    pub cuArrayCreate_v2: DynFn,
    pub cuArray3DCreate_v2: DynFn,
    pub cuMipmappedArrayCreate: DynFn,
    pub cuArrayDestroy: DynFn,
    pub cuMipmappedArrayDestroy: DynFn,
    pub cuArrayGetMemoryRequirements: DynFn,
    pub cuMipmappedArrayGetMemoryRequirements: DynFn,
    pub nvmlDeviceGetMemoryInfo: DynFn,
    pub nvmlDeviceGetMemoryInfo_v2: DynFn,
    pub nvmlDeviceGetUUID: DynFn,
    pub nvmlDeviceGetIndex: DynFn,
    pub cuGetProcAddress: DynFn,
    pub cuGetProcAddress_v2: DynFn,
    pub cuMemAlloc_v2: DynFn,
    pub cuMemAllocPitch_v2: DynFn,
    pub cuMemAllocManaged: DynFn,
    pub cuMemFree_v2: DynFn,
    pub cuMemGetInfo_v2: DynFn,
    pub cuDeviceTotalMem_v2: DynFn,
    pub cuCtxGetDevice: DynFn,
    pub cuCtxGetCurrent: DynFn,
    pub cuCtxSynchronize: DynFn,
    pub cuCtxPushCurrent_v2: DynFn,
    pub cuCtxPopCurrent_v2: DynFn,
    pub cuCtxDestroy_v2: DynFn,
    pub cuDevicePrimaryCtxRetain: DynFn,
    pub cuDevicePrimaryCtxRelease_v2: DynFn,
    pub cuDevicePrimaryCtxReset_v2: DynFn,
    pub cuDevicePrimaryCtxGetState: DynFn,
    pub cuDeviceGetUuid: DynFn,
    pub cuDeviceGetUuid_v2: DynFn,
    pub cuIpcGetMemHandle: DynFn,
    pub cuStreamIsCapturing: DynFn,
    pub cuStreamIsCapturing_ptsz: DynFn,
    pub cuStreamBeginCapture: DynFn,
    pub cuStreamBeginCapture_ptsz: DynFn,
    pub cuStreamBeginCapture_v2: DynFn,
    pub cuStreamBeginCapture_v2_ptsz: DynFn,
    pub cuStreamBeginCaptureToGraph: DynFn,
    pub cuStreamBeginCaptureToGraph_ptsz: DynFn,
    pub cuStreamEndCapture: DynFn,
    pub cuStreamEndCapture_ptsz: DynFn,
}

pub static REAL: RealFns = RealFns {
    cuMemUnmap: DynFn::new(c"cuMemUnmap"),
    cuMemMap: DynFn::new(c"cuMemMap"),
    cuMemExportToShareableHandle: DynFn::new(c"cuMemExportToShareableHandle"),
    cuDeviceGetAttribute: DynFn::new(c"cuDeviceGetAttribute"),
    cuMemAdvise: DynFn::new(c"cuMemAdvise"),
    cuMemAdvise_v2: DynFn::new(c"cuMemAdvise_v2"),
    cuMemHostAlloc: DynFn::new(c"cuMemHostAlloc"),
    cuMemHostGetDevicePointer_v2: DynFn::new(c"cuMemHostGetDevicePointer_v2"),
    cuMemFreeHost: DynFn::new(c"cuMemFreeHost"),
    cuEventCreate: DynFn::new(c"cuEventCreate"),
    cuEventRecord: DynFn::new(c"cuEventRecord"),
    cuEventRecord_ptsz: DynFn::new(c"cuEventRecord_ptsz"),
    cuEventQuery: DynFn::new(c"cuEventQuery"),
    cuEventDestroy_v2: DynFn::new(c"cuEventDestroy_v2"),
    cuStreamGetDevice: DynFn::new(c"cuStreamGetDevice"),
    cuStreamGetDevice_ptsz: DynFn::new(c"cuStreamGetDevice_ptsz"),
    cuMemAllocAsync: DynFn::new(c"cuMemAllocAsync"),
    cuMemAllocAsync_ptsz: DynFn::new(c"cuMemAllocAsync_ptsz"),
    cuMemAllocFromPoolAsync: DynFn::new(c"cuMemAllocFromPoolAsync"),
    cuMemAllocFromPoolAsync_ptsz: DynFn::new(c"cuMemAllocFromPoolAsync_ptsz"),
    cuMemFreeAsync: DynFn::new(c"cuMemFreeAsync"),
    cuMemFreeAsync_ptsz: DynFn::new(c"cuMemFreeAsync_ptsz"),
    cuMemCreate: DynFn::new(c"cuMemCreate"),
    cuMemRelease: DynFn::new(c"cuMemRelease"),
    cuMemRetainAllocationHandle: DynFn::new(c"cuMemRetainAllocationHandle"),
    cuMemImportFromShareableHandle: DynFn::new(c"cuMemImportFromShareableHandle"),
    cuArrayCreate_v2: DynFn::new(c"cuArrayCreate_v2"),
    cuArray3DCreate_v2: DynFn::new(c"cuArray3DCreate_v2"),
    cuMipmappedArrayCreate: DynFn::new(c"cuMipmappedArrayCreate"),
    cuArrayDestroy: DynFn::new(c"cuArrayDestroy"),
    cuMipmappedArrayDestroy: DynFn::new(c"cuMipmappedArrayDestroy"),
    cuArrayGetMemoryRequirements: DynFn::new(c"cuArrayGetMemoryRequirements"),
    cuMipmappedArrayGetMemoryRequirements: DynFn::new(c"cuMipmappedArrayGetMemoryRequirements"),
    nvmlDeviceGetMemoryInfo: DynFn::nvml(c"nvmlDeviceGetMemoryInfo"),
    nvmlDeviceGetMemoryInfo_v2: DynFn::nvml(c"nvmlDeviceGetMemoryInfo_v2"),
    nvmlDeviceGetUUID: DynFn::nvml(c"nvmlDeviceGetUUID"),
    nvmlDeviceGetIndex: DynFn::nvml(c"nvmlDeviceGetIndex"),
    cuGetProcAddress: DynFn::new(c"cuGetProcAddress"),
    cuGetProcAddress_v2: DynFn::new(c"cuGetProcAddress_v2"),
    cuMemAlloc_v2: DynFn::new(c"cuMemAlloc_v2"),
    cuMemAllocPitch_v2: DynFn::new(c"cuMemAllocPitch_v2"),
    cuMemAllocManaged: DynFn::new(c"cuMemAllocManaged"),
    cuMemFree_v2: DynFn::new(c"cuMemFree_v2"),
    cuMemGetInfo_v2: DynFn::new(c"cuMemGetInfo_v2"),
    cuDeviceTotalMem_v2: DynFn::new(c"cuDeviceTotalMem_v2"),
    cuCtxGetDevice: DynFn::new(c"cuCtxGetDevice"),
    cuCtxGetCurrent: DynFn::new(c"cuCtxGetCurrent"),
    cuCtxSynchronize: DynFn::new(c"cuCtxSynchronize"),
    cuCtxPushCurrent_v2: DynFn::new(c"cuCtxPushCurrent_v2"),
    cuCtxPopCurrent_v2: DynFn::new(c"cuCtxPopCurrent_v2"),
    cuCtxDestroy_v2: DynFn::new(c"cuCtxDestroy_v2"),
    cuDevicePrimaryCtxRetain: DynFn::new(c"cuDevicePrimaryCtxRetain"),
    cuDevicePrimaryCtxRelease_v2: DynFn::new(c"cuDevicePrimaryCtxRelease_v2"),
    cuDevicePrimaryCtxReset_v2: DynFn::new(c"cuDevicePrimaryCtxReset_v2"),
    cuDevicePrimaryCtxGetState: DynFn::new(c"cuDevicePrimaryCtxGetState"),
    cuDeviceGetUuid: DynFn::new(c"cuDeviceGetUuid"),
    cuDeviceGetUuid_v2: DynFn::new(c"cuDeviceGetUuid_v2"),
    cuIpcGetMemHandle: DynFn::new(c"cuIpcGetMemHandle"),
    cuStreamIsCapturing: DynFn::new(c"cuStreamIsCapturing"),
    cuStreamIsCapturing_ptsz: DynFn::new(c"cuStreamIsCapturing_ptsz"),
    cuStreamBeginCapture: DynFn::new(c"cuStreamBeginCapture"),
    cuStreamBeginCapture_ptsz: DynFn::new(c"cuStreamBeginCapture_ptsz"),
    cuStreamBeginCapture_v2: DynFn::new(c"cuStreamBeginCapture_v2"),
    cuStreamBeginCapture_v2_ptsz: DynFn::new(c"cuStreamBeginCapture_v2_ptsz"),
    cuStreamBeginCaptureToGraph: DynFn::new(c"cuStreamBeginCaptureToGraph"),
    cuStreamBeginCaptureToGraph_ptsz: DynFn::new(c"cuStreamBeginCaptureToGraph_ptsz"),
    cuStreamEndCapture: DynFn::new(c"cuStreamEndCapture"),
    cuStreamEndCapture_ptsz: DynFn::new(c"cuStreamEndCapture_ptsz"),
};

/// One intercepted variant.
pub struct Hook {
    /// The exact exported name, which is also the variant's name in the driver.
    pub name: &'static CStr,
    /// The base name `cuGetProcAddress` callers ask for.
    pub base: &'static str,
    /// `cudaVersion` range `[since, until)` for which the driver answers a
    /// request for `base` with this variant. Only used when the driver hands
    /// back a pointer that is not its exported symbol (see [`substitute`]).
    pub since: c_int,
    pub until: c_int,
    /// For functions with a per-thread-default-stream twin: whether this is
    /// the per-thread (`_ptsz`) variant. `None`: no twin, `flags` is moot.
    pub per_thread: Option<bool>,
    pub hook: *const c_void,
    pub real: &'static DynFn,
}

// SAFETY: the raw pointer is a function address, immutable and valid forever.
unsafe impl Sync for Hook {}

/// Requests above this `cudaVersion` are never matched by name and version,
/// only by pointer: a later major release may give a name a new signature.
const NAME_MATCH_MAX_VERSION: c_int = 13999;

const OPEN: c_int = c_int::MAX;

/// `cuGetProcAddress` flags.
const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// Every hooked variant: the single list the exports, the `dlsym` answers and
/// the `cuGetProcAddress` answers come from (a test compares it with the
/// library's dynamic symbols).
pub static HOOKS: [Hook; 40] = [
    Hook {
        name: c"cuGetProcAddress",
        base: "cuGetProcAddress",
        since: 11030,
        until: 12000,
        per_thread: None,
        hook: crate::hooks::cuGetProcAddress as *const c_void,
        real: &REAL.cuGetProcAddress,
    },
    Hook {
        name: c"cuGetProcAddress_v2",
        base: "cuGetProcAddress",
        since: 12000,
        until: OPEN,
        per_thread: None,
        hook: crate::hooks::cuGetProcAddress_v2 as *const c_void,
        real: &REAL.cuGetProcAddress_v2,
    },
    Hook {
        name: c"cuMemAlloc_v2",
        base: "cuMemAlloc",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: alloc::cuMemAlloc_v2 as *const c_void,
        real: &REAL.cuMemAlloc_v2,
    },
    Hook {
        name: c"cuMemAllocPitch_v2",
        base: "cuMemAllocPitch",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: alloc::cuMemAllocPitch_v2 as *const c_void,
        real: &REAL.cuMemAllocPitch_v2,
    },
    Hook {
        name: c"cuMemAllocManaged",
        base: "cuMemAllocManaged",
        since: 6000,
        until: OPEN,
        per_thread: None,
        hook: alloc::cuMemAllocManaged as *const c_void,
        real: &REAL.cuMemAllocManaged,
    },
    Hook {
        name: c"cuMemFree_v2",
        base: "cuMemFree",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: alloc::cuMemFree_v2 as *const c_void,
        real: &REAL.cuMemFree_v2,
    },
    Hook {
        name: c"cuMemGetInfo_v2",
        base: "cuMemGetInfo",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: alloc::cuMemGetInfo_v2 as *const c_void,
        real: &REAL.cuMemGetInfo_v2,
    },
    Hook {
        name: c"cuDeviceTotalMem_v2",
        base: "cuDeviceTotalMem",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: alloc::cuDeviceTotalMem_v2 as *const c_void,
        real: &REAL.cuDeviceTotalMem_v2,
    },
    Hook {
        name: c"cuCtxDestroy_v2",
        base: "cuCtxDestroy",
        since: 4000,
        until: OPEN,
        per_thread: None,
        hook: lifecycle::cuCtxDestroy_v2 as *const c_void,
        real: &REAL.cuCtxDestroy_v2,
    },
    Hook {
        name: c"cuDevicePrimaryCtxRelease_v2",
        base: "cuDevicePrimaryCtxRelease",
        since: 11000,
        until: OPEN,
        per_thread: None,
        hook: lifecycle::cuDevicePrimaryCtxRelease_v2 as *const c_void,
        real: &REAL.cuDevicePrimaryCtxRelease_v2,
    },
    Hook {
        name: c"cuDevicePrimaryCtxReset_v2",
        base: "cuDevicePrimaryCtxReset",
        since: 11000,
        until: OPEN,
        per_thread: None,
        hook: lifecycle::cuDevicePrimaryCtxReset_v2 as *const c_void,
        real: &REAL.cuDevicePrimaryCtxReset_v2,
    },
    Hook {
        name: c"cuIpcGetMemHandle",
        base: "cuIpcGetMemHandle",
        since: 4010,
        until: OPEN,
        per_thread: None,
        hook: lifecycle::cuIpcGetMemHandle as *const c_void,
        real: &REAL.cuIpcGetMemHandle,
    },
    Hook {
        name: c"cuStreamBeginCapture",
        base: "cuStreamBeginCapture",
        since: 10000,
        until: 10010,
        per_thread: Some(false),
        hook: lifecycle::cuStreamBeginCapture as *const c_void,
        real: &REAL.cuStreamBeginCapture,
    },
    Hook {
        name: c"cuStreamBeginCapture_ptsz",
        base: "cuStreamBeginCapture",
        since: 10000,
        until: 10010,
        per_thread: Some(true),
        hook: lifecycle::cuStreamBeginCapture_ptsz as *const c_void,
        real: &REAL.cuStreamBeginCapture_ptsz,
    },
    Hook {
        name: c"cuStreamBeginCapture_v2",
        base: "cuStreamBeginCapture",
        since: 10010,
        until: OPEN,
        per_thread: Some(false),
        hook: lifecycle::cuStreamBeginCapture_v2 as *const c_void,
        real: &REAL.cuStreamBeginCapture_v2,
    },
    Hook {
        name: c"cuStreamBeginCapture_v2_ptsz",
        base: "cuStreamBeginCapture",
        since: 10010,
        until: OPEN,
        per_thread: Some(true),
        hook: lifecycle::cuStreamBeginCapture_v2_ptsz as *const c_void,
        real: &REAL.cuStreamBeginCapture_v2_ptsz,
    },
    Hook {
        name: c"cuStreamBeginCaptureToGraph",
        base: "cuStreamBeginCaptureToGraph",
        since: 12030,
        until: OPEN,
        per_thread: Some(false),
        hook: lifecycle::cuStreamBeginCaptureToGraph as *const c_void,
        real: &REAL.cuStreamBeginCaptureToGraph,
    },
    Hook {
        name: c"cuStreamBeginCaptureToGraph_ptsz",
        base: "cuStreamBeginCaptureToGraph",
        since: 12030,
        until: OPEN,
        per_thread: Some(true),
        hook: lifecycle::cuStreamBeginCaptureToGraph_ptsz as *const c_void,
        real: &REAL.cuStreamBeginCaptureToGraph_ptsz,
    },
    Hook {
        name: c"cuStreamEndCapture",
        base: "cuStreamEndCapture",
        since: 10000,
        until: OPEN,
        per_thread: Some(false),
        hook: lifecycle::cuStreamEndCapture as *const c_void,
        real: &REAL.cuStreamEndCapture,
    },
    Hook {
        name: c"cuStreamEndCapture_ptsz",
        base: "cuStreamEndCapture",
        since: 10000,
        until: OPEN,
        per_thread: Some(true),
        hook: lifecycle::cuStreamEndCapture_ptsz as *const c_void,
        real: &REAL.cuStreamEndCapture_ptsz,
    },
    Hook {
        name: c"cuMemAllocAsync",
        base: "cuMemAllocAsync",
        since: 11020,
        until: OPEN,
        per_thread: Some(false),
        hook: paths::cuMemAllocAsync as *const c_void,
        real: &REAL.cuMemAllocAsync,
    },
    Hook {
        name: c"cuMemAllocAsync_ptsz",
        base: "cuMemAllocAsync",
        since: 11020,
        until: OPEN,
        per_thread: Some(true),
        hook: paths::cuMemAllocAsync_ptsz as *const c_void,
        real: &REAL.cuMemAllocAsync_ptsz,
    },
    Hook {
        name: c"cuMemAllocFromPoolAsync",
        base: "cuMemAllocFromPoolAsync",
        since: 11020,
        until: OPEN,
        per_thread: Some(false),
        hook: paths::cuMemAllocFromPoolAsync as *const c_void,
        real: &REAL.cuMemAllocFromPoolAsync,
    },
    Hook {
        name: c"cuMemAllocFromPoolAsync_ptsz",
        base: "cuMemAllocFromPoolAsync",
        since: 11020,
        until: OPEN,
        per_thread: Some(true),
        hook: paths::cuMemAllocFromPoolAsync_ptsz as *const c_void,
        real: &REAL.cuMemAllocFromPoolAsync_ptsz,
    },
    Hook {
        name: c"cuMemFreeAsync",
        base: "cuMemFreeAsync",
        since: 11020,
        until: OPEN,
        per_thread: Some(false),
        hook: paths::cuMemFreeAsync as *const c_void,
        real: &REAL.cuMemFreeAsync,
    },
    Hook {
        name: c"cuMemFreeAsync_ptsz",
        base: "cuMemFreeAsync",
        since: 11020,
        until: OPEN,
        per_thread: Some(true),
        hook: paths::cuMemFreeAsync_ptsz as *const c_void,
        real: &REAL.cuMemFreeAsync_ptsz,
    },
    Hook {
        name: c"cuMemCreate",
        base: "cuMemCreate",
        since: 10020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemCreate as *const c_void,
        real: &REAL.cuMemCreate,
    },
    Hook {
        name: c"cuMemRelease",
        base: "cuMemRelease",
        since: 10020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemRelease as *const c_void,
        real: &REAL.cuMemRelease,
    },
    Hook {
        name: c"cuMemRetainAllocationHandle",
        base: "cuMemRetainAllocationHandle",
        since: 11000,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemRetainAllocationHandle as *const c_void,
        real: &REAL.cuMemRetainAllocationHandle,
    },
    Hook {
        name: c"cuMemImportFromShareableHandle",
        base: "cuMemImportFromShareableHandle",
        since: 10020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemImportFromShareableHandle as *const c_void,
        real: &REAL.cuMemImportFromShareableHandle,
    },
    Hook {
        name: c"cuArrayCreate_v2",
        base: "cuArrayCreate",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuArrayCreate_v2 as *const c_void,
        real: &REAL.cuArrayCreate_v2,
    },
    Hook {
        name: c"cuArray3DCreate_v2",
        base: "cuArray3DCreate",
        since: 3020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuArray3DCreate_v2 as *const c_void,
        real: &REAL.cuArray3DCreate_v2,
    },
    Hook {
        name: c"cuMipmappedArrayCreate",
        base: "cuMipmappedArrayCreate",
        since: 5000,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMipmappedArrayCreate as *const c_void,
        real: &REAL.cuMipmappedArrayCreate,
    },
    Hook {
        name: c"cuArrayDestroy",
        base: "cuArrayDestroy",
        since: 2000,
        until: OPEN,
        per_thread: None,
        hook: paths::cuArrayDestroy as *const c_void,
        real: &REAL.cuArrayDestroy,
    },
    Hook {
        name: c"cuMipmappedArrayDestroy",
        base: "cuMipmappedArrayDestroy",
        since: 5000,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMipmappedArrayDestroy as *const c_void,
        real: &REAL.cuMipmappedArrayDestroy,
    },
    Hook {
        name: c"nvmlDeviceGetMemoryInfo",
        base: "",
        since: 0,
        until: 0,
        per_thread: None,
        hook: nvml::nvmlDeviceGetMemoryInfo as *const c_void,
        real: &REAL.nvmlDeviceGetMemoryInfo,
    },
    Hook {
        name: c"nvmlDeviceGetMemoryInfo_v2",
        base: "",
        since: 0,
        until: 0,
        per_thread: None,
        hook: nvml::nvmlDeviceGetMemoryInfo_v2 as *const c_void,
        real: &REAL.nvmlDeviceGetMemoryInfo_v2,
    },
    Hook {
        name: c"cuMemExportToShareableHandle",
        base: "cuMemExportToShareableHandle",
        since: 10020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemExportToShareableHandle as *const c_void,
        real: &REAL.cuMemExportToShareableHandle,
    },
    Hook {
        name: c"cuMemMap",
        base: "cuMemMap",
        since: 10020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemMap as *const c_void,
        real: &REAL.cuMemMap,
    },
    Hook {
        name: c"cuMemUnmap",
        base: "cuMemUnmap",
        since: 10020,
        until: OPEN,
        per_thread: None,
        hook: paths::cuMemUnmap as *const c_void,
        real: &REAL.cuMemUnmap,
    },
];

/// Runs a hook body; a panic is caught (it must never unwind into C), logged
/// once, and answered with `on_panic`.
pub fn boundary<R>(name: &'static str, on_panic: R, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            log_once!(
                Error,
                "internal error in the {name} hook; answering conservatively (please report this)"
            );
            on_panic
        }
    }
}

pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// Replaces a driver function pointer handed out by `cuGetProcAddress*` with
/// the hook for the same variant. The variant is identified by the pointer
/// itself (the driver's exported symbol of that exact name); when the driver
/// hands out a pointer that is none of its exports, by base name and version
/// within the CUDA major versions whose signatures the hooks were written for.
///
/// # Safety
/// `pfn` is non-null and holds what the real resolver wrote; `symbol` is the
/// caller's NUL-terminated name.
unsafe fn substitute(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) {
    if disabled() {
        return;
    }
    // SAFETY: guaranteed by the caller.
    let p = unsafe { *pfn };
    if p.is_null() {
        return;
    }
    // NVML functions are never handed out by the CUDA resolver; looking
    // them up here would load NVML as a side effect.
    let cuda_hooks = || {
        HOOKS
            .iter()
            .filter(|h| h.real.lib == crate::real::Lib::Cuda)
    };
    if let Some(h) = cuda_hooks().find(|h| h.real.get() == Some(p)) {
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = h.hook.cast_mut() };
        return;
    }
    if symbol.is_null() || cuda_version > NAME_MATCH_MAX_VERSION {
        return;
    }
    // SAFETY: the real resolver accepted it as a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let flavour_ok = |h: &Hook| match h.per_thread {
        None => true,
        Some(true) => flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        // With the default flags the driver picks by how the caller was
        // built, which the shim cannot know: no substitution by name then.
        Some(false) => flags == CU_GET_PROC_ADDRESS_LEGACY_STREAM,
    };
    if let Some(h) = HOOKS.iter().find(|h| {
        h.base.as_bytes() == name && (h.since..h.until).contains(&cuda_version) && flavour_ok(h)
    }) {
        log_at!(
            Debug,
            "cuGetProcAddress({}, {cuda_version}): internal driver pointer, matched {:?} by version",
            h.base,
            h.name
        );
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = h.hook.cast_mut() };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    boundary("cuGetProcAddress_v2", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuGetProcAddress_v2,
            fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult,
            symbol,
            pfn,
            cuda_version,
            flags,
            symbol_status
        );
        if rc == CUDA_SUCCESS && !pfn.is_null() {
            // SAFETY: pfn is non-null and the resolver filled it.
            unsafe { substitute(symbol, pfn, cuda_version, flags) };
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    boundary("cuGetProcAddress", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuGetProcAddress,
            fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult,
            symbol,
            pfn,
            cuda_version,
            flags
        );
        if rc == CUDA_SUCCESS && !pfn.is_null() {
            // SAFETY: pfn is non-null and the resolver filled it.
            unsafe { substitute(symbol, pfn, cuda_version, flags) };
        }
        rc
    })
}

/// What `dlsym(handle, name)` answers for a real handle, given glibc's own
/// answer `found`: the hook when `found` is the driver's own symbol of a
/// hooked name, else `found` unchanged.
pub fn answer_dlsym(name: &CStr, found: *mut c_void) -> *mut c_void {
    let n = name.to_bytes();
    if found.is_null() || disabled() || !(n.starts_with(b"cu") || n.starts_with(b"nvml")) {
        return found;
    }
    let Some(h) = HOOKS.iter().find(|h| h.name == name) else {
        return found;
    };
    match h.real.get() {
        Some(p) if p == found => h.hook.cast_mut(),
        _ => {
            log_once!(
                Warn,
                "the program looked up {:?} in a library that is not the driver vramcap uses ({:?}); calls through it are not capped. Set VRAMCAP_CUDA_LIBRARY to the libcuda.so.1 the program loads",
                name,
                crate::real::driver_path()
            );
            found
        }
    }
}
