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
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vramcap_core::park::Ask;

/// The device plugin's default paths: where the DaemonSet puts the shim on
/// the node (and where containers see it), and the kubelet's sockets.
const SHIM_ON_NODE: &str = "/opt/vramcap/lib/libvramcap.so";
const KUBELET_PLUGINS: &str = "/var/lib/kubelet/device-plugins";
const POD_RESOURCES: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

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

#[derive(Subcommand)]
enum Command {
    /// Run a command under the shim: `vramcap run --limit 8GiB -- python train.py`
    Run {
        #[command(flatten)]
        opts: cli::run::ShimOptions,
        /// The command and its arguments
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
    /// Print `export` lines that put the shim in front of programs started from this shell
    Env {
        #[command(flatten)]
        opts: cli::run::ShimOptions,
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
    /// Park running processes: their GPU memory to host memory, their budget released (docs/parking.md)
    Park {
        #[command(flatten)]
        targets: cli::park::Targets,
        /// Only processes that made no CUDA call for this long, e.g. 10m
        #[arg(long, value_name = "DURATION", value_parser = parse_park_duration)]
        idle: Option<std::time::Duration>,
        #[command(flatten)]
        write: cli::trim::WriteOptions,
    },
    /// Resume parked processes, once their bytes fit on the GPU and in their group
    Resume {
        #[command(flatten)]
        targets: cli::park::Targets,
        /// Keep trying this long while there is no room, e.g. 5m (default: refuse at once)
        #[arg(long, value_name = "DURATION", value_parser = parse_park_duration)]
        wait: Option<std::time::Duration>,
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
        #[arg(long, value_name = "DIR", default_value = KUBELET_PLUGINS)]
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
        #[arg(long, value_name = "PATH", default_value = SHIM_ON_NODE)]
        library: PathBuf,
        /// Where containers see the shim (named by their /etc/ld.so.preload)
        #[arg(long, value_name = "PATH", default_value = SHIM_ON_NODE)]
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
        #[arg(long, value_name = "PATH", default_value = POD_RESOURCES)]
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

/// `vramcap size`: the byte count of a size, as `--limit` and the shim read it.
fn print_size(text: &str) -> Result<ExitCode, String> {
    let bytes = vramcap_core::size::parse_size(text).map_err(|e| {
        format!("\"{text}\" is not a valid size: {e}; for example: vramcap size 4GiB")
    })?;
    println!("{bytes}");
    Ok(ExitCode::SUCCESS)
}

/// `vramcap park` and `vramcap resume` (`command`): `ask` to the processes
/// `args` picks, in the statistics directories `write` resolves.
fn park(
    write: &cli::trim::WriteOptions,
    uid: u32,
    command: &str,
    ask: Ask,
    args: &cli::park::ParkArgs,
) -> Result<ExitCode, String> {
    let (dirs, users) = write.resolve(uid, command)?;
    Ok(ExitCode::from(cli::park::run(&dirs, users, ask, args)))
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
        Command::Park {
            targets,
            idle,
            write,
        } => park(&write, uid, "park", Ask::Park, &targets.args(idle, None)),
        Command::Resume {
            targets,
            wait,
            write,
        } => park(&write, uid, "resume", Ask::Resume, &targets.args(None, wait)),
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
            cli::run::find_library(),
            cli::stat::stats_dirs(uid),
            uid,
        ))),
        Command::Run { opts, command } => cli::run::run(&opts, &command),
        Command::Env { opts } => cli::run::env(&opts),
    };
    result.unwrap_or_else(|e| {
        eprintln!("vramcap: {e}");
        ExitCode::from(2)
    })
}

/// A duration as `VRAMCAP_PARK`'s `idle:` takes it (10m, 30s, 500ms).
fn parse_park_duration(text: &str) -> Result<std::time::Duration, String> {
    vramcap_core::settings::parse_duration(text)
        .ok_or_else(|| format!("{text:?} is not a duration; e.g. 10m, 30s or 500ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example in the `--all-users` refusal of each command that
    /// writes to pages is a command line the CLI takes.
    #[test]
    fn the_all_users_refusal_suggests_a_valid_command() {
        let write = cli::trim::WriteOptions {
            dirs: Vec::new(),
            all_users: true,
        };
        for command in ["trim", "limit", "park", "resume"] {
            let Err(line) = write.resolve(1000, command) else {
                panic!("{command}: --all-users accepted from uid 1000");
            };
            let (_, example) = line.rsplit_once("e.g. ").expect("an example");
            let argv: Vec<&str> = example.split_whitespace().collect();
            assert_eq!(argv[..2], ["vramcap", command], "{line}");
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("{command}: {example:?} does not parse: {e}");
            }
        }
        assert_eq!(
            write.resolve(1000, "park").err().as_deref(),
            Some(
                "--all-users is for root (it changes other users' processes); without it, vramcap park acts on your own, e.g. vramcap park --pid 4242"
            )
        );
    }
}
