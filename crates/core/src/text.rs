//! Text from outside (pages, group files, file and directory names) made
//! safe to print and export: the one sanitising helper.
//!
//! Anyone who can write a page or name a file can put bytes there that
//! would drive a terminal (an escape sequence that retitles the window or
//! clears the screen), break a line-oriented format, or reorder what a
//! reader sees. Every such string goes through [`printable_bytes`] (or
//! [`printable`], [`field`], [`path`]) before it is shown, printed as JSON or
//! exported as a label value:
//!
//! - control characters (C0, DEL, C1) become `\xNN` (`\x1b`, `\x0a`) for
//!   those below 0x80 and `\u00NN` for C1;
//! - the invisible format characters that reorder or hide text
//!   (bidirectional overrides and isolates, zero-width and byte-order
//!   marks) become `\uNNNN` (every escaped character is below U+10000, so
//!   four digits always do; no braces, which some label parsers mistake
//!   for the end of the labels);
//! - bytes that are not UTF-8 become `\xNN` (always 0x80 or above, so they
//!   never read as an escaped control character);
//! - everything else, backslashes included, is kept as it is.
//!
//! The result is valid UTF-8 without a control character, so it is also a
//! safe Prometheus label value once the format's own escapes (`\\`, `\"`)
//! are applied.

use std::borrow::Cow;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether `c` would be shown escaped.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn push_escaped(out: &mut String, c: char) {
    let n = c as u32;
    // Writing to a String cannot fail.
    let _ = if n < 0x80 {
        write!(out, "\\x{n:02x}")
    } else {
        write!(out, "\\u{n:04x}")
    };
}

/// `text` with every character that could drive a terminal or hide text
/// escaped (see the module); borrowed when nothing needed it.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `bytes` as printable text: [`printable`] of each UTF-8 run, and `\xNN`
/// for each byte that is not UTF-8.
pub fn printable_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(&printable(chunk.valid()));
        for b in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A NUL-padded text field of a page or group file, up to its first NUL,
/// as printable text.
pub fn field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    printable_bytes(&bytes[..end])
}

/// A path as printable text (its bytes, not a lossy rendering).
pub fn path(p: &Path) -> String {
    printable_bytes(p.as_os_str().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes() {
        assert_eq!(
            printable("python train.py --lr=1e-3"),
            "python train.py --lr=1e-3"
        );
        assert!(matches!(printable("plain ü"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\x1b]0;owned\x07b\x1b[2J\x1b[H"),
            "a\\x1b]0;owned\\x07b\\x1b[2J\\x1b[H"
        );
        assert_eq!(
            printable("tab\tnl\ncr\rdel\x7f"),
            "tab\\x09nl\\x0acr\\x0ddel\\x7f"
        );
        assert_eq!(printable("c1\u{9b}31m"), "c1\\u009b31m");
        assert_eq!(printable("abc\u{202e}fed"), "abc\\u202efed");
        assert_eq!(printable("\u{feff}x\u{200b}"), "\\ufeffx\\u200b");
        assert_eq!(printable("back\\slash"), "back\\slash");
        assert_eq!(printable_bytes(b"ok\xff\xfe!\xc3"), "ok\\xff\\xfe!\\xc3");
        assert_eq!(printable_bytes("ñ\x1b".as_bytes()), "ñ\\x1b");
        assert_eq!(field(b"name\0\x1bjunk"), "name");
        assert_eq!(field(b"\x1b[31m"), "\\x1b[31m");
        assert_eq!(
            path(Path::new(std::ffi::OsStr::from_bytes(
                b"/d/\x1b[2J\xff.page"
            ))),
            "/d/\\x1b[2J\\xff.page"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Whatever the bytes: valid UTF-8, no control or hiding
        /// character, and text that needed nothing is kept exactly.
        #[test]
        fn any_bytes_come_out_printable(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let out = printable_bytes(&bytes);
            prop_assert!(!out.chars().any(escaped), "{out:?}");
            if let Ok(s) = std::str::from_utf8(&bytes) && !s.chars().any(escaped) {
                prop_assert_eq!(out.as_str(), s);
            }
        }

        #[test]
        fn any_text_comes_out_printable(s in any::<String>()) {
            let out = printable(&s);
            prop_assert!(!out.chars().any(escaped), "{out:?}");
            prop_assert!(out.len() >= s.len());
        }
    }
}
