//! `vramcap top`: a live view of every process under the shim.
//!
//! Every `--interval` seconds (default 1) the statistics pages and group
//! pages are read again, exactly as `vramcap stat` reads them, and the
//! screen is redrawn:
//!
//! ```text
//! vramcap top  12:34:56  2 processes  /dev/shm/vramcap-1000
//! GPU  PID     MEMORY              USED▼    LIMIT      %  OOM HISTORY          COMMAND
//! 1    24423   ████████████████ 1.00 GiB 1.00 GiB 100.0%    1     ▂▂▄▄▆▆██████ python train.py
//! 0    24501   ████████████▓▓▓▓ 1.50 GiB        -      -    0 ▂▄▆█████████████ python eval.py
//! 0    24423   ███▓▓▒▒·········  300 MiB 1.00 GiB  29.3%    0        ▁▁▂▂▂▃▃▃▃ python train.py
//!
//! GROUP GPU          MEMORY                             USED    LIMIT MEMBERS
//! train GPU-5ca1ab1e █████████████████·············  640 MiB 1.00 GiB 2: 24423, 24501
//! q quit  u used  p pid  g gpu  o oom  r reverse   ░ context █ used ▓ cached ▒ spilled
//! ```
//!
//! - The title line: the time of the last refresh, the number of processes
//!   and the statistics directory (then files that were skipped, or why the
//!   directory could not be read).
//! - One row per process and GPU. `MEMORY` is a bar of what the process
//!   holds beyond its allocations (its context and graph memory, `░`,
//!   blue; part of `USED`), the bytes in use (`█`, green), the freed blocks the shim keeps cached (`▓`, yellow; the
//!   cap counts them, so they are part of `USED`) and the bytes spilled to
//!   host memory (`▒`, magenta; not counted against the cap), drawn against
//!   the limit — or, for a GPU without a cap (`LIMIT` `-`), against the
//!   process's peak. `%` is `USED` of `LIMIT` (yellow from 90 %), `OOM` the
//!   allocations the cap refused (red when any). `HISTORY` is a sparkline
//!   of `USED` over the last [`model::HISTORY`] refreshes (two minutes at the
//!   default interval), newest on the right, each character the highest
//!   value of the refreshes it covers, scaled to the limit (to the highest
//!   value seen when uncapped).
//! - Below, when any group page exists, one row per group and GPU: its
//!   shared budget as a bar, the bytes the group holds, its limit and its
//!   members.
//!
//! Keys: `u` sorts by used bytes (largest first, the default), `p` by PID,
//! `g` by GPU, `o` by refusals (most first); choosing another column sorts
//! in its natural direction, `r` reverses the order. `q`, `Esc` or `Ctrl-C`
//! quits. The view uses the alternate screen and raw mode; both are undone
//! on every way out — a quit key, `--count`, SIGTERM/SIGHUP/SIGINT, an error
//! or a panic — and the cursor is shown again ([`terminal`]). A resized
//! terminal is redrawn at once.
//!
//! When standard output is not a terminal, `top` prints the table of
//! `vramcap stat` (with its groups section) every interval instead, like
//! `vramcap stat --loop INTERVAL`. `--count N` stops after N refreshes in
//! both modes (the live view keeps the last one on screen for one interval).
//!
//! Exit status: 0; 1 when the terminal cannot be set up or drawn to, or
//! (without a terminal) the statistics directory cannot be read; 128 + the
//! signal's number after SIGTERM, SIGHUP or SIGINT.

//!
//! The parts: [`terminal`] (setting the terminal up and restoring it,
//! signals), [`model`] (the rows, their order and history, read from the
//! pages), [`view`] (drawing a model); this file runs the loop between
//! them.

mod model;
mod terminal;
mod view;

use std::io::{self, IsTerminal};
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;

use self::model::{Model, SortBy};
use self::terminal::Screen;
use super::stat::{GpuSel, Sources, StatArgs, parse_interval as parse_seconds};

/// `--interval`: seconds, greater than 0.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_seconds(text).map_err(|_| {
        format!(
            "\"{text}\" is not a refresh interval: expected seconds, greater than 0 (e.g. --interval 1 or --interval 0.5)"
        )
    })
}

/// Runs `top`; returns the exit code. `count` `Some(0)` is `--once`: the
/// `stat` table printed once, with or without a terminal.
pub fn run(sources: Sources, interval: Duration, count: Option<u64>, gpus: Vec<GpuSel>) -> u8 {
    let once = count == Some(0);
    if once || !io::stdout().is_terminal() {
        let mut args = StatArgs {
            groups: Vec::new(),
            json: false,
            interval: (!once).then_some(interval),
            count: count.filter(|_| !once),
            pids: Vec::new(),
            gpus,
            csv: None,
            sources,
        };
        return super::stat::run(&mut args);
    }
    let mut model = Model::new(sources, gpus);
    let outcome = (|| -> io::Result<Option<i32>> {
        let mut screen = Screen::enter()?;
        screen.terminal.clear()?;
        live(&mut screen.terminal, &mut model, interval, count)
        // `screen` restores the terminal here, before anything is printed.
    })();
    match outcome {
        Ok(None) => 0,
        Ok(Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        Err(e) => {
            eprintln!("vramcap: top: {e}");
            1
        }
    }
}

/// The event loop: refresh on every tick, redraw on keys and resizes.
/// Returns the signal that ended it, if one did.
fn live(
    terminal: &mut DefaultTerminal,
    model: &mut Model,
    interval: Duration,
    count: Option<u64>,
) -> io::Result<Option<i32>> {
    let mut refreshes = 0u64;
    let mut next = Instant::now();
    loop {
        if let Some(signal) = terminal::signal() {
            return Ok(Some(signal));
        }
        let now = Instant::now();
        if now >= next {
            if count.is_some_and(|c| refreshes >= c) {
                return Ok(None);
            }
            model.refresh();
            refreshes += 1;
            terminal.draw(|f| view::draw(f, model))?;
            next += interval;
            if next <= now {
                next = now + interval;
            }
        }
        // Short polls, so a signal is noticed within a quarter of a second.
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        if !terminal::input(wait)? {
            continue;
        }
        match event::read()? {
            Event::Key(key) if key.kind != KeyEventKind::Release => match action(key) {
                Some(Action::Quit) => return Ok(None),
                Some(Action::Sort(by)) => {
                    model.sort_by(by);
                    terminal.draw(|f| view::draw(f, model))?;
                }
                Some(Action::Reverse) => {
                    model.toggle_reverse();
                    terminal.draw(|f| view::draw(f, model))?;
                }
                Some(Action::Cycle(step)) => {
                    model.sort_by(model.sort.cycled(step));
                    terminal.draw(|f| view::draw(f, model))?;
                }
                None => {}
            },
            Event::Resize(..) => {
                terminal.autoresize()?;
                terminal.clear()?;
                terminal.draw(|f| view::draw(f, model))?;
            }
            _ => {}
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Quit,
    Sort(SortBy),
    Reverse,
    /// The previous (-1) or next (+1) column to sort by.
    Cycle(i8),
}

fn action(key: KeyEvent) -> Option<Action> {
    match key.code {
        KeyCode::Esc => Some(Action::Quit),
        KeyCode::Char(c) if key.modifiers.contains(KeyModifiers::CONTROL) => {
            matches!(c, 'c' | 'C').then_some(Action::Quit)
        }
        KeyCode::Char(c) => match c.to_ascii_lowercase() {
            'q' => Some(Action::Quit),
            'u' => Some(Action::Sort(SortBy::Used)),
            'p' => Some(Action::Sort(SortBy::Pid)),
            'g' => Some(Action::Sort(SortBy::Gpu)),
            'o' => Some(Action::Sort(SortBy::Refusals)),
            'r' | '/' => Some(Action::Reverse),
            ',' | '<' => Some(Action::Cycle(-1)),
            '.' | '>' => Some(Action::Cycle(1)),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let k = |code, modifiers| action(KeyEvent::new(code, modifiers));
        assert_eq!(
            k(KeyCode::Char('q'), KeyModifiers::NONE),
            Some(Action::Quit)
        );
        assert_eq!(k(KeyCode::Esc, KeyModifiers::NONE), Some(Action::Quit));
        assert_eq!(
            k(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Some(Action::Quit)
        );
        assert_eq!(k(KeyCode::Char('c'), KeyModifiers::NONE), None);
        assert_eq!(
            k(KeyCode::Char('o'), KeyModifiers::NONE),
            Some(Action::Sort(SortBy::Refusals))
        );
        assert_eq!(
            k(KeyCode::Char('r'), KeyModifiers::NONE),
            Some(Action::Reverse)
        );
        // nvitop's: `/` reverses, `,` and `.` move the sort column.
        assert_eq!(
            k(KeyCode::Char('/'), KeyModifiers::NONE),
            Some(Action::Reverse)
        );
        assert_eq!(
            k(KeyCode::Char(','), KeyModifiers::NONE),
            Some(Action::Cycle(-1))
        );
        assert_eq!(
            k(KeyCode::Char('.'), KeyModifiers::NONE),
            Some(Action::Cycle(1))
        );
        let mut by = SortBy::Gpu;
        let mut seen = Vec::new();
        for _ in 0..4 {
            by = by.cycled(1);
            seen.push(by);
        }
        assert_eq!(
            seen,
            [SortBy::Pid, SortBy::Used, SortBy::Refusals, SortBy::Gpu]
        );
        assert_eq!(SortBy::Gpu.cycled(-1), SortBy::Refusals);
    }

    #[test]
    fn interval_message_names_the_option() {
        assert!(parse_interval("0").unwrap_err().contains("--interval"));
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
    }
}
