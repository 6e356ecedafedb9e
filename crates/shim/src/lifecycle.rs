//! Hooks that do not allocate but change what the shim may do with memory:
//! contexts going away (their memory goes with them), stream capture (no
//! synchronising while it runs) and IPC export (such blocks are not cached).

#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::cache::{self, CAPTURES};
use crate::cuda::*;
use crate::hooks::{REAL, boundary, disabled};
use crate::log::log_at;
use crate::real::call_real;
use crate::state::release_on;
use crate::state::{Kind, slot, table};

/// Drops the records of every allocation of a context the driver destroyed
/// and gives their bytes back.
fn forget_ctx(ctx: usize) {
    cache::forget_ctx(ctx);
    let mut gone = Vec::new();
    table().retain(|ptr, r| {
        if r.ctx == ctx {
            gone.push((*ptr, *r));
            false
        } else {
            true
        }
    });
    for (_, r) in &gone {
        if matches!(r.kind, Kind::SpillManaged | Kind::SpillHost(_)) {
            crate::spill::forget(r);
        } else if let Some(s) = slot(CUdevice::from(r.device)) {
            release_on(s, CUdevice::from(r.device), r.bytes);
            s.frees.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !gone.is_empty() {
        log_at!(
            Info,
            "context {ctx:#x} went away holding {} allocations; their bytes are back in the budget",
            gone.len()
        );
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CUresult {
    let real = || call_real!(REAL.cuCtxDestroy_v2, fn(*mut c_void) -> CUresult, ctx);
    boundary("cuCtxDestroy_v2", CUDA_ERROR_NOT_FOUND, || {
        if disabled() || ctx.is_null() {
            return real();
        }
        cache::drain_ctx(ctx as usize);
        let rc = real();
        if rc == CUDA_SUCCESS {
            forget_ctx(ctx as usize);
        }
        rc
    })
}

/// The handle of `dev`'s primary context when it is active.
fn active_primary(dev: CUdevice) -> Option<usize> {
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    let rc = call_real!(
        REAL.cuDevicePrimaryCtxGetState,
        fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult,
        dev,
        &mut flags,
        &mut active
    );
    if rc != CUDA_SUCCESS || active == 0 {
        return None;
    }
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let rc = call_real!(
        REAL.cuDevicePrimaryCtxRetain,
        fn(*mut *mut c_void, CUdevice) -> CUresult,
        &mut ctx,
        dev
    );
    if rc != CUDA_SUCCESS {
        return None;
    }
    let _ = call_real!(
        REAL.cuDevicePrimaryCtxRelease_v2,
        fn(CUdevice) -> CUresult,
        dev
    );
    Some(ctx as usize)
}

fn still_active(dev: CUdevice) -> bool {
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    let rc = call_real!(
        REAL.cuDevicePrimaryCtxGetState,
        fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult,
        dev,
        &mut flags,
        &mut active
    );
    rc != CUDA_SUCCESS || active != 0
}

/// Around a call that may destroy `dev`'s primary context (releasing its
/// last reference, or a reset): cached blocks are freed before (they might
/// be the last use), records dropped after if the context is gone.
fn around_primary_teardown(dev: CUdevice, real: impl FnOnce() -> CUresult) -> CUresult {
    if disabled() {
        return real();
    }
    let primary = active_primary(dev);
    if let Some(ctx) = primary {
        cache::drain_ctx(ctx);
    }
    let rc = real();
    if let (CUDA_SUCCESS, Some(ctx)) = (rc, primary)
        && !still_active(dev)
    {
        forget_ctx(ctx);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    boundary("cuDevicePrimaryCtxRelease_v2", CUDA_ERROR_NOT_FOUND, || {
        around_primary_teardown(dev, || {
            call_real!(
                REAL.cuDevicePrimaryCtxRelease_v2,
                fn(CUdevice) -> CUresult,
                dev
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    boundary("cuDevicePrimaryCtxReset_v2", CUDA_ERROR_NOT_FOUND, || {
        around_primary_teardown(dev, || {
            call_real!(
                REAL.cuDevicePrimaryCtxReset_v2,
                fn(CUdevice) -> CUresult,
                dev
            )
        })
    })
}

/// A block exported for IPC may be open in another process: it is never
/// cached, so its address is never handed out again while it lives there.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, dptr: CUdeviceptr) -> CUresult {
    boundary("cuIpcGetMemHandle", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuIpcGetMemHandle,
            fn(*mut c_void, CUdeviceptr) -> CUresult,
            handle,
            dptr
        );
        if rc == CUDA_SUCCESS
            && let Some(mut r) = table().get_mut(&dptr)
        {
            r.exported = true;
        }
        rc
    })
}

fn began(rc: CUresult) -> CUresult {
    if rc == CUDA_SUCCESS {
        CAPTURES.fetch_add(1, Ordering::SeqCst);
    }
    rc
}

/// After an end-of-capture call: the capture is over when the stream says it
/// is no longer capturing (whatever the call returned); if the stream cannot
/// be asked, when the call succeeded or reported an invalidated capture.
fn ended(rc: CUresult, stream: *mut c_void, per_thread: bool) -> CUresult {
    let mut status: c_int = 0;
    let q = if per_thread {
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
    let over = if q == CUDA_SUCCESS {
        status == 0
    } else {
        rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    };
    if over {
        let _ = CAPTURES.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n > 0).then(|| n - 1)
        });
    }
    rc
}

macro_rules! begin_capture_hook {
    ($name:ident, ($($arg:ident: $ty:ty),*)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            boundary(stringify!($name), CUDA_ERROR_NOT_FOUND, || {
                began(call_real!(REAL.$name, fn($($ty),*) -> CUresult, $($arg),*))
            })
        }
    };
}

begin_capture_hook!(cuStreamBeginCapture, (stream: *mut c_void));
begin_capture_hook!(cuStreamBeginCapture_ptsz, (stream: *mut c_void));
begin_capture_hook!(cuStreamBeginCapture_v2, (stream: *mut c_void, mode: c_int));
begin_capture_hook!(cuStreamBeginCapture_v2_ptsz, (stream: *mut c_void, mode: c_int));
begin_capture_hook!(cuStreamBeginCaptureToGraph, (
    stream: *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    dep_data: *const c_void,
    n: usize,
    mode: c_int
));
begin_capture_hook!(cuStreamBeginCaptureToGraph_ptsz, (
    stream: *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    dep_data: *const c_void,
    n: usize,
    mode: c_int
));

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(
    stream: *mut c_void,
    graph: *mut *mut c_void,
) -> CUresult {
    boundary("cuStreamEndCapture", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuStreamEndCapture,
            fn(*mut c_void, *mut *mut c_void) -> CUresult,
            stream,
            graph
        );
        ended(rc, stream, false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    stream: *mut c_void,
    graph: *mut *mut c_void,
) -> CUresult {
    boundary("cuStreamEndCapture_ptsz", CUDA_ERROR_NOT_FOUND, || {
        let rc = call_real!(
            REAL.cuStreamEndCapture_ptsz,
            fn(*mut c_void, *mut *mut c_void) -> CUresult,
            stream,
            graph
        );
        ended(rc, stream, true)
    })
}
