//! The answers to `cuGetProcAddress*` and to `dlsym` on a library handle:
//! the hook when the library's own answer is the real function of a hooked
//! variant, else the library's answer unchanged.
//!
//! The variant is identified by the pointer itself (the driver's exported
//! symbol of that exact name). When the driver hands out a pointer that is
//! none of its exports (an internal entry point), by base name, version and
//! flags within the CUDA major versions whose signatures the hooks were
//! written for ([`crate::lookup`]).

use std::ffi::{CStr, c_char, c_int, c_void};

use super::entry::Hook;
use super::real::{Lib, driver_path};
use super::{RealDriver, disabled};
use crate::engine::Engine;
use crate::ffi::{CUDA_SUCCESS, CUresult};
use crate::log::{log_at, log_once};
use crate::lookup;
use vramcap_core::settings::Spill;

/// Replaces a function pointer handed out by `cuGetProcAddress*` with the
/// hook for the same variant, from `hooks` (the hook list).
///
/// # Safety
/// `pfn` is non-null and holds what the real resolver wrote; `symbol` is
/// null or the caller's NUL-terminated name.
unsafe fn substitute(
    hooks: &[Hook],
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) {
    // SAFETY: guaranteed by the caller.
    let p = unsafe { *pfn };
    if p.is_null() {
        return;
    }
    // NVML functions are never handed out by the CUDA resolver; looking
    // them up here would load NVML as a side effect.
    let by_pointer = hooks
        .iter()
        .filter(|h| h.real.lib == Lib::Cuda && handed_out(h))
        .find(|h| h.real.get() == Some(p));
    if let Some(h) = by_pointer {
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = h.hook.cast_mut() };
        return;
    }
    if symbol.is_null() {
        return;
    }
    // SAFETY: the real resolver accepted it as a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if let Some(i) = lookup::by_name(hooks.iter().map(|h| &h.lookup), name, cuda_version, flags)
        && handed_out(&hooks[i])
    {
        let h = &hooks[i];
        log_at!(
            Debug,
            "cuGetProcAddress({}, {cuda_version}): internal driver pointer, matched {:?} by version",
            h.lookup.base,
            h.name
        );
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = h.hook.cast_mut() };
    }
}

/// `cuGetProcAddress_v2`: the real resolver with the caller's exact
/// arguments, then the hook for the variant it found.
///
/// # Safety
/// The driver function's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn get_proc_address_v2(
    engine: &'static Engine<RealDriver>,
    hooks: &[Hook],
    real: impl FnMut() -> CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    _symbol_status: *mut c_int,
) -> CUresult {
    // SAFETY: the driver function's contract.
    unsafe { get_proc_address(engine, hooks, real, symbol, pfn, cuda_version, flags) }
}

/// `cuGetProcAddress` (CUDA 11.3–11.8), and the work of
/// [`get_proc_address_v2`].
///
/// # Safety
/// The driver function's contract.
pub unsafe fn get_proc_address(
    _engine: &'static Engine<RealDriver>,
    hooks: &[Hook],
    mut real: impl FnMut() -> CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let rc = real();
    if rc == CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: pfn is non-null and the resolver filled it.
        unsafe { substitute(hooks, symbol, pfn, cuda_version, flags) };
    }
    rc
}

/// What `dlsym(handle, name)` answers for a real handle, given glibc's own
/// answer `found`: the hook in `hooks` (the hook list) when `found` is the
/// library's own symbol of a hooked name, else `found` unchanged.
pub fn answer_dlsym(hooks: &[Hook], name: &CStr, found: *mut c_void) -> *mut c_void {
    let n = name.to_bytes();
    if found.is_null() || disabled() || !(n.starts_with(b"cu") || n.starts_with(b"nvml")) {
        return found;
    }
    let Some(h) = hooks
        .iter()
        .find(|h| h.name == name)
        .filter(|h| handed_out(h))
    else {
        return found;
    };
    match h.real.get() {
        Some(p) if p == found => h.hook.cast_mut(),
        _ if found == h.hook.cast_mut() => found,
        _ if capping_asked() => {
            // Calls through it would bypass the cap the user asked for:
            // the program is told there is no such function instead.
            log_once!(
                Error,
                "the program looked up {:?} in a library that is not the driver vramcap uses ({:?}); calls through it would not be capped, so the lookup fails. Set VRAMCAP_CUDA_LIBRARY to the libcuda.so.1 the program loads, or unset it",
                name,
                driver_path()
            );
            std::ptr::null_mut()
        }
        _ => {
            log_once!(
                Warn,
                "the program looked up {:?} in a library that is not the driver vramcap uses ({:?}); calls through it are not counted. Set VRAMCAP_CUDA_LIBRARY to the libcuda.so.1 the program loads",
                name,
                driver_path()
            );
            found
        }
    }
}

/// Whether the hook of `h` is handed out: those only tiered spill needs
/// (the entry's `tiered` flag, `hooks.rs`) only under tiered spill;
/// otherwise the program gets the driver's own functions and pays nothing.
fn handed_out(h: &Hook) -> bool {
    !h.tiered_only || super::settings().spill == Spill::Tiered
}

/// Whether any cap was asked for (a limit, NVIDIA's variable, the
/// operator's file or a group): then nothing may bypass the hooks.
fn capping_asked() -> bool {
    let s = super::settings();
    !s.limit.is_unlimited() || s.nvidia_limit.is_some() || s.operator.is_some() || s.group.is_some()
}
