//! Frees: a second free, and what a context takes with it.

use super::*;

#[test]
fn a_second_free_of_a_cached_block_is_refused_and_changes_nothing() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let a = alloc(e, 8 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, a), CUDA_ERROR_INVALID_VALUE);
    // The block is still the driver's and still cached, counted once.
    assert_eq!(e.driver.frees.load(Ordering::SeqCst), 0);
    assert_eq!(e.driver.live.load(Ordering::SeqCst), 8 * MIB);
    assert_eq!(used(e), 8 * MIB);
    let s = e.slot(0).unwrap();
    assert_eq!(s.cached.load(Ordering::Relaxed), 8 * MIB);
    assert_eq!(s.frees.load(Ordering::Relaxed), 1);
    // The same for a stream-ordered free of it.
    assert_eq!(
        e.mem_free_async(Flavour::Legacy, || CUDA_SUCCESS, a, std::ptr::null_mut()),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(alloc(e, 8 * MIB).unwrap(), a);
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(used(e), 8 * MIB);
}

#[test]
fn a_second_free_without_the_cache_is_the_drivers_answer() {
    let e = uncached("1GiB", &[]);
    let a = alloc(e, 8 * MIB).unwrap();
    assert_eq!(free(e, a), CUDA_SUCCESS);
    assert_eq!(free(e, a), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(used(e), 0);
    assert_eq!(e.slot(0).unwrap().frees.load(Ordering::Relaxed), 1);
}

#[test]
fn arrays_go_back_to_the_budget_with_their_context() {
    let e = engine(&[("VRAMCAP_LIMIT", "1GiB")]);
    let desc = CUDA_ARRAY_DESCRIPTOR {
        width: 1024,
        height: 1024,
        format: 0x20, // float
        channels: 4,
    };
    let h: CUarray = std::ptr::without_provenance_mut(0xa11a);
    assert_eq!(
        e.array_create(|| Ok(h), crate::engine::ArrayDesc::Flat(&desc)),
        CUDA_SUCCESS
    );
    // The fake reports no size: the estimate (rows of 16 KiB) stands.
    assert_eq!(used(e), 16 * MIB);
    let ctx: CUcontext = std::ptr::without_provenance_mut(CTX);
    assert_eq!(e.ctx_destroy(|| CUDA_SUCCESS, ctx), CUDA_SUCCESS);
    assert_eq!(used(e), 0);
    // A destroy of the handle afterwards is the driver's business only.
    assert_eq!(e.array_destroy(|| 1, h), 1);
    assert_eq!(used(e), 0);
    assert_eq!(e.slot(0).unwrap().frees.load(Ordering::Relaxed), 1);
}
