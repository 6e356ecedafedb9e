//! [`RealDriver`]: the engine's [`Driver`] trait over the real libraries,
//! one method per function, through the typed slots of `hooks.rs`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr;

use super::graph_walk::{graph_bytes, graph_kernels_at, handle};
use super::hooks::calls as c;
use super::hooks::real as h;
use crate::engine::{Driver, Flavour};
use crate::ffi::*;

/// The real CUDA driver and NVML.
pub struct RealDriver;

/// `Ok(value)` when `rc` is success.
fn ok<T>(rc: CUresult, value: T) -> Result<T, CUresult> {
    (rc == CUDA_SUCCESS).then_some(value).ok_or(rc)
}

/// A real stream query that answers through an out-pointer.
type StreamQuery<T> = unsafe fn(CUstream, *mut T) -> CUresult;

/// Asks `query` about `stream`: its answer, or the driver's error.
fn stream_query<T: Default>(stream: usize, query: StreamQuery<T>) -> Result<T, CUresult> {
    let mut v = T::default();
    // SAFETY: see the impl.
    let rc = unsafe { query(handle(stream), &mut v) };
    ok(rc, v)
}

/// The text NVML wrote into `buf`, when it succeeded.
fn nvml_text(rc: nvmlReturn_t, buf: &mut [c_char; 96]) -> Option<String> {
    if rc != NVML_SUCCESS {
        return None;
    }
    buf[95] = 0;
    // SAFETY: a NUL-terminated string inside the buffer (ensured above).
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(text.to_string_lossy().into_owned())
}

/// Whether this process is in the initial PID namespace, where its PID is
/// the one NVML reports (read once; `/proc/self/ns/pid` names the
/// namespace, and the initial one's inode is fixed, `PROC_PID_INIT_INO`).
/// Unreadable counts as not.
pub fn in_initial_pid_namespace() -> bool {
    use std::sync::atomic::AtomicU8;
    static KNOWN: AtomicU8 = AtomicU8::new(0);
    match KNOWN.load(std::sync::atomic::Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let mut buf = [0u8; 64];
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/ns/pid".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let initial = usize::try_from(n).is_ok_and(|n| &buf[..n.min(buf.len())] == b"pid:[4026531836]");
    KNOWN.store(
        if initial { 1 } else { 2 },
        std::sync::atomic::Ordering::Relaxed,
    );
    initial
}

// SAFETY (for every call below): each passes valid out-pointers to locals
// and handles the engine got from the driver; the driver checks the rest.
impl Driver for RealDriver {
    fn ctx_get_current(&self) -> Result<usize, CUresult> {
        let mut ctx: CUcontext = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { c::cuCtxGetCurrent::call(&mut ctx) };
        ok(rc, ctx as usize)
    }

    fn ctx_get_device(&self) -> Result<CUdevice, CUresult> {
        let mut dev: CUdevice = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::cuCtxGetDevice::call(&mut dev) };
        ok(rc, dev)
    }

    fn ctx_get_id(&self, ctx: usize) -> Result<u64, CUresult> {
        let mut id: u64 = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::cuCtxGetId::call(handle(ctx), &mut id) };
        ok(rc, id)
    }

    fn ctx_synchronize(&self) -> CUresult {
        // SAFETY: no arguments.
        unsafe { c::cuCtxSynchronize::call() }
    }

    fn ctx_push_current(&self, ctx: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuCtxPushCurrent_v2::call(handle(ctx)) }
    }

    fn ctx_pop_current(&self) -> CUresult {
        let mut popped: CUcontext = ptr::null_mut();
        // SAFETY: see the impl.
        unsafe { c::cuCtxPopCurrent_v2::call(&mut popped) }
    }

    fn primary_ctx_state(&self, dev: CUdevice) -> Result<(c_uint, bool), CUresult> {
        let (mut flags, mut active): (c_uint, c_int) = (0, 0);
        // SAFETY: see the impl.
        let rc = unsafe { c::cuDevicePrimaryCtxGetState::call(dev, &mut flags, &mut active) };
        ok(rc, (flags, active != 0))
    }

    fn primary_ctx_retain(&self, dev: CUdevice) -> Result<usize, CUresult> {
        let mut ctx: CUcontext = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { c::cuDevicePrimaryCtxRetain::call(&mut ctx, dev) };
        ok(rc, ctx as usize)
    }

    fn primary_ctx_release(&self, dev: CUdevice) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuDevicePrimaryCtxRelease_v2::call(dev) }
    }

    fn device_count(&self) -> Result<c_int, CUresult> {
        let mut n: c_int = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::cuDeviceGetCount::call(&mut n) };
        ok(rc, n)
    }

    fn device_name(&self, dev: CUdevice) -> Result<String, CUresult> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: see the impl; the length is the buffer's.
        let rc = unsafe { c::cuDeviceGetName::call(buf.as_mut_ptr(), 256, dev) };
        // The driver NUL-terminates within the length; make sure anyway.
        buf[255] = 0;
        // SAFETY: a NUL-terminated string inside the buffer (set above).
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
        ok(rc, text.to_string_lossy().into_owned())
    }

    fn device_total_mem(&self, dev: CUdevice) -> Result<u64, CUresult> {
        let mut total: usize = 0;
        // SAFETY: see the impl.
        let rc = unsafe { h::cuDeviceTotalMem_v2::call(&mut total, dev) };
        ok(rc, total as u64)
    }

    fn device_uuid(&self, dev: CUdevice) -> Result<[u8; 16], CUresult> {
        let mut u = CUuuid::default();
        // SAFETY: see the impl.
        let mut rc = unsafe { c::cuDeviceGetUuid_v2::call(&mut u, dev) };
        if rc != CUDA_SUCCESS {
            // SAFETY: see the impl.
            rc = unsafe { c::cuDeviceGetUuid::call(&mut u, dev) };
        }
        ok(rc, u.bytes)
    }

    fn stream_is_capturing(&self, stream: usize, flavour: Flavour) -> Result<c_int, CUresult> {
        stream_query(
            stream,
            match flavour {
                Flavour::Legacy => c::cuStreamIsCapturing::call,
                Flavour::PerThread => c::cuStreamIsCapturing_ptsz::call,
            },
        )
    }

    fn stream_get_device(&self, stream: usize, flavour: Flavour) -> Result<CUdevice, CUresult> {
        stream_query(
            stream,
            match flavour {
                Flavour::Legacy => c::cuStreamGetDevice::call,
                Flavour::PerThread => c::cuStreamGetDevice_ptsz::call,
            },
        )
    }

    fn mem_free(&self, ptr: CUdeviceptr) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuMemFree_v2::call(ptr) }
    }

    fn mem_host_alloc(&self, bytes: usize, flags: c_uint) -> Result<usize, CUresult> {
        let mut host: *mut c_void = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { c::cuMemHostAlloc::call(&mut host, bytes, flags) };
        ok(rc, host as usize)
    }

    fn mem_host_get_device_pointer(&self, host: usize) -> Result<CUdeviceptr, CUresult> {
        let mut d: CUdeviceptr = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::cuMemHostGetDevicePointer_v2::call(&mut d, handle(host), 0) };
        ok(rc, d)
    }

    fn mem_free_host(&self, host: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuMemFreeHost::call(handle(host)) }
    }

    fn host_register(&self, host: usize, bytes: u64) -> CUresult {
        const PORTABLE_DEVICEMAP: c_uint = 0x01 | 0x02;
        // SAFETY: see the impl; the engine's own mapping of `bytes` at `host`.
        unsafe { c::cuMemHostRegister_v2::call(handle(host), bytes as usize, PORTABLE_DEVICEMAP) }
    }

    fn host_unregister(&self, host: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuMemHostUnregister::call(handle(host)) }
    }

    fn event_create(&self, flags: c_uint) -> Result<usize, CUresult> {
        let mut ev: CUevent = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { c::cuEventCreate::call(&mut ev, flags) };
        ok(rc, ev as usize)
    }

    fn event_record(&self, event: usize, stream: usize, flavour: Flavour) -> CUresult {
        // SAFETY: see the impl.
        unsafe {
            match flavour {
                Flavour::Legacy => c::cuEventRecord::call(handle(event), handle(stream)),
                Flavour::PerThread => c::cuEventRecord_ptsz::call(handle(event), handle(stream)),
            }
        }
    }

    fn event_query(&self, event: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuEventQuery::call(handle(event)) }
    }

    fn param_info(&self, func: usize, index: usize) -> Result<(usize, usize), CUresult> {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: see the impl; the driver checks the handle.
        let rc =
            unsafe { c::cuFuncGetParamInfo::call(handle(func), index, &mut offset, &mut size) };
        if rc == CUDA_SUCCESS {
            return Ok((offset, size));
        }
        // SAFETY: as above.
        let rc2 =
            unsafe { c::cuKernelGetParamInfo::call(handle(func), index, &mut offset, &mut size) };
        if rc2 == CUDA_SUCCESS {
            Ok((offset, size))
        } else {
            Err(rc)
        }
    }

    fn vmm_granularity(&self, location: CUmemLocation) -> Result<u64, CUresult> {
        let prop = vmm_prop(location);
        let mut g = 0usize;
        // SAFETY: see the impl; `prop` is a whole CUmemAllocationProp.
        let rc = unsafe { c::cuMemGetAllocationGranularity::call(&mut g, &prop, 0) };
        ok(rc, g as u64)
    }

    fn vmm_create(&self, bytes: u64, location: CUmemLocation) -> Result<u64, CUresult> {
        let prop = vmm_prop(location);
        let mut handle = 0;
        // SAFETY: see the impl; the real function, not the hook: the engine
        // counts what it makes itself.
        let rc = unsafe {
            h::cuMemCreate::call(&mut handle, bytes as usize, ptr::from_ref(&prop).cast(), 0)
        };
        ok(rc, handle)
    }

    fn vmm_release(&self, handle: u64) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuMemRelease::call(handle) }
    }

    fn vmm_reserve(&self, bytes: u64) -> Result<CUdeviceptr, CUresult> {
        let mut p = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::cuMemAddressReserve::call(&mut p, bytes as usize, 0, 0, 0) };
        ok(rc, p)
    }

    fn vmm_free_address(&self, p: CUdeviceptr, bytes: u64) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuMemAddressFree::call(p, bytes as usize) }
    }

    fn vmm_map(&self, p: CUdeviceptr, bytes: u64, handle: u64, device: CUdevice) -> CUresult {
        // SAFETY: see the impl.
        let rc = unsafe { h::cuMemMap::call(p, bytes as usize, 0, handle, 0) };
        if rc != CUDA_SUCCESS {
            return rc;
        }
        let desc = CUmemAccessDesc::read_write(device);
        // SAFETY: see the impl; one descriptor.
        let rc = unsafe { h::cuMemSetAccess::call(p, bytes as usize, &desc, 1) };
        if rc != CUDA_SUCCESS {
            // SAFETY: undoing the map just made.
            let _ = unsafe { h::cuMemUnmap::call(p, bytes as usize) };
        }
        rc
    }

    fn vmm_unmap(&self, p: CUdeviceptr, bytes: u64) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuMemUnmap::call(p, bytes as usize) }
    }

    fn vmm_map_as(
        &self,
        p: CUdeviceptr,
        bytes: u64,
        offset: u64,
        handle: u64,
        flags: u64,
    ) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuMemMap::call(p, bytes as usize, offset as usize, handle, flags) }
    }

    fn vmm_set_access(&self, p: CUdeviceptr, bytes: u64, access: &[CUmemAccessDesc]) -> CUresult {
        // SAFETY: see the impl; the slice is the descriptors and their count.
        unsafe { h::cuMemSetAccess::call(p, bytes as usize, access.as_ptr(), access.len()) }
    }

    unsafe fn vmm_export(
        &self,
        shareable: *mut c_void,
        handle: u64,
        kind: c_int,
        flags: u64,
    ) -> CUresult {
        // SAFETY: the caller's contract.
        unsafe { h::cuMemExportToShareableHandle::call(shareable, handle, kind, flags) }
    }

    unsafe fn vmm_properties(&self, prop: *mut CUmemAllocationPropFull, handle: u64) -> CUresult {
        // SAFETY: the caller's contract.
        unsafe { h::cuMemGetAllocationPropertiesFromHandle::call(prop, handle) }
    }

    fn copy_dtod(&self, dst: CUdeviceptr, src: CUdeviceptr, bytes: u64, stream: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuMemcpyDtoDAsync_v2::call(dst, src, bytes as usize, handle(stream)) }
    }

    fn func_name(&self, func: usize) -> Option<String> {
        let mut name: *const c_char = ptr::null();
        // SAFETY: see the impl; the driver checks the handle.
        let mut rc = unsafe { c::cuFuncGetName::call(&mut name, handle(func)) };
        if rc != CUDA_SUCCESS {
            // SAFETY: as above.
            rc = unsafe { c::cuKernelGetName::call(&mut name, handle(func)) };
        }
        if rc != CUDA_SUCCESS || name.is_null() {
            return None;
        }
        // SAFETY: the driver answers a NUL-terminated name it keeps.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    fn stream_create(&self, flags: c_uint) -> Result<usize, CUresult> {
        let mut st: CUstream = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { h::cuStreamCreate::call(&mut st, flags) };
        ok(rc, st as usize)
    }

    fn stream_synchronize(&self, stream: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuStreamSynchronize::call(handle(stream)) }
    }

    fn event_synchronize(&self, event: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuEventSynchronize::call(handle(event)) }
    }

    fn event_destroy(&self, event: usize) -> CUresult {
        // SAFETY: see the impl.
        unsafe { c::cuEventDestroy_v2::call(handle(event)) }
    }

    fn array_destroy(&self, array: usize, mipmapped: bool) -> CUresult {
        // SAFETY: see the impl.
        unsafe {
            if mipmapped {
                h::cuMipmappedArrayDestroy::call(handle(array))
            } else {
                h::cuArrayDestroy::call(handle(array))
            }
        }
    }

    fn array_size(&self, array: usize, dev: CUdevice, mipmapped: bool) -> Result<u64, CUresult> {
        let mut req = CUDA_ARRAY_MEMORY_REQUIREMENTS::default();
        // SAFETY: see the impl.
        let rc = unsafe {
            if mipmapped {
                c::cuMipmappedArrayGetMemoryRequirements::call(&mut req, handle(array), dev)
            } else {
                c::cuArrayGetMemoryRequirements::call(&mut req, handle(array), dev)
            }
        };
        ok(rc, req.size as u64)
    }

    fn device_mem_pool(&self, dev: CUdevice) -> Result<usize, CUresult> {
        let mut pool: CUmemoryPool = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { c::cuDeviceGetMemPool::call(&mut pool, dev) };
        ok(rc, pool as usize)
    }

    fn mem_pool_attribute(&self, pool: usize, attr: c_int) -> Result<u64, CUresult> {
        let mut value: u64 = 0;
        // SAFETY: see the impl; every attribute asked for is a cuuint64_t.
        let rc =
            unsafe { c::cuMemPoolGetAttribute::call(handle(pool), attr, (&raw mut value).cast()) };
        ok(rc, value)
    }

    fn mem_pool_trim_to(&self, pool: usize, keep: u64) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuMemPoolTrimTo::call(handle(pool), keep as usize) }
    }

    fn graph_mem_attribute(&self, dev: CUdevice, attr: c_int) -> Result<u64, CUresult> {
        let mut value: u64 = 0;
        // SAFETY: see the impl; every attribute asked for is a cuuint64_t.
        let rc =
            unsafe { c::cuDeviceGetGraphMemAttribute::call(dev, attr, (&raw mut value).cast()) };
        ok(rc, value)
    }

    fn graph_mem_trim(&self, dev: CUdevice) -> CUresult {
        // SAFETY: see the impl.
        unsafe { h::cuDeviceGraphMemTrim::call(dev) }
    }

    fn graph_alloc_bytes(&self, graph: usize, round: u64) -> Option<u64> {
        graph_bytes(graph, round, 0)
    }

    fn graph_kernels(
        &self,
        graph: usize,
        visit: &mut dyn FnMut(usize, *mut *mut c_void, *mut *mut c_void),
    ) -> bool {
        graph_kernels_at(graph, 0, visit)
    }

    fn nvml_init(&self) -> bool {
        // SAFETY: no arguments.
        unsafe { c::nvmlInit_v2::call() == NVML_SUCCESS }
    }

    fn nvml_shutdown(&self) {
        // SAFETY: no arguments; balances a successful nvmlInit_v2.
        unsafe { c::nvmlShutdown::call() };
    }

    fn nvml_device_count(&self) -> Option<u32> {
        let mut n: c_uint = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::nvmlDeviceGetCount_v2::call(&mut n) };
        (rc == NVML_SUCCESS).then_some(n)
    }

    fn nvml_device_by_index(&self, index: u32) -> Option<usize> {
        let mut device: nvmlDevice_t = ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { c::nvmlDeviceGetHandleByIndex_v2::call(index, &mut device) };
        (rc == NVML_SUCCESS && !device.is_null()).then_some(device as usize)
    }

    fn nvml_device_name(&self, device: usize) -> Option<String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: see the impl; the length is the buffer's.
        let rc = unsafe { c::nvmlDeviceGetName::call(handle(device), buf.as_mut_ptr(), 96) };
        nvml_text(rc, &mut buf)
    }

    fn nvml_device_uuid(&self, device: usize) -> Option<String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: see the impl; the length is the buffer's.
        let rc = unsafe { c::nvmlDeviceGetUUID::call(handle(device), buf.as_mut_ptr(), 96) };
        nvml_text(rc, &mut buf)
    }

    fn nvml_device_index(&self, device: usize) -> Option<u32> {
        let mut index: c_uint = 0;
        // SAFETY: see the impl.
        let rc = unsafe { c::nvmlDeviceGetIndex::call(handle(device), &mut index) };
        (rc == NVML_SUCCESS).then_some(index)
    }

    fn nvml_device_by_uuid(&self, uuid: &str) -> Option<usize> {
        let text = std::ffi::CString::new(uuid).ok()?;
        let mut device: nvmlDevice_t = ptr::null_mut();
        // SAFETY: see the impl; `text` is NUL-terminated.
        let rc = unsafe { c::nvmlDeviceGetHandleByUUID::call(text.as_ptr(), &mut device) };
        (rc == NVML_SUCCESS && !device.is_null()).then_some(device as usize)
    }

    fn nvml_processes(&self, device: usize, out: &mut [(u32, u64)]) -> Option<usize> {
        const MAX: usize = 128;
        let mut infos = [nvmlProcessInfo_t::default(); MAX];
        let mut count = MAX as c_uint;
        // SAFETY: see the impl; `count` is the array's length.
        let rc = unsafe {
            c::nvmlDeviceGetComputeRunningProcesses_v3::call(
                handle(device),
                &mut count,
                infos.as_mut_ptr(),
            )
        };
        let n = count as usize;
        if rc != NVML_SUCCESS || n > MAX || n > out.len() {
            crate::log::log_at!(
                Debug,
                "nvmlDeviceGetComputeRunningProcesses_v3: {rc}, {n} processes"
            );
            return None;
        }
        for (o, i) in out.iter_mut().zip(&infos[..n]) {
            *o = (i.pid, i.used_gpu_memory);
        }
        Some(n)
    }

    fn initial_pid_namespace(&self) -> bool {
        in_initial_pid_namespace()
    }

    fn exit_process(&self, status: c_int) {
        // SAFETY: _exit has no preconditions. No exit handler may run: this
        // is called inside a driver call, on any of the program's threads,
        // and handlers (the CUDA runtime's among them) would call into the
        // driver and the program while its other threads go on.
        unsafe { libc::_exit(status) }
    }
}

/// Pinned memory at `location`, for `cuMemCreate` and its granularity.
fn vmm_prop(location: CUmemLocation) -> CUmemAllocationPropFull {
    CUmemAllocationPropFull {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        handle_types: 0,
        location,
        win32_metadata: ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}
