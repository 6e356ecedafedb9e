//! The allocating handlers at the edge: the caller's out-pointers (the
//! address, a pitched allocation's pitch, an array's or a pool's handle)
//! are read after the real call and written with the engine's answer here,
//! and the caller's descriptors read, so the engine takes and returns Rust
//! values ([`Made`], a handle, a descriptor by reference). A null pointer
//! goes to the driver unchanged, as it always has.

use std::ffi::{c_uint, c_void};

use super::RealDriver;
use crate::engine::{ArrayDesc, Engine, Flavour, Made};
use crate::ffi::*;

type E = &'static Engine<RealDriver>;

/// The real call, answering what the driver wrote through `dptr` (and
/// `pitch`, when there is one) when it succeeded.
///
/// # Safety
/// `dptr` is non-null and writable, as is `pitch` when non-null; `real`
/// writes through them when it succeeds.
unsafe fn reading(
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
) -> impl FnMut() -> Result<Made, CUresult> {
    move || match real() {
        // SAFETY: the driver succeeded, so it wrote through both (the
        // caller's contract).
        CUDA_SUCCESS => Ok(unsafe {
            Made {
                ptr: *dptr,
                pitch: if pitch.is_null() { 0 } else { *pitch as u64 },
            }
        }),
        rc => Err(rc),
    }
}

/// Writes the engine's answer to the caller's pointers.
///
/// # Safety
/// As [`reading`].
unsafe fn answer(
    made: Result<Made, CUresult>,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
) -> CUresult {
    match made {
        Ok(m) => {
            // SAFETY: the caller's contract.
            unsafe {
                *dptr = m.ptr;
                if !pitch.is_null() {
                    *pitch = usize::try_from(m.pitch).unwrap_or(usize::MAX);
                }
            }
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    }
}

/// An allocation answered through `dptr` (and `pitch`, when non-null): a
/// null `dptr` goes to the driver unchanged; otherwise `handler` (the
/// engine's) gets the real call as [`reading`] makes it, and its answer is
/// written back.
///
/// # Safety
/// As [`reading`], where `dptr` is non-null.
unsafe fn allocating(
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    handler: impl FnOnce(&mut dyn FnMut() -> Result<Made, CUresult>) -> Result<Made, CUresult>,
) -> CUresult {
    if dptr.is_null() {
        return real();
    }
    // SAFETY: `dptr` is non-null; the caller's contract.
    let made = handler(&mut unsafe { reading(real, dptr, pitch) });
    // SAFETY: as above.
    unsafe { answer(made, dptr, pitch) }
}

/// `cuMemAlloc_v2`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc(
    engine: E,
    real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    // SAFETY: the driver function's contract.
    unsafe {
        allocating(real, dptr, std::ptr::null_mut(), |r| {
            engine.mem_alloc(r, bytesize as u64)
        })
    }
}

/// `cuMemAllocPitch_v2`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_pitch(
    engine: E,
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    if pitch.is_null() {
        return real();
    }
    // SAFETY: the driver function's contract.
    unsafe {
        allocating(real, dptr, pitch, |r| {
            engine.mem_alloc_pitch(r, width as u64, height as u64, element_size)
        })
    }
}

/// `cuMemAllocManaged`. Its flags go to the real call only: the engine
/// makes no managed memory of its own.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_managed(
    engine: E,
    real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: the driver function's contract.
    unsafe {
        allocating(real, dptr, std::ptr::null_mut(), |r| {
            engine.mem_alloc_managed(r, bytesize as u64)
        })
    }
}

/// `cuMemAllocAsync[_ptsz]`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_async(
    engine: E,
    flavour: Flavour,
    real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the driver function's contract.
    unsafe {
        allocating(real, dptr, std::ptr::null_mut(), |r| {
            engine.mem_alloc_async(flavour, r, size, stream)
        })
    }
}

/// `cuMemAllocFromPoolAsync[_ptsz]`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_from_pool_async(
    engine: E,
    flavour: Flavour,
    real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the driver function's contract.
    unsafe {
        allocating(real, dptr, std::ptr::null_mut(), |r| {
            engine.mem_alloc_from_pool_async(flavour, r, size, pool, stream)
        })
    }
}

/// The real call, answering what the driver wrote through `out` when it
/// succeeded.
///
/// # Safety
/// `out` is non-null and writable; `real` writes through it when it
/// succeeds.
unsafe fn written<T: Copy>(
    mut real: impl FnMut() -> CUresult,
    out: *mut T,
) -> impl FnMut() -> Result<T, CUresult> {
    move || match real() {
        // SAFETY: the driver succeeded, so it wrote through `out` (the
        // caller's contract).
        CUDA_SUCCESS => Ok(unsafe { *out }),
        rc => Err(rc),
    }
}

/// The handlers of calls that make one handle through an out-pointer from
/// a descriptor: a null pointer goes to the driver unchanged; otherwise the
/// engine's handler gets the descriptor (wrapped, when a wrapper is named)
/// and a real call that answers the handle.
macro_rules! makers {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($out:ident: *mut $t:ty, $input:ident: *const $i:ty $(, $extra:ident: $et:ty)*)
            => $handler:ident($($wrap:path)?);
    )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The driver function's contract.
        pub unsafe fn $name(
            engine: E,
            mut real: impl FnMut() -> CUresult,
            $out: *mut $t,
            $input: *const $i,
            $($extra: $et,)*
        ) -> CUresult {
            if $out.is_null() || $input.is_null() {
                return real();
            }
            // SAFETY: both are non-null; the driver function's contract.
            unsafe { engine.$handler(written(real, $out), $($wrap)?(&*$input)) }
        }
    )*};
}

makers! {
    /// `cuArrayCreate_v2`.
    fn array_create(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR)
        => array_create(ArrayDesc::Flat);
    /// `cuArray3DCreate_v2`.
    fn array_3d_create(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR)
        => array_create(ArrayDesc::Layered);
    /// `cuMipmappedArrayCreate` (of any number of levels).
    fn mipmapped_array_create(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, _levels: c_uint)
        => array_create(ArrayDesc::Mipmapped);
    /// `cuMemPoolCreate`.
    fn mem_pool_create(pool: *mut CUmemoryPool, props: *const CUmemPoolProps)
        => mem_pool_create();
}
