//! The other ways device memory is allocated: stream-ordered allocation and
//! memory pools, virtual memory management (`cuMemCreate`) and arrays.
//!
//! Choices, each keeping the cap exact for what the program holds:
//! - Stream-ordered: each allocation is counted when it is made, on its
//!   stream's device, and given back when its free is *issued*
//!   (`cuMemFreeAsync`), not when the stream reaches it; a pool may keep
//!   freed memory reserved above what is live (its release threshold), which
//!   the cap does not count. Allocations made while their stream is being
//!   captured are graph memory nodes: the driver allocates them when the
//!   graph runs, outside any call the shim sees, so they are not counted.
//!   A free of a pointer the shim does not know (another pool's, or a
//!   captured one) goes to the driver unchanged.
//! - VMM: `cuMemCreate` counts `size` against the device in its location
//!   properties; host and host-NUMA locations count against nothing. The
//!   count lives with the handle, which may be retained or imported again in
//!   this process (each adds a reference); the bytes go back when the last
//!   reference is released. Handles imported from other processes are their
//!   memory, not counted. Each mapping (`cuMemMap`) holds a reference too,
//!   until `cuMemUnmap`: the driver frees the memory only when it is both
//!   released and unmapped. Address reservations are passed through.
//! - Arrays: reserved from the descriptor, then settled to the size the
//!   driver reports (`cuArrayGetMemoryRequirements`).

#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use vramcap_core::page::DeviceSlot;

use crate::alloc::{Request, call_with_retry, capped_alloc, current, reserve, settle};
use crate::cache::CAPTURES;
use crate::cuda::*;
use crate::hooks::{REAL, boundary, disabled};
use crate::log::log_at;
use crate::real::call_real;
use crate::state::release_on;
use crate::state::{ARRAYS, EXPORTS, Kind, MAPS, Object, VMM, slot, table};

// ---------------------------------------------------------------- stream-ordered

/// The (context, device) a stream's allocations come from; `None` when the
/// stream is being captured (the call then goes to the driver uncounted) or
/// there is no current context.
fn stream_target(stream: *mut c_void, per_thread: bool) -> Option<(usize, CUdevice)> {
    let (ctx, cur_dev) = current()?;
    if CAPTURES.load(Ordering::SeqCst) > 0 {
        let mut status: c_int = 0;
        let rc = if per_thread {
            call_real!(
                REAL.cuStreamIsCapturing_ptsz,
                fn(*mut c_void, *mut c_int) -> CUresult,
                stream,
                &mut status
            )
        } else {
            call_real!(
                REAL.cuStreamIsCapturing,
                fn(*mut c_void, *mut c_int) -> CUresult,
                stream,
                &mut status
            )
        };
        if rc == CUDA_SUCCESS && status != 0 {
            return None;
        }
    }
    let mut dev: CUdevice = cur_dev;
    let rc = if per_thread {
        call_real!(
            REAL.cuStreamGetDevice_ptsz,
            fn(*mut c_void, *mut CUdevice) -> CUresult,
            stream,
            &mut dev
        )
    } else {
        call_real!(
            REAL.cuStreamGetDevice,
            fn(*mut c_void, *mut CUdevice) -> CUresult,
            stream,
            &mut dev
        )
    };
    Some((ctx, if rc == CUDA_SUCCESS { dev } else { cur_dev }))
}

fn alloc_async(
    what: &'static str,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: *mut c_void,
    per_thread: bool,
    real: impl FnMut() -> CUresult,
) -> CUresult {
    let target = if disabled() {
        None
    } else {
        stream_target(stream, per_thread)
    };
    capped_alloc(
        what,
        dptr,
        size as u64,
        Request::Async,
        target,
        real,
        || size as u64,
    )
}

macro_rules! alloc_async_hook {
    ($name:ident, $per_thread:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            size: usize,
            stream: *mut c_void,
        ) -> CUresult {
            boundary(stringify!($name), CUDA_ERROR_OUT_OF_MEMORY, || {
                alloc_async(stringify!($name), dptr, size, stream, $per_thread, || {
                    call_real!(
                        REAL.$name,
                        fn(*mut CUdeviceptr, usize, *mut c_void) -> CUresult,
                        dptr,
                        size,
                        stream
                    )
                })
            })
        }
    };
}

alloc_async_hook!(cuMemAllocAsync, false);
alloc_async_hook!(cuMemAllocAsync_ptsz, true);

macro_rules! alloc_pool_hook {
    ($name:ident, $per_thread:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            size: usize,
            pool: *mut c_void,
            stream: *mut c_void,
        ) -> CUresult {
            boundary(stringify!($name), CUDA_ERROR_OUT_OF_MEMORY, || {
                alloc_async(stringify!($name), dptr, size, stream, $per_thread, || {
                    call_real!(
                        REAL.$name,
                        fn(*mut CUdeviceptr, usize, *mut c_void, *mut c_void) -> CUresult,
                        dptr,
                        size,
                        pool,
                        stream
                    )
                })
            })
        }
    };
}

alloc_pool_hook!(cuMemAllocFromPoolAsync, false);
alloc_pool_hook!(cuMemAllocFromPoolAsync_ptsz, true);

fn free_async(
    dptr: CUdeviceptr,
    stream: *mut c_void,
    per_thread: bool,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    if dptr == 0 || disabled() {
        return real();
    }
    let Some((_, r)) = table().remove(&dptr) else {
        return real();
    };
    if matches!(r.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
        // The driver refuses stream-ordered frees of such memory: free it
        // for real once the stream gets there.
        let rc = crate::spill::free_when_reached(dptr, r, stream, per_thread);
        if rc != CUDA_SUCCESS {
            table().insert(dptr, r);
        }
        return rc;
    }
    let rc = real();
    if rc == CUDA_SUCCESS {
        if let Some(s) = slot(CUdevice::from(r.device)) {
            DeviceSlot::add(&s.frees, 1);
            release_on(s, CUdevice::from(r.device), r.bytes);
        }
    } else {
        table().insert(dptr, r);
    }
    rc
}

macro_rules! free_async_hook {
    ($name:ident, $per_thread:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: CUdeviceptr, stream: *mut c_void) -> CUresult {
            boundary(stringify!($name), CUDA_ERROR_NOT_FOUND, || {
                free_async(dptr, stream, $per_thread, || {
                    call_real!(
                        REAL.$name,
                        fn(CUdeviceptr, *mut c_void) -> CUresult,
                        dptr,
                        stream
                    )
                })
            })
        }
    };
}

free_async_hook!(cuMemFreeAsync, false);
free_async_hook!(cuMemFreeAsync_ptsz, true);

// ---------------------------------------------------------------- VMM

/// `CUmemAllocationProp` up to its location (cuda.h 13.0).
#[repr(C)]
struct AllocationProp {
    kind: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
}

const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    let real = || {
        call_real!(
            REAL.cuMemCreate,
            fn(*mut u64, usize, *const c_void, u64) -> CUresult,
            handle,
            size,
            prop,
            flags
        )
    };
    boundary("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, || {
        if disabled() || handle.is_null() || prop.is_null() || size == 0 {
            return real();
        }
        // SAFETY: the caller passes a valid CUmemAllocationProp, which
        // starts with these four ints.
        let p = unsafe { &*prop.cast::<AllocationProp>() };
        if p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            return real(); // host memory: not the device cap's business
        }
        let device = p.location_id;
        let (slot, _) = match reserve("cuMemCreate", device, size as u64) {
            Ok(x) => x,
            Err(rc) => return rc,
        };
        let rc = call_with_retry(device, real);
        if rc != CUDA_SUCCESS {
            release_on(slot, device, size as u64);
            return rc;
        }
        DeviceSlot::add(&slot.allocs, 1);
        // SAFETY: the driver succeeded and wrote the handle.
        let h = unsafe { *handle };
        VMM.get().insert(
            h,
            Object {
                device: device as u16,
                bytes: size as u64,
                refs: 1,
                alias_of: 0,
            },
        );
        log_at!(
            Debug,
            "cuMemCreate: {size} bytes on device {device}, handle {h:#x}"
        );
        rc
    })
}

/// Another reference to a handle the shim counts (a retain yields the same
/// handle value).
fn add_ref(h: u64) {
    if let Some(mut o) = VMM.get().get_mut(&h) {
        o.refs += 1;
    }
}

/// Drops one reference to the allocation behind `handle`; gives its bytes
/// back with the last one.
fn drop_ref(handle: u64) {
    let vmm = VMM.get();
    let target = match vmm.get(&handle).map(|o| o.alias_of) {
        None => return,
        Some(0) => handle,
        Some(original) => {
            vmm.remove(&handle);
            original
        }
    };
    unref(target);
}

/// One reference less on a counted allocation (by its own handle).
fn unref(target: u64) {
    let gone = VMM.get().remove_if_mut(&target, |_, o| {
        o.refs = o.refs.saturating_sub(1);
        o.refs == 0
    });
    if let Some((_, o)) = gone
        && let Some(s) = slot(CUdevice::from(o.device))
    {
        DeviceSlot::add(&s.frees, 1);
        release_on(s, CUdevice::from(o.device), o.bytes);
    }
}

/// The counted allocation behind a handle (itself, or what it aliases).
fn target_of(handle: u64) -> Option<u64> {
    VMM.get()
        .get(&handle)
        .map(|o| if o.alias_of == 0 { handle } else { o.alias_of })
}

/// A mapping keeps the allocation's memory alive even after its last handle
/// is released (the driver frees it once unmapped too): each mapping holds
/// a reference until `cuMemUnmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    boundary("cuMemMap", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuMemMap,
            fn(CUdeviceptr, usize, usize, u64, u64) -> CUresult,
            ptr,
            size,
            offset,
            handle,
            flags
        );
        if rc == CUDA_SUCCESS
            && !disabled()
            && let Some(target) = target_of(handle)
        {
            add_ref(target);
            MAPS.get().insert(ptr, (target, size as u64));
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    boundary("cuMemUnmap", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuMemUnmap,
            fn(CUdeviceptr, usize) -> CUresult,
            ptr,
            size
        );
        if rc == CUDA_SUCCESS && !disabled() {
            let end = ptr.saturating_add(size as u64);
            let mut gone = Vec::new();
            MAPS.get().retain(|start, (target, _)| {
                let inside = (ptr..end).contains(start);
                if inside {
                    gone.push(*target);
                }
                !inside
            });
            for target in gone {
                unref(target);
            }
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    let real = || call_real!(REAL.cuMemRelease, fn(u64) -> CUresult, handle);
    boundary("cuMemRelease", CUDA_ERROR_NOT_FOUND, || {
        let rc = real();
        if rc == CUDA_SUCCESS && !disabled() {
            drop_ref(handle);
        }
        rc
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    boundary("cuMemRetainAllocationHandle", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuMemRetainAllocationHandle,
            fn(*mut u64, *mut c_void) -> CUresult,
            handle,
            addr
        );
        if rc == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: written by the driver on success.
            add_ref(unsafe { *handle });
        }
        rc
    })
}

const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;

/// Remembers which handle a POSIX descriptor exports, so an import of it in
/// this process is known to be the same allocation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    kind: c_int,
    flags: u64,
) -> CUresult {
    boundary("cuMemExportToShareableHandle", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuMemExportToShareableHandle,
            fn(*mut c_void, u64, c_int, u64) -> CUresult,
            shareable,
            handle,
            kind,
            flags
        );
        if rc == CUDA_SUCCESS
            && kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            && !shareable.is_null()
            && VMM.get().contains_key(&handle)
        {
            // SAFETY: for this handle type the driver wrote an int.
            let fd = unsafe { *shareable.cast::<c_int>() };
            EXPORTS.get().insert(fd as u64, handle);
        }
        rc
    })
}

/// An import of this process's own export refers to an allocation already
/// counted: the new handle becomes another reference to it. Imports of
/// other processes' exports are their memory and are not counted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: c_int,
) -> CUresult {
    boundary(
        "cuMemImportFromShareableHandle",
        CUDA_ERROR_NOT_FOUND,
        || {
            let rc = call_real!(
                REAL.cuMemImportFromShareableHandle,
                fn(*mut u64, *mut c_void, c_int) -> CUresult,
                handle,
                os_handle,
                kind
            );
            if rc != CUDA_SUCCESS || handle.is_null() || disabled() {
                return rc;
            }
            // SAFETY: written by the driver on success.
            let h = unsafe { *handle };
            let vmm = VMM.get();
            if vmm.contains_key(&h) {
                add_ref(h);
            } else if kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                && let Some(original) = EXPORTS.get().get(&(os_handle as usize as u64)).map(|o| *o)
                && let Some(o) = vmm.get(&original).map(|o| *o)
            {
                add_ref(original);
                vmm.insert(
                    h,
                    Object {
                        refs: 0,
                        alias_of: original,
                        ..o
                    },
                );
            }
            rc
        },
    )
}

// ---------------------------------------------------------------- arrays

#[repr(C)]
struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_int,
    channels: c_uint,
}

#[repr(C)]
struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
    flags: c_uint,
}

#[repr(C)]
#[derive(Default)]
struct MemoryRequirements {
    size: usize,
    alignment: usize,
    reserved: [c_uint; 4],
}

/// Bytes per element of a `CUarray_format`; 16 (the widest) for formats
/// not listed, so the estimate stays an upper bound until settled.
fn format_bytes(format: c_int) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

/// An upper-bound estimate: rows padded to 512 bytes.
fn array_estimate(
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    channels: c_uint,
) -> u64 {
    let row = (width as u64)
        .saturating_mul(format_bytes(format))
        .saturating_mul(u64::from(channels.max(1)))
        .checked_next_multiple_of(512)
        .unwrap_or(u64::MAX);
    row.saturating_mul(height.max(1) as u64)
        .saturating_mul(depth.max(1) as u64)
}

/// Shared by the array hooks: reserve `estimate`, create, settle to the
/// driver's reported size, record.
fn capped_array(
    what: &'static str,
    handle: *mut *mut c_void,
    estimate: u64,
    real: impl FnMut() -> CUresult,
    size_of: impl FnOnce(*mut c_void, CUdevice) -> Option<u64>,
) -> CUresult {
    let mut real = real;
    if disabled() || handle.is_null() || estimate == 0 {
        return real();
    }
    let Some((_, device)) = current() else {
        return real();
    };
    let (slot, limit) = match reserve(what, device, estimate) {
        Ok(x) => x,
        Err(rc) => return rc,
    };
    let rc = call_with_retry(device, real);
    if rc != CUDA_SUCCESS {
        release_on(slot, device, estimate);
        return rc;
    }
    // SAFETY: written by the driver on success.
    let h = unsafe { *handle };
    let bytes = size_of(h, device).unwrap_or(estimate);
    if let Err(rc) = settle(what, device, slot, limit, estimate, bytes) {
        destroy_array(what, h);
        return rc;
    }
    DeviceSlot::add(&slot.allocs, 1);
    ARRAYS.get().insert(
        h as u64,
        Object {
            device: device as u16,
            bytes,
            refs: 1,
            alias_of: 0,
        },
    );
    log_at!(Debug, "{what}: {bytes} bytes on device {device}");
    rc
}

fn destroy_array(what: &str, h: *mut c_void) {
    let _ = if what == "cuMipmappedArrayCreate" {
        call_real!(REAL.cuMipmappedArrayDestroy, fn(*mut c_void) -> CUresult, h)
    } else {
        call_real!(REAL.cuArrayDestroy, fn(*mut c_void) -> CUresult, h)
    };
}

/// The size the driver reports for an array (`get` is its memory
/// requirements call for that kind of array).
fn requirements(get: &crate::real::DynFn, h: *mut c_void, device: CUdevice) -> Option<u64> {
    let mut req = MemoryRequirements::default();
    let rc = call_real!(
        get,
        fn(*mut MemoryRequirements, *mut c_void, CUdevice) -> CUresult,
        &mut req,
        h,
        device
    );
    (rc == CUDA_SUCCESS && req.size > 0).then_some(req.size as u64)
}

fn array_size(h: *mut c_void, device: CUdevice) -> Option<u64> {
    requirements(&REAL.cuArrayGetMemoryRequirements, h, device)
}

fn mipmapped_size(h: *mut c_void, device: CUdevice) -> Option<u64> {
    requirements(&REAL.cuMipmappedArrayGetMemoryRequirements, h, device)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: *mut *mut c_void,
    desc: *const c_void,
) -> CUresult {
    let real = || {
        call_real!(
            REAL.cuArrayCreate_v2,
            fn(*mut *mut c_void, *const c_void) -> CUresult,
            handle,
            desc
        )
    };
    boundary("cuArrayCreate_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        if desc.is_null() {
            return real();
        }
        // SAFETY: a valid CUDA_ARRAY_DESCRIPTOR from the caller.
        let d = unsafe { &*desc.cast::<ArrayDescriptor>() };
        let estimate = array_estimate(d.width, d.height, 1, d.format, d.channels);
        capped_array("cuArrayCreate", handle, estimate, real, array_size)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: *mut *mut c_void,
    desc: *const c_void,
) -> CUresult {
    let real = || {
        call_real!(
            REAL.cuArray3DCreate_v2,
            fn(*mut *mut c_void, *const c_void) -> CUresult,
            handle,
            desc
        )
    };
    boundary("cuArray3DCreate_v2", CUDA_ERROR_OUT_OF_MEMORY, || {
        if desc.is_null() {
            return real();
        }
        // SAFETY: a valid CUDA_ARRAY3D_DESCRIPTOR from the caller.
        let d = unsafe { &*desc.cast::<Array3dDescriptor>() };
        let _ = d.flags;
        let estimate = array_estimate(d.width, d.height, d.depth, d.format, d.channels);
        capped_array("cuArray3DCreate", handle, estimate, real, array_size)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: *mut *mut c_void,
    desc: *const c_void,
    levels: c_uint,
) -> CUresult {
    let real = || {
        call_real!(
            REAL.cuMipmappedArrayCreate,
            fn(*mut *mut c_void, *const c_void, c_uint) -> CUresult,
            handle,
            desc,
            levels
        )
    };
    boundary("cuMipmappedArrayCreate", CUDA_ERROR_OUT_OF_MEMORY, || {
        if desc.is_null() {
            return real();
        }
        // SAFETY: a valid CUDA_ARRAY3D_DESCRIPTOR from the caller.
        let d = unsafe { &*desc.cast::<Array3dDescriptor>() };
        // All levels together are less than twice the first one.
        let estimate =
            array_estimate(d.width, d.height, d.depth, d.format, d.channels).saturating_mul(2);
        capped_array(
            "cuMipmappedArrayCreate",
            handle,
            estimate,
            real,
            mipmapped_size,
        )
    })
}

/// Destroys an array through `real`, its record taken out *before* the
/// call: once the driver has destroyed it, another thread may be handed the
/// same handle value and record it anew. Put back if the call fails.
fn destroy_counted(h: *mut c_void, real: impl FnOnce() -> CUresult) -> CUresult {
    if disabled() {
        return real();
    }
    let record = ARRAYS.get().remove(&(h as u64)).map(|(_, o)| o);
    let rc = real();
    match record {
        Some(o) if rc == CUDA_SUCCESS => {
            if let Some(s) = slot(CUdevice::from(o.device)) {
                DeviceSlot::add(&s.frees, 1);
                release_on(s, CUdevice::from(o.device), o.bytes);
            }
        }
        Some(o) => {
            ARRAYS.get().insert(h as u64, o);
        }
        None => {}
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(h: *mut c_void) -> CUresult {
    boundary("cuArrayDestroy", CUDA_ERROR_NOT_FOUND, || {
        destroy_counted(h, || {
            call_real!(REAL.cuArrayDestroy, fn(*mut c_void) -> CUresult, h)
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h: *mut c_void) -> CUresult {
    boundary("cuMipmappedArrayDestroy", CUDA_ERROR_NOT_FOUND, || {
        destroy_counted(h, || {
            call_real!(REAL.cuMipmappedArrayDestroy, fn(*mut c_void) -> CUresult, h)
        })
    })
}
