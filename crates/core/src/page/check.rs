//! The reader's check of a page's fixed header: magic, version, sizes, owner
//! and state, before anything else in the file is trusted.

use std::mem::offset_of;

use super::{
    HEADER_SIZE, Header, MAGIC, MAX_PAGE_SIZE, PAGE_SIZE, SLOT_SIZE, SLOTS, STATE_READY, VERSION,
};

/// Why a file in the stats directory is not a page this reader can show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageProblem {
    Truncated {
        len: u64,
    },
    /// Shorter than the `page_size` its header says (a page with a tail).
    ShorterThanItSays {
        len: u64,
        size: u64,
    },
    ForeignMagic,
    OtherVersion {
        version: u32,
    },
    BadSizes,
    OtherUser {
        uid: u32,
    },
    Initialising,
}

impl std::fmt::Display for PageProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageProblem::Truncated { len } => {
                write!(
                    f,
                    "truncated ({len} bytes, a version-{VERSION} page has {PAGE_SIZE})"
                )
            }
            PageProblem::ShorterThanItSays { len, size } => {
                write!(f, "truncated ({len} bytes, its header says {size})")
            }
            PageProblem::ForeignMagic => write!(f, "not a vramcap page (wrong magic)"),
            PageProblem::OtherVersion { version } => write!(
                f,
                "page layout version {version}, this vramcap reads version {VERSION} (use the vramcap that matches the library)"
            ),
            PageProblem::BadSizes => write!(
                f,
                "corrupt page (sizes in the header do not match the layout)"
            ),
            PageProblem::OtherUser { uid } => write!(f, "written by another user (uid {uid})"),
            PageProblem::Initialising => write!(f, "still being created"),
        }
    }
}

/// Checks the fixed part of a page's header. `len` is the file's length;
/// `head` its first [`HEADER_SIZE`] bytes (or fewer when the file is shorter).
pub fn check_header(len: u64, head: &[u8], expected_uid: Option<u32>) -> Result<(), PageProblem> {
    if head.len() < 16 || head[..8] != MAGIC {
        if head.len() >= 8 && head[..8] != MAGIC {
            return Err(PageProblem::ForeignMagic);
        }
        return Err(PageProblem::Truncated { len });
    }
    let word = |at: usize| u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let version = word(offset_of!(Header, version));
    if version != VERSION {
        return Err(PageProblem::OtherVersion { version });
    }
    if len < PAGE_SIZE as u64 || head.len() < HEADER_SIZE {
        return Err(PageProblem::Truncated { len });
    }
    // A later layout may append words after the slots (a longer page,
    // its `page_size` saying so): this reader reads the first PAGE_SIZE
    // bytes of it, so that a newer library's page stays readable.
    let page_size = word(offset_of!(Header, page_size)) as usize;
    if word(offset_of!(Header, header_size)) as usize != HEADER_SIZE
        || !(PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size)
        || word(offset_of!(Header, slot_size)) as usize != SLOT_SIZE
        || word(offset_of!(Header, slot_count)) as usize != SLOTS
    {
        return Err(PageProblem::BadSizes);
    }
    if len < page_size as u64 {
        return Err(PageProblem::ShorterThanItSays {
            len,
            size: page_size as u64,
        });
    }
    let uid = word(offset_of!(Header, uid));
    if expected_uid.is_some_and(|e| e != uid) {
        return Err(PageProblem::OtherUser { uid });
    }
    if word(offset_of!(Header, state)) != STATE_READY {
        return Err(PageProblem::Initialising);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    fn page_bytes() -> Vec<u8> {
        let mut h: Header = unsafe_zeroed_header();
        h.fill(42, 1000, 7, 9, "python train.py", "");
        h.state = AtomicU32::new(STATE_READY);
        // SAFETY: Header is repr(C) plain data; viewing it as bytes is sound.
        let bytes =
            unsafe { std::slice::from_raw_parts((&h as *const Header).cast::<u8>(), HEADER_SIZE) };
        bytes.to_vec()
    }

    fn unsafe_zeroed_header() -> Header {
        // SAFETY: every field of Header is an integer, array of integers or
        // atomic integer, for which all-zero bytes are valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn header_checks() {
        let head = page_bytes();
        let len = PAGE_SIZE as u64;
        assert_eq!(check_header(len, &head, Some(1000)), Ok(()));
        assert_eq!(check_header(len, &head, None), Ok(()), "any user's page");
        assert_eq!(
            check_header(len, &head, Some(1001)),
            Err(PageProblem::OtherUser { uid: 1000 })
        );
        assert_eq!(
            check_header(100, &head[..100], Some(1000)),
            Err(PageProblem::Truncated { len: 100 })
        );
        assert_eq!(
            check_header(4, &head[..4], Some(1000)),
            Err(PageProblem::Truncated { len: 4 })
        );
        // A byte of the header changed (offset, new value) and what it makes.
        let spoilt = [
            (&[(0, b'X')][..], PageProblem::ForeignMagic),
            (&[(8, 2)], PageProblem::OtherVersion { version: 2 }),
            (&[(16, 0), (17, 0)], PageProblem::BadSizes),
            (&[(36, 0)], PageProblem::Initialising),
        ];
        // A longer page (a later layout's words after the slots) is read;
        // its length must cover what it says, and no page is past 64 KiB.
        let mut longer = head.clone();
        let at = offset_of!(Header, page_size);
        longer[at..at + 4].copy_from_slice(&((PAGE_SIZE + 256) as u32).to_ne_bytes());
        assert_eq!(check_header(len + 256, &longer, Some(1000)), Ok(()));
        assert_eq!(
            check_header(len, &longer, Some(1000)),
            Err(PageProblem::ShorterThanItSays {
                len,
                size: len + 256
            })
        );
        assert_eq!(
            PageProblem::ShorterThanItSays {
                len: 17500,
                size: 17664
            }
            .to_string(),
            "truncated (17500 bytes, its header says 17664)"
        );
        longer[at..at + 4].copy_from_slice(&((MAX_PAGE_SIZE + 1) as u32).to_ne_bytes());
        assert_eq!(
            check_header(u64::MAX, &longer, Some(1000)),
            Err(PageProblem::BadSizes)
        );
        for (bytes, problem) in spoilt {
            let mut bad = head.clone();
            for &(at, value) in bytes {
                bad[at] = value;
            }
            assert_eq!(
                check_header(len, &bad, Some(1000)),
                Err(problem),
                "{bytes:?}"
            );
        }
    }
}
