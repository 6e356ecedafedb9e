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

/// `cuMemAlloc_v2`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc(
    engine: E,
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    if dptr.is_null() {
        return real();
    }
    let none = std::ptr::null_mut();
    // SAFETY: `dptr` is non-null; the driver function's contract.
    unsafe {
        answer(
            engine.mem_alloc(reading(real, dptr, none), bytesize as u64),
            dptr,
            none,
        )
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
    if dptr.is_null() || pitch.is_null() {
        return real();
    }
    let made = engine.mem_alloc_pitch(
        // SAFETY: both are non-null; the driver function's contract.
        unsafe { reading(real, dptr, pitch) },
        width as u64,
        height as u64,
        element_size,
    );
    // SAFETY: as above.
    unsafe { answer(made, dptr, pitch) }
}

/// `cuMemAllocManaged`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_managed(
    engine: E,
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    if dptr.is_null() {
        return real();
    }
    let none = std::ptr::null_mut();
    // SAFETY: `dptr` is non-null; the driver function's contract.
    let made =
        engine.mem_alloc_managed(unsafe { reading(real, dptr, none) }, bytesize as u64, flags);
    // SAFETY: as above.
    unsafe { answer(made, dptr, none) }
}

/// `cuMemAllocAsync[_ptsz]`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_async(
    engine: E,
    flavour: Flavour,
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    if dptr.is_null() {
        return real();
    }
    let none = std::ptr::null_mut();
    // SAFETY: `dptr` is non-null; the driver function's contract.
    let made = engine.mem_alloc_async(flavour, unsafe { reading(real, dptr, none) }, size, stream);
    // SAFETY: as above.
    unsafe { answer(made, dptr, none) }
}

/// `cuMemAllocFromPoolAsync[_ptsz]`.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn mem_alloc_from_pool_async(
    engine: E,
    flavour: Flavour,
    mut real: impl FnMut() -> CUresult,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: CUstream,
) -> CUresult {
    if dptr.is_null() {
        return real();
    }
    let none = std::ptr::null_mut();
    let made = engine.mem_alloc_from_pool_async(
        flavour,
        // SAFETY: `dptr` is non-null; the driver function's contract.
        unsafe { reading(real, dptr, none) },
        size,
        pool,
        stream,
    );
    // SAFETY: as above.
    unsafe { answer(made, dptr, none) }
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
