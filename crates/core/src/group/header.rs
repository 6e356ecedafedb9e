//! The group file's header: filling it in, and checking one before
//! trusting the rest; the names of temporary files.

use std::mem::offset_of;

use super::*;

/// Why a file is not a group page this process can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupProblem {
    Truncated {
        len: u64,
    },
    ForeignMagic,
    /// A group file of another layout version (another vramcap made it).
    OtherLayout {
        version: u32,
    },
    BadSizes,
    OtherUser {
        uid: u32,
    },
    Initialising,
}

impl std::fmt::Display for GroupProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupProblem::Truncated { len } => write!(
                f,
                "truncated ({len} bytes, a version-{GROUP_VERSION} group file has {GROUP_PAGE_SIZE})"
            ),
            GroupProblem::ForeignMagic => write!(f, "not a vramcap group file (wrong magic)"),
            GroupProblem::OtherLayout { version } => write!(
                f,
                "group layout version {version}, made by {} vramcap; this one uses version {GROUP_VERSION} and cannot share it: remove the file once no process of the {} vramcap is in the group",
                if *version < GROUP_VERSION {
                    "an older"
                } else {
                    "a newer"
                },
                if *version < GROUP_VERSION {
                    "older"
                } else {
                    "newer"
                },
            ),
            GroupProblem::BadSizes => write!(
                f,
                "corrupt group file (sizes in the header do not match the layout)"
            ),
            GroupProblem::OtherUser { uid } => write!(f, "written by another user (uid {uid})"),
            GroupProblem::Initialising => write!(f, "still being created"),
        }
    }
}

/// Checks a group file's header like `page::check_header`: the version
/// before anything else, so a file of another layout is never misread.
pub fn check_group_header(
    len: u64,
    head: &[u8],
    expected_uid: Option<u32>,
) -> Result<(), GroupProblem> {
    if head.len() < 16 {
        return Err(GroupProblem::Truncated { len });
    }
    if head[..8] != GROUP_MAGIC {
        return Err(GroupProblem::ForeignMagic);
    }
    let word = |at: usize| u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let version = word(offset_of!(GroupHeader, version));
    if version != GROUP_VERSION {
        return Err(GroupProblem::OtherLayout { version });
    }
    if len < GROUP_PAGE_SIZE as u64 || head.len() < 48 {
        return Err(GroupProblem::Truncated { len });
    }
    if word(offset_of!(GroupHeader, header_size)) as usize != GROUP_HEADER_SIZE
        || word(offset_of!(GroupHeader, page_size)) as usize != GROUP_PAGE_SIZE
        || word(offset_of!(GroupHeader, device_count)) as usize != GROUP_DEVICES
        || word(offset_of!(GroupHeader, member_count)) as usize != MEMBERS
    {
        return Err(GroupProblem::BadSizes);
    }
    let uid = word(offset_of!(GroupHeader, uid));
    if expected_uid.is_some_and(|e| e != uid) {
        return Err(GroupProblem::OtherUser { uid });
    }
    if word(offset_of!(GroupHeader, state)) != crate::page::STATE_READY {
        return Err(GroupProblem::Initialising);
    }
    Ok(())
}

impl GroupHeader {
    pub fn fill(&mut self, uid: u32, created_unix_ns: u64, name: &str, limit_text: &str) {
        self.magic = GROUP_MAGIC;
        self.version = GROUP_VERSION;
        self.header_size = GROUP_HEADER_SIZE as u32;
        self.page_size = GROUP_PAGE_SIZE as u32;
        self.device_count = GROUP_DEVICES as u32;
        self.member_count = MEMBERS as u32;
        self.uid = uid;
        self.created_unix_ns = created_unix_ns;
        crate::page::put_text(&mut self.name, name);
        crate::page::put_text(&mut self.limit_text, limit_text);
    }
}

/// Temporary files the shim writes in the statistics directory before it
/// publishes them (a page renamed into place, a group file linked into
/// place): `.PID.NS.tmp` and `.group-NAME.PID.NS.tmp`. Each writer holds an
/// open-file-description lock on the temporary file's first byte from
/// right after creating it; a reader removes one whose lock is free and
/// that is older than [`TEMP_MIN_AGE_SECS`] (the age covers the moment
/// between creation and lock). The PID in the name is only a label: it
/// means nothing across PID namespaces.
pub fn is_temp_name(name: &[u8]) -> bool {
    let Some(inner) = name
        .strip_prefix(b".")
        .and_then(|n| n.strip_suffix(b".tmp"))
    else {
        return false;
    };
    let inner = inner.strip_prefix(b"group-").unwrap_or(inner);
    // NAME (group only), then PID and NS: the last two dot-separated parts
    // are decimal numbers.
    let mut parts = inner.rsplitn(3, |&b| b == b'.');
    let digits =
        |p: Option<&[u8]>| p.is_some_and(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
    let (ns, pid) = (parts.next(), parts.next());
    let rest = parts.next();
    digits(ns) && digits(pid) && (rest.is_none() || name.starts_with(b".group-"))
}

/// How old an unlocked temporary file must be before a reader removes it.
pub const TEMP_MIN_AGE_SECS: u64 = 60;
