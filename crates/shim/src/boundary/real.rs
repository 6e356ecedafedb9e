//! The real `dlsym`, the real driver and NVML, and slots for their functions.
//!
//! Everything here is resolved lazily and without locks: a pointer slot is
//! an `AtomicPtr` that starts null, is filled by whichever thread gets there
//! first (two threads may both resolve it; they store the same value), and
//! remembers "missing" with a sentinel so a symbol the driver lacks is looked
//! up once, not on every call. Nothing here panics.

use std::ffi::{CStr, c_char, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use std::marker::PhantomData;

use crate::log::{log_at, log_once};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`. Read by the `dlsym` trampoline in assembly, hence
/// `#[no_mangle]`-free but `pub` and a plain pointer-sized static.
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Finds glibc's `dlsym` through `dlvsym`, which the shim does not export and
/// so cannot recurse into. Never returns null: without `dlsym` nothing can
/// work, so the process is stopped with a message.
pub extern "C" fn resolve_real_dlsym() -> *mut c_void {
    let cur = REAL_DLSYM.load(Ordering::Acquire);
    if !cur.is_null() {
        return cur;
    }
    // The default version first (glibc >= 2.34), then the older x86_64 one.
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: RTLD_NEXT and two NUL-terminated strings are valid arguments.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p, Ordering::Release);
            return p;
        }
    }
    crate::log::write_line(format_args!(
        "cannot find the C library's dlsym (dlvsym failed for GLIBC_2.34 and GLIBC_2.2.5); stopping"
    ));
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// Calls glibc's `dlsym` on behalf of the shim itself.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    real_dlsym_raw(handle, name.as_ptr())
}

/// Calls glibc's `dlsym` with a raw name (null is passed on: glibc decides).
pub fn real_dlsym_raw(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f = resolve_real_dlsym();
    // SAFETY: `f` is glibc's dlsym, whose signature DlsymFn matches.
    let f: DlsymFn = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(f) };
    // SAFETY: dlsym validates the handle itself and takes the caller's name.
    unsafe { f(handle, name) }
}

const DRIVER_UNTRIED: u8 = 0;
const DRIVER_LOADED: u8 = 1;
const DRIVER_MISSING: u8 = 2;

static DRIVER: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
static DRIVER_STATE: AtomicU8 = AtomicU8::new(DRIVER_UNTRIED);

/// The path the shim opens: `VRAMCAP_CUDA_LIBRARY`, else `libcuda.so.1`.
/// Stored NUL-terminated by the constructor.
static DRIVER_PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

pub fn set_driver_path(path: Option<&std::path::Path>) {
    use std::os::unix::ffi::OsStrExt;
    let c = match path {
        Some(p) => std::ffi::CString::new(p.as_os_str().as_bytes())
            .unwrap_or_else(|_| c"libcuda.so.1".into()),
        None => c"libcuda.so.1".into(),
    };
    let _ = DRIVER_PATH.set(c);
}

pub fn driver_path() -> &'static CStr {
    DRIVER_PATH
        .get()
        .map(|c| c.as_c_str())
        .unwrap_or(c"libcuda.so.1")
}

/// The real driver's handle, opened on first use.
pub fn driver() -> Option<*mut c_void> {
    match DRIVER_STATE.load(Ordering::Acquire) {
        DRIVER_LOADED => return Some(DRIVER.load(Ordering::Acquire)),
        DRIVER_MISSING => return None,
        _ => {}
    }
    thread_local! {
        static OPENING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    // The driver's own start-up may call dlsym, which may ask for the driver
    // again on this thread: answer "not loaded yet" instead of recursing.
    if OPENING.with(|o| o.replace(true)) {
        return None;
    }
    let path = driver_path();
    // SAFETY: dlopen takes a NUL-terminated path and flags; it is re-entrant
    // and reference-counted, so a second thread opening it too is harmless.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    OPENING.with(|o| o.set(false));
    if h.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
        let err = unsafe { libc::dlerror() };
        let why = if err.is_null() {
            c"unknown error"
        } else {
            // SAFETY: see above.
            unsafe { CStr::from_ptr(err) }
        };
        log_once!(
            Error,
            "cannot open the CUDA driver {:?}: {:?}; set VRAMCAP_CUDA_LIBRARY to the real libcuda.so.1",
            path,
            why
        );
        DRIVER_STATE.store(DRIVER_MISSING, Ordering::Release);
        return None;
    }
    DRIVER.store(h, Ordering::Release);
    DRIVER_STATE.store(DRIVER_LOADED, Ordering::Release);
    log_at!(Debug, "real driver: {:?}", path);
    Some(h)
}

static NVML: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
static NVML_STATE: AtomicU8 = AtomicU8::new(DRIVER_UNTRIED);

/// NVML's handle (`libnvidia-ml.so.1`), opened on first use.
pub fn nvml() -> Option<*mut c_void> {
    match NVML_STATE.load(Ordering::Acquire) {
        DRIVER_LOADED => return Some(NVML.load(Ordering::Acquire)),
        DRIVER_MISSING => return None,
        _ => {}
    }
    // SAFETY: dlopen takes a NUL-terminated path and flags; reference-counted.
    let h = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if h.is_null() {
        NVML_STATE.store(DRIVER_MISSING, Ordering::Release);
        return None;
    }
    NVML.store(h, Ordering::Release);
    NVML_STATE.store(DRIVER_LOADED, Ordering::Release);
    Some(h)
}

fn library_missing(lib: Lib) -> bool {
    match lib {
        Lib::Cuda => DRIVER_STATE.load(Ordering::Acquire) == DRIVER_MISSING,
        Lib::Nvml => NVML_STATE.load(Ordering::Acquire) == DRIVER_MISSING,
    }
}

/// Which library a [`DynFn`] comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

/// "Looked up, not there".
const MISSING: *mut c_void = std::ptr::dangling_mut::<c_void>();

/// A driver (or NVML) function resolved on first use, untyped; [`Slot`]
/// gives it its C signature.
pub struct DynFn {
    pub name: &'static CStr,
    pub lib: Lib,
    ptr: AtomicPtr<c_void>,
}

impl DynFn {
    pub const fn new(name: &'static CStr) -> DynFn {
        DynFn {
            name,
            lib: Lib::Cuda,
            ptr: AtomicPtr::new(ptr::null_mut()),
        }
    }

    pub const fn nvml(name: &'static CStr) -> DynFn {
        DynFn {
            name,
            lib: Lib::Nvml,
            ptr: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The library's own pointer for this exact name, or `None`: one load
    /// once resolved (every forwarded call passes here).
    #[inline(always)]
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() || p == MISSING {
            self.resolve(p)
        } else {
            Some(p)
        }
    }

    /// [`DynFn::get`] before the pointer is resolved, or once it is known
    /// to be missing.
    #[cold]
    fn resolve(&self, p: *mut c_void) -> Option<*mut c_void> {
        if p == MISSING {
            return None;
        }
        let handle = match self.lib {
            Lib::Cuda => driver(),
            Lib::Nvml => nvml(),
        };
        let p = handle
            .map(|h| real_dlsym(h, self.name))
            .unwrap_or(ptr::null_mut());
        if p.is_null() {
            // A handle not available *yet* (asked while the shim itself is
            // opening the driver) must not mark the function missing for good.
            if handle.is_none() && !library_missing(self.lib) {
                return None;
            }
            self.ptr.store(MISSING, Ordering::Release);
            log_at!(Debug, "the library has no {:?}", self.name);
            None
        } else {
            self.ptr.store(p, Ordering::Release);
            Some(p)
        }
    }
}

/// A [`DynFn`] with its C signature `F` (an `unsafe extern "C" fn` type),
/// declared once in the hook or function list; the only place the untyped
/// pointer becomes a typed one.
pub struct Slot<F> {
    pub raw: DynFn,
    _f: PhantomData<F>,
}

impl<F: Copy> Slot<F> {
    pub const fn new(raw: DynFn) -> Slot<F> {
        const {
            assert!(size_of::<F>() == size_of::<*mut c_void>());
        }
        Slot {
            raw,
            _f: PhantomData,
        }
    }

    /// The function, or `None` when the library lacks it.
    #[inline(always)]
    pub fn get(&self) -> Option<F> {
        let p = self.raw.get()?;
        // SAFETY: `p` is the library's symbol of exactly this name, whose C
        // signature is `F` (declared with the name in one list), and `F` is
        // a function pointer type of a pointer's size (asserted in `new`).
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}
