//! `vramcap run`'s check of its target: the dynamic loader runs a program
//! that gains privileges at `execve` (set-user-ID or set-group-ID to
//! someone else, or file capabilities) in secure-execution mode, and
//! there it drops `LD_PRELOAD`: the program would run without the shim,
//! uncapped and silently. `run` refuses such a target with one line,
//! unless `/etc/ld.so.preload` names the shim (the loader honours that
//! file in secure-execution mode too).
//!
//! What decides it is the kernel's rule (`bprm_fill_uid`,
//! `cap_bprm_creds_from_file`): the set-user-ID bit counts when the file's
//! owner is not the caller, the set-group-ID bit when the group may
//! execute it and its group is not the caller's; file capabilities
//! (`security.capability`) count for callers other than root. On a mount
//! with `nosuid`, or in a process with `no_new_privs` set (as Kubernetes
//! sets it for `allowPrivilegeEscalation: false`), none of them count. A
//! script (`#!`) runs its interpreter, whose file is the one that counts.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The loader's list of libraries preloaded into every program.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// The file `execvp` would run for `command` (a name without `/` is looked
/// up in `PATH`), or `None` when there is none (exec then says so).
pub fn resolve(command: &OsStr) -> Option<PathBuf> {
    if command.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(command));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(command))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// Why the loader would run `program` in secure-execution mode, in a few
/// words ("set-user-ID to user 0"), or `None` when it would not.
pub fn privilege(program: &Path) -> Option<String> {
    privilege_at(program, 0)
}

fn privilege_at(program: &Path, depth: u32) -> Option<String> {
    let meta = std::fs::metadata(program).ok()?;
    if !meta.is_file() {
        return None;
    }
    if depth < 4
        && let Some(interpreter) = interpreter(program)
    {
        return privilege_at(&interpreter, depth + 1);
    }
    if nosuid(program) || no_new_privs() {
        return None;
    }
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mode = meta.mode();
    let mut why = Vec::new();
    if mode & libc::S_ISUID != 0 && meta.uid() != uid {
        why.push(format!("set-user-ID to user {}", meta.uid()));
    }
    if mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP)
        && meta.gid() != gid
    {
        why.push(format!("set-group-ID to group {}", meta.gid()));
    }
    if uid != 0 && has_capabilities(program) {
        why.push("given file capabilities (security.capability)".to_string());
    }
    (!why.is_empty()).then(|| why.join(" and "))
}

/// The interpreter of a `#!` script.
fn interpreter(program: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let word = line
        .split(|&b| b == b' ' || b == b'\t')
        .find(|w| !w.is_empty())?;
    Some(PathBuf::from(OsStr::from_bytes(word)))
}

/// Whether this process (and so the program it execs) has `no_new_privs`:
/// then `execve` grants nothing and the loader keeps `LD_PRELOAD`.
fn no_new_privs() -> bool {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer and cannot fail here.
    unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 }
}

fn nosuid(program: &Path) -> bool {
    let Ok(c) = CString::new(program.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::statvfs(c.as_ptr(), &mut st) == 0 && st.f_flag & libc::ST_NOSUID != 0 }
}

fn has_capabilities(program: &Path) -> bool {
    let Ok(c) = CString::new(program.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: both names are C strings; a null buffer of size 0 asks for
    // the value's size only.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    n > 0
}

/// Whether the loader's preload file `preload` names the shim `lib`: an
/// entry that is the same file, or another copy of `libvramcap.so`.
pub fn preload_names_shim(preload: &Path, lib: &Path) -> bool {
    let Ok(text) = std::fs::read(preload) else {
        return false;
    };
    let same = std::fs::metadata(lib).ok().map(|m| (m.dev(), m.ino()));
    // The loader's separators (glibc's rtld: spaces, tabs, newlines, colons).
    text.split(|&b| matches!(b, b' ' | b'\t' | b'\n' | b':'))
        .filter(|e| !e.is_empty())
        .map(|e| Path::new(OsStr::from_bytes(e)))
        .any(|e| {
            let Ok(m) = std::fs::metadata(e) else {
                return false;
            };
            Some((m.dev(), m.ino())) == same
                || (m.is_file() && e.file_name() == Some(OsStr::new("libvramcap.so")))
        })
}

/// `run`'s refusal of `command`, as its one line, or `None` to go on.
pub fn refusal(command: &OsStr, lib: &Path, preload: &Path) -> Option<String> {
    let program = resolve(command)?;
    let why = privilege(&program)?;
    if preload_names_shim(preload, lib) {
        return None;
    }
    Some(format!(
        "{} is {why}: the loader runs it in secure-execution mode and drops LD_PRELOAD, so it would run uncapped; run a program that is not, or have the loader preload the shim for every program (e.g. echo {} >> {LD_SO_PRELOAD}, as root)",
        program.display(),
        lib.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vramcap-secure-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// d/NAME (its directory made) holding BYTES, with MODE when given.
    fn file_in(d: &Path, name: &str, bytes: &[u8], mode: Option<u32>) -> PathBuf {
        let p = d.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        if let Some(mode) = mode {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        p
    }

    /// `/etc/ld.so.preload` naming the shim (the file itself, or a copy
    /// of libvramcap.so, among other entries and separators) is the one
    /// exception; a file naming something else, or none, is not.
    #[test]
    fn the_preload_file_must_name_the_shim() {
        let d = scratch("preload");
        let lib = file_in(&d, "libvramcap.so", b"x", None);
        let other = file_in(&d, "other/libvramcap.so", b"y", None);
        let not = file_in(&d, "libother.so", b"z", None);
        let preload = d.join("ld.so.preload");
        let names = |text: String| {
            std::fs::write(&preload, text).unwrap();
            preload_names_shim(&preload, &lib)
        };
        assert!(names(format!("{}\n", lib.display())));
        assert!(names(format!("{}:{}\n", not.display(), lib.display())));
        assert!(names(format!("\t{}  \n", other.display())));
        assert!(!names(format!("{}\n", not.display())));
        assert!(!names(format!(
            "{}\n",
            d.join("gone/libvramcap.so").display()
        )));
        assert!(!names(String::new()));
        assert!(!preload_names_shim(&d.join("none"), &lib));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A set-user-ID file of one's own and a set-group-ID file its group
    /// may not execute gain nothing; a script is judged by its interpreter.
    #[test]
    fn what_gains_no_privilege_is_not_refused() {
        let d = scratch("plain");
        let own = file_in(&d, "own", b"\x7fELF", Some(0o4755));
        assert_eq!(privilege(&own), None);
        let script = file_in(&d, "script", b"#!/bin/sh\necho hi\n", Some(0o4755));
        assert_eq!(interpreter(&script), Some(PathBuf::from("/bin/sh")));
        assert_eq!(privilege(&script), privilege(Path::new("/bin/sh")));
        assert_eq!(refusal(OsStr::new("sh"), &own, &d.join("none")), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
