//! What `--dir` names, and reading every directory it names.
//!
//! A source is an absolute directory path, or a pattern in which a
//! component that is exactly `*` stands for each subdirectory at that
//! level. The part before the first `*` is the reader's own choice and is
//! opened as a path, symbolic links followed; from the first `*` on, others
//! may control the directories, so every component is opened relative to
//! its parent without following a symbolic link. One directory matched by a
//! `*` that cannot be read is reported as skipped, so one container's
//! directory never hides the others.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::dir::Dir;
use super::groups::{GroupSnapshot, groups_names};
use super::pages::{Scan, scan_names};
use super::{Skipped, Users};

/// What [`read_sources`] found in every directory it read.
#[derive(Debug, Default)]
pub struct Reading {
    /// Pages of live processes, by PID (the same PID from two directories,
    /// e.g. two containers, appears twice, in directory order).
    pub scan: Scan,
    pub groups: Vec<GroupSnapshot>,
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

/// An open directory a source names, and whether a `*` matched it.
struct Found {
    dir: Dir,
    matched: bool,
}

/// Directories a source names, and matched ones that could not be listed.
type Expanded = (Vec<Found>, Vec<Skipped>);

/// The directories `source` names: itself, or for a pattern every match,
/// where a component that is exactly `*` stands for each subdirectory at
/// that level (names starting with `.` are left out). The part before the
/// first `*` is opened as a path, symbolic links followed (it is the
/// reader's choice); from the first `*` on, every component is opened
/// relative to its parent without following a symbolic link, since others
/// may control those directories. A directory matched by a `*` that cannot
/// be listed is reported in the skipped list; an error opening the part the
/// source names outright is returned.
fn expand(source: &Path) -> Result<Expanded, (PathBuf, io::Error)> {
    use std::path::Component;
    let comps: Vec<Component> = source.components().collect();
    let first_star = comps
        .iter()
        .position(|c| c.as_os_str() == "*")
        .unwrap_or(comps.len());
    let prefix: PathBuf = comps[..first_star].iter().collect();
    let root = match Dir::open(&prefix) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err((prefix, e)),
    };
    let mut current = vec![Found {
        dir: root,
        matched: false,
    }];
    let mut skipped = Vec::new();
    for comp in &comps[first_star..] {
        let mut next = Vec::new();
        for found in current {
            if comp.as_os_str() != "*" {
                // Gone, or not a directory (a symbolic link among them):
                // nothing to read there.
                if let Ok(dir) = found.dir.sub(comp.as_os_str()) {
                    next.push(Found {
                        dir,
                        matched: found.matched,
                    });
                }
                continue;
            }
            let names = match found.dir.names() {
                Ok(n) => n,
                Err(e) if found.matched => {
                    skipped.push(Skipped {
                        path: found.dir.path.clone(),
                        reason: format!("cannot list the directory: {e}"),
                    });
                    continue;
                }
                Err(e) => return Err((found.dir.path.clone(), e)),
            };
            for name in names.iter().filter(|n| !n.as_bytes().starts_with(b".")) {
                if let Ok(dir) = found.dir.sub(name) {
                    next.push(Found { dir, matched: true });
                }
            }
        }
        current = next;
    }
    Ok((current, skipped))
}

/// Reads the pages and group files of every directory the sources name
/// (see [`expand`]), each directory once. A missing directory is empty; a
/// directory named outright that cannot be read is the error returned,
/// with its path; one matched by a `*` that cannot be read is reported as
/// skipped, so one container's directory never hides the others.
pub fn read_sources(sources: &[PathBuf], users: Users) -> Result<Reading, (PathBuf, io::Error)> {
    let mut out = Reading::default();
    let mut seen = std::collections::HashSet::new();
    for source in sources {
        let (found, skipped) = expand(source)?;
        out.scan.skipped.extend(skipped);
        for Found { dir, matched } in found {
            if !seen.insert(dir.path.clone()) {
                continue;
            }
            // One listing serves the pages and the group files.
            let read = dir.names().map(|names| {
                (
                    scan_names(&dir, &names, users),
                    groups_names(&dir, &names, users),
                )
            });
            match read {
                Ok((s, (groups, group_skips))) => {
                    out.scan.pages.extend(s.pages);
                    out.scan.skipped.extend(s.skipped);
                    out.scan.skipped.extend(group_skips);
                    out.scan.pruned.extend(s.pruned);
                    out.groups.extend(groups);
                }
                Err(e) if matched => out.scan.skipped.push(Skipped {
                    path: dir.path,
                    reason: format!("cannot read the directory: {e}"),
                }),
                Err(e) => return Err((dir.path, e)),
            }
        }
    }
    out.scan.pages.sort_by_key(|p| p.pid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree(name: &str, dirs: &[&str]) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("vramcap-expand-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        root
    }

    fn names(root: &Path, found: &[Found]) -> Vec<(String, bool)> {
        found
            .iter()
            .map(|f| {
                let rel = f.dir.path.strip_prefix(root).unwrap().display().to_string();
                (rel, f.matched)
            })
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

        let (found, skipped) = expand(&root.join("pods")).unwrap();
        assert_eq!(names(&root, &found), [("pods".to_string(), false)]);
        assert!(skipped.is_empty());

        let (found, _) = expand(&root.join("pods/*")).unwrap();
        let want: Vec<(String, bool)> = ["pods/a", "pods/b", "pods/c"]
            .iter()
            .map(|s| (s.to_string(), true))
            .collect();
        assert_eq!(names(&root, &found), want);

        // After a `*`, a component that is a symbolic link is not followed
        // (pods/c/v links to pods/a/v); a missing one is nothing.
        std::os::unix::fs::symlink(root.join("pods/a/v"), root.join("pods/c/v")).unwrap();
        let (found, _) = expand(&root.join("pods/*/v/s")).unwrap();
        let want: Vec<(String, bool)> = ["pods/a/v/s", "pods/b/v/s"]
            .iter()
            .map(|s| (s.to_string(), true))
            .collect();
        assert_eq!(
            names(&root, &found),
            want,
            "later components are opened in turn"
        );

        // Before the first `*`, the path is the reader's: links are followed.
        std::os::unix::fs::symlink(root.join("pods"), root.join("via")).unwrap();
        let (found, _) = expand(&root.join("via/*")).unwrap();
        assert_eq!(found.len(), 3);

        let (found, _) = expand(&root.join("missing/*")).unwrap();
        assert!(found.is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_unreadable_prefix_is_an_error_an_unreadable_match_is_skipped() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Root lists any directory: check the outcome through a file
            // where a directory is expected instead.
            let root = tree("unreadable-root", &["pods/a"]);
            std::fs::write(root.join("flat"), b"x").unwrap();
            let (p, e) = expand(&root.join("flat/*")).map(|_| ()).unwrap_err();
            assert_eq!(p, root.join("flat"));
            assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
            std::fs::remove_dir_all(&root).unwrap();
            return;
        }
        let root = tree("unreadable", &["pods/a/x", "pods/b/x"]);
        std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let (found, skipped) = expand(&root.join("pods/*/*")).unwrap();
        assert_eq!(names(&root, &found), [("pods/b/x".to_string(), true)]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].path, root.join("pods/a"));
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        let (p, _) = expand(&root.join("pods/*")).map(|_| ()).unwrap_err();
        assert_eq!(p, root.join("pods"));
        std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
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
