//! `vramcap doctor`: where the shim and the driver are, whether the driver
//! answers, and proof that interposition works, with a fix for each problem.
//!
//! The proof runs `vramcap doctor --probe` as a child under the shim (with a
//! 1 GiB cap and no statistics page): the child asks the driver for its
//! functions the ways programs do and checks, with `dladdr`, that the
//! answers are the shim's. With a usable GPU it also checks that
//! `cuMemGetInfo` reports the cap.
//!
//! The settings in the environment are read as the shim reads them; a
//! `VRAMCAP_*` name that is no setting fails with the line the shim warns
//! with. When `VRAMCAP_LIMIT` names devices, `vramcap doctor --probe-limit`
//! runs under the shim with the environment's limit and makes one call that
//! needs a cap, so the shim's own check decides whether every key names a
//! GPU (and its line is shown); without a usable GPU the keys are checked
//! against NVML's list, as `vramcap run` does.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use vramcap_core::stats_dir::{self, DirProblem};
use vramcap_core::text;

use super::stat::StatsDirs;

struct Report {
    problems: u32,
}

impl Report {
    fn ok(&self, what: &str, detail: impl AsRef<str>) {
        println!("ok    {what}: {}", detail.as_ref());
    }
    fn bad(&mut self, what: &str, detail: impl AsRef<str>, fix: impl AsRef<str>) {
        self.problems += 1;
        println!(
            "FAIL  {what}: {}\n      fix: {}",
            detail.as_ref(),
            fix.as_ref()
        );
    }
    fn note(&self, what: &str, detail: impl AsRef<str>) {
        println!("note  {what}: {}", detail.as_ref());
    }
}

type GetProc =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// The driver's path as the dynamic loader resolved it.
fn object_of(p: *const c_void) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: zeroed Dl_info is a valid out-buffer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr accepts any address.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

fn driver_name() -> CString {
    std::env::var("VRAMCAP_CUDA_LIBRARY")
        .ok()
        .and_then(|v| CString::new(v).ok())
        .unwrap_or_else(|| c"libcuda.so.1".into())
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: see above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

struct Driver {
    handle: *mut c_void,
}

impl Driver {
    fn open() -> Result<Driver, String> {
        let name = driver_name();
        // SAFETY: a valid NUL-terminated name.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            Err(dlerror_text())
        } else {
            Ok(Driver { handle: h })
        }
    }

    fn sym(&self, name: &CStr) -> *mut c_void {
        // SAFETY: a valid handle and name.
        unsafe { libc::dlsym(self.handle, name.as_ptr()) }
    }

    /// The driver's function `name`, typed as `F`.
    ///
    /// # Safety
    /// `F` must be the C signature of that driver function.
    unsafe fn func<F: Copy>(&self, name: &CStr) -> Option<F> {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let p = self.sym(name);
        // SAFETY: F is a function pointer type of pointer size (asserted) and
        // the caller guarantees it is the function's signature.
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Initialises the driver and makes device 0's primary context current.
/// Returns the number of devices, or why not.
fn init_driver(d: &Driver) -> Result<c_int, String> {
    type Init = unsafe extern "C" fn(u32) -> c_int;
    type Count = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
    type SetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
    // SAFETY: each type above is the cuda.h signature of the function named.
    let (init, count_fn, retain, set_current) = unsafe {
        (
            d.func::<Init>(c"cuInit"),
            d.func::<Count>(c"cuDeviceGetCount"),
            d.func::<Retain>(c"cuDevicePrimaryCtxRetain"),
            d.func::<SetCurrent>(c"cuCtxSetCurrent"),
        )
    };
    let (Some(init), Some(count_fn), Some(retain), Some(set_current)) =
        (init, count_fn, retain, set_current)
    else {
        return Err("the driver lacks cuInit, cuDeviceGetCount, cuDevicePrimaryCtxRetain or cuCtxSetCurrent".into());
    };
    let mut count: c_int = 0;
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: driver calls with valid out-pointers, in the documented order.
    unsafe {
        let rc = init(0);
        if rc != 0 {
            return Err(format!(
                "cuInit returned {rc} (100 means no CUDA-capable device is visible)"
            ));
        }
        count_fn(&mut count);
        let rc = retain(&mut ctx, 0);
        if rc != 0 {
            return Err(format!("cuDevicePrimaryCtxRetain returned {rc}"));
        }
        set_current(ctx);
    }
    Ok(count)
}

/// The statistics directories: the one `VRAMCAP_STATS_DIR` names (a
/// directory, or one that can be made), or the default ones, which must
/// be the user's own with mode 700 (see `vramcap_core::stats_dir`): a
/// directory or link someone else planted under a default name fails.
fn stats_dirs_report(r: &mut Report, dirs: Result<StatsDirs, String>, uid: u32) {
    const WHAT: &str = "statistics directory";
    let dirs = match dirs {
        Ok(d) => d,
        Err(e) => {
            return r.bad(
                WHAT,
                e,
                "set VRAMCAP_STATS_DIR to an absolute path or unset it",
            );
        }
    };
    // Missing, but can it be made? Its parent must be a directory.
    let can_make = |d: &Path| d.parent().is_some_and(Path::is_dir);
    let Some(uid_private) = dirs.private_to else {
        let d = &dirs.dirs[0];
        let shown = text::path(d);
        return match stats_dir::open_dir(d, None) {
            Ok(_) => r.ok(WHAT, format!("{shown} (VRAMCAP_STATS_DIR; exists)")),
            Err(DirProblem::Missing) if can_make(d) => r.ok(
                WHAT,
                format!("{shown} (VRAMCAP_STATS_DIR; created on first use)"),
            ),
            Err(p) => r.bad(
                WHAT,
                format!("VRAMCAP_STATS_DIR: {}", p.describe(d, uid)),
                "set VRAMCAP_STATS_DIR to a directory (not a symbolic link) whose parent exists, or unset it",
            ),
        };
    };
    let xdg = std::env::var_os(stats_dir::RUNTIME_VAR);
    let primary = stats_dir::default_dir(uid_private, xdg.as_deref());
    if let Err(p) = stats_dir::runtime_dir(uid_private, xdg.as_deref())
        && p != DirProblem::Missing
    {
        r.note(
            "runtime directory",
            format!(
                "XDG_RUNTIME_DIR {} (it must be yours with mode 700); pages go to {} instead",
                p.phrase(uid_private),
                text::path(&primary)
            ),
        );
    }
    let fallback = stats_dir::fallback_dir(uid_private);
    let mut check = |d: &Path, what: &str, quiet_if_missing: bool| {
        let shown = text::path(d);
        match stats_dir::open_dir(d, Some(uid_private)) {
            Ok(_) => r.ok(what, format!("{shown} (yours, mode 700)")),
            Err(DirProblem::Missing) if quiet_if_missing => {}
            Err(DirProblem::Missing) if can_make(d) => {
                r.ok(what, format!("{shown} (created on first use)"))
            }
            Err(p) => r.bad(
                what,
                format!(
                    "{}; nothing is published there and group members refuse their allocations (the cap still holds)",
                    p.describe(d, uid_private)
                ),
                p.fix(d),
            ),
        }
    };
    check(&primary, WHAT, false);
    if fallback != primary {
        // Programs started without the runtime directory (cron, services)
        // use the fallback: someone else's directory there stops them too.
        check(
            &fallback,
            "statistics directory without XDG_RUNTIME_DIR",
            true,
        );
    }
}

pub fn run(lib: Result<PathBuf, String>, stats_dirs: Result<StatsDirs, String>, uid: u32) -> u8 {
    let mut r = Report { problems: 0 };
    println!("vramcap {} doctor", env!("CARGO_PKG_VERSION"));

    let lib = match lib {
        Ok(p) => {
            r.ok("shim", p.display().to_string());
            Some(p)
        }
        Err(e) => {
            r.bad("shim", e, "run `cargo build --release` and use target/release/vramcap, or set VRAMCAP_LIBRARY");
            None
        }
    };

    let settings = match vramcap_core::settings::Settings::from_env() {
        Ok(s) => {
            r.ok(
                "settings in this environment",
                format!("limit: {}; log {}", s.limit, s.log.name()),
            );
            let context = match s.context {
                vramcap_core::settings::ContextCharge::Auto => {
                    "the context measured through NVML".to_string()
                }
                vramcap_core::settings::ContextCharge::Bytes(b) => {
                    format!("the context charged at {b} bytes per GPU")
                }
            };
            match s.counting {
                vramcap_core::settings::Counting::Held => r.ok(
                    "what the cap counts",
                    format!("held (VRAMCAP_COUNT): allocations, stream-ordered pools, graph memory and {context}"),
                ),
                vramcap_core::settings::Counting::Allocations => r.note(
                    "what the cap counts",
                    "allocations only (VRAMCAP_COUNT=allocations): pools' retained memory, graph memory and the context are not capped, so the process can hold more than its cap",
                ),
            }
            if let Some(nv) = s.nvidia_limit {
                r.ok(
                    "NVIDIA_GPU_MEMORY_LIMIT",
                    format!(
                        "{} MiB on every GPU, with VRAMCAP_LIMIT the stricter applies",
                        nv >> 20
                    ),
                );
            }
            use vramcap_core::settings::{OPERATOR_LIMIT_PATH, OperatorError, read_operator_limit};
            match read_operator_limit(std::path::Path::new(OPERATOR_LIMIT_PATH)) {
                Ok(None) => {}
                Ok(Some(spec)) => {
                    r.ok(
                        "operator's cap",
                        format!("{OPERATOR_LIMIT_PATH}: {spec}; no variable lifts it"),
                    );
                    if s.disabled
                        || s.counting == vramcap_core::settings::Counting::Allocations
                        || s.cuda_library.is_some()
                        || matches!(s.context, vramcap_core::settings::ContextCharge::Bytes(_))
                        || s.spill == vramcap_core::settings::Spill::Managed
                    {
                        r.note(
                            "operator's cap",
                            "under it the shim ignores VRAMCAP_DISABLE, VRAMCAP_COUNT=allocations, VRAMCAP_CONTEXT and VRAMCAP_CUDA_LIBRARY and takes VRAMCAP_SPILL=managed as host: what this environment sets of them does not apply",
                        );
                    }
                }
                Err(OperatorError::Unusable(why)) => {
                    r.note("operator's cap", format!("{why}: the shim ignores it"))
                }
                Err(OperatorError::Bad(why)) => r.bad(
                    "operator's cap",
                    why,
                    "write one cap into it as root, e.g. 8GiB, or remove it",
                ),
            }
            Some(s)
        }
        Err(e) => {
            r.bad(
                "settings in this environment",
                e.to_string(),
                "correct or unset that variable",
            );
            None
        }
    };
    for unknown in vramcap_core::settings::unknown_vars_in_env() {
        r.bad(
            "settings in this environment",
            unknown.to_string(),
            format!(
                "rename it to the setting you meant ({}) or unset it",
                unknown.closest
            ),
        );
    }

    stats_dirs_report(&mut r, stats_dirs, uid);

    let driver = match Driver::open() {
        Ok(d) => {
            let at = object_of(d.sym(c"cuInit"))
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "?".into());
            r.ok(
                "CUDA driver",
                format!("{} at {at}", driver_name().to_string_lossy()),
            );
            if !d.sym(c"vramcap_standin_devices").is_null() {
                r.note(
                    "CUDA driver",
                    "this is vramcap's stand-in driver (tests/standin), not NVIDIA's: no GPU is used and no figure below is a GPU's",
                );
            }
            Some(d)
        }
        Err(e) => {
            r.bad(
                "CUDA driver",
                format!("cannot load {}: {e}", driver_name().to_string_lossy()),
                "install the NVIDIA driver, or set VRAMCAP_CUDA_LIBRARY to the real libcuda.so.1",
            );
            None
        }
    };
    let mut gpu = false;
    if let Some(d) = &driver {
        let mut version: c_int = 0;
        type Version = unsafe extern "C" fn(*mut c_int) -> c_int;
        // SAFETY: cuDriverGetVersion(int*) in cuda.h.
        if let Some(f) = unsafe { d.func::<Version>(c"cuDriverGetVersion") } {
            // SAFETY: a valid out-pointer.
            unsafe { f(&mut version) };
        }
        match init_driver(d) {
            Ok(n) => {
                gpu = true;
                r.ok(
                    "driver reachable",
                    format!(
                        "CUDA {}.{}, {n} device(s)",
                        version / 1000,
                        version % 1000 / 10
                    ),
                );
            }
            Err(e) => r.note(
                "driver reachable",
                format!("no usable GPU here ({e}); the interposition check runs without one"),
            ),
        }
    }

    if let (Some(lib), Some(_)) = (&lib, &driver) {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("vramcap"));
        let out = Command::new(exe)
            .args(["doctor", "--probe"])
            .env("LD_PRELOAD", lib)
            .env("VRAMCAP_LIMIT", "1GiB")
            .env("VRAMCAP_STATS", "off")
            .env_remove("VRAMCAP_DISABLE")
            .env("VRAMCAP_PROBE_GPU", if gpu { "1" } else { "0" })
            .output();
        match out {
            Ok(o) if o.status.success() => {
                r.ok("interposition", String::from_utf8_lossy(&o.stdout).trim().replace('\n', "; "))
            }
            Ok(o) => r.bad(
                "interposition",
                format!(
                    "the check under the shim failed ({}): {}{}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout).trim().replace('\n', "; "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                "make sure LD_PRELOAD reaches the program (setuid programs ignore it) and that VRAMCAP_CUDA_LIBRARY, if set, is the driver the program loads; report a bug with `VRAMCAP_LOG=debug vramcap doctor` attached",
            ),
            Err(e) => r.bad("interposition", format!("cannot run the check: {e}"), "check that this binary can execute itself"),
        }
    }

    enforcement(&r, lib.as_deref(), settings.as_ref());

    if let Some(s) = settings.filter(|s| !s.limit.entries.is_empty()) {
        check_limit_keys(
            &mut r,
            &s,
            lib.as_deref().filter(|_| gpu && driver.is_some()),
        );
    }

    if r.problems == 0 {
        println!("no problems found");
        0
    } else {
        println!("{} problem(s) found", r.problems);
        1
    }
}

/// The first line the device plugin writes into a container's cap file.
const PLUGIN_MARK: &str = "# written by vramcap device-plugin";
/// The MPS control daemon's default pipe directory.
const MPS_PIPES: &str = "/tmp/nvidia-mps";

/// What LD_PRELOAD enforcement is and is not, and which of the things that
/// hold a cap against a program that tries to escape it are in force here
/// (docs/limitations.md, "What LD_PRELOAD enforcement is and is not").
fn enforcement(
    r: &Report,
    lib: Option<&Path>,
    settings: Option<&vramcap_core::settings::Settings>,
) {
    use vramcap_core::settings::{NVIDIA_LIMIT_VAR, OPERATOR_LIMIT_PATH};
    r.note(
        "enforcement",
        "LD_PRELOAD caps programs that do not try to escape it; a program that runs code of its own can open the driver's device files (/dev/nvidia*) itself and allocate uncapped. What holds against that is listed below (docs/limitations.md)",
    );
    let preload = Path::new(super::secure::LD_SO_PRELOAD);
    match lib {
        Some(lib) if super::secure::preload_names_shim(preload, lib) => r.ok(
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
    match (std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), daemon) {
        (Ok(v), true) => r.ok(
            "MPS pinned-memory limit",
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v:?} and an MPS control daemon at {where_}: the driver holds this process's GPU memory to it, on any driver, whatever the program calls"),
        ),
        (Ok(v), false) => r.note(
            "MPS pinned-memory limit",
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={v:?}, but no MPS control daemon at {where_}: it applies only to clients of a running MPS server"),
        ),
        (Err(_), true) => r.note(
            "MPS pinned-memory limit",
            format!("an MPS control daemon at {where_}, and no CUDA_MPS_PINNED_DEVICE_MEM_LIMIT here: only the daemon's default (set_default_device_pinned_mem_limit), if it set one, holds"),
        ),
        (Err(_), false) => r.note(
            "MPS pinned-memory limit",
            format!("not in force (no MPS control daemon at {where_}); with MPS the driver holds each client to its pinned-memory limit, on any driver"),
        ),
    }
    let mps = daemon && std::env::var_os("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").is_some();
    let version = super::machine::Inventory::open().and_then(|i| i.driver_version());
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

const KEYS: &str = "limit's devices";
const KEYS_FIX: &str = "name each device by its index as the process sees it (after CUDA_VISIBLE_DEVICES) or a prefix of its UUID, as `nvidia-smi -L` prints it";

/// Whether every device key of the environment's `VRAMCAP_LIMIT` names a
/// GPU: decided by the shim itself in a child when `lib` is given (a usable
/// GPU is there), else against NVML's list.
fn check_limit_keys(r: &mut Report, s: &vramcap_core::settings::Settings, lib: Option<&Path>) {
    let Some(lib) = lib else {
        match crate::cli::machine::check_limit_keys(&s.limit, &s.limit_text) {
            Ok(()) => r.note(
                KEYS,
                "without a usable GPU only NVML's list could be checked, and nothing in it contradicts them",
            ),
            Err(line) => r.bad(KEYS, line, KEYS_FIX),
        }
        return;
    };
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("vramcap"));
    let out = Command::new(exe)
        .args(["doctor", "--probe-limit"])
        .env("LD_PRELOAD", lib)
        .env("VRAMCAP_STATS", "off")
        .env_remove("VRAMCAP_DISABLE")
        .env_remove("VRAMCAP_GROUP")
        .output();
    match out {
        Ok(o) if o.status.success() => r.ok(KEYS, "every device key names a GPU"),
        Ok(o) => {
            // The shim's own line, without its "vramcap[PID]: " prefix.
            let stderr = String::from_utf8_lossy(&o.stderr);
            let line = stderr
                .lines()
                .rfind(|l| l.contains("VRAMCAP_LIMIT"))
                .map(|l| l.split_once("]: ").map_or(l, |(_, rest)| rest))
                .unwrap_or_else(|| stderr.trim())
                .to_string();
            r.bad(KEYS, format!("{line} ({})", o.status), KEYS_FIX)
        }
        Err(e) => r.bad(
            KEYS,
            format!("cannot run the check: {e}"),
            "check that this binary can execute itself",
        ),
    }
}

/// The child side of the key check, run under the shim with the
/// environment's limit: one call that needs a cap (`cuDeviceTotalMem_v2`
/// of device 0), at which the shim checks the keys and stops the process
/// with status 2 when one names no GPU.
pub fn probe_limit() -> u8 {
    let d = match Driver::open() {
        Ok(d) => d,
        Err(e) => {
            println!("cannot load the driver: {e}");
            return 1;
        }
    };
    if let Err(e) = init_driver(&d) {
        println!("driver init under the shim failed: {e}");
        return 1;
    }
    type Total = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
    let mut bytes = 0usize;
    // SAFETY: cuDeviceTotalMem_v2(size_t*, CUdevice) in cuda.h.
    let Some(total) = (unsafe { d.func::<Total>(c"cuDeviceTotalMem_v2") }) else {
        println!("the driver lacks cuDeviceTotalMem_v2");
        return 1;
    };
    // SAFETY: a valid out-pointer and device 0, which init_driver found.
    let rc = unsafe { total(&mut bytes, 0) };
    if rc != 0 {
        // The shim checks only once the driver has answered.
        println!("cuDeviceTotalMem_v2 returned {rc}; the keys were not checked");
        return 1;
    }
    println!("every device key names a GPU");
    0
}

/// The child side of the interposition check, run under the shim.
pub fn probe() -> u8 {
    let d = match Driver::open() {
        Ok(d) => d,
        Err(e) => {
            println!("cannot load the driver: {e}");
            return 1;
        }
    };
    let mut failed = false;
    let mut check = |what: &str, p: *const c_void| {
        let lib = object_of(p)
            .map(|p| file_name(&p))
            .unwrap_or_else(|| "nothing".into());
        let good = lib.starts_with("libvramcap");
        failed |= !good;
        println!(
            "{what} -> {lib}{}",
            if good {
                ""
            } else {
                " (expected libvramcap.so)"
            }
        );
    };
    let gpa = d.sym(c"cuGetProcAddress_v2");
    check("dlsym cuGetProcAddress_v2", gpa);
    check("dlsym cuMemAlloc_v2", d.sym(c"cuMemAlloc_v2"));
    if !gpa.is_null() {
        // SAFETY: the resolver has the CUDA 12+ signature GetProc.
        let gpa: GetProc = unsafe { std::mem::transmute::<*mut c_void, GetProc>(gpa) };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid name, out-pointer and a null status.
        unsafe {
            gpa(
                c"cuMemAlloc".as_ptr(),
                &mut p,
                3020,
                0,
                std::ptr::null_mut(),
            )
        };
        check("cuGetProcAddress cuMemAlloc@3020", p);
    }
    if std::env::var("VRAMCAP_PROBE_GPU").as_deref() == Ok("1") {
        match init_driver(&d) {
            Ok(_) => {
                let (mut free, mut total) = (0usize, 0usize);
                type Info = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
                // SAFETY: cuMemGetInfo_v2(size_t*, size_t*) in cuda.h.
                if let Some(f) = unsafe { d.func::<Info>(c"cuMemGetInfo_v2") } {
                    // SAFETY: valid out-pointers.
                    unsafe { f(&mut free, &mut total) };
                }
                let good = total == 1 << 30;
                failed |= !good;
                println!(
                    "cuMemGetInfo total under a 1 GiB cap -> {total}{}",
                    if good { "" } else { " (expected 1073741824)" }
                );
            }
            Err(e) => {
                failed = true;
                println!("driver init under the shim failed: {e}");
            }
        }
    }
    u8::from(failed)
}
