//! The driver opened the way programs open it (`dlopen`, then its symbols),
//! for the parent's checks and the children's probes alike.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

pub(super) type GetProc =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// The driver's path as the dynamic loader resolved it.
pub(super) fn object_of(p: *const c_void) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: zeroed Dl_info is a valid out-buffer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr accepts any address.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

pub(super) fn driver_name() -> CString {
    std::env::var("VRAMCAP_CUDA_LIBRARY")
        .ok()
        .and_then(|v| CString::new(v).ok())
        .unwrap_or_else(|| c"libcuda.so.1".into())
}

pub(super) fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: see above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

pub(super) struct Driver {
    handle: *mut c_void,
}

impl Driver {
    pub(super) fn open() -> Result<Driver, String> {
        let name = driver_name();
        // SAFETY: a valid NUL-terminated name.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            Err(dlerror_text())
        } else {
            Ok(Driver { handle: h })
        }
    }

    pub(super) fn sym(&self, name: &CStr) -> *mut c_void {
        // SAFETY: a valid handle and name.
        unsafe { libc::dlsym(self.handle, name.as_ptr()) }
    }

    /// The driver's function `name`, typed as `F`.
    ///
    /// # Safety
    /// `F` must be the C signature of that driver function.
    pub(super) unsafe fn func<F: Copy>(&self, name: &CStr) -> Option<F> {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let p = self.sym(name);
        // SAFETY: F is a function pointer type of pointer size (asserted) and
        // the caller guarantees it is the function's signature.
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

pub(super) fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Initialises the driver and makes device 0's primary context current.
/// Returns the number of devices, or why not.
pub(super) fn init_driver(d: &Driver) -> Result<c_int, String> {
    type Init = unsafe extern "C" fn(u32) -> c_int;
    type Count = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
    type SetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
    // SAFETY: each type above is the cuda.h signature of the function named.
    let (init, count_fn, retain, set_current) = unsafe {
        (
            d.func::<Init>(c"cuInit"),
            d.func::<Count>(c"cuDeviceGetCount"),
            d.func::<Retain>(c"cuDevicePrimaryCtxRetain"),
            d.func::<SetCurrent>(c"cuCtxSetCurrent"),
        )
    };
    let (Some(init), Some(count_fn), Some(retain), Some(set_current)) =
        (init, count_fn, retain, set_current)
    else {
        return Err("the driver lacks cuInit, cuDeviceGetCount, cuDevicePrimaryCtxRetain or cuCtxSetCurrent".into());
    };
    let mut count: c_int = 0;
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers, in the documented order.
    unsafe {
        let rc = init(0);
        if rc != 0 {
            return Err(format!(
                "cuInit returned {rc} (100 means no CUDA-capable device is visible)"
            ));
        }
        count_fn(&mut count);
        let rc = retain(&mut ctx, 0);
        if rc != 0 {
            return Err(format!("cuDevicePrimaryCtxRetain returned {rc}"));
        }
        set_current(ctx);
    }
    Ok(count)
}
