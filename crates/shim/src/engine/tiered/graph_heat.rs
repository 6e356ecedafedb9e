//! Heat from graph launches: what the kernel nodes of an executable graph
//! name in tiered blocks, read once at instantiation, counted at each launch.

#[allow(unused_imports)]
use super::*;

/// What the kernel nodes of an executable graph name in tiered blocks:
/// each word once, with the weights of its uses summed; and how many
/// kernel nodes it has.
pub struct GraphUses {
    pub(super) kernels: u64,
    pub(super) words: Box<[(u64, u32)]>,
}

impl Tiers {
    /// `exec` was instantiated from `graph`, or updated to follow it: what
    /// its kernel nodes' words name in tiered blocks now is kept, to count
    /// as uses at each launch (the driver copies a graph's parameters into
    /// the executable graph as it is instantiated).
    pub fn graph_instantiated<D: Driver>(&self, driver: &D, exec: u64, graph: usize) {
        let (lo, hi) = self.span();
        if lo >= hi {
            // No tiered block yet: nothing the graph names can be one.
            write!(self.graphs).remove(&exec);
            return;
        }
        let mut kernels = 0u64;
        let mut words: Vec<(u64, u32)> = Vec::new();
        let whole = driver.graph_kernels(graph, &mut |func, params, extra| {
            kernels += 1;
            if func == 0 {
                return;
            }
            let k = self.layout(driver, func);
            // SAFETY: the driver's own parameters of the node, laid out as
            // a launch's.
            unsafe { scan(&k, params, extra, lo, hi, |w| words.push((w, k.weight))) };
        });
        if !whole {
            log_once!(
                Info,
                "tiered spill: the driver would not say what some graph holds (its nodes, a kernel node's parameters, or a conditional node's body): what it did not say counts no uses"
            );
        }
        // One entry a word, weights summed; only words in a block now.
        words.sort_unstable();
        words.dedup_by(|next, kept| {
            next.0 == kept.0 && {
                kept.1 = kept.1.saturating_add(next.1);
                true
            }
        });
        {
            let map = read!(self.blocks);
            words.retain(|&(w, _)| block_at(&map, w).is_some());
        }
        let uses = Arc::new(GraphUses {
            kernels,
            words: words.into(),
        });
        let mut graphs = write!(self.graphs);
        if graphs.len() >= MAX_GRAPHS && !graphs.contains_key(&exec) {
            drop(graphs);
            log_once!(
                Info,
                "tiered spill: more than {MAX_GRAPHS} executable graphs at once; the launches of those made after count no uses"
            );
            return;
        }
        graphs.insert(exec, uses);
    }

    /// A launch of `exec`: its kernels' uses ([`Tiers::graph_instantiated`]),
    /// and its kernels count as launches for the scores' decay.
    pub fn note_graph(&self, exec: u64) {
        let Some(g) = read!(self.graphs).get(&exec).cloned() else {
            return;
        };
        self.launches.fetch_add(g.kernels, Ordering::Relaxed);
        let map = read!(self.blocks);
        let hits = g
            .words
            .iter()
            .filter(|&&(w, weight)| note_in(&map, w, weight).is_some())
            .count() as u64;
        drop(map);
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
    }

    /// `exec` is being destroyed: its uses, to put back if that fails.
    pub fn take_graph(&self, exec: u64) -> Option<Arc<GraphUses>> {
        write!(self.graphs).remove(&exec)
    }

    /// Puts back what [`Tiers::take_graph`] took (the destroy failed).
    pub fn put_graph(&self, exec: u64, uses: Arc<GraphUses>) {
        write!(self.graphs).entry(exec).or_insert(uses);
    }
}
