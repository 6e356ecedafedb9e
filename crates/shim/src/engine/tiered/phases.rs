//! Staging ahead, step 1 (issue 44, a spike): from the order in which a
//! program's launches use tiered blocks, find where its step repeats and
//! split one step into phases whose blocks fit in a budget, with the bytes
//! that must move at each phase boundary. Pure: no driver, no locks, no
//! engine; the rounds hand it the trace `heat.rs` records at debug level
//! and log what it finds (`docs/design/tiered.md`, "Staging ahead"). The
//! staging built over it (issue 44's prototype in two forms) was measured
//! on the H200, lost to placement by heat and was deleted; this report
//! stays.
//!
//! - A launch is the set of blocks it used (block indices, sorted,
//!   deduplicated); two launches are alike when their sets are equal.
//! - [`period`]: of the periods with which the trace ends at least twice
//!   over, the one that covers the longest end of it, the shortest of those
//!   (the Z-function of the reversed trace: linear in its length). The
//!   longest cover, not the shortest period: a real trace ends with two
//!   alike launches as often as not (the H200, session 16: "a step of 1
//!   launch"), and a step repeats layers within it; only the step covers
//!   every repetition. `None`: the end of the trace does not repeat yet (a
//!   new shape, evaluation, a changed batch), and placement stays by heat.
//! - The period is found on the kernels launched, which a step repeats
//!   exactly, and the phases on the blocks the last step's launches used
//!   (the allocator may place a tensor in another block from step to step).
//! - [`split`]: one step cut greedily into consecutive phases, each as long
//!   as its blocks' bytes fit in the budget. Adding a launch to a phase only
//!   grows its set, so cutting as late as possible gives the fewest phases.
//!   A launch whose own blocks do not fit is no phase at all: staging
//!   cannot run that step ([`Split::Unfit`]).
//! - [`boundary_bytes`]: what moves between consecutive phases, the step
//!   taken as a cycle (its last phase is followed by its first): the bytes
//!   of the next phase's blocks not in the current one, which come in, and
//!   as many go out.
//! - [`report`]: the three over a recorded trace of block addresses, what
//!   the rounds log at debug level (`rounds.rs`), with a [`Follower`] run
//!   over the trace: where it would have locked on and how often the
//!   order broke.
//! - [`Follower`]: fed each launch's kernel, it locks on the step after
//!   [`LOCK_ON`] launches in a row from the step's first kernel, reports
//!   each phase's first launch (where staging would move the next phase)
//!   and the first launch that breaks the order.

/// A launch's blocks: indices into the block sizes, sorted, no repeats.
pub type Launch = Vec<usize>;

/// The period with which `trace` ends at least twice over that covers the
/// longest end of it, the shortest of those; with the launches it covers.
pub fn period<T: PartialEq>(trace: &[T]) -> Option<(usize, usize)> {
    let n = trace.len();
    if n < 2 {
        return None;
    }
    // r is the trace read backwards; z[i]: the length of the longest run
    // of r from i equal to r's start. The end repeats with period p
    // (twice at least) when z[p] >= p, and p-periodic it covers z[p] + p.
    let r: Vec<&T> = trace.iter().rev().collect();
    let mut z = vec![0usize; n];
    let (mut l, mut h) = (0usize, 0usize);
    for i in 1..n {
        if i < h {
            z[i] = (h - i).min(z[i - l]);
        }
        while i + z[i] < n && r[z[i]] == r[i + z[i]] {
            z[i] += 1;
        }
        if i + z[i] > h {
            l = i;
            h = i + z[i];
        }
    }
    let mut best: Option<(usize, usize)> = None;
    for (p, &zp) in z.iter().enumerate().take(n / 2 + 1).skip(1) {
        if zp >= p && best.is_none_or(|(_, c)| zp + p > c) {
            best = Some((p, zp + p));
        }
    }
    best
}

/// One phase: the launches `start..end` of a step and the blocks they use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub start: usize,
    pub end: usize,
    /// The blocks the phase's launches use, sorted.
    pub blocks: Vec<usize>,
    /// Their bytes.
    pub bytes: u64,
}

/// How one step splits under a budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    Phases(Vec<Phase>),
    /// The launch at this index uses more bytes than the budget by itself.
    Unfit {
        launch: usize,
        bytes: u64,
    },
}

/// The union of two sorted block lists.
fn union(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) if x == y => {
                i += 1;
                j += 1;
                x
            }
            (Some(&x), Some(&y)) if x < y => {
                i += 1;
                x
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (_, Some(&y)) => {
                j += 1;
                y
            }
            (None, None) => unreachable!("the loop runs while one is left"),
        };
        out.push(next);
    }
    out
}

/// The bytes of `blocks` (indices into `sizes`; an index past it weighs 0).
fn bytes_of(blocks: &[usize], sizes: &[u64]) -> u64 {
    blocks
        .iter()
        .map(|&b| sizes.get(b).copied().unwrap_or(0))
        .fold(0u64, u64::saturating_add)
}

/// Cuts `step` into the fewest consecutive phases whose blocks' bytes
/// (`sizes`) fit in `budget` (module docs).
pub fn split(step: &[Launch], sizes: &[u64], budget: u64) -> Split {
    let mut phases: Vec<Phase> = Vec::new();
    let mut cur: Option<Phase> = None;
    for (i, launch) in step.iter().enumerate() {
        let own = bytes_of(launch, sizes);
        if own > budget {
            return Split::Unfit {
                launch: i,
                bytes: own,
            };
        }
        cur = Some(match cur.take() {
            None => Phase {
                start: i,
                end: i + 1,
                blocks: launch.clone(),
                bytes: own,
            },
            Some(p) => {
                let blocks = union(&p.blocks, launch);
                let bytes = bytes_of(&blocks, sizes);
                if bytes <= budget {
                    Phase {
                        start: p.start,
                        end: i + 1,
                        blocks,
                        bytes,
                    }
                } else {
                    phases.push(p);
                    Phase {
                        start: i,
                        end: i + 1,
                        blocks: launch.clone(),
                        bytes: own,
                    }
                }
            }
        });
    }
    phases.extend(cur);
    Split::Phases(phases)
}

/// The bytes that come in at each boundary of a step's phases taken as a
/// cycle: entry `i` is what phase `i + 1` (the first after the last)
/// needs that phase `i` did not hold. One phase moves nothing.
pub fn boundary_bytes(phases: &[Phase], sizes: &[u64]) -> Vec<u64> {
    if phases.len() < 2 {
        return vec![0; phases.len()];
    }
    (0..phases.len())
        .map(|i| {
            let (now, next) = (&phases[i].blocks, &phases[(i + 1) % phases.len()].blocks);
            let incoming: Vec<usize> = next
                .iter()
                .copied()
                .filter(|b| now.binary_search(b).is_err())
                .collect();
            bytes_of(&incoming, sizes)
        })
        .collect()
}

/// One recorded launch: its kernel and the starts of the blocks it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launched {
    pub kernel: u64,
    pub blocks: Box<[u64]>,
}

/// What a recorded trace says of staging (issue 44's report, logged at
/// debug level by the rounds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The order does not repeat (yet) in the `launches` recorded.
    NoRepeat { launches: usize },
    /// A step of `period` launches has one launch whose blocks alone
    /// (`bytes`) are over the budget.
    Unfit { period: usize, bytes: u64 },
    /// A step of `period` launches (the last `covered` of the trace repeat
    /// it) using `step_bytes` of blocks splits into `phases` under the
    /// budget, with `moved` bytes coming in over its boundaries each step.
    Phases {
        period: usize,
        covered: usize,
        step_bytes: u64,
        phases: usize,
        moved: u64,
        /// A [`Follower`] of the step run over the whole trace: the launch
        /// at which it first locked on (`None`: never), and how many
        /// times the order broke after it had.
        locked_at: Option<usize>,
        lost: usize,
    },
}

/// Issue 44's report of a trace of launches (`size_of` gives a block
/// start's bytes; `None`: a block freed since, which weighs nothing),
/// under `budget`.
pub fn report(trace: &[Launched], size_of: impl Fn(u64) -> Option<u64>, budget: u64) -> Report {
    let kernels: Vec<u64> = trace.iter().map(|l| l.kernel).collect();
    let Some((period, covered)) = period(&kernels) else {
        return Report::NoRepeat {
            launches: trace.len(),
        };
    };
    let last = &trace[trace.len() - period..];
    let mut starts: Vec<u64> = last.iter().flat_map(|l| l.blocks.iter().copied()).collect();
    starts.sort_unstable();
    starts.dedup();
    let index = |p: &u64| starts.binary_search(p).unwrap_or(0);
    let step: Vec<Launch> = last
        .iter()
        .map(|l| l.blocks.iter().map(index).collect())
        .collect();
    let sizes: Vec<u64> = starts.iter().map(|&p| size_of(p).unwrap_or(0)).collect();
    match split(&step, &sizes, budget) {
        Split::Unfit { bytes, .. } => Report::Unfit { period, bytes },
        Split::Phases(p) => {
            let mut f = Follower::new(kernels[kernels.len() - period..].to_vec(), &p);
            let (mut locked_at, mut lost) = (None, 0);
            for (i, &k) in kernels.iter().enumerate() {
                if f.launched(k) == Followed::Lost {
                    lost += 1;
                }
                if locked_at.is_none() && f.locked() {
                    locked_at = Some(i);
                }
            }
            Report::Phases {
                period,
                covered,
                step_bytes: sizes.iter().fold(0u64, |a, &b| a.saturating_add(b)),
                phases: p.len(),
                moved: boundary_bytes(&p, &sizes).iter().sum(),
                locked_at,
                lost,
            }
        }
    }
}

/// What one launch tells a [`Follower`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    /// Nothing new: inside a phase, or not locked on the step.
    Same,
    /// The launch begins phase `i` of the step: where staging would move
    /// phase `i + 1`.
    Entered(usize),
    /// The launch is not the step's next one (a new shape, evaluation, a
    /// changed batch): the follower looks for the step's start again.
    Lost,
}

/// Where the program is in a learned step (issue 44, step 2: "where the
/// program is"), fed the kernel of each launch in order. It locks on the
/// step only after [`LOCK_ON`] launches (or the whole step, if shorter)
/// in a row match the step from its first kernel, since a step's first
/// kernel may also appear inside it; locked, it reports each phase's
/// first launch, and the first launch that breaks the order.
#[derive(Debug, Clone)]
pub struct Follower {
    kernels: Vec<u64>,
    /// The first launch of each phase, ascending (the first is 0).
    starts: Vec<usize>,
    /// The position of the next launch expected, and how many matched in
    /// a row since the step's first kernel (locked once at [`LOCK_ON`]).
    next: Option<usize>,
    matched: usize,
}

/// Launches that must match in a row before a follower trusts the step.
pub const LOCK_ON: usize = 8;

impl Follower {
    /// A follower of the step `kernels` cut into `phases` (from [`split`]).
    pub fn new(kernels: Vec<u64>, phases: &[Phase]) -> Follower {
        let mut starts: Vec<usize> = phases.iter().map(|p| p.start).collect();
        starts.sort_unstable();
        starts.dedup();
        Follower {
            kernels,
            starts,
            next: None,
            matched: 0,
        }
    }

    /// Whether it is locked on the step.
    pub fn locked(&self) -> bool {
        self.matched >= LOCK_ON.min(self.kernels.len())
    }

    /// One launch of `kernel`.
    pub fn launched(&mut self, kernel: u64) -> Followed {
        let n = self.kernels.len();
        if n == 0 {
            return Followed::Same;
        }
        let was_locked = self.locked();
        let pos = match self.next {
            Some(p) if self.kernels[p] == kernel => p,
            _ => {
                // Out of order: start again at the step's first kernel,
                // if this is it.
                self.next = None;
                self.matched = 0;
                if self.kernels[0] != kernel {
                    return if was_locked {
                        Followed::Lost
                    } else {
                        Followed::Same
                    };
                }
                if was_locked {
                    // Locked, a launch out of order is lost even when it is
                    // the step's first kernel (the step restarted early).
                    self.next = Some(1 % n);
                    self.matched = 1;
                    return Followed::Lost;
                }
                0
            }
        };
        self.next = Some((pos + 1) % n);
        self.matched = self.matched.saturating_add(1);
        match self.starts.binary_search(&pos) {
            Ok(i) if self.locked() => Followed::Entered(i),
            _ => Followed::Same,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn phases_at(starts: &[usize], len: usize) -> Vec<Phase> {
        starts
            .iter()
            .enumerate()
            .map(|(i, &start)| Phase {
                start,
                end: starts.get(i + 1).copied().unwrap_or(len),
                blocks: Vec::new(),
                bytes: 0,
            })
            .collect()
    }

    /// A step of 12 kernels whose first kernel (1) also appears inside it,
    /// in phases starting at 0, 5 and 9: the follower locks on only after
    /// LOCK_ON launches in a row from the step's start, then reports each
    /// phase's first launch every step; a launch out of order is Lost, and
    /// it locks on again one step start later.
    #[test]
    fn a_follower_locks_on_reports_phases_and_loses_an_order_that_breaks() {
        let step: Vec<u64> = vec![1, 2, 3, 1, 4, 5, 6, 7, 8, 9, 10, 11];
        let mut f = Follower::new(step.clone(), &phases_at(&[0, 5, 9], step.len()));
        let mut seen = Vec::new();
        // Warm-up noise, then the step twice.
        for k in [40, 41, 1, 40] {
            seen.push(f.launched(k));
        }
        assert!(seen.iter().all(|&s| s == Followed::Same), "{seen:?}");
        assert!(!f.locked());
        let mut entered = Vec::new();
        for (i, &k) in step.iter().chain(&step).enumerate() {
            if let Followed::Entered(p) = f.launched(k) {
                entered.push((i, p));
            }
        }
        // Locked after 8 launches of the first step: phase 2 (launch 9) is
        // the first reported, then the second step's three phases.
        assert_eq!(entered, [(9, 2), (12, 0), (17, 1), (21, 2)]);
        assert!(f.locked());
        // Evaluation: another kernel. Lost, once; then noise is Same.
        assert_eq!(f.launched(99), Followed::Lost);
        assert_eq!(f.launched(98), Followed::Same);
        assert!(!f.locked());
        // Training again: locks on after LOCK_ON launches from the start.
        let again: Vec<Followed> = step.iter().map(|&k| f.launched(k)).collect();
        assert_eq!(again[9], Followed::Entered(2), "{again:?}");
        assert!(again[..9].iter().all(|&s| s == Followed::Same), "{again:?}");
    }

    /// Locked, a step that restarts early (its first kernel where another
    /// was due) is Lost too, and counts as the start of the next lock-on.
    #[test]
    fn an_early_restart_is_lost_and_starts_the_next_lock_on() {
        let step: Vec<u64> = (1..=10).collect();
        let mut f = Follower::new(step.clone(), &phases_at(&[0, 4], step.len()));
        for &k in &step {
            f.launched(k);
        }
        assert!(f.locked());
        assert_eq!(f.launched(1), Followed::Entered(0));
        assert_eq!(f.launched(2), Followed::Same);
        assert_eq!(f.launched(1), Followed::Lost);
        let rest: Vec<Followed> = step[1..].iter().map(|&k| f.launched(k)).collect();
        // 1 + 7 matched: locked at kernel 8, past phase 1's start (5th).
        assert!(rest.iter().all(|&s| s == Followed::Same), "{rest:?}");
        assert!(f.locked());
        assert_eq!(f.launched(1), Followed::Entered(0));
    }

    /// A step shorter than LOCK_ON locks on after one whole step.
    #[test]
    fn a_short_step_locks_on_after_itself() {
        let mut f = Follower::new(vec![7, 8, 9], &phases_at(&[0, 2], 3));
        assert_eq!(
            [7, 8, 9, 7, 8, 9].map(|k| f.launched(k)),
            [
                Followed::Same,
                Followed::Same,
                Followed::Entered(1),
                Followed::Entered(0),
                Followed::Same,
                Followed::Entered(1)
            ]
        );
    }

    /// A training step of `layers` layers: forward uses each layer's
    /// weights (block l) and its activation (block layers + l); backward
    /// the same in reverse, with the gradient buffer (block 2 * layers);
    /// then the optimizer touches every weight.
    fn step(layers: usize) -> Vec<Launch> {
        let mut s = Vec::new();
        for l in 0..layers {
            s.push(vec![l, layers + l]);
        }
        for l in (0..layers).rev() {
            s.push(vec![l, layers + l, 2 * layers]);
        }
        s.push((0..layers).collect());
        s
    }

    #[test]
    fn a_repeating_step_is_found_and_a_changed_one_is_not() {
        let one = step(3);
        let mut trace = Vec::new();
        // Warm-up launches of another shape first, then three steps.
        trace.push(vec![9]);
        trace.push(vec![8, 9]);
        for _ in 0..3 {
            trace.extend(one.iter().cloned());
        }
        assert_eq!(period(&trace), Some((one.len(), 3 * one.len())));
        // A step's end that does not repeat yet (evaluation began).
        trace.push(vec![0, 7]);
        assert_eq!(period(&trace), None);
        // Too short to tell, and a trace of one launch repeated.
        assert_eq!(period(&[vec![1]]), None);
        assert_eq!(period(&[vec![1], vec![1], vec![1]]), Some((1, 3)));
        // The shortest period of the longest cover: a step made of two
        // equal halves.
        let half = vec![vec![1], vec![2, 3]];
        let doubled: Vec<Launch> = half
            .iter()
            .chain(&half)
            .chain(&half)
            .chain(&half)
            .cloned()
            .collect();
        assert_eq!(period(&doubled), Some((2, 8)));
    }

    /// What the H200 showed (session 16): a step that ends with two alike
    /// launches, and layers that repeat within a step, are not the step.
    #[test]
    fn the_step_is_the_period_that_covers_most() {
        // Kernels: 7 (embedding), then 1, 2 per layer for 3 layers, then
        // 5 twice (an optimizer's two alike launches): 10 a step.
        let one = [7, 1, 2, 1, 2, 1, 2, 5, 5];
        let mut trace = vec![3, 3, 4];
        for _ in 0..4 {
            trace.extend(one);
        }
        assert_eq!(period(&trace), Some((one.len(), 4 * one.len())));
        // Within one step, the layers' period covers the layers only.
        assert_eq!(period(&[7, 1, 2, 1, 2, 1, 2]), Some((2, 6)));
    }

    #[test]
    fn a_step_splits_into_the_fewest_phases_that_fit() {
        let s = step(3); // blocks 0..2 weights, 3..5 activations, 6 gradients
        let sizes = [
            100 * MIB,
            100 * MIB,
            100 * MIB,
            50 * MIB,
            50 * MIB,
            50 * MIB,
            100 * MIB,
        ];
        // Everything fits: one phase, nothing moves.
        let all = 550 * MIB;
        let Split::Phases(one) = split(&s, &sizes, all) else {
            panic!("fits");
        };
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].start, one[0].end, one[0].bytes), (0, 7, all));
        assert_eq!(boundary_bytes(&one, &sizes), [0]);
        // 300 MiB: forward 0-1 (300), forward 2 + backward 2 (250), backward
        // 1 (250), backward 0 (250), the optimizer (300).
        let Split::Phases(p) = split(&s, &sizes, 300 * MIB) else {
            panic!("fits");
        };
        let cuts: Vec<(usize, usize, u64)> =
            p.iter().map(|p| (p.start, p.end, p.bytes / MIB)).collect();
        assert_eq!(
            cuts,
            [
                (0, 2, 300),
                (2, 4, 250),
                (4, 5, 250),
                (5, 6, 250),
                (6, 7, 300)
            ]
        );
        assert_eq!(p[1].blocks, [2, 5, 6]);
        // In at each boundary: {2,5,6} after {0,1,3,4}, {1,4} after
        // {2,5,6}, {0,3} after {1,4,6}, {1,2} after {0,3,6}, and the next
        // step's {0,1,3,4} after {0,1,2}.
        assert_eq!(
            boundary_bytes(&p, &sizes)
                .iter()
                .map(|b| b / MIB)
                .collect::<Vec<_>>(),
            [250, 150, 150, 200, 100]
        );
        // A launch bigger than the budget by itself: staging cannot run it.
        assert_eq!(
            split(&s, &sizes, 280 * MIB),
            Split::Unfit {
                launch: 6,
                bytes: 300 * MIB
            }
        );
    }

    #[test]
    fn a_trace_is_reported_by_addresses() {
        // Blocks at 0x1000 (100 MiB), 0x2000 (100 MiB), 0x3000 (50 MiB);
        // a step launches kernel 1 on {1000, 3000} then kernel 2 on
        // {2000, 3000}, three times over.
        let size = |p: u64| match p {
            0x1000 | 0x2000 => Some(100 * MIB),
            0x3000 => Some(50 * MIB),
            _ => None,
        };
        let at = |kernel: u64, blocks: &[u64]| Launched {
            kernel,
            blocks: blocks.into(),
        };
        let one = [at(1, &[0x1000, 0x3000]), at(2, &[0x2000, 0x3000])];
        let mut trace: Vec<Launched> = one.iter().cycle().take(6).cloned().collect();
        assert_eq!(
            report(&trace, size, 150 * MIB),
            Report::Phases {
                period: 2,
                covered: 6,
                step_bytes: 250 * MIB,
                phases: 2,
                moved: 200 * MIB,
                locked_at: Some(1),
                lost: 0
            }
        );
        assert_eq!(
            report(&trace, size, 250 * MIB),
            Report::Phases {
                period: 2,
                covered: 6,
                step_bytes: 250 * MIB,
                phases: 1,
                moved: 0,
                locked_at: Some(1),
                lost: 0
            }
        );
        assert_eq!(
            report(&trace, size, 100 * MIB),
            Report::Unfit {
                period: 2,
                bytes: 150 * MIB
            }
        );
        assert_eq!(
            report(&trace[..3], size, 150 * MIB),
            Report::NoRepeat { launches: 3 }
        );
        // The kernels repeat, a block moved in the allocator: the period
        // holds, and the phases are the last step's blocks.
        trace.extend([at(1, &[0x1000, 0x4000]), at(2, &[0x2000, 0x3000])]);
        assert_eq!(
            report(&trace, size, 150 * MIB),
            Report::Phases {
                period: 2,
                covered: 8,
                step_bytes: 250 * MIB,
                phases: 2,
                moved: 250 * MIB,
                locked_at: Some(1),
                lost: 0
            }
        );
        // Another kernel in between (evaluation): the follower loses the
        // order once and locks on again.
        let mut broken: Vec<Launched> = one.iter().cycle().take(4).cloned().collect();
        broken.push(at(9, &[0x1000]));
        broken.extend(one.iter().cycle().take(6).cloned());
        assert_eq!(
            report(&broken, size, 150 * MIB),
            Report::Phases {
                period: 2,
                covered: 6,
                step_bytes: 250 * MIB,
                phases: 2,
                moved: 200 * MIB,
                locked_at: Some(1),
                lost: 1
            }
        );
    }

    #[test]
    fn unions_and_sizes_are_exact() {
        assert_eq!(union(&[1, 3, 5], &[2, 3, 6]), [1, 2, 3, 5, 6]);
        assert_eq!(union(&[], &[4]), [4]);
        assert_eq!(bytes_of(&[0, 9], &[7]), 7);
        assert_eq!(bytes_of(&[0, 0], &[u64::MAX]), u64::MAX);
    }
}
