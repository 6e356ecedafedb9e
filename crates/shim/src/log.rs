//! Logging that never allocates and never locks: each message is formatted
//! into a buffer on the stack and written with one `write(2)` to stderr,
//! prefixed `vramcap[PID]: `. Long messages are cut, never split.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

use vramcap_core::settings::LogLevel;

/// The most detailed level that is printed (`LogLevel as u8`).
static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

#[inline(always)]
pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// A fixed buffer that keeps what fits and drops the rest.
pub struct StackBuf {
    buf: [u8; 1024],
    len: usize,
}

impl StackBuf {
    pub const fn new() -> StackBuf {
        StackBuf {
            buf: [0; 1024],
            len: 0,
        }
    }
}

impl Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len; // keep one byte for '\n'
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes one line to stderr, ignoring failures (there is nowhere to report them).
pub fn write_line(args: fmt::Arguments<'_>) {
    let mut b = StackBuf::new();
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    let _ = write!(b, "vramcap[{pid}]: ");
    let _ = b.write_fmt(args);
    b.buf[b.len] = b'\n';
    b.len += 1;
    // SAFETY: the pointer and length describe initialised bytes of `b`.
    let _ = unsafe { libc::write(2, b.buf.as_ptr().cast(), b.len) };
}

macro_rules! log_at {
    ($level:ident, $($arg:tt)*) => {
        if $crate::log::enabled(vramcap_core::settings::LogLevel::$level) {
            $crate::log::write_line(format_args!($($arg)*))
        }
    };
}

/// Logs at most once per call site for the life of the process.
macro_rules! log_once {
    ($level:ident, $($arg:tt)*) => {{
        static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !DONE.swap(true, std::sync::atomic::Ordering::Relaxed) {
            $crate::log::log_at!($level, $($arg)*);
        }
    }};
}

pub(crate) use {log_at, log_once};
