//! The two macros that turn a list of C signatures into everything the
//! boundary needs. Each function's signature is written once, in
//! `hooks.rs` (the hooked ones, and in its `calls` module the others the
//! engine calls); everything else is generated from it.
//!
//! - [`real_fns!`]: one module per function, `real::NAME`, with its typed
//!   [`Slot`](super::real::Slot) and `call(args)`, which calls the real
//!   function or answers the list's "missing" value when the library lacks
//!   it. No call site casts a pointer.
//! - [`hooks!`]: for each entry, the real function as above, plus
//!   - the `#[no_mangle]` export, which passes straight to the real
//!     function when the shim is disabled, passes parking's gate (CUDA
//!     exports, when parking is enabled) and otherwise runs the engine's
//!     handler inside the panic boundary (a panic answers the entry's
//!     `on panic` value), handing it the engine, any extra arguments from
//!     the entry, a closure that makes the real call with the caller's
//!     exact arguments, and those arguments;
//!   - a row of [`HOOKS`](super::hooks::HOOKS): the exported name, how
//!     `cuGetProcAddress` reaches it ([`Lookup`](crate::lookup::Lookup)),
//!     the export's address, the real function's slot and when it is
//!     handed out (always, or only under tiered spill or parking), from which the `dlsym` and `cuGetProcAddress`
//!     answers are made.
//!
//! An entry's flags, after its `on panic` value: `tiered` (handed out only
//! under tiered spill), `parking` (only with parking enabled), `blocks`
//! (only where the engine makes blocks: tiered spill, or parking by the
//! shim's moves; with `gate` and `Engine::pass_gate`, a driver call that
//! reads a block's mapping, exported so that a program linked with -lcuda
//! passes both gates), `gate` (a hook that passes tiered spill's gate:
//! the handler takes the engine, the entry's bracketed arguments, which may
//! name the caller's, and the real call; `Engine::pass_gate` takes none, a
//! launch the function and its parameters) and `known` (only with parking
//! enabled: a query or synchronisation whose answer is known while parked,
//! which parking's gate answers without resuming; the handler takes the
//! engine and the real call).

/// A `&'static CStr` of an identifier's text.
macro_rules! c_name {
    ($name:ident) => {
        match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
            Ok(c) => c,
            Err(_) => panic!("an identifier holds no NUL byte"),
        }
    };
}

/// Typed slots for library functions: `real_fns! { LIB, MISSING; fn NAME(ARGS) -> RET; … }`
/// where LIB is `new` (the CUDA driver) or `nvml`, and MISSING is returned
/// when the library lacks the function.
macro_rules! real_fns {
    ($lib:ident, $missing:expr; $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*) => {
        $( real_fns!(@one $lib, $missing, $name ($($arg: $ty),*) -> $ret); )*
    };
    (@one $lib:ident, $missing:expr, $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        #[allow(non_snake_case, dead_code)]
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;

            /// The function's C signature.
            pub type F = unsafe extern "C" fn($($ty),*) -> $ret;

            pub static SLOT: $crate::boundary::real::Slot<F> =
                $crate::boundary::real::Slot::new($crate::boundary::real::DynFn::$lib(c_name!($name)));

            /// Calls the real function, or answers "missing" without it.
            ///
            /// # Safety
            /// The function's own C contract.
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn call($($arg: $ty),*) -> $ret {
                match SLOT.get() {
                    // SAFETY: the caller keeps the function's contract.
                    Some(f) => unsafe { f($($arg),*) },
                    None => $missing,
                }
            }
        }
    };
}

/// The hooked functions; see the module docs and `hooks.rs`.
macro_rules! hooks {
    (
        $(
            $section:ident ($lib:ident, $missing:expr) {
                $(
                    $(#[$meta:meta])*
                    fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty,
                        $lookup:expr, on panic $panic:expr $(, $flag:ident)*
                        => $handler:path $([ $($extra:expr),* ])? ;
                )*
            }
        )*
    ) => {
        /// The real functions of the hooked names.
        pub mod real {
            #[allow(unused_imports)]
            use super::*;
            $( $( real_fns!(@one $lib, $missing, $name ($($arg: $ty),*) -> $ret); )* )*
        }

        $( $(
            $(#[$meta])*
            #[unsafe(no_mangle)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the caller's arguments go to the real function unchanged.
                let real = move || unsafe { real::$name::call($($arg),*) };
                if $crate::boundary::disabled() {
                    return real();
                }
                park_pass!($lib, _inside, $name, [$($flag)*]);
                $crate::boundary::boundary(stringify!($name), $panic, move || {
                    let engine = $crate::boundary::engine();
                    #[allow(unused_unsafe)]
                    // SAFETY: the handler's contract is this function's,
                    // which the caller keeps.
                    let answer = unsafe {
                        hook_call!([$($flag)*] $handler, engine, [$($($extra,)*)?], real, ($($arg),*))
                    };
                    answer
                })
            }
        )* )*

        /// Every hooked variant: the exports, the `dlsym` answers and the
        /// `cuGetProcAddress` answers all come from this one list.
        pub static HOOKS: &[$crate::boundary::entry::Hook] = &[
            $( $(
                $crate::boundary::entry::Hook {
                    name: c_name!($name),
                    lookup: $lookup,
                    hook: $name as *const ::std::ffi::c_void,
                    real: &real::$name::SLOT.raw,
                    only: only_flag!($($flag)*),
                },
            )* )*
        ];
    };
}

/// An export's first step when parking is enabled: the entry gate
/// (`process/gate.rs`), held as `$pass` for the call; a call that may
/// not proceed (the process cannot continue) answers the gate's code, for
/// an NVML export in NVML's terms.
/// NVML's exports pass it too: measured on the H200 (r580), an NVML call
/// in a checkpointed process waits for the restore, as a CUDA call does.
/// An entry flagged `known` (its answer is known while parked) passes
/// `gate::enter_known` instead, which answers a parked process's call
/// `CUDA_SUCCESS` without resuming it.
macro_rules! park_pass {
    (nvml, $pass:ident, $name:ident, [$($flag:ident)*]) => {
        // NVML's own codes (`gate::nvml_code`).
        let $pass = match $crate::process::gate::enter_as(stringify!($name)) {
            Ok(p) => p,
            Err(code) => return $crate::process::gate::nvml_code(code),
        };
    };
    ($lib:ident, $pass:ident, $name:ident, [$($flag:ident)*]) => {
        let $pass = match gate_enter!($name, [$($flag)*]) {
            Ok(p) => p,
            Err(code) => return code,
        };
    };
}

/// The gate an entry's flags choose: `known` entries `enter_known`, the
/// others `enter`.
macro_rules! gate_enter {
    ($name:ident, []) => {
        $crate::process::gate::enter_as(stringify!($name))
    };
    ($name:ident, [known $($rest:ident)*]) => {
        $crate::process::gate::enter_known()
    };
    ($name:ident, [$other:ident $($rest:ident)*]) => {
        gate_enter!($name, [$($rest)*])
    };
}

/// When an entry's hook is handed out, from its flags: `tiered`,
/// `parking` or `blocks` ([`Only`](super::entry::Only)), else always.
macro_rules! only_flag {
    () => {
        $crate::boundary::entry::Only::Always
    };
    (tiered $($rest:ident)*) => {
        $crate::boundary::entry::Only::Tiered
    };
    (parking $($rest:ident)*) => {
        $crate::boundary::entry::Only::Parking
    };
    (blocks $($rest:ident)*) => {
        $crate::boundary::entry::Only::Blocks
    };
    (known $($rest:ident)*) => {
        $crate::boundary::entry::Only::Parking
    };
    ($other:ident $($rest:ident)*) => {
        only_flag!($($rest)*)
    };
}

/// The call of an entry's handler: with the engine, the entry's extra
/// arguments, the real call and the caller's arguments; or, for an entry
/// flagged `gate` (a hook that only passes tiered spill's gate, whatever its
/// arguments), with the engine and the real call only.
macro_rules! hook_call {
    ([] $h:path, $e:ident, [$($x:expr,)*], $r:ident, ($($a:ident),*)) => {
        $h($e, $($x,)* $r, $($a),*)
    };
    ([gate $($rest:ident)*] $h:path, $e:ident, [$($x:expr,)*], $r:ident, ($($a:ident),*)) => {
        $h($e, $($x,)* $r)
    };
    ([known $($rest:ident)*] $h:path, $e:ident, [$($x:expr,)*], $r:ident, ($($a:ident),*)) => {
        $h($e, $($x,)* $r)
    };
    ([$other:ident $($rest:ident)*] $($tail:tt)*) => {
        hook_call!([$($rest)*] $($tail)*)
    };
}

pub(crate) use {c_name, gate_enter, hook_call, hooks, only_flag, park_pass, real_fns};
