//! The exported `dlopen` and `dlmopen`: the two ways a library could be
//! loaded where the shim's exports do not come first.
//!
//! - `RTLD_DEEPBIND` puts a library's own dependencies ahead of the global
//!   scope, so a library linked with `-lcuda` binds `cuMemAlloc_v2` (and
//!   glibc's `dlsym`) straight to the driver. Under a cap the flag is
//!   dropped, with one warning naming the library: the library is then
//!   capped like any other.
//! - `dlmopen` into another link namespace loads a second copy of every
//!   dependency, the driver included, where `LD_PRELOAD` never reaches.
//!   Under a cap it is refused: the call answers null, one error line says
//!   why, and `dlerror()` names vramcap.
//!
//! Without a cap (or with `VRAMCAP_DISABLE=1`) both pass through unchanged.
//!
//! glibc's `dlopen` reads its caller's return address (for the caller's
//! link namespace and its `RPATH`/`RUNPATH`), so the exports are naked
//! trampolines: they ask [`dlopen_mode`] / [`dlmopen_mode`] for the mode
//! and then jump (not call) to glibc with the caller's frame intact.
//! Nothing here panics across the C boundary or allocates.

use std::ffi::{CStr, c_char, c_int, c_long, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::log::log_at;

/// glibc's `dlopen` and `dlmopen`, read by the trampolines.
pub static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
pub static REAL_DLMOPEN: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// `dlmopen`'s answer "refused", for the trampoline.
const REFUSE: c_int = -1;

/// Finds glibc's function through `RTLD_NEXT` (the shim exports the same
/// name). Without it the process cannot load libraries at all: stop it.
fn resolve(slot: &AtomicPtr<c_void>, name: &CStr) {
    if !slot.load(Ordering::Acquire).is_null() {
        return;
    }
    let p = super::real::real_dlsym(libc::RTLD_NEXT, name);
    if p.is_null() {
        crate::log::write_line(format_args!(
            "cannot find the C library's {name:?} (dlsym(RTLD_NEXT) failed); stopping"
        ));
        // SAFETY: abort has no preconditions.
        unsafe { libc::abort() }
    }
    slot.store(p, Ordering::Release);
}

/// Whether a cap is in force for this process (a limit, NVIDIA's
/// variable, the operator's file or a group) and the shim is not switched
/// off: then nothing may be loaded around it.
fn guarding() -> bool {
    !super::disabled() && super::capping_asked()
}

/// The mode `dlopen(file, mode)` runs with: `mode` without
/// `RTLD_DEEPBIND` under a cap. Called by the trampoline.
extern "C" fn dlopen_mode(file: *const c_char, mode: c_int) -> c_int {
    resolve(&REAL_DLOPEN, c"dlopen");
    // A null file is the main program, which loads nothing new.
    if mode & libc::RTLD_DEEPBIND == 0 || file.is_null() {
        return mode;
    }
    let guarded = std::panic::catch_unwind(guarding).unwrap_or(true);
    if !guarded {
        return mode;
    }
    // SAFETY: dlopen's contract: a non-null file is NUL-terminated.
    let name = unsafe { CStr::from_ptr(file) };
    log_at!(
        Warn,
        "{name:?} is loaded without RTLD_DEEPBIND: with it, the library could call the CUDA driver around the cap. If it needs RTLD_DEEPBIND for other symbols, run it without a limit"
    );
    mode & !libc::RTLD_DEEPBIND
}

/// The mode `dlmopen(lmid, file, mode)` runs with, or [`REFUSE`]: into
/// another link namespace under a cap, refused. Called by the trampoline.
extern "C" fn dlmopen_mode(lmid: c_long, file: *const c_char, mode: c_int) -> c_int {
    resolve(&REAL_DLMOPEN, c"dlmopen");
    if lmid == libc::LM_ID_BASE {
        return dlopen_mode(file, mode);
    }
    resolve(&REAL_DLOPEN, c"dlopen");
    if !std::panic::catch_unwind(guarding).unwrap_or(true) {
        return mode;
    }
    let name: &CStr = if file.is_null() {
        c"(null)"
    } else {
        // SAFETY: dlmopen's contract: a non-null file is NUL-terminated.
        unsafe { CStr::from_ptr(file) }
    };
    log_at!(
        Error,
        "dlmopen of {name:?} into another link namespace is refused: the CUDA driver loaded there would not be capped. Load it with dlopen, or run without a limit"
    );
    set_dlerror(
        c"vramcap refused dlmopen into a new link namespace (its driver would not be capped)",
    );
    REFUSE
}

/// Leaves `dlerror()` naming a refusal for the caller: glibc's message for
/// a library that cannot be found, whose name (`why`, without a slash)
/// says why. Nothing is loaded.
pub fn set_dlerror(why: &CStr) {
    resolve(&REAL_DLOPEN, c"dlopen");
    let f = REAL_DLOPEN.load(Ordering::Acquire);
    type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    // SAFETY: `f` is glibc's dlopen (resolved above), whose signature this is.
    let dlopen: DlopenFn = unsafe { std::mem::transmute::<*mut c_void, DlopenFn>(f) };
    // SAFETY: a NUL-terminated name without a slash and valid flags; the
    // name is no library, so nothing is loaded.
    let h = unsafe { dlopen(why.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    debug_assert!(h.is_null());
}

// The exported `dlopen`: asks `dlopen_mode` for the mode (the arguments
// saved around the call, the stack 16-byte aligned), then jumps to glibc's
// dlopen with the caller's return address on the stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {mode}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "mov esi, eax",
        "jmp qword ptr [rip + {real}]",
        mode = sym dlopen_mode,
        real = sym REAL_DLOPEN,
    )
}

// The exported `dlmopen`: the same, or null when `dlmopen_mode` refuses.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlmopen(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {mode}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "cmp eax, -1",
        "je 2f",
        "mov edx, eax",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "xor eax, eax",
        "ret",
        mode = sym dlmopen_mode,
        real = sym REAL_DLMOPEN,
    )
}
