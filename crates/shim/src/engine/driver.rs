//! What the engine asks of the CUDA driver and NVML besides the call it is
//! handling: one method per driver function it uses, in Rust types. The
//! shim's implementation (`boundary::RealDriver`) calls the real libraries
//! through their typed table; the engine's unit tests use a fake.
//!
//! Handles (contexts, streams, events, arrays, host pointers) travel as
//! `usize`: the engine compares and stores them, never dereferences them.
//! A method whose driver function is missing answers `CUDA_ERROR_NOT_FOUND`
//! (or, for NVML, `None`), as the real library would for a bad call.
//!
//! One method is not the driver's: [`Driver::exit_process`], how the engine
//! stops a process that must not run without the cap it asked for (the
//! fake records it instead, so tests can see it).

use std::ffi::{c_int, c_uint, c_void};

use crate::ffi::{
    CUdevice, CUdeviceptr, CUmemAccessDesc, CUmemAllocationPropFull, CUmemLocation, CUresult,
};

/// Which of a function's two stream flavours to call: the legacy default
/// stream (`cuX`) or the per-thread one (`cuX_ptsz`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Legacy,
    PerThread,
}

/// A step of the driver's checkpoint API, always on this process's own PID
/// (`cuCheckpointProcess*`; parking, `engine/park/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// `cuCheckpointProcessLock`, with a timeout in milliseconds.
    Lock(u32),
    /// `cuCheckpointProcessCheckpoint`.
    Save,
    Restore,
    Unlock,
}

/// What parking asks of the driver and NVML, apart from [`Driver`] so that
/// its implementations live with parking (`boundary/park.rs`); the
/// defaults answer "not there" (the fake).
pub trait Checkpointing {
    /// A checkpoint step on this process; `None` when the driver lacks the
    /// checkpoint API (drivers before r570).
    fn checkpoint(&self, _step: Checkpoint) -> Option<CUresult> {
        None
    }
    /// Whether the driver has every checkpoint step.
    fn has_checkpoint_api(&self) -> bool {
        false
    }
    /// Every GPU's free bytes by UUID (`GPU-…`), measured by another
    /// process: in this one CUDA and NVML calls both block while it is
    /// checkpointed. `Err` says why they are not known.
    fn gpu_free(&self) -> Result<Vec<(String, u64)>, String> {
        Err("no way to measure".into())
    }
    /// The free bytes of the current context's GPU (`cuMemGetInfo`, real),
    /// asked by a running process's policy; `None` when not known.
    fn current_free(&self) -> Option<u64> {
        None
    }
}

pub trait Driver: Checkpointing + Send + Sync + 'static {
    /// `cuCtxGetCurrent`: the calling thread's context (0 for none).
    fn ctx_get_current(&self) -> Result<usize, CUresult>;
    /// `cuCtxGetDevice` of the current context.
    fn ctx_get_device(&self) -> Result<CUdevice, CUresult>;
    /// `cuCtxGetId` (CUDA 12.0): an ID no other context of the process
    /// ever has.
    fn ctx_get_id(&self, ctx: usize) -> Result<u64, CUresult>;
    /// `cuCtxSynchronize` of the current context.
    fn ctx_synchronize(&self) -> CUresult;
    /// `cuCtxPushCurrent_v2`.
    fn ctx_push_current(&self, ctx: usize) -> CUresult;
    /// `cuCtxPopCurrent_v2`.
    fn ctx_pop_current(&self) -> CUresult;
    /// `cuDevicePrimaryCtxGetState`: (flags, active).
    fn primary_ctx_state(&self, dev: CUdevice) -> Result<(c_uint, bool), CUresult>;
    /// `cuDevicePrimaryCtxRetain`.
    fn primary_ctx_retain(&self, dev: CUdevice) -> Result<usize, CUresult>;
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn primary_ctx_release(&self, dev: CUdevice) -> CUresult;

    /// `cuDeviceGetCount`: the devices the process sees.
    fn device_count(&self) -> Result<c_int, CUresult>;
    /// `cuDeviceGetName`.
    fn device_name(&self, dev: CUdevice) -> Result<String, CUresult>;
    /// `cuDeviceTotalMem_v2`.
    fn device_total_mem(&self, dev: CUdevice) -> Result<u64, CUresult>;
    /// `cuDeviceGetUuid_v2`, else `cuDeviceGetUuid`.
    fn device_uuid(&self, dev: CUdevice) -> Result<[u8; 16], CUresult>;

    /// `cuStreamIsCapturing[_ptsz]`: the capture status (0: not capturing).
    fn stream_is_capturing(&self, stream: usize, flavour: Flavour) -> Result<c_int, CUresult>;
    /// `cuStreamGetDevice[_ptsz]`.
    fn stream_get_device(&self, stream: usize, flavour: Flavour) -> Result<CUdevice, CUresult>;

    /// `cuMemFree_v2` (the real one: never the shim's hook).
    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult;
    /// `cuMemHostAlloc`: the host address.
    fn mem_host_alloc(&self, bytes: usize, flags: c_uint) -> Result<usize, CUresult>;
    /// `cuMemHostGetDevicePointer_v2`.
    fn mem_host_get_device_pointer(&self, host: usize) -> Result<CUdeviceptr, CUresult>;
    /// `cuMemFreeHost`.
    fn mem_free_host(&self, host: usize) -> CUresult;
    /// `cuMemHostRegister_v2` of the process's own memory, portable and
    /// device-mapped (parking's host pages, `tiered/pages.rs`).
    fn host_register(&self, host: usize, bytes: u64) -> CUresult;
    /// `cuMemHostUnregister`.
    fn host_unregister(&self, host: usize) -> CUresult;

    /// `cuFuncGetParamInfo` (CUDA 12.4), else `cuKernelGetParamInfo` for
    /// a handle that is a `CUkernel`: the offset and size of parameter
    /// `index` of the function a launch names.
    fn param_info(&self, func: usize, index: usize) -> Result<(usize, usize), CUresult>;
    /// `cuMemGetAllocationGranularity` (minimum) of pinned memory at `location`.
    fn vmm_granularity(&self, location: CUmemLocation) -> Result<u64, CUresult>;
    /// `cuMemCreate` (the real one) of pinned memory at `location`: the handle.
    fn vmm_create(&self, bytes: u64, location: CUmemLocation) -> Result<u64, CUresult>;
    /// `cuMemRelease` (the real one).
    fn vmm_release(&self, handle: u64) -> CUresult;
    /// `cuMemAddressReserve` of `bytes` anywhere: the address.
    fn vmm_reserve(&self, bytes: u64) -> Result<CUdeviceptr, CUresult>;
    /// `cuMemAddressFree`.
    fn vmm_free_address(&self, ptr: CUdeviceptr, bytes: u64) -> CUresult;
    /// `cuMemMap` (the real one) of all of `handle` at `ptr`, then
    /// `cuMemSetAccess` giving `device` read and write access.
    fn vmm_map(&self, ptr: CUdeviceptr, bytes: u64, handle: u64, device: CUdevice) -> CUresult;
    /// `cuMemUnmap` (the real one).
    fn vmm_unmap(&self, ptr: CUdeviceptr, bytes: u64) -> CUresult;
    /// `cuMemMap` (the real one) as the program asked it, with the
    /// physical allocation behind the program's handle.
    fn vmm_map_as(
        &self,
        ptr: CUdeviceptr,
        bytes: u64,
        offset: u64,
        handle: u64,
        flags: u64,
    ) -> CUresult;
    /// `cuMemSetAccess` (the real one).
    fn vmm_set_access(&self, ptr: CUdeviceptr, bytes: u64, access: &[CUmemAccessDesc]) -> CUresult;
    /// `cuMemExportToShareableHandle` (the real one).
    ///
    /// # Safety
    /// `shareable` as the driver function requires for `kind`.
    unsafe fn vmm_export(
        &self,
        shareable: *mut c_void,
        handle: u64,
        kind: c_int,
        flags: u64,
    ) -> CUresult;
    /// `cuMemGetAllocationPropertiesFromHandle`.
    ///
    /// # Safety
    /// `prop` null or a writable `CUmemAllocationProp`.
    unsafe fn vmm_properties(&self, prop: *mut CUmemAllocationPropFull, handle: u64) -> CUresult;
    /// `cuMemcpyDtoDAsync_v2` (the real one) on `stream`.
    fn copy_dtod(&self, dst: CUdeviceptr, src: CUdeviceptr, bytes: u64, stream: usize) -> CUresult;
    /// `cuFuncGetName` (CUDA 12.3), else `cuKernelGetName` for a `CUkernel`
    /// handle: the function's (mangled) name.
    fn func_name(&self, func: usize) -> Option<String>;
    /// `cuStreamCreate` (the real one: never the shim's hook), in the
    /// current context.
    fn stream_create(&self, flags: c_uint) -> Result<usize, CUresult>;
    /// `cuStreamSynchronize`.
    fn stream_synchronize(&self, stream: usize) -> CUresult;

    /// `cuEventCreate`.
    fn event_create(&self, flags: c_uint) -> Result<usize, CUresult>;
    /// `cuEventRecord[_ptsz]`.
    fn event_record(&self, event: usize, stream: usize, flavour: Flavour) -> CUresult;
    /// `cuEventQuery`.
    fn event_query(&self, event: usize) -> CUresult;
    /// `cuEventSynchronize`.
    fn event_synchronize(&self, event: usize) -> CUresult;
    /// `cuEventDestroy_v2`.
    fn event_destroy(&self, event: usize) -> CUresult;

    /// `cuArrayDestroy` or `cuMipmappedArrayDestroy` (the real ones).
    fn array_destroy(&self, array: usize, mipmapped: bool) -> CUresult;
    /// `cuArrayGetMemoryRequirements` or `cuMipmappedArrayGetMemoryRequirements`: the size.
    fn array_size(&self, array: usize, dev: CUdevice, mipmapped: bool) -> Result<u64, CUresult>;

    /// `cuDeviceGetMemPool`: the device's current pool, which
    /// `cuMemAllocAsync` allocates from.
    fn device_mem_pool(&self, dev: CUdevice) -> Result<usize, CUresult>;
    /// `cuMemPoolGetAttribute` of a `cuuint64_t` attribute.
    fn mem_pool_attribute(&self, pool: usize, attr: c_int) -> Result<u64, CUresult>;
    /// `cuMemPoolTrimTo` (the real one).
    fn mem_pool_trim_to(&self, pool: usize, keep: u64) -> CUresult;
    /// `cuDeviceGetGraphMemAttribute` of a `cuuint64_t` attribute.
    fn graph_mem_attribute(&self, dev: CUdevice, attr: c_int) -> Result<u64, CUresult>;
    /// `cuDeviceGraphMemTrim` (the real one).
    fn graph_mem_trim(&self, dev: CUdevice) -> CUresult;
    /// The bytes of the memory allocation nodes of `graph` and of the
    /// graphs of its child-graph nodes (`cuGraphGetNodes`,
    /// `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`,
    /// `cuGraphChildGraphNodeGetGraph`), each rounded up to `round`; `None`
    /// when the driver will not say.
    fn graph_alloc_bytes(&self, graph: usize, round: u64) -> Option<u64>;
    /// Calls `visit` with the function (or `CUkernel`), parameter array
    /// and `extra` of every kernel node of `graph` and of the graphs of its
    /// child-graph nodes (`cuGraphKernelNodeGetParams_v2`, else v1); the
    /// pointers are the driver's and valid during the call only. False
    /// when the driver would not say (what was visited stands).
    fn graph_kernels(
        &self,
        graph: usize,
        visit: &mut dyn FnMut(usize, *mut *mut c_void, *mut *mut c_void),
    ) -> bool;

    /// `nvmlInit_v2`: true when NVML is there and started (each success
    /// is balanced by [`Driver::nvml_shutdown`]).
    fn nvml_init(&self) -> bool;
    /// `nvmlShutdown`.
    fn nvml_shutdown(&self);
    /// `nvmlDeviceGetCount_v2`: every GPU on the machine (NVML does not
    /// follow `CUDA_VISIBLE_DEVICES`).
    fn nvml_device_count(&self) -> Option<u32>;
    /// `nvmlDeviceGetHandleByIndex_v2`.
    fn nvml_device_by_index(&self, index: u32) -> Option<usize>;
    /// `nvmlDeviceGetName`.
    fn nvml_device_name(&self, device: usize) -> Option<String>;
    /// `nvmlDeviceGetUUID`, as text.
    fn nvml_device_uuid(&self, device: usize) -> Option<String>;
    /// `nvmlDeviceGetIndex`.
    fn nvml_device_index(&self, device: usize) -> Option<u32>;

    /// `nvmlDeviceGetHandleByUUID`.
    fn nvml_device_by_uuid(&self, uuid: &str) -> Option<usize>;
    /// `nvmlDeviceGetComputeRunningProcesses_v3`: fills `out` with (PID,
    /// bytes) of the processes with a context on the device, NVML's PIDs
    /// (the host's, in a container); how many, or `None` when NVML cannot
    /// say or they do not fit.
    fn nvml_processes(&self, device: usize, out: &mut [(u32, u64)]) -> Option<usize>;

    /// Whether the process is in the initial PID namespace, where its PID
    /// is the one NVML lists (in a container it is not).
    fn initial_pid_namespace(&self) -> bool;

    /// Ends the process at once with `status` (`_exit`: see
    /// `accounting.rs` for why a process is stopped rather than left to
    /// run loose, and why no exit handler runs). The fake records it and
    /// returns; the engine then refuses, as it would for any cap it cannot
    /// work out.
    fn exit_process(&self, status: c_int);
}

/// `Some(r)` unless `r` is the driver's out-of-memory answer (which a
/// caller that can make room tries again after).
pub(in crate::engine) fn unless_oom<T>(r: Result<T, CUresult>) -> Option<Result<T, CUresult>> {
    (!matches!(r, Err(crate::ffi::CUDA_ERROR_OUT_OF_MEMORY))).then_some(r)
}
