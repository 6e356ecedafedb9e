//! Drawing the live view (see the module above for what it shows): the
//! title line, the process table with its bars and sparklines, the groups,
//! and the key line. Text from the pages (commands, group names, paths) is
//! printable already (the reader passed it through `vramcap_core::text`);
//! the view applies the same helper again to what it composes from it, so
//! nothing it draws can drive the terminal.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use vramcap_core::counters::SlotSnapshot;
use vramcap_core::human_bytes;
use vramcap_core::page::uuid_text;
use vramcap_core::text;

use super::model::{HISTORY, History, Model, SortBy};

const USED_GLYPH: char = '█';
const CACHED_GLYPH: char = '▓';
/// What the process holds beyond its allocations: the context's footprint
/// and graph memory (`VRAMCAP_COUNT=held`).
const CONTEXT_GLYPH: char = '░';
const SPILLED_GLYPH: char = '▒';
const FREE_GLYPH: char = '·';
const USED_COLOUR: Color = Color::Green;
const CACHED_COLOUR: Color = Color::Yellow;
const CONTEXT_COLOUR: Color = Color::Blue;
const SPILLED_COLOUR: Color = Color::Magenta;
const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// `h` in `width` characters, newest on the right, scaled to `scale`. When
/// it does not fit, each character is the highest of a fixed run of samples
/// (runs aligned to the absolute sample number, so characters do not shift
/// between runs), enough that the whole history fits.
pub fn sparkline(h: &History, width: usize, scale: u64) -> String {
    if width == 0 {
        return String::new();
    }
    let per = HISTORY.div_ceil(width).max(1) as u64;
    let mut buckets: Vec<u64> = Vec::new(); // newest first
    let mut current: Option<u64> = None;
    for (i, v) in h.indexed().rev() {
        let bucket = i / per;
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

/// The bar of one process row: the context and graph memory, in use,
/// cached, spilled, against the limit (the peak when uncapped), widened
/// when spilled bytes pass it.
fn slot_bar(width: usize, s: &SlotSnapshot) -> Line<'static> {
    let context = s.context.saturating_add(s.graphs).min(s.used);
    let cached = s.cached.min(s.used - context);
    let in_use = s.used - context - cached;
    let base = s.limit.unwrap_or(s.peak.max(s.used));
    let scale = base.max(s.used.saturating_add(s.spilled));
    bar(
        width,
        scale,
        &[
            (context, CONTEXT_GLYPH, CONTEXT_COLOUR),
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
/// What the command column starts with when a process is over its cap
/// (it was lowered below what the process holds) or above its soft limit.
fn state_mark(s: &SlotSnapshot) -> &'static str {
    if s.limit.is_some_and(|l| s.used > l) {
        "[over its cap] "
    } else if s.soft_limit.is_some_and(|l| s.used > l) {
        "[above its soft limit] "
    } else {
        ""
    }
}

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
    text::printable(&text).into_owned()
}

/// Draws the whole view of `m`.
pub fn draw(f: &mut Frame, m: &Model) {
    let area = f.area();
    let group_rows: usize = m.groups.iter().map(|g| g.devices.len().max(1)).sum();
    let group_height = if m.groups.is_empty() {
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
    f.render_widget(Paragraph::new(title_line(m)), title);
    draw_processes(m, f, table);
    if group_height > 0 {
        let [_, rest] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(groups);
        draw_groups(m, f, rest);
    }
    f.render_widget(Paragraph::new(footer_line()), footer);
}

fn title_line(m: &Model) -> Line<'static> {
    let plural = if m.processes == 1 { "" } else { "es" };
    let mut spans = vec![
        Span::styled("vramcap top", Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            "  {}  {} process{plural}  {}",
            m.time,
            m.processes,
            m.sources.describe()
        )),
    ];
    if m.skipped > 0 {
        let s = if m.skipped == 1 { "" } else { "s" };
        spans.push(Span::styled(
            format!("  {} file{s} skipped (vramcap stat says why)", m.skipped),
            Style::default().fg(Color::Yellow),
        ));
    }
    if let Some(e) = &m.error {
        spans.push(Span::styled(
            format!("  {e}"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    Line::from(spans)
}

/// The widest of `widths`, and at least `least`.
fn widest(widths: impl Iterator<Item = usize>, least: usize) -> usize {
    widths.max().unwrap_or(0).max(least)
}

fn draw_processes(m: &Model, f: &mut Frame, area: Rect) {
    let pid_w = widest(m.rows.iter().map(|r| r.pid.to_string().len()), 7);
    let oom_w = widest(m.rows.iter().map(|r| r.slot.refusals.to_string().len()), 4);
    // GPU (with room for the sort arrow), PID, USED, LIMIT, %, OOM and
    // the spaces between nine columns.
    let fixed = 4 + pid_w + 8 + 8 + 6 + oom_w + 8;
    let rest = (area.width as usize).saturating_sub(fixed);
    let bar_w = (rest * 3 / 10).clamp(8, 30);
    let hist_w = (rest * 3 / 10).min(30);
    let hist_w = if hist_w < 4 { 0 } else { hist_w };

    let arrow = |col: SortBy| -> &'static str {
        if col != m.sort {
            ""
        } else {
            let natural_down = matches!(col, SortBy::Used | SortBy::Refusals);
            if natural_down != m.reverse {
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

    let rows: Vec<Row> = m
        .rows
        .iter()
        .map(|r| {
            let s = &r.slot;
            let pct = s.limit.map(|l| s.used as f64 * 100.0 / l.max(1) as f64);
            let pct_cell = right(
                pct.map(|p| format!("{p:.1}%"))
                    .unwrap_or_else(|| "-".into()),
            );
            let over = s.limit.is_some_and(|l| s.used > l);
            let above_soft = s.soft_limit.is_some_and(|l| s.used > l);
            let pct_cell = if over {
                pct_cell.style(Style::default().fg(Color::Red).add_modifier(Modifier::BOLD))
            } else if pct.is_some_and(|p| p >= 90.0) || above_soft {
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
                let h = m.history.get(&r.key());
                let scale = s.limit.unwrap_or_else(|| h.map_or(0, History::max));
                let line = h.map(|h| sparkline(h, hist_w, scale)).unwrap_or_default();
                cells.push(Cell::from(Span::styled(
                    line,
                    Style::default().fg(Color::Cyan),
                )));
            }
            cells.push(Cell::from(format!(
                "{}{}",
                state_mark(s),
                shown_command(&r.command, &r.pod, &r.container)
            )));
            Row::new(cells)
        })
        .collect();
    let empty = rows.is_empty();
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::default().add_modifier(Modifier::REVERSED)))
        .column_spacing(1);
    f.render_widget(table, area);
    if empty && area.height > 1 {
        let text = match &m.error {
            Some(_) => String::new(),
            None => format!("(no processes under vramcap in {})", m.sources.describe()),
        };
        let at = Rect {
            y: area.y + 1,
            height: 1,
            ..area
        };
        f.render_widget(Paragraph::new(text), at);
    }
}

fn draw_groups(m: &Model, f: &mut Frame, area: Rect) {
    let name_w = widest(m.groups.iter().map(|g| g.name.chars().count()), 5);
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
    for g in &m.groups {
        let members = g.members_text(|n, pids| format!("{n}: {pids}"));
        if g.devices.is_empty() {
            rows.push(Row::new(vec![
                Cell::from(text::printable(&g.name).into_owned()),
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
                Cell::from(text::printable(&g.name).into_owned()),
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

fn footer_line() -> Line<'static> {
    let key = |k: &'static str| Span::styled(k, Style::default().add_modifier(Modifier::BOLD));
    let glyph = |g: char, c: Color| Span::styled(g.to_string(), Style::default().fg(c));
    let mut spans = Vec::new();
    for (k, what) in [
        ("q", " quit  "),
        ("u", " used  "),
        ("p", " pid  "),
        ("g", " gpu  "),
        ("o", " oom  "),
        ("r", " reverse   "),
    ] {
        spans.extend([key(k), Span::raw(what)]);
    }
    for (g, c, what) in [
        (CONTEXT_GLYPH, CONTEXT_COLOUR, " context "),
        (USED_GLYPH, USED_COLOUR, " used "),
        (CACHED_GLYPH, CACHED_COLOUR, " cached "),
        (SPILLED_GLYPH, SPILLED_COLOUR, " spilled"),
    ] {
        spans.extend([glyph(g, c), Span::raw(what)]);
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars() {
        assert_eq!(bar_cells(10, 100, &[30, 20, 0]), [3, 2, 0]);
        // A small non-zero part still shows; the total never passes the width.
        assert_eq!(bar_cells(10, 1000, &[1, 0, 1]), [1, 0, 1]);
        assert_eq!(bar_cells(10, 100, &[100, 50, 50]), [10, 0, 0]);
        assert_eq!(bar_cells(4, 0, &[0]), [0]);
        assert_eq!(bar_cells(0, 10, &[5]), [0]);
        // (limit, used, peak, cached, context, graphs, spilled), the width,
        // and the bar drawn.
        for ((limit, used, peak, cached, context, graphs, spilled), width, want) in [
            // Scale widens to used + spilled = 100: 4 used, 1 cached, 5 spilled.
            ((Some(100), 50, 50, 10, 0, 0, 50), 10, "████▓▒▒▒▒▒"),
            // The context and graph memory come first, out of what is used.
            ((Some(100), 100, 100, 10, 20, 10, 0), 10, "░░░██████▓"),
            ((None, 25, 100, 0, 0, 0, 0), 8, "██······"),
        ] {
            let s = SlotSnapshot {
                limit,
                used,
                peak,
                cached,
                context,
                graphs,
                spilled,
                ..SlotSnapshot::default()
            };
            let text: String = slot_bar(width, &s)
                .spans
                .iter()
                .map(|s| s.content.as_ref())
                .collect();
            assert_eq!(text, want, "{s:?}");
        }
    }

    #[test]
    fn sparklines() {
        let mut h = History::default();
        assert_eq!(sparkline(&h, 5, 8), "     ");
        for v in [0, 8, 4, 1] {
            h.push(v);
        }
        // Wide enough for one sample per character (HISTORY / 120 = 1).
        assert_eq!(sparkline(&h, 120, 8).trim_start(), "█▄▁");
        assert_eq!(sparkline(&h, 120, 8).chars().count(), 120);
        // 10 characters: 12 samples each, the four fall in one run.
        assert_eq!(sparkline(&h, 10, 8), "         █");
        for _ in 0..500 {
            h.push(2);
        }
        assert_eq!(h.len(), HISTORY);
        assert_eq!(sparkline(&h, 10, 8), "▂".repeat(10));
        h.push(100);
        assert_eq!(sparkline(&h, 10, 8).chars().last(), Some('█'));
        assert_eq!(sparkline(&h, 0, 8), "");
    }

    #[test]
    fn over_the_cap_and_above_the_soft_limit_are_marked() {
        let at = |limit, soft_limit, used| SlotSnapshot {
            limit,
            soft_limit,
            used,
            ..SlotSnapshot::default()
        };
        assert_eq!(state_mark(&at(Some(100), None, 100)), "");
        assert_eq!(state_mark(&at(Some(100), None, 101)), "[over its cap] ");
        assert_eq!(state_mark(&at(Some(100), Some(80), 80)), "");
        assert_eq!(
            state_mark(&at(Some(100), Some(80), 81)),
            "[above its soft limit] "
        );
        assert_eq!(state_mark(&at(Some(100), Some(80), 101)), "[over its cap] ");
        assert_eq!(state_mark(&at(None, None, u64::MAX)), "");
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
        assert_eq!(shown_command("a\x1b[2Jb", "p", ""), "p: a\\x1b[2Jb");
    }
}
