//! One row of the hook list ([`HOOKS`](super::hooks::HOOKS)), the type the
//! list (`hooks.rs`) and its readers (`resolve.rs`, `dlsym.rs`) share, so
//! that the readers take the list as a value and import nothing of it.

use std::ffi::{CStr, c_void};

use super::real::DynFn;
use crate::lookup::Lookup;

/// One hooked variant.
pub struct Hook {
    /// The exact exported name, which is also the variant's name in the driver.
    pub name: &'static CStr,
    pub lookup: Lookup,
    /// The export.
    pub hook: *const c_void,
    /// The library's own function of the same name.
    pub real: &'static DynFn,
    /// When the hook is handed out (the entry's `tiered` or `parking`
    /// flag, `resolve.rs`); otherwise the program gets the driver's own
    /// function and pays nothing.
    pub only: Only,
}

/// When a hook is handed out by `dlsym` and `cuGetProcAddress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    /// Always (no flag).
    Always,
    /// Only under `VRAMCAP_SPILL=tiered` (flag `tiered`).
    Tiered,
    /// Only with parking enabled, `VRAMCAP_PARK` (flag `parking`).
    Parking,
    /// Only where the engine makes blocks of the program's memory, whose
    /// handles it answers itself and whose mappings come and go: under
    /// `VRAMCAP_SPILL=tiered`, and with parking by the shim's moves (flag
    /// `blocks`).
    Blocks,
}

// SAFETY: the raw pointer is a function address, immutable and valid forever.
unsafe impl Sync for Hook {}
