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

mod driver;
mod enforcement;
mod environment;
mod probe;

use std::ffi::c_int;
use std::path::PathBuf;
use std::process::Command;

use super::stat::StatsDirs;
use driver::{Driver, driver_name, init_driver, object_of};
use enforcement::enforcement;
use environment::{check_limit_keys, stats_dirs_report};
pub use probe::{probe, probe_limit};

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
            if let Some(line) = s.managed_as_host() {
                r.note("spill", line);
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
                    {
                        r.note(
                            "operator's cap",
                            "under it the shim ignores VRAMCAP_DISABLE, VRAMCAP_COUNT=allocations, VRAMCAP_CONTEXT and VRAMCAP_CUDA_LIBRARY: what this environment sets of them does not apply",
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
