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
use super::dir::{Dir, has_extension};
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
        let listing = match dir.list(allow.entries, |n| !n.starts_with(b".")) {
            Ok(l) => l,
            Err(e) if matched => {
                self.skip(&dir.path, format!("cannot list the directory: {e}"), 1);
                return Ok(Counts::default());
            }
            Err(e) => return Err((dir.path.clone(), e)),
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
        let listing = match dir.list(allow.entries, keep) {
            Ok(l) => l,
            Err(e) if matched => {
                self.skip(&dir.path, format!("cannot read the directory: {e}"), 1);
                return Ok(Counts::default());
            }
            Err(e) => return Err((dir.path.clone(), e)),
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
mod tests {
    use super::*;
    use crate::read::testpages::{scratch, write_page};
    use std::os::unix::fs::PermissionsExt;

    fn tree(name: &str, dirs: &[&str]) -> PathBuf {
        let root = scratch(&format!("expand-{name}"));
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        root
    }

    fn scope(bounds: Bounds) -> Scope {
        Scope {
            users: Users::All,
            private_to: None,
            bounds,
        }
    }

    fn read(root: &Path, source: &str) -> Result<Reading, Failed> {
        read_sources(&[root.join(source)], &scope(Bounds::DEFAULT))
    }

    /// The directories a source led to, relative to `root`.
    fn read_dirs(root: &Path, source: &str) -> Vec<String> {
        read(root, source)
            .unwrap()
            .dirs_read
            .iter()
            .map(|d| d.strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn a_plain_directory_is_itself_and_stars_match_each_subdirectory() {
        let root = tree(
            "stars",
            &[
                "pods/b/v/s",
                "pods/a/v/s",
                "pods/c/other",
                "pods/.hidden/v/s",
            ],
        );
        std::fs::write(root.join("pods/file"), b"not a directory").unwrap();
        std::os::unix::fs::symlink(root.join("pods/a"), root.join("pods/link")).unwrap();

        assert_eq!(read_dirs(&root, "pods"), ["pods"]);
        assert_eq!(read_dirs(&root, "pods/*"), ["pods/a", "pods/b", "pods/c"]);

        // After a `*`, a component that is a symbolic link is not followed
        // (pods/c/v links to pods/a/v); a missing one is nothing.
        std::os::unix::fs::symlink(root.join("pods/a/v"), root.join("pods/c/v")).unwrap();
        assert_eq!(
            read_dirs(&root, "pods/*/v/s"),
            ["pods/a/v/s", "pods/b/v/s"],
            "later components are opened in turn"
        );

        // Before the first `*`, the path is the reader's: links are followed.
        std::os::unix::fs::symlink(root.join("pods"), root.join("via")).unwrap();
        assert_eq!(read_dirs(&root, "via/*").len(), 3);
        assert!(read_dirs(&root, "missing/*").is_empty());
        let r = read(&root, "pods/*").unwrap();
        assert!(r.scan.skipped.is_empty(), "{:?}", r.scan.skipped);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_unreadable_prefix_is_an_error_an_unreadable_match_is_skipped() {
        let root = tree("unreadable", &["pods/a/x", "pods/b/x"]);
        // A file where a directory is expected, named outright: an error.
        std::fs::write(root.join("flat"), b"x").unwrap();
        let (p, e) = read(&root, "flat/*").map(|_| ()).unwrap_err();
        assert_eq!(p, root.join("flat"));
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Root opens any directory: the rest needs permissions to bite.
            std::fs::remove_dir_all(&root).unwrap();
            return;
        }
        std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let r = read(&root, "pods/*/*").unwrap();
        assert_eq!(r.dirs_read, [root.join("pods/b/x")]);
        assert_eq!(r.scan.skipped.len(), 1);
        assert_eq!(r.scan.skipped[0].path, root.join("pods/a"));
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let (p, _) = read(&root, "pods/*").map(|_| ()).unwrap_err();
        assert_eq!(p, root.join("pods"));
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A default directory someone else made, or a link planted under its
    /// name, is not read and says why; a missing one is empty.
    #[test]
    fn default_directories_are_read_only_when_they_are_ours() {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let root = scratch("private");
        let mine = root.join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        let _live = write_page(&mine, 41, 1, "python a.py");
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _planted = write_page(&open, 42, 1, "planted");
        std::os::unix::fs::symlink(&mine, root.join("link")).unwrap();
        let sources = ["mine", "open", "link", "missing"].map(|d| root.join(d));
        let s = Scope {
            users: Users::Only(uid),
            private_to: Some(uid),
            bounds: Bounds::DEFAULT,
        };
        let r = read_sources(&sources, &s).unwrap();
        assert_eq!(r.dirs_read, std::slice::from_ref(&mine));
        let pids: Vec<u32> = r.scan.pages.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [41]);
        let why: Vec<(PathBuf, &str)> = r
            .scan
            .skipped
            .iter()
            .map(|s| (s.path.clone(), s.reason.as_str()))
            .collect();
        assert_eq!(
            why,
            [
                (
                    open.clone(),
                    "not read: it is open to other users (mode 755); a default statistics directory is used only when it is yours with mode 700 (the shim writes nothing there either)"
                ),
                (
                    root.join("link"),
                    "not read: it is a symbolic link; a default statistics directory is used only when it is yours with mode 700 (the shim writes nothing there either)"
                ),
            ]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// One directory full of live pages claiming every GPU takes only its
    /// share: the others are read whole, and what is past the share is one
    /// line with its count.
    #[test]
    fn a_crowded_directory_takes_only_its_share() {
        let root = tree("crowded", &["pods/a", "pods/b", "pods/c"]);
        let mut held = Vec::new();
        for pid in 1..=40 {
            held.push(write_page(&root.join("pods/b"), pid, 64, "forged"));
        }
        held.push(write_page(&root.join("pods/a"), 100, 2, "a"));
        held.push(write_page(&root.join("pods/c"), 200, 8, "c"));
        let bounds = Bounds {
            rows: 300,
            ..Bounds::DEFAULT
        };
        let r = read_sources(&[root.join("pods/*")], &scope(bounds)).unwrap();
        let rows = |dir: &str| -> usize {
            r.scan
                .pages
                .iter()
                .filter(|p| p.dir == root.join(dir))
                .map(|p| p.devices.len())
                .sum()
        };
        // a: 2 rows (share 100); b: share (300-2)/2 = 149 -> two pages of 64;
        // c: the 8 rows it has.
        assert_eq!(
            (rows("pods/a"), rows("pods/b"), rows("pods/c")),
            (2, 128, 8)
        );
        assert_eq!(
            r.scan.skipped,
            [Skipped {
                path: root.join("pods/b"),
                reason: "38 pages not shown: past this directory's share of the 300 process-GPU rows a scan shows".into(),
                count: 38,
            }]
        );
        assert_eq!(r.scan.skipped_files(), 38);
        drop(held);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Every other bound: names listed, directories, files opened, and the
    /// deadline, each reported once per directory with what it left out.
    #[test]
    fn every_bound_is_reported_once_per_directory() {
        let root = tree("bounds", &["d", "many/1", "many/2", "many/3", "many/4"]);
        let mut held = Vec::new();
        for pid in 1..=10 {
            held.push(write_page(&root.join("d"), pid, 1, "p"));
        }
        let reasons = |b: Bounds, src: &str| -> Vec<(String, usize)> {
            let r = read_sources(&[root.join(src)], &scope(b)).unwrap();
            r.scan
                .skipped
                .iter()
                .map(|s| (s.reason.clone(), s.count))
                .collect()
        };
        assert_eq!(
            reasons(Bounds { files: 4, ..Bounds::DEFAULT }, "d"),
            [("6 files not read: past this directory's share of the 4 pages and group files a scan opens".to_string(), 6)]
        );
        assert_eq!(
            reasons(Bounds { entries: 3, ..Bounds::DEFAULT }, "d"),
            [("only its first 3 names were looked at (its share of the 3 a scan lists); files past them were not read".to_string(), 1)]
        );
        assert_eq!(
            reasons(
                Bounds {
                    dirs: 2,
                    ..Bounds::DEFAULT
                },
                "many/*"
            ),
            [(
                "2 subdirectories not read: past its share of the 2 directories a scan reads"
                    .to_string(),
                2
            )]
        );
        assert_eq!(
            reasons(
                Bounds {
                    time: std::time::Duration::ZERO,
                    ..Bounds::DEFAULT
                },
                "d"
            ),
            [(
                "not read: the scan stopped at its deadline (0 s)".to_string(),
                1
            )]
        );
        drop(held);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sources_are_checked() {
        assert!(check_source(Path::new("/run/vramcap/pods/*")).is_ok());
        assert!(check_source(Path::new("/run/vramcap")).is_ok());
        let e = check_source(Path::new("pods/*")).unwrap_err();
        assert!(e.contains("expected an absolute directory path"), "{e}");
        let e = check_source(Path::new("/run/pods/pod-*")).unwrap_err();
        assert!(e.contains("`*` must be a whole path component"), "{e}");
        let e = check_source(Path::new("/run/vramcap/pods/*/../..")).unwrap_err();
        assert!(e.contains("`..` is not allowed"), "{e}");
        assert!(is_pattern(Path::new("/a/*/b")));
        assert!(!is_pattern(Path::new("/a/b")));
    }
}
