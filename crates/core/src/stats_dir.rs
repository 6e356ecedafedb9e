//! Where statistics pages and group files go when `VRAMCAP_STATS_DIR` is
//! unset, and the checks that keep that directory the user's own.
//!
//! A name in a directory everyone can write (`/dev/shm`) can be taken by
//! anyone first: another user who makes `/dev/shm/vramcap-1000` (a
//! directory or a symbolic link) before user 1000 does would otherwise get
//! that user's pages, or stop them. So the default is, in order:
//!
//! 1. `$XDG_RUNTIME_DIR/vramcap`, when `XDG_RUNTIME_DIR` names the user's
//!    own runtime directory: an absolute path to a directory (not a
//!    symbolic link) that the user owns and nobody else may enter (mode
//!    0700, as logind makes `/run/user/UID`). No one else can make
//!    anything inside it.
//! 2. Else `/dev/shm/vramcap-<uid>`.
//!
//! Either is used only when, once it exists, it is a directory (reached
//! without a symbolic link) that the user owns with no access for anyone
//! else; it is made with `mkdir(0700)` and then checked on a descriptor
//! opened with `O_NOFOLLOW | O_DIRECTORY` (`fstat`), so what is checked is
//! what was made, whoever raced for the name. A squatted directory is
//! refused with one line saying whose it is and what to do
//! ([`DirProblem::refusal`]); nothing is ever written into it. Neither
//! name can be moved or replaced once the user owns it: the runtime
//! directory is the user's, and `/dev/shm` is sticky.
//!
//! Readers look in every place a writer of this user may have chosen
//! ([`reader_dirs`]): a program started without `XDG_RUNTIME_DIR` (a
//! cron job, a service) writes to `/dev/shm/vramcap-<uid>` even while the
//! user's shell has a runtime directory.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The subdirectory of `XDG_RUNTIME_DIR` that holds the pages.
pub const RUNTIME_SUBDIR: &str = "vramcap";
/// The variable naming the user's runtime directory.
pub const RUNTIME_VAR: &str = "XDG_RUNTIME_DIR";

/// `/dev/shm/vramcap-<uid>`: the default when there is no usable runtime
/// directory.
pub fn fallback_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/vramcap-{uid}"))
}

/// Why a directory is not the user's own private directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirProblem {
    /// The variable holds a relative path (only for `XDG_RUNTIME_DIR`).
    Relative,
    Missing,
    SymbolicLink,
    NotADirectory,
    /// Owned by another user.
    NotOwned {
        owner: u32,
        mode: u32,
    },
    /// Ours, but others may enter it.
    OpenToOthers {
        mode: u32,
    },
    /// It could not be made, opened or inspected.
    Io(String),
}

impl DirProblem {
    /// What is wrong, as the rest of a sentence about the directory:
    /// "belongs to uid 1001 (mode 755), not to you (uid 1000)".
    pub fn phrase(&self, uid: u32) -> String {
        match self {
            DirProblem::Relative => "is not an absolute path".into(),
            DirProblem::Missing => "does not exist".into(),
            DirProblem::SymbolicLink => "is a symbolic link".into(),
            DirProblem::NotADirectory => "is not a directory".into(),
            DirProblem::NotOwned { owner, mode } => {
                format!("belongs to uid {owner} (mode {mode:o}), not to you (uid {uid})")
            }
            DirProblem::OpenToOthers { mode } => {
                format!("is open to other users (mode {mode:o})")
            }
            DirProblem::Io(e) => format!("cannot be used ({e})"),
        }
    }

    /// What is wrong with `dir`, in words (no advice).
    pub fn describe(&self, dir: &Path, uid: u32) -> String {
        format!("{} {}", crate::text::path(dir), self.phrase(uid))
    }

    /// What to do about it, for the default directory `dir`.
    pub fn fix(&self, dir: &Path) -> String {
        let d = crate::text::path(dir);
        let own = "make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR";
        match self {
            DirProblem::OpenToOthers { .. } => format!("make it private (chmod 700 {d}), or {own}"),
            DirProblem::NotOwned { .. } => {
                format!("someone else made it: have it removed (its owner or root can), or {own}")
            }
            DirProblem::SymbolicLink | DirProblem::NotADirectory => {
                format!("remove it (rm {d}; if it is not yours, its owner or root can), or {own}")
            }
            DirProblem::Relative | DirProblem::Missing | DirProblem::Io(_) => own.to_string(),
        }
    }

    /// The one line a writer or reader refusing the default directory
    /// `dir` prints: what is wrong, and what to do.
    pub fn refusal(&self, dir: &Path, uid: u32) -> String {
        format!(
            "the statistics directory {}; vramcap uses it only when it is yours with mode 700: {}",
            self.describe(dir, uid),
            self.fix(dir)
        )
    }
}

fn c_path(path: &Path) -> Result<CString, DirProblem> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| DirProblem::Io("the path holds a NUL byte".into()))
}

/// Checks what `st` describes: a directory owned by `uid` that no one
/// else may enter.
fn check_stat(st: &libc::stat, uid: u32) -> Result<(), DirProblem> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {}
        libc::S_IFLNK => return Err(DirProblem::SymbolicLink),
        _ => return Err(DirProblem::NotADirectory),
    }
    let mode = st.st_mode & 0o7777;
    if st.st_uid != uid {
        return Err(DirProblem::NotOwned {
            owner: st.st_uid,
            mode,
        });
    }
    if mode & 0o077 != 0 {
        return Err(DirProblem::OpenToOthers { mode });
    }
    Ok(())
}

/// Why opening `path` as a directory without following a link failed, from
/// `lstat` (for the message only: the decision was the open's).
fn open_problem(c: &CString, e: std::io::Error) -> DirProblem {
    if e.raw_os_error() == Some(libc::ENOENT) {
        return DirProblem::Missing;
    }
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and out-buffer.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } == 0 {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => return DirProblem::SymbolicLink,
            libc::S_IFDIR => {}
            _ => return DirProblem::NotADirectory,
        }
    }
    DirProblem::Io(e.to_string())
}

/// Opens `path` as a directory without following a symbolic link in its
/// last component, and checks the opened directory: when `private_to` is
/// `Some(uid)`, it must be owned by `uid` with no access for others.
/// Returns the open descriptor (close-on-exec), so a caller can go on
/// from exactly what was checked.
pub fn open_dir(path: &Path, private_to: Option<u32>) -> Result<std::os::fd::OwnedFd, DirProblem> {
    use std::os::fd::FromRawFd;
    let c = c_path(path)?;
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(open_problem(&c, std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor, owned from here on.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    if let Some(uid) = private_to {
        // SAFETY: zeroed stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: an open descriptor and a valid out-buffer.
        if unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut st) } != 0 {
            return Err(DirProblem::Io(std::io::Error::last_os_error().to_string()));
        }
        check_stat(&st, uid)?;
    }
    Ok(fd)
}

/// Makes `dir` (mode 0700) unless it exists, then checks it as
/// [`open_dir`] does: a directory reached without a symbolic link, and
/// when `private_to` is `Some(uid)` owned by `uid` and closed to others.
/// Its parent must exist.
pub fn prepare(dir: &Path, private_to: Option<u32>) -> Result<(), DirProblem> {
    let c = c_path(dir)?;
    // SAFETY: a valid NUL-terminated path and a mode.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(DirProblem::Io(format!("cannot create it: {e}")));
        }
    }
    open_dir(dir, private_to).map(drop)
}

/// `XDG_RUNTIME_DIR` (as given in `xdg`) when it is the user's own
/// runtime directory: absolute, a directory that is not a symbolic link,
/// owned by `uid`, mode 0700.
pub fn runtime_dir(uid: u32, xdg: Option<&OsStr>) -> Result<PathBuf, DirProblem> {
    let xdg = xdg.filter(|x| !x.is_empty()).ok_or(DirProblem::Missing)?;
    let p = Path::new(xdg);
    if !p.is_absolute() {
        return Err(DirProblem::Relative);
    }
    open_dir(p, Some(uid))?;
    Ok(p.to_path_buf())
}

/// Where a writer with this `XDG_RUNTIME_DIR` (as given in `xdg`) puts its
/// pages by default: `$XDG_RUNTIME_DIR/vramcap` when that is the user's
/// own runtime directory, else [`fallback_dir`].
pub fn default_dir(uid: u32, xdg: Option<&OsStr>) -> PathBuf {
    match runtime_dir(uid, xdg) {
        Ok(r) => r.join(RUNTIME_SUBDIR),
        Err(_) => fallback_dir(uid),
    }
}

/// Every default directory a writer of this user may have chosen, the
/// one this environment's writers choose first: `$XDG_RUNTIME_DIR/vramcap`
/// (when usable), `/run/user/<uid>/vramcap` (when that runtime directory
/// is usable: a writer whose session had it), and [`fallback_dir`].
pub fn reader_dirs(uid: u32, xdg: Option<&OsStr>) -> Vec<PathBuf> {
    let mut out = vec![default_dir(uid, xdg)];
    let standard = PathBuf::from(format!("/run/user/{uid}"));
    if open_dir(&standard, Some(uid)).is_ok() {
        out.push(standard.join(RUNTIME_SUBDIR));
    }
    out.push(fallback_dir(uid));
    let mut seen = std::collections::HashSet::new();
    out.retain(|d| seen.insert(d.clone()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("vramcap-statsdir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn me() -> u32 {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A scratch directory and, in it, a runtime directory `rt` of mode 700.
    fn private_runtime_dir(name: &str) -> (PathBuf, PathBuf) {
        let root = scratch(name);
        let rt = root.join("rt");
        std::fs::create_dir(&rt).unwrap();
        chmod(&rt, 0o700);
        (root, rt)
    }

    #[test]
    fn the_runtime_directory_is_used_only_when_it_is_ours_and_private() {
        let uid = me();
        let (root, rt) = private_runtime_dir("runtime");
        let x = |p: &Path| Some(p.as_os_str().to_owned());
        assert_eq!(default_dir(uid, x(&rt).as_deref()), rt.join("vramcap"));
        assert_eq!(default_dir(uid, None), fallback_dir(uid));
        assert_eq!(default_dir(uid, Some(OsStr::new(""))), fallback_dir(uid));
        assert_eq!(
            runtime_dir(uid, Some(OsStr::new("run/user/1"))),
            Err(DirProblem::Relative)
        );
        chmod(&rt, 0o755);
        assert_eq!(
            runtime_dir(uid, x(&rt).as_deref()),
            Err(DirProblem::OpenToOthers { mode: 0o755 })
        );
        assert_eq!(default_dir(uid, x(&rt).as_deref()), fallback_dir(uid));
        chmod(&rt, 0o700);
        let link = root.join("link");
        std::os::unix::fs::symlink(&rt, &link).unwrap();
        assert_eq!(
            runtime_dir(uid, x(&link).as_deref()),
            Err(DirProblem::SymbolicLink)
        );
        assert_eq!(
            runtime_dir(uid.wrapping_add(1), x(&rt).as_deref()),
            Err(DirProblem::NotOwned {
                owner: uid,
                mode: 0o700
            })
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn prepare_makes_a_private_directory_and_refuses_what_is_not() {
        let uid = me();
        let root = scratch("prepare");
        let d = root.join("pages");
        assert_eq!(prepare(&d, Some(uid)), Ok(()));
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "made private: {mode:o}");
        assert_eq!(prepare(&d, Some(uid)), Ok(()), "an existing one is fine");
        chmod(&d, 0o755);
        assert_eq!(
            prepare(&d, Some(uid)),
            Err(DirProblem::OpenToOthers { mode: 0o755 })
        );
        assert_eq!(
            prepare(&d, None),
            Ok(()),
            "a named directory only has to be one"
        );
        std::os::unix::fs::symlink(&d, root.join("link")).unwrap();
        assert_eq!(
            prepare(&root.join("link"), None),
            Err(DirProblem::SymbolicLink)
        );
        std::fs::write(root.join("file"), b"x").unwrap();
        assert_eq!(
            prepare(&root.join("file"), Some(uid)),
            Err(DirProblem::NotADirectory)
        );
        assert_eq!(
            prepare(&root.join("no/such"), Some(uid)),
            Err(DirProblem::Io(
                "cannot create it: No such file or directory (os error 2)".into()
            ))
        );
        assert_eq!(
            prepare(&root.join("no/such"), Some(uid))
                .unwrap_err()
                .describe(&root.join("no/such"), uid),
            format!(
                "{} cannot be used (cannot create it: No such file or directory (os error 2))",
                root.join("no/such").display()
            )
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn refusals_say_whose_it_is_and_what_to_do() {
        let d = Path::new("/dev/shm/vramcap-1000");
        assert_eq!(
            DirProblem::NotOwned {
                owner: 1001,
                mode: 0o755
            }
            .refusal(d, 1000),
            "the statistics directory /dev/shm/vramcap-1000 belongs to uid 1001 (mode 755), not to you (uid 1000); vramcap uses it only when it is yours with mode 700: someone else made it: have it removed (its owner or root can), or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR"
        );
        assert_eq!(
            DirProblem::SymbolicLink.refusal(d, 1000),
            "the statistics directory /dev/shm/vramcap-1000 is a symbolic link; vramcap uses it only when it is yours with mode 700: remove it (rm /dev/shm/vramcap-1000; if it is not yours, its owner or root can), or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR"
        );
        assert_eq!(
            DirProblem::OpenToOthers { mode: 0o777 }.refusal(d, 1000),
            "the statistics directory /dev/shm/vramcap-1000 is open to other users (mode 777); vramcap uses it only when it is yours with mode 700: make it private (chmod 700 /dev/shm/vramcap-1000), or make a directory of your own (mkdir -m 700 DIR) and set VRAMCAP_STATS_DIR=DIR"
        );
    }

    #[test]
    fn readers_look_wherever_a_writer_may_have_put_pages() {
        let uid = me();
        let (root, rt) = private_runtime_dir("readers");
        let dirs = reader_dirs(uid, Some(rt.as_os_str()));
        assert_eq!(dirs.first(), Some(&rt.join("vramcap")));
        assert_eq!(dirs.last(), Some(&fallback_dir(uid)));
        let dirs = reader_dirs(uid, None);
        assert_eq!(dirs.last(), Some(&fallback_dir(uid)));
        assert_eq!(
            dirs.iter().filter(|d| **d == fallback_dir(uid)).count(),
            1,
            "each once: {dirs:?}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
