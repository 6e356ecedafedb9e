//! The exported `dlsym`: a trampoline, so glibc still sees the real
//! caller for the lookups that depend on it.

use std::ffi::{CStr, c_char, c_void};

use super::boundary;
use super::hooks::HOOKS;
use super::real;
use super::resolve::answer_dlsym;

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
    boundary("dlsym", found, || answer_dlsym(HOOKS, name, found))
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
