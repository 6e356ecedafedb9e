//! The live view's terminal: raw mode and the alternate screen, set up by
//! `ratatui::try_init` and undone by `ratatui::try_restore`, on every way
//! out.
//!
//! - A normal end (a quit key, `--count`, an error): [`Screen`] is dropped
//!   before anything is printed, showing the cursor, leaving raw mode and
//!   the alternate screen.
//! - SIGTERM, SIGHUP, SIGINT: their default would end the process with the
//!   terminal left in raw mode, so a handler only records the signal
//!   ([`signal`]); the event loop sees it within a quarter of a second and
//!   returns, and the terminal is restored as on a normal end.
//! - A panic: the hook `ratatui::try_init` installs restores the terminal
//!   before the message is printed, on the normal screen; unwinding then
//!   drops the [`Screen`], which only shows the cursor again. Once the
//!   terminal is restored the hook from before is put back, so a later
//!   panic does not restore it twice.
//!
//! - The terminal going away (its emulator killed, a tmux server gone):
//!   the tty then reads end-of-file for ever, and crossterm, once asked to
//!   wait for input, reads it in a loop that never returns. So the view
//!   waits for input itself ([`input`]: `poll(2)` on the terminal, which
//!   reports the hang-up) and asks crossterm only when there is some;
//!   [`signal`] reports the hang-up as SIGHUP, and the view ends as after
//!   one within a quarter of a second.
//!
//! A resize needs nothing here: crossterm reports it as an event and the
//! loop redraws at the new size.

use std::io;
use std::panic::PanicHookInfo;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Once};

use ratatui::DefaultTerminal;

/// The signal that asked the view to end (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signal that asked the view to end, if one did (SIGHUP as well when
/// the terminal hung up without one arriving).
pub fn signal() -> Option<i32> {
    match SIGNAL.load(Ordering::Relaxed) {
        0 => hung_up().then_some(libc::SIGHUP),
        s => Some(s),
    }
}

/// Waits up to `wait` for an event; true when crossterm has one to read.
/// On a hung-up terminal it returns false at once (see the module docs).
pub fn input(wait: std::time::Duration) -> io::Result<bool> {
    use crossterm::event;
    // SAFETY: isatty has no preconditions.
    if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
        // crossterm reads /dev/tty then, not a descriptor of ours.
        return event::poll(wait);
    }
    if hung_up() {
        return Ok(false);
    }
    if event::poll(std::time::Duration::ZERO)? {
        return Ok(true); // one crossterm read earlier and keeps
    }
    let mut fds = [
        libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: libc::STDOUT_FILENO,
            events: 0,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: two valid pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    let gone = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    if n <= 0 || (fds[0].revents | fds[1].revents) & gone != 0 {
        return Ok(false);
    }
    if fds[0].revents & libc::POLLIN == 0 || hung_up() {
        return Ok(false);
    }
    event::poll(std::time::Duration::ZERO)
}

/// Whether the terminal on standard output hung up (its other end closed).
fn hung_up() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait; POLLHUP and POLLERR are reported
    // whatever `events` asks.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n == 1 && fd.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe. The loop restores the
    // terminal and returns.
    SIGNAL.store(signal, Ordering::Relaxed);
}

fn catch_signals() {
    static HANDLERS: Once = Once::new();
    HANDLERS.call_once(|| {
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
            // SAFETY: a zeroed sigaction with a handler that only stores to
            // an atomic, installed for signals whose default would end the
            // process with the terminal left in raw mode.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(signal, &sa, std::ptr::null_mut());
            }
        }
    });
}

type PanicHook = dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static;

/// Installs `hook` as the panic hook.
fn set_hook(hook: Arc<PanicHook>) {
    std::panic::set_hook(Box::new(move |info| hook(info)));
}

/// The terminal in raw mode on the alternate screen, the cursor hidden,
/// until dropped.
pub struct Screen {
    pub terminal: DefaultTerminal,
    /// The panic hook from before `try_init` wrapped it, to put back once
    /// the terminal is restored.
    hook: Option<Arc<PanicHook>>,
}

impl Screen {
    pub fn enter() -> io::Result<Screen> {
        catch_signals();
        // Keep a handle on the hook that `try_init` wraps in its own.
        let hook: Arc<PanicHook> = Arc::from(std::panic::take_hook());
        set_hook(hook.clone());
        let terminal = match ratatui::try_init() {
            Ok(t) => t,
            Err(e) => {
                // Raw mode may be on already.
                let _ = ratatui::try_restore();
                set_hook(hook);
                return Err(e);
            }
        };
        // From here on, dropping the screen undoes everything.
        let mut screen = Screen {
            terminal,
            hook: Some(hook),
        };
        screen.terminal.hide_cursor()?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.terminal.show_cursor();
        if std::thread::panicking() {
            // The panic hook restored the terminal already, and a hook
            // cannot be changed while panicking.
            return;
        }
        let _ = ratatui::try_restore();
        if let Some(hook) = self.hook.take() {
            set_hook(hook);
        }
    }
}
