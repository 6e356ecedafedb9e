//! What holds a cap against a program that tries to escape `LD_PRELOAD`,
//! and which of those things are in force on this machine.

use std::path::{Path, PathBuf};

use vramcap_core::text;

use super::Report;

/// The first line the device plugin writes into a container's cap file.
const PLUGIN_MARK: &str = "# written by vramcap device-plugin";
/// The MPS control daemon's default pipe directory.
const MPS_PIPES: &str = "/tmp/nvidia-mps";

/// What LD_PRELOAD enforcement is and is not, and which of the things that
/// hold a cap against a program that tries to escape it are in force here
/// (docs/limitations.md, "What LD_PRELOAD enforcement is and is not").
pub(super) fn enforcement(
    r: &Report,
    lib: Option<&Path>,
    settings: Option<&vramcap_core::settings::Settings>,
) {
    use vramcap_core::settings::{NVIDIA_LIMIT_VAR, OPERATOR_LIMIT_PATH};
    r.note(
        "enforcement",
        "LD_PRELOAD caps programs that do not try to escape it; a program that runs code of its own can open the driver's device files (/dev/nvidia*) itself and allocate uncapped. What holds against that is listed below (docs/limitations.md)",
    );
    let preload = Path::new(crate::cli::secure::LD_SO_PRELOAD);
    match lib {
        Some(lib) if crate::cli::secure::preload_names_shim(preload, lib) => r.ok(
            "/etc/ld.so.preload",
            "names the shim: every dynamically linked program here loads it, set-user-ID ones and those that clear LD_PRELOAD too",
        ),
        _ => r.note(
            "/etc/ld.so.preload",
            format!(
                "does not name the shim: a program started without LD_PRELOAD, or a set-user-ID one, runs uncapped (as root, to preload it everywhere: echo {} >> /etc/ld.so.preload)",
                lib.map_or_else(|| "/path/to/libvramcap.so".into(), |l| l.display().to_string())
            ),
        ),
    }
    let operator = std::fs::read_to_string(OPERATOR_LIMIT_PATH).ok();
    match &operator {
        Some(_) => r.ok(
            "operator's cap file",
            format!("{OPERATOR_LIMIT_PATH}: no variable of the program lifts it"),
        ),
        None => r.note(
            "operator's cap file",
            format!("no {OPERATOR_LIMIT_PATH}: a program may set its own VRAMCAP_LIMIT, or VRAMCAP_DISABLE=1"),
        ),
    }
    if operator.is_some_and(|t| t.starts_with(PLUGIN_MARK)) {
        r.ok(
            "device plugin",
            "this container was set up by vramcap device-plugin: its cap file and /etc/ld.so.preload are mounted read-only",
        );
    } else {
        r.note(
            "device plugin",
            "not in force here (no container set up by vramcap device-plugin); on Kubernetes it gives each container the operator's cap and /etc/ld.so.preload (docs/device-plugin.md)",
        );
    }
    let pipes = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .map_or_else(|| PathBuf::from(MPS_PIPES), PathBuf::from);
    let daemon = pipes.join("control").exists();
    let where_ = text::path(&pipes);
    let pinned = std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    // In force only with both the limit and a daemon to apply it.
    let in_force = pinned.is_ok() && daemon;
    let mps_limit = match (pinned, daemon) {
        (Ok(v), true) => format!(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v:?} and an MPS control daemon at {where_}: the driver holds this process's GPU memory to it, on any driver, whatever the program calls"
        ),
        (Ok(v), false) => format!(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v:?}, but no MPS control daemon at {where_}: it applies only to clients of a running MPS server"
        ),
        (Err(_), true) => format!(
            "an MPS control daemon at {where_}, and no CUDA_MPS_PINNED_DEVICE_MEM_LIMIT here: only the daemon's default (set_default_device_pinned_mem_limit), if it set one, holds"
        ),
        (Err(_), false) => format!(
            "not in force (no MPS control daemon at {where_}); with MPS the driver holds each client to its pinned-memory limit, on any driver"
        ),
    };
    if in_force {
        r.ok("MPS pinned-memory limit", mps_limit);
    } else {
        r.note("MPS pinned-memory limit", mps_limit);
    }
    let mps = daemon && std::env::var_os("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").is_some();
    let version = crate::cli::machine::Inventory::open().and_then(|i| i.driver_version());
    let branch = version
        .as_deref()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    let asked = settings.and_then(|s| s.nvidia_limit).map_or_else(
        || format!("{NVIDIA_LIMIT_VAR} is not set here"),
        |b| format!("{NVIDIA_LIMIT_VAR}={} here", b >> 20),
    );
    match (branch, version.as_deref()) {
        (Some(b), Some(v)) if b >= 615 => r.ok(
            "NVIDIA per-cgroup limits",
            format!("available with driver {v} (r615 and later): NVML memory limits per cgroup, which NVIDIA's container toolkit sets from {NVIDIA_LIMIT_VAR}; {asked}"),
        ),
        (_, Some(v)) => r.note(
            "NVIDIA per-cgroup limits",
            format!("not available: driver {v} is older than r615; {asked}"),
        ),
        (_, None) => r.note(
            "NVIDIA per-cgroup limits",
            format!("the driver's version is unknown (NVML cannot be loaded); they need r615 or later ({asked})"),
        ),
    }
    let cgroup =
        branch.is_some_and(|b| b >= 615) && settings.is_some_and(|s| s.nvidia_limit.is_some());
    let held: Vec<&str> = [
        (mps, "MPS's pinned-memory limit"),
        (
            cgroup,
            "NVIDIA's per-cgroup limit (as its container toolkit applies NVIDIA_GPU_MEMORY_LIMIT)",
        ),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| *name)
    .collect();
    if held.is_empty() {
        r.note(
            "against a program that tries to escape",
            "nothing here holds: the shim, the operator's file and /etc/ld.so.preload close the ways round it through the loader and the environment, and only a limit the driver keeps holds against the device files",
        );
    } else {
        r.ok(
            "against a program that tries to escape",
            format!(
                "{} {}: the driver keeps it, whatever the program calls",
                held.join(" and "),
                if held.len() > 1 { "hold" } else { "holds" }
            ),
        );
    }
}
