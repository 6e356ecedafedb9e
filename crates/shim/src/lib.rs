//! `libvramcap.so`: an `LD_PRELOAD` library that sits between CUDA programs
//! and the driver (`libcuda.so.1`) and holds a per-GPU memory cap.
//!
//! # How calls reach the shim
//! - Programs linked with `-lcuda` bind the exported `cu*` names here first.
//! - Programs that `dlopen` the driver and `dlsym` names from its handle
//!   (XLA, CuPy, cudarc) reach the exported `dlsym`, which asks glibc, and
//!   answers with the hook when glibc found the driver's own symbol of a
//!   hooked name ([`hooks::answer_dlsym`]).
//! - The CUDA runtime, static or shared, `dlsym`s `cuGetProcAddress_v2` and
//!   then resolves everything, itself included, through it; the hooked
//!   resolvers call the real one with the caller's exact arguments and swap
//!   in a hook only for the exact variant the driver returned ([`hooks`]).
//! - `dlsym(RTLD_DEFAULT/RTLD_NEXT, …)` is not ours to answer and depends on
//!   the caller's address, so the exported `dlsym` is a trampoline that jumps
//!   (not calls) to glibc for those handles: glibc sees the real caller.
//!
//! # Concurrency
//! - Hot path state is atomic: per-device budgets (reserve by compare-and-swap
//!   before the driver call, settle or give back after; see
//!   `vramcap_core::budget`), lazily resolved function pointers
//!   ([`real::DynFn`]), the driver handle, the log level.
//! - The only locks are the shard locks of the allocation table, each held
//!   for one map operation and never across a driver call, `dlopen` or
//!   `dlsym`; no two are ever held together, so there is no lock order.
//! - Settings are read once (constructor, or the first hook if a hook runs
//!   first) through a `OnceLock`, before any thread of the program exists.
//! - No hook allocates except the table insert on a successful allocation.
//!   Logging formats into a stack buffer and issues one `write(2)`.
//! - `fork`: an `atfork` child handler resets every budget and swaps in a
//!   fresh allocation table without touching the old one, whose shard locks
//!   another thread of the parent may have held ([`state::reset_after_fork`]).
//! - A panic in a hook is caught at the boundary ([`hooks::boundary`]),
//!   logged once, and answered conservatively (allocations: out of memory).

// The exported functions are C entry points whose safety contract is the
// CUDA or glibc documentation of the function of the same name.
#![allow(clippy::missing_safety_doc)]

mod alloc;
mod cache;
mod cuda;
mod group;
mod hooks;
mod lifecycle;
mod log;
mod nvml;
mod paths;
mod real;
mod spill;
mod state;
mod stats;

use std::ffi::{CStr, c_char, c_void};

use crate::log::log_at;

/// Called by the `dlsym` trampoline for lookups in a real handle.
///
/// # Safety
/// Same contract as `dlsym`.
unsafe extern "C" fn dlsym_handle(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let found = real::real_dlsym_raw(handle, symbol);
    if symbol.is_null() {
        return found;
    }
    // SAFETY: glibc accepted `symbol` as a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) };
    hooks::boundary("dlsym", found, || hooks::answer_dlsym(name, found))
}

// The exported `dlsym`. For RTLD_DEFAULT (0) and RTLD_NEXT (-1) it jumps to
// glibc's dlsym with the caller's return address still on the stack, so
// glibc resolves relative to the real caller. Other handles go to
// `dlsym_handle` (also a jump: the caller's frame is reused). Before glibc's
// dlsym is known, it is resolved first, with the arguments saved around the
// call and the stack kept 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 4f",
        "test rdi, rdi",
        "jz 3f",
        "cmp rdi, -1",
        "je 3f",
        "jmp {handle}",
        "3:",
        "jmp rax",
        "4:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp 2b",
        real = sym real::REAL_DLSYM,
        handle = sym dlsym_handle,
        resolve = sym real::resolve_real_dlsym,
    )
}

#[cfg(not(target_arch = "x86_64"))]
compile_error!("the dlsym trampoline of libvramcap.so is written for x86_64 only");

/// Runs before the program's `main` (and before constructors of libraries
/// loaded after the shim): reads and checks the settings, exiting with status
/// 2 on a bad value, and registers the fork handler.
#[ctor::ctor]
unsafe fn init() {
    let s = state::settings();
    extern "C" fn child() {
        state::reset_after_fork();
    }
    // SAFETY: registering a handler with no prepare/parent parts is always valid.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
    log_at!(
        Debug,
        "loaded; limit: {}; log level {}; driver {:?}{}",
        s.limit,
        s.log.name(),
        real::driver_path(),
        if s.disabled { "; DISABLED" } else { "" }
    );
}

/// Runs at normal exit: removes the statistics page.
#[ctor::dtor]
unsafe fn fini() {
    group::leave();
    stats::remove_at_exit();
}
