//! The freed-block cache's bookkeeping: which blocks are kept, which one a
//! request may reuse, and which ones go when the cache must shrink. Pure
//! data structure; the shim adds the driver calls and the locking.
//!
//! Policy:
//! - Whole blocks only: a reused pointer is always the start of a driver
//!   allocation, so address-range and pointer-attribute queries keep working.
//! - A plain request of `n` bytes may reuse a plain block of `b` bytes when
//!   `n <= b <= n + slack(n)`, `slack(n) = n / 8 + 4 KiB`; the smallest such
//!   block wins (oldest among equals). A pitched request reuses only a block
//!   made by the same width, height and element size (hence the same pitch).
//!   A block is reused only in the context that allocated it.
//! - The cache holds at most a bound of bytes per device; putting a block in
//!   evicts the least recently freed blocks until it fits (a block larger than
//!   the bound is not kept at all).
//! - Blocks idle longer than the idle time are evicted by the shim's
//!   background thread; all of them on `vramcap trim` or under cap pressure
//!   (least recently freed first).

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, Hasher};

/// The hash of the shim's maps keyed by a driver handle or a device
/// address (the cache's blocks and contexts, the engine's records): such
/// words are aligned and spread over a wide range, come from the driver
/// (never from another user), and a multiplicative hash of the whole word
/// is enough and much cheaper than SipHash.
#[derive(Clone, Copy, Default, Debug)]
pub struct PtrHash;

pub struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

impl BuildHasher for PtrHash {
    type Hasher = PtrHasher;
    fn build_hasher(&self) -> PtrHasher {
        PtrHasher(0)
    }
}

/// How a block was made, which decides what it can be reused for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Plain,
    Pitch {
        width: u64,
        height: u64,
        elem: u32,
        pitch: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub ptr: u64,
    /// Bytes the block holds (and the budget counts).
    pub bytes: u64,
    /// The context that allocated it (an opaque handle).
    pub ctx: usize,
    pub shape: Shape,
    /// The shim's synchronisation ticket when the block was freed: the block
    /// is safe to reuse once a synchronisation with a later ticket finished.
    pub ticket: u64,
    /// When it was freed, in the shim's monotonic nanoseconds.
    pub freed_ns: u64,
}

/// The largest block a plain request of `n` bytes may be given.
pub fn max_fit(n: u64) -> u64 {
    n.saturating_add(n / 8).saturating_add(4096)
}

/// The blocks kept, in one map: a hit takes one removal and a free one
/// insertion and one push (the cache-hit pair's cost, issue 41). Age order
/// is a queue of keys in the order they were put, from which keys of
/// blocks taken since are dropped lazily: when they reach its front, or
/// when it grows past twice the map (so it stays within that, amortised
/// O(1) a put). Addresses are found by a scan, which only frees of
/// unknown addresses need.
#[derive(Debug, Default)]
pub struct Pool {
    /// (bytes, seq) -> block: best fit by size, oldest first among equals;
    /// a smaller seq was freed earlier.
    by_size: BTreeMap<(u64, u64), Block>,
    /// The keys put, oldest first; some no longer in `by_size`.
    order: VecDeque<(u64, u64)>,
    next_seq: u64,
    total: u64,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Plain { bytes: u64 },
    Pitch { width: u64, height: u64, elem: u32 },
}

impl Pool {
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn len(&self) -> usize {
        self.by_size.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_size.is_empty()
    }

    /// Whether the pool holds the block at `ptr` (a scan: only a free of
    /// an address the engine does not know asks).
    pub fn contains(&self, ptr: u64) -> bool {
        self.by_size.values().any(|b| b.ptr == ptr)
    }

    fn remove(&mut self, key: (u64, u64)) -> Option<Block> {
        let b = self.by_size.remove(&key)?;
        self.total -= b.bytes;
        Some(b)
    }

    /// The keys of the blocks `keep` accepts, least recently freed first.
    fn oldest_first(&self, keep: impl Fn(&Block) -> bool) -> Vec<(u64, u64)> {
        self.order
            .iter()
            .filter(|k| self.by_size.get(k).is_some_and(&keep))
            .copied()
            .collect()
    }

    /// Takes the best block for `want` in context `ctx`, if any.
    pub fn take(&mut self, ctx: usize, want: Want) -> Option<Block> {
        let key = match want {
            Want::Plain { bytes } => self
                .by_size
                .range((bytes, 0)..=(max_fit(bytes), u64::MAX))
                .find(|(_, b)| b.ctx == ctx && b.shape == Shape::Plain)
                .map(|(k, _)| *k),
            Want::Pitch {
                width,
                height,
                elem,
            } => self
                .by_size
                .iter()
                .find(|(_, b)| {
                    b.ctx == ctx
                        && matches!(b.shape, Shape::Pitch { width: w, height: h, elem: e, .. }
                            if w == width && h == height && e == elem)
                })
                .map(|(k, _)| *k),
        }?;
        self.remove(key)
    }

    /// Keeps `block`, evicting least recently freed blocks so the pool stays
    /// within `bound` bytes. Returns the blocks to release for real (the
    /// block itself when it alone is larger than the bound).
    pub fn put(&mut self, block: Block, bound: u64) -> Vec<Block> {
        if block.bytes > bound {
            return vec![block];
        }
        let mut out = self.evict_until_room(bound - block.bytes);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_size.insert((block.bytes, seq), block);
        self.order.push_back((block.bytes, seq));
        if self.order.len() > 2 * self.by_size.len() + 64 {
            let live = &self.by_size;
            self.order.retain(|k| live.contains_key(k));
        }
        self.total += block.bytes;
        out.shrink_to_fit();
        out
    }

    /// Evicts least recently freed blocks until at most `keep` bytes remain.
    pub fn evict_until_room(&mut self, keep: u64) -> Vec<Block> {
        let mut out = Vec::new();
        while self.total > keep {
            let Some(k) = self.order.pop_front() else {
                break;
            };
            if let Some(b) = self.remove(k) {
                out.push(b);
            }
        }
        out
    }

    /// Evicts least recently freed blocks of context `ctx` until at least
    /// `need` bytes are out (or none of that context is left).
    pub fn evict_from_ctx(&mut self, ctx: usize, need: u64) -> Vec<Block> {
        let mut out = Vec::new();
        let mut freed = 0u64;
        for k in self.oldest_first(|b| b.ctx == ctx) {
            if freed >= need {
                break;
            }
            if let Some(b) = self.remove(k) {
                freed += b.bytes;
                out.push(b);
            }
        }
        out
    }

    /// Evicts blocks freed at or before `cutoff_ns`.
    pub fn evict_idle(&mut self, cutoff_ns: u64) -> Vec<Block> {
        let keys: Vec<(u64, u64)> = self
            .by_size
            .iter()
            .filter(|(_, b)| b.freed_ns <= cutoff_ns)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter().filter_map(|k| self.remove(k)).collect()
    }

    /// Evicts every block of context `ctx`.
    pub fn drain_ctx(&mut self, ctx: usize) -> Vec<Block> {
        self.evict_from_ctx(ctx, u64::MAX)
    }

    /// Evicts everything.
    pub fn drain(&mut self) -> Vec<Block> {
        self.evict_until_room(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(ptr: u64, bytes: u64, ctx: usize, t: u64) -> Block {
        Block {
            ptr,
            bytes,
            ctx,
            shape: Shape::Plain,
            ticket: 0,
            freed_ns: t,
        }
    }

    #[test]
    fn best_fit_within_slack_same_context() {
        let mut p = Pool::default();
        assert!(p.put(plain(1, 1000, 7, 0), u64::MAX).is_empty());
        assert!(p.put(plain(2, 2048, 7, 0), u64::MAX).is_empty());
        assert!(p.put(plain(3, 1 << 20, 7, 0), u64::MAX).is_empty());
        assert_eq!(p.total(), 1000 + 2048 + (1 << 20));
        // Too small, other context, outside slack: no.
        assert_eq!(p.take(7, Want::Plain { bytes: 1 << 21 }), None);
        assert_eq!(p.take(8, Want::Plain { bytes: 1000 }), None);
        assert_eq!(
            p.take(7, Want::Plain { bytes: 900_000 }),
            None,
            "1 MiB > 900000 + 112500 + 4096"
        );
        // Smallest fit wins.
        assert_eq!(
            p.take(7, Want::Plain { bytes: 500 }).map(|b| b.ptr),
            Some(1)
        );
        assert_eq!(
            p.take(7, Want::Plain { bytes: 1000 }).map(|b| b.ptr),
            Some(2)
        );
        assert_eq!(
            p.take(7, Want::Plain { bytes: 1 << 20 }).map(|b| b.ptr),
            Some(3)
        );
        assert!(p.is_empty());
        assert_eq!(p.total(), 0);
    }

    #[test]
    fn pitch_blocks_only_for_the_same_shape() {
        let mut p = Pool::default();
        let shape = Shape::Pitch {
            width: 1000,
            height: 10,
            elem: 4,
            pitch: 1024,
        };
        p.put(
            Block {
                ptr: 9,
                bytes: 10240,
                ctx: 1,
                shape,
                ticket: 0,
                freed_ns: 0,
            },
            u64::MAX,
        );
        assert_eq!(p.take(1, Want::Plain { bytes: 10240 }), None);
        assert_eq!(
            p.take(
                1,
                Want::Pitch {
                    width: 1000,
                    height: 11,
                    elem: 4
                }
            ),
            None
        );
        assert_eq!(
            p.take(
                1,
                Want::Pitch {
                    width: 1000,
                    height: 10,
                    elem: 4
                }
            )
            .map(|b| b.ptr),
            Some(9)
        );
    }

    #[test]
    fn bound_evicts_least_recently_freed() {
        let mut p = Pool::default();
        assert!(p.put(plain(1, 100, 0, 0), 250).is_empty());
        assert!(p.put(plain(2, 100, 0, 0), 250).is_empty());
        let out = p.put(plain(3, 100, 0, 0), 250);
        assert_eq!(out.iter().map(|b| b.ptr).collect::<Vec<_>>(), [1]);
        assert_eq!(p.total(), 200);
        let out = p.put(plain(4, 300, 0, 0), 250);
        assert_eq!(
            out.iter().map(|b| b.ptr).collect::<Vec<_>>(),
            [4],
            "larger than the bound: not kept"
        );
        assert_eq!(p.total(), 200);
        let out = p.evict_from_ctx(0, 50);
        assert_eq!(out.iter().map(|b| b.ptr).collect::<Vec<_>>(), [2]);
        assert_eq!(p.drain().iter().map(|b| b.ptr).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn idle_and_context_drains() {
        let mut p = Pool::default();
        p.put(plain(1, 10, 1, 100), u64::MAX);
        p.put(plain(2, 10, 2, 200), u64::MAX);
        p.put(plain(3, 10, 1, 300), u64::MAX);
        assert_eq!(
            p.evict_idle(200).iter().map(|b| b.ptr).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(
            p.drain_ctx(1).iter().map(|b| b.ptr).collect::<Vec<_>>(),
            [3]
        );
        assert!(p.is_empty());
    }

    #[test]
    fn random_operations_keep_the_total_exact() {
        let mut p = Pool::default();
        let mut x = 12345u64;
        let mut held = 0u64;
        let mut out_seqs: Vec<u64> = Vec::new();
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bytes = (x % 64 + 1) * 512;
            if x.is_multiple_of(3) {
                if let Some(b) = p.take(0, Want::Plain { bytes }) {
                    assert!(b.bytes >= bytes && b.bytes <= max_fit(bytes));
                }
            } else {
                let seqs: Vec<(u64, u64)> = p.by_size.iter().map(|(k, b)| (b.ptr, k.1)).collect();
                let out = p.put(plain(i, bytes, 0, i), 16384);
                assert!(out.iter().all(|b| b.bytes > 0));
                out_seqs = out
                    .iter()
                    .filter_map(|b| seqs.iter().find(|(ptr, _)| *ptr == b.ptr).map(|&(_, s)| s))
                    .collect();
            }
            held = p.by_size.values().map(|b| b.bytes).sum();
            // The age queue holds every live key once and stays within
            // twice the blocks (and a slack).
            assert!(p.order.len() <= 2 * p.by_size.len() + 65);
            assert!(p.by_size.keys().all(|k| p.order.contains(k)));
            assert_eq!(held, p.total());
            assert!(p.total() <= 16384);
            // Eviction takes the least recently freed first: what is left
            // is newer than what went.
            if let (Some(oldest_left), Some(newest_out)) =
                (p.by_size.keys().map(|k| k.1).min(), out_seqs.iter().max())
            {
                assert!(oldest_left > *newest_out);
            }
        }
        assert_eq!(held, p.total());
    }

    #[test]
    fn the_pool_knows_which_addresses_it_holds() {
        let mut p = Pool::default();
        assert!(p.put(plain(0x1000, 4096, 1, 0), 1 << 20).is_empty());
        assert!(p.put(plain(0x9000, 8192, 1, 0), 1 << 20).is_empty());
        assert!(p.contains(0x1000) && p.contains(0x9000) && !p.contains(0x2000));
        let b = p
            .take(1, Want::Plain { bytes: 4096 })
            .expect("a fitting block");
        assert_eq!(b.ptr, 0x1000);
        assert!(!p.contains(0x1000) && p.contains(0x9000));
        assert_eq!(p.drain().len(), 1);
        assert!(!p.contains(0x9000));
    }
}
