//! Helpers the parking tests share (`park_basics`, `park_policy`,
//! `park_resume`, `park_exit`, `park_cli`, `park_calls`): parking
//! (`crates/shim/src/engine/park/`, docs/parking.md) is tested against the
//! stand-in's checkpoint model (`tests/standin/checkpoint_standin.c`), one
//! fresh process per case, through the CLI (`park`, `stat`) and the lines
//! the process says on its stderr.

use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::util::*;

pub const MANUAL: (&str, &str) = ("VRAMCAP_PARK", "manual");
pub const NO_CACHE: (&str, &str) = ("VRAMCAP_CACHE", "off");

/// `vramcap park --pid PID`.
pub fn park(dir: &Path, pid: u32) -> Ran {
    cli(dir, &["park", "--pid", &pid.to_string()])
}

/// `vramcap park --pid PID` exits 1 with `line` alone on stderr; the run,
/// for more checks.
pub fn park_refused(dir: &Path, pid: u32, line: &str) -> Ran {
    let ran = park(dir, pid);
    ran.expect_code(1);
    assert_eq!(ran.stderr(), format!("{line}\n"));
    ran
}

/// `vramcap park --pid` of `h` is refused with `why`: exit 1, nothing on
/// stdout, one line on stderr, and the same line on the process's stderr.
pub fn assert_refused(dir: &Path, h: &mut Held, why: &str) {
    let pid = h.pid();
    let ran = park_refused(dir, pid, &format!("vramcap: {pid}: cannot park: {why}"));
    assert_eq!(ran.stdout(), "");
    assert_eq!(
        stderr_until(h, "cannot park"),
        format!("vramcap[{pid}]: cannot park: {why}")
    );
}

/// `vramcap ARGS` reading the pages in `dir`.
pub fn cli(dir: &Path, args: &[&str]) -> Ran {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).args(args);
    run(cmd)
}

/// `vramcap stat --json`, parsed.
pub fn stat(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&cli(dir, &["stat", "--json"]).ok_lines().join("")).unwrap()
}

/// The group's bytes held on its first GPU, and each member's ledger.
pub fn group_used(dir: &Path) -> (u64, Vec<u64>) {
    let j = stat(dir);
    let g = &j["groups"][0];
    let members = g["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["held_bytes"][0].as_u64().unwrap())
        .collect();
    (g["devices"][0]["used_bytes"].as_u64().unwrap(), members)
}

/// Reads `h`'s stderr until a line containing `want`; returns the line.
pub fn stderr_until(h: &mut Held, want: &str) -> String {
    let err = h.child.stderr.as_mut().expect("piped stderr");
    let mut r = BufReader::new(err);
    loop {
        let mut l = String::new();
        assert!(
            r.read_line(&mut l).expect("read stderr") > 0,
            "stderr ended before {want:?}"
        );
        if l.contains(want) {
            return l.trim_end().to_string();
        }
    }
}

/// A client held at its `wait`s under the shim, killed if it runs past
/// the watchdog's minute.
pub struct Watched {
    pub h: Held,
    done: std::sync::mpsc::Sender<()>,
    pub pid: u32,
}

impl Watched {
    pub fn start(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Watched {
        Watched::start_by("procaddr", dir, env, args)
    }

    /// [`Watched::start`] reaching the driver by `method` ([`held_by_in`]).
    pub fn start_by(method: &str, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Watched {
        let h = held_by_in(method, dir, env, args);
        let pid = h.pid();
        Watched {
            done: watchdog(pid),
            h,
            pid,
        }
    }

    /// Every line, those after its input was closed too, and the output.
    pub fn end_all(self) -> (Vec<String>, std::process::Output) {
        let ended = self.h.finish();
        let _ = self.done.send(());
        ended
    }

    /// The lines read so far, and the output once its input is closed.
    pub fn end(self) -> (Vec<String>, std::process::Output) {
        let lines = self.h.lines.clone();
        let (_, out) = self.h.finish();
        let _ = self.done.send(());
        (lines, out)
    }
}

impl std::ops::Deref for Watched {
    type Target = Held;
    fn deref(&self) -> &Held {
        &self.h
    }
}

impl std::ops::DerefMut for Watched {
    fn deref_mut(&mut self) -> &mut Held {
        &mut self.h
    }
}
