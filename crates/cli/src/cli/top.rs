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
//! q quit  u used  p pid  g gpu  o oom  r reverse   █ used ▓ cached ▒ spilled
//! ```
//!
//! - The title line: the time of the last refresh, the number of processes
//!   and the statistics directory (then files that were skipped, or why the
//!   directory could not be read).
//! - One row per process and GPU. `MEMORY` is a bar of the bytes in use
//!   (`█`, green), the freed blocks the shim keeps cached (`▓`, yellow; the
//!   cap counts them, so they are part of `USED`) and the bytes spilled to
//!   host memory (`▒`, magenta; not counted against the cap), drawn against
//!   the limit — or, for a GPU without a cap (`LIMIT` `-`), against the
//!   process's peak. `%` is `USED` of `LIMIT` (yellow from 90 %), `OOM` the
//!   allocations the cap refused (red when any). `HISTORY` is a sparkline
//!   of `USED` over the last [`HISTORY`] refreshes (two minutes at the
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
//! or a panic — and the cursor is shown again. A resized terminal is redrawn
//! at once.
//!
//! When standard output is not a terminal, `top` prints the table of
//! `vramcap stat` (with its groups section) every interval instead, like
//! `vramcap stat --loop INTERVAL`. `--count N` stops after N refreshes in
//! both modes (the live view keeps the last one on screen for one interval).
//!
//! Exit status: 0; 1 when the terminal cannot be set up or drawn to, or
//! (without a terminal) the statistics directory cannot be read; 128 + the
//! signal's number after SIGTERM, SIGHUP or SIGINT.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IsTerminal, Stdout};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::read::GroupSnapshot;
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Frame;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use vramcap_core::human_bytes;
use vramcap_core::page::{SlotSnapshot, uuid_text};

use super::stat::{Sources, StatArgs, parse_interval as parse_seconds};

/// Samples of `USED` kept per process and GPU for the sparkline.
pub const HISTORY: usize = 120;

const USED_GLYPH: char = '█';
const CACHED_GLYPH: char = '▓';
const SPILLED_GLYPH: char = '▒';
const FREE_GLYPH: char = '·';
const USED_COLOUR: Color = Color::Green;
const CACHED_COLOUR: Color = Color::Yellow;
const SPILLED_COLOUR: Color = Color::Magenta;
const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// `--interval`: seconds, greater than 0.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_seconds(text).map_err(|_| {
        format!(
            "\"{text}\" is not a refresh interval: expected seconds, greater than 0 (e.g. --interval 1 or --interval 0.5)"
        )
    })
}

/// Runs `top`; returns the exit code.
pub fn run(sources: Sources, interval: Duration, count: Option<u64>) -> u8 {
    if !io::stdout().is_terminal() {
        let mut args = StatArgs {
            groups: Vec::new(),
            json: false,
            interval: Some(interval),
            count,
            pids: Vec::new(),
            gpus: Vec::new(),
            sources,
        };
        return super::stat::run(&mut args);
    }
    let mut view = View::new(sources);
    let outcome = (|| -> io::Result<Option<i32>> {
        let _guard = TerminalGuard::enter()?;
        let mut terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
        terminal.clear()?;
        live(&mut terminal, &mut view, interval, count)
        // `_guard` restores the terminal here, before anything is printed.
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
    terminal: &mut Terminal<CrosstermBackend<Stdout>>,
    view: &mut View,
    interval: Duration,
    count: Option<u64>,
) -> io::Result<Option<i32>> {
    let mut refreshes = 0u64;
    let mut next = Instant::now();
    loop {
        let signal = SIGNAL.load(Ordering::Relaxed);
        if signal != 0 {
            return Ok(Some(signal));
        }
        let now = Instant::now();
        if now >= next {
            if count.is_some_and(|c| refreshes >= c) {
                return Ok(None);
            }
            view.refresh();
            refreshes += 1;
            terminal.draw(|f| view.draw(f))?;
            next += interval;
            if next <= now {
                next = now + interval;
            }
        }
        // Short polls, so a signal is noticed within a quarter of a second.
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        if !event::poll(wait)? {
            continue;
        }
        match event::read()? {
            Event::Key(key) if key.kind != KeyEventKind::Release => match action(key) {
                Some(Action::Quit) => return Ok(None),
                Some(Action::Sort(by)) => {
                    if view.sort != by {
                        view.sort = by;
                        view.reverse = false;
                    }
                    terminal.draw(|f| view.draw(f))?;
                }
                Some(Action::Reverse) => {
                    view.reverse = !view.reverse;
                    terminal.draw(|f| view.draw(f))?;
                }
                None => {}
            },
            Event::Resize(..) => {
                terminal.autoresize()?;
                terminal.clear()?;
                terminal.draw(|f| view.draw(f))?;
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
            'r' => Some(Action::Reverse),
            _ => None,
        },
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// The terminal: raw mode and the alternate screen, undone on every way out.

/// Whether raw mode and the alternate screen are on and not yet undone.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The signal that asked the view to end (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Leaves raw mode and the alternate screen and shows the cursor, once.
fn restore_terminal() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, crossterm::cursor::Show);
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe. The loop restores the
    // terminal and returns.
    SIGNAL.store(signal, Ordering::Relaxed);
}

struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> io::Result<TerminalGuard> {
        static HOOKS: Once = Once::new();
        HOOKS.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // The message must land on the normal screen, after raw mode.
                restore_terminal();
                previous(info);
            }));
            for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
                // SAFETY: a zeroed sigaction with a handler that only stores
                // to an atomic, installed for signals whose default would
                // end the process with the terminal left in raw mode.
                unsafe {
                    let mut sa: libc::sigaction = std::mem::zeroed();
                    sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                    sa.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut sa.sa_mask);
                    libc::sigaction(signal, &sa, std::ptr::null_mut());
                }
            }
        });
        enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        let guard = TerminalGuard; // from here on, dropping it undoes everything
        execute!(io::stdout(), EnterAlternateScreen, crossterm::cursor::Hide)?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

// ---------------------------------------------------------------------------
// What is shown.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Used,
    Pid,
    Gpu,
    Refusals,
}

/// One process on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcRow {
    pub pid: u32,
    pub start_time: u64,
    /// The directory of the page (PIDs of two containers may be equal).
    pub dir: std::path::PathBuf,
    pub command: String,
    pub slot: SlotSnapshot,
}

impl ProcRow {
    fn key(&self) -> HistoryKey {
        (
            self.dir.clone(),
            self.pid,
            self.start_time,
            self.slot.device,
        )
    }
}

/// Sorts rows by `by` in its natural direction (used and refusals largest
/// first, PID and GPU smallest first; ties by PID, then GPU), or the exact
/// opposite when `reverse`.
pub fn sort_rows(rows: &mut [ProcRow], by: SortBy, reverse: bool) {
    rows.sort_by(|a, b| {
        let ids = (a.pid, a.slot.device).cmp(&(b.pid, b.slot.device));
        let order = match by {
            SortBy::Used => b.slot.used.cmp(&a.slot.used).then(ids),
            SortBy::Pid => ids,
            SortBy::Gpu => a.slot.device.cmp(&b.slot.device).then(a.pid.cmp(&b.pid)),
            SortBy::Refusals => b.slot.refusals.cmp(&a.slot.refusals).then(ids),
        };
        if reverse { order.reverse() } else { order }
    });
}

/// (directory, pid, start time, GPU): a reused PID starts a fresh history,
/// and equal PIDs of two containers keep theirs apart.
type HistoryKey = (std::path::PathBuf, u32, u64, u32);

/// The last [`HISTORY`] values of one row's `USED`.
#[derive(Debug, Default, Clone)]
pub struct History {
    samples: VecDeque<u64>,
    /// Samples ever pushed (the absolute index of the next one).
    total: u64,
}

impl History {
    pub fn push(&mut self, value: u64) {
        if self.samples.len() == HISTORY {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
        self.total += 1;
    }

    pub fn max(&self) -> u64 {
        self.samples.iter().copied().max().unwrap_or(0)
    }

    /// The history in `width` characters, newest on the right. When it does
    /// not fit, each character is the highest of a fixed run of samples
    /// (runs aligned to the absolute sample number, so characters do not
    /// shift between runs), enough that the whole history fits.
    pub fn sparkline(&self, width: usize, scale: u64) -> String {
        if width == 0 {
            return String::new();
        }
        let per = HISTORY.div_ceil(width).max(1) as u64;
        let first = self.total - self.samples.len() as u64;
        let mut buckets: Vec<u64> = Vec::new(); // newest first
        let mut current: Option<u64> = None;
        for (i, &v) in self.samples.iter().enumerate().rev() {
            let bucket = (first + i as u64) / per;
            if current != Some(bucket) {
                if buckets.len() == width {
                    break;
                }
                current = Some(bucket);
                buckets.push(v);
            } else if let Some(last) = buckets.last_mut() {
                *last = (*last).max(v);
            }
        }
        let scale = scale.max(1);
        let mut out: String = " ".repeat(width - buckets.len());
        for &v in buckets.iter().rev() {
            out.push(if v == 0 {
                ' '
            } else {
                let level = (v as u128 * 7 / scale as u128).min(7) as usize;
                SPARKS[level]
            });
        }
        out
    }
}

/// Lengths, in cells, of `segments` drawn in a bar of `width` cells where
/// `width` stands for `scale` bytes. A segment that is not zero gets at
/// least one cell while there is room; the total never passes `width`.
pub fn bar_cells(width: usize, scale: u64, segments: &[u64]) -> Vec<usize> {
    let scale = scale.max(1) as u128;
    let mut left = width;
    let mut out = Vec::with_capacity(segments.len());
    for &s in segments {
        let mut n = (s as u128 * width as u128 + scale / 2) / scale;
        if s > 0 && n == 0 {
            n = 1;
        }
        let n = (n as usize).min(left);
        left -= n;
        out.push(n);
    }
    out
}

fn bar(width: usize, scale: u64, segments: &[(u64, char, Color)]) -> Line<'static> {
    let values: Vec<u64> = segments.iter().map(|s| s.0).collect();
    let cells = bar_cells(width, scale, &values);
    let mut spans = Vec::new();
    for (&n, &(_, glyph, colour)) in cells.iter().zip(segments) {
        if n > 0 {
            spans.push(Span::styled(
                glyph.to_string().repeat(n),
                Style::default().fg(colour),
            ));
        }
    }
    let free = width - cells.iter().sum::<usize>();
    if free > 0 {
        spans.push(Span::styled(
            FREE_GLYPH.to_string().repeat(free),
            Style::default().fg(Color::DarkGray),
        ));
    }
    Line::from(spans)
}

/// The bar of one process row: in use, cached, spilled, against the limit
/// (the peak when uncapped), widened when spilled bytes pass it.
fn slot_bar(width: usize, s: &SlotSnapshot) -> Line<'static> {
    let cached = s.cached.min(s.used);
    let in_use = s.used - cached;
    let base = s.limit.unwrap_or(s.peak.max(s.used));
    let scale = base.max(s.used.saturating_add(s.spilled));
    bar(
        width,
        scale,
        &[
            (in_use, USED_GLYPH, USED_COLOUR),
            (cached, CACHED_GLYPH, CACHED_COLOUR),
            (s.spilled, SPILLED_GLYPH, SPILLED_COLOUR),
        ],
    )
}

/// The command as the view shows it: absolute paths cut to their last
/// component (`/opt/venv/bin/python3 /src/train.py` is `python3 train.py`),
/// so rows tell programs apart in the column's width; prefixed with
/// `POD/CONTAINER:` when the process recorded a Kubernetes identity.
fn shown_command(command: &str, pod: &str, container: &str) -> String {
    let short: Vec<&str> = command
        .split(' ')
        .map(|w| match w.rsplit_once('/') {
            Some((_, last)) if w.starts_with('/') && !last.is_empty() => last,
            _ => w,
        })
        .collect();
    let short = short.join(" ");
    let text = match (pod, container) {
        ("", _) => short,
        (pod, "") => format!("{pod}: {short}"),
        (pod, container) => format!("{pod}/{container}: {short}"),
    };
    printable(&text)
}

/// Control characters of a command line would drive the terminal: shown as `?`.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn clock() -> String {
    // SAFETY: time with a null pointer only returns the time.
    let t = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: tm is plain data, and localtime_r writes only into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return String::new();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

struct View {
    sources: Sources,
    rows: Vec<ProcRow>,
    groups: Vec<GroupSnapshot>,
    processes: usize,
    skipped: usize,
    error: Option<String>,
    time: String,
    history: HashMap<HistoryKey, History>,
    sort: SortBy,
    reverse: bool,
}

impl View {
    fn new(sources: Sources) -> View {
        View {
            sources,
            rows: Vec::new(),
            groups: Vec::new(),
            processes: 0,
            skipped: 0,
            error: None,
            time: String::new(),
            history: HashMap::new(),
            sort: SortBy::Used,
            reverse: false,
        }
    }

    /// Reads the pages again and extends every row's history.
    fn refresh(&mut self) {
        self.time = clock();
        let (s, groups) = match self.sources.read() {
            Ok(r) => (r.scan, r.groups),
            Err(e) => {
                self.error = Some(e);
                self.rows.clear();
                self.groups.clear();
                self.processes = 0;
                self.skipped = 0;
                self.history.clear();
                return;
            }
        };
        self.error = None;
        self.processes = s.pages.len();
        self.skipped = s.skipped.len();
        self.groups = groups;
        self.rows = s
            .pages
            .iter()
            .flat_map(|p| {
                p.devices.iter().map(|d| ProcRow {
                    pid: p.pid,
                    start_time: p.start_time,
                    dir: p.dir.clone(),
                    command: shown_command(&p.command, &p.pod, &p.container),
                    slot: *d,
                })
            })
            .collect();
        let mut seen = HashMap::with_capacity(self.rows.len());
        for r in &self.rows {
            let mut h = self.history.remove(&r.key()).unwrap_or_default();
            h.push(r.slot.used);
            seen.insert(r.key(), h);
        }
        self.history = seen; // rows that went take their history with them
    }

    fn draw(&mut self, f: &mut Frame) {
        sort_rows(&mut self.rows, self.sort, self.reverse);
        let area = f.area();
        let group_rows: usize = self.groups.iter().map(|g| g.devices.len().max(1)).sum();
        let group_height = if self.groups.is_empty() {
            0
        } else {
            // A blank line, the header, the rows; at most half the screen.
            (2 + group_rows as u16).min(area.height / 2)
        };
        let [title, table, groups, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(0),
            Constraint::Length(group_height),
            Constraint::Length(1),
        ])
        .areas(area);
        f.render_widget(Paragraph::new(self.title_line()), title);
        self.draw_processes(f, table);
        if group_height > 0 {
            let [_, rest] =
                Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(groups);
            self.draw_groups(f, rest);
        }
        f.render_widget(Paragraph::new(footer_line()), footer);
    }

    fn title_line(&self) -> Line<'static> {
        let plural = if self.processes == 1 { "" } else { "es" };
        let mut spans = vec![
            Span::styled("vramcap top", Style::default().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                "  {}  {} process{plural}  {}",
                self.time,
                self.processes,
                self.sources.describe()
            )),
        ];
        if self.skipped > 0 {
            let s = if self.skipped == 1 { "" } else { "s" };
            spans.push(Span::styled(
                format!("  {} file{s} skipped (vramcap stat says why)", self.skipped),
                Style::default().fg(Color::Yellow),
            ));
        }
        if let Some(e) = &self.error {
            spans.push(Span::styled(
                format!("  {e}"),
                Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
            ));
        }
        Line::from(spans)
    }

    fn draw_processes(&self, f: &mut Frame, area: Rect) {
        let pid_w = self
            .rows
            .iter()
            .map(|r| r.pid.to_string().len())
            .max()
            .unwrap_or(0)
            .max(7);
        let oom_w = self
            .rows
            .iter()
            .map(|r| r.slot.refusals.to_string().len())
            .max()
            .unwrap_or(0)
            .max(4);
        // GPU (with room for the sort arrow), PID, USED, LIMIT, %, OOM and
        // the spaces between nine columns.
        let fixed = 4 + pid_w + 8 + 8 + 6 + oom_w + 8;
        let rest = (area.width as usize).saturating_sub(fixed);
        let bar_w = (rest * 3 / 10).clamp(8, 30);
        let hist_w = (rest * 3 / 10).min(30);
        let hist_w = if hist_w < 4 { 0 } else { hist_w };

        let arrow = |col: SortBy| -> &'static str {
            if col != self.sort {
                ""
            } else {
                let natural_down = matches!(col, SortBy::Used | SortBy::Refusals);
                if natural_down != self.reverse {
                    "▼"
                } else {
                    "▲"
                }
            }
        };
        let right = |s: String| Cell::from(Line::from(s).right_aligned());
        let mut header = vec![
            Cell::from(format!("GPU{}", arrow(SortBy::Gpu))),
            Cell::from(format!("PID{}", arrow(SortBy::Pid))),
            Cell::from("MEMORY"),
            right(format!("USED{}", arrow(SortBy::Used))),
            right("LIMIT".into()),
            right("%".into()),
            right(format!("OOM{}", arrow(SortBy::Refusals))),
        ];
        let mut widths = vec![
            Constraint::Length(4),
            Constraint::Length(pid_w as u16),
            Constraint::Length(bar_w as u16),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(6),
            Constraint::Length(oom_w as u16),
        ];
        if hist_w > 0 {
            header.push(Cell::from("HISTORY"));
            widths.push(Constraint::Length(hist_w as u16));
        }
        header.push(Cell::from("COMMAND"));
        widths.push(Constraint::Fill(1));

        let rows: Vec<Row> = self
            .rows
            .iter()
            .map(|r| {
                let s = &r.slot;
                let pct = s.limit.map(|l| s.used as f64 * 100.0 / l.max(1) as f64);
                let pct_cell = right(
                    pct.map(|p| format!("{p:.1}%"))
                        .unwrap_or_else(|| "-".into()),
                );
                let pct_cell = if pct.is_some_and(|p| p >= 90.0) {
                    pct_cell.style(Style::default().fg(Color::Yellow))
                } else {
                    pct_cell
                };
                let oom = right(s.refusals.to_string());
                let oom = if s.refusals > 0 {
                    oom.style(Style::default().fg(Color::Red).add_modifier(Modifier::BOLD))
                } else {
                    oom
                };
                let mut cells = vec![
                    Cell::from(s.device.to_string()),
                    Cell::from(r.pid.to_string()),
                    Cell::from(slot_bar(bar_w, s)),
                    right(human_bytes(s.used)),
                    right(s.limit.map(human_bytes).unwrap_or_else(|| "-".into())),
                    pct_cell,
                    oom,
                ];
                if hist_w > 0 {
                    let h = self.history.get(&r.key());
                    let scale = s.limit.unwrap_or_else(|| h.map_or(0, History::max));
                    let line = h.map(|h| h.sparkline(hist_w, scale)).unwrap_or_default();
                    cells.push(Cell::from(Span::styled(
                        line,
                        Style::default().fg(Color::Cyan),
                    )));
                }
                cells.push(Cell::from(r.command.clone()));
                Row::new(cells)
            })
            .collect();
        let empty = rows.is_empty();
        let table = Table::new(rows, widths)
            .header(Row::new(header).style(Style::default().add_modifier(Modifier::REVERSED)))
            .column_spacing(1);
        f.render_widget(table, area);
        if empty && area.height > 1 {
            let text = match &self.error {
                Some(_) => String::new(),
                None => format!(
                    "(no processes under vramcap in {})",
                    self.sources.describe()
                ),
            };
            let at = Rect {
                y: area.y + 1,
                height: 1,
                ..area
            };
            f.render_widget(Paragraph::new(text), at);
        }
    }

    fn draw_groups(&self, f: &mut Frame, area: Rect) {
        let name_w = self
            .groups
            .iter()
            .map(|g| g.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        let full_uuid = area.width >= 110;
        let uuid_w = if full_uuid { 40 } else { 12 };
        let fixed = name_w + uuid_w + 8 + 8 + 5;
        let rest = (area.width as usize).saturating_sub(fixed);
        let bar_w = (rest / 2).clamp(8, 30);
        let right = |s: String| Cell::from(Line::from(s).right_aligned());
        let header = Row::new(vec![
            Cell::from("GROUP"),
            Cell::from("GPU"),
            Cell::from("MEMORY"),
            right("USED".into()),
            right("LIMIT".into()),
            Cell::from("MEMBERS"),
        ])
        .style(Style::default().add_modifier(Modifier::REVERSED));
        let mut rows = Vec::new();
        for g in &self.groups {
            let pids: Vec<String> = g.members.iter().map(|m| m.pid.to_string()).collect();
            let members = if pids.is_empty() {
                "0".to_string()
            } else {
                format!("{}: {}", pids.len(), pids.join(", "))
            };
            if g.devices.is_empty() {
                rows.push(Row::new(vec![
                    Cell::from(printable(&g.name)),
                    Cell::from("-"),
                    Cell::from(""),
                    right("-".into()),
                    right("-".into()),
                    Cell::from(members.clone()),
                ]));
            }
            for d in &g.devices {
                let uuid = uuid_text(&d.uuid).unwrap_or_else(|| "?".into());
                let uuid = if full_uuid {
                    uuid
                } else {
                    uuid.chars().take(uuid_w).collect()
                };
                let scale = d.limit.unwrap_or(d.peak.max(d.used));
                rows.push(Row::new(vec![
                    Cell::from(printable(&g.name)),
                    Cell::from(uuid),
                    Cell::from(bar(bar_w, scale, &[(d.used, USED_GLYPH, USED_COLOUR)])),
                    right(human_bytes(d.used)),
                    right(d.limit.map(human_bytes).unwrap_or_else(|| "-".into())),
                    Cell::from(members.clone()),
                ]));
            }
        }
        let widths = [
            Constraint::Length(name_w as u16),
            Constraint::Length(uuid_w as u16),
            Constraint::Length(bar_w as u16),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Fill(1),
        ];
        f.render_widget(
            Table::new(rows, widths).header(header).column_spacing(1),
            area,
        );
    }
}

fn footer_line() -> Line<'static> {
    let key = |k: &'static str| Span::styled(k, Style::default().add_modifier(Modifier::BOLD));
    let glyph = |g: char, c: Color| Span::styled(g.to_string(), Style::default().fg(c));
    Line::from(vec![
        key("q"),
        Span::raw(" quit  "),
        key("u"),
        Span::raw(" used  "),
        key("p"),
        Span::raw(" pid  "),
        key("g"),
        Span::raw(" gpu  "),
        key("o"),
        Span::raw(" oom  "),
        key("r"),
        Span::raw(" reverse   "),
        glyph(USED_GLYPH, USED_COLOUR),
        Span::raw(" used "),
        glyph(CACHED_GLYPH, CACHED_COLOUR),
        Span::raw(" cached "),
        glyph(SPILLED_GLYPH, SPILLED_COLOUR),
        Span::raw(" spilled"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, gpu: u32, used: u64, refusals: u64) -> ProcRow {
        ProcRow {
            dir: std::path::PathBuf::new(),
            pid,
            start_time: 1,
            command: String::new(),
            slot: SlotSnapshot {
                device: gpu,
                used,
                refusals,
                ..SlotSnapshot::default()
            },
        }
    }

    fn order(rows: &[ProcRow]) -> Vec<(u32, u32)> {
        rows.iter().map(|r| (r.pid, r.slot.device)).collect()
    }

    #[test]
    fn sorting() {
        let mut rows = vec![
            row(20, 0, 500, 0),
            row(10, 1, 1000, 1),
            row(10, 0, 300, 0),
            row(30, 0, 500, 2),
        ];
        sort_rows(&mut rows, SortBy::Used, false);
        assert_eq!(order(&rows), [(10, 1), (20, 0), (30, 0), (10, 0)]);
        sort_rows(&mut rows, SortBy::Used, true);
        assert_eq!(order(&rows), [(10, 0), (30, 0), (20, 0), (10, 1)]);
        sort_rows(&mut rows, SortBy::Pid, false);
        assert_eq!(order(&rows), [(10, 0), (10, 1), (20, 0), (30, 0)]);
        sort_rows(&mut rows, SortBy::Gpu, false);
        assert_eq!(order(&rows), [(10, 0), (20, 0), (30, 0), (10, 1)]);
        sort_rows(&mut rows, SortBy::Refusals, false);
        assert_eq!(order(&rows), [(30, 0), (10, 1), (10, 0), (20, 0)]);
        sort_rows(&mut rows, SortBy::Gpu, true);
        assert_eq!(order(&rows), [(10, 1), (30, 0), (20, 0), (10, 0)]);
    }

    #[test]
    fn bars() {
        assert_eq!(bar_cells(10, 100, &[30, 20, 0]), [3, 2, 0]);
        // A small non-zero part still shows; the total never passes the width.
        assert_eq!(bar_cells(10, 1000, &[1, 0, 1]), [1, 0, 1]);
        assert_eq!(bar_cells(10, 100, &[100, 50, 50]), [10, 0, 0]);
        assert_eq!(bar_cells(4, 0, &[0]), [0]);
        assert_eq!(bar_cells(0, 10, &[5]), [0]);
        let s = SlotSnapshot {
            limit: Some(100),
            used: 50,
            peak: 50,
            cached: 10,
            spilled: 50,
            ..SlotSnapshot::default()
        };
        // Scale widens to used + spilled = 100: 4 used, 1 cached, 5 spilled.
        let text: String = slot_bar(10, &s)
            .spans
            .iter()
            .map(|s| s.content.as_ref())
            .collect();
        assert_eq!(text, "████▓▒▒▒▒▒");
        let uncapped = SlotSnapshot {
            limit: None,
            used: 25,
            peak: 100,
            ..SlotSnapshot::default()
        };
        let text: String = slot_bar(8, &uncapped)
            .spans
            .iter()
            .map(|s| s.content.as_ref())
            .collect();
        assert_eq!(text, "██······");
    }

    #[test]
    fn sparklines() {
        let mut h = History::default();
        assert_eq!(h.sparkline(5, 8), "     ");
        for v in [0, 8, 4, 1] {
            h.push(v);
        }
        // Wide enough for one sample per character (HISTORY / 120 = 1).
        assert_eq!(h.sparkline(120, 8).trim_start(), "█▄▁");
        assert_eq!(h.sparkline(120, 8).chars().count(), 120);
        // 10 characters: 12 samples each, the four fall in one run.
        assert_eq!(h.sparkline(10, 8), "         █");
        for _ in 0..500 {
            h.push(2);
        }
        assert_eq!(h.samples.len(), HISTORY);
        assert_eq!(h.sparkline(10, 8), "▂".repeat(10));
        h.push(100);
        assert_eq!(h.sparkline(10, 8).chars().last(), Some('█'));
        assert_eq!(h.sparkline(0, 8), "");
    }

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
    }

    #[test]
    fn commands_are_shortened_and_carry_the_pod() {
        assert_eq!(
            shown_command(
                "/opt/torch/.venv/bin/python3 /work/train.py --out /tmp/",
                "",
                ""
            ),
            "python3 train.py --out /tmp/"
        );
        assert_eq!(shown_command("./a.out x/y", "", ""), "./a.out x/y");
        assert_eq!(
            shown_command("/usr/bin/python3 t.py", "trainer-0", "main"),
            "trainer-0/main: python3 t.py"
        );
        assert_eq!(shown_command("a\x1b[2Jb", "p", ""), "p: a?[2Jb");
    }

    #[test]
    fn interval_message_names_the_option() {
        assert!(parse_interval("0").unwrap_err().contains("--interval"));
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
    }
}
