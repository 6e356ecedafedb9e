//! What a process holds beyond its allocations, under the shim and the
//! stand-in driver (`crates/shim/src/engine/held.rs`): pools charged by
//! their reserve and trimmed as a synchronisation would before a refusal,
//! graph memory sized at instantiation and refused at launch, the context
//! measured through NVML (in a container too), and what the program is
//! told. Exact bytes; one fresh process per case.

use crate::util::*;

const CAP: (&str, &str) = ("VRAMCAP_LIMIT", "4GiB");
const RETAIN: (&str, &str) = ("STANDIN_POOL_RETAIN", "1");

fn info(free: u64) -> String {
    format!("info -> 0 free={free} total={}", 4 * GIB)
}

/// 3 GiB from the stream's pool, freed and synchronised, then 3 GiB
/// allocated plainly.
const POOL_THEN_PLAIN: [&str; 7] = ["allocasync", "3G", "freeasync", "0", "sync", "alloc", "3G"];

/// What [`POOL_THEN_PLAIN`] answers when both allocations are granted.
fn pool_then_plain_granted() -> [String; 4] {
    [
        format!("allocasync {} -> 0 #0", 3 * GIB),
        "freeasync #0 -> 0".into(),
        "sync -> 0".into(),
        format!("alloc {} -> 0 #1", 3 * GIB),
    ]
}

/// The scenario: a pool whose release threshold keeps everything
/// is charged for what it keeps; a plain allocation that needs it is
/// refused until the program trims the pool, then granted.
#[test]
fn a_pool_that_keeps_freed_memory_is_refused_until_trimmed() {
    client(
        "procaddr",
        &[CAP, RETAIN],
        &[
            "init",
            "stream",
            "poolset",
            "threshold",
            "max",
            "allocasync",
            "2800M",
            "freeasync",
            "0",
            "sync",
            "info",
            "alloc",
            "3600M",
            "pooltrim",
            "0",
            "alloc",
            "3600M",
            "info",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "stream -> 0",
        "poolset threshold max -> 0",
        "allocasync 2800M -> 0 #0",
        "freeasync #0 -> 0",
        "sync -> 0",
        &info(4 * GIB - 2800 * MIB),
        "alloc 3600M -> 2",
        "pooltrim 0 -> 0",
        "alloc 3600M -> 0 #1",
        &info(4 * GIB - 3600 * MIB),
    ]);
}

/// With the default threshold the driver gives the memory back at the
/// synchronisation; the shim sees it before refusing anything.
#[test]
fn a_pool_trimmed_at_a_synchronisation_is_seen_before_a_refusal() {
    let mut cmds = vec!["init", "stream"];
    cmds.extend_from_slice(&POOL_THEN_PLAIN);
    cmds.push("info");
    client("procaddr", &[CAP, RETAIN], &cmds).expect_owned_lines(
        &[
            &["init -> 0".into(), "stream -> 0".into()][..],
            &pool_then_plain_granted(),
            &[info(GIB)],
        ]
        .concat(),
    );
}

/// The context is counted: the program sees a card of the cap's size
/// with the context on it, so two halves of the total do not both fit.
#[test]
fn the_context_is_counted_and_two_halves_do_not_fit() {
    client(
        "procaddr",
        &[CAP, ("STANDIN_CONTEXT_MIB", "518")],
        &["init", "info", "alloc", "2G", "alloc", "2G"],
    )
    .expect_sized(&[
        "init -> 0",
        // Measured, and charged with 128 MiB of room to grow.
        &info(4 * GIB - 518 * MIB - 128 * MIB),
        "alloc 2G -> 0 #0",
        "alloc 2G -> 2",
    ]);
}

/// NVML names this process by another PID (as in a container, where it
/// shows the host's) beside two other processes. In the host's PID
/// namespace the shim never takes another PID for its own: the fallback
/// stays. In a container it charges the fallback until this process can be
/// told apart (the only one holding at least what it counts), then that
/// figure, provisionally. Which applies depends on where the test runs.
#[test]
fn a_process_nvml_names_by_another_pid_is_found_only_in_a_container() {
    let in_host =
        std::fs::read_link("/proc/self/ns/pid").is_ok_and(|l| l.as_os_str() == "pid:[4026531836]");
    let context = if in_host {
        512 * MIB
    } else {
        300 * MIB + 128 * MIB
    };
    client(
        "procaddr",
        &[
            CAP,
            ("STANDIN_CONTEXT_MIB", "300"),
            ("STANDIN_NVML_PID", "999999"),
            ("STANDIN_NVML_OTHERS", "2"),
        ],
        &["init", "info", "alloc", "1G", "alloc", "4G", "info"],
    )
    .expect_sized(&[
        "init -> 0",
        &info(4 * GIB - 512 * MIB),
        "alloc 1G -> 0 #0",
        "alloc 4G -> 2",
        &info(3 * GIB - context),
    ]);
}

/// A graph is sized at instantiation: its launch is refused while the
/// cap has no room for its allocation nodes, and runs once it has; its
/// graph memory then counts, until it is freed and trimmed.
#[test]
fn a_graph_that_does_not_fit_is_refused_at_launch() {
    for method in ["procaddr", "dlsym", "linked"] {
        client(
            method,
            &[CAP, RETAIN],
            &[
                "init",
                "stream",
                "graphalloc",
                "3G",
                "instantiate",
                "alloc",
                "1536M",
                "launch",
                "free",
                "1",
                "launch",
                "graphmem",
                "reserved",
                "info",
                "freeasync",
                "0",
                "graphtrim",
                "info",
            ],
        )
        .expect_sized(&[
            "init -> 0",
            "stream -> 0",
            "graphalloc 3G -> 0 #0",
            "instantiate -> 0",
            "alloc 1536M -> 0 #1",
            "launch -> 2",
            "free #1 -> 0",
            "launch -> 0",
            "graphmem reserved -> 0 3G",
            &info(GIB),
            // Freed, its graph memory stays reserved until trimmed.
            "freeasync #0 -> 0",
            "graphtrim -> 0",
            &info(4 * GIB),
        ]);
    }
}

/// `VRAMCAP_COUNT=allocations`: neither the context nor a pool's reserve
/// is counted.
#[test]
fn counting_allocations_leaves_pools_and_the_context_out() {
    client(
        "procaddr",
        &[
            CAP,
            RETAIN,
            ("STANDIN_CONTEXT_MIB", "518"),
            ("VRAMCAP_COUNT", "allocations"),
        ],
        &[
            &["init", "info", "stream", "poolset", "threshold", "max"][..],
            &POOL_THEN_PLAIN,
        ]
        .concat(),
    )
    .expect_owned_lines(
        &[
            &["init -> 0".into(), info(4 * GIB), "stream -> 0".into()][..],
            &["poolset threshold max -> 0".into()],
            &pool_then_plain_granted(),
        ]
        .concat(),
    );
}
