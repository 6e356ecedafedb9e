//! `vramcap kernel install|list|remove`: Jupyter kernelspecs whose kernels
//! start under the shim.
//!
//! A kernelspec is a folder `KERNELS/NAME/` holding `kernel.json`, whose
//! `argv` Jupyter runs to start a kernel. Ours is
//! `vramcap run --limit 8GiB -- PYTHON -m ipykernel_launcher -f {connection_file}`
//! (`run` execs, so the kernel is the Python process Jupyter signals), with
//! `metadata.vramcap` marking it as written here: `list` shows only those,
//! and `remove` and a second `install` touch only those.
//!
//! The folders are jupyter_core's: `JUPYTER_PATH`'s entries, the user's
//! (`JUPYTER_DATA_DIR`, else `$XDG_DATA_HOME/jupyter`, else
//! `~/.local/share/jupyter`), the environment's (`PREFIX/share/jupyter`,
//! the interpreter's `sys.prefix`), then `/usr/local/share/jupyter` and
//! `/usr/share/jupyter`; each with a `kernels` folder.

use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;
use vramcap_core::exe::{is_executable, on_path};
use vramcap_core::text;

/// The CLI's `kernel` actions.
#[derive(clap::Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once, from the command line
pub enum Action {
    /// Write a kernelspec whose kernels start under the shim: `vramcap kernel install --limit 8GiB`
    Install {
        #[command(flatten)]
        opts: crate::cli::run::ShimOptions,
        /// The kernel's name (letters, digits, `.`, `_`, `-`); default vramcap-LIMIT, e.g. vramcap-8gib
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// The name a notebook shows; default "Python 3 (vramcap 8 GiB)"
        #[arg(long, value_name = "TEXT")]
        display_name: Option<String>,
        /// The Python that runs the kernel (needs ipykernel); default the python beside this vramcap, else python3 on PATH
        #[arg(long, value_name = "PATH")]
        python: Option<PathBuf>,
        /// Into the user's Jupyter folder (the default): $JUPYTER_DATA_DIR, else ~/.local/share/jupyter
        #[arg(long, conflicts_with_all = ["sys_prefix", "prefix"])]
        user: bool,
        /// Into the Python environment's: sys.prefix/share/jupyter of --python
        #[arg(long, conflicts_with = "prefix")]
        sys_prefix: bool,
        /// Into PREFIX/share/jupyter
        #[arg(long, value_name = "PREFIX")]
        prefix: Option<PathBuf>,
    },
    /// List the kernels `vramcap kernel install` wrote, in Jupyter's search order
    List {
        /// Also look in PREFIX/share/jupyter
        #[arg(long, value_name = "PREFIX")]
        prefix: Option<PathBuf>,
    },
    /// Remove a kernel `vramcap kernel install` wrote (the first Jupyter finds)
    Remove {
        /// The kernel's name, as `vramcap kernel list` shows it
        #[arg(value_name = "NAME")]
        name: String,
        /// Also look in PREFIX/share/jupyter
        #[arg(long, value_name = "PREFIX")]
        prefix: Option<PathBuf>,
    },
}

/// Runs an action: Err (exit 2) for bad input, exit 1 when the files
/// cannot be written or removed.
pub fn run(action: Action) -> Result<ExitCode, String> {
    match action {
        Action::Install {
            opts,
            name,
            display_name,
            python,
            user: _,
            sys_prefix,
            prefix,
        } => install(&opts, name, display_name, python, sys_prefix, prefix),
        Action::List { prefix } => Ok(list(prefix.as_deref())),
        Action::Remove { name, prefix } => remove(&name, prefix.as_deref()),
    }
}

/// jupyter_core's `jupyter_data_dir()` on Linux.
fn user_data_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("JUPYTER_DATA_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Some(Path::new(&x).join("jupyter"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(".local/share/jupyter"))
}

/// The `kernels` folders Jupyter searches, first first (jupyter_core's
/// `jupyter_path("kernels")`, with this vramcap's prefix as the
/// environment's), then `extra`'s.
fn search_path(extra: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("JUPYTER_PATH") {
        dirs.extend(std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()));
    }
    dirs.extend(user_data_dir());
    if let Ok(exe) = std::env::current_exe()
        && let Some(prefix) = exe.parent().and_then(Path::parent)
    {
        dirs.push(prefix.join("share/jupyter"));
    }
    dirs.push("/usr/local/share/jupyter".into());
    dirs.push("/usr/share/jupyter".into());
    if let Some(p) = extra {
        dirs.push(p.join("share/jupyter"));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let k = d.join("kernels");
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// jupyter_client's rule for kernel names.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Whether `name` is one plain folder name in `kernels/` (not `.` or
/// `..`, which jupyter_client's rule lets through).
fn one_folder(name: &str) -> bool {
    matches!(
        Path::new(name).components().collect::<Vec<_>>()[..],
        [Component::Normal(_)]
    )
}

/// `vramcap-8gib` for `--limit 8GiB`, `vramcap-group-train` for `--group train`.
fn default_name(opts: &crate::cli::run::ShimOptions) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(l) = &opts.limit {
        parts.push(l.replace('%', "pct"));
    }
    if let Some(g) = &opts.group {
        parts.push(format!("group-{g}"));
    }
    let mut name = String::from("vramcap");
    for p in parts {
        name.push('-');
        for c in p.to_ascii_lowercase().chars() {
            let c = if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            };
            if !(c == '-' && name.ends_with('-')) {
                name.push(c);
            }
        }
    }
    name.trim_end_matches('-').to_string()
}

/// `8 GiB` for a whole number of a unit, else vramcap's usual rounding.
fn size_words(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1u64 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    vramcap_core::size::human_bytes(bytes)
}

/// "Python 3 (vramcap 8 GiB)", "Python 3 (vramcap 0=8GiB,1=4GiB, group train)".
fn default_display_name(opts: &crate::cli::run::ShimOptions) -> String {
    let mut what: Vec<String> = Vec::new();
    if let Some(l) = &opts.limit {
        what.push(match vramcap_core::size::parse_size(l) {
            Ok(b) => size_words(b),
            Err(_) => l.trim().to_string(),
        });
    }
    if let Some(g) = &opts.group {
        what.push(format!("group {g}"));
    }
    format!("Python 3 (vramcap {})", what.join(", "))
}

/// `--limit 8GiB --group g …`: the options as `vramcap run` takes them.
fn run_flags(opts: &crate::cli::run::ShimOptions) -> Vec<String> {
    let all = [
        ("--limit", &opts.limit),
        ("--log", &opts.log),
        ("--cache", &opts.cache),
        ("--cache-idle", &opts.cache_idle),
        ("--spill", &opts.spill),
        ("--spill-limit", &opts.spill_limit),
        ("--stats-dir", &opts.stats_dir),
        ("--group", &opts.group),
        ("--count", &opts.count),
        ("--context", &opts.context),
        ("--park", &opts.park),
    ];
    let mut out = Vec::new();
    for (flag, value) in all {
        if let Some(v) = value {
            out.push(format!("{flag}={v}"));
        }
    }
    out
}

/// The kernel's Python: `--python`, else the one beside this vramcap (the
/// wheel's environment), else python3 on PATH. Not resolved through links:
/// a virtual environment's python is a link that must stay itself.
fn find_python(given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        let p = if p.components().count() == 1 && !p.exists() {
            on_path(&p.to_string_lossy()).unwrap_or(p)
        } else {
            p
        };
        if !is_executable(&p) {
            return Err(format!(
                "--python {}: no such program; give the interpreter that has ipykernel, e.g. --python /opt/venv/bin/python",
                p.display()
            ));
        }
        return Ok(std::path::absolute(&p).unwrap_or(p));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        for n in ["python3", "python"] {
            if is_executable(&dir.join(n)) {
                return Ok(dir.join(n));
            }
        }
    }
    on_path("python3").or_else(|| on_path("python")).ok_or_else(|| {
        "no python3 beside this vramcap or on PATH; name the interpreter that has ipykernel, e.g. --python /opt/venv/bin/python".to_string()
    })
}

/// The interpreter's `sys.prefix`, after checking that it has ipykernel.
fn python_prefix(python: &Path) -> Result<PathBuf, String> {
    let out = std::process::Command::new(python)
        .args(["-c", "import sys, ipykernel; print(sys.prefix)"])
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = match err.lines().last().map(str::trim) {
            Some(l) if !l.is_empty() => l.to_string(),
            _ => out.status.to_string(),
        };
        return Err(format!(
            "{} cannot import ipykernel ({last}); install it there ({} -m pip install ipykernel) or name another interpreter, e.g. --python /opt/venv/bin/python",
            python.display(),
            python.display()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(PathBuf::from(text.trim()))
}

/// A kernelspec found on disk.
struct Found {
    name: String,
    dir: PathBuf,
    spec: serde_json::Value,
}

impl Found {
    fn ours(&self) -> bool {
        is_ours(&self.spec)
    }
}

/// Whether a kernelspec is one vramcap wrote: its `metadata.vramcap`.
fn is_ours(spec: &serde_json::Value) -> bool {
    spec.get("metadata")
        .and_then(|m| m.get("vramcap"))
        .is_some()
}

fn read_spec(dir: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("kernel.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Every kernelspec in the search path, in its order (names sorted within
/// a folder); a name may come more than once (Jupyter uses the first).
fn all_specs(extra: Option<&Path>) -> Vec<Found> {
    let mut out = Vec::new();
    for kernels in search_path(extra) {
        let Ok(entries) = std::fs::read_dir(&kernels) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let dir = kernels.join(&name);
            if let Some(spec) = read_spec(&dir) {
                out.push(Found {
                    name: name.to_ascii_lowercase(),
                    dir,
                    spec,
                });
            }
        }
    }
    out
}

fn install(
    opts: &crate::cli::run::ShimOptions,
    name: Option<String>,
    display_name: Option<String>,
    python: Option<PathBuf>,
    sys_prefix: bool,
    prefix: Option<PathBuf>,
) -> Result<ExitCode, String> {
    if opts.limit.is_none() && opts.group.is_none() {
        return Err(
            "kernel install needs the cap: --limit (or --group), e.g. vramcap kernel install --limit 8GiB"
                .into(),
        );
    }
    // Every value checked as `vramcap run` will check it when the kernel starts.
    crate::cli::run::shim_env(opts)?;
    let name = name.unwrap_or_else(|| default_name(opts));
    if !valid_name(&name) {
        return Err(format!(
            "kernel name {name:?}: a kernelspec name has only letters, digits, '.', '_' and '-', e.g. --name {}",
            default_name(opts)
        ));
    }
    if !one_folder(&name) {
        return Err(format!(
            "kernel name {name:?}: a kernelspec name is a folder of its own in kernels/, not \".\" or \"..\", e.g. --name {}",
            default_name(opts)
        ));
    }
    let name = name.to_ascii_lowercase();
    let python = find_python(python)?;
    let env_prefix = python_prefix(&python)?;
    let data = if let Some(p) = prefix {
        std::path::absolute(&p).unwrap_or(p).join("share/jupyter")
    } else if sys_prefix {
        env_prefix.join("share/jupyter")
    } else {
        user_data_dir().ok_or(
            "no user Jupyter folder: HOME, XDG_DATA_HOME and JUPYTER_DATA_DIR are unset; give one, e.g. --prefix /opt/venv",
        )?
    };
    let dir = data.join("kernels").join(&name);
    let file = dir.join("kernel.json");
    if let Some(why) = not_ours_to_replace(&dir) {
        return Err(format!(
            "a kernel named {name} is at {} and {why}; pick another name, e.g. --name {}",
            text::path(&dir),
            default_name(opts)
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this vramcap: {e}"))?;
    let mut argv = vec![exe.to_string_lossy().into_owned(), "run".into()];
    argv.extend(run_flags(opts));
    argv.extend([
        "--".into(),
        python.to_string_lossy().into_owned(),
        "-m".into(),
        "ipykernel_launcher".into(),
        "-f".into(),
        "{connection_file}".into(),
    ]);
    let display = display_name.unwrap_or_else(|| default_display_name(opts));
    let mut marker = serde_json::Map::new();
    for (flag, v) in run_flags(opts).iter().filter_map(|f| f.split_once('=')) {
        marker.insert(flag.trim_start_matches("--").to_string(), json!(v));
    }
    let spec = json!({
        "argv": argv,
        "display_name": display,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": { "debugger": true, "vramcap": marker },
    });
    let json = serde_json::to_string_pretty(&spec).expect("a JSON value always serialises") + "\n";
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| write_spec(&file, &json)) {
        eprintln!("vramcap: cannot write {}: {e}", text::path(&file));
        return Ok(ExitCode::from(1));
    }
    println!(
        "installed kernel {name} ({}) in {}",
        text::printable(&display),
        text::path(&dir)
    );
    Ok(ExitCode::SUCCESS)
}

/// Why the kernelspec in `dir` may not be replaced by `install`, or None
/// when it may: there is none, or its `kernel.json` is vramcap's. One that
/// cannot be read as JSON is not known to be vramcap's; a link or anything
/// but a regular file is not written through.
fn not_ours_to_replace(dir: &Path) -> Option<String> {
    let file = dir.join("kernel.json");
    match std::fs::symlink_metadata(&file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("its kernel.json cannot be read ({e})")),
        Ok(m) if m.file_type().is_symlink() => {
            return Some(
                "its kernel.json is a symbolic link, which vramcap does not write through".into(),
            );
        }
        Ok(m) if !m.is_file() => return Some("its kernel.json is not a regular file".into()),
        Ok(_) => {}
    }
    let spec = match std::fs::read_to_string(&file) {
        Ok(t) => serde_json::from_str::<serde_json::Value>(&t).map_err(|e| {
            format!("its kernel.json is not valid JSON ({e}), so it is not known to be vramcap's")
        }),
        Err(e) => Err(format!("its kernel.json cannot be read ({e})")),
    };
    match spec {
        Err(why) => Some(why),
        Ok(spec) => (!is_ours(&spec)).then(|| "was not written by vramcap".to_string()),
    }
}

/// Writes `json` to `file`, which must be a regular file or absent: never
/// through a link (`O_NOFOLLOW`), nor into a FIFO or device (checked on the
/// open file, `O_NONBLOCK` so a FIFO cannot hold the open).
fn write_spec(file: &Path, json: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    f.set_len(0)?;
    f.write_all(json.as_bytes())
}

fn list(extra: Option<&Path>) -> ExitCode {
    let ours: Vec<Found> = all_specs(extra).into_iter().filter(Found::ours).collect();
    if ours.is_empty() {
        let looked: Vec<String> = search_path(extra).iter().map(|d| text::path(d)).collect();
        println!(
            "no vramcap kernels (looked in {}); add one with: vramcap kernel install --limit 8GiB",
            looked.join(", ")
        );
        return ExitCode::SUCCESS;
    }
    // Names, display names and folders as printable text: a kernel.json
    // or a folder name may hold anything.
    let rows: Vec<[String; 3]> = ours
        .iter()
        .map(|f| {
            let display = f
                .spec
                .get("display_name")
                .and_then(|d| d.as_str())
                .unwrap_or("");
            [
                text::printable(&f.name).into_owned(),
                text::printable(display).into_owned(),
                text::path(&f.dir),
            ]
        })
        .collect();
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let (w_name, w_disp) = (width(0), width(1));
    for [name, display, dir] in &rows {
        println!("{name:w_name$}  {display:w_disp$}  {dir}");
    }
    ExitCode::SUCCESS
}

fn remove(name: &str, extra: Option<&Path>) -> Result<ExitCode, String> {
    let lower = name.to_ascii_lowercase();
    let Some(found) = all_specs(extra).into_iter().find(|f| f.name == lower) else {
        return Err(format!(
            "no kernel named {name:?}; `vramcap kernel list` shows the ones vramcap wrote, e.g. vramcap kernel remove vramcap-8gib"
        ));
    };
    if !found.ours() {
        let name = text::printable(name);
        return Err(format!(
            "the kernel {name} at {} was not written by vramcap; remove it with jupyter: jupyter kernelspec remove {name}",
            text::path(&found.dir)
        ));
    }
    if let Err(e) = std::fs::remove_dir_all(&found.dir) {
        eprintln!("vramcap: cannot remove {}: {e}", text::path(&found.dir));
        return Ok(ExitCode::from(1));
    }
    println!(
        "removed kernel {} from {}",
        text::printable(&lower),
        text::path(&found.dir)
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(limit: Option<&str>, group: Option<&str>) -> crate::cli::run::ShimOptions {
        crate::cli::run::ShimOptions {
            limit: limit.map(str::to_string),
            log: None,
            cache: None,
            cache_idle: None,
            spill: None,
            spill_limit: None,
            stats_dir: None,
            group: group.map(str::to_string),
            count: None,
            context: None,
            park: None,
        }
    }

    #[test]
    fn names_and_display_names() {
        let cases = [
            (
                Some("8GiB"),
                None,
                "vramcap-8gib",
                "Python 3 (vramcap 8 GiB)",
            ),
            (
                Some("512MiB"),
                None,
                "vramcap-512mib",
                "Python 3 (vramcap 512 MiB)",
            ),
            (
                Some("1.5GiB"),
                None,
                "vramcap-1.5gib",
                "Python 3 (vramcap 1536 MiB)",
            ),
            (Some("50%"), None, "vramcap-50pct", "Python 3 (vramcap 50%)"),
            (
                Some("0=8GiB,1=4GiB"),
                Some("train"),
                "vramcap-0-8gib-1-4gib-group-train",
                "Python 3 (vramcap 0=8GiB,1=4GiB, group train)",
            ),
            (
                None,
                Some("Team A"),
                "vramcap-group-team-a",
                "Python 3 (vramcap group Team A)",
            ),
        ];
        for (limit, group, name, display) in cases {
            let o = opts(limit, group);
            assert_eq!(default_name(&o), name);
            assert!(valid_name(&default_name(&o)));
            assert_eq!(default_display_name(&o), display);
        }
        assert!(!valid_name("my kernel"));
        assert!(!valid_name(""));
        assert!(valid_name("Vramcap_8.x-y"));
        // jupyter_client's rule lets these through; neither is a folder of
        // its own in kernels/.
        for name in [".", ".."] {
            assert!(valid_name(name) && !one_folder(name), "{name}");
        }
        assert!(one_folder("...") && one_folder("vramcap-8gib"));
    }
}
