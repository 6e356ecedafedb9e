//! A test client that reaches the driver the way Rust programs using cudarc
//! do: cudarc's dynamic loading `dlopen`s `libcuda.so` and `dlsym`s every
//! exact versioned name from that handle.
//!
//! Usage: `cudarc-client CHUNK_BYTES` — allocates chunks until the driver
//! (or the cap) refuses, prints what it saw, frees everything. Each line is
//! asserted by the integration tests.

use cudarc::driver::sys;

fn check(what: &str, rc: sys::CUresult) {
    if rc != sys::CUresult::CUDA_SUCCESS {
        eprintln!("cudarc-client: {what} failed: {rc:?}");
        std::process::exit(1);
    }
}

fn main() {
    let chunk: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| {
            eprintln!("usage: cudarc-client CHUNK_BYTES");
            std::process::exit(64);
        });
    // SAFETY: plain driver calls with valid out-pointers, in the documented order.
    unsafe {
        check("cuInit", sys::cuInit(0));
        let mut dev = 0;
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0));
        let mut ctx = std::ptr::null_mut();
        check(
            "cuDevicePrimaryCtxRetain",
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
        );
        check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx));
        let mut total_mem = 0usize;
        check(
            "cuDeviceTotalMem_v2",
            sys::cuDeviceTotalMem_v2(&mut total_mem, dev),
        );
        println!("device total={total_mem}");

        let mut held = Vec::new();
        let rc = loop {
            let mut p = 0;
            let rc = sys::cuMemAlloc_v2(&mut p, chunk);
            if rc != sys::CUresult::CUDA_SUCCESS || held.len() >= 100_000 {
                break rc;
            }
            held.push(p);
        };
        let (mut free, mut total) = (0usize, 0usize);
        check(
            "cuMemGetInfo_v2",
            sys::cuMemGetInfo_v2(&mut free, &mut total),
        );
        println!(
            "fill {} allocs {} bytes rc={rc:?}",
            held.len(),
            held.len() * chunk
        );
        println!("info free={free} total={total}");
        for p in held.drain(..) {
            check("cuMemFree_v2", sys::cuMemFree_v2(p));
        }
        check(
            "cuMemGetInfo_v2",
            sys::cuMemGetInfo_v2(&mut free, &mut total),
        );
        println!("after free={free} total={total}");
    }
}
