//! The planner, pure Rust over the blocks' figures: a round's heat
//! (`take_round`) and the moves it chooses (`plan`), tested without a driver.

#[allow(unused_imports)]
use super::*;

/// One round's moves for a device.
#[derive(Default)]
pub(in crate::engine) struct Plan {
    pub(in crate::engine) demote: Vec<Arc<TierBlock>>,
    pub(in crate::engine) promote: Vec<Arc<TierBlock>>,
}

/// A block's score halves every this many launches (not rounds: a score
/// then covers the same stretch of a program's work at any speed).
pub(in crate::engine) const HALF_LIFE_LAUNCHES: f64 = 4000.0;

/// The score formula, in one place: each block's score decays by half
/// every [`HALF_LIFE_LAUNCHES`] launches (`since`: the launches seen since
/// the last round) and gains the round's passes ([`take_round`]); its
/// weight gains the round's uses.
pub(in crate::engine) fn score_round(blocks: &[Arc<TierBlock>], round: u64, since: u64) {
    let decay = 0.5f64.powf(since as f64 / HALF_LIFE_LAUNCHES);
    for (b, (passes, weight)) in blocks.iter().zip(take_round(blocks, round)) {
        b.weight.fetch_add(weight, Ordering::Relaxed);
        let s = b.score() * decay + passes;
        b.score.store(s.to_bits(), Ordering::Relaxed);
    }
}

/// Rounds a page that launches named counts as one where tensors start
/// ([`take_round`]).
pub const NAMED_ROUNDS: u64 = 50;

/// The round's cost of keeping each block on the host, in weighted passes
/// over each of its bytes, and the weight of its uses, in `blocks`' order;
/// resets the blocks' spots for the next round. Every use counts the bytes
/// from its offset to the next offset used, as element-wise kernels touch
/// a whole tensor and PyTorch's segments hold tensors end to end; uses
/// that found no spot count a [`SPOTS`]th of their block. The engine's
/// blocks are each a region of their own. The blocks a program mapped
/// itself end to end (its pages: one device, each starting where the one
/// before it ends) are read as one region: a tensor may span pages and a
/// launch names only the page it starts in, so a use reaches on into the
/// pages after its own, up to the next offset used anywhere in the region,
/// the region's end, or the first page that launches named in the last
/// [`NAMED_ROUNDS`] rounds (tensors start there: a page holding only the
/// rest of a large tensor is never named). `round`: this round.
pub(in crate::engine) fn take_round(blocks: &[Arc<TierBlock>], round: u64) -> Vec<(f64, u64)> {
    let mut out = vec![(0f64, 0u64); blocks.len()];
    let mut scratch = Scratch::default();
    let mut pages = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        if b.program_handle == 0 {
            take_region(blocks, &[i], round, &mut out, &mut scratch);
        } else {
            pages.push(i);
        }
    }
    pages.sort_unstable_by_key(|&i| blocks[i].ptr);
    let mut start = 0;
    while start < pages.len() {
        let mut end = start + 1;
        while end < pages.len() {
            let (a, b) = (&blocks[pages[end - 1]], &blocks[pages[end]]);
            if a.device != b.device || a.ptr.saturating_add(a.bytes) != b.ptr {
                break;
            }
            end += 1;
        }
        take_region(blocks, &pages[start..end], round, &mut out, &mut scratch);
        start = end;
    }
    out
}

/// The lists [`take_region`] fills, made once a round for all regions.
#[derive(Default)]
pub(super) struct Scratch {
    /// The region's uses: (offset in the region, weight).
    pub(super) uses: Vec<(u64, u32)>,
    /// The weighted bytes each of its blocks is passed over.
    pub(super) bytes: Vec<f64>,
}

/// [`take_round`] for one region: `run` indexes `blocks`, in address
/// order, each block starting where the one before it ends. The uses'
/// reaches are disjoint, so the walk touches each page at most once per
/// use that reaches it: linear in pages plus uses.
pub(super) fn take_region(
    blocks: &[Arc<TierBlock>],
    run: &[usize],
    round: u64,
    out: &mut [(f64, u64)],
    scratch: &mut Scratch,
) {
    let base = blocks[run[0]].ptr;
    let at = |k: usize| blocks[run[k]].ptr - base;
    let last = &blocks[run[run.len() - 1]];
    let len = last.ptr + last.bytes - base;
    let Scratch { uses, bytes } = scratch;
    uses.clear();
    bytes.clear();
    bytes.resize(run.len(), 0.0);
    for (k, &i) in run.iter().enumerate() {
        let b = &blocks[i];
        let (seen, n, unplaced) = b.take_spots();
        uses.extend(
            seen[..n]
                .iter()
                .map(|&(off, w)| (at(k) + off.min(b.bytes), w)),
        );
        bytes[k] += f64::from(unplaced) * (b.bytes / SPOTS as u64) as f64;
        out[i].1 = seen[..n].iter().map(|&(_, w)| u64::from(w)).sum::<u64>() + u64::from(unplaced);
        if out[i].1 > 0 {
            b.named.store(round, Ordering::Relaxed);
        }
    }
    let starts = |j: usize| {
        let named = blocks[run[j]].named.load(Ordering::Relaxed);
        named != 0 && round.saturating_sub(named) < NAMED_ROUNDS
    };
    let mut k = 0;
    for (u, &(off, w)) in uses.iter().enumerate() {
        let end = uses.get(u + 1).map_or(len, |n| n.0);
        while k + 1 < run.len() && at(k + 1) <= off {
            k += 1;
        }
        let mut j = k;
        while j < run.len() && at(j) < end && (j == k || !starts(j)) {
            let (lo, hi) = (at(j), at(j) + blocks[run[j]].bytes);
            bytes[j] += f64::from(w) * hi.min(end).saturating_sub(lo.max(off)) as f64;
            j += 1;
        }
    }
    for (k, &i) in run.iter().enumerate() {
        out[i].0 = bytes[k] / blocks[i].bytes.max(1) as f64;
    }
}

/// Chooses the moves for the blocks of one device. `over`: bytes reserved
/// above the device's target (demoted, coldest first, when positive);
/// `room`: bytes promotions may still take (the target less
/// [`PROMOTE_MARGIN`], less what is reserved); `host_room`: bytes the
/// spill limit still allows on the host.
pub(in crate::engine) fn plan(
    blocks: &[Arc<TierBlock>],
    over: i128,
    room: i128,
    host_room: u64,
    round: u64,
) -> Plan {
    let settled =
        |b: &TierBlock| round.saturating_sub(b.moved.load(Ordering::Relaxed)) >= MIN_ROUNDS;
    let movable = || blocks.iter().filter(|b| b.movable());
    let mut dev: Vec<&Arc<TierBlock>> = movable().filter(|b| b.on_device()).collect();
    let mut host: Vec<&Arc<TierBlock>> = movable()
        .filter(|b| !b.on_device() && b.score() > 0.0 && settled(b))
        .collect();
    // Coldest device blocks first, hottest host blocks first.
    dev.sort_by(|a, b| a.density().total_cmp(&b.density()));
    host.sort_by(|a, b| b.density().total_cmp(&a.density()));
    let mut out = Plan::default();
    let mut room = room;
    let mut over = over;
    let mut host_room = i128::from(host_room);
    let mut budget = i128::from(ROUND_BYTES);
    let mut next = 0usize; // the next device block to demote
    // Above the target: demote the coldest until under, settled or not.
    while over > 0 && next < dev.len() && budget > 0 {
        let b = dev[next];
        next += 1;
        if i128::from(b.bytes) > host_room {
            continue;
        }
        over -= i128::from(b.bytes);
        room += i128::from(b.bytes);
        host_room -= i128::from(b.bytes);
        budget -= i128::from(b.bytes);
        out.demote.push(b.clone());
    }
    if over > 0 {
        return out;
    }
    room = room.max(0);
    let full = i128::from(ROUND_BYTES);
    for h in host {
        let bytes = i128::from(h.bytes);
        // A block larger than a round's budget moves alone in a round.
        if bytes > budget && budget < full {
            continue;
        }
        if bytes <= room {
            room -= bytes;
            host_room += bytes;
            budget -= bytes;
            out.promote.push(h.clone());
            continue;
        }
        // Swap: colder settled device blocks make the room.
        let mut gain = 0i128;
        let mut j = next;
        let mut taken = Vec::new();
        while room + gain < bytes && j < dev.len() {
            let d = dev[j];
            j += 1;
            if d.density() * HYSTERESIS >= h.density() {
                break;
            }
            if !settled(d) {
                continue;
            }
            gain += i128::from(d.bytes);
            taken.push(d.clone());
        }
        let moved: i128 = gain + bytes;
        if room + gain < bytes || (moved > budget && budget < full) || gain - bytes > host_room {
            continue;
        }
        next = j;
        room += gain - bytes;
        host_room -= gain - bytes;
        budget -= moved;
        out.demote.extend(taken);
        out.promote.push(h.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ptr: u64, bytes: u64, place: Place, score: f64, moved: u64) -> Arc<TierBlock> {
        let b = TierBlock::new(ptr, bytes, 0, 1, 0, place, moved);
        b.score.store(score.to_bits(), Ordering::Relaxed);
        Arc::new(b)
    }

    /// A use reaches across the pages a program mapped end to end (a tensor
    /// may span them), up to the next use or a page launches name (where
    /// tensors start); never into the engine's own block beside them, nor
    /// into a page apart.
    #[test]
    fn a_use_reaches_across_the_pages_a_program_mapped_end_to_end() {
        const MIB: u64 = 1 << 20;
        let mk = |ptr: u64, program: u64| {
            let mut b = TierBlock::new(ptr, 4 * MIB, 0, 1, 0, Place::Device, 0);
            b.program_handle = program;
            Arc::new(b)
        };
        let blocks = [
            mk(0x1080_0000, 3),
            mk(0x1000_0000, 1),
            mk(0x1040_0000, 2),
            mk(0x2000_0000, 4),
            mk(0x10c0_0000, 0),
        ];
        blocks[1].note(0, 1); // stops where the next named page starts
        blocks[2].note(2 * MIB, 3); // reaches on to the region's end
        blocks[4].note(0, 5);
        let got = take_round(&blocks, 1);
        assert_eq!(got, [(3.0, 0), (1.0, 1), (1.5, 3), (0.0, 0), (5.0, 5)]);
        // The spots were reset for the next round.
        assert_eq!(take_round(&blocks, 2), [(0.0, 0); 5]);
        // A page named within NAMED_ROUNDS still stops a reach; then not.
        blocks[1].note(0, 1);
        assert_eq!(
            take_round(&blocks, NAMED_ROUNDS)[1..3],
            [(1.0, 1), (0.0, 0)]
        );
        blocks[1].note(0, 1);
        let later = take_round(&blocks, NAMED_ROUNDS + 1);
        assert_eq!(later[1..3], [(1.0, 1), (1.0, 0)]);
        assert_eq!(later[0], (1.0, 0));
    }

    #[test]
    fn a_use_touches_up_to_the_next_offset_used() {
        let b = block(1 << 40, 32 * M, Place::Host, 0.0, 0);
        // One use at the start of the block: one pass over it.
        b.note(0, 1);
        assert_eq!(b.take_passes(), (1.0, 1));
        // Taken: the spots start again.
        assert_eq!(b.take_passes(), (0.0, 0));
        // Two tensors end to end, the second used three times (once by a
        // matrix product): (1 x 16 MiB + (1 + 1 + 32) x 16 MiB) / 32 MiB.
        b.note(0, 1);
        b.note(16 * M, 1);
        b.note(16 * M, 1);
        b.note(16 * M, PRODUCT_WEIGHT);
        assert_eq!(b.heat(), 3 + 32);
        assert_eq!(b.take_passes(), ((16.0 + 34.0 * 16.0) / 32.0, 3 + 32));
        assert_eq!(b.heat(), 0);
    }

    #[test]
    fn uses_past_the_spots_count_a_share_of_the_block() {
        let b = block(1 << 40, 32 * M, Place::Host, 0.0, 0);
        for i in 0..=SPOTS as u64 {
            b.note(i * M, 1);
        }
        // Spots 0..15 reach 1 MiB each but the last, which reaches the end
        // (17 MiB); the use that found no spot counts 32 MiB / 16.
        assert_eq!(b.take_passes(), ((15.0 + 17.0 + 2.0) / 32.0, 17));
    }

    #[test]
    fn a_claim_ends_when_a_move_panics() {
        let t = Tiers::new(true, true);
        let _ = t.insert(TierBlock::new(
            1 << 40,
            4 * M,
            0,
            1,
            0,
            Place::Device,
            t.round_now(),
        ));
        let b = t.snapshot().pop().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _c = b.claim().unwrap();
            assert!(b.claim().is_none(), "one claim at a time");
            panic!("a bug in a move");
        }));
        assert!(r.is_err());
        // The free does not wait for ever: the claim ended with the unwinding.
        assert!(t.detach(1 << 40).is_some());
        assert!(b.claim().is_none(), "a freed block is not claimed");
    }

    #[test]
    fn products_are_told_by_their_names() {
        for n in [
            "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3",
            "ampere_sgemm_128x64_nn",
            "_ZN7cutlass6KernelI...",
            "gemv2T_kernel_val",
            "cudnn::detail::implicit_convolve_sgemm",
            "triton_tem_fused_mm_0_matmul",
        ] {
            assert!(is_product(n), "{n}");
        }
        for n in [
            "_ZN2at6native29vectorized_elementwise_kernel",
            "multi_tensor_apply_kernel",
            "softmax_warp_forward",
            "reduce_kernel",
            "layer_norm_kernel_gamma_beta",
            "unrolled_elementwise_kernel_convert",
        ] {
            assert!(!is_product(n), "{n}");
        }
    }

    fn ptrs(v: &[Arc<TierBlock>]) -> Vec<u64> {
        v.iter().map(|b| b.ptr).collect()
    }

    const M: u64 = 1 << 20;
    const DEVICE: Place = Place::Device;
    const HOST: Place = Place::Host;

    /// Round 100's plan for blocks 1, 2, … of 100 MiB, (place, score, round
    /// last moved) each: the (demoted, promoted) blocks.
    fn round_100(
        blocks: &[(Place, f64, u64)],
        over: i128,
        room: i128,
        spill_limit: u64,
    ) -> (Vec<u64>, Vec<u64>) {
        let b: Vec<_> = (1..)
            .zip(blocks)
            .map(|(ptr, &(place, score, moved))| block(ptr, 100 * M, place, score, moved))
            .collect();
        let p = plan(&b, over, room, spill_limit, 100);
        (ptrs(&p.demote), ptrs(&p.promote))
    }

    #[test]
    fn hot_host_blocks_fill_the_room_first() {
        let host = [(HOST, 10.0, 0), (HOST, 50.0, 0), (HOST, 0.0, 0)];
        let room = i128::from(150 * M);
        assert_eq!(round_100(&host, 0, room, u64::MAX), (vec![], vec![2]));
    }

    /// Round 100's plan for device block 1 and host block 2, with no room
    /// and `spill_limit`: the (demoted, promoted) blocks.
    fn swap(device: (f64, u64), host: (f64, u64), spill_limit: u64) -> (Vec<u64>, Vec<u64>) {
        let b = [(DEVICE, device.0, device.1), (HOST, host.0, host.1)];
        round_100(&b, 0, 0, spill_limit)
    }

    #[test]
    fn swaps_need_the_hysteresis_margin() {
        // Device block 1 has density 10/100M; a host block of 12.4/100M is
        // not 1.25x hotter, so nothing moves; one of 12.6/100M is.
        assert_eq!(HYSTERESIS, 1.25);
        assert_eq!(swap((10.0, 0), (12.4, 0), u64::MAX), (vec![], vec![]));
        assert_eq!(swap((10.0, 0), (12.6, 0), u64::MAX), (vec![1], vec![2]));
    }

    #[test]
    fn recently_moved_blocks_stay() {
        assert_eq!(swap((1.0, 90), (50.0, 0), u64::MAX), (vec![], vec![]));
        assert_eq!(swap((1.0, 0), (50.0, 85), u64::MAX), (vec![], vec![]));
    }

    #[test]
    fn above_the_target_the_coldest_go_first() {
        let device = [(DEVICE, 9.0, 99), (DEVICE, 1.0, 99), (DEVICE, 5.0, 99)];
        let over = i128::from(150 * M);
        assert_eq!(round_100(&device, over, 0, u64::MAX), (vec![2, 3], vec![]));
    }

    #[test]
    fn the_spill_limit_bounds_demotions() {
        // A swap moves no bytes to the host on balance: allowed with no room.
        assert_eq!(swap((1.0, 0), (50.0, 0), 0), (vec![1], vec![2]));
        let b = [block(1, 100 * M, Place::Device, 1.0, 0)];
        let p = plan(&b, 1, 0, 0, 100);
        assert!(p.demote.is_empty());
    }

    #[test]
    fn a_block_larger_than_a_rounds_budget_moves_alone() {
        let b = [
            block(1, 3 * ROUND_BYTES, Place::Host, 1000.0, 0),
            block(2, 512 * M, Place::Host, 50.0, 0),
        ];
        let p = plan(&b, 0, i128::from(8 * ROUND_BYTES), u64::MAX, 100);
        assert_eq!(ptrs(&p.promote), vec![1]);
    }

    #[test]
    fn a_round_moves_at_most_its_budget() {
        let b: Vec<_> = (0..10)
            .map(|i| block(i + 1, 512 * M, Place::Host, 100.0, 0))
            .collect();
        let p = plan(&b, 0, i128::from(100 * 512 * M), u64::MAX, 100);
        let moved: u64 = p.promote.iter().map(|b| b.bytes).sum();
        assert_eq!(moved, ROUND_BYTES);
    }
}
