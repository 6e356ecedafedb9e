//! Tiered spill (`VRAMCAP_SPILL=tiered`) against the stand-in driver, in
//! fresh processes: blocks within the cap are device memory and past it
//! host memory; kernel launches that name a host block get it promoted
//! (after a colder block makes room) with its address and contents kept;
//! the device never holds more than the cap; no launch or copy ever meets
//! an unmapped address; a CUDA graph's kernels heat blocks as launches do;
//! and without tiered spill the launch hooks are not handed out at all.

use std::time::{Duration, Instant};

use crate::util::*;

/// Waits (at most 30 s) for the process's one promotion under a 64 MiB
/// cap: the 32 MiB host block #2 onto the device, the 32 MiB device block
/// #0 making room (the device then holds #1 and #2, `used` bytes).
fn promoted_once(dir: &std::path::Path, pid: u32, used: u64) {
    let start = Instant::now();
    let d = loop {
        let d = stat_device0(dir, pid);
        if d["promotions"] == 1 {
            break d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no promotion within 30 s: {d}"
        );
        std::thread::yield_now();
    };
    assert_eq!(d["demotions"], 1, "{d}");
    assert_eq!(d["moved_bytes"], 64 * MIB, "{d}");
    assert_eq!(d["used_bytes"], used, "{d}");
    assert_eq!(d["spilled_bytes"], 32 * MIB, "{d}");
}

fn tiered(cap: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("VRAMCAP_LIMIT", cap),
        ("VRAMCAP_SPILL", "tiered"),
        ("VRAMCAP_SPILL_LIMIT", "1GiB"),
        ("VRAMCAP_CACHE", "off"),
    ]
}

/// Three blocks under a 64 MiB cap: #0 (32 MiB) and #1 (16 MiB) on the
/// device, #2 (32 MiB) past the cap on the host; #2 tagged 77, #0 tagged 5;
/// the kernel `touch2` loaded.
const THREE_BLOCKS: [&str; 17] = [
    "init", "alloc", "32M", "alloc", "16M", "alloc", "32M", "memset32", "2", "32M", "77",
    "memset32", "0", "32M", "5", "kernel", "touch2",
];

/// The three blocks freed, then the device's use.
const FREE_THREE: [&str; 7] = ["free", "0", "free", "1", "free", "2", "standin"];

/// What [`FREE_THREE`] answers after a promotion under a 64 MiB cap (a
/// peak of 48 MiB on the device).
fn freed_three() -> [String; 5] {
    [
        "free #0 -> 0".into(),
        "free #1 -> 0".into(),
        "free #2 -> 0".into(),
        format!("standin dev=0 used=0 peak={}", 48 * MIB),
        "standin dev=1 used=0 peak=0".into(),
    ]
}

/// Runs the client with `cmds` under tiered spill and a 64 MiB cap, waits
/// for its one promotion (`used` bytes on the device after it), resumes it
/// and returns its lines once it has exited successfully.
fn promoted_run(cmds: &[&str], used: u64) -> Vec<String> {
    let dir = scratch_dir();
    let mut h = held_in(&dir, &tiered("64MiB"), cmds);
    promoted_once(&dir, h.pid(), used);
    h.resume();
    let (lines, out) = h.finish();
    assert!(out.status.success(), "{lines:?}");
    lines
}

/// The lines from `resumed` on.
fn after_resume(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .map(String::as_str)
        .skip_while(|l| *l != "resumed")
        .collect()
}

/// A hot host block is promoted: the cold device block that makes room goes
/// to the host, the hot one comes to the device, the stand-in's device
/// never holds more than the 64 MiB cap, and the hot block's contents (the
/// stand-in's tag, written before the move and read after it) survive.
#[test]
fn a_hot_host_block_moves_onto_the_gpu_with_its_contents() {
    let mut cmds = THREE_BLOCKS.to_vec();
    cmds.extend_from_slice(&["kernel-launch", "3000", "#2", "#2", "wait", "read32", "2"]);
    cmds.extend_from_slice(&["read32", "0", "kernel-launch", "1", "#0", "#2", "kcounts"]);
    cmds.push("standin");
    cmds.extend_from_slice(&FREE_THREE);
    // #0 (32 MiB, never launched) is the block to make room for #2.
    let lines = promoted_run(&cmds, 48 * MIB);
    let mut want = vec![
        "resumed".to_string(),
        "read32 #2 -> 0 value=77".into(),
        "read32 #0 -> 0 value=5".into(),
        "kernel-launch 1 -> 0".into(),
        "kcounts launch=3001 fault=0".into(),
        // The peak: 48 MiB, never the 80 MiB a move that made the new
        // memory before giving back the old would have needed.
        format!("standin dev=0 used={} peak={}", 48 * MIB, 48 * MIB),
        "standin dev=1 used=0 peak=0".into(),
    ];
    want.extend(freed_three());
    assert_eq!(after_resume(&lines), want);
}

/// The program's own `cuMemCreate` memory (PyTorch's expandable segments)
/// is tiered too: past the cap a handle is host memory; a page the program
/// mapped whole and granted access to moves like a block, its handle value
/// and contents kept, the device never above the cap; the handle still
/// maps, retains and releases; and its bytes come back with its release.
#[test]
fn the_programs_own_vmm_pages_move_with_their_handles_and_contents() {
    let mut cmds = vec!["init", "vmm", "32M", "vmm", "32M", "vmm", "32M"];
    cmds.extend_from_slice(&["vmmmap", "%0", "vmmmap", "%1", "vmmmap", "%2", "standin"]);
    cmds.extend_from_slice(&["memset32", "%2", "32M", "77", "memset32", "%0", "32M", "5"]);
    cmds.extend_from_slice(&[
        "kernel",
        "touch2",
        "kernel-launch",
        "3000",
        "%2",
        "%2",
        "wait",
    ]);
    cmds.extend_from_slice(&[
        "read32",
        "%2",
        "read32",
        "%0",
        "kernel-launch",
        "1",
        "%0",
        "%2",
    ]);
    cmds.extend_from_slice(&["kcounts", "standin", "vmmretain", "%2", "vmmrelease", "%3"]);
    cmds.extend_from_slice(&["vmmunmap", "%0", "vmmunmap", "%1", "vmmunmap", "%2"]);
    cmds.extend_from_slice(&["vmmrelease", "%0", "vmmrelease", "%1", "vmmrelease", "%2"]);
    cmds.extend_from_slice(&["vmmrelease", "%2", "standin", "counts"]);
    // %0 (32 MiB, never launched) is the block to make room for %2.
    let lines = promoted_run(&cmds, 64 * MIB);
    let at = |l: &str| lines.iter().position(|x| x == l).expect(l);
    // The third handle is past the cap: host memory, the device holds two.
    assert_eq!(
        lines[at("vmmmap %2 -> 0") + 1],
        format!("standin dev=0 used={} peak={}", 64 * MIB, 64 * MIB)
    );
    let (counts, lines) = lines.split_last().unwrap();
    let tail: Vec<&str> = lines[at("resumed")..].iter().map(String::as_str).collect();
    assert_eq!(
        tail,
        [
            "resumed",
            "read32 %2 -> 0 value=77",
            "read32 %0 -> 0 value=5",
            "kernel-launch 1 -> 0",
            "kcounts launch=3001 fault=0",
            // Never above the cap: the demotion gives back its memory
            // before the promotion makes its own.
            &format!("standin dev=0 used={} peak={}", 64 * MIB, 64 * MIB),
            "standin dev=1 used=0 peak=0",
            // The retained handle is the program's %2 again.
            "vmmretain %2 -> 0 %3",
            "vmmrelease %3 -> 0",
            "vmmunmap %0 -> 0",
            "vmmunmap %1 -> 0",
            "vmmunmap %2 -> 0",
            "vmmrelease %0 -> 0",
            "vmmrelease %1 -> 0",
            "vmmrelease %2 -> 0",
            // Released already: the driver's answer for a released handle.
            "vmmrelease %2 -> 1",
            &format!("standin dev=0 used=0 peak={}", 64 * MIB),
            "standin dev=1 used=0 peak=0",
        ]
    );
    // Two device handles asked for, one promotion; one host handle made
    // past the cap, one demotion.
    assert!(counts.contains(" vmm=3 vmm_host=2 "), "{counts}");
}

/// The graph commands of [`graph_promotes`] for one graph whose kernel
/// names the host block #2.
const CAPTURE_2: [&str; 7] = [
    "capture-begin",
    "kernel-launch",
    "1",
    "#2",
    "#2",
    "capture-end",
    "instantiate",
];

/// Three blocks under a 64 MiB cap (#0 32 MiB and #1 16 MiB on the device,
/// #2 32 MiB on the host), both device blocks warmed by ten launches (more
/// than one captured launch alone gives the host block); then `graph` (the
/// commands making the executable graph) and 3000 launches of it, which
/// must promote #2 (#0 making room) with its contents kept and no fault.
/// `said`: what the graph commands answer.
fn graph_promotes(graph: &[&str], said: &[&str]) {
    let mut cmds = THREE_BLOCKS.to_vec();
    cmds.extend_from_slice(&["kernel-launch", "10", "#0", "#1", "stream"]);
    cmds.extend_from_slice(graph);
    cmds.extend_from_slice(&[
        "launches",
        "3000",
        "wait",
        "read32",
        "2",
        "read32",
        "0",
        "launch",
        "kcounts",
        "standin",
        "execdestroy",
    ]);
    cmds.extend_from_slice(&FREE_THREE);
    let lines = promoted_run(&cmds, 48 * MIB);
    let before: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .take_while(|l| *l != "resumed")
        .filter(|l| {
            [
                "kernel-launch",
                "launches",
                "capture",
                "instantiate",
                "execupdate",
            ]
            .iter()
            .any(|c| l.starts_with(c))
        })
        .collect();
    let mut want = vec!["kernel-launch 10 -> 0"];
    want.extend_from_slice(said);
    want.push("launches 3000 -> 0");
    assert_eq!(before, want);
    let mut want = vec![
        "resumed".to_string(),
        "read32 #2 -> 0 value=77".into(),
        "read32 #0 -> 0 value=5".into(),
        "launch -> 0".into(),
        // Captured launches ran nothing; each graph launch ran its one kernel.
        "kcounts launch=3011 fault=0".into(),
        format!("standin dev=0 used={} peak={}", 48 * MIB, 48 * MIB),
        "standin dev=1 used=0 peak=0".into(),
        "execdestroy -> 0".into(),
    ];
    want.extend(freed_three());
    assert_eq!(after_resume(&lines), want);
}

/// A host block that only a CUDA graph's kernel uses heats as launched
/// blocks do: the kernel captured on a stream becomes a kernel node, whose
/// parameters the shim reads when the graph is instantiated and counts at
/// each launch of it. The block is promoted, keeps its contents, and the
/// graph's kernels never meet an unmapped address.
#[test]
fn a_block_only_a_graph_uses_moves_onto_the_gpu() {
    graph_promotes(
        &CAPTURE_2,
        &[
            "capture-begin -> 0",
            "kernel-launch 1 -> 0",
            "capture-end -> 0",
            "instantiate -> 0",
        ],
    );
}

/// An executable graph made from a graph whose kernel names #1, then
/// updated (`cuGraphExecUpdate`) to one whose kernel names #2: its
/// launches are uses of #2, which is promoted.
#[test]
fn an_updated_graph_heats_what_its_new_kernels_name() {
    let mut graph = vec![
        "capture-begin",
        "kernel-launch",
        "1",
        "#1",
        "#1",
        "capture-end",
        "instantiate",
    ];
    graph.extend_from_slice(&CAPTURE_2[..6]);
    graph.push("execupdate");
    graph_promotes(
        &graph,
        &[
            "capture-begin -> 0",
            "kernel-launch 1 -> 0",
            "capture-end -> 0",
            "instantiate -> 0",
            "capture-begin -> 0",
            "kernel-launch 1 -> 0",
            "capture-end -> 0",
            "execupdate -> 0 result=0",
        ],
    );
}

/// Past the cap a tiered block is host memory; the spill limit bounds it;
/// allocations under the granularity take the ordinary path.
#[test]
fn past_the_cap_blocks_are_host_memory_within_the_spill_limit() {
    let mut env = tiered("64MiB");
    env[2] = ("VRAMCAP_SPILL_LIMIT", "32MiB");
    client(
        "procaddr",
        &env,
        &[
            "init", "alloc", "3M", "alloc", "60M", "alloc", "32M", "alloc", "2M", "alloc", "1M",
            "standin", "info",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        // 3 MiB is mapped and charged as 4 MiB (the 2 MiB granularity).
        "alloc 3M -> 0 #0",
        "alloc 60M -> 0 #1",
        "alloc 32M -> 0 #2",
        "alloc 2M -> 2",
        // 1 MiB: the ordinary path, whose spill the full spill limit refuses too.
        "alloc 1M -> 2",
        "standin dev=0 used=64M peak=64M",
        "standin dev=1 used=0 peak=0",
        "info -> 0 free=0 total=64M",
    ]);
}

/// Without tiered spill the resolver hands out the driver's own launch,
/// copy and memset functions; with it, the shim's.
#[test]
#[rustfmt::skip]
fn the_launch_hooks_are_handed_out_only_under_tiered_spill() {
    let args = [
        "resolve", "cuLaunchKernel", "4000", "1",
        "resolve", "cuMemcpyDtoDAsync", "3020", "1",
        "resolve", "cuMemsetD8Async", "3020", "1",
        "resolve", "cuMemAlloc", "3020", "0",
    ];
    client("procaddr", &[("VRAMCAP_LIMIT", "1GiB")], &args).expect_lines(&[
        "resolve cuLaunchKernel 4000 1 -> 0 status=0 lib=libcuda.so.1",
        "resolve cuMemcpyDtoDAsync 3020 1 -> 0 status=0 lib=libcuda.so.1",
        "resolve cuMemsetD8Async 3020 1 -> 0 status=0 lib=libcuda.so.1",
        "resolve cuMemAlloc 3020 0 -> 0 status=0 lib=libvramcap.so",
    ]);
    client("procaddr", &tiered("1GiB"), &args).expect_lines(&[
        "resolve cuLaunchKernel 4000 1 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemcpyDtoDAsync 3020 1 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemsetD8Async 3020 1 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemAlloc 3020 0 -> 0 status=0 lib=libvramcap.so",
    ]);
}

/// A program linked against the driver calls the shim's exported launch
/// function whatever the mode; without tiered spill it is the driver's.
#[test]
fn a_linked_launch_without_tiered_spill_is_the_drivers() {
    capped(
        "linked",
        "1GiB",
        &[
            "init",
            "alloc",
            "4M",
            "kernel",
            "touch1",
            "kernel-launch",
            "5",
            "#0",
            "kcounts",
        ],
    )
    .expect_sized(&[
        "init -> 0",
        "alloc 4M -> 0 #0",
        "kernel touch1 -> 0",
        "kernel-launch 5 -> 0",
        "kcounts launch=5 fault=0",
    ]);
}

/// The batched copy (`cuMemcpyBatchAsync`, both its CUDA 12.8 form with a
/// failure index and its 13.0 form without) is the shim's under tiered
/// spill, so that it waits for a move, and it copies what it is asked to,
/// on the host block as on the device ones (the stand-in models contents
/// for VMM mappings only: tiered blocks); without tiered spill it is the
/// driver's.
#[test]
#[rustfmt::skip]
fn the_batched_copy_passes_the_gate_in_both_its_forms() {
    let copies = [
        "init", "alloc", "32M", "alloc", "32M", "alloc", "32M",
        "memset32", "0", "32M", "5", "memset32", "2", "32M", "77",
        "batch-copy", "13000", "1", "0", "32M",
        "batch-copy", "12080", "0", "2", "32M",
    ];
    let mut args = copies.to_vec();
    args.extend(["read32", "1", "read32", "0"]);
    let allocs = [
        "init -> 0".to_string(),
        format!("alloc {} -> 0 #0", 32 * MIB),
        format!("alloc {} -> 0 #1", 32 * MIB),
        format!("alloc {} -> 0 #2", 32 * MIB),
    ];
    let lines = |lib: &str| {
        let mut l = allocs.to_vec();
        l.extend([
            "memset32 #0 -> 0".to_string(),
            "memset32 #2 -> 0".into(),
            format!("batch-copy 13000 #1 #0 -> 0 lib={lib}"),
            format!("batch-copy 12080 #0 #2 -> 0 fail=99 lib={lib}"),
        ]);
        l
    };
    let mut want = lines("libvramcap.so");
    want.extend(["read32 #1 -> 0 value=5".to_string(), "read32 #0 -> 0 value=77".into()]);
    let mut env = tiered("64MiB");
    env.push(("VRAMCAP_LOG", "info"));
    let d = client("procaddr", &env, &args);
    d.expect_lines(&want.iter().map(String::as_str).collect::<Vec<_>>());
    // The third block is past the cap: the second copy read host memory.
    assert!(d.stderr().contains("new blocks go to host memory"), "{}", d.stderr());
    let want = lines("libcuda.so.1");
    client("procaddr", &[("VRAMCAP_LIMIT", "1GiB")], &copies)
        .expect_lines(&want.iter().map(String::as_str).collect::<Vec<_>>());
}

/// The copies between arrays and device memory (`cuMemcpyAtoD`,
/// `cuMemcpyDtoA`, and their per-thread forms) and the launches of
/// parameters set beforehand (`cuLaunch`, `cuLaunchGrid`,
/// `cuLaunchGridAsync`) are the shim's under tiered spill, so that they
/// wait for a move, and reach the driver; without tiered spill they are
/// the driver's.
#[test]
#[rustfmt::skip]
fn array_copies_and_grid_launches_pass_the_gate() {
    let args = [
        "init", "alloc", "32M", "array", "1000", "64", "0x20", "4",
        "kernel", "touch1", "array-copies", "@0", "#0", "grid-launches", "kcounts",
        "resolve", "cuMemcpyAtoD", "7000", "2",
        "resolve", "cuMemcpyDtoA", "7000", "2",
    ];
    let lines = |lib: &str| {
        vec![
            "init -> 0".to_string(),
            format!("alloc {} -> 0 #0", 32 * MIB),
            "array 1000 64 0x20 4 -> 0 @0".into(),
            "kernel touch1 -> 0".into(),
            format!("array-copies @0 #0 -> atod=0 dtoa=0 lib={lib},{lib}"),
            format!("grid-launches -> 0 0 0 lib={lib},{lib},{lib}"),
            "kcounts launch=3 fault=0".into(),
            format!("resolve cuMemcpyAtoD 7000 2 -> 0 status=0 lib={lib}"),
            format!("resolve cuMemcpyDtoA 7000 2 -> 0 status=0 lib={lib}"),
        ]
    };
    let want = lines("libvramcap.so");
    client("procaddr", &tiered("64MiB"), &args)
        .expect_lines(&want.iter().map(String::as_str).collect::<Vec<_>>());
    let want = lines("libcuda.so.1");
    client("procaddr", &[("VRAMCAP_LIMIT", "1GiB")], &args)
        .expect_lines(&want.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Peer access under tiered spill: the blocks on the GPU another was given
/// access to are granted to it, those made before and after the ask, and
/// a block past the cap (host memory mapped for its GPU) too.
#[test]
fn tiered_blocks_are_granted_to_a_gpu_given_peer_access() {
    let env = tiered("64MiB");
    client(
        "procaddr",
        &env,
        &[
            "init", "ctx", "0", "alloc", "32M", "access", "0", "1", "ctx", "1", "peer", "0", "ctx",
            "0", "access", "0", "1", "alloc", "64M", "access", "1", "1", "standin",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "ctx 0 -> 0",
        "alloc 33554432 -> 0 #0",
        "access #0 dev=1 -> 0 flags=0",
        "ctx 1 -> 0",
        "peer 0 -> 0",
        "ctx 0 -> 0",
        "access #0 dev=1 -> 0 flags=3",
        "alloc 67108864 -> 0 #1",
        "access #1 dev=1 -> 0 flags=3",
        "standin dev=0 used=33554432 peak=33554432",
        "standin dev=1 used=0 peak=0",
    ]);
}
