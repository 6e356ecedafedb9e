//! `libvramcap.so`: an `LD_PRELOAD` library that sits between CUDA programs
//! and the driver (`libcuda.so.1`) and holds a per-GPU memory cap.
//!
//! # Layers (ARCHITECTURE.md has the whole map)
//! - [`boundary`]: everything C sees. The exports, generated with the typed
//!   real functions and the lookup table from one list (`boundary/hooks.rs`),
//!   the `dlsym` trampoline, the `cuGetProcAddress*` and `dlsym` answers,
//!   settings, the panic boundary, fork.
//! - [`engine`]: what the shim decides, in plain Rust with a driver trait:
//!   the cap, the cache, spill, groups, records, the statistics page.
//! - [`lookup`]: which hooked variant a `cuGetProcAddress` request is for.
//! - `log`: lock-free, allocation-free logging, used by all of them.
//! - `vramcap_core` (another crate): layouts, grammars and budgets shared
//!   with the CLI.
//!
//! Imports go boundary → engine → core, never back.
//!
//! # How calls reach the shim
//! - Programs linked with `-lcuda` bind the exported `cu*` names here first.
//! - Programs that `dlopen` the driver and `dlsym` names from its handle
//!   (XLA, CuPy, cudarc) reach the exported `dlsym`, which asks glibc, and
//!   answers with the hook when glibc found the driver's own symbol of a
//!   hooked name.
//! - The CUDA runtime, static or shared, `dlsym`s `cuGetProcAddress_v2` and
//!   then resolves everything, itself included, through it; the hooked
//!   resolvers call the real one with the caller's exact arguments and swap
//!   in a hook only for the exact variant the driver returned.
//! - `dlsym(RTLD_DEFAULT/RTLD_NEXT, …)` is not ours to answer and depends on
//!   the caller's address, so the exported `dlsym` is a trampoline that jumps
//!   (not calls) to glibc for those handles: glibc sees the real caller.

// The exported functions are C entry points whose safety contract is the
// CUDA or glibc documentation of the function of the same name; the
// engine's handlers share the contract of the function they handle.
#![allow(clippy::missing_safety_doc)]

mod boundary;
mod engine;
mod ffi;
mod log;
mod lookup;
mod process;

use crate::log::log_at;

/// Runs before the program's `main` (and before constructors of libraries
/// loaded after the shim): reads and checks the settings, exiting with status
/// 2 on a bad value, and registers the fork handler.
#[ctor::ctor]
unsafe fn init() {
    let s = boundary::init();
    log_at!(
        Debug,
        "loaded; limit: {}; log level {}; driver {:?}{}",
        s.limit,
        s.log.name(),
        boundary::real::driver_path(),
        if s.disabled { "; DISABLED" } else { "" }
    );
}

/// Runs at normal exit: leaves the group and removes the statistics page.
#[ctor::dtor]
unsafe fn fini() {
    boundary::fini();
}

/// The layers stay layers: the engine never imports the boundary. (That no
/// module imports another in a circle is `tests/layout.rs`'s check, for
/// every crate.)
#[cfg(test)]
mod layering {
    use std::path::Path;

    fn visit(dir: &Path, seen: &mut usize) {
        for entry in std::fs::read_dir(dir).expect("a readable directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                visit(&path, seen);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            assert!(
                !text.contains("crate::boundary"),
                "{} imports the boundary layer",
                path.display()
            );
            *seen += 1;
        }
    }

    #[test]
    fn the_engine_never_imports_the_boundary() {
        let mut seen = 0;
        visit(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine"),
            &mut seen,
        );
        assert!(seen > 10, "the engine's files were not found ({seen})");
    }
}
