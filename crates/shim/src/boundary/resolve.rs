//! The answers to `cuGetProcAddress*` and to `dlsym` on a library handle:
//! the hook when the library's own answer is the real function of a hooked
//! variant, else the library's answer unchanged.
//!
//! The variant is identified by the pointer itself (the driver's exported
//! symbol of that exact name). When the driver hands out a pointer that is
//! none of its exports (an internal entry point), by base name, version and
//! flags within the CUDA major versions whose signatures the hooks were
//! written for ([`crate::lookup`]). Above those versions an internal pointer
//! for a hooked name is asked for again at the newest known version: the
//! same pointer is the same function, and gets its hook; another is a
//! function the hooks were not written for, and under a cap the lookup
//! fails rather than hand out a way around it.
//!
//! With parking enabled, a driver function that gets no hook (none
//! written, or one handed out only under tiered spill) is answered with
//! its forwarder (`forward.rs`), last, after every comparison above has
//! seen the driver's own pointer.

use std::ffi::{CStr, c_char, c_int, c_void};

use super::entry::{Hook, Only};
use super::forward::{forwarder, parking_enabled};
use super::real::{Lib, driver, driver_path, real_dlsym};
use super::{RealDriver, disabled};
use crate::engine::Engine;
use crate::ffi::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUresult};
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
    symbol_status: *mut c_int,
) -> CUresult {
    // SAFETY: the driver function's contract.
    let rc = unsafe { get_proc_address(engine, hooks, real, symbol, pfn, cuda_version, flags) };
    if rc == CUDA_ERROR_NOT_FOUND && !symbol_status.is_null() {
        // SAFETY: the caller passed a writable status (null: none).
        unsafe { *symbol_status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND };
    }
    rc
}

/// `CUdriverProcAddressQueryResult`: no such symbol.
const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;

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
        let found = unsafe { *pfn };
        // SAFETY: as above.
        unsafe { substitute(hooks, symbol, pfn, cuda_version, flags) };
        // SAFETY: as above.
        let kept = unsafe { *pfn } == found;
        if kept
            && !found.is_null()
            && !symbol.is_null()
            && cuda_version > lookup::NAME_MATCH_MAX_VERSION
        {
            // SAFETY: the real resolver accepted it as a NUL-terminated string.
            let name = unsafe { CStr::from_ptr(symbol) };
            // SAFETY: pfn is non-null and writable.
            let rc = unsafe { beyond_known_versions(hooks, name, pfn, cuda_version, flags) };
            if rc != CUDA_SUCCESS {
                return rc;
            }
        }
        // Last, so that every comparison above saw the driver's pointer:
        // a driver function that is no hook gets its forwarder (parking
        // only; otherwise it is handed out as found).
        // SAFETY: as above.
        if unsafe { *pfn } == found && !found.is_null() {
            let name = if symbol.is_null() {
                c"(null)"
            } else {
                // SAFETY: the real resolver accepted it as a NUL-terminated string.
                unsafe { CStr::from_ptr(symbol) }
            };
            // SAFETY: pfn is non-null and writable.
            unsafe { *pfn = forwarder(name, found) };
        }
    }
    rc
}

/// `cuGetProcAddress_v2`'s C signature, to ask the real resolver again.
type ResolverV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

/// A request above [`lookup::NAME_MATCH_MAX_VERSION`] for a hooked name
/// whose answer `*pfn` matched no hook: asked again at the newest known
/// version, the same pointer gets that version's hook; another pointer is
/// a function the hooks were not written for, which under a cap is
/// answered "not found" (and otherwise handed out, with a warning).
///
/// # Safety
/// `pfn` is non-null, writable and holds the real resolver's answer.
unsafe fn beyond_known_versions(
    hooks: &[Hook],
    name: &CStr,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let n = name.to_bytes();
    let hooked = hooks.iter().any(|h| {
        h.real.lib == Lib::Cuda
            && handed_out(h)
            && (h.lookup.base.as_bytes() == n || h.lookup.also.0.as_bytes() == n)
    });
    if !hooked {
        return CUDA_SUCCESS;
    }
    // SAFETY: guaranteed by the caller.
    let found = unsafe { *pfn };
    let known = lookup::NAME_MATCH_MAX_VERSION;
    let resolver = hooks
        .iter()
        .find(|h| h.name == c"cuGetProcAddress_v2")
        .and_then(|h| h.real.get());
    let mut same: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    let rc = match resolver {
        Some(f) => {
            // SAFETY: the driver's cuGetProcAddress_v2, whose signature
            // this is.
            let f: ResolverV2 = unsafe { std::mem::transmute::<*mut c_void, ResolverV2>(f) };
            // SAFETY: the resolver's contract: a NUL-terminated name and
            // writable out-pointers.
            unsafe { f(name.as_ptr(), &mut same, known, flags, &mut status) }
        }
        None => CUDA_ERROR_NOT_FOUND,
    };
    if rc == CUDA_SUCCESS && same == found {
        if let Some(i) = lookup::by_name(hooks.iter().map(|h| &h.lookup), n, known, flags)
            && handed_out(&hooks[i])
        {
            log_at!(
                Debug,
                "cuGetProcAddress({name:?}, {cuda_version}): the function answered at {known}, matched {:?}",
                hooks[i].name
            );
            // SAFETY: guaranteed by the caller.
            unsafe { *pfn = hooks[i].hook.cast_mut() };
        }
        return CUDA_SUCCESS;
    }
    if super::capping_asked() {
        log_once!(
            Error,
            "cuGetProcAddress({name:?}, {cuda_version}) answered a function that vramcap was not written for (it knows CUDA versions up to {known}); calls through it would not be capped, so the lookup fails. Use a vramcap release that knows this CUDA version, or run without a limit"
        );
        // SAFETY: guaranteed by the caller.
        unsafe { *pfn = std::ptr::null_mut() };
        return CUDA_ERROR_NOT_FOUND;
    }
    log_once!(
        Warn,
        "cuGetProcAddress({name:?}, {cuda_version}) answered a function that vramcap was not written for (it knows CUDA versions up to {known}); calls through it are not counted"
    );
    CUDA_SUCCESS
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
        return forwarded_dlsym(name, found);
    };
    match h.real.get() {
        Some(p) if p == found => h.hook.cast_mut(),
        _ if found == h.hook.cast_mut() => found,
        _ if super::capping_asked() => {
            // Calls through it would bypass the cap the user asked for:
            // the program is told there is no such function instead.
            log_once!(
                Error,
                "the program looked up {:?} in a library that is not the driver vramcap uses ({:?}); calls through it would not be capped, so the lookup fails. Set VRAMCAP_CUDA_LIBRARY to the libcuda.so.1 the program loads, or unset it",
                name,
                driver_path()
            );
            // A null answer with dlerror() unset crashes callers that read
            // it (CPython's ctypes): it names vramcap's refusal.
            super::loader::set_dlerror(
                c"vramcap refused this lookup: the library is not the CUDA driver it caps",
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

/// `dlsym`'s answer for a name that gets no hook: its forwarder when it is
/// the driver's own function (a `cu` name followed by a capital, which the
/// driver's handle answers with the same address) and parking is enabled;
/// else `found`. Libraries whose names start with `cu` too (`cublas…`,
/// `cudnn…`, the runtime's `cuda…`, `cuFile…`) are never forwarded.
fn forwarded_dlsym(name: &CStr, found: *mut c_void) -> *mut c_void {
    let n = name.to_bytes();
    if !parking_enabled() {
        return found;
    }
    // NVML's functions too (`nvml` and a capital): on r580 they block in
    // a checkpointed process, so a parked process's call to one must
    // wait at the gate and have it resumed first.
    // nvmlErrorString answers a pointer, not a code, and never blocks:
    // it is not gated.
    let (lib, at) = match n.starts_with(b"nvml") {
        true if n == b"nvmlErrorString" => return found,
        true => (super::real::nvml(), 4),
        false => (driver(), 2),
    };
    if !n.get(at).is_some_and(u8::is_ascii_uppercase) {
        return found;
    }
    match lib {
        Some(h) if real_dlsym(h, name) == found => forwarder(name, found),
        _ => found,
    }
}

/// Whether the hook of `h` is handed out: those only tiered spill needs
/// (the entry's `tiered` flag, `hooks.rs`) only under tiered spill, those
/// only parking needs (`parking`) only with parking enabled, and those of
/// the engine's own handles (`blocks`) wherever it makes blocks;
/// otherwise the program gets the driver's own functions and pays nothing,
/// or under parking their forwarders (`forward.rs`), which pass the gate
/// at the cost of one load.
fn handed_out(h: &Hook) -> bool {
    match h.only {
        Only::Always => true,
        Only::Tiered => super::settings().spill == Spill::Tiered,
        Only::Parking => parking_enabled(),
        // As the engine's `Tiers::new`: the handles it answers must be
        // answered wherever it makes them.
        Only::Blocks => {
            let s = super::settings();
            s.spill == Spill::Tiered || (s.park.is_some() && s.park_move.moves_blocks())
        }
    }
}
