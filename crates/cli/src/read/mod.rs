//! Finding and reading the statistics pages and group files of live
//! processes.
//!
//! A reader trusts nothing in the directory, which other users or
//! containers may control: nothing there may crash it, mislead it or make
//! it work without bound. The work is split by concern:
//!
//! - [`dir`]: the directory walker. Directories are opened once and
//!   everything in them is opened relative to that descriptor, never by
//!   path again; a file is checked to be a regular file before it is opened
//!   for reading, and the inode checked is the one read. Stale files are
//!   removed only if their name still leads to the file that was read.
//! - [`file`]: reading an opened file. Pages, and anyone else's group
//!   files, are copied out with `pread` (until two reads agree), never
//!   mapped: whoever can write a file can truncate it under a mapping and
//!   make the reader fault (SIGBUS), and a container's root is the same uid
//!   as the exporter's.
//! - [`guard`]: the one kind of mapping readers still make, for what must
//!   be changed in place with atomic instructions (the reader's own group
//!   files, to return dead members' bytes; a page's trim request): a fault
//!   in it is absorbed and the read thrown away instead of killing the
//!   reader.
//! - [`budget`]: how much one scan may do: a bound on entries listed,
//!   directories, files opened, rows and group members shown, and a
//!   deadline, each directory getting a fair share, so files one tenant
//!   plants in its directories cost the others nothing and the memory used
//!   stays proportional to what is shown. What is past a bound is
//!   reported in one line per directory.
//! - [`pages`]: the statistics pages (header checks, liveness, pruning of
//!   dead processes' pages), and mapping one page for writing (`trim`).
//! - [`groups`]: the group files.
//! - [`sources`]: what `--dir` names (a directory, or a pattern with `*`
//!   components) and reading every directory it names.
//! - [`temps`]: removing temporary files that writers which died left.
//!
//! Every string taken from a page, a group file or a file name reaches the
//! caller through `vramcap_core::text` (control characters, text-hiding
//! characters and bytes that are not UTF-8 escaped); paths are kept as
//! they are, for the caller to show with `vramcap_core::text::path`.

mod budget;
mod dir;
mod file;
#[cfg(test)]
mod fuzz;
mod groups;
mod guard;
mod pages;
mod sources;
mod temps;
#[cfg(test)]
mod testpages;

use std::path::PathBuf;

pub use budget::Bounds;
#[cfg(test)]
pub use groups::{GroupDeviceSnapshot, MemberSnapshot};
pub use groups::{GroupSnapshot, map_group_for_write};
pub use pages::{PageMap, Scan, map_for_write};
pub use sources::{Reading, Scope, check_source, is_pattern, read_sources};

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

/// A file that was not shown, and why; or a directory in which `count`
/// files were not read or not shown, past a bound of the scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
    /// Files this entry stands for (1 for one file).
    pub count: usize,
}

impl Skipped {
    pub fn file(path: PathBuf, reason: String) -> Skipped {
        Skipped {
            path,
            reason,
            count: 1,
        }
    }
}
