//! The default statistics directory: who may make it, and where readers
//! and writers look for it.

use super::*;

/// Runs `program` as `uid` (this test runs as root), without
/// `VRAMCAP_STATS_DIR`, with `XDG_RUNTIME_DIR` as given.
fn as_user(program: &Path, uid: u32, xdg: Option<&Path>, preload: bool) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = if preload {
        shimmed(program)
    } else {
        bare(program)
    };
    cmd.env_remove("VRAMCAP_STATS_DIR")
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir("/")
        .uid(uid)
        .gid(uid);
    if let Some(x) = xdg {
        cmd.env("XDG_RUNTIME_DIR", x);
    }
    cmd
}

/// `/dev/shm/vramcap-<victim>`, made by `squatter` as a directory (mode
/// 755) or as a symbolic link to a directory of the squatter's; removed
/// when dropped.
struct Squat {
    path: PathBuf,
    target: Option<PathBuf>,
}

impl Squat {
    fn new(victim: u32, squatter: u32, link: bool) -> Squat {
        use std::os::unix::fs::{PermissionsExt, lchown};
        let path = PathBuf::from(format!("/dev/shm/vramcap-{victim}"));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(&path);
        let mut target = None;
        if link {
            let t = PathBuf::from(format!("/dev/shm/vramcap-squat-{squatter}"));
            let _ = std::fs::remove_dir_all(&t);
            std::fs::create_dir(&t).unwrap();
            std::os::unix::fs::chown(&t, Some(squatter), Some(squatter)).unwrap();
            std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::os::unix::fs::symlink(&t, &path).unwrap();
            lchown(&path, Some(squatter), Some(squatter)).unwrap();
            target = Some(t);
        } else {
            std::fs::create_dir(&path).unwrap();
            std::os::unix::fs::chown(&path, Some(squatter), Some(squatter)).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Squat { path, target }
    }
}

impl Drop for Squat {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(t) = &self.target {
            let _ = std::fs::remove_dir_all(t);
        }
    }
}

/// A runtime directory of `uid`'s own (mode 700), as logind makes it.
fn runtime_dir(part: &str, uid: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch_dir_named(part).join("run-user");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Another user made `/dev/shm/vramcap-<uid>` first (a directory, then a
/// symbolic link). With a runtime directory of its own, the victim's pages
/// and group go there and `stat` finds them, saying in one line why the
/// squatted directory is not read; without one, the shim refuses the
/// squatted directory in one line saying whose it is and what to do, the
/// cap still holds, a group refuses its allocations rather than run
/// without its budget, and `doctor` fails naming the directory.
#[test]
#[ignore = "needs root"]
fn a_squatted_default_directory_is_refused_and_the_runtime_directory_is_used() {
    needs_root();
    let a = artefacts();
    for (victim, squatter, link) in [(43_101u32, 43_102u32, false), (43_103, 43_104, true)] {
        let squat = Squat::new(victim, squatter, link);
        let shown = squat.path.display().to_string();
        let what = if link {
            "is a symbolic link".to_string()
        } else {
            format!("belongs to uid {squatter} (mode 755), not to you (uid {victim})")
        };
        let fix = if link {
            format!("remove it (rm {shown}; if it is not yours, its owner or root can)")
        } else {
            "someone else made it: have it removed (its owner or root can)".to_string()
        };
        let refusal = format!(
            "the statistics directory {shown} {what}; vramcap uses it only when it is yours with mode 700: {fix}, or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR"
        );

        // No runtime directory: the squatted one is refused, the cap holds.
        let mut cmd = as_user(&a.client, victim, None, true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .args(["procaddr", "init", "fill", "256M"]);
        let ran = run(cmd);
        ran.expect_lines(&[
            "init -> 0",
            "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        ]);
        let err = ran.stderr();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].starts_with("vramcap[")
                && lines[0].ends_with(&format!(
                    "]: {refusal}; counters are not published (the cap still holds)"
                )),
            "{err}"
        );
        assert!(
            lines[1].contains("]: cuMemAlloc: refused 268435456 bytes on device 0"),
            "{err}"
        );
        // A group cannot be joined there: its allocations are refused.
        let mut cmd = as_user(&a.client, victim, None, true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .env("VRAMCAP_GROUP", "g")
            .args(["procaddr", "init", "fill", "256M"]);
        let ran = run(cmd);
        assert_eq!(
            ran.ok_lines(),
            ["init -> 0", "fill 268435456 -> 0 allocs 0 bytes rc=2"]
        );
        assert!(ran.stderr().contains(&refusal), "{}", ran.stderr());
        // Nothing went into the squatter's directory.
        let planted = squat.target.clone().unwrap_or(squat.path.clone());
        assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 0);

        // doctor fails, naming the directory and the fix.
        let mut cmd = as_user(&a.cli, victim, None, false);
        cmd.arg("doctor");
        let out = stdout_of_failure(cmd);
        assert!(
            out.contains(&format!(
                "FAIL  statistics directory: {shown} {what}; nothing is published there and group members refuse their allocations (the cap still holds)\n      fix: {fix}, or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR\n"
            )),
            "{out}"
        );

        // With a runtime directory of its own: pages and the group go there.
        let rt = runtime_dir(&format!("squat-{victim}"), victim);
        let mut cmd = as_user(&a.client, victim, Some(&rt), true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .env("VRAMCAP_GROUP", "g")
            .args(["procaddr", "init", "alloc", "64M", "wait"]);
        let h = Held::at_wait(cmd);
        let pages = rt.join("vramcap");
        let page = pages.join(format!("{}.page", h.pid()));
        assert!(page.is_file(), "no page in {}", pages.display());
        assert!(pages.join("group-g.grp").is_file());
        let mut cmd = as_user(&a.cli, victim, Some(&rt), false);
        cmd.args(["stat", "--json"]);
        let ran = run(cmd);
        let j: Value = serde_json::from_str(&ran.ok_lines().join("")).unwrap();
        assert_eq!(j["processes"][0]["pid"], h.pid(), "{j}");
        assert_eq!(j["processes"][0]["devices"][0]["used_bytes"], 64u64 << 20);
        assert_eq!(j["groups"][0]["name"], "g");
        assert_eq!(j["dir"], pages.display().to_string());
        assert_eq!(
            j["dirs"],
            serde_json::json!([pages.display().to_string(), shown])
        );
        let not_read = format!(
            "not read: it {what}; a default statistics directory is used only when it is yours with mode 700 (the shim writes nothing there either)"
        );
        assert_eq!(
            j["skipped"],
            serde_json::json!([{"file": shown, "reason": not_read}])
        );
        assert_eq!(
            ran.stderr(),
            format!("vramcap: skipping {shown}: {not_read}\n")
        );
        let (_, out) = h.finish();
        assert!(out.status.success());
        drop(squat);
    }
}

/// With nothing in the way, the runtime directory and `/dev/shm` both
/// work, each made private by the shim, and `stat` from a shell with a
/// runtime directory also finds what a program started without one (a
/// cron job) published in `/dev/shm`.
#[test]
#[ignore = "needs root"]
fn readers_find_pages_in_every_default_directory() {
    needs_root();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let a = artefacts();
    let uid = 43_105u32;
    let shm = PathBuf::from(format!("/dev/shm/vramcap-{uid}"));
    let _ = std::fs::remove_dir_all(&shm);
    let rt = runtime_dir("runtime", uid);
    let start = |xdg: Option<&Path>| {
        let mut cmd = as_user(&a.client, uid, xdg, true);
        cmd.env("VRAMCAP_LIMIT", "1GiB")
            .args(["procaddr", "init", "alloc", "16M", "wait"]);
        Held::at_wait(cmd)
    };
    let cron = start(None);
    let shell = start(Some(&rt));
    for d in [&shm, &rt.join("vramcap")] {
        let m = std::fs::symlink_metadata(d).unwrap();
        assert!(m.is_dir());
        assert_eq!((m.uid(), m.permissions().mode() & 0o777), (uid, 0o700));
    }
    let mut cmd = as_user(&a.cli, uid, Some(&rt), false);
    cmd.args(["stat", "--json"]);
    let ran = run(cmd);
    assert_eq!(ran.stderr(), "");
    let j: Value = serde_json::from_str(&ran.ok_lines().join("")).unwrap();
    let mut seen: Vec<(u64, String)> = j["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap(),
                p["dir"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut want = vec![
        (cron.pid() as u64, shm.display().to_string()),
        (shell.pid() as u64, rt.join("vramcap").display().to_string()),
    ];
    want.sort();
    assert_eq!(seen, want);
    let mut cmd = as_user(&a.cli, uid, Some(&rt), false);
    cmd.arg("doctor");
    let ran = run(cmd);
    let out = ran.stdout();
    assert!(
        out.contains(&format!(
            "ok    statistics directory: {} (yours, mode 700)\nok    statistics directory without XDG_RUNTIME_DIR: {} (yours, mode 700)\n",
            rt.join("vramcap").display(),
            shm.display()
        )),
        "{out}"
    );
    cron.finish();
    shell.finish();
    let _ = std::fs::remove_dir_all(&shm);
}
