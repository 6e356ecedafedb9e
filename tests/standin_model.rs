//! The stand-in driver's own model of what a process holds on a GPU, with
//! no shim: pool reserves (STANDIN_POOL_RETAIN=1), graph memory, the
//! context footprint and NVML's per-process figures. Exact bytes, one fresh
//! process per case (see `standin/README.md`).

use crate::util::*;

const GRANULE: u64 = 2 * MIB;

/// The bare client with pools that retain, on 64 MiB devices.
fn retaining(method: &str, args: &[&str]) -> Ran {
    client_bare(
        method,
        &[("STANDIN_POOL_RETAIN", "1"), ("STANDIN_TOTAL_MIB", "64")],
        args,
    )
}

#[test]
fn standin_pool_grows_by_granule_and_keeps_freed_memory_until_sync() {
    for method in ["linked", "dlsym", "procaddr"] {
        retaining(
            method,
            &[
                "init",
                "stream",
                "allocasync",
                "1M",
                "poolattr",
                "reserved",
                "poolattr",
                "used",
                // Reuses the free reserve: no growth.
                "allocasync",
                "1M",
                "poolattr",
                "reserved",
                // 1 MiB missing grows by one granule.
                "allocasync",
                "1M",
                "poolattr",
                "reserved",
                "freeasync",
                "0",
                "freeasync",
                "1",
                "poolattr",
                "used",
                "poolattr",
                "reserved",
                "info",
                "streamsync",
                "poolattr",
                "reserved",
                "poolattr",
                "reservedhigh",
                "poolattr",
                "usedhigh",
                "standin",
            ],
        )
        .expect_sized(&[
            "init -> 0",
            "stream -> 0",
            "allocasync 1048576 -> 0 #0",
            "poolattr reserved -> 0 2M",
            "poolattr used -> 0 1M",
            "allocasync 1048576 -> 0 #1",
            "poolattr reserved -> 0 2M",
            "allocasync 1048576 -> 0 #2",
            "poolattr reserved -> 0 4M",
            "freeasync #0 -> 0",
            "freeasync #1 -> 0",
            "poolattr used -> 0 1M",
            "poolattr reserved -> 0 4M",
            "info -> 0 free=60M total=64M",
            "streamsync -> 0",
            // Trimmed to the live MiB, rounded up to the granule.
            "poolattr reserved -> 0 2M",
            "poolattr reservedhigh -> 0 4M",
            "poolattr usedhigh -> 0 3M",
            "standin dev=0 used=2M peak=4M",
            "standin dev=1 used=0 peak=0",
        ]);
    }
}

#[test]
fn standin_pool_threshold_keeps_reserve_at_sync() {
    retaining(
        "procaddr",
        &[
            "init",
            "stream",
            "poolset",
            "threshold",
            "5M",
            "allocasync",
            "9M",
            "freeasync",
            "0",
            "sync",
            "poolattr",
            "threshold",
            "poolattr",
            "reserved",
            "poolset",
            "threshold",
            "max",
            "allocasync",
            "20M",
            "freeasync",
            "1",
            "sync",
            "poolattr",
            "reserved",
            "poolattr",
            "threshold",
            // TrimTo releases above max(used, keep), granule-rounded.
            "pooltrim",
            "3M",
            "poolattr",
            "reserved",
            "pooltrim",
            "0",
            "poolattr",
            "reserved",
            "poolset",
            "reservedhigh",
            "0",
            "poolattr",
            "reservedhigh",
            "poolset",
            "usedhigh",
            "1",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "poolset threshold 5M -> 0",
        "allocasync 9M -> 0 #0",
        "freeasync #0 -> 0",
        "sync -> 0",
        "poolattr threshold -> 0 5M",
        "poolattr reserved -> 0 6M",
        "poolset threshold max -> 0",
        "allocasync 20M -> 0 #1",
        "freeasync #1 -> 0",
        "sync -> 0",
        "poolattr reserved -> 0 20M",
        &format!("poolattr threshold -> 0 {}", u64::MAX),
        "pooltrim 3M -> 0",
        "poolattr reserved -> 0 4M",
        "pooltrim 0 -> 0",
        "poolattr reserved -> 0 0",
        "poolset reservedhigh 0 -> 0",
        "poolattr reservedhigh -> 0 0",
        "poolset usedhigh 1 -> 1",
        "standin dev=0 used=0 peak=20M",
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn standin_pool_growth_that_does_not_fit_changes_nothing() {
    retaining(
        "dlsym",
        &[
            "init",
            "stream",
            "allocasync",
            "40M",
            "allocasync",
            "20M",
            "freeasync",
            "0",
            // 40 MiB free in the reserve: 50 MiB need 10 MiB more, and only
            // 4 MiB are left on the device.
            "allocasync",
            "50M",
            "poolattr",
            "reserved",
            "allocasync",
            "44M",
            "poolattr",
            "reserved",
            "alloc",
            "1M",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "allocasync 40M -> 0 #0",
        "allocasync 20M -> 0 #1",
        "freeasync #0 -> 0",
        "allocasync 50M -> 2",
        "poolattr reserved -> 0 60M",
        "allocasync 44M -> 0 #2",
        "poolattr reserved -> 0 64M",
        "alloc 1M -> 2",
        "standin dev=0 used=64M peak=64M",
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn standin_created_pool_current_pool_and_destroy() {
    retaining(
        "procaddr",
        &[
            "init",
            "stream",
            "pool",
            "setpool",
            // cuMemAllocAsync now takes the created pool.
            "allocasync",
            "3M",
            "allocasync",
            "1M",
            "poolattr",
            "reserved",
            "freeasync",
            "1",
            "destroypool",
            "standin",
            "freeasync",
            "0",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "pool -> 0",
        "setpool -> 0",
        "allocasync 3M -> 0 #0",
        "allocasync 1M -> 0 #1",
        "poolattr reserved -> 0 4M",
        "freeasync #1 -> 0",
        "destroypool -> 0",
        // What the live 3 MiB need stays (granule-rounded); the rest goes.
        "standin dev=0 used=4M peak=4M",
        "standin dev=1 used=0 peak=0",
        "freeasync #0 -> 0",
        "standin dev=0 used=0 peak=4M",
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn standin_graph_memory_counts_at_launch_in_every_method() {
    for method in ["linked", "dlsym", "procaddr"] {
        retaining(
            method,
            &[
                "init",
                "stream",
                "graphalloc",
                "3M",
                "graphalloc",
                "1M",
                "graphfree",
                "1",
                "graphnodes",
                "instantiate",
                "standin",
                "launch",
                "graphmem",
                "used",
                "graphmem",
                "usedhigh",
                "graphmem",
                "reserved",
                "graphmem",
                "reservedhigh",
                "standin",
                // Its 3 MiB allocation is still live: no relaunch.
                "launch",
                "freeasync",
                "0",
                "graphmem",
                "used",
                "standin",
                "graphtrim",
                "graphmem",
                "reserved",
                "graphmemset",
                "reservedhigh",
                "0",
                "graphmem",
                "reservedhigh",
                "standin",
                "execdestroy",
            ],
        )
        .expect_sized(&[
            "init -> 0",
            "stream -> 0",
            "graphalloc 3M -> 0 #0",
            "graphalloc 1M -> 0 #1",
            "graphfree #1 -> 0",
            "graphnodes -> 0 n=3 types=10,10,11",
            "instantiate -> 0",
            "standin dev=0 used=0 peak=0",
            "standin dev=1 used=0 peak=0",
            "launch -> 0",
            "graphmem used -> 0 3M",
            "graphmem usedhigh -> 0 4M",
            "graphmem reserved -> 0 4M",
            "graphmem reservedhigh -> 0 4M",
            "standin dev=0 used=4M peak=4M",
            "standin dev=1 used=0 peak=0",
            "launch -> 1",
            "freeasync #0 -> 0",
            "graphmem used -> 0 0",
            "standin dev=0 used=4M peak=4M",
            "standin dev=1 used=0 peak=0",
            "graphtrim -> 0",
            "graphmem reserved -> 0 0",
            "graphmemset reservedhigh 0 -> 0",
            "graphmem reservedhigh -> 0 0",
            "standin dev=0 used=0 peak=4M",
            "standin dev=1 used=0 peak=0",
            "execdestroy -> 0",
        ]);
    }
}

#[test]
fn standin_captured_graph_upload_autofree_and_oom() {
    retaining(
        "procaddr",
        &[
            "init",
            "stream",
            "capture-begin",
            "allocasync",
            "40M",
            "capture-end",
            "graphnodes",
            "instantiate",
            "autofree",
            "upload",
            "graphmem",
            "reserved",
            "launch",
            // AUTO_FREE_ON_LAUNCH: the live 40 MiB are freed first.
            "launch",
            "graphmem",
            "used",
            "free",
            "0",
            "free",
            "0",
            "graphtrim",
            "alloc",
            "30M",
            "standin",
            // 40 MiB do not fit beside 30 MiB: nothing changes.
            "launch",
            "graphmem",
            "reserved",
            "graphmem",
            "used",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "capture-begin -> 0",
        "allocasync 40M -> 0 #0",
        "capture-end -> 0",
        "graphnodes -> 0 n=1 types=10",
        "instantiate autofree -> 0",
        "upload -> 0",
        "graphmem reserved -> 0 40M",
        "launch -> 0",
        "launch -> 0",
        "graphmem used -> 0 40M",
        "free #0 -> 0",
        "free #0 -> 1",
        "graphtrim -> 0",
        "alloc 30M -> 0 #1",
        "standin dev=0 used=30M peak=40M",
        "standin dev=1 used=0 peak=0",
        "launch -> 2",
        "graphmem reserved -> 0 0",
        "graphmem used -> 0 0",
        "standin dev=0 used=30M peak=40M",
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn standin_instantiate_with_params_uploads() {
    retaining(
        "procaddr",
        &[
            "init",
            "stream",
            "graphalloc",
            "5M",
            "instantiate",
            "upload",
            "graphmem",
            "reserved",
            "graphmem",
            "used",
            // One executable graph at a time for a graph with memory nodes.
            "instantiate",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "graphalloc 5M -> 0 #0",
        "instantiate upload -> 0 result=0",
        "graphmem reserved -> 0 6M",
        "graphmem used -> 0 0",
        "instantiate -> 1",
    ]);
}

#[test]
fn standin_context_footprint_counts_per_context() {
    client_bare(
        "dlsym",
        &[("STANDIN_CONTEXT_MIB", "300")],
        &[
            "init",
            "ctx",
            "1",
            "ctxcreate",
            "standin",
            "info",
            "ctxdestroy",
            "release",
            "1",
            "standin",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "ctx 1 -> 0",
        "ctxcreate -> 0",
        "standin dev=0 used=600M peak=600M",
        "standin dev=1 used=300M peak=300M",
        &format!(
            "info -> 0 free={} total={}",
            16384 * MIB - 600 * MIB,
            16384 * MIB
        ),
        "ctxdestroy -> 0",
        "release 1 -> 0",
        "standin dev=0 used=300M peak=600M",
        "standin dev=1 used=0 peak=300M",
    ]);
}

#[test]
fn standin_nvml_lists_this_process_per_device_with_everything_it_holds() {
    let r = client_bare(
        "procaddr",
        &[("STANDIN_CONTEXT_MIB", "100"), ("STANDIN_POOL_RETAIN", "1")],
        &[
            "init",
            "stream",
            "allocasync",
            "1M",
            "alloc",
            "5M",
            "nvmlprocs",
        ],
    );
    // The client is the process NVML reports; its PID is not known before.
    let lines = r.ok_lines();
    assert_eq!(lines.len(), 6, "{lines:?}");
    let used = 100 * MIB + GRANULE + 5 * MIB;
    let want_prefix = "nvmlprocs dev=0 pid=";
    assert!(lines[4].starts_with(want_prefix), "{lines:?}");
    let rest = &lines[4][want_prefix.len()..];
    let (pid, used_part) = rest.split_once(' ').expect("pid and used");
    assert!(pid.parse::<u32>().unwrap() > 0, "{lines:?}");
    assert_eq!(used_part, format!("used={used}"), "{lines:?}");
    assert_eq!(lines[5], "nvmlprocs dev=1 none");
}

#[test]
fn standin_nvml_pid_override_and_other_processes() {
    client_bare(
        "dlsym",
        &[
            ("STANDIN_NVML_PID", "4242"),
            ("STANDIN_NVML_OTHERS", "2"),
            ("STANDIN_NVML_DEVICES", "3"),
        ],
        &["init", "alloc", "7M", "nvmlprocs", "nvml"],
    )
    .expect_sized(&[
        "init -> 0",
        "alloc 7M -> 0 #0",
        "nvmlprocs dev=0 pid=4242 used=7M",
        "nvmlprocs dev=0 pid=4000000 used=100M",
        "nvmlprocs dev=0 pid=4000001 used=100M",
        "nvmlprocs dev=1 pid=4000000 used=100M",
        "nvmlprocs dev=1 pid=4000001 used=100M",
        "nvmlprocs dev=2 pid=4000000 used=100M",
        "nvmlprocs dev=2 pid=4000001 used=100M",
        &nvml_line(0, 207 * MIB),
        &nvml_line(1, 200 * MIB),
        &nvml_line(2, 200 * MIB),
    ]);
}

fn nvml_line(dev: u32, used: u64) -> String {
    let total = 16384 * MIB;
    let free = total - used;
    format!(
        "nvml dev={dev} uuid=GPU-5ca1ab1e-0000-4000-8000-{dev:012x} total={total} \
         free={free} used={used} v2total={total} v2free={free} v2used={used} v2reserved=0"
    )
}
