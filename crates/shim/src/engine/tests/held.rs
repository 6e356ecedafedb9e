//! What a process holds beyond its allocations (`held.rs`): pools charged
//! by their reserve and trimmed before a refusal, the context measured
//! through NVML or set, and what `cuMemGetInfo` says of both.

use super::*;

/// `cuMemAllocAsync` of `bytes` from the fake's pool: it reuses its free
/// reserve, else grows by the rest rounded to 2 MiB.
fn alloc_async(e: &'static Engine<Fake>, bytes: u64) -> Result<u64, CUresult> {
    let real = || {
        let mut pool = e.driver.pool.lock().unwrap();
        let free = pool.0 - pool.1;
        if bytes > free {
            pool.0 += (bytes - free).next_multiple_of(2 * MIB);
        }
        pool.1 += bytes;
        Ok(Made::at(0x9000_0000_0000 + pool.1))
    };
    // The stream is only compared.
    e.mem_alloc_async(Flavour::Legacy, real, bytes as usize, std::ptr::null_mut())
        .map(|m| m.ptr)
}

fn free_async(e: &'static Engine<Fake>, ptr: u64, bytes: u64) -> CUresult {
    let real = || {
        e.driver.pool.lock().unwrap().1 -= bytes;
        CUDA_SUCCESS
    };
    e.mem_free_async(Flavour::Legacy, real, ptr, std::ptr::null_mut())
}

/// What a synchronisation does to the fake's pool: trim to the threshold.
fn synchronise(e: &'static Engine<Fake>) {
    let mut pool = e.driver.pool.lock().unwrap();
    pool.0 = pool.0.min(pool.1.max(pool.2));
}

fn info(e: &'static Engine<Fake>) -> (u64, u64) {
    e.mem_info(16 * GIB, 16 * GIB)
        .unwrap_or((16 * GIB, 16 * GIB))
}

/// The scenario: a pool that keeps what was freed (threshold
/// past anything) is charged for it; a plain allocation that needs it is
/// refused until the program trims the pool, then fits.
#[test]
fn a_pool_that_keeps_freed_memory_is_charged_until_trimmed() {
    let e = uncached("4GiB", &[]);
    e.driver.pool.lock().unwrap().2 = u64::MAX;
    let size = 2867 * MIB + 5; // 70% of the cap, not a multiple of the granule
    let a = alloc_async(e, size).unwrap();
    let s = e.slot(0).unwrap();
    let grown = (2867 * MIB + 5).next_multiple_of(2 * MIB);
    assert_eq!((used(e), s.pools.load(Ordering::Relaxed)), (grown, grown));
    assert_eq!(free_async(e, a, size), CUDA_SUCCESS);
    synchronise(e);
    assert_eq!(used(e), grown, "the pool keeps it, so the cap counts it");
    assert_eq!(info(e).0, 4 * GIB - grown);
    assert_eq!(alloc(e, 3686 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let pool = POOL as CUmemoryPool;
    let trim = || {
        let mut p = e.driver.pool.lock().unwrap();
        p.0 = p.1;
        CUDA_SUCCESS
    };
    assert_eq!(e.mem_pool_trim_to(trim, pool, 0), CUDA_SUCCESS);
    assert_eq!((used(e), s.pools.load(Ordering::Relaxed)), (0, 0));
    let b = alloc(e, 3686 * MIB).unwrap();
    assert_eq!(used(e), 3686 * MIB);
    assert_eq!(free(e, b), CUDA_SUCCESS);
}

/// With the default threshold (0) the driver releases at the next
/// synchronisation; the engine sees it before refusing anything, and
/// allocations reusing the reserve cost nothing more.
#[test]
fn a_pool_trimmed_at_a_synchronisation_is_seen_before_a_refusal() {
    let e = uncached("4GiB", &[]);
    let a = alloc_async(e, 3 * GIB).unwrap();
    assert_eq!(free_async(e, a, 3 * GIB), CUDA_SUCCESS);
    let b = alloc_async(e, GIB).unwrap();
    assert_eq!(used(e), 3 * GIB, "reusing the reserve charges nothing");
    assert_eq!(free_async(e, b, GIB), CUDA_SUCCESS);
    synchronise(e);
    assert_eq!(used(e), 3 * GIB, "not seen yet");
    let c = alloc(e, 3 * GIB).unwrap();
    assert_eq!(used(e), 3 * GIB, "seen at the refusal, then granted");
    assert_eq!(e.slot(0).unwrap().pools.load(Ordering::Relaxed), 0);
    assert_eq!(alloc_async(e, GIB + 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(
        e.driver.pool.lock().unwrap().0,
        0,
        "a refused claim grows nothing"
    );
    assert_eq!(free(e, c), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

/// A set context size is charged at the device's first use: the program
/// sees a card of the cap's size with the context on it, and two halves of
/// the total do not both fit.
#[test]
fn a_set_context_is_charged_and_two_halves_do_not_fit() {
    let e = uncached("4GiB", &[("VRAMCAP_CONTEXT", "600MiB")]);
    assert_eq!(info(e), (4 * GIB - 600 * MIB, 4 * GIB));
    let s = e.slot(0).unwrap();
    assert_eq!(
        (used(e), s.context.load(Ordering::Relaxed)),
        (600 * MIB, 600 * MIB)
    );
    let a = alloc(e, 2 * GIB).unwrap();
    assert_eq!(alloc(e, 2 * GIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(used(e), 600 * MIB);
}

/// Measured: NVML's figure for the process minus what the engine counts.
#[test]
fn the_context_is_what_nvml_shows_beyond_the_allocations() {
    let e = engine_with(
        Fake {
            context: Some(518 * MIB),
            ..Fake::default()
        },
        &[
            ("VRAMCAP_LIMIT", "4GiB"),
            NO_CACHE,
            ("VRAMCAP_CONTEXT", "auto"),
        ],
    );
    let a = alloc(e, GIB).unwrap();
    let s = e.slot(0).unwrap();
    // Charged with 128 MiB of room for modules loaded later.
    let charged = 518 * MIB + 128 * MIB;
    assert_eq!(s.context.load(Ordering::Relaxed), charged);
    assert_eq!(used(e), GIB + charged);
    e.accounting.context_measure(0);
    assert_eq!(used(e), GIB + charged, "measuring again changes nothing");
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(used(e), charged);
}

/// Where NVML lists nobody that can be this process, the fallback is charged.
#[test]
fn without_nvml_the_fallback_is_charged() {
    let e = engine(&[("VRAMCAP_LIMIT", "4GiB"), ("VRAMCAP_CONTEXT", "auto")]);
    assert_eq!(info(e), (4 * GIB - 512 * MIB, 4 * GIB));
}

/// `VRAMCAP_COUNT=allocations`: stream-ordered allocations by size, given
/// back at their free; nothing else counted.
#[test]
fn counting_allocations_only_charges_by_size() {
    let e = engine(&[
        ("VRAMCAP_LIMIT", "4GiB"),
        ("VRAMCAP_COUNT", "allocations"),
        ("VRAMCAP_CONTEXT", "600MiB"),
    ]);
    let a = alloc_async(e, 3 * GIB + 1).unwrap();
    assert_eq!(used(e), 3 * GIB + 1);
    assert_eq!(free_async(e, a, 3 * GIB + 1), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    assert_eq!(e.slot(0).unwrap().pools.load(Ordering::Relaxed), 0);
    assert_eq!(info(e), (4 * GIB, 4 * GIB));
}

/// The engine of the context tests below: a 4 GiB cap, the cache off, the
/// context measured, on `fake` with a context of 300 MiB.
fn measured(fake: Fake) -> &'static Engine<Fake> {
    let fake = Fake {
        context: Some(300 * MIB),
        ..fake
    };
    let vars = [
        ("VRAMCAP_LIMIT", "4GiB"),
        NO_CACHE,
        ("VRAMCAP_CONTEXT", "auto"),
    ];
    engine_with(fake, &vars)
}

/// In a container NVML lists host PIDs. With another process on the GPU
/// the fallback is charged until this one can be told apart (the only one
/// holding at least what it counts); the guess stays provisional, so it
/// can fall again.
#[test]
fn in_a_container_the_context_is_a_provisional_guess() {
    let e = measured(Fake {
        container: true,
        others: vec![(9, 100 * MIB)],
        ..Fake::default()
    });
    assert_eq!(
        info(e).0,
        4 * GIB - 512 * MIB,
        "two candidates: the fallback"
    );
    let a = alloc(e, GIB).unwrap();
    assert_eq!(alloc(e, 4 * GIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let s = e.slot(0).unwrap();
    assert_eq!(
        s.context.load(Ordering::Relaxed),
        300 * MIB + 128 * MIB,
        "told apart at the refusal"
    );
    assert_eq!(free(e, a), CUDA_SUCCESS);
    e.accounting.context_measure(0);
    assert_eq!(
        s.context.load(Ordering::Relaxed),
        512 * MIB,
        "ambiguous again: back to the fallback, no figure locked in"
    );
}

/// Outside a container only this process's PID counts: another process
/// alone on the list is never taken for it.
#[test]
fn in_the_host_namespace_another_pid_is_never_taken_for_this_one() {
    let e = measured(Fake {
        not_available: true,
        ..Fake::default()
    });
    // NVML lists this PID without a figure: the fallback, not 2^64 bytes.
    assert_eq!(info(e).0, 4 * GIB - 512 * MIB);
    let a = alloc(e, GIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
}

/// `VRAMCAP_COUNT=allocations`: pools are never read, trimmed or charged,
/// whatever the program does with them.
#[test]
fn counting_allocations_never_reads_a_pool() {
    let e = engine(&[("VRAMCAP_LIMIT", "4GiB"), ("VRAMCAP_COUNT", "allocations")]);
    let a = alloc_async(e, GIB).unwrap();
    assert_eq!(used(e), GIB);
    info(e);
    let trim = || CUDA_SUCCESS;
    assert_eq!(
        e.mem_pool_trim_to(trim, POOL as CUmemoryPool, 0),
        CUDA_SUCCESS
    );
    assert_eq!(used(e), GIB, "no pool charge on top");
    assert_eq!(
        e.mem_pool_destroy(|| CUDA_SUCCESS, POOL as CUmemoryPool),
        CUDA_SUCCESS
    );
    assert_eq!(free_async(e, a, GIB), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
}

/// A pool destroyed with a live allocation stays charged until it is
/// freed, and a new pool that gets the same handle is a pool of its own.
#[test]
fn a_destroyed_pool_is_charged_until_its_last_allocation_goes() {
    let e = uncached("4GiB", &[]);
    let a = alloc_async(e, GIB).unwrap();
    let destroy = || {
        // The driver keeps its memory; a new pool starts empty.
        *e.driver.pool.lock().unwrap() = (0, 0, 0);
        CUDA_SUCCESS
    };
    assert_eq!(
        e.mem_pool_destroy(destroy, POOL as CUmemoryPool),
        CUDA_SUCCESS
    );
    assert_eq!(used(e), GIB);
    let b = alloc_async(e, 512 * MIB).unwrap();
    assert_eq!(used(e), GIB + 512 * MIB);
    // The destroyed pool's last allocation: its whole charge goes.
    assert_eq!(
        e.mem_free_async(Flavour::Legacy, || CUDA_SUCCESS, a, std::ptr::null_mut()),
        CUDA_SUCCESS
    );
    assert_eq!(used(e), 512 * MIB);
    // The new pool keeps what is freed, as pools do.
    assert_eq!(free_async(e, b, 512 * MIB), CUDA_SUCCESS);
    assert_eq!(used(e), 512 * MIB);
}
