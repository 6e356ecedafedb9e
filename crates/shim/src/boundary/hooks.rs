//! The hooked driver and NVML functions: the one list. Each entry is the
//! exported name with its C signature, how `cuGetProcAddress` reaches it
//! (base name, `cudaVersion` range, stream flavour), what a panic in the
//! engine answers, its flags (`tiered`: handed out only under tiered
//! spill; `gate`: a hook that passes tiered spill's gate, whose handler is
//! called with the engine, the bracketed arguments and the real call, not
//! the caller's arguments), and the engine handler (with any extra
//! arguments in brackets, which may name the caller's),
//! one line each. `hooks!` (in `macros.rs`) makes the export,
//! the typed real function and the row of [`HOOKS`] from it.
//!
//! To hook another function, add its entry here and write its handler in
//! the engine; see ARCHITECTURE.md for a worked example.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::macros::{c_name, gate_enter, hook_call, hooks, only_flag, park_pass, real_fns};
use super::{allocs, export_table, queries, resolve};
use crate::engine::{Engine, Flavour};
use crate::ffi::*;
use crate::lookup::Lookup;

const OOM: CUresult = CUDA_ERROR_OUT_OF_MEMORY;
const NOT_FOUND: CUresult = CUDA_ERROR_NOT_FOUND;
const LEGACY: Flavour = Flavour::Legacy;
const PTSZ: Flavour = Flavour::PerThread;

hooks! {
    cuda(new, CUDA_ERROR_NOT_FOUND) {
        fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> CUresult, Lookup::cuda("cuGetProcAddress", 11030).until(12000), on panic NOT_FOUND => resolve::get_proc_address[HOOKS];
        fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, symbol_status: *mut c_int) -> CUresult, Lookup::cuda("cuGetProcAddress", 12000), on panic NOT_FOUND => resolve::get_proc_address_v2[HOOKS];
        fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) -> CUresult, Lookup::cuda("cuGetExportTable", 3000), on panic NOT_FOUND, parking => export_table::get_export_table;

        fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult, Lookup::cuda("cuMemAlloc", 3020), on panic OOM => allocs::mem_alloc;
        fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, element_size: c_uint) -> CUresult, Lookup::cuda("cuMemAllocPitch", 3020), on panic OOM => allocs::mem_alloc_pitch;
        fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult, Lookup::cuda("cuMemAllocManaged", 6000), on panic OOM => allocs::mem_alloc_managed;
        fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult, Lookup::cuda("cuMemFree", 3020), on panic NOT_FOUND => Engine::mem_free;
        fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult, Lookup::cuda("cuMemGetInfo", 3020), on panic NOT_FOUND => queries::mem_get_info;
        fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult, Lookup::cuda("cuDeviceTotalMem", 3020), on panic NOT_FOUND => queries::device_total_mem;

        fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult, Lookup::cuda("cuCtxDestroy", 4000), on panic NOT_FOUND => Engine::ctx_destroy;
        fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult, Lookup::cuda("cuDevicePrimaryCtxRelease", 11000), on panic NOT_FOUND => Engine::primary_ctx_teardown;
        fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult, Lookup::cuda("cuDevicePrimaryCtxReset", 11000), on panic NOT_FOUND => Engine::primary_ctx_teardown;
        fn cuIpcGetMemHandle(handle: *mut c_void, dptr: CUdeviceptr) -> CUresult, Lookup::cuda("cuIpcGetMemHandle", 4010), on panic NOT_FOUND => Engine::ipc_get_mem_handle;
        fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamCreate", 2000), on panic NOT_FOUND => Engine::stream_create;
        fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult, Lookup::cuda("cuStreamCreateWithPriority", 5050), on panic NOT_FOUND => Engine::stream_create_with_priority;
        fn cuGreenCtxStreamCreate(stream: *mut CUstream, green: *mut c_void, flags: c_uint, priority: c_int) -> CUresult, Lookup::cuda("cuGreenCtxStreamCreate", 12050), on panic NOT_FOUND => Engine::green_ctx_stream_create;

        fn cuStreamBeginCapture(stream: CUstream) -> CUresult, Lookup::cuda("cuStreamBeginCapture", 10000).until(10010).legacy_stream(), on panic NOT_FOUND => Engine::begin_capture;
        fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult, Lookup::cuda("cuStreamBeginCapture", 10000).until(10010).per_thread_stream(), on panic NOT_FOUND => Engine::begin_capture;
        fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult, Lookup::cuda("cuStreamBeginCapture", 10010).legacy_stream(), on panic NOT_FOUND => Engine::begin_capture_v2;
        fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult, Lookup::cuda("cuStreamBeginCapture", 10010).per_thread_stream(), on panic NOT_FOUND => Engine::begin_capture_v2;
        fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: *mut c_void, deps: *const c_void, dep_data: *const c_void, count: usize, mode: c_int) -> CUresult, Lookup::cuda("cuStreamBeginCaptureToGraph", 12030).legacy_stream(), on panic NOT_FOUND => Engine::begin_capture_to_graph;
        fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: *mut c_void, deps: *const c_void, dep_data: *const c_void, count: usize, mode: c_int) -> CUresult, Lookup::cuda("cuStreamBeginCaptureToGraph", 12030).per_thread_stream(), on panic NOT_FOUND => Engine::begin_capture_to_graph;
        fn cuStreamEndCapture(stream: CUstream, graph: *mut *mut c_void) -> CUresult, Lookup::cuda("cuStreamEndCapture", 10000).legacy_stream(), on panic NOT_FOUND => Engine::end_capture[LEGACY];
        fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut *mut c_void) -> CUresult, Lookup::cuda("cuStreamEndCapture", 10000).per_thread_stream(), on panic NOT_FOUND => Engine::end_capture[PTSZ];

        fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemAllocAsync", 11020).legacy_stream(), on panic OOM => allocs::mem_alloc_async[LEGACY];
        fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemAllocAsync", 11020).per_thread_stream(), on panic OOM => allocs::mem_alloc_async[PTSZ];
        fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: *mut c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemAllocFromPoolAsync", 11020).legacy_stream(), on panic OOM => allocs::mem_alloc_from_pool_async[LEGACY];
        fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: *mut c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemAllocFromPoolAsync", 11020).per_thread_stream(), on panic OOM => allocs::mem_alloc_from_pool_async[PTSZ];
        fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult, Lookup::cuda("cuMemFreeAsync", 11020).legacy_stream(), on panic NOT_FOUND => Engine::mem_free_async[LEGACY];
        fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult, Lookup::cuda("cuMemFreeAsync", 11020).per_thread_stream(), on panic NOT_FOUND => Engine::mem_free_async[PTSZ];
        fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult, Lookup::cuda("cuMemPoolCreate", 11020), on panic NOT_FOUND => allocs::mem_pool_create;
        fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult, Lookup::cuda("cuMemPoolDestroy", 11020), on panic NOT_FOUND => Engine::mem_pool_destroy;
        fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult, Lookup::cuda("cuMemPoolTrimTo", 11020), on panic NOT_FOUND => Engine::mem_pool_trim_to;
        fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult, Lookup::cuda("cuMemPoolSetAttribute", 11020), on panic NOT_FOUND => Engine::mem_pool_set_attribute;
        fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult, Lookup::cuda("cuDeviceGraphMemTrim", 11040), on panic NOT_FOUND => Engine::graph_mem_trim;
        fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) -> CUresult, Lookup::cuda("cuGraphInstantiate", 10000).until(11000), on panic OOM => Engine::graph_instantiate_logged;
        fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) -> CUresult, Lookup::cuda("cuGraphInstantiate", 11000).until(12000), on panic OOM => Engine::graph_instantiate_logged;
        fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult, Lookup::cuda("cuGraphInstantiateWithFlags", 11040).also("cuGraphInstantiate", 12000), on panic OOM => Engine::graph_instantiate_with_flags;
        fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult, Lookup::cuda("cuGraphInstantiateWithParams", 12000).legacy_stream(), on panic OOM => Engine::graph_instantiate_with_params[LEGACY];
        fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult, Lookup::cuda("cuGraphInstantiateWithParams", 12000).per_thread_stream(), on panic OOM => Engine::graph_instantiate_with_params[PTSZ];
        fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult, Lookup::cuda("cuGraphExecDestroy", 10000), on panic NOT_FOUND => Engine::graph_exec_destroy;
        fn cuGraphExecUpdate(exec: CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, result: *mut c_int) -> CUresult, Lookup::cuda("cuGraphExecUpdate", 10020).until(12000), on panic NOT_FOUND, tiered => Engine::graph_exec_update;
        fn cuGraphExecUpdate_v2(exec: CUgraphExec, graph: CUgraph, info: *mut c_void) -> CUresult, Lookup::cuda("cuGraphExecUpdate", 12000), on panic NOT_FOUND, tiered => Engine::graph_exec_update_v2;
        fn cuGraphExecKernelNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) -> CUresult, Lookup::cuda("cuGraphExecKernelNodeSetParams", 10010).until(12000), on panic NOT_FOUND, tiered => Engine::graph_exec_node_set;
        fn cuGraphExecKernelNodeSetParams_v2(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) -> CUresult, Lookup::cuda("cuGraphExecKernelNodeSetParams", 12000), on panic NOT_FOUND, tiered => Engine::graph_exec_node_set;
        fn cuGraphExecNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *mut c_void) -> CUresult, Lookup::cuda("cuGraphExecNodeSetParams", 12020), on panic NOT_FOUND, tiered => Engine::graph_exec_node_set_any;
        fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult, Lookup::cuda("cuGraphLaunch", 10000).legacy_stream(), on panic OOM => Engine::graph_launch[LEGACY];
        fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult, Lookup::cuda("cuGraphLaunch", 10000).per_thread_stream(), on panic OOM => Engine::graph_launch[PTSZ];
        fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult, Lookup::cuda("cuGraphUpload", 11010).legacy_stream(), on panic OOM => Engine::graph_upload[LEGACY];
        fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult, Lookup::cuda("cuGraphUpload", 11010).per_thread_stream(), on panic OOM => Engine::graph_upload[PTSZ];

        // Flagged `tiered`, handed out only under VRAMCAP_SPILL=tiered:
        // launches count uses, and launches, copies and memsets pass a gate
        // that moves close (engine/tiered/).
        fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult, Lookup::cuda("cuLaunchKernel", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::launched[f, params, extra];
        fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult, Lookup::cuda("cuLaunchKernel", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::launched[f, params, extra];
        fn cuLaunchKernelEx(config: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult, Lookup::cuda("cuLaunchKernelEx", 11060).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::launched[f, params, extra];
        fn cuLaunchKernelEx_ptsz(config: *const c_void, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult, Lookup::cuda("cuLaunchKernelEx", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::launched[f, params, extra];
        fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult, Lookup::cuda("cuLaunchCooperativeKernel", 9000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::launched[f, params, std::ptr::null_mut()];
        fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult, Lookup::cuda("cuLaunchCooperativeKernel", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::launched[f, params, std::ptr::null_mut()];
        fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyAsync", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyHtoDAsync", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyHtoDAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyDtoHAsync", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyDtoHAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyDtoDAsync", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyDtoDAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy2DAsync_v2(copy: *const c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy2DAsync", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy2DAsync_v2_ptsz(copy: *const c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy2DAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DAsync_v2(copy: *const c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DAsync", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DAsync_v2_ptsz(copy: *const c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyPeerAsync", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyPeerAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD16Async", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD16Async", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD32Async", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD32Async", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD8Async", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD8Async", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpy", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpy", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult, Lookup::cuda("cuMemcpyHtoD", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult, Lookup::cuda("cuMemcpyHtoD", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpyDtoH", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpyDtoH", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpyDtoD", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpyDtoD", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy2D_v2(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy2D", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy2D_v2_ptds(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy2D", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3D_v2(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy3D", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3D_v2_ptds(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy3D", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) -> CUresult, Lookup::cuda("cuMemcpyPeer", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) -> CUresult, Lookup::cuda("cuMemcpyPeer", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        // The batched and attributed copies: CUDA 12.8's forms take a
        // failure index the 13.0 forms (_v2) dropped.
        fn cuMemcpyBatchAsync(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut c_void, attr_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyBatchAsync", 12080).until(13000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyBatchAsync_ptsz(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut c_void, attr_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyBatchAsync", 12080).until(13000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyBatchAsync_v2(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut c_void, attr_idxs: *mut usize, num_attrs: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyBatchAsync", 13000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyBatchAsync_v2_ptsz(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut c_void, attr_idxs: *mut usize, num_attrs: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyBatchAsync", 13000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DBatchAsync(num_ops: usize, ops: *mut c_void, fail_idx: *mut usize, flags: u64, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DBatchAsync", 12080).until(13000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DBatchAsync_ptsz(num_ops: usize, ops: *mut c_void, fail_idx: *mut usize, flags: u64, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DBatchAsync", 12080).until(13000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DBatchAsync_v2(num_ops: usize, ops: *mut c_void, flags: u64, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DBatchAsync", 13000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DBatchAsync_v2_ptsz(num_ops: usize, ops: *mut c_void, flags: u64, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DBatchAsync", 13000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyWithAttributesAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, attr: *mut c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyWithAttributesAsync", 13000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyWithAttributesAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, attr: *mut c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpyWithAttributesAsync", 13000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DWithAttributesAsync(op: *mut c_void, flags: u64, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DWithAttributesAsync", 13000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DWithAttributesAsync_ptsz(op: *mut c_void, flags: u64, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DWithAttributesAsync", 13000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult, Lookup::cuda("cuMemsetD8", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, n: usize) -> CUresult, Lookup::cuda("cuMemsetD8", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) -> CUresult, Lookup::cuda("cuMemsetD16", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, n: usize) -> CUresult, Lookup::cuda("cuMemsetD16", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) -> CUresult, Lookup::cuda("cuMemsetD32", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: c_uint, n: usize) -> CUresult, Lookup::cuda("cuMemsetD32", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;

        fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) -> CUresult, Lookup::cuda("cuMemsetD2D8", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) -> CUresult, Lookup::cuda("cuMemsetD2D8", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize) -> CUresult, Lookup::cuda("cuMemsetD2D16", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize) -> CUresult, Lookup::cuda("cuMemsetD2D16", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) -> CUresult, Lookup::cuda("cuMemsetD2D32", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) -> CUresult, Lookup::cuda("cuMemsetD2D32", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD2D8Async", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD2D8Async", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD2D16Async", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD2D16Async", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD2D32Async", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream) -> CUresult, Lookup::cuda("cuMemsetD2D32Async", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy2DUnaligned_v2(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy2DUnaligned", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy2DUnaligned_v2_ptds(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy2DUnaligned", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DPeer(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy3DPeer", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DPeer_ptds(copy: *const c_void) -> CUresult, Lookup::cuda("cuMemcpy3DPeer", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DPeerAsync(copy: *const c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DPeerAsync", 4000).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpy3DPeerAsync_ptsz(copy: *const c_void, stream: CUstream) -> CUresult, Lookup::cuda("cuMemcpy3DPeerAsync", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyAtoD_v2(dst: CUdeviceptr, src: *mut c_void, src_offset: usize, n: usize) -> CUresult, Lookup::cuda("cuMemcpyAtoD", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, src: *mut c_void, src_offset: usize, n: usize) -> CUresult, Lookup::cuda("cuMemcpyAtoD", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoA_v2(dst: *mut c_void, dst_offset: usize, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpyDtoA", 3020).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuMemcpyDtoA_v2_ptds(dst: *mut c_void, dst_offset: usize, src: CUdeviceptr, n: usize) -> CUresult, Lookup::cuda("cuMemcpyDtoA", 7000).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        // The launches of parameters set with cuParamSet*: no heat (their
        // parameters are not at hand), only the gate.
        fn cuLaunch(f: CUfunction) -> CUresult, Lookup::cuda("cuLaunch", 2000), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int) -> CUresult, Lookup::cuda("cuLaunchGrid", 2000), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuLaunchGridAsync(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> CUresult, Lookup::cuda("cuLaunchGridAsync", 2000), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWriteValue32_v2(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWriteValue32", 11070).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWriteValue32_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWriteValue32", 11070).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWriteValue64_v2(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWriteValue64", 11070).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWriteValue64_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWriteValue64", 11070).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWaitValue32_v2(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWaitValue32", 11070).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWaitValue32_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWaitValue32", 11070).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWaitValue64_v2(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWaitValue64", 11070).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamWaitValue64_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamWaitValue64", 11070).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamBatchMemOp_v2(stream: CUstream, count: c_uint, params: *mut c_void, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamBatchMemOp", 11070).legacy_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        fn cuStreamBatchMemOp_v2_ptsz(stream: CUstream, count: c_uint, params: *mut c_void, flags: c_uint) -> CUresult, Lookup::cuda("cuStreamBatchMemOp", 11070).per_thread_stream(), on panic NOT_FOUND, tiered, gate => Engine::pass_gate;
        // Queries and synchronisations of work submitted before a park,
        // which the park waited for: answered without resuming a parked
        // process (issue 43; `process/gate.rs`, `enter_known`).
        fn cuStreamQuery(stream: CUstream) -> CUresult, Lookup::cuda("cuStreamQuery", 2000).legacy_stream(), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuStreamQuery_ptsz(stream: CUstream) -> CUresult, Lookup::cuda("cuStreamQuery", 7000).per_thread_stream(), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuStreamSynchronize(stream: CUstream) -> CUresult, Lookup::cuda("cuStreamSynchronize", 2000).legacy_stream(), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult, Lookup::cuda("cuStreamSynchronize", 7000).per_thread_stream(), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuEventQuery(event: CUevent) -> CUresult, Lookup::cuda("cuEventQuery", 2000), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuEventSynchronize(event: CUevent) -> CUresult, Lookup::cuda("cuEventSynchronize", 2000), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuCtxSynchronize() -> CUresult, Lookup::cuda("cuCtxSynchronize", 2000), on panic NOT_FOUND, known => Engine::known_while_parked;
        fn cuModuleUnload(module: *mut c_void) -> CUresult, Lookup::cuda("cuModuleUnload", 2000), on panic NOT_FOUND, tiered => Engine::code_unloaded;
        fn cuLibraryUnload(library: *mut c_void) -> CUresult, Lookup::cuda("cuLibraryUnload", 12000), on panic NOT_FOUND, tiered => Engine::code_unloaded;

        fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult, Lookup::cuda("cuMemCreate", 10020), on panic OOM => Engine::mem_create;
        fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult, Lookup::cuda("cuMemRelease", 10020), on panic NOT_FOUND => Engine::mem_release;
        fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult, Lookup::cuda("cuMemRetainAllocationHandle", 11000), on panic NOT_FOUND => Engine::mem_retain_allocation_handle;
        fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: c_int) -> CUresult, Lookup::cuda("cuMemImportFromShareableHandle", 10020), on panic NOT_FOUND => Engine::mem_import_from_shareable_handle;
        fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64) -> CUresult, Lookup::cuda("cuMemExportToShareableHandle", 10020), on panic NOT_FOUND => Engine::mem_export_to_shareable_handle;
        fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult, Lookup::cuda("cuMemMap", 10020), on panic NOT_FOUND => Engine::mem_map;
        fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult, Lookup::cuda("cuMemUnmap", 10020), on panic NOT_FOUND => Engine::mem_unmap;
        fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult, Lookup::cuda("cuMemSetAccess", 10020), on panic NOT_FOUND, blocks => Engine::mem_set_access;
        fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationPropFull, handle: CUmemGenericAllocationHandle) -> CUresult, Lookup::cuda("cuMemGetAllocationPropertiesFromHandle", 10020), on panic NOT_FOUND, blocks => Engine::mem_get_allocation_properties_from_handle;
        fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult, Lookup::cuda("cuCtxEnablePeerAccess", 4000), on panic NOT_FOUND, blocks => Engine::ctx_enable_peer_access;
        fn cuMemGetHandleForAddressRange(handle: *mut c_void, dptr: CUdeviceptr, size: usize, kind: c_int, flags: u64) -> CUresult, Lookup::cuda("cuMemGetHandleForAddressRange", 11070), on panic NOT_FOUND, blocks => Engine::mem_get_handle_for_address_range;
        // What the driver answers from an address's mapping, which a block
        // has none of while a park or a tiered round has it unmapped (its
        // address stays reserved). Measured on r580
        // (scripts/gpu/research/unmapped_query.cu): the pointer query and
        // cuMemGetAccess answer 1, cuMemGetAddressRange 500, a memset or
        // copy node naming it 1, and cuPointerGetAttributes 0 with device
        // -2, not mapped. Exported so that a program linked with
        // -lcuda passes parking's gate too (a parked process resumes
        // first), and tiered spill's.
        fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult, Lookup::cuda("cuPointerGetAttribute", 4000), on panic NOT_FOUND, blocks, gate => Engine::pass_gate;
        fn cuPointerGetAttributes(count: c_uint, attributes: *mut c_int, data: *mut *mut c_void, ptr: CUdeviceptr) -> CUresult, Lookup::cuda("cuPointerGetAttributes", 7000), on panic NOT_FOUND, blocks, gate => Engine::pass_gate;
        fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) -> CUresult, Lookup::cuda("cuMemGetAddressRange", 3020), on panic NOT_FOUND, blocks, gate => Engine::pass_gate;
        fn cuMemGetAccess(flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr) -> CUresult, Lookup::cuda("cuMemGetAccess", 10020), on panic NOT_FOUND, blocks, gate => Engine::pass_gate;
        fn cuGraphAddMemsetNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const c_void, ctx: CUcontext) -> CUresult, Lookup::cuda("cuGraphAddMemsetNode", 10000), on panic NOT_FOUND, blocks, gate => Engine::pass_gate;
        fn cuGraphAddMemcpyNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, count: usize, params: *const c_void, ctx: CUcontext) -> CUresult, Lookup::cuda("cuGraphAddMemcpyNode", 10000), on panic NOT_FOUND, blocks, gate => Engine::pass_gate;

        fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult, Lookup::cuda("cuArrayCreate", 3020), on panic OOM => allocs::array_create;
        fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult, Lookup::cuda("cuArray3DCreate", 3020), on panic OOM => allocs::array_3d_create;
        fn cuMipmappedArrayCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CUresult, Lookup::cuda("cuMipmappedArrayCreate", 5000), on panic OOM => allocs::mipmapped_array_create;
        fn cuArrayDestroy(array: CUarray) -> CUresult, Lookup::cuda("cuArrayDestroy", 2000), on panic NOT_FOUND => Engine::array_destroy;
        fn cuMipmappedArrayDestroy(array: CUarray) -> CUresult, Lookup::cuda("cuMipmappedArrayDestroy", 5000), on panic NOT_FOUND => Engine::array_destroy;
    }

    nvml(nvml, NVML_ERROR_FUNCTION_NOT_FOUND) {
        fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t, Lookup::NVML, on panic NVML_ERROR_NOT_FOUND => queries::nvml_memory_info;
        fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t, Lookup::NVML, on panic NVML_ERROR_NOT_FOUND => queries::nvml_memory_info_v2;
    }
}

/// The other library functions the engine calls (through `RealDriver`).
pub mod calls {
    use super::*;

    real_fns! { new, CUDA_ERROR_NOT_FOUND;
        fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
        fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
        fn cuCtxSynchronize() -> CUresult;
        fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult;
        fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
        fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult;
        fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult;
        fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult;
        fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
        fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
        fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult;
        fn cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut c_int) -> CUresult;
        fn cuStreamGetDevice(stream: CUstream, dev: *mut CUdevice) -> CUresult;
        fn cuStreamGetDevice_ptsz(stream: CUstream, dev: *mut CUdevice) -> CUresult;
        fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
        fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void) -> CUresult;
        fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) -> CUresult;
        fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult;
        fn cuGraphNodeGetType(node: CUgraphNode, kind: *mut c_int) -> CUresult;
        fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
        fn cuGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: *mut CUgraph) -> CUresult;
        fn cuGraphKernelNodeGetParams(node: CUgraphNode, params: *mut CUDA_KERNEL_NODE_PARAMS) -> CUresult;
        fn cuGraphKernelNodeGetParams_v2(node: CUgraphNode, params: *mut CUDA_KERNEL_NODE_PARAMS) -> CUresult;
        fn cuMemHostAlloc(host: *mut *mut c_void, bytes: usize, flags: c_uint) -> CUresult;
        fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, host: *mut c_void, flags: c_uint) -> CUresult;
        fn cuMemFreeHost(host: *mut c_void) -> CUresult;
        fn cuMemHostRegister_v2(host: *mut c_void, bytes: usize, flags: c_uint) -> CUresult;
        fn cuMemHostUnregister(host: *mut c_void) -> CUresult;
        fn cuFuncGetParamInfo(func: CUfunction, index: usize, offset: *mut usize, size: *mut usize) -> CUresult;
        fn cuFuncGetName(name: *mut *const c_char, func: CUfunction) -> CUresult;
        fn cuKernelGetName(name: *mut *const c_char, kernel: CUfunction) -> CUresult;
        fn cuKernelGetParamInfo(kernel: CUfunction, index: usize, offset: *mut usize, size: *mut usize) -> CUresult;
        fn cuStreamSynchronize(stream: CUstream) -> CUresult;
        fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationPropFull, option: c_int) -> CUresult;
        fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) -> CUresult;
        fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
        fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
        fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
        fn cuEventRecord_ptsz(event: CUevent, stream: CUstream) -> CUresult;
        fn cuEventQuery(event: CUevent) -> CUresult;
        fn cuEventSynchronize(event: CUevent) -> CUresult;
        fn cuEventDestroy_v2(event: CUevent) -> CUresult;
        fn cuArrayGetMemoryRequirements(req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUarray, dev: CUdevice) -> CUresult;
        fn cuMipmappedArrayGetMemoryRequirements(req: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS, array: CUarray, dev: CUdevice) -> CUresult;
        fn cuCheckpointProcessLock(pid: c_int, args: *mut c_void) -> CUresult;
        fn cuCheckpointProcessCheckpoint(pid: c_int, args: *mut c_void) -> CUresult;
        fn cuCheckpointProcessRestore(pid: c_int, args: *mut c_void) -> CUresult;
        fn cuCheckpointProcessUnlock(pid: c_int, args: *mut c_void) -> CUresult;
    }

    real_fns! { nvml, NVML_ERROR_FUNCTION_NOT_FOUND;
        fn nvmlInit_v2() -> nvmlReturn_t;
        fn nvmlShutdown() -> nvmlReturn_t;
        fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t;
        fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t;
        fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t;
        fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t;
        fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t;
        fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t;
        fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::process::Command;

    use crate::boundary::entry::Only;

    /// The built library exports exactly the hooks of this list, `dlsym`
    /// and the program's C ABI (`abi.rs`): nothing else can be interposed
    /// by accident, and no hook is missing from the exports.
    #[test]
    fn exported_symbols_are_exactly_the_hooks() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .current_dir(&root)
            .args(["build", "--quiet", "-p", "vramcap-shim"])
            .status()
            .expect("cargo runs");
        assert!(built.success(), "building the shim failed");
        let lib = target.join("debug/libvramcap.so");
        let out = Command::new("nm")
            .args(["-D", "--defined-only", "--format=just-symbols"])
            .arg(&lib)
            .output()
            .expect("nm (binutils) is needed");
        assert!(out.status.success(), "nm {lib:?} failed");
        let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        got.sort();
        let mut want: Vec<String> = super::HOOKS
            .iter()
            .map(|h| h.name.to_string_lossy().into_owned())
            .chain(["dlsym", "dlopen", "dlmopen"].map(String::from))
            .chain(super::super::abi::NAMES.iter().map(|n| n.to_string()))
            .collect();
        want.sort();
        assert_eq!(got, want);
    }

    /// The `tiered` flag marks what only tiered spill needs: every launch,
    /// copy, memset and stream memory operation (they pass its gate), and
    /// nothing of the allocation, free and query families, which every
    /// mode counts through.
    #[test]
    fn tiered_only_marks_the_gated_families_and_nothing_counted() {
        let gated = [
            &b"cuLaunch"[..],
            b"cuMemcpy",
            b"cuMemset",
            b"cuStreamWriteValue",
            b"cuStreamWaitValue",
            b"cuStreamBatchMemOp",
        ];
        let counted = [
            &b"cuMemAlloc"[..],
            b"cuMemFree",
            b"cuMemGetInfo",
            b"cuDeviceTotalMem",
            b"cuMemCreate",
            b"cuMemRelease",
            b"cuMemMap",
            b"cuArray",
            b"nvml",
            b"cuGetProcAddress",
        ];
        let mut tiered = 0;
        for h in super::HOOKS {
            let n = h.name.to_bytes();
            if gated.iter().any(|p| n.starts_with(p)) {
                assert_eq!(
                    h.only,
                    Only::Tiered,
                    "{:?} passes the gate: tiered-only",
                    h.name
                );
            }
            if counted.iter().any(|p| n.starts_with(p)) {
                assert_eq!(
                    h.only,
                    Only::Always,
                    "{:?} is counted in every mode",
                    h.name
                );
            }
            tiered += usize::from(h.only == Only::Tiered);
        }
        assert_eq!(
            tiered, 100,
            "the tiered-only entries at 913fdaf's prefix list, less the three VMM queries now `blocks`"
        );
    }

    /// The `blocks` flag marks exactly the VMM queries that name the
    /// engine's own handles or need its grants, the peer access the
    /// blocks must be granted to, and the calls the driver answers from an
    /// address's mapping, which a moved block lacks: handed out wherever
    /// the engine makes blocks (under parking's moves too, not only tiered
    /// spill: the H200's JAX process parked with nothing moved).
    #[test]
    fn blocks_only_marks_what_the_engine_s_blocks_change() {
        let mut blocks: Vec<&[u8]> = super::HOOKS
            .iter()
            .filter(|h| h.only == Only::Blocks)
            .map(|h| h.name.to_bytes())
            .collect();
        blocks.sort();
        assert_eq!(
            blocks,
            [
                &b"cuCtxEnablePeerAccess"[..],
                b"cuGraphAddMemcpyNode",
                b"cuGraphAddMemsetNode",
                b"cuMemGetAccess",
                b"cuMemGetAddressRange_v2",
                b"cuMemGetAllocationPropertiesFromHandle",
                b"cuMemGetHandleForAddressRange",
                b"cuMemSetAccess",
                b"cuPointerGetAttribute",
                b"cuPointerGetAttributes"
            ]
        );
    }

    /// Each name is hooked once, and every CUDA entry can be reached by
    /// `cuGetProcAddress` (NVML's by `dlsym` only).
    #[test]
    fn one_row_per_variant() {
        let mut names: Vec<_> = super::HOOKS.iter().map(|h| h.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), super::HOOKS.len());
        for h in super::HOOKS {
            let nvml = h.name.to_bytes().starts_with(b"nvml");
            assert_eq!(h.lookup.base.is_empty(), nvml, "{:?}", h.name);
            assert_eq!(h.real.name, h.name);
        }
    }
}
