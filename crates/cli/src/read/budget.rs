//! How much one scan may do, and how it is shared between directories.
//!
//! Anyone who can write a directory a reader reads (a container's volume,
//! with `--all-users`) can fill it with files that look like pages: live
//! ones (their owner holds the lock), each claiming every GPU, or millions
//! of names, or thousands of subdirectories. Unbounded, one scrape of 2000
//! such pages took seconds and hundreds of MB. A scan is therefore bounded
//! ([`Bounds`]): names looked at in listings, directories read, files
//! opened, process-GPU rows shown (a page without a GPU counts as one),
//! group members shown (a group counts one more), and a deadline. The
//! size of what is read is bounded by the layouts: a page's 17 KiB and a
//! group file's size, whatever the file's length.
//!
//! Each bound is shared between the parts of the walk in turn: the k-th of
//! n siblings (the directories a `*` matched, or the sources) may use
//! `left / (n - k + 1)` of what is left, and what it leaves unused goes to
//! the ones after it. Shares never shrink along the way, so every
//! directory gets at least `bound / n`, and a directory that needs no more
//! than that is read whole whatever the others hold: files planted in one
//! tenant's directories never hide another tenant's pages. What a
//! directory holds past its share is reported in one line for that
//! directory ([`super::Skipped`] with a count), not one per file; past the
//! deadline, the scan stops and answers with what it has.

use std::time::{Duration, Instant};

/// The bounds of one scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Names looked at in directory listings.
    pub entries: usize,
    /// Directories read (for pages, and matched by `*`).
    pub dirs: usize,
    /// Pages and group files opened.
    pub files: usize,
    /// Process-GPU rows shown (a page without a GPU counts as one).
    pub rows: usize,
    /// Group members shown (each group counts one more).
    pub members: usize,
    /// How long a scan may take.
    pub time: Duration,
}

impl Bounds {
    /// What `stat`, `top`, `trim` and the exporter read per scan: far more
    /// than a node runs (8 GPUs × 512 processes is 4096 rows), far less
    /// than would cost more than a few MB and tens of milliseconds.
    pub const DEFAULT: Bounds = Bounds {
        entries: 65_536,
        dirs: 1024,
        files: 8192,
        rows: 4096,
        members: 4096,
        time: Duration::from_secs(2),
    };
}

/// Counts of what may still be done (or what was done).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub entries: usize,
    pub dirs: usize,
    pub files: usize,
    pub rows: usize,
    pub members: usize,
}

impl Counts {
    pub fn of(b: &Bounds) -> Counts {
        Counts {
            entries: b.entries,
            dirs: b.dirs,
            files: b.files,
            rows: b.rows,
            members: b.members,
        }
    }

    /// The share of the first of `parts` siblings still to go.
    pub fn share(&self, parts: usize) -> Counts {
        let p = parts.max(1);
        Counts {
            entries: self.entries / p,
            dirs: self.dirs / p,
            files: self.files / p,
            rows: self.rows / p,
            members: self.members / p,
        }
    }

    /// What is left after `used` (never below zero).
    pub fn minus(&self, used: &Counts) -> Counts {
        Counts {
            entries: self.entries.saturating_sub(used.entries),
            dirs: self.dirs.saturating_sub(used.dirs),
            files: self.files.saturating_sub(used.files),
            rows: self.rows.saturating_sub(used.rows),
            members: self.members.saturating_sub(used.members),
        }
    }

    pub fn add(&mut self, other: &Counts) {
        self.entries += other.entries;
        self.dirs += other.dirs;
        self.files += other.files;
        self.rows += other.rows;
        self.members += other.members;
    }
}

/// The deadline of one scan.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    pub time: Duration,
}

impl Deadline {
    pub fn after(time: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + time,
            time,
        }
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Siblings taking their shares in turn: each gets at least an equal
    /// part, one that needs less leaves the rest to those after it, and
    /// together they never pass the bound.
    #[test]
    fn shares_are_fair_and_never_shrink() {
        let total = Counts {
            rows: 100,
            ..Counts::default()
        };
        // Four directories needing 1000, 3, 1000 and 10 rows.
        let needs = [1000, 3, 1000, 10];
        let mut left = total;
        let mut got = Vec::new();
        let mut last_share = 0;
        for (k, need) in needs.iter().enumerate() {
            let share = left.share(needs.len() - k).rows;
            assert!(share >= last_share, "shares never shrink");
            last_share = share;
            let used = (*need).min(share);
            got.push(used);
            left = left.minus(&Counts {
                rows: used,
                ..Counts::default()
            });
        }
        assert_eq!(got, [25, 3, 36, 10]);
        assert!(got.iter().sum::<usize>() <= 100);
    }
}
