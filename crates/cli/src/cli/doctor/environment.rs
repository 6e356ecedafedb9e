//! The checks of what the environment asks for: the statistics directories
//! and the device keys of `VRAMCAP_LIMIT`.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramcap_core::stats_dir::{self, DirProblem};
use vramcap_core::text;

use super::Report;
use crate::cli::stat::StatsDirs;

/// The statistics directories: the one `VRAMCAP_STATS_DIR` names (a
/// directory, or one that can be made), or the default ones, which must
/// be the user's own with mode 700 (see `vramcap_core::stats_dir`): a
/// directory or link someone else planted under a default name fails.
pub(super) fn stats_dirs_report(r: &mut Report, dirs: Result<StatsDirs, String>, uid: u32) {
    const WHAT: &str = "statistics directory";
    let dirs = match dirs {
        Ok(d) => d,
        Err(e) => {
            return r.bad(
                WHAT,
                e,
                "set VRAMCAP_STATS_DIR to an absolute path or unset it",
            );
        }
    };
    // Missing, but can it be made? Its parent must be a directory.
    let can_make = |d: &Path| d.parent().is_some_and(Path::is_dir);
    let Some(uid_private) = dirs.private_to else {
        let d = &dirs.dirs[0];
        let shown = text::path(d);
        return match stats_dir::open_dir(d, None) {
            Ok(_) => r.ok(WHAT, format!("{shown} (VRAMCAP_STATS_DIR; exists)")),
            Err(DirProblem::Missing) if can_make(d) => r.ok(
                WHAT,
                format!("{shown} (VRAMCAP_STATS_DIR; created on first use)"),
            ),
            Err(p) => r.bad(
                WHAT,
                format!("VRAMCAP_STATS_DIR: {}", p.describe(d, uid)),
                "set VRAMCAP_STATS_DIR to a directory (not a symbolic link) whose parent exists, or unset it",
            ),
        };
    };
    let xdg = std::env::var_os(stats_dir::RUNTIME_VAR);
    let primary = stats_dir::default_dir(uid_private, xdg.as_deref());
    if let Err(p) = stats_dir::runtime_dir(uid_private, xdg.as_deref())
        && p != DirProblem::Missing
    {
        r.note(
            "runtime directory",
            format!(
                "XDG_RUNTIME_DIR {} (it must be yours with mode 700); pages go to {} instead",
                p.phrase(uid_private),
                text::path(&primary)
            ),
        );
    }
    let fallback = stats_dir::fallback_dir(uid_private);
    let mut check = |d: &Path, what: &str, quiet_if_missing: bool| {
        let shown = text::path(d);
        match stats_dir::open_dir(d, Some(uid_private)) {
            Ok(_) => r.ok(what, format!("{shown} (yours, mode 700)")),
            Err(DirProblem::Missing) if quiet_if_missing => {}
            Err(DirProblem::Missing) if can_make(d) => {
                r.ok(what, format!("{shown} (created on first use)"))
            }
            Err(p) => r.bad(
                what,
                format!(
                    "{}; nothing is published there and group members refuse their allocations (the cap still holds)",
                    p.describe(d, uid_private)
                ),
                p.fix(d),
            ),
        }
    };
    check(&primary, WHAT, false);
    if fallback != primary {
        // Programs started without the runtime directory (cron, services)
        // use the fallback: someone else's directory there stops them too.
        check(
            &fallback,
            "statistics directory without XDG_RUNTIME_DIR",
            true,
        );
    }
}

const KEYS: &str = "limit's devices";
const KEYS_FIX: &str = "name each device by its index as the process sees it (after CUDA_VISIBLE_DEVICES) or a prefix of its UUID, as `nvidia-smi -L` prints it";

/// Whether every device key of the environment's `VRAMCAP_LIMIT` names a
/// GPU: decided by the shim itself in a child when `lib` is given (a usable
/// GPU is there), else against NVML's list.
pub(super) fn check_limit_keys(
    r: &mut Report,
    s: &vramcap_core::settings::Settings,
    lib: Option<&Path>,
) {
    let Some(lib) = lib else {
        match crate::cli::machine::check_limit_keys(&s.limit, &s.limit_text) {
            Ok(()) => r.note(
                KEYS,
                "without a usable GPU only NVML's list could be checked, and nothing in it contradicts them",
            ),
            Err(line) => r.bad(KEYS, line, KEYS_FIX),
        }
        return;
    };
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("vramcap"));
    let out = Command::new(exe)
        .args(["doctor", "--probe-limit"])
        .env("LD_PRELOAD", lib)
        .env("VRAMCAP_STATS", "off")
        .env_remove("VRAMCAP_DISABLE")
        .env_remove("VRAMCAP_GROUP")
        .output();
    match out {
        Ok(o) if o.status.success() => r.ok(KEYS, "every device key names a GPU"),
        Ok(o) => {
            // The shim's own line, without its "vramcap[PID]: " prefix.
            let stderr = String::from_utf8_lossy(&o.stderr);
            let line = stderr
                .lines()
                .rfind(|l| l.contains("VRAMCAP_LIMIT"))
                .map(|l| l.split_once("]: ").map_or(l, |(_, rest)| rest))
                .unwrap_or_else(|| stderr.trim())
                .to_string();
            r.bad(KEYS, format!("{line} ({})", o.status), KEYS_FIX)
        }
        Err(e) => r.bad(
            KEYS,
            format!("cannot run the check: {e}"),
            "check that this binary can execute itself",
        ),
    }
}
