//! `vramcap run` and `vramcap env`: the shim found, every option checked the
//! way the shim will read it, then the variables set on a command or printed.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vramcap_core::limit::parse_limit;
use vramcap_core::settings::{
    CACHE_IDLE_VAR, CACHE_VAR, CONTEXT_VAR, COUNT_VAR, DISABLE_VAR, GROUP_VAR, LOG_VAR, PARK_VAR,
    SPILL_LIMIT_VAR, SPILL_VAR, STATS_DIR_VAR, Settings, parse_log_level, unknown_vars_in_env,
};

#[derive(clap::Args, Clone)]
pub struct ShimOptions {
    /// The cap: 8GiB, 50%, 0=8GiB,1=4GiB, or 4GiB,1=2GiB (sets VRAMCAP_LIMIT)
    #[arg(long, value_name = "SPEC", allow_hyphen_values = true)]
    pub limit: Option<String>,
    /// error, warn, info or debug (sets VRAMCAP_LOG)
    #[arg(long, value_name = "LEVEL")]
    pub log: Option<String>,
    /// Freed-block cache bound per GPU: a size, a percentage of the cap, or off (sets VRAMCAP_CACHE)
    #[arg(long, value_name = "SIZE|PERCENT|off")]
    pub cache: Option<String>,
    /// Return cached blocks idle this long, e.g. 5s (sets VRAMCAP_CACHE_IDLE)
    #[arg(long, value_name = "DURATION")]
    pub cache_idle: Option<String>,
    /// Past the cap, spill to host memory: off, host or tiered (sets VRAMCAP_SPILL)
    #[arg(long, value_name = "MODE")]
    pub spill: Option<String>,
    /// Host memory spill may take: a size or a percentage of RAM (sets VRAMCAP_SPILL_LIMIT)
    #[arg(long, value_name = "SIZE|PERCENT")]
    pub spill_limit: Option<String>,
    /// Directory for statistics pages (sets VRAMCAP_STATS_DIR)
    #[arg(long, value_name = "DIR")]
    pub stats_dir: Option<String>,
    /// Share one budget per GPU with every process of this group (sets VRAMCAP_GROUP)
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// What the cap counts: held (everything the process holds on the GPU, the default) or allocations (sets VRAMCAP_COUNT)
    #[arg(long, value_name = "held|allocations")]
    pub count: Option<String>,
    /// The context's footprint: auto (measured through NVML) or a size per GPU (sets VRAMCAP_CONTEXT)
    #[arg(long, value_name = "auto|SIZE")]
    pub context: Option<String>,
    /// Let the process be parked: manual (only by vramcap park) or idle:DURATION (also by the idle policy) (sets VRAMCAP_PARK)
    #[arg(long, value_name = "manual|idle:DURATION")]
    pub park: Option<String>,
}

/// `vramcap run`: the command under the shim, in place of this process.
pub fn run(opts: &ShimOptions, command: &[OsString]) -> Result<ExitCode, String> {
    shim_env(opts).map(|vars| {
        // A program the loader would run in secure-execution mode
        // drops LD_PRELOAD: refused, never run uncapped silently.
        if let Ok(lib) = find_library()
            && let Some(why) =
                super::secure::refusal(&command[0], &lib, Path::new(super::secure::LD_SO_PRELOAD))
        {
            eprintln!("vramcap: {why}");
            return ExitCode::from(126);
        }
        let mut cmd = std::process::Command::new(&command[0]);
        for k in clear_disable(opts, "run") {
            cmd.env_remove(k);
        }
        let err = cmd.args(&command[1..]).envs(vars).exec();
        let code = if err.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        eprintln!(
            "vramcap: cannot run {}: {err}",
            command[0].to_string_lossy()
        );
        ExitCode::from(code)
    })
}

/// `vramcap env`: the variables as `export` lines for a shell.
pub fn env(opts: &ShimOptions) -> Result<ExitCode, String> {
    shim_env(opts).map(|vars| {
        for (k, v) in &vars {
            println!("export {k}={}", shell_quote(&v.to_string_lossy()));
        }
        for k in clear_disable(opts, "env") {
            println!("unset {k}");
        }
        println!("# {}", counting_line(&vars));
        ExitCode::SUCCESS
    })
}

/// Where the shim is: beside this binary, then `VRAMCAP_LIBRARY`, then the
/// install locations.
pub fn find_library() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        tried.push(dir.join("libvramcap.so"));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(prefix) = exe.parent().and_then(Path::parent)
    {
        // PREFIX/bin/vramcap beside PREFIX/lib/…/vramcap/libvramcap.so (the
        // .deb's layout under any prefix, and the tarball's).
        tried.push(prefix.join("lib/x86_64-linux-gnu/vramcap/libvramcap.so"));
        tried.push(prefix.join("lib/vramcap/libvramcap.so"));
        // The wheel's: PREFIX/bin/vramcap and the package in
        // PREFIX/lib/pythonX.Y/{site,dist}-packages/vramcap/ (a virtual
        // environment, --user, a system prefix; or where its vramcap.pth
        // points, for an editable install), or DIR/bin and DIR/vramcap
        // (pip install --target DIR).
        tried.extend(wheel_libraries(prefix));
    }
    if let Some(p) = std::env::var_os(vramcap_core::settings::LIBRARY_VAR) {
        tried.push(PathBuf::from(p));
    }
    for dir in [
        "/usr/lib/x86_64-linux-gnu/vramcap",
        "/usr/local/lib/vramcap",
        "/usr/lib/vramcap",
    ] {
        tried.push(Path::new(dir).join("libvramcap.so"));
    }
    tried
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
            format!(
                "cannot find libvramcap.so (looked in {}); build it with `cargo build --release` or set VRAMCAP_LIBRARY to its path",
                list.join(", ")
            )
        })
}

/// Where an installed wheel keeps the library, for its CLI in PREFIX/bin.
fn wheel_libraries(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let dir = py.join(packages);
                out.push(dir.join("vramcap/libvramcap.so"));
                // `pip install -e .`: a .pth file names the checkout's
                // python/ folder, where the backend put the library.
                if let Ok(pth) = std::fs::read_to_string(dir.join("vramcap.pth")) {
                    for line in pth.lines().map(str::trim).filter(|l| l.starts_with('/')) {
                        out.push(Path::new(line).join("vramcap/libvramcap.so"));
                    }
                }
            }
        }
    }
    out.push(prefix.join("vramcap/libvramcap.so"));
    out
}

/// The variables `run` and `env` clear: with `--limit` or `--group`, an
/// inherited `VRAMCAP_DISABLE` (which would turn the cap off) is cleared,
/// with one line when it would have turned the shim off (any value but
/// unset, empty or 0). Clearing, not refusing: the option on the command
/// line is the newer, explicit wish, and `env -u` would be the only fix
/// anyway; the line says what happened.
fn clear_disable(opts: &ShimOptions, verb: &str) -> Vec<&'static str> {
    let asked = match (&opts.limit, &opts.group) {
        (Some(_), _) => "--limit",
        (None, Some(_)) => "--group",
        (None, None) => return Vec::new(),
    };
    let Some(value) = std::env::var_os(DISABLE_VAR) else {
        return Vec::new();
    };
    let value = value.to_string_lossy();
    if !matches!(value.trim(), "" | "0") {
        let example = if verb == "run" {
            "vramcap run -- python train.py"
        } else {
            "vramcap env"
        };
        eprintln!(
            "vramcap: {DISABLE_VAR}={value:?} in the environment would turn vramcap off; {verb} clears it, since {asked} asks for a cap (to run uncapped, leave out {asked}, e.g. {example})"
        );
    }
    vec![DISABLE_VAR]
}

/// The variables to set, after checking every value the way the shim will.
pub fn shim_env(opts: &ShimOptions) -> Result<Vec<(String, OsString)>, String> {
    let lib = find_library()?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        // The library once (`eval "$(vramcap env)"` run twice), first.
        let others: Vec<&[u8]> = existing
            .as_bytes()
            .split(|&b| b == b':' || b == b' ')
            .filter(|p| !p.is_empty() && *p != lib.as_os_str().as_bytes())
            .collect();
        for p in others {
            preload.push(":");
            preload.push(std::ffi::OsStr::from_bytes(p));
        }
    }
    let mut vars = vec![("LD_PRELOAD".to_string(), preload)];
    // A misspelt setting in the environment is told, as the shim will.
    for unknown in unknown_vars_in_env() {
        eprintln!("vramcap: {unknown}");
    }
    if let Some(limit) = &opts.limit {
        let spec = parse_limit(limit).map_err(|e| e.to_string())?;
        // Keys that certainly name no GPU are refused now (the shim checks
        // fully at the first CUDA call; cli/machine.rs says what is certain).
        super::machine::check_limit_keys(&spec, limit)?;
        vars.push(("VRAMCAP_LIMIT".into(), limit.into()));
    }
    if let Some(level) = &opts.log {
        parse_log_level(level).map_err(|e| e.to_string())?;
        vars.push((LOG_VAR.into(), level.into()));
    }
    // Every other option: checked exactly as the shim will read it.
    let others = [
        (CACHE_VAR, &opts.cache),
        (CACHE_IDLE_VAR, &opts.cache_idle),
        (SPILL_VAR, &opts.spill),
        (SPILL_LIMIT_VAR, &opts.spill_limit),
        (STATS_DIR_VAR, &opts.stats_dir),
        (GROUP_VAR, &opts.group),
        (COUNT_VAR, &opts.count),
        (CONTEXT_VAR, &opts.context),
        (PARK_VAR, &opts.park),
    ];
    for (var, value) in others {
        if let Some(v) = value {
            Settings::from_lookup(|k| (k == var).then(|| v.clone())).map_err(|e| e.to_string())?;
            vars.push((var.into(), v.into()));
        }
    }
    Ok(vars)
}

/// What the cap will count, in one line, for the variables `vramcap env`
/// sets (the environment's own `VRAMCAP_COUNT` where it sets none).
fn counting_line(vars: &[(String, OsString)]) -> String {
    let value = vars
        .iter()
        .find(|(k, _)| k == COUNT_VAR)
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .or_else(|| std::env::var(COUNT_VAR).ok());
    let counting = value
        .and_then(|v| vramcap_core::settings::parse_counting(&v).ok())
        .unwrap_or(vramcap_core::settings::Counting::Held);
    match counting {
        vramcap_core::settings::Counting::Held => format!(
            "{COUNT_VAR}=held: the cap counts everything the process holds on each GPU (allocations, stream-ordered pools, graph memory, the context)"
        ),
        vramcap_core::settings::Counting::Allocations => format!(
            "{COUNT_VAR}=allocations: the cap counts allocations only; pools' retained memory, graph memory and the context are not capped"
        ),
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
