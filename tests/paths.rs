//! Every other allocation path against the stand-in driver: stream-ordered
//! allocation and pools, VMM, arrays, NVML, and several GPUs. Exact bytes,
//! error codes and memory info, one fresh process per case.

use crate::util::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The VMM cases: the client through cuGetProcAddress under a 64 MiB cap.
fn vmm_client(args: &[&str]) -> Ran {
    client("procaddr", &[("VRAMCAP_LIMIT", "64MiB")], args)
}

#[test]
fn stream_ordered_allocations_are_capped_and_freed() {
    capped(
        "procaddr",
        "1GiB",
        &[
            "init",
            "stream",
            "allocasync",
            "512M",
            "allocasync",
            "512M",
            "allocasync",
            "1M",
            "info",
            "freeasync",
            "0",
            "info",
            "allocasync",
            "256M",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "allocasync 536870912 -> 0 #0",
        "allocasync 536870912 -> 0 #1",
        "allocasync 1048576 -> 2",
        "info -> 0 free=0 total=1G",
        "freeasync #0 -> 0",
        "info -> 0 free=512M total=1G",
        "allocasync 268435456 -> 0 #2",
        "standin dev=0 used=768M peak=1G",
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn pool_allocations_count_and_unknown_frees_pass_through() {
    for method in ["linked", "dlsym", "procaddr", "procaddr-legacy"] {
        client(
            method,
            &[("VRAMCAP_LIMIT", "1GiB")],
            &[
                "init",
                "pool",
                "poolalloc",
                "768M",
                "poolalloc",
                "512M",
                "poolalloc",
                "256M",
                "freeall",
                "info",
                "freeraw",
                "0x1234",
            ],
        )
        .expect_sized(&[
            "init -> 0",
            "pool -> 0",
            "poolalloc 805306368 -> 0 #0",
            "poolalloc 536870912 -> 2",
            "poolalloc 268435456 -> 0 #1",
            "freeall -> 2 freed rc=0",
            "info -> 0 free=1G total=1G",
            "freeraw 0x1234 -> 1",
        ]);
    }
}

/// Allocations made while the stream is captured are graph memory: the
/// driver's behaviour, not counted.
#[test]
fn captured_stream_allocations_pass_through() {
    capped(
        "procaddr",
        "1GiB",
        &[
            "init",
            "stream",
            "capture-begin",
            "allocasync",
            "2G",
            "freeasync",
            "0",
            "capture-end",
            "info",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "capture-begin -> 0",
        "allocasync 2147483648 -> 0 #0",
        "freeasync #0 -> 0",
        "capture-end -> 0",
        "info -> 0 free=1G total=1G",
    ]);
}

#[test]
fn vmm_counts_device_handles_until_the_last_reference() {
    vmm_client(&[
        "init",
        "vmm",
        "32M",
        "vmm",
        "32M",
        "vmm",
        "2M",
        "vmm",
        "64M",
        "host",
        "vmmmap",
        "0",
        "vmmretain",
        "0",
        "info",
        "vmmrelease",
        "0",
        "info",
        "vmmunmap",
        "0",
        "vmmrelease",
        "3",
        "info",
        "vmmexport",
        "1",
        "vmmimport",
        "vmmrelease",
        "1",
        "info",
        "vmmrelease",
        "4",
        "info",
        "vmm",
        "64M",
    ])
    .expect_sized(&[
        "init -> 0",
        "vmm 33554432 -> 0 %0",
        "vmm 33554432 -> 0 %1",
        "vmm 2097152 -> 2",
        // Host-located handles count against no device.
        "vmm 67108864 -> 0 %2",
        "vmmmap %0 -> 0",
        "vmmretain %0 -> 0 %3",
        "info -> 0 free=0 total=67108864",
        // Two references (create, retain): the first release keeps it.
        "vmmrelease %0 -> 0",
        "info -> 0 free=0 total=67108864",
        "vmmunmap %0 -> 0",
        "vmmrelease %3 -> 0",
        "info -> 0 free=32M total=67108864",
        // Exported and imported in the same process: one allocation, two
        // references, counted once.
        "vmmexport %1 -> 0",
        "vmmimport -> 0 %4",
        "vmmrelease %1 -> 0",
        "info -> 0 free=32M total=67108864",
        "vmmrelease %4 -> 0",
        "info -> 0 free=67108864 total=67108864",
        "vmm 67108864 -> 0 %5",
    ]);
}

#[test]
fn arrays_are_counted_at_the_driver_reported_size() {
    // 1000 float4 texels per row = 16000 bytes, padded to 16384; 64 rows.
    let row = 16384u64;
    capped(
        "procaddr",
        "4MiB",
        &[
            "init",
            "array",
            "1000",
            "64",
            "0x20",
            "4",
            "arraysize",
            "0",
            "info",
            "array3d",
            "1000",
            "64",
            "4",
            "0x20",
            "4",
            "mipmap",
            "512",
            "512",
            "0",
            "0x1",
            "1",
            "10",
            "arraysize",
            "1",
            "info",
            "arraydestroy",
            "0",
            "arraydestroy",
            "1",
            "info",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "array 1000 64 0x20 4 -> 0 @0",
        &format!("arraysize @0 -> 0 size={}", row * 64),
        &format!("info -> 0 free={} total={}", 4 * MIB - row * 64, 4 * MIB),
        // 4 MiB of 3D array does not fit next to the 1 MiB one.
        "array3d 1000 64 4 0x20 4 -> 2",
        "mipmap 512 512 0 0x1 1 10 -> 0 @1",
        // The stand-in's reported size for all ten levels.
        "arraysize @1 -> 0 size=523776",
        &format!(
            "info -> 0 free={} total={}",
            4 * MIB - row * 64 - 523776,
            4 * MIB
        ),
        "arraydestroy @0 -> 0",
        "arraydestroy @1 -> 0",
        &format!("info -> 0 free={0} total={0}", 4 * MIB),
    ]);
}

#[test]
fn nvml_reports_the_cap_like_cuda_does() {
    for method in ["procaddr", "linked"] {
        client(
            method,
            &[("VRAMCAP_LIMIT", "0=1GiB,1=512MiB")],
            &["init", "alloc", "256M", "nvml", "info"],
        )
        .expect_sized(&[
            "init -> 0",
            "alloc 268435456 -> 0 #0",
            &format!("nvml dev=0 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000000 total={GIB} free={0} used={1} v2total={GIB} v2free={0} v2used={1} v2reserved=0", 768 * MIB, 256 * MIB),
            // Device 1 not used through CUDA yet: its cap comes from the limit.
            &format!("nvml dev=1 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000001 total={0} free={0} used=0 v2total={0} v2free={0} v2used=0 v2reserved=0", 512 * MIB),
            "info -> 0 free=768M total=1G",
        ]);
    }
    // CUDA_VISIBLE_DEVICES=1,0: NVML's device 1 is the process's device 0.
    client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "0=1GiB,1=512MiB"), ("CUDA_VISIBLE_DEVICES", "1,0")],
        &["nvml"],
    )
    .expect_lines(&[
        &format!("nvml dev=0 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000000 total={0} free={0} used=0 v2total={0} v2free={0} v2used=0 v2reserved=0", 512 * MIB),
        &format!("nvml dev=1 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000001 total={0} free={0} used=0 v2total={0} v2free={0} v2used=0 v2reserved=0", GIB),
    ]);
    // Without a cap NVML is the driver's.
    client("procaddr", &[], &["nvml"]).expect_lines(&[
        "nvml dev=0 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000000 total=17179869184 free=17179869184 used=0 v2total=17179869184 v2free=17179869184 v2used=0 v2reserved=0",
        "nvml dev=1 uuid=GPU-5ca1ab1e-0000-4000-8000-000000000001 total=17179869184 free=17179869184 used=0 v2total=17179869184 v2free=17179869184 v2used=0 v2reserved=0",
    ]);
}

/// Every path in one process, frees in another order, each device its cap.
#[test]
fn mixed_paths_on_two_devices() {
    client(
        "procaddr",
        &[
            ("VRAMCAP_LIMIT", "0=1GiB,1=512MiB"),
            ("VRAMCAP_CACHE", "off"),
        ],
        &[
            "init",
            "stream",
            "alloc",
            "256M",
            "allocasync",
            "256M",
            "vmm",
            "256M",
            "managed",
            "256M",
            "alloc",
            "2M",
            "ctx",
            "1",
            "alloc",
            "256M",
            "managed",
            "256M",
            "alloc",
            "1M",
            "ctx",
            "0",
            "free",
            "1",
            "freeasync",
            "0",
            "vmmrelease",
            "0",
            "free",
            "2",
            "info",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "alloc 268435456 -> 0 #0",
        "allocasync 268435456 -> 0 #1",
        "vmm 268435456 -> 0 %0",
        "managed 268435456 -> 0 #2",
        "alloc 2097152 -> 2",
        "ctx 1 -> 0",
        "alloc 268435456 -> 0 #3",
        "managed 268435456 -> 0 #4",
        "alloc 1048576 -> 2",
        "ctx 0 -> 0",
        // Freed in another order than allocated, each through the other
        // path's call where the driver allows it.
        "free #1 -> 0",
        "freeasync #0 -> 0",
        "vmmrelease %0 -> 0",
        "free #2 -> 0",
        "info -> 0 free=1G total=1G",
        "standin dev=0 used=0 peak=1G",
        "standin dev=1 used=512M peak=512M",
    ]);
}

/// Threads switching devices: each allocation lands on its own device's cap.
#[test]
fn threads_switching_devices_keep_separate_caps() {
    let lines = client(
        "procaddr",
        &[
            ("VRAMCAP_LIMIT", "0=256MiB,1=128MiB"),
            ("VRAMCAP_CACHE", "off"),
        ],
        &[
            "init", "threads", "8", "2000", "16M", "ctx", "1", "threads", "8", "2000", "16M",
            "standin",
        ],
    )
    .ok_lines();
    assert!(
        lines[1].ends_with(" other=0") && lines[3].ends_with(" other=0"),
        "{lines:?}"
    );
    let peak = |l: &str| l.rsplit_once("peak=").unwrap().1.parse::<u64>().unwrap();
    assert!(
        lines[4].starts_with("standin dev=0 used=0 ") && peak(&lines[4]) <= 256 * MIB,
        "{lines:?}"
    );
    assert!(
        lines[5].starts_with("standin dev=1 used=0 ") && peak(&lines[5]) <= 128 * MIB,
        "{lines:?}"
    );
}

/// The driver frees VMM memory once it is released *and* unmapped: a mapping
/// keeps it counted after its last handle is released.
#[test]
fn vmm_memory_released_while_mapped_stays_counted_until_unmapped() {
    vmm_client(&[
        "init",
        "vmm",
        "32M",
        "vmmmap",
        "0",
        "vmmrelease",
        "0",
        "info",
        "vmm",
        "64M",
        "vmmunmap",
        "0",
        "info",
        "standin",
    ])
    .expect_sized(&[
        "init -> 0",
        "vmm 33554432 -> 0 %0",
        "vmmmap %0 -> 0",
        "vmmrelease %0 -> 0",
        "info -> 0 free=32M total=67108864",
        "vmm 67108864 -> 2",
        "vmmunmap %0 -> 0",
        "info -> 0 free=67108864 total=67108864",
        "standin dev=0 used=0 peak=33554432",
        "standin dev=1 used=0 peak=0",
    ]);
}

/// Destroying a context frees its arrays in the driver; their bytes come
/// back to the budget with it (and a later destroy of the handle is the
/// driver's business).
#[test]
fn arrays_go_back_to_the_budget_with_their_context() {
    // 1000 float4 texels, the row padded to 512 bytes by the stand-in.
    let row = (1000u64 * 16).next_multiple_of(512);
    capped(
        "procaddr",
        "4MiB",
        &[
            "init",
            "ctxcreate",
            "array",
            "1000",
            "64",
            "0x20",
            "4",
            "info",
            "ctxdestroy",
            "ctx",
            "0",
            "info",
            "standin",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "ctxcreate -> 0",
        "array 1000 64 0x20 4 -> 0 @0",
        &format!("info -> 0 free={} total={}", 4 * MIB - row * 64, 4 * MIB),
        "ctxdestroy -> 0",
        "ctx 0 -> 0",
        &format!("info -> 0 free={0} total={0}", 4 * MIB),
        &format!("standin dev=0 used=0 peak={}", row * 64),
        "standin dev=1 used=0 peak=0",
    ]);
}

/// Stream-ordered allocations live in the device's memory pool, which
/// outlives a context: the driver keeps them when their context is
/// destroyed (the stand-in does too; so does the H200's driver, see
/// docs/design/gpu-history.md), so they stay counted until they are freed.
#[test]
fn stream_ordered_memory_stays_counted_past_its_context() {
    capped(
        "procaddr",
        "1GiB",
        &[
            "init",
            "ctxcreate",
            "allocasync",
            "256M",
            "ctxdestroy",
            "ctx",
            "0",
            "info",
            "standin",
            "free",
            "0",
            "info",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "ctxcreate -> 0",
        "allocasync 268435456 -> 0 #0",
        "ctxdestroy -> 0",
        "ctx 0 -> 0",
        &format!("info -> 0 free={} total={GIB}", GIB - 256 * MIB),
        &format!("standin dev=0 used={0} peak={0}", 256 * MIB),
        "standin dev=1 used=0 peak=0",
        "free #0 -> 0",
        "info -> 0 free=1G total=1G",
        "standin dev=0 used=0 peak=256M",
        "standin dev=1 used=0 peak=0",
    ]);
}
