//! `vramcap top`: the live view, driven in a pseudo-terminal by tmux, and
//! its plain-table fallback when standard output is not a terminal. Clients
//! stop at `wait` while the test looks at them; the screen is polled until
//! what is expected appears, with a deadline, never waited for blindly.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::*;

const DEADLINE: Duration = Duration::from_secs(30);

fn held_client(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Held {
    let env = [&[("VRAMCAP_LIMIT", "1GiB")], env].concat();
    held_in(dir, &env, args)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A tmux server of this test alone (its own socket), killed when dropped,
/// whatever the test's outcome.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(name: &str, dir: &Path, width: u16, height: u16, command: &str) -> Tmux {
        let found = Command::new("sh")
            .args(["-c", "command -v tmux"])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "tmux is needed to drive `vramcap top` in a terminal and is not installed: \
             install it (apt-get install tmux; scripts/test.sh does so when run as root)"
        );
        let tmux = Tmux {
            socket: format!("vramcap-top-{}-{name}", std::process::id()),
        };
        // No user configuration; keep a dead pane on screen to look at.
        let conf = dir.join("tmux.conf");
        std::fs::write(
            &conf,
            "set -g remain-on-exit on\nset -g status off\nset -g default-shell /bin/sh\n",
        )
        .unwrap();
        let mut cmd = tmux.command();
        cmd.arg("-f").arg(&conf).args([
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            command,
        ]);
        run(cmd).ok_lines();
        tmux
    }

    /// `tmux -L SOCKET`, with the clean environment of the other tests (the
    /// server and the pane's command inherit it).
    fn command(&self) -> Command {
        let mut cmd = bare(Path::new("tmux"));
        cmd.env_remove("TMUX").args(["-u", "-L", &self.socket]);
        cmd
    }

    fn tmux(&self, args: &[&str]) -> String {
        let mut cmd = self.command();
        cmd.args(args);
        run(cmd).ok_lines().join("\n")
    }

    /// The screen's lines; `escapes` keeps colours and attributes.
    fn screen(&self, escapes: bool) -> Vec<String> {
        let mut args = vec!["capture-pane", "-p", "-t", "top"];
        if escapes {
            args.push("-e");
        }
        self.tmux(&args).lines().map(str::to_string).collect()
    }

    fn format(&self, format: &str) -> String {
        self.tmux(&["display-message", "-p", "-t", "top", format])
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", "top", keys]);
    }

    /// Polls until `check` accepts the screen; panics with the last screen
    /// at the deadline.
    fn until<T>(&self, what: &str, mut check: impl FnMut(&[String]) -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            let screen = self.screen(false);
            if let Some(t) = check(&screen) {
                return t;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the screen never showed {what}; it shows:\n{}",
                screen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").output();
    }
}

/// The (gpu, pid) of every process row on the screen, top to bottom.
fn row_order(screen: &[String], pids: &[u32]) -> Vec<(u32, u32)> {
    screen
        .iter()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            let gpu = t.next()?.parse().ok()?;
            let pid = t.next()?.parse().ok()?;
            pids.contains(&pid).then_some((gpu, pid))
        })
        .collect()
}

fn row(screen: &[String], gpu: u32, pid: u32) -> Option<&String> {
    screen.iter().find(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        t.len() > 2 && t[0] == gpu.to_string() && t[1] == pid.to_string()
    })
}

/// A line of `capture-pane -e` without its SGR sequences.
fn strip_escapes(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn bar_cells(line: &str) -> usize {
    line.chars().filter(|c| "█▓▒·".contains(*c)).count()
}

fn cli_path() -> PathBuf {
    artefacts().cli.clone()
}

#[test]
fn the_live_view_shows_rows_sorts_redraws_on_resize_and_restores_the_terminal() {
    // Named by hand, short: the path shows in the 120-column title line.
    let dir = fresh_dir("top-live");
    let a = held_client(
        &dir,
        &[],
        &[
            "init", "alloc", "300M", "ctx", "1", "alloc", "1G", "alloc", "1G", "wait",
        ],
    );
    let b = held_client(
        &dir,
        &[("VRAMCAP_GROUP", "train")],
        &["init", "alloc", "500M", "wait"],
    );
    let (pa, pb) = (a.pid(), b.pid());
    let pids = [pa, pb];

    // After top: its status, whether the tty is back in cooked mode, then a
    // pause, so the pane stays alive to be looked at. The interval is long,
    // so every redraw after the first is one a key or the resize caused
    // (refreshes on time are checked below, in the next test).
    let command = format!(
        "env VRAMCAP_STATS_DIR={} {} top --interval 120; \
         echo \"top exited: $?\"; \
         stty -a | tr -s ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo; \
         read line; echo \"read: $?\" > {}",
        shell_quote(&dir.display().to_string()),
        shell_quote(&cli_path().display().to_string()),
        shell_quote(&dir.join("pane-end").display().to_string()),
    );
    let tmux = Tmux::start("live", &dir, 120, 30, &command);

    // Exact bytes and limit; sorted by used bytes, largest first. The key
    // line is drawn last: with it on screen the frame is complete.
    let screen = tmux.until("both processes' rows", |s| {
        let r = row(s, 0, pa)?;
        (s.last()?.starts_with("q quit")
            && r.contains("300 MiB")
            && r.contains("1.00 GiB")
            && r.contains("29.3%")
            && row_order(s, &pids) == [(1, pa), (0, pb), (0, pa)])
        .then(|| s.to_vec())
    });
    assert!(screen[0].starts_with("vramcap top  "), "{screen:#?}");
    assert!(screen[0].contains("2 processes"), "{screen:#?}");
    assert!(
        screen[0].contains(&dir.display().to_string()),
        "{screen:#?}"
    );
    let header: Vec<&str> = screen[1].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "GPU", "PID", "MEMORY", "USED▼", "LIMIT", "%", "OOM", "HISTORY", "COMMAND"
        ]
    );
    let a0 = row(&screen, 0, pa).unwrap();
    let t: Vec<&str> = a0.split_whitespace().collect();
    // GPU PID BAR USED(2) LIMIT(2) % OOM HISTORY COMMAND…
    assert_eq!(t[3..9], ["300", "MiB", "1.00", "GiB", "29.3%", "0"], "{a0}");
    // 300 MiB of 1 GiB: 6 of the bar's 22 cells; the sparkline at 2/7.
    assert_eq!(t[2], format!("{}{}", "█".repeat(6), "·".repeat(16)), "{a0}");
    assert!(t[9].chars().all(|c| c == '▃'), "{a0}");
    // The command, its path cut to the program's name.
    assert_eq!(
        t[10..],
        ["client", "procaddr", "init", "alloc", "300M"],
        "{a0}"
    );
    let a1 = row(&screen, 1, pa).unwrap();
    let t: Vec<&str> = a1.split_whitespace().collect();
    assert_eq!(
        t[3..9],
        ["1.00", "GiB", "1.00", "GiB", "100.0%", "1"],
        "{a1}"
    );
    let b0 = row(&screen, 0, pb).unwrap();
    assert!(b0.contains("500 MiB") && b0.contains("48.8%"), "{b0}");
    // The group, with its budget and member.
    let group = screen
        .iter()
        .find(|l| l.starts_with("train "))
        .unwrap_or_else(|| panic!("no group row: {screen:#?}"));
    let t: Vec<&str> = group.split_whitespace().collect();
    assert_eq!(t[1], "GPU-5ca1ab1e-0000-4000-8000-000000000000", "{group}");
    assert_eq!(
        t[3..],
        ["500", "MiB", "1.00", "GiB", "1:", &pb.to_string()],
        "{group}"
    );
    assert!(screen[29].starts_with("q quit"), "{screen:#?}");

    // Refusals in red (bold, colour 1); none, no red.
    let coloured = tmux.screen(true);
    let plain: Vec<String> = coloured.iter().map(|l| strip_escapes(l)).collect();
    let find = |gpu: u32| {
        let at = plain
            .iter()
            .position(|l| row(std::slice::from_ref(l), gpu, pa).is_some())
            .unwrap_or_else(|| panic!("no row {gpu}/{pa}: {coloured:#?}"));
        &coloured[at]
    };
    let red = |l: &str| l.contains("38;5;1m") || l.contains("[31m") || l.contains(";31m");
    assert!(red(find(1)), "{:?}", find(1));
    assert!(!red(find(0)), "{:?}", find(0));

    // Sorting.
    let mut by_pid = vec![(0, pa), (1, pa), (0, pb)];
    by_pid.sort_by_key(|&(g, p)| (p, g));
    tmux.keys("p");
    tmux.until("rows by pid", |s| {
        (row_order(s, &pids) == by_pid).then_some(())
    });
    tmux.keys("r");
    let mut reversed = by_pid.clone();
    reversed.reverse();
    tmux.until("rows by pid, reversed", |s| {
        (row_order(s, &pids) == reversed && s[1].contains("PID▼")).then_some(())
    });
    tmux.keys("g");
    let (lo, hi) = (pa.min(pb), pa.max(pb));
    tmux.until("rows by gpu", |s| {
        (row_order(s, &pids) == [(0, lo), (0, hi), (1, pa)] && s[1].contains("GPU▲")).then_some(())
    });
    tmux.keys("o");
    let mut by_oom = vec![(0, pa), (0, pb)];
    by_oom.sort_by_key(|&(g, p)| (p, g));
    by_oom.insert(0, (1, pa));
    tmux.until("rows by refusals", |s| {
        (row_order(s, &pids) == by_oom).then_some(())
    });
    tmux.keys("u");
    tmux.until("rows by used bytes again", |s| {
        (row_order(s, &pids) == [(1, pa), (0, pb), (0, pa)]).then_some(())
    });

    // A smaller window: redrawn to its size (title on the first line, keys
    // on the last, a narrower bar), the row intact.
    tmux.tmux(&["resize-window", "-t", "top", "-x", "100", "-y", "25"]);
    assert_eq!(tmux.format("#{pane_width}x#{pane_height}"), "100x25");
    tmux.until("the view redrawn at 100x25", |s| {
        let r = row(s, 0, pa)?;
        (s.len() == 25
            && s[0].starts_with("vramcap top  ")
            && s[24].starts_with("q quit")
            && r.contains("300 MiB")
            && r.contains("1.00 GiB")
            && bar_cells(r) < 22
            && bar_cells(r) > 0
            && s.iter().all(|l| l.chars().count() <= 100))
        .then_some(())
    });

    // q: top ends with status 0, the alternate screen is left, the tty is
    // back in cooked mode, the cursor shows.
    tmux.keys("q");
    tmux.until("top's exit", |s| {
        s.iter().any(|l| l == "top exited: 0").then_some(())
    });
    let after = tmux.until("the terminal modes", |s| {
        (s.iter().any(|l| l == "icanon") && s.iter().any(|l| l == "echo")).then(|| s.to_vec())
    });
    assert!(
        !after
            .iter()
            .any(|l| l.contains("vramcap top") || l.contains("HISTORY") || l.contains("q quit")),
        "the view is still on screen: {after:#?}"
    );
    assert!(
        !after.iter().any(|l| l == "-icanon" || l == "-echo"),
        "{after:#?}"
    );
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
    // The pane's own command reads the line and ends. (Its status is told
    // by the command itself: tmux 3.3a can mark a pane dead before it has
    // reaped the child, and then never shows `pane_dead_status`.)
    tmux.keys("Enter");
    let end = dir.join("pane-end");
    let start = Instant::now();
    while std::fs::read_to_string(&end).ok().as_deref() != Some("read: 0\n") {
        assert!(
            start.elapsed() < DEADLINE,
            "the pane's command never read its line: {:?}; it shows:\n{}",
            std::fs::read_to_string(&end),
            tmux.screen(false).join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(tmux);

    for h in [a, b] {
        let (_, out) = h.finish();
        assert!(out.status.success());
    }
}

#[test]
fn it_refreshes_on_time_and_escape_ctrl_c_sigterm_and_count_end_it_with_the_terminal_restored() {
    // Named by hand, short: the path shows whole in the pane's lines.
    let dir = fresh_dir("top-keys");
    let h = held_client(&dir, &[], &["init", "alloc", "1M", "wait"]);
    let pid = h.pid();
    let pidfile = dir.join("top.pid");
    // `exec` so the pane's shell is replaced by top and $$ is top's pid.
    let command = |first: &str| {
        format!(
            "sh -c 'echo $$ > \"{pidfile}\"; exec env VRAMCAP_STATS_DIR=\"{dir}\" \"{cli}\" top --interval 0.2'; \
             echo \"{first} exited: $?\"; stty -a | tr -s ' ;' '\\n\\n' | grep -x -e icanon -e -icanon; read line",
            pidfile = pidfile.display(),
            dir = dir.display(),
            cli = cli_path().display(),
        )
    };

    let tmux = Tmux::start("esc", &dir, 100, 20, &command("esc"));
    tmux.until("the row", |s| {
        (row(s, 0, pid)?.contains("1.00 MiB") && s[0].contains(" 1 process ")).then_some(())
    });
    // The process ends: a refresh takes its row away.
    let (_, out) = h.finish();
    assert!(out.status.success());
    let gone = format!("(no processes under vramcap in {})", dir.display());
    tmux.until("no process", |s| {
        (row(s, 0, pid).is_none()
            && s[0].contains(" 0 processes ")
            && s.iter().any(|l| l.trim_end() == gone))
        .then_some(())
    });
    tmux.keys("Escape");
    tmux.until("top's exit on Escape", |s| {
        (s.iter().any(|l| l == "esc exited: 0") && s.iter().any(|l| l == "icanon")).then_some(())
    });
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
    drop(tmux);

    let tmux = Tmux::start("ctrlc", &dir, 100, 20, &command("ctrl-c"));
    tmux.until("the view", |s| {
        s[0].starts_with("vramcap top").then_some(())
    });
    tmux.keys("C-c");
    tmux.until("top's exit on Ctrl-C", |s| {
        (s.iter().any(|l| l == "ctrl-c exited: 0") && s.iter().any(|l| l == "icanon")).then_some(())
    });
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
    drop(tmux);

    let _ = std::fs::remove_file(&pidfile);
    let tmux = Tmux::start("term", &dir, 100, 20, &command("term"));
    tmux.until("the view", |s| {
        s[0].starts_with("vramcap top").then_some(())
    });
    let top_pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signalling the top this test started.
    assert_eq!(unsafe { libc::kill(top_pid, libc::SIGTERM) }, 0);
    tmux.until("top's exit on SIGTERM", |s| {
        (s.iter().any(|l| l == "term exited: 143") && s.iter().any(|l| l == "icanon")).then_some(())
    });
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
    drop(tmux);

    // --count ends the view by itself.
    let tmux = Tmux::start(
        "count",
        &dir,
        100,
        20,
        &format!(
            "{} top --count 3 --interval 0.05; echo \"count exited: $?\"; read line",
            shell_quote(&cli_path().display().to_string())
        ),
    );
    tmux.until("top's exit after 3 refreshes", |s| {
        s.iter().any(|l| l == "count exited: 0").then_some(())
    });
    assert_eq!(tmux.format("#{alternate_on} #{cursor_flag}"), "0 1");
}

#[test]
fn without_a_terminal_it_prints_the_stat_table_each_refresh() {
    let dir = scratch_dir();
    let h = held_client(&dir, &[], &["init", "alloc", "300M", "wait"]);
    let pid = h.pid();
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .args(["top", "--count", "2", "--interval", "0.1"]);
    let lines = run(cmd).ok_lines();
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let header =
        words("GPU PID LIMIT USED PEAK CACHED POOLS GRAPHS CONTEXT SPILLED %LIMIT OOM COMMAND");
    let row = words(&format!(
        "0 {pid} 1.00 GiB 300 MiB 300 MiB 0 B 0 B 0 B 0 B 0 B 29.3% 0 {} procaddr init alloc 300M wait",
        artefacts().client.display()
    ));
    assert_eq!(lines.len(), 6, "{lines:#?}");
    for table in lines.chunks(3) {
        // Each refresh starts with its time (RFC 3339, UTC).
        assert!(
            table[0].starts_with("# 20") && table[0].ends_with('Z'),
            "{lines:#?}"
        );
        assert_eq!(words(&table[1]), header, "{lines:#?}");
        assert_eq!(words(&table[2]), row, "{lines:#?}");
    }
    // No escape sequences, no screen clearing.
    assert!(!lines.iter().any(|l| l.contains('\x1b')), "{lines:#?}");

    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &dir)
        .args(["top", "--count", "1"]);
    assert_eq!(run(cmd).ok_lines().len(), 3);
    // --once (as nvitop's): the table once, no time line; -i filters GPUs.
    let top = |args: &[&str]| {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", &dir).arg("top").args(args);
        run(cmd).ok_lines()
    };
    let once = top(&["--once"]);
    assert_eq!(once.len(), 2, "{once:#?}");
    assert_eq!(words(&once[0]), header);
    assert_eq!(words(&once[1]), row);
    assert_eq!(top(&["--once", "-i", "0"]), once);
    assert_eq!(top(&["--once", "--gpu", "GPU-5ca1ab1e"]), once);
    assert_eq!(
        top(&["--once", "-i", "1"]),
        [
            "GPU  PID  LIMIT  USED  PEAK  CACHED  POOLS  GRAPHS  CONTEXT  SPILLED  %LIMIT  OOM  COMMAND"
                .to_string(),
            format!("(no processes under vramcap in {})", dir.display())
        ]
    );
    h.finish();
}

#[test]
fn a_bad_interval_or_count_is_refused() {
    for args in [
        &["top", "--interval", "0"][..],
        &["top", "--interval", "soon"],
        &["top", "--count", "0"],
        &["top", "--once", "--count", "2"],
        &["top", "-i", "gpu0"],
    ] {
        let mut cmd = bare(&artefacts().cli);
        cmd.args(args);
        let ran = run(cmd);
        ran.expect_code(2);
        if args[1] == "--interval" {
            assert!(ran.stderr().contains("--interval 0.5"), "{}", ran.stderr());
        }
    }
}

/// A page whose command and group hold a window-title change, a screen
/// clear and a bell, in the live view: shown escaped, the pane's title
/// untouched, nothing cleared.
#[test]
fn escape_sequences_in_a_page_never_reach_the_terminal() {
    use crate::readers::{Forge, forge};
    let dir = scratch_dir();
    let page = forge(&dir, &Forge::hostile(970_001, b"", b"\x1b]2;pod\x07", b""));
    let command = format!(
        "env VRAMCAP_STATS_DIR={} {} top --interval 120; read line",
        shell_quote(&dir.display().to_string()),
        shell_quote(&cli_path().display().to_string()),
    );
    let tmux = Tmux::start("hostile", &dir, 250, 12, &command);
    let title = tmux.format("#{pane_title}");
    let screen = tmux.until("the forged row", |s| {
        (s.last()?.starts_with("q quit") && row(s, 0, 970_001).is_some()).then(|| s.to_vec())
    });
    let r = row(&screen, 0, 970_001).unwrap();
    assert!(
        r.ends_with(
            "\\x1b]2;pod\\x07: python \\x1b]0;owned\\x07 \\x1b[2J\\x1b[H\\xff\\xfe evil\\u202eyx"
        ),
        "{r}"
    );
    assert!(
        screen[0].starts_with("vramcap top  "),
        "nothing cleared: {screen:#?}"
    );
    assert_eq!(
        tmux.format("#{pane_title}"),
        title,
        "the title was not changed"
    );
    assert_ne!(title, "owned");
    drop(page);
}

/// When its terminal goes away (the tmux server killed: the tty hangs up
/// and reads end-of-file for ever), the live view ends instead of spinning
/// on the dead terminal (it used to read end-of-file at full speed until
/// killed).
#[test]
fn the_live_view_ends_when_its_terminal_goes_away() {
    let dir = scratch_dir();
    let pidfile = dir.join("top.pid");
    let command = format!(
        "echo $$ > {}; exec env VRAMCAP_STATS_DIR={} {} top --interval 120",
        shell_quote(&pidfile.display().to_string()),
        shell_quote(&dir.display().to_string()),
        shell_quote(&cli_path().display().to_string()),
    );
    let tmux = Tmux::start("hangup", &dir, 100, 12, &command);
    tmux.until("the live view", |s| {
        s.last()?.starts_with("q quit").then_some(())
    });
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .expect("the pane wrote its pid")
        .trim()
        .parse()
        .expect("a pid");
    drop(tmux);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    // A zombie of an exited process still has /proc/PID; its state says so.
    let running = || {
        std::fs::read_to_string(proc_dir.join("stat"))
            .ok()
            .and_then(|s| s.rsplit(") ").next().map(|r| !r.starts_with('Z')))
            .unwrap_or(false)
    };
    while running() && Instant::now() < deadline {
        std::thread::yield_now();
    }
    let still = running();
    if still {
        // SAFETY: signalling the process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(
        !still,
        "vramcap top ({pid}) still runs after its terminal went away"
    );
}
