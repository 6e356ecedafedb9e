//! Finding and reading the statistics pages and group files of live
//! processes.
//!
//! A reader trusts nothing in the directory, which other users or
//! containers may control. The work is split by concern:
//!
//! - [`dir`]: the directory walker. Directories are opened once and
//!   everything in them is opened relative to that descriptor, never by
//!   path again; a file is checked to be a regular file before it is opened
//!   for reading, and the inode checked is the one read. Stale files are
//!   removed only if their name still leads to the file that was read.
//! - [`file`]: reading an opened file. The reader's own files are mapped;
//!   anyone else's are copied out, because their owner could truncate a
//!   mapping under the reader.
//! - [`pages`]: the statistics pages (header checks, liveness, pruning of
//!   dead processes' pages), and mapping one page for writing (`trim`).
//! - [`groups`]: the group files (the reader's own are mapped for writing,
//!   to return dead members' bytes).
//! - [`sources`]: what `--dir` names (a directory, or a pattern with `*`
//!   components) and reading every directory it names.
//! - [`temps`]: removing temporary files that writers which died left.

mod dir;
mod file;
mod groups;
mod pages;
mod sources;
mod temps;

use std::path::PathBuf;

pub use groups::GroupSnapshot;
#[cfg(test)]
pub use groups::{GroupDeviceSnapshot, MemberSnapshot};
pub use pages::{Scan, map_for_write, scan};
pub use sources::{Reading, check_source, is_pattern, read_sources};

/// Whose pages and group files a reader shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Users {
    /// Only files of this user (owner and the uid written inside agree):
    /// what `stat`, `top` and the exporter read by default.
    Only(u32),
    /// Every user's (`--all-users`, for root reading the directories of
    /// other users or containers, where the uid inside a page may be one
    /// of the container's user namespace).
    All,
}

impl Users {
    fn accepts_owner(self, owner: u32) -> bool {
        match self {
            Users::Only(uid) => uid == owner,
            Users::All => true,
        }
    }

    fn expected(self) -> Option<u32> {
        match self {
            Users::Only(uid) => Some(uid),
            Users::All => None,
        }
    }
}

/// A file that was not shown, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}
