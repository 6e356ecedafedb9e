//! Finding a program to run: an executable file, by name on `PATH`. Used by
//! the CLI (a kernel's Python) and the shim (the `nvidia-smi` a resume
//! runs); `vramcap run` resolves its command as `execvp` does instead
//! (`cli/secure.rs`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Whether `p` is a regular file with an execute bit.
pub fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first executable file called `name` in a folder of `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}
