//! The tests of `--dir` sources and their walk.

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
    std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let r = read(&root, "pods/*/*").unwrap();
    assert_eq!(r.dirs_read, [root.join("pods/b/x")]);
    assert_eq!(r.scan.skipped.len(), 1);
    assert_eq!(r.scan.skipped[0].path, root.join("pods/a"));
    std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let (p, _) = read(&root, "pods/*").map(|_| ()).unwrap_err();
    assert_eq!(p, root.join("pods"));
    std::fs::set_permissions(root.join("pods"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(root.join("pods/a"), std::fs::Permissions::from_mode(0o755)).unwrap();
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

/// A page with its tail (its `page_size` covering it: the host memory kept
/// for parks is read from it) and one without (an earlier library's: 0)
/// are read; one whose file is shorter than its `page_size` says is
/// skipped as truncated.
#[test]
fn pages_with_and_without_a_tail_are_read_a_short_one_is_skipped() {
    use std::io::Write;
    use std::mem::offset_of;
    use vramcap_core::page::{Header, PAGE_SIZE};
    let root = tree("longer", &["d"]);
    let held = [
        write_page(&root.join("d"), 7, 1, "later"),
        write_page(&root.join("d"), 8, 1, "short"),
    ];
    let at = offset_of!(Header, page_size) as u64;
    let longer = ((PAGE_SIZE + 256) as u32).to_ne_bytes();
    for (f, extend) in held.iter().zip([true, false]) {
        std::os::unix::fs::FileExt::write_all_at(f, &longer, at).unwrap();
        if extend {
            // The tail, its first word the host memory kept for parks.
            let mut f = f;
            std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap();
            let mut tail = [0u8; 256];
            tail[..8].copy_from_slice(&(5u64 << 20).to_ne_bytes());
            f.write_all(&tail).unwrap();
        }
    }
    let old = write_page(&root.join("d"), 9, 1, "earlier");
    let r = read(&root, "d").unwrap();
    let pids: Vec<(u32, u64)> = r
        .scan
        .pages
        .iter()
        .map(|p| (p.pid, p.park.host_kept))
        .collect();
    // A page of this layout with its tail, and one of an earlier (none).
    assert_eq!(pids, [(7, 5 << 20), (9, 0)]);
    drop(old);
    assert_eq!(r.scan.skipped.len(), 1, "{:?}", r.scan.skipped);
    assert!(
        r.scan.skipped[0].reason.contains("truncated"),
        "{:?}",
        r.scan.skipped
    );
    drop(held);
    std::fs::remove_dir_all(&root).unwrap();
}
