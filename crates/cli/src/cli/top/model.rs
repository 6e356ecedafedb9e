//! What the live view shows: one row per process and GPU, the groups, the
//! sort order, and each row's history of `USED`, read afresh on every
//! refresh exactly as `vramcap stat` reads the pages.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use vramcap_core::counters::SlotSnapshot;

use crate::cli::stat::{GpuSel, Sources};
use crate::read::GroupSnapshot;

/// Samples of `USED` kept per process and GPU for the sparkline.
pub const HISTORY: usize = 120;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Used,
    Pid,
    Gpu,
    Refusals,
}

impl SortBy {
    /// The columns in the order the view shows them (GPU, PID, USED, OOM).
    const ORDER: [SortBy; 4] = [SortBy::Gpu, SortBy::Pid, SortBy::Used, SortBy::Refusals];

    /// The column `step` places to the right (negative: left), wrapping.
    pub fn cycled(self, step: i8) -> SortBy {
        let n = Self::ORDER.len() as i64;
        let at = Self::ORDER.iter().position(|&s| s == self).unwrap_or(0) as i64;
        Self::ORDER[(at + i64::from(step)).rem_euclid(n) as usize]
    }
}

/// One process on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcRow {
    pub pid: u32,
    pub start_time: u64,
    /// The directory of the page (PIDs of two containers may be equal).
    pub dir: PathBuf,
    /// The command line, as the page recorded it.
    pub command: String,
    /// The Kubernetes pod and container the page recorded ("" when none).
    pub pod: String,
    pub container: String,
    pub slot: SlotSnapshot,
}

impl ProcRow {
    pub fn key(&self) -> HistoryKey {
        (
            self.dir.clone(),
            self.pid,
            self.start_time,
            self.slot.device,
        )
    }
}

/// Sorts rows by `by` in its natural direction (used and refusals largest
/// first, PID and GPU smallest first; ties by PID, then GPU), or the exact
/// opposite when `reverse`.
pub fn sort_rows(rows: &mut [ProcRow], by: SortBy, reverse: bool) {
    rows.sort_by(|a, b| {
        let ids = (a.pid, a.slot.device).cmp(&(b.pid, b.slot.device));
        let order = match by {
            SortBy::Used => b.slot.used.cmp(&a.slot.used).then(ids),
            SortBy::Pid => ids,
            SortBy::Gpu => a.slot.device.cmp(&b.slot.device).then(a.pid.cmp(&b.pid)),
            SortBy::Refusals => b.slot.refusals.cmp(&a.slot.refusals).then(ids),
        };
        if reverse { order.reverse() } else { order }
    });
}

/// (directory, pid, start time, GPU): a reused PID starts a fresh history,
/// and equal PIDs of two containers keep theirs apart.
pub type HistoryKey = (PathBuf, u32, u64, u32);

/// The last [`HISTORY`] values of one row's `USED`.
#[derive(Debug, Default, Clone)]
pub struct History {
    samples: VecDeque<u64>,
    /// Samples ever pushed (the absolute index of the next one).
    total: u64,
}

impl History {
    pub fn push(&mut self, value: u64) {
        if self.samples.len() == HISTORY {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
        self.total += 1;
    }

    pub fn max(&self) -> u64 {
        self.samples.iter().copied().max().unwrap_or(0)
    }

    /// The samples kept, oldest first, each with its absolute index (the
    /// number of samples pushed before it).
    pub fn indexed(&self) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let first = self.total - self.samples.len() as u64;
        self.samples
            .iter()
            .enumerate()
            .map(move |(i, &v)| (first + i as u64, v))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.len()
    }
}

/// The state of the view between refreshes.
pub struct Model {
    pub sources: Sources,
    /// `-i/--id`: only these GPUs (all when empty).
    pub gpus: Vec<GpuSel>,
    /// Sorted by `sort` and `reverse`.
    pub rows: Vec<ProcRow>,
    pub groups: Vec<GroupSnapshot>,
    pub processes: usize,
    pub skipped: usize,
    /// Why the last refresh found nothing to show.
    pub error: Option<String>,
    /// The local time of the last refresh (`HH:MM:SS`).
    pub time: String,
    pub history: HashMap<HistoryKey, History>,
    pub sort: SortBy,
    pub reverse: bool,
}

impl Model {
    pub fn new(sources: Sources, gpus: Vec<GpuSel>) -> Model {
        Model {
            sources,
            gpus,
            rows: Vec::new(),
            groups: Vec::new(),
            processes: 0,
            skipped: 0,
            error: None,
            time: String::new(),
            history: HashMap::new(),
            sort: SortBy::Used,
            reverse: false,
        }
    }

    /// Reads the pages again and extends every row's history.
    pub fn refresh(&mut self) {
        self.time = clock();
        let (s, groups) = match self.sources.read() {
            Ok(r) => (r.scan, r.groups),
            Err(e) => {
                self.error = Some(e);
                self.rows.clear();
                self.groups.clear();
                self.processes = 0;
                self.skipped = 0;
                self.history.clear();
                return;
            }
        };
        self.error = None;
        self.processes = s.pages.len();
        self.skipped = s.skipped_files();
        self.groups = groups;
        self.rows = s
            .pages
            .iter()
            .flat_map(|p| {
                let gpus = &self.gpus;
                p.devices
                    .iter()
                    .filter(move |d| gpus.is_empty() || gpus.iter().any(|g| g.matches(d)))
                    .map(|d| ProcRow {
                        pid: p.pid,
                        start_time: p.start_time,
                        dir: p.dir.clone(),
                        command: format!(
                            "{}{}",
                            p.park.label(
                                std::time::SystemTime::now()
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map_or(0, |t| t.as_nanos() as u64)
                            ),
                            p.command
                        ),
                        pod: p.pod.clone(),
                        container: p.container.clone(),
                        slot: *d,
                    })
            })
            .collect();
        let mut seen = HashMap::with_capacity(self.rows.len());
        for r in &self.rows {
            let mut h = self.history.remove(&r.key()).unwrap_or_default();
            h.push(r.slot.used);
            seen.insert(r.key(), h);
        }
        self.history = seen; // rows that went take their history with them
        self.sort_rows();
    }

    /// Sorts by `by`: another column in its natural direction, the same
    /// one as it is.
    pub fn sort_by(&mut self, by: SortBy) {
        if self.sort != by {
            self.sort = by;
            self.reverse = false;
        }
        self.sort_rows();
    }

    pub fn toggle_reverse(&mut self) {
        self.reverse = !self.reverse;
        self.sort_rows();
    }

    fn sort_rows(&mut self) {
        sort_rows(&mut self.rows, self.sort, self.reverse);
    }
}

fn clock() -> String {
    // SAFETY: time with a null pointer only returns the time.
    let t = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: tm is plain data, and localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return String::new();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, gpu: u32, used: u64, refusals: u64) -> ProcRow {
        ProcRow {
            dir: PathBuf::new(),
            pid,
            start_time: 1,
            command: String::new(),
            pod: String::new(),
            container: String::new(),
            slot: SlotSnapshot {
                device: gpu,
                used,
                refusals,
                ..SlotSnapshot::default()
            },
        }
    }

    fn order(rows: &[ProcRow]) -> Vec<(u32, u32)> {
        rows.iter().map(|r| (r.pid, r.slot.device)).collect()
    }

    #[test]
    fn sorting() {
        let mut rows = vec![
            row(20, 0, 500, 0),
            row(10, 1, 1000, 1),
            row(10, 0, 300, 0),
            row(30, 0, 500, 2),
        ];
        // One after the other: each sort starts from the order the last left.
        for (by, reverse, want) in [
            (SortBy::Used, false, [(10, 1), (20, 0), (30, 0), (10, 0)]),
            (SortBy::Used, true, [(10, 0), (30, 0), (20, 0), (10, 1)]),
            (SortBy::Pid, false, [(10, 0), (10, 1), (20, 0), (30, 0)]),
            (SortBy::Gpu, false, [(10, 0), (20, 0), (30, 0), (10, 1)]),
            (
                SortBy::Refusals,
                false,
                [(30, 0), (10, 1), (10, 0), (20, 0)],
            ),
            (SortBy::Gpu, true, [(10, 1), (30, 0), (20, 0), (10, 0)]),
        ] {
            sort_rows(&mut rows, by, reverse);
            assert_eq!(order(&rows), want, "{by:?} reverse={reverse}");
        }
    }

    #[test]
    fn choosing_another_column_sorts_it_in_its_natural_direction() {
        let sources = Sources {
            dirs: vec![PathBuf::from("/nonexistent")],
            users: crate::read::Users::All,
            private_to: None,
            named: false,
        };
        let mut m = Model::new(sources, Vec::new());
        m.rows = vec![row(20, 0, 500, 0), row(10, 1, 1000, 1)];
        m.toggle_reverse();
        assert_eq!(order(&m.rows), [(20, 0), (10, 1)]);
        m.sort_by(SortBy::Used);
        assert!(m.reverse, "the same column keeps its direction");
        m.sort_by(SortBy::Pid);
        assert!(!m.reverse);
        assert_eq!(order(&m.rows), [(10, 1), (20, 0)]);
    }

    #[test]
    fn history_keeps_the_last_samples_with_their_index() {
        let mut h = History::default();
        for v in 0..(HISTORY as u64 + 5) {
            h.push(v);
        }
        assert_eq!(h.len(), HISTORY);
        assert_eq!(h.max(), HISTORY as u64 + 4);
        assert_eq!(h.indexed().next(), Some((5, 5)));
        assert_eq!(
            h.indexed().next_back(),
            Some((HISTORY as u64 + 4, HISTORY as u64 + 4))
        );
    }
}
