//! The operator's cap file: read only when no one but root could have
//! written it; a root file that holds no usable cap refuses the run.

use crate::limit::{LIMIT_VAR, LimitSpec, parse_limit};

/// Reads the operator's cap at `path`: `Ok(None)` when there is no file.
///
/// A file the caller could have written itself (its own, unless the caller
/// is root, or writable by group or others) is `Err(Unusable)`: the shim
/// warns and goes on with the caps it has, which ignoring such a file never
/// loosens. Any other file binds: if it cannot be opened or read, is not a
/// regular file (no link is followed: the file is opened first, then looked
/// at), is not UTF-8, or holds no usable cap, that is `Err(Bad)` and the
/// shim refuses to run. Blank lines and `#` comments are skipped; what is
/// left is one `VRAMCAP_LIMIT` value with a default (every GPU gets a cap)
/// and no index keys (indices follow `CUDA_VISIBLE_DEVICES`, which the
/// process chooses; UUID keys do not).
pub fn read_operator_limit(path: &std::path::Path) -> Result<Option<LimitSpec>, OperatorError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display();
    // SAFETY: geteuid cannot fail.
    let caller = unsafe { libc::geteuid() };
    let mine = |uid: u32| uid == caller && caller != 0;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let owner = std::fs::symlink_metadata(path)
                .map(|m| m.uid())
                .unwrap_or(0);
            if mine(owner) {
                return Err(OperatorError::Unusable(format!(
                    "{shown} is a symbolic link of yours"
                )));
            }
            return Err(OperatorError::Bad(format!(
                "{shown} is a symbolic link; the operator's cap must be a regular file (in Kubernetes, mount the ConfigMap key with subPath)"
            )));
        }
        Err(e) => return Err(OperatorError::Bad(format!("cannot open {shown}: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| OperatorError::Bad(format!("cannot inspect {shown}: {e}")))?;
    if mine(meta.uid()) || meta.mode() & 0o022 != 0 {
        return Err(OperatorError::Unusable(format!(
            "{shown} could have been written by this user (owner uid {}, mode {:o}); the operator's cap is a file only root writes",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    if !meta.is_file() {
        return Err(OperatorError::Bad(format!("{shown} is not a regular file")));
    }
    let mut bytes = Vec::new();
    file.take(4097)
        .read_to_end(&mut bytes)
        .map_err(|e| OperatorError::Bad(format!("cannot read {shown}: {e}")))?;
    let bad = |why: String| {
        OperatorError::Bad(format!(
            "{shown}: {why} (the file holds the operator's cap in the grammar of {LIMIT_VAR}, with a default and UUID keys only, e.g. a line 8GiB)"
        ))
    };
    if bytes.len() > 4096 {
        return Err(bad("longer than 4096 bytes".to_string()));
    }
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".to_string()))?;
    let value: Vec<&str> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    let one = match value.as_slice() {
        [one] => *one,
        [] => return Err(bad("it is empty".to_string())),
        _ => return Err(bad(format!("{} values, expected one", value.len()))),
    };
    let spec = parse_limit(one)
        .map_err(|e| bad(e.to_string().replacen(&format!("{LIMIT_VAR}="), "", 1)))?;
    if spec.default.is_none() {
        return Err(bad(format!(
            "{one:?} has no default, so a GPU it does not name would have no cap"
        )));
    }
    if let Some((k, _)) = spec
        .entries
        .iter()
        .find(|(k, _)| matches!(k, crate::limit::Key::Ordinal(_)))
    {
        return Err(bad(format!(
            "{one:?} names GPU {k} by index, which CUDA_VISIBLE_DEVICES changes"
        )));
    }
    Ok(Some(spec))
}

/// Why the operator's cap file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorError {
    /// One the caller could have written: ignored with a warning.
    Unusable(String),
    /// One that binds but holds no usable cap: the shim refuses to run.
    Bad(String),
}
