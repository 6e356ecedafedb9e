//! The boundary: everything C sees. The exports (generated from the one
//! list in `hooks.rs`), the program's own C ABI (`abi.rs`), the `dlsym`
//! trampoline, the `cuGetProcAddress*`
//! and `dlsym` answers, the forwarders handed out for the driver's other
//! functions when parking is enabled (`forward.rs`; the driver's export
//! tables are pointed at them in place, `export_table.rs`), the real
//! libraries' functions, the settings read once, the process's engine,
//! and the panic boundary around every hook.
//!
//! A call travels: export (`hooks!`) → [`disabled`]? → real function;
//! else [`boundary`] → the engine's handler, with a closure for the real
//! call → engine → [`RealDriver`] for any other driver function it needs.

pub mod abi;
mod allocs;
mod dlsym;
mod driver;
mod entry;
mod export_table;
pub mod forward;
mod graph_walk;
pub mod hooks;
mod loader;
mod macros;
mod park;
mod queries;
pub mod real;
mod resolve;

use std::panic::AssertUnwindSafe;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use vramcap_core::settings::Settings;

pub use self::driver::RealDriver;
use crate::engine::Engine;
use crate::log::log_once;

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// `VRAMCAP_DISABLE=1`: every hook passes straight through.
static DISABLED: AtomicBool = AtomicBool::new(false);

/// Reads the settings once. A bad value stops the process with status 2 and
/// one line naming the variable, so a program never runs uncapped by mistake;
/// a `VRAMCAP_*` name that is no setting (`VRAMCAP_LIMT`, `vramcap_limit`)
/// gets a warning naming the closest one. In a secure-execution process
/// the environment is not read at all ([`secure_execution`]).
pub fn settings() -> &'static Settings {
    SETTINGS.get_or_init(init_settings)
}

/// [`settings`]' first call: reads them (from the environment unless the
/// process is in secure-execution mode) and sets what follows from them.
#[cold]
fn init_settings() -> Settings {
    let secure = secure_execution();
    let read = match secure {
        true => Ok(Settings::for_secure_execution()),
        false => Settings::from_env(),
    };
    match read.and_then(with_operator) {
        Ok(s) => {
            crate::log::set_level(s.log);
            DISABLED.store(s.disabled, Ordering::Relaxed);
            crate::process::gate::enable(s.park.is_some() && !s.disabled);
            crate::process::gate::set_driver_live(
                s.park_move == vramcap_core::park::ParkMove::Shim,
            );
            real::set_driver_path(s.cuda_library.as_deref());
            if secure {
                crate::log::log_at!(
                    Debug,
                    "secure-execution process (set-user-ID, set-group-ID or file capabilities): the environment's settings are ignored; the cap is {} and no statistics page is kept",
                    match s.operator {
                        Some(_) => "the operator's file's (/run/vramcap/operator-limit)",
                        None => "none (no operator's file at /run/vramcap/operator-limit)",
                    }
                );
            } else {
                for unknown in vramcap_core::settings::unknown_vars_in_env() {
                    crate::log::log_at!(Warn, "{unknown}");
                }
            }
            // Never uncapped silently: the switch over a cap is told at
            // the default level (the operator's cap has cleared it already).
            if let Some(line) = s.disabled_over_cap() {
                crate::log::log_at!(Warn, "{line}");
            }
            // The removed managed mode (docs/design/spill-modes.md).
            if let Some(line) = s.managed_as_host() {
                crate::log::log_at!(Warn, "{line}");
            }
            s
        }
        Err(e) => {
            crate::log::write_line(format_args!("{e}"));
            // SAFETY: _exit has no preconditions; no cleanup may run in a
            // half-initialised process.
            unsafe { libc::_exit(2) }
        }
    }
}

/// Adds the operator's cap (`OPERATOR_LIMIT_PATH`) to the settings: a root
/// file that is no cap stops the process like a bad variable; one that is
/// not root's is warned about and ignored (it could only have made caps
/// stricter). With an operator's cap, nothing in the environment may make
/// the shim count less or stand aside: `VRAMCAP_DISABLE=1` and
/// `VRAMCAP_COUNT=allocations` are ignored, with a warning.
fn with_operator(mut s: Settings) -> Result<Settings, vramcap_core::settings::SettingsError> {
    use vramcap_core::settings::{
        ContextCharge, Counting, OPERATOR_LIMIT_PATH, OperatorError, SettingsError,
        read_operator_limit,
    };
    match read_operator_limit(std::path::Path::new(OPERATOR_LIMIT_PATH)) {
        Ok(None) => {}
        Ok(Some(spec)) => {
            if s.disabled {
                crate::log::write_line(format_args!(
                    "VRAMCAP_DISABLE=1 is ignored: the operator's cap ({OPERATOR_LIMIT_PATH}) applies"
                ));
                s.disabled = false;
            }
            if s.counting == Counting::Allocations {
                crate::log::write_line(format_args!(
                    "VRAMCAP_COUNT=allocations is ignored: under the operator's cap ({OPERATOR_LIMIT_PATH}) everything held is counted"
                ));
                s.counting = Counting::Held;
            }
            if let ContextCharge::Bytes(_) = s.context {
                crate::log::write_line(format_args!(
                    "VRAMCAP_CONTEXT is ignored: under the operator's cap ({OPERATOR_LIMIT_PATH}) the context is measured"
                ));
                s.context = ContextCharge::Auto;
            }
            if s.cuda_library.is_some() {
                crate::log::write_line(format_args!(
                    "VRAMCAP_CUDA_LIBRARY is ignored: under the operator's cap ({OPERATOR_LIMIT_PATH}) the shim caps the driver the program loads"
                ));
                s.cuda_library = None;
            }
            s.operator = Some(spec);
        }
        Err(OperatorError::Unusable(why)) => {
            crate::log::write_line(format_args!("ignoring the operator's cap: {why}"));
        }
        Err(OperatorError::Bad(why)) => return Err(SettingsError::Operator(why)),
    }
    Ok(s)
}

pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// Runs a hook body; a panic is caught (it must never unwind into C), logged
/// once, and answered with `on_panic`.
pub fn boundary<R>(name: &'static str, on_panic: R, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            log_once!(
                Error,
                "internal error in the {name} hook; answering conservatively (please report this)"
            );
            on_panic
        }
    }
}

/// The process's engine (a child after fork gets a fresh one).
static ENGINE: AtomicPtr<Engine<RealDriver>> = AtomicPtr::new(ptr::null_mut());

/// The process's engine, made on first use.
pub fn engine() -> &'static Engine<RealDriver> {
    let p = ENGINE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published engine is leaked, never freed.
        return unsafe { &*p };
    }
    make_engine()
}

#[cold]
fn make_engine() -> &'static Engine<RealDriver> {
    let fresh = Box::into_raw(Box::new(Engine::new(RealDriver, settings())));
    match ENGINE.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published; leaked for good.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never shared (and made nothing outside
            // itself: its page and membership are made on first use);
            // `existing` is leaked for good.
            unsafe {
                drop(Box::from_raw(fresh));
                &*existing
            }
        }
    }
}

/// The engine if one was made (for exit, which must not make one).
fn existing_engine() -> Option<&'static Engine<RealDriver>> {
    let p = ENGINE.load(Ordering::Acquire);
    // SAFETY: a published engine is leaked, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The `atfork` child handler: the parent's engine is left alone (another
/// parent thread may have held one of its locks at the fork) but for its
/// descriptors; the child's first hook makes a new one.
extern "C" fn after_fork_in_child() {
    if let Some(e) = existing_engine() {
        e.forget_after_fork();
    }
    ENGINE.store(ptr::null_mut(), Ordering::Release);
    crate::process::reset_after_fork();
}

/// Whether this process is the nvidia-smi a resume runs (the setting
/// `VRAMCAP_FREE_PROBE`; never in a secure-execution process, whose
/// environment is not read).
pub fn is_free_probe() -> bool {
    settings().free_probe
}

/// Whether the loader runs this process in secure-execution mode
/// (`AT_SECURE`: set-user-ID, set-group-ID, file capabilities, as under
/// `/etc/ld.so.preload`): its environment is the invoking user's, and
/// nothing in it is trusted (no setting, no path, no switch).
pub fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Called by the constructor: reads and checks the settings (exiting with
/// status 2 on a bad value) and registers the fork handler.
pub fn init() -> &'static Settings {
    let s = settings();
    // SAFETY: registering a handler with no prepare/parent parts is always valid.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    s
}

/// Called by the destructor at normal exit.
pub fn fini() {
    if let Some(e) = existing_engine() {
        e.at_exit();
    }
}

/// Whether any cap is in force or was asked for (a limit, NVIDIA's
/// variable, the operator's file, a group, or a cap set while running):
/// then nothing may bypass the hooks (`resolve.rs`, `loader.rs`).
fn capping_asked() -> bool {
    let s = settings();
    !s.limit.is_unlimited()
        || s.nvidia_limit.is_some()
        || s.operator.is_some()
        || s.group.is_some()
        || crate::engine::CAPPED_WHILE_RUNNING.load(std::sync::atomic::Ordering::Relaxed)
}
