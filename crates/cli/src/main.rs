//! `vramcap`: run programs under the shim and read their counters.
//!
//! Exit codes: `run` exits with the command's own status (127 when the
//! command or the shim cannot be found, 126 when the command cannot be
//! executed, or would run without the shim: set-user-ID, set-group-ID or
//! file capabilities, `cli/secure.rs`); every subcommand exits 2 for bad arguments or settings;
//! `stat` exits 1 when the statistics directory cannot be read; `kernel`
//! exits 1 when a kernelspec cannot be written or removed; `doctor`
//! exits 1 when it found a problem; `trim` exits 1 when a process could not
//! be reached or did not answer in time; `top` exits 1 when the terminal
//! cannot be set up or drawn to, 128 + the signal after SIGTERM, SIGHUP or
//! SIGINT; `exporter` serves until killed and exits 2 when it cannot listen;
//! otherwise 0.

mod cli;
mod read;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vramcap_core::limit::parse_limit;
use vramcap_core::settings::{
    CACHE_IDLE_VAR, CACHE_VAR, CONTEXT_VAR, COUNT_VAR, DISABLE_VAR, GROUP_VAR, LOG_VAR,
    SPILL_LIMIT_VAR, SPILL_VAR, STATS_DIR_VAR, Settings, parse_log_level, unknown_vars_in_env,
};

#[derive(Parser)]
#[command(
    name = "vramcap",
    version,
    about = "Per-GPU memory caps for unmodified CUDA programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct ShimOptions {
    /// The cap: 8GiB, 50%, 0=8GiB,1=4GiB, or 4GiB,1=2GiB (sets VRAMCAP_LIMIT)
    #[arg(long, value_name = "SPEC", allow_hyphen_values = true)]
    limit: Option<String>,
    /// error, warn, info or debug (sets VRAMCAP_LOG)
    #[arg(long, value_name = "LEVEL")]
    log: Option<String>,
    /// Freed-block cache bound per GPU: a size, a percentage of the cap, or off (sets VRAMCAP_CACHE)
    #[arg(long, value_name = "SIZE|PERCENT|off")]
    cache: Option<String>,
    /// Return cached blocks idle this long, e.g. 5s (sets VRAMCAP_CACHE_IDLE)
    #[arg(long, value_name = "DURATION")]
    cache_idle: Option<String>,
    /// Past the cap, spill to host memory: off, managed, host or tiered (sets VRAMCAP_SPILL)
    #[arg(long, value_name = "MODE")]
    spill: Option<String>,
    /// Host memory spill may take: a size or a percentage of RAM (sets VRAMCAP_SPILL_LIMIT)
    #[arg(long, value_name = "SIZE|PERCENT")]
    spill_limit: Option<String>,
    /// Directory for statistics pages (sets VRAMCAP_STATS_DIR)
    #[arg(long, value_name = "DIR")]
    stats_dir: Option<String>,
    /// Share one budget per GPU with every process of this group (sets VRAMCAP_GROUP)
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// What the cap counts: held (everything the process holds on the GPU, the default) or allocations (sets VRAMCAP_COUNT)
    #[arg(long, value_name = "held|allocations")]
    count: Option<String>,
    /// The context's footprint: auto (measured through NVML) or a size per GPU (sets VRAMCAP_CONTEXT)
    #[arg(long, value_name = "auto|SIZE")]
    context: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command under the shim: `vramcap run --limit 8GiB -- python train.py`
    Run {
        #[command(flatten)]
        opts: ShimOptions,
        /// The command and its arguments
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Print `export` lines that put the shim in front of programs started from this shell
    Env {
        #[command(flatten)]
        opts: ShimOptions,
    },
    /// Show the memory of every process under the shim (one row per process and GPU)
    Stat {
        #[command(flatten)]
        read: cli::stat::ReadOptions,
        /// Print JSON (schema vramcap.stat version 1, documented in docs/statistics.md)
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// Print CSV for scripts, as nvidia-smi: csv[,noheader][,nounits]
        #[arg(long, value_name = "csv[,noheader][,nounits]", value_parser = cli::stat::parse_format)]
        format: Option<cli::stat::CsvFormat>,
        /// Refresh every SECONDS until interrupted
        #[arg(short = 'l', long = "loop", value_name = "SECONDS", value_parser = cli::stat::parse_interval)]
        interval: Option<std::time::Duration>,
        /// With --loop, stop after N refreshes
        #[arg(long, value_name = "N", requires = "interval", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Only these processes (repeatable)
        #[arg(long = "pid", value_name = "PID")]
        pids: Vec<u32>,
        /// Only these GPUs: indices as the processes see them or UUID
        /// prefixes, comma-separated, as `nvidia-smi -i` takes them
        /// (repeatable; --gpu is the same)
        #[arg(short = 'i', long = "id", visible_alias = "gpu", value_name = "ID[,ID…]", value_delimiter = ',', value_parser = cli::stat::parse_gpu)]
        gpus: Vec<cli::stat::GpuSel>,
    },
    /// Live view of every process under the shim: memory bars, history and groups
    ///
    /// Keys: u, p, g, o sort by used bytes, PID, GPU or refusals; `,` and `.`
    /// move the sort to the previous or next column and `/` (or r) reverses
    /// it, as in nvitop; q, Esc or Ctrl-C quits. Without a terminal, prints
    /// the `stat` table every interval instead.
    Top {
        #[command(flatten)]
        read: cli::stat::ReadOptions,
        /// Only these GPUs: indices as the processes see them or UUID
        /// prefixes, comma-separated, as `nvidia-smi -i` takes them (--gpu is the same)
        #[arg(short = 'i', long = "id", visible_alias = "gpu", value_name = "ID[,ID…]", value_delimiter = ',', value_parser = cli::stat::parse_gpu)]
        gpus: Vec<cli::stat::GpuSel>,
        /// Print the table once and exit, as `nvitop --once` does
        #[arg(long, conflicts_with = "count")]
        once: bool,
        /// Refresh every SECONDS
        #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = cli::top::parse_interval)]
        interval: std::time::Duration,
        /// Stop after N refreshes
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// Serve the counters of every process under the shim as Prometheus metrics
    ///
    /// `GET /metrics` answers in the text exposition format; one sample per
    /// process and GPU, labelled gpu, UUID, pid, command, group, dir (the
    /// directory the page was read from), and pod, namespace, container when
    /// the process had them in its environment. Runs until killed.
    Exporter {
        #[command(flatten)]
        read: cli::stat::ReadOptions,
        /// Address to listen on: IP:PORT, [IPv6]:PORT, HOST:PORT or :PORT (all interfaces); port 0 picks a free one
        #[arg(long, value_name = "ADDRESS:PORT", default_value = cli::exporter::DEFAULT_LISTEN)]
        listen: String,
    },
    /// Make processes give their cached blocks back to the driver now
    Trim {
        /// Processes to trim (or --all)
        #[arg(value_name = "PID", conflicts_with = "all")]
        pids: Vec<u32>,
        /// Every process of this user under the shim (with --all-users, of every user)
        #[arg(long)]
        all: bool,
        /// How long to wait for each process to answer
        #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = cli::stat::parse_seconds)]
        timeout: std::time::Duration,
        #[command(flatten)]
        write: cli::trim::WriteOptions,
    },
    /// Change the cap of running processes: `vramcap limit --pid 4242 2GiB` (SPEC as --limit takes it, or none)
    Limit {
        /// Processes to change (repeatable)
        #[arg(
            long = "pid",
            value_name = "PID",
            required_unless_present_any = ["all", "group"],
            conflicts_with_all = ["all", "group"]
        )]
        pids: Vec<u32>,
        /// Every process of this user under the shim (with --all-users, of every user)
        #[arg(long, conflicts_with = "group")]
        all: bool,
        /// A group: its limits change for all its members at once
        #[arg(long, value_name = "NAME")]
        group: Option<String>,
        /// Wait until every target holds at most its new cap (exit 1 when the time is up)
        #[arg(long, value_name = "SECONDS", value_parser = cli::stat::parse_seconds)]
        wait: Option<std::time::Duration>,
        /// How long to wait for each process to take the change
        #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = cli::stat::parse_seconds)]
        timeout: std::time::Duration,
        /// Only these GPUs of each process: indices or UUID prefixes,
        /// comma-separated, as `nvidia-smi -i` takes them (--gpu is the same)
        #[arg(short = 'i', long = "id", visible_alias = "gpu", value_name = "ID[,ID…]", value_delimiter = ',', value_parser = cli::stat::parse_gpu, conflicts_with = "group")]
        gpus: Vec<cli::stat::GpuSel>,
        /// The new cap: 2GiB, 50%, 0=2GiB,1=4GiB, GPU-5ca1ab1e=2GiB, or none
        #[arg(value_name = "SPEC")]
        spec: String,
        #[command(flatten)]
        write: cli::trim::WriteOptions,
    },
    /// Print the bytes of a size such as 4GiB (the grammar of --limit amounts)
    Size {
        /// A size: whole or decimal number, then B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB
        #[arg(value_name = "SIZE", allow_hyphen_values = true)]
        size: String,
    },
    /// Serve GPU memory to the kubelet as vramcap.io/gpu-memory (a device plugin, API v1beta1; docs/device-plugin.md)
    DevicePlugin {
        /// The kubelet's device-plugin directory (its kubelet.sock is there)
        #[arg(
            long,
            value_name = "DIR",
            default_value = "/var/lib/kubelet/device-plugins"
        )]
        plugin_dir: PathBuf,
        /// The plugin's socket, in that directory
        #[arg(long, value_name = "NAME", default_value = "vramcap-gpu-memory.sock")]
        socket: String,
        /// The extended resource advertised
        #[arg(long, value_name = "NAME", default_value = "vramcap.io/gpu-memory")]
        resource: String,
        /// Memory of one advertised device (unit), e.g. 256MiB
        #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_unit)]
        unit: u64,
        /// Memory of each GPU not advertised (room for the CUDA contexts the caps count)
        #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_reserve)]
        reserve: u64,
        /// The shim on the node (where the DaemonSet's init container puts it), mounted read-only into each container
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/opt/vramcap/lib/libvramcap.so"
        )]
        library: PathBuf,
        /// Where containers see the shim (named by their /etc/ld.so.preload)
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/opt/vramcap/lib/libvramcap.so"
        )]
        library_in_container: PathBuf,
        /// The plugin's directory on the node: ld.so.preload and one directory per allocation
        #[arg(long, value_name = "DIR", default_value = "/var/lib/vramcap")]
        state_dir: PathBuf,
        /// How containers get their GPUs: env (NVIDIA_VISIBLE_DEVICES, for the NVIDIA container runtime) or cdi (CDI device names)
        #[arg(long, value_name = "env|cdi", default_value = "env", value_parser = parse_device_mode)]
        devices: cli::plugin::layout::DeviceMode,
        /// Advertise only these GPUs (UUID, repeatable; default every GPU NVML lists)
        #[arg(long = "gpu", value_name = "UUID")]
        gpus: Vec<String>,
        /// How often each GPU's health is asked of NVML, in seconds
        #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = cli::stat::parse_seconds)]
        health_interval: std::time::Duration,
        /// The kubelet's PodResources socket, asked which allocations are still there
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
        )]
        pod_resources: PathBuf,
        /// How often the directories of ended allocations are swept, in seconds
        #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = cli::stat::parse_seconds)]
        sweep_interval: std::time::Duration,
        /// How old an ended allocation's directory must be to go, in seconds
        #[arg(long, value_name = "SECONDS", default_value = "300", value_parser = cli::stat::parse_seconds)]
        sweep_grace: std::time::Duration,
    },
    /// Jupyter kernels that start under the shim: `vramcap kernel install --limit 8GiB`
    Kernel {
        #[command(subcommand)]
        action: cli::kernel::Action,
    },
    /// Check the installation: shim, driver, and that interposition works
    Doctor {
        /// Internal: the check that runs under the shim
        #[arg(long, hide = true)]
        probe: bool,
        /// Internal: the shim's check of VRAMCAP_LIMIT's device keys, in a child
        #[arg(long, hide = true, conflicts_with = "probe")]
        probe_limit: bool,
    },
}

/// `--unit`: a size of at least 1 MiB.
fn parse_unit(text: &str) -> Result<u64, String> {
    match vramcap_core::size::parse_size(text) {
        Ok(b) if b >= 1 << 20 => Ok(b),
        Ok(_) => Err(format!(
            "{text:?} is less than 1 MiB; give a unit such as 256MiB"
        )),
        Err(e) => Err(format!("{e}; give a unit such as 256MiB")),
    }
}

/// `--reserve`: a size, 0 for none.
fn parse_reserve(text: &str) -> Result<u64, String> {
    vramcap_core::size::parse_size(text).map_err(|e| format!("{e}; e.g. 1GiB or 0"))
}

/// `--devices`.
fn parse_device_mode(text: &str) -> Result<cli::plugin::layout::DeviceMode, String> {
    match text {
        "env" => Ok(cli::plugin::layout::DeviceMode::Env),
        "cdi" => Ok(cli::plugin::layout::DeviceMode::Cdi),
        _ => Err(format!(
            "{text:?} is not a way to give containers their GPUs: env or cdi (e.g. --devices cdi)"
        )),
    }
}

/// Where the shim is: beside this binary, then `VRAMCAP_LIBRARY`, then the
/// install locations.
fn find_library() -> Result<PathBuf, String> {
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
fn shim_env(opts: &ShimOptions) -> Result<Vec<(String, OsString)>, String> {
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
        cli::machine::check_limit_keys(&spec, limit)?;
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
    ];
    for (var, value) in others {
        if let Some(v) = value {
            Settings::from_lookup(|k| (k == var).then(|| v.clone())).map_err(|e| e.to_string())?;
            vars.push((var.into(), v.into()));
        }
    }
    Ok(vars)
}

/// `vramcap size`: the byte count of a size, as `--limit` and the shim read it.
fn print_size(text: &str) -> Result<ExitCode, String> {
    let bytes = vramcap_core::size::parse_size(text).map_err(|e| {
        format!("\"{text}\" is not a valid size: {e}; for example: vramcap size 4GiB")
    })?;
    println!("{bytes}");
    Ok(ExitCode::SUCCESS)
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Exporter { .. } | Command::DevicePlugin { .. }
    ) {
        // A reader that goes away (`vramcap doctor | head -1`) ends the
        // command quietly, as it does other command-line tools; the
        // exporter handles its clients' closed connections itself.
        // SAFETY: setting a signal's disposition to its default.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let result = match cli.command {
        Command::Stat {
            read,
            json,
            format,
            interval,
            count,
            pids,
            gpus,
        } => cli::stat::Sources::new(&read, uid).map(|sources| {
            let mut args = cli::stat::StatArgs {
                groups: Vec::new(),
                json,
                interval,
                count,
                pids,
                gpus,
                csv: format,
                sources,
            };
            ExitCode::from(cli::stat::run(&mut args))
        }),
        Command::Top {
            read,
            interval,
            count,
            gpus,
            once,
        } => cli::stat::Sources::new(&read, uid).map(|sources| {
            ExitCode::from(cli::top::run(
                sources,
                interval,
                if once { Some(0) } else { count },
                gpus,
            ))
        }),
        Command::Exporter { read, listen } => cli::stat::Sources::new(&read, uid)
            .and_then(|sources| cli::exporter::run(&listen, sources))
            .map(ExitCode::from),
        Command::Trim { pids, all, .. } if pids.is_empty() && !all => Err(
            "trim needs the processes to trim or --all, e.g. vramcap trim 4242 or vramcap trim --all"
                .to_string(),
        ),
        Command::Trim {
            pids,
            all,
            timeout,
            write,
        } => write.resolve(uid, "trim").map(|(dirs, users)| {
            ExitCode::from(cli::trim::run(&dirs, users, &pids, all, timeout))
        }),
        Command::Limit {
            pids,
            all,
            group,
            wait,
            timeout,
            spec,
            write,
            gpus,
        } => write.resolve(uid, "limit").map(|(dirs, users)| {
            let args = cli::limit::LimitArgs {
                pids: &pids,
                all,
                group: group.as_deref(),
                spec: &spec,
                timeout,
                wait,
                gpus: &gpus,
            };
            ExitCode::from(cli::limit::run(&dirs, users, &args))
        }),
        Command::Size { size } => print_size(&size),
        Command::Kernel { action } => cli::kernel::run(action),
        Command::DevicePlugin {
            plugin_dir,
            socket,
            resource,
            unit,
            reserve,
            library,
            library_in_container,
            state_dir,
            devices,
            gpus,
            health_interval,
            pod_resources,
            sweep_interval,
            sweep_grace,
        } => cli::plugin::run(cli::plugin::Args {
            plugin_dir,
            socket,
            resource,
            health_interval,
            pod_resources,
            sweep_interval,
            sweep_grace,
            config: cli::plugin::layout::Config {
                unit,
                reserve,
                library,
                library_in_container,
                state_dir,
                device_mode: devices,
            },
            only: (!gpus.is_empty()).then_some(gpus),
        })
        .map(ExitCode::from),
        Command::Doctor {
            probe: true,
            probe_limit: false,
        } => Ok(ExitCode::from(cli::doctor::probe())),
        Command::Doctor {
            probe_limit: true, ..
        } => Ok(ExitCode::from(cli::doctor::probe_limit())),
        Command::Doctor { .. } => Ok(ExitCode::from(cli::doctor::run(
            find_library(),
            cli::stat::stats_dirs(uid),
            uid,
        ))),
        Command::Run { opts, command } => shim_env(&opts).map(|vars| {
            // A program the loader would run in secure-execution mode
            // drops LD_PRELOAD: refused, never run uncapped silently.
            if let Ok(lib) = find_library()
                && let Some(why) = cli::secure::refusal(
                    &command[0],
                    &lib,
                    Path::new(cli::secure::LD_SO_PRELOAD),
                )
            {
                eprintln!("vramcap: {why}");
                return ExitCode::from(126);
            }
            let mut cmd = std::process::Command::new(&command[0]);
            for k in clear_disable(&opts, "run") {
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
        }),
        Command::Env { opts } => shim_env(&opts).map(|vars| {
            for (k, v) in &vars {
                println!("export {k}={}", shell_quote(&v.to_string_lossy()));
            }
            for k in clear_disable(&opts, "env") {
                println!("unset {k}");
            }
            println!("# {}", counting_line(&vars));
            ExitCode::SUCCESS
        }),
    };
    result.unwrap_or_else(|e| {
        eprintln!("vramcap: {e}");
        ExitCode::from(2)
    })
}
