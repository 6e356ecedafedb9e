//! Tiered spill against the fake driver: where blocks are made, how
//! launches heat them, what a round moves, and what a free settles. Rounds
//! are called directly, so nothing here waits for the background thread.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use super::*;
use crate::engine::tiered::MIN_ROUNDS;

mod handles;

const TIERED: (&str, &str) = ("VRAMCAP_SPILL", "tiered");

fn tiered(cap: &str) -> &'static Engine<Fake> {
    uncached(cap, &[TIERED])
}

fn spilled(e: &'static Engine<Fake>) -> u64 {
    e.slot(0).unwrap().spilled.load(Ordering::Relaxed)
}

/// A launch of the fake's function with one 8-byte parameter per word.
fn launch(e: &'static Engine<Fake>, words: &[u64]) -> CUresult {
    let mut vals: Vec<u64> = words.to_vec();
    let mut params: Vec<*mut c_void> = vals
        .iter_mut()
        .map(|v| std::ptr::from_mut(v).cast::<c_void>())
        .collect();
    // SAFETY: one valid pointer per parameter of the fake's function
    // `words.len()` (which has that many 8-byte parameters).
    unsafe {
        e.launched(
            words.len() as *mut c_void,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
            || CUDA_SUCCESS,
        )
    }
}

fn rounds(e: &'static Engine<Fake>, n: usize) {
    for _ in 0..n {
        e.tier_round();
    }
}

fn device_resident(e: &'static Engine<Fake>) -> u64 {
    e.driver
        .vmm
        .lock()
        .unwrap()
        .values()
        .filter(|(_, host)| !host)
        .map(|(b, _)| b)
        .sum()
}

/// What the device slot counts as reserved and as spilled, and what the
/// fake holds in device memory.
fn placed(e: &'static Engine<Fake>) -> (u64, u64, u64) {
    (used(e), spilled(e), device_resident(e))
}

/// The device's demotions and promotions so far.
fn moves(e: &'static Engine<Fake>) -> (u64, u64) {
    let s = e.slot(0).unwrap();
    (
        s.demotions.load(Ordering::Relaxed),
        s.promotions.load(Ordering::Relaxed),
    )
}

#[test]
fn within_the_cap_blocks_are_device_memory_past_it_host_memory() {
    let e = tiered("64MiB");
    let a = alloc(e, 32 * MIB).unwrap();
    assert_eq!(placed(e), (32 * MIB, 0, 32 * MIB));
    // 3 MiB is mapped and charged as 4 (the granularity is 2 MiB).
    let b = alloc(e, 3 * MIB).unwrap();
    assert_eq!(used(e), 36 * MIB);
    let c = alloc(e, 40 * MIB).unwrap();
    assert_eq!(placed(e), (36 * MIB, 40 * MIB, 36 * MIB));
    // Smaller than the granularity: the ordinary path (the driver's cuMemAlloc).
    let d = alloc(e, MIB).unwrap();
    assert_eq!(
        (used(e), e.driver.sizes.lock().unwrap().len()),
        (37 * MIB, 1)
    );
    for p in [a, b, c] {
        assert_eq!(free(e, p), CUDA_SUCCESS);
    }
    assert_eq!(free(e, d), CUDA_SUCCESS);
    assert_eq!(placed(e), (0, 0, 0));
    assert!(e.driver.vmm.lock().unwrap().is_empty());
    assert!(e.driver.maps.lock().unwrap().is_empty());
    // A second free of a tiered address is the driver's answer for an unknown one.
    assert_ne!(free(e, a), CUDA_SUCCESS);
}

#[test]
fn launches_count_uses_of_the_blocks_their_words_point_into() {
    let e = tiered("64MiB");
    let a = alloc(e, 8 * MIB).unwrap();
    assert_eq!(
        launch(e, &[a, a + 8 * MIB - 1, a + 8 * MIB, 7]),
        CUDA_SUCCESS
    );
    assert_eq!((e.tiers.launches(), e.tiers.hits()), (1, 2));
}

/// Issue 44's record (kept only while the log is at debug level): each
/// launch's kernel and blocks, by their starts, sorted, once each; nothing
/// when off.
#[test]
fn launches_are_recorded_only_when_asked() {
    let e = tiered("64MiB");
    let [a, b] = allocs(e, [8 * MIB, 8 * MIB]);
    launch(e, &[b, a]);
    assert!(e.tiers.recorded().is_empty());
    e.tiers.record(true);
    launch(e, &[b + 5, a, b, 7]);
    launch(e, &[a + 1]);
    e.tiers.record(false);
    launch(e, &[b]);
    let (lo, hi) = (a.min(b), a.max(b));
    let got: Vec<(u64, Box<[u64]>)> = e
        .tiers
        .recorded()
        .into_iter()
        .map(|l| (l.kernel, l.blocks))
        .collect();
    // The fake's function for n words is n.
    assert_eq!(
        got,
        [
            (4, vec![lo, hi].into_boxed_slice()),
            (1, vec![a].into_boxed_slice())
        ]
    );
}

#[test]
fn a_use_by_a_matrix_product_weighs_more() {
    let e = tiered("64MiB");
    let [a, b] = allocs(e, [8 * MIB, 8 * MIB]);
    launch(e, &[a, b]); // an element-wise kernel
    launch(e, &[a, 0, 0, 0, 0, 0, 0]); // function 7: a matrix product
    assert_eq!(e.tiers.heat_of(a), Some(1 + 32));
    assert_eq!(e.tiers.heat_of(b), Some(1));
}

/// Gives the fake driver's `graph` these kernel nodes (function, parameter
/// words), then instantiates it as [`instantiate`] does.
fn graph_of(
    e: &'static Engine<Fake>,
    graph: usize,
    handle: usize,
    nodes: Vec<KernelNode>,
) -> CUgraphExec {
    e.driver.graphs.lock().unwrap().insert(graph, nodes);
    instantiate(e, graph, handle)
}

/// `cuGraphInstantiateWithFlags` of `graph` through the engine: the
/// executable graph's handle.
fn instantiate(e: &'static Engine<Fake>, graph: usize, handle: usize) -> CUgraphExec {
    let mut exec: CUgraphExec = std::ptr::null_mut();
    let out: *mut CUgraphExec = &mut exec;
    let real = || {
        // SAFETY: `out` points at `exec`, alive for this call.
        unsafe { *out = handle as CUgraphExec };
        CUDA_SUCCESS
    };
    assert_eq!(
        e.graph_instantiate_with_flags(real, out, graph as CUgraph, 0),
        CUDA_SUCCESS
    );
    exec
}

fn graph_launch(e: &'static Engine<Fake>, exec: CUgraphExec) -> CUresult {
    e.graph_launch(Flavour::Legacy, || CUDA_SUCCESS, exec, std::ptr::null_mut())
}

#[test]
fn a_graph_launch_counts_the_uses_its_kernel_nodes_make() {
    let e = tiered("64MiB");
    let [a, b] = allocs(e, [8 * MIB, 8 * MIB]);
    // Function N has N 8-byte parameters; 7 is a matrix product. Two
    // nodes name `a` at its start (one entry, weight 2), a product names
    // it 1 MiB in; words outside every block (0, 7) are left out.
    let exec = graph_of(
        e,
        0x50,
        0x5000,
        vec![
            (2, vec![a, b]),
            (1, vec![a]),
            (7, vec![a + MIB, 0, 0, 0, 0, 0, 7]),
        ],
    );
    // Instantiating is no use.
    assert_eq!(e.tiers.heat_of(a), Some(0));
    for _ in 0..3 {
        assert_eq!(graph_launch(e, exec), CUDA_SUCCESS);
    }
    assert_eq!(e.tiers.heat_of(a), Some(3 * (2 + 32)));
    assert_eq!(e.tiers.heat_of(b), Some(3));
    // Each launch: three kernels for the scores' clock, three entries hit.
    assert_eq!((e.tiers.launches(), e.tiers.hits()), (9, 9));
    // An upload runs no kernel.
    assert_eq!(
        e.graph_upload(Flavour::Legacy, || CUDA_SUCCESS, exec, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    assert_eq!(e.tiers.heat_of(b), Some(3));
    // Destroyed: its handle may come back for another graph.
    assert_eq!(e.graph_exec_destroy(|| CUDA_SUCCESS, exec), CUDA_SUCCESS);
    assert_eq!(graph_launch(e, exec), CUDA_SUCCESS);
    assert_eq!(e.tiers.heat_of(b), Some(3));
    assert_eq!(e.tiers.launches(), 9);
}

#[test]
fn a_failed_destroy_keeps_the_graphs_uses_and_no_block_means_no_walk() {
    let e = tiered("64MiB");
    // Before any tiered block the graph is not walked.
    let early = graph_of(e, 0x80, 0x8000, vec![(1, vec![0])]);
    assert_eq!(e.driver.graph_walks.load(Ordering::SeqCst), 0);
    assert_eq!(graph_launch(e, early), CUDA_SUCCESS);
    assert_eq!(e.tiers.launches(), 0);
    let a = alloc(e, 8 * MIB).unwrap();
    let exec = graph_of(e, 0x81, 0x8100, vec![(1, vec![a])]);
    assert_eq!(
        e.graph_exec_destroy(|| CUDA_ERROR_INVALID_VALUE, exec),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(graph_launch(e, exec), CUDA_SUCCESS);
    assert_eq!(e.tiers.heat_of(a), Some(1));
}

/// `cuGraphExecUpdate`'s answer when the update was not possible.
const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;

#[test]
fn an_updated_graph_counts_its_new_uses_and_a_changed_node_none() {
    let e = tiered("64MiB");
    let [a, b] = allocs(e, [8 * MIB, 8 * MIB]);
    {
        let mut g = e.driver.graphs.lock().unwrap();
        g.insert(0x90, vec![(1, vec![a])]);
        g.insert(0x91, vec![(1, vec![b])]);
    }
    let exec = instantiate(e, 0x90, 0x9000);
    // A failed update changes nothing.
    let no = e.graph_exec_update_v2(
        || CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
        exec,
        0x91 as CUgraph,
        std::ptr::null_mut(),
    );
    assert_eq!(no, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    graph_launch(e, exec);
    assert_eq!((e.tiers.heat_of(a), e.tiers.heat_of(b)), (Some(1), Some(0)));
    // Updated to follow 0x91: its launches use b.
    let rc = e.graph_exec_update_v2(|| CUDA_SUCCESS, exec, 0x91 as CUgraph, std::ptr::null_mut());
    assert_eq!(rc, CUDA_SUCCESS);
    graph_launch(e, exec);
    assert_eq!((e.tiers.heat_of(a), e.tiers.heat_of(b)), (Some(1), Some(1)));
    // A node changed in place: no uses at all from then on (not the old ones).
    let node = std::ptr::null_mut();
    assert_eq!(
        e.graph_exec_node_set(|| CUDA_ERROR_INVALID_VALUE, exec, node, std::ptr::null()),
        CUDA_ERROR_INVALID_VALUE
    );
    graph_launch(e, exec);
    assert_eq!(e.tiers.heat_of(b), Some(2));
    assert_eq!(
        e.graph_exec_node_set(|| CUDA_SUCCESS, exec, node, std::ptr::null()),
        CUDA_SUCCESS
    );
    graph_launch(e, exec);
    assert_eq!((e.tiers.heat_of(a), e.tiers.heat_of(b)), (Some(1), Some(2)));
    // cuGraphExecNodeSetParams of another kind of node changes nothing.
    e.graph_exec_update_v2(|| CUDA_SUCCESS, exec, 0x91 as CUgraph, std::ptr::null_mut());
    let mut memset_node: [c_int; 32] = [0; 32];
    memset_node[0] = 2; // CU_GRAPH_NODE_TYPE_MEMSET
    // SAFETY: a whole CUgraphNodeParams-sized buffer, its type first.
    let rc = unsafe {
        e.graph_exec_node_set_any(|| CUDA_SUCCESS, exec, node, memset_node.as_mut_ptr().cast())
    };
    assert_eq!(rc, CUDA_SUCCESS);
    graph_launch(e, exec);
    assert_eq!(e.tiers.heat_of(b), Some(3));
}

/// A host block that only a graph's kernels use heats as a launched one
/// does, and is promoted after colder blocks make room.
#[test]
fn a_block_used_only_by_a_graph_is_promoted() {
    let e = tiered("64MiB");
    let [a, _b, c] = allocs(e, [32 * MIB, 16 * MIB, 32 * MIB]); // c is past the cap: on the host
    assert_eq!((used(e), spilled(e)), (48 * MIB, 32 * MIB));
    let exec = graph_of(e, 0x60, 0x6000, vec![(2, vec![c, c + 64])]);
    launch(e, &[a]);
    for _ in 0..50 {
        assert_eq!(graph_launch(e, exec), CUDA_SUCCESS);
    }
    rounds(e, MIN_ROUNDS as usize);
    assert_eq!(moves(e), (2, 1));
    assert_eq!(placed(e), (32 * MIB, 48 * MIB, 32 * MIB));
}

#[test]
fn without_tiered_spill_graphs_are_not_walked() {
    let e = uncached("64MiB", &[]);
    let a = alloc(e, 8 * MIB).unwrap();
    let exec = graph_of(e, 0x70, 0x7000, vec![(1, vec![a])]);
    assert_eq!(graph_launch(e, exec), CUDA_SUCCESS);
    assert_eq!(e.driver.graph_walks.load(Ordering::SeqCst), 0);
    assert_eq!((e.tiers.launches(), e.tiers.hits()), (0, 0));
}

#[test]
fn a_hot_host_block_is_promoted_after_colder_ones_make_room() {
    let e = tiered("64MiB");
    let [a, b, c] = allocs(e, [32 * MIB, 16 * MIB, 32 * MIB]); // c is past the cap: on the host
    assert_eq!((used(e), spilled(e)), (48 * MIB, 32 * MIB));
    launch(e, &[a]);
    for _ in 0..50 {
        launch(e, &[c, c + 64]);
    }
    // Fresh blocks stay put for MIN_ROUNDS rounds.
    rounds(e, MIN_ROUNDS as usize - 1);
    assert_eq!(e.driver.copies.load(Ordering::SeqCst), 0);
    rounds(e, 1);
    // b and a were demoted (coldest first, until c fits), then c promoted.
    let s = e.slot(0).unwrap();
    assert_eq!(moves(e), (2, 1));
    assert_eq!(s.moved_bytes.load(Ordering::Relaxed), 80 * MIB);
    assert_eq!(placed(e), (32 * MIB, 48 * MIB, 32 * MIB));
    assert_eq!(e.driver.copies.load(Ordering::SeqCst), 3);
    // The device never held more than the cap, even while moving.
    assert!(e.driver.peak.load(Ordering::SeqCst) <= 64 * MIB);
    // Addresses never change: every block is still mapped where it was.
    let maps = e.driver.maps.lock().unwrap().clone();
    for p in [a, b, c] {
        let h = maps[&p];
        assert!(e.driver.vmm.lock().unwrap().contains_key(&h));
    }
    assert_eq!(maps.len(), 3, "no scratch mapping is left behind");
    // Frees settle by where the block is now.
    assert_eq!(free(e, c), CUDA_SUCCESS);
    assert_eq!((used(e), spilled(e)), (0, 48 * MIB));
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(placed(e), (0, 0, 0));
}

/// Promotions fill the room under the cap to within `PROMOTE_MARGIN`: a
/// margin of 1/64 of a 1 GiB cap (the first cut's) would leave the 12 MiB
/// block on the host for good, with 16 MiB free under the cap.
#[test]
fn promotions_fill_the_cap_to_within_the_margin() {
    use crate::engine::tiered::PROMOTE_MARGIN;
    let e = tiered("1GiB");
    let [a, b, h] = allocs(e, [1000 * MIB, 20 * MIB, 12 * MIB]); // with h 1032 MiB: past the cap
    assert_eq!((used(e), spilled(e)), (1020 * MIB, 12 * MIB));
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert!(1024 * MIB - used(e) - PROMOTE_MARGIN >= 12 * MIB);
    assert!(1024 * MIB - used(e) - 1024 * MIB / 64 < 12 * MIB);
    // Both as hot, so no swap: only the free room can take h.
    for _ in 0..MIN_ROUNDS {
        for _ in 0..50 {
            launch(e, &[a, h]);
        }
        rounds(e, 1);
    }
    assert_eq!(moves(e), (0, 1));
    assert_eq!(placed(e), (1012 * MIB, 0, 1012 * MIB));
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, h), CUDA_SUCCESS);
    assert_eq!((used(e), spilled(e)), (0, 0));
}

#[test]
fn nothing_moves_while_a_capture_runs() {
    let e = tiered("64MiB");
    let [_a, c] = allocs(e, [48 * MIB, 32 * MIB]);
    for _ in 0..50 {
        launch(e, &[c]);
    }
    e.accounting.capture_began();
    rounds(e, 10);
    assert_eq!(e.driver.copies.load(Ordering::SeqCst), 0);
    e.accounting.capture_ended();
    // Rounds skipped during the capture did not count towards MIN_ROUNDS.
    rounds(e, MIN_ROUNDS as usize - 1);
    assert_eq!(e.slot(0).unwrap().promotions.load(Ordering::Relaxed), 0);
    rounds(e, 1);
    assert_eq!(e.slot(0).unwrap().promotions.load(Ordering::Relaxed), 1);
}

#[test]
fn the_spill_limit_bounds_host_blocks() {
    let e = engine(&[
        ("VRAMCAP_LIMIT", "32MiB"),
        TIERED,
        ("VRAMCAP_SPILL_LIMIT", "16MiB"),
    ]);
    let [_a, _b] = allocs(e, [32 * MIB, 16 * MIB]);
    assert_eq!(alloc(e, 2 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(e.slot(0).unwrap().refusals.load(Ordering::Relaxed), 1);
}

#[test]
fn a_stream_ordered_free_of_a_tiered_block_waits_for_its_stream() {
    let e = tiered("64MiB");
    let a = alloc(e, 32 * MIB).unwrap();
    let rc = e.mem_free_async(Flavour::Legacy, || CUDA_SUCCESS, a, std::ptr::null_mut());
    assert_eq!(rc, CUDA_SUCCESS);
    // The fake's events complete at once: the next reap frees it.
    e.spill.reap(e.driver, &e.accounting);
    assert_eq!((used(e), device_resident(e)), (0, 0));
    assert!(e.driver.maps.lock().unwrap().is_empty());
}

#[test]
fn without_tiered_spill_launches_are_not_decoded() {
    let e = engine(&[("VRAMCAP_LIMIT", "64MiB")]);
    let a = alloc(e, 8 * MIB).unwrap();
    assert_eq!(launch(e, &[a]), CUDA_SUCCESS);
    assert_eq!(e.tiers.launches(), 0);
}

#[test]
fn a_free_waits_for_the_gpu_as_the_drivers_does() {
    let e = tiered("64MiB");
    let a = alloc(e, 8 * MIB).unwrap();
    let before = e.driver.syncs.load(Ordering::SeqCst);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(e.driver.syncs.load(Ordering::SeqCst), before + 1);
    assert!(e.driver.maps.lock().unwrap().is_empty());
}

#[test]
fn a_free_during_a_capture_is_left_to_the_next_round() {
    let e = tiered("64MiB");
    let a = alloc(e, 8 * MIB).unwrap();
    e.accounting.capture_began();
    let before = e.driver.syncs.load(Ordering::SeqCst);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    // No synchronisation, nothing released yet; the bytes still count.
    assert_eq!(e.driver.syncs.load(Ordering::SeqCst), before);
    assert_eq!((e.driver.maps.lock().unwrap().len(), used(e)), (1, 8 * MIB));
    rounds(e, 1);
    assert_eq!(
        e.driver.maps.lock().unwrap().len(),
        1,
        "not during the capture"
    );
    e.accounting.capture_ended();
    rounds(e, 1);
    assert_eq!((e.driver.maps.lock().unwrap().len(), used(e)), (0, 0));
    assert!(e.driver.vmm.lock().unwrap().is_empty());
}

#[test]
fn a_context_that_goes_away_takes_its_blocks_memory_with_it() {
    let e = tiered("64MiB");
    let [_a, _b] = allocs(e, [32 * MIB, 48 * MIB]); // _b: on the host
    assert_eq!(
        e.ctx_destroy(|| CUDA_SUCCESS, CTX as CUcontext),
        CUDA_SUCCESS
    );
    // VMM memory outlives its context: the shim released it.
    assert!(e.driver.maps.lock().unwrap().is_empty());
    assert!(e.driver.vmm.lock().unwrap().is_empty());
    assert_eq!((used(e), spilled(e)), (0, 0));
}

#[test]
fn above_the_soft_limit_new_blocks_start_on_the_host() {
    let e = uncached("64MiB", &[("VRAMCAP_SOFT_LIMIT", "32MiB"), TIERED]);
    let [_a, _b] = allocs(e, [24 * MIB, 16 * MIB]);
    assert_eq!((used(e), spilled(e)), (24 * MIB, 16 * MIB));
    // A round finds nothing to correct.
    rounds(e, MIN_ROUNDS as usize + 1);
    assert_eq!(e.driver.copies.load(Ordering::SeqCst), 0);
}

#[test]
fn a_tiered_address_gives_no_allocation_handle() {
    let e = tiered("64MiB");
    let a = alloc(e, 8 * MIB).unwrap();
    let mut h: CUmemGenericAllocationHandle = 0;
    // SAFETY: a writable handle; the address is passed as a value.
    let rc = unsafe {
        e.mem_retain_allocation_handle(|| CUDA_SUCCESS, &mut h, (a + 4096) as *mut c_void)
    };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
}

/// Waits until no round's synchronisation thread is left in the driver.
fn drained(e: &'static Engine<Fake>) {
    while e.tiers.syncing() {
        std::thread::yield_now();
    }
}

/// The GPU's queue takes 200 ms to drain, ten times the first wait: the
/// first stop gives up without a pause, the wait then follows what the
/// drain took, and the next round makes the move. (Before issue 32 the
/// wait only doubled, and the round number, which paused rounds do not
/// advance, kept moves paused for good after the first give-up.)
#[test]
fn a_long_first_drain_is_learnt_without_a_pause() {
    use std::time::Duration;
    let e = tiered("64MiB");
    e.tiers.set_base_wait(Duration::from_millis(20));
    let [_a, c] = allocs(e, [48 * MIB, 32 * MIB]);
    for _ in 0..50 {
        launch(e, &[c]);
    }
    let syncs = e.driver.syncs.load(Ordering::SeqCst);
    e.driver.sync_us.store(200_000, Ordering::SeqCst);
    rounds(e, MIN_ROUNDS as usize);
    assert_eq!(moves(e), (0, 0), "the first wait gives up");
    drained(e);
    // Twice the 200 ms drain; each later (short) drain a round started
    // after it, which a loaded machine allows, takes 1/16 off the figure.
    let later = e.driver.syncs.load(Ordering::SeqCst) - syncs - 1;
    let want = (0..later).fold(400_000u64, |w, _| w - w / 16);
    assert!(
        e.tiers.sync_wait() >= Duration::from_micros(want),
        "the wait follows the drain: {:?}, {later} later drains",
        e.tiers.sync_wait()
    );
    rounds(e, 1);
    assert_eq!(moves(e), (1, 1), "the next round moves");
}

/// Three give-ups in a row stop moves for good; a wait that ends in time
/// starts the count again.
#[test]
fn three_give_ups_in_a_row_stop_moves_and_one_in_time_forgives() {
    use crate::engine::tiered::STALL_ROUNDS;
    let e = tiered("64MiB");
    assert!(!e.tiers.stall());
    assert!(!e.tiers.stall());
    e.tiers.quiesced();
    assert!(!e.tiers.stall());
    assert!(!e.tiers.stall());
    for _ in 0..STALL_ROUNDS {
        assert!(e.tiers.paused());
    }
    assert!(!e.tiers.paused(), "a pause ends");
    assert!(e.tiers.stall(), "the third in a row");
    for _ in 0..10 * STALL_ROUNDS {
        assert!(e.tiers.paused());
    }
}

/// Parking's host pages (`tiered/pages.rs`): each area starts on a huge
/// page, is resident and zeroed (every base page written by the making
/// threads), pinned through the driver, and given back whole.
#[test]
fn park_pages_are_aligned_resident_and_given_back() {
    use crate::engine::tiered::pages;
    let f = Fake::default();
    // More areas than one thread takes: each answer in its area's place.
    let sizes = [4 * MIB, 6 * MIB, 2 * MIB, 8 * MIB, 2 * MIB];
    let made = pages::make_all(&f, &sizes.map(|b| (b, 1)));
    assert_eq!(made.len(), sizes.len());
    for (p, bytes) in made.into_iter().zip(sizes) {
        let p = p.expect("made");
        assert_eq!(p.bytes, bytes);
        assert_eq!(p.host % (2 << 20), 0);
        assert_eq!(
            p.dev,
            p.host as u64 | 0x1_0000_0000_0000,
            "the driver's device address"
        );
        // SAFETY: the mapping of `p.bytes` at `p.host` made above.
        let bytes = unsafe { std::slice::from_raw_parts(p.host as *const u8, p.bytes as usize) };
        assert!(bytes.iter().step_by(4096).all(|&b| b == 0));
        pages::free(&f, p);
    }
}
