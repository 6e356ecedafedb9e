//! Helpers for the integration tests: build the shim and the CLI once per
//! run (the stand-in driver and the clients come ready from build.rs), then
//! run each case in a fresh process with a clean environment and print
//! everything when it fails.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;

pub struct Artefacts {
    pub shim: PathBuf,
    pub standin_lib: PathBuf,
    pub client: PathBuf,
    pub client_linked: PathBuf,
    pub cudarc_client: PathBuf,
    pub cli: PathBuf,
}

/// The workspace's root (this package is its `tests/` folder).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies inside the workspace")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn run_checked(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds everything the tests run, once per run.
pub fn artefacts() -> &'static Artefacts {
    static A: OnceLock<Artefacts> = OnceLock::new();
    A.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        run_checked(Command::new(cargo).current_dir(root()).args([
            "build",
            "--quiet",
            "-p",
            "vramcap-shim",
            "-p",
            "vramcap",
            "-p",
            "cudarc-client",
        ]));
        let standin = PathBuf::from(env!("STANDIN_DIR"));
        let debug = target_dir().join("debug");
        Artefacts {
            shim: debug.join("libvramcap.so"),
            standin_lib: standin.join("lib"),
            client: standin.join("bin/client"),
            client_linked: standin.join("bin/client-linked"),
            cudarc_client: debug.join("cudarc-client"),
            cli: debug.join("vramcap"),
        }
    })
}

/// A command with an environment that holds nothing of the caller's
/// `VRAMCAP_*`, `STANDIN_*`, `LD_PRELOAD` or Kubernetes identity variables,
/// and finds the stand-in driver (and its `nvidia-smi` first on `PATH`).
pub fn bare(program: &Path) -> Command {
    let a = artefacts();
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        // The Kubernetes identity variables end up in pages and labels.
        let identity = [
            "POD_NAME",
            "KUBERNETES_POD_NAME",
            "POD_NAMESPACE",
            "CONTAINER_NAME",
        ];
        if k.starts_with("VRAMCAP_")
            || k.starts_with("STANDIN_")
            || k == "LD_PRELOAD"
            || identity.contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("LD_LIBRARY_PATH", &a.standin_lib);
    // The stand-in's nvidia-smi (what a resume asks for free memory).
    let bin = a.standin_lib.with_file_name("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin];
    dirs.extend(std::env::split_paths(&path));
    cmd.env(
        "PATH",
        std::env::join_paths(dirs).expect("PATH entries without ':'"),
    );
    // Pages of tests that do not look at them stay out of /dev/shm.
    cmd.env("VRAMCAP_STATS_DIR", target_dir().join("test-pages"));
    cmd
}

/// A fresh, empty directory `target/test-dirs/<name>`; tests take theirs
/// from [`scratch_dir`], which names it after them. For what several tests
/// share (built once).
pub fn fresh_dir(name: &str) -> PathBuf {
    let d = target_dir().join("test-dirs").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create test dir");
    d
}

/// The running test's path (`group::sixty_four_processes_join_at_once`),
/// which libtest gives the thread it runs the test on. Panics on another
/// thread, where no test's name is known.
pub fn test_name() -> String {
    let t = std::thread::current();
    match t.name() {
        Some(n) if n != "main" => n.to_string(),
        other => panic!(
            "the test's scratch directory is named after the thread libtest runs it on; \
             this thread is {other:?}: take it on the test's own thread"
        ),
    }
}

/// A fresh, empty directory for the running test, named after it:
/// `target/test-dirs/group.sixty_four_processes_join_at_once`. Taken again
/// by the same test, it is emptied again.
pub fn scratch_dir() -> PathBuf {
    fresh_dir(&test_name().replace("::", "."))
}

/// A second fresh directory of the running test, `<its name>-<part>`.
pub fn scratch_dir_named(part: &str) -> PathBuf {
    fresh_dir(&format!("{}-{part}", test_name().replace("::", ".")))
}

/// Whether the tests run as root (some need other uids, chown or a mount
/// namespace of their own).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The first line of a test marked `#[ignore = "needs root"]`: fails, rather
/// than passes, when it is run as another user (scripts/test.sh includes
/// ignored tests only when it runs as root).
pub fn needs_root() {
    assert!(
        is_root(),
        "this test needs root (other uids, chown, a mount namespace); \
         as another user, leave out --include-ignored and it is reported ignored"
    );
}

/// Kills `pid` unless `done` is sent within a minute: a call that never
/// comes back fails the test instead of hanging it.
pub fn watchdog(pid: u32) -> std::sync::mpsc::Sender<()> {
    let (done, watch) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watch
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_err()
        {
            // SAFETY: kill of our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    done
}

/// A running client that stops at `wait` until told to go on: lets a test
/// look at a process while it holds memory, with no sleeps.
pub struct Held {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub lines: Vec<String>,
}

/// Runs `cmd`, which must exit with status 1 (as `doctor` does on a
/// problem): its stdout.
pub fn stdout_of_failure(cmd: Command) -> String {
    let ran = run(cmd);
    ran.expect_code(1);
    ran.stdout()
}

/// Starts `cmd` with its stdin, stdout and stderr piped.
pub fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

impl Held {
    pub fn spawn(mut cmd: Command) -> Held {
        let mut child = spawn_piped(&mut cmd);
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Held {
            child,
            stdin,
            stdout,
            lines: Vec::new(),
        }
    }

    /// Starts `cmd` and reads its stdout up to its first `wait`, where it
    /// holds what it allocated until told to go on.
    pub fn at_wait(cmd: Command) -> Held {
        let mut h = Held::spawn(cmd);
        h.until("wait");
        h
    }

    /// Reads stdout until the line `want` (panics at end of output).
    pub fn until(&mut self, want: &str) {
        loop {
            let mut l = String::new();
            let n = self.stdout.read_line(&mut l).expect("read child stdout");
            if n == 0 {
                // Its stdout is closed: it ended. Its stderr is read on a
                // thread of its own, for at most 5 s, in case a child of
                // its own still holds it open.
                let err = self.child.stderr.take().map_or_else(String::new, |mut e| {
                    let (tx, rx) = std::sync::mpsc::channel();
                    std::thread::spawn(move || {
                        let mut err = String::new();
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                        let _ = tx.send(err);
                    });
                    rx.recv_timeout(std::time::Duration::from_secs(5))
                        .unwrap_or_else(|_| "(not read: still open after 5 s)".into())
                });
                panic!(
                    "child ended before {want:?}; it printed {:?}, and on stderr:\n{err}",
                    self.lines
                );
            }
            let l = l.trim_end().to_string();
            self.lines.push(l.clone());
            if l == want {
                return;
            }
        }
    }

    /// Lets the child go on past one `wait`.
    pub fn resume(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(b"\n").and_then(|_| s.flush());
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child; returns the rest of stdout's lines and the output.
    pub fn finish(mut self) -> (Vec<String>, Output) {
        drop(self.stdin.take()); // end of input releases every later `wait`
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).expect("read child stdout");
        let out = self.child.wait_with_output().expect("wait for child");
        self.lines.extend(rest.lines().map(str::to_string));
        (self.lines, out)
    }
}

/// `bare`, with the shim preloaded.
pub fn shimmed(program: &Path) -> Command {
    let mut cmd = bare(program);
    cmd.env("LD_PRELOAD", &artefacts().shim);
    cmd
}

/// The test client under the shim: [`held_program_in`] with the client.
pub fn held_in(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Held {
    held_program_in(&artefacts().client, dir, env, args)
}

/// [`held_in`] reaching the driver by `method` (`linked`: the client
/// linked with -lcuda, whose calls the dynamic linker binds).
pub fn held_by_in(method: &str, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Held {
    let mut cmd = shimmed(client_program(method));
    cmd.env("VRAMCAP_STATS_DIR", dir)
        .envs(env.iter().copied())
        .arg(method)
        .args(args);
    Held::at_wait(cmd)
}

/// `program` (a test client) under the shim, reaching the driver through
/// `cuGetProcAddress` as the runtime does, publishing its page in `dir`,
/// with `env` added; running `args` up to its first `wait`, where it holds
/// what it allocated until told to go on.
pub fn held_program_in(program: &Path, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Held {
    let mut cmd = shimmed(program);
    cmd.env("VRAMCAP_STATS_DIR", dir)
        .envs(env.iter().copied())
        .arg("procaddr")
        .args(args);
    Held::at_wait(cmd)
}

pub struct Ran {
    pub what: String,
    pub out: Output,
}

impl Ran {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    pub fn code(&self) -> Option<i32> {
        self.out.status.code()
    }

    fn context(&self) -> String {
        format!(
            "\ncommand: {}\ncwd: {}\nstatus: {}\nstdout:\n{}\nstderr:\n{}",
            self.what,
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            self.out.status,
            self.stdout(),
            self.stderr()
        )
    }

    /// Asserts a zero exit and returns stdout's lines.
    pub fn ok_lines(&self) -> Vec<String> {
        assert!(
            self.out.status.success(),
            "unexpected failure{}",
            self.context()
        );
        self.stdout().lines().map(str::to_string).collect()
    }

    /// Asserts a zero exit and stdout equal to `want`, line by line.
    pub fn expect_lines(&self, want: &[&str]) {
        let got = self.ok_lines();
        assert_eq!(got, want, "stdout differs{}", self.context());
    }

    /// [`Ran::expect_lines`] with each size word of `want` (`40M`, `3G`)
    /// written in bytes first, as the stand-in prints sizes: see [`in_bytes`].
    pub fn expect_sized(&self, want: &[&str]) {
        let want: Vec<String> = want.iter().map(|line| in_bytes(line)).collect();
        self.expect_owned_lines(&want);
    }

    /// [`Ran::expect_lines`] for lines made at run time.
    pub fn expect_owned_lines(&self, want: &[String]) {
        let got = self.ok_lines();
        assert_eq!(got, want, "stdout differs{}", self.context());
    }

    pub fn expect_code(&self, code: i32) {
        assert_eq!(
            self.code(),
            Some(code),
            "unexpected exit status{}",
            self.context()
        );
    }
}

pub fn run(mut cmd: Command) -> Ran {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    Ran { what, out }
}

/// The test client that reaches the driver by `method` (`linked`: the one
/// linked with -lcuda; every other method loads the driver at run time).
fn client_program(method: &str) -> &'static Path {
    let a = artefacts();
    if method == "linked" {
        &a.client_linked
    } else {
        &a.client
    }
}

fn run_client(mut cmd: Command, method: &str, env: &[(&str, &str)], args: &[&str]) -> Ran {
    cmd.envs(env.iter().copied()).arg(method).args(args);
    run(cmd)
}

/// Runs the test client under the shim with `env` and `args`.
pub fn client(method: &str, env: &[(&str, &str)], args: &[&str]) -> Ran {
    run_client(shimmed(client_program(method)), method, env, args)
}

/// Runs the test client against the stand-in driver alone.
/// [`client`] under `VRAMCAP_LIMIT=limit` and no other setting.
pub fn capped(method: &str, limit: &str, args: &[&str]) -> Ran {
    client(method, &[("VRAMCAP_LIMIT", limit)], args)
}

pub fn client_bare(method: &str, env: &[(&str, &str)], args: &[&str]) -> Ran {
    run_client(bare(client_program(method)), method, env, args)
}

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// `line` with each size word in bytes: digits followed by `M` (MiB) or `G`
/// (GiB), with no letter or digit on either side, so `alloc 40M -> 0 #1`
/// becomes `alloc 41943040 -> 0 #1`. Everything else is kept as it is.
pub fn in_bytes(line: &str) -> String {
    let alnum = |c: Option<&u8>| c.is_some_and(u8::is_ascii_alphanumeric);
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len() + 16);
    let mut i = 0;
    while i < b.len() {
        let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        let unit = match b.get(i + digits) {
            Some(b'M') => MIB,
            Some(b'G') => GIB,
            _ => 0,
        };
        let alone =
            !alnum(i.checked_sub(1).and_then(|j| b.get(j))) && !alnum(b.get(i + digits + 1));
        if digits > 0 && unit > 0 && alone {
            let n: u64 = line[i..i + digits].parse().expect("only digits");
            out.push_str(&(n * unit).to_string());
            i += digits + 1;
        } else if digits > 0 {
            out.push_str(&line[i..i + digits]);
            i += digits;
        } else {
            let c = line[i..].chars().next().expect("i is below the length");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Device 0 of process `pid` as `vramcap stat --json` shows it, from `dir`.
pub fn stat_device0(dir: &Path, pid: u32) -> serde_json::Value {
    let mut cmd = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir)
        .args(["stat", "--json", "--pid", &pid.to_string()]);
    let j: serde_json::Value = serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap();
    j["processes"][0]["devices"][0].clone()
}
