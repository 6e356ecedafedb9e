//! Unit tests of the engine against a fake driver: the reservation under
//! the cap (threads included), the cache's synchronisation tickets, VMM
//! reference counts, settling to the size the driver chose, spill and the
//! memory-info formula, the check that every key of the limit names a GPU,
//! and the rule that a group only makes a member's cap stricter. Each test
//! makes its own engine (statistics off: the page lives in private memory;
//! group tests use a directory of their own for the group file).

use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::engine::accounting::capped_info;
use crate::engine::driver::{Driver, Flavour};
use crate::engine::{Engine, Made};
use crate::ffi::*;

mod fake;
mod frees;
mod held;
mod limits;
mod park;
mod tiered;

use self::fake::*;

/// The freed-block cache off: every free reaches the fake.
const NO_CACHE: (&str, &str) = ("VRAMCAP_CACHE", "off");

/// [`engine`] capped at `cap` with [`NO_CACHE`], and `more` settings.
fn uncached(cap: &str, more: &[(&str, &str)]) -> &'static Engine<Fake> {
    let mut vars = vec![("VRAMCAP_LIMIT", cap), NO_CACHE];
    vars.extend_from_slice(more);
    engine(&vars)
}

/// `cuMemAlloc_v2` through the engine, the fake playing the driver.
fn alloc(e: &'static Engine<Fake>, bytes: u64) -> Result<u64, CUresult> {
    let real = || Ok(Made::at(e.driver.alloc(bytes)));
    e.mem_alloc(real, bytes).map(|m| m.ptr)
}

/// [`alloc`] of each size in turn, each of which must succeed.
fn allocs<const N: usize>(e: &'static Engine<Fake>, sizes: [u64; N]) -> [u64; N] {
    sizes.map(|bytes| alloc(e, bytes).unwrap())
}

fn free(e: &'static Engine<Fake>, ptr: u64) -> CUresult {
    e.mem_free(|| e.driver.mem_free(ptr), ptr)
}

fn used(e: &'static Engine<Fake>) -> u64 {
    e.slot(0).unwrap().budget.used()
}

#[test]
fn the_cap_refuses_exactly_past_it_and_frees_give_back() {
    let e = uncached("1GiB", &[]);
    let a = alloc(e, 768 * MIB).unwrap();
    assert_eq!(alloc(e, 257 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let b = alloc(e, 256 * MIB).unwrap();
    assert_eq!(used(e), GIB);
    assert_eq!(alloc(e, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let s = e.slot(0).unwrap();
    assert_eq!(s.refusals.load(Ordering::Relaxed), 2);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 0);
    assert_eq!(s.allocs.load(Ordering::Relaxed), 2);
    assert_eq!(s.frees.load(Ordering::Relaxed), 2);
}

#[test]
fn racing_threads_never_hold_more_than_the_cap() {
    let e = uncached("100MiB", &[]);
    let granted = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let granted = &granted;
            scope.spawn(move || {
                for i in 0..400u64 {
                    let bytes = (1 + (t * 7 + i * 13) % 9) * MIB;
                    if let Ok(p) = alloc(e, bytes) {
                        granted.fetch_add(1, Ordering::Relaxed);
                        assert_eq!(free(e, p), CUDA_SUCCESS);
                    }
                }
            });
        }
    });
    // The driver never held more than the cap at any moment; everything
    // came back; every attempt was either granted or counted as refused.
    assert!(e.driver.peak.load(Ordering::SeqCst) <= 100 * MIB);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 0);
    assert_eq!(used(e), 0);
    let s = e.slot(0).unwrap();
    let refused = s.refusals.load(Ordering::Relaxed) as usize;
    assert_eq!(granted.load(Ordering::Relaxed) + refused, 8 * 400);
    assert!(s.budget.peak() <= 100 * MIB);
}

/// With only blocking streams a reuse is ordered with an event on the
/// legacy stream (no wait); once a non-blocking stream was asked for, it
/// waits for a synchronisation. Either way once per burst.
#[test]
fn one_ordering_makes_every_block_freed_before_it_safe() {
    for nonblocking in [false, true] {
        let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
        let flags = c_uint::from(nonblocking);
        assert_eq!(
            e.stream_create(|| CUDA_SUCCESS, std::ptr::null_mut(), flags),
            CUDA_SUCCESS
        );
        let (waits, ordered) = (&e.driver.syncs, &e.driver.legacy_records);
        let (way, other) = if nonblocking {
            (waits, ordered)
        } else {
            (ordered, waits)
        };
        reuse_once_per_burst(e, way);
        assert_eq!(other.load(Ordering::SeqCst), 0);
        let s = e.slot(0).unwrap();
        let counted = if nonblocking {
            &s.cache_waits
        } else {
            &s.cache_ordered
        };
        assert_eq!(counted.load(Ordering::Relaxed), 2);
    }
}

/// A context destroyed through a call the hooks do not see, and a new one
/// at the same address (another `cuCtxGetId`): the old event's handle is
/// never recorded again; the new context gets its own.
#[test]
fn a_new_context_at_the_same_address_gets_its_own_event() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let reuse = || {
        let a = alloc(e, 8 * MIB).unwrap();
        assert_eq!(free(e, a), CUDA_SUCCESS);
        let b = alloc(e, 8 * MIB).unwrap();
        assert_eq!(b, a, "the cached block");
        assert_eq!(free(e, b), CUDA_SUCCESS);
    };
    reuse();
    assert_eq!(e.driver.last_recorded.load(Ordering::SeqCst), 0x1000);
    reuse();
    assert_eq!(e.driver.events_created.load(Ordering::SeqCst), 1);
    e.driver.ctx_id.store(7, Ordering::SeqCst);
    reuse();
    assert_eq!(e.driver.last_recorded.load(Ordering::SeqCst), 0x1001);
    assert_eq!(e.driver.events_created.load(Ordering::SeqCst), 2);
    reuse();
    assert_eq!(e.driver.events_created.load(Ordering::SeqCst), 2);
    assert_eq!(e.driver.last_recorded.load(Ordering::SeqCst), 0x1001);
}

/// A non-blocking stream asked for after an ordering waits for it first:
/// the block that ordering made safe is then handed out without another.
#[test]
fn a_late_non_blocking_stream_waits_for_the_orderings_made() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let [a, b] = allocs(e, [8 * MIB, 8 * MIB]);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    let _c = alloc(e, 8 * MIB).unwrap();
    assert_eq!(e.driver.legacy_records.load(Ordering::SeqCst), 1);
    assert_eq!(e.driver.event_syncs.load(Ordering::SeqCst), 0);
    assert_eq!(
        e.stream_create(|| CUDA_SUCCESS, std::ptr::null_mut(), 1),
        CUDA_SUCCESS
    );
    assert_eq!(e.driver.event_syncs.load(Ordering::SeqCst), 1);
    let _d = alloc(e, 8 * MIB).unwrap();
    assert_eq!(e.driver.syncs.load(Ordering::SeqCst), 0);
    // A second non-blocking stream changes nothing more.
    assert_eq!(
        e.stream_create(|| CUDA_SUCCESS, std::ptr::null_mut(), 1),
        CUDA_SUCCESS
    );
    assert_eq!(e.driver.event_syncs.load(Ordering::SeqCst), 1);
    let s = e.slot(0).unwrap();
    assert_eq!(s.cache_waits.load(Ordering::Relaxed), 1);
    assert_eq!(s.cache_ordered.load(Ordering::Relaxed), 1);
}

fn reuse_once_per_burst(e: &'static Engine<Fake>, syncs: &AtomicUsize) {
    let [a, b] = allocs(e, [8 * MIB, 8 * MIB]);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    // Both kept: no driver free, still counted.
    assert_eq!(e.driver.frees.load(Ordering::SeqCst), 0);
    assert_eq!(used(e), 16 * MIB);
    assert_eq!(e.slot(0).unwrap().cached.load(Ordering::Relaxed), 16 * MIB);
    // The first reuse must be made safe from work that may still use the
    // block...
    let c = alloc(e, 8 * MIB).unwrap();
    assert_eq!(syncs.load(Ordering::SeqCst), 1);
    // ...and that covers the other block too.
    let d = alloc(e, 8 * MIB).unwrap();
    assert_eq!(syncs.load(Ordering::SeqCst), 1);
    let mut got = [c, d];
    got.sort();
    let mut want = [a, b];
    want.sort();
    assert_eq!(got, want);
    // A block freed after that needs another.
    assert_eq!(free(e, c), CUDA_SUCCESS);
    assert_eq!(alloc(e, 8 * MIB).unwrap(), c);
    assert_eq!(syncs.load(Ordering::SeqCst), 2);
    let s = e.slot(0).unwrap();
    assert_eq!(s.cache_hits.load(Ordering::Relaxed), 3);
    assert_eq!(s.cached.load(Ordering::Relaxed), 0);
    assert_eq!(used(e), 16 * MIB);
}

#[test]
fn while_a_capture_runs_the_cache_neither_synchronises_nor_keeps() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let a = alloc(e, 8 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS); // kept, not yet safe
    assert_eq!(
        e.begin_capture(|| CUDA_SUCCESS, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    let b = alloc(e, 8 * MIB).unwrap();
    assert_ne!(b, a, "an unsafe block is not handed out during a capture");
    assert_eq!(e.driver.syncs.load(Ordering::SeqCst), 0);
    assert_eq!(e.driver.legacy_records.load(Ordering::SeqCst), 0);
    // A free during the capture goes to the driver: keeping could evict.
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(e.driver.frees.load(Ordering::SeqCst), 1);
    let stream = 0x77;
    assert_eq!(
        e.end_capture(
            Flavour::Legacy,
            || CUDA_SUCCESS,
            stream as CUstream,
            std::ptr::null_mut()
        ),
        CUDA_SUCCESS
    );
    assert!(!e.accounting.capturing());
    assert_eq!(alloc(e, 8 * MIB).unwrap(), a);
    assert_eq!(e.driver.legacy_records.load(Ordering::SeqCst), 1);
}

#[test]
fn a_full_cap_releases_cached_blocks_before_refusing() {
    let e = engine(&[("VRAMCAP_LIMIT", "64MiB")]);
    let a = alloc(e, 48 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
    // 48 MiB cached; 32 MiB fits only once the cache gives the block back.
    let b = alloc(e, 32 * MIB).unwrap();
    assert_ne!(b, a);
    let s = e.slot(0).unwrap();
    assert_eq!(s.evictions.load(Ordering::Relaxed), 1);
    assert_eq!(s.cached.load(Ordering::Relaxed), 0);
    assert_eq!(used(e), 32 * MIB);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 32 * MIB);
}

#[test]
fn vmm_bytes_come_back_with_the_last_reference_or_mapping() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let prop = CUmemAllocationProp {
        kind: 1,
        handle_types: 0,
        location: CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
    };
    let mut h: CUmemGenericAllocationHandle = 0;
    let out: *mut u64 = &mut h;
    let real = || {
        // SAFETY: `out` points at `h`.
        unsafe { *out = 0xabc };
        CUDA_SUCCESS
    };
    // SAFETY: valid out-pointer and properties.
    let rc = unsafe { e.mem_create(real, out, (256 * MIB) as usize, &prop, 0) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(used(e), 256 * MIB);
    let mut again: u64 = 0;
    let again_out: *mut u64 = &mut again;
    let retain = || {
        // SAFETY: `again_out` points at `again`.
        unsafe { *again_out = 0xabc };
        CUDA_SUCCESS
    };
    // SAFETY: valid out-pointer.
    let rc = unsafe { e.mem_retain_allocation_handle(retain, again_out, std::ptr::null_mut()) };
    assert_eq!(rc, CUDA_SUCCESS);
    let ok = || CUDA_SUCCESS;
    assert_eq!(
        e.mem_map(ok, 0x9000_0000, (256 * MIB) as usize, 0, 0xabc, 0),
        CUDA_SUCCESS
    );
    assert_eq!(e.mem_release(ok, 0xabc), CUDA_SUCCESS);
    assert_eq!(e.mem_release(ok, 0xabc), CUDA_SUCCESS);
    // Both handles released, but the mapping still holds the memory.
    assert_eq!(used(e), 256 * MIB);
    assert_eq!(
        e.mem_unmap(ok, 0x9000_0000, (256 * MIB) as usize),
        CUDA_SUCCESS
    );
    assert_eq!(used(e), 0);
    // A handle the engine never counted changes nothing.
    assert_eq!(e.mem_release(ok, 0xdef), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    assert_eq!(e.slot(0).unwrap().frees.load(Ordering::Relaxed), 1);
}

#[test]
fn a_pitch_wider_than_the_estimate_is_settled_or_refused() {
    let e = uncached("1GiB", &[]);
    let pitched = |width: usize, height: usize, driver_pitch: usize| {
        let real = || {
            Ok(Made {
                ptr: e.driver.alloc((driver_pitch * height) as u64),
                pitch: driver_pitch as u64,
            })
        };
        match e.mem_alloc_pitch(real, width as u64, height as u64, 4) {
            Ok(m) => (CUDA_SUCCESS, m.ptr, m.pitch as usize),
            Err(rc) => (rc, 0, 0),
        }
    };
    // Estimated at 512 × 1 Mi rows = 512 MiB; the driver picks 768.
    let (rc, p, pitch) = pitched(500, 1 << 20, 768);
    assert_eq!((rc, pitch), (CUDA_SUCCESS, 768));
    assert_eq!(used(e), 768 * MIB);
    // Estimated at 256 MiB, which fits; the driver's 512 MiB does not:
    // refused, and what the driver gave is freed again.
    let (rc, _, _) = pitched(500, 1 << 19, 1024);
    assert_eq!(rc, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(used(e), 768 * MIB);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 768 * MIB);
    assert_eq!(free(e, p), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

#[test]
fn past_the_cap_host_spill_places_and_frees_outside_the_budget() {
    let e = uncached("1GiB", &[("VRAMCAP_SPILL", "host")]);
    let [a, b] = allocs(e, [GIB, 256 * MIB]);
    assert_eq!(
        b & 0x1_0000_0000_0000,
        0x1_0000_0000_0000,
        "a mapped host address"
    );
    let s = e.slot(0).unwrap();
    assert_eq!(used(e), GIB);
    assert_eq!(s.spilled.load(Ordering::Relaxed), 256 * MIB);
    assert_eq!(s.spill_allocs.load(Ordering::Relaxed), 1);
    assert_eq!(s.refusals.load(Ordering::Relaxed), 0);
    assert_eq!(free(e, b), CUDA_SUCCESS);
    assert_eq!(s.spilled.load(Ordering::Relaxed), 0);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

#[test]
fn memory_info_is_the_cap_picture() {
    let nocap = u64::MAX;
    // Capped: total is the cap; free is what is left under it, cached
    // blocks counted as free.
    assert_eq!(
        capped_info(140 * GIB, 139 * GIB, 4 * GIB, 0, 0),
        (4 * GIB, 4 * GIB)
    );
    assert_eq!(
        capped_info(140 * GIB, 139 * GIB, 4 * GIB, 3 * GIB, GIB),
        (4 * GIB, 2 * GIB)
    );
    // The device's own free memory still bounds it.
    assert_eq!(
        capped_info(140 * GIB, GIB / 2, 4 * GIB, 0, 0),
        (4 * GIB, GIB / 2)
    );
    // A cap larger than the device reports the device.
    assert_eq!(capped_info(2 * GIB, GIB, 4 * GIB, 5 * GIB, 0), (2 * GIB, 0));
    // No cap: the driver's figures, cached blocks counted as free.
    assert_eq!(
        capped_info(16 * GIB, 10 * GIB, nocap, 0, GIB),
        (16 * GIB, 11 * GIB)
    );
    assert_eq!(
        capped_info(16 * GIB, 16 * GIB, nocap, 0, GIB),
        (16 * GIB, 16 * GIB)
    );
}
