//! What `--dir` names, and reading every directory it names.
//!
//! A source is an absolute directory path, or a pattern in which a
//! component that is exactly `*` stands for each subdirectory at that
//! level. The part before the first `*` is the reader's own choice and is
//! opened as a path, symbolic links followed; from the first `*` on, others
//! may control the directories, so every component is opened relative to
//! its parent without following a symbolic link. One directory matched by a
//! `*` that cannot be read is reported as skipped, so one container's
//! directory never hides the others. Default directories (no `--dir`, no
//! `VRAMCAP_STATS_DIR`) are read only when they are the user's own
//! ([`Scope::private_to`]), as the shim writes only there.
//!
//! The walk is depth first, in name order, one directory open per level,
//! and every part of it takes its share of the scan's bounds in turn (see
//! [`super::budget`]): the sources, the directories each `*` matched, the
//! files of each directory.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use vramcap_core::stats_dir::{self, DirProblem};

use super::budget::{Bounds, Counts, Deadline};
use super::dir::{Dir, Listing, has_extension};
use super::groups::{GroupSnapshot, read_group};
use super::pages::{Outcome, Scan, read_one};
use super::{Skipped, Users};
use vramcap_core::group::is_temp_name;

/// What [`read_sources`] found in every directory it read.
#[derive(Debug, Default)]
pub struct Reading {
    /// Pages of live processes, by PID (the same PID from two directories,
    /// e.g. two containers, appears twice, in directory order).
    pub scan: Scan,
    pub groups: Vec<GroupSnapshot>,
    /// The directories whose pages were read, in order.
    pub dirs_read: Vec<PathBuf>,
}

/// How a scan reads its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// Whose pages and group files are shown.
    pub users: Users,
    /// `Some(uid)` when the sources are the default directories (plain
    /// paths): each is read only if it is a directory, reached without a
    /// symbolic link, that `uid` owns with no access for others; anything
    /// else under that name is reported as skipped (and a missing one is
    /// empty). Someone else's directory there holds no page of this user:
    /// the shim writes only to its own.
    pub private_to: Option<u32>,
    pub bounds: Bounds,
}

/// Whether a source names directories through `*` components.
pub fn is_pattern(source: &Path) -> bool {
    source.components().any(|c| c.as_os_str() == "*")
}

/// Checks a source as the command line gives it: an absolute path without
/// `..`, in which `*`, if any, stands alone as a whole component.
pub fn check_source(source: &Path) -> Result<(), String> {
    use std::path::Component;
    if !source.is_absolute() {
        return Err(format!(
            "--dir {:?} is not valid: expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
            source
        ));
    }
    if source.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "--dir {:?} is not valid: `..` is not allowed (name the directory itself)",
            source
        ));
    }
    let bad = source.components().find(|c| {
        let b = c.as_os_str().as_bytes();
        b != b"*" && b.contains(&b'*')
    });
    if let Some(c) = bad {
        return Err(format!(
            "--dir {:?} is not valid: `*` must be a whole path component (it stands for every subdirectory there), not part of {:?}",
            source,
            c.as_os_str()
        ));
    }
    Ok(())
}

/// One scan in progress.
struct Walk<'a> {
    scope: &'a Scope,
    deadline: Deadline,
    out: Reading,
    seen: HashSet<PathBuf>,
}

type Failed = (PathBuf, io::Error);

impl Walk<'_> {
    /// dir's names that `keep` keeps (`max` at most); when they can not be
    /// listed, `None` with the directory skipped (saying `what`) where it
    /// was matched, else the error.
    fn list_or_skip(
        &mut self,
        dir: &Dir,
        matched: bool,
        max: usize,
        keep: impl Fn(&[u8]) -> bool,
        what: &str,
    ) -> Result<Option<Listing>, Failed> {
        match dir.list(max, keep) {
            Ok(l) => Ok(Some(l)),
            Err(e) if matched => {
                self.skip(&dir.path, format!("{what}: {e}"), 1);
                Ok(None)
            }
            Err(e) => Err((dir.path.clone(), e)),
        }
    }

    fn skip(&mut self, path: &Path, reason: String, count: usize) {
        self.out.scan.skipped.push(Skipped {
            path: path.to_path_buf(),
            reason,
            count,
        });
    }

    fn late(&self) -> String {
        format!(
            "the scan stopped at its deadline ({} s)",
            self.deadline.time.as_secs_f64()
        )
    }

    /// Reads one source within `allow`; returns what it used.
    fn source(&mut self, source: &Path, allow: Counts) -> Result<Counts, Failed> {
        let comps: Vec<Component> = source.components().collect();
        let first_star = comps
            .iter()
            .position(|c| c.as_os_str() == "*")
            .unwrap_or(comps.len());
        let prefix: PathBuf = comps[..first_star].iter().collect();
        let root = match self.scope.private_to {
            Some(uid) => match stats_dir::open_dir(&prefix, Some(uid)) {
                Ok(fd) => Dir::from_fd(fd, prefix),
                Err(DirProblem::Missing) => return Ok(Counts::default()),
                Err(p) => {
                    let reason = format!(
                        "not read: it {}; a default statistics directory is used only when it is yours with mode 700 (the shim writes nothing there either)",
                        p.phrase(uid)
                    );
                    self.skip(&prefix, reason, 1);
                    return Ok(Counts::default());
                }
            },
            None => match Dir::open(&prefix) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Counts::default()),
                Err(e) => return Err((prefix, e)),
            },
        };
        let rest: Vec<&OsStr> = comps[first_star..].iter().map(|c| c.as_os_str()).collect();
        self.walk(root, &rest, false, allow)
    }

    /// Goes down `rest` from `dir`: a `*` stands for each subdirectory
    /// (names starting with `.` left out), any other component for itself
    /// (gone, or not a directory, a symbolic link among them: nothing to
    /// read there). `matched`: a `*` led here.
    fn walk(
        &mut self,
        dir: Dir,
        rest: &[&OsStr],
        matched: bool,
        allow: Counts,
    ) -> Result<Counts, Failed> {
        let Some((&comp, rest)) = rest.split_first() else {
            return self.leaf(dir, matched, allow);
        };
        if comp != "*" {
            return match dir.sub(comp) {
                Ok(d) => self.walk(d, rest, matched, allow),
                Err(_) => Ok(Counts::default()),
            };
        }
        if self.deadline.passed() {
            let why = format!("not read: {}", self.late());
            self.skip(&dir.path, why, 1);
            return Ok(Counts::default());
        }
        let Some(listing) = self.list_or_skip(
            &dir,
            matched,
            allow.entries,
            |n| !n.starts_with(b"."),
            "cannot list the directory",
        )?
        else {
            return Ok(Counts::default());
        };
        let mut used = Counts {
            entries: listing.looked,
            ..Counts::default()
        };
        if !listing.complete {
            let why = format!(
                "only its first {} names were looked at (its share of the {} a scan lists); subdirectories past them were not read",
                listing.looked, self.scope.bounds.entries
            );
            self.skip(&dir.path, why, 1);
        }
        let n = listing.names.len();
        let (mut over, mut late) = (0, 0);
        for (k, name) in listing.names.iter().enumerate() {
            if self.deadline.passed() {
                late += 1;
                continue;
            }
            let share = allow.minus(&used).share(n - k);
            if share.dirs == 0 {
                over += 1;
                continue;
            }
            let sub = match dir.sub(name) {
                Ok(d) => d,
                // A file, a symbolic link, or gone: no directory to read.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOTDIR | libc::ELOOP | libc::ENOENT)
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    let path = dir.path.join(name);
                    self.skip(&path, format!("cannot open the directory: {e}"), 1);
                    continue;
                }
            };
            let u = self.walk(sub, rest, true, share)?;
            used.add(&u);
        }
        if over > 0 {
            let why = format!(
                "{over} subdirectories not read: past its share of the {} directories a scan reads",
                self.scope.bounds.dirs
            );
            self.skip(&dir.path, why, over);
        }
        if late > 0 {
            let why = format!("{late} subdirectories not read: {}", self.late());
            self.skip(&dir.path, why, late);
        }
        Ok(used)
    }

    /// Reads the pages and group files of one directory within `allow`.
    fn leaf(&mut self, dir: Dir, matched: bool, allow: Counts) -> Result<Counts, Failed> {
        if !self.seen.insert(dir.path.clone()) {
            return Ok(Counts::default());
        }
        if allow.dirs == 0 || self.deadline.passed() {
            let why = if allow.dirs == 0 {
                format!(
                    "not read: past the {} directories a scan reads",
                    self.scope.bounds.dirs
                )
            } else {
                format!("not read: {}", self.late())
            };
            self.skip(&dir.path, why, 1);
            return Ok(Counts::default());
        }
        // One listing serves the pages, the group files and the temporary
        // files of writers that died (`temps`).
        let keep =
            |n: &[u8]| has_extension(n, "page") || has_extension(n, "grp") || is_temp_name(n);
        let Some(listing) = self.list_or_skip(
            &dir,
            matched,
            allow.entries,
            keep,
            "cannot read the directory",
        )?
        else {
            return Ok(Counts::default());
        };
        let mut used = Counts {
            entries: listing.looked,
            dirs: 1,
            ..Counts::default()
        };
        self.out.dirs_read.push(dir.path.clone());
        if !listing.complete {
            let why = format!(
                "only its first {} names were looked at (its share of the {} a scan lists); files past them were not read",
                listing.looked, self.scope.bounds.entries
            );
            self.skip(&dir.path, why, 1);
        }
        let users = self.scope.users;
        let (mut over_files, mut over_rows, mut over_members, mut late) = (0, 0, 0, 0);
        let pages = listing
            .names
            .iter()
            .filter(|n| has_extension(n.as_bytes(), "page"));
        let groups = listing
            .names
            .iter()
            .filter(|n| has_extension(n.as_bytes(), "grp"));
        for (name, is_page) in pages.map(|n| (n, true)).chain(groups.map(|n| (n, false))) {
            if self.deadline.passed() {
                late += 1;
                continue;
            }
            // Full up: no page (or group) can be shown any more, so none is
            // opened (each costs at least one row, or one member).
            if is_page && used.rows >= allow.rows {
                over_rows += 1;
                continue;
            }
            if !is_page && used.members >= allow.members {
                over_members += 1;
                continue;
            }
            if used.files >= allow.files {
                over_files += 1;
                continue;
            }
            used.files += 1;
            let path = dir.path.join(name);
            if is_page {
                match read_one(&dir, name, users) {
                    Outcome::Live(mut p) => {
                        let cost = p.devices.len().max(1);
                        if used.rows + cost > allow.rows {
                            over_rows += 1;
                            continue;
                        }
                        used.rows += cost;
                        p.dir = dir.path.clone();
                        self.out.scan.pages.push(p);
                    }
                    Outcome::Dead(id) => {
                        if dir.remove_if_same(name, id) {
                            self.out.scan.pruned.push(path);
                        }
                    }
                    Outcome::Skip(reason) => {
                        self.out.scan.skipped.push(Skipped::file(path, reason))
                    }
                    Outcome::Ignore => {}
                }
                continue;
            }
            match read_group(&dir, name, users) {
                Ok(Some(mut g)) => {
                    let cost = g.members.len() + 1;
                    if used.members + cost > allow.members {
                        over_members += 1;
                        continue;
                    }
                    used.members += cost;
                    g.dir = dir.path.clone();
                    self.out.groups.push(g);
                }
                Ok(None) => {}
                Err(reason) => self.out.scan.skipped.push(Skipped::file(path, reason)),
            }
        }
        self.out
            .scan
            .pruned
            .extend(super::temps::remove_stale(&dir, &listing.names));
        let b = self.scope.bounds;
        let summaries = [
            (
                over_files,
                format!(
                    "{over_files} files not read: past this directory's share of the {} pages and group files a scan opens",
                    b.files
                ),
            ),
            (
                over_rows,
                format!(
                    "{over_rows} pages not shown: past this directory's share of the {} process-GPU rows a scan shows",
                    b.rows
                ),
            ),
            (
                over_members,
                format!(
                    "{over_members} group files not shown: past this directory's share of the {} group members a scan shows",
                    b.members
                ),
            ),
            (late, format!("{late} files not read: {}", self.late())),
        ];
        for (n, why) in summaries {
            if n > 0 {
                self.skip(&dir.path, why, n);
            }
        }
        Ok(used)
    }
}

/// Reads the pages and group files of every directory the sources name
/// (see the module), each directory once, within the scope's bounds. A
/// missing directory is empty; a directory named outright that cannot be
/// read is the error returned, with its path; one matched by a `*` that
/// cannot be read is reported as skipped, so one container's directory
/// never hides the others.
pub fn read_sources(sources: &[PathBuf], scope: &Scope) -> Result<Reading, Failed> {
    let mut w = Walk {
        scope,
        deadline: Deadline::after(scope.bounds.time),
        out: Reading::default(),
        seen: HashSet::new(),
    };
    let mut left = Counts::of(&scope.bounds);
    for (k, source) in sources.iter().enumerate() {
        let used = w.source(source, left.share(sources.len() - k))?;
        left = left.minus(&used);
    }
    w.out.scan.pages.sort_by_key(|p| p.pid);
    Ok(w.out)
}

#[cfg(test)]
mod tests;
