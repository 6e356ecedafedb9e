//! The children `vramcap doctor` runs under the shim: `--probe` checks that
//! the driver's answers are the shim's, `--probe-limit` lets the shim check
//! the limit's device keys. Each prints its findings and exits non-zero on one.

use std::ffi::{c_int, c_void};

use super::driver::{Driver, GetProc, file_name, init_driver, object_of};

/// The driver, or `None` after one line saying why it cannot be loaded.
fn open_driver() -> Option<Driver> {
    Driver::open()
        .map_err(|e| println!("cannot load the driver: {e}"))
        .ok()
}

/// The child side of the key check, run under the shim with the
/// environment's limit: one call that needs a cap (`cuDeviceTotalMem_v2`
/// of device 0), at which the shim checks the keys and stops the process
/// with status 2 when one names no GPU.
pub fn probe_limit() -> u8 {
    let Some(d) = open_driver() else {
        return 1;
    };
    if let Err(e) = init_driver(&d) {
        println!("driver init under the shim failed: {e}");
        return 1;
    }
    type Total = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
    let mut bytes = 0usize;
    // SAFETY: cuDeviceTotalMem_v2(size_t*, CUdevice) in cuda.h.
    let Some(total) = (unsafe { d.func::<Total>(c"cuDeviceTotalMem_v2") }) else {
        println!("the driver lacks cuDeviceTotalMem_v2");
        return 1;
    };
    // SAFETY: a valid out-pointer and device 0, which init_driver found.
    let rc = unsafe { total(&mut bytes, 0) };
    if rc != 0 {
        // The shim checks only once the driver has answered.
        println!("cuDeviceTotalMem_v2 returned {rc}; the keys were not checked");
        return 1;
    }
    println!("every device key names a GPU");
    0
}

/// The child side of the interposition check, run under the shim.
pub fn probe() -> u8 {
    let Some(d) = open_driver() else {
        return 1;
    };
    let mut failed = false;
    let mut check = |what: &str, p: *const c_void| {
        let lib = object_of(p)
            .map(|p| file_name(&p))
            .unwrap_or_else(|| "nothing".into());
        let good = lib.starts_with("libvramcap");
        failed |= !good;
        println!(
            "{what} -> {lib}{}",
            if good {
                ""
            } else {
                " (expected libvramcap.so)"
            }
        );
    };
    let gpa = d.sym(c"cuGetProcAddress_v2");
    check("dlsym cuGetProcAddress_v2", gpa);
    check("dlsym cuMemAlloc_v2", d.sym(c"cuMemAlloc_v2"));
    if !gpa.is_null() {
        // SAFETY: the resolver has the CUDA 12+ signature GetProc.
        let gpa: GetProc = unsafe { std::mem::transmute::<*mut c_void, GetProc>(gpa) };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid name, out-pointer and a null status.
        unsafe {
            gpa(
                c"cuMemAlloc".as_ptr(),
                &mut p,
                3020,
                0,
                std::ptr::null_mut(),
            )
        };
        check("cuGetProcAddress cuMemAlloc@3020", p);
    }
    if std::env::var("VRAMCAP_PROBE_GPU").as_deref() == Ok("1") {
        match init_driver(&d) {
            Ok(_) => {
                let (mut free, mut total) = (0usize, 0usize);
                type Info = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
                // SAFETY: cuMemGetInfo_v2(size_t*, size_t*) in cuda.h.
                if let Some(f) = unsafe { d.func::<Info>(c"cuMemGetInfo_v2") } {
                    // SAFETY: valid out-pointers.
                    unsafe { f(&mut free, &mut total) };
                }
                let good = total == 1 << 30;
                failed |= !good;
                println!(
                    "cuMemGetInfo total under a 1 GiB cap -> {total}{}",
                    if good { "" } else { " (expected 1073741824)" }
                );
            }
            Err(e) => {
                failed = true;
                println!("driver init under the shim failed: {e}");
            }
        }
    }
    u8::from(failed)
}
