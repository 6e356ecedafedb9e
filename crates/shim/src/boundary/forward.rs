//! The forwarders: with parking enabled (`VRAMCAP_PARK`), every driver
//! function the program looks up that is not a hook (`dlsym` on the driver,
//! `cuGetProcAddress*`, `resolve.rs`) is handed out as a trampoline that
//! passes the parking gate first, so that a parked process's next driver
//! call, whichever it is, can wait for (and ask for) the resume before the
//! driver's checkpoint lock blocks it. Without parking nothing here is used
//! and the program gets the driver's own pointers.
//!
//! - **The table** ([`SLOTS`] entries, made by the assembler at compile
//!   time, x86_64 only): entry `i` is 32 bytes at `vramcap_forwarders +
//!   32 i`. Its fast path loads the gate word and the activity flag and
//!   jumps through `TARGETS[i]`: the caller's frame and every register
//!   untouched. A closed gate (word not 0) or a clear flag (once per
//!   worker tick) calls the slow path, which saves the argument registers
//!   (`rdi rsi rdx rcx r8 r9`, `rax` for varargs, `xmm0`–`xmm7`; the stack
//!   kept 16-byte aligned), calls [`forward_wait`] (the gate: waits while
//!   parked, records activity), restores them and jumps to the target, or
//!   returns the gate's error as the call's answer (a failed restore).
//!   Arguments on the stack are never moved.
//! - **The slots**: `TARGETS` is an open-addressed table keyed by the real
//!   function's address, which is also what the entry jumps to. A slot is
//!   taken by one compare-and-swap from null and never given back, so the
//!   same function always gets the same forwarder, from either lookup and
//!   any thread (pointer identity across lookups holds exactly when it
//!   held for the driver's own pointers), with no lock and no allocation.
//!   Keyed by the function, not the name: one base name is several
//!   functions across versions and stream flavours.
//! - **Table full**: the real pointer is handed out and one warning names
//!   the function that is not gated.
//! - **Export-table slots** ([`dark_forwarder`], `export_table.rs`): the
//!   last [`DARK_SLOTS`] entries, a range of their own (a driver function
//!   both in a table and handed out by name gets one forwarder in each, so
//!   the public one keeps its answers), tagged with their table and index
//!   in [`DARK`]. Their functions' signatures are unknown (some return
//!   nothing), so the gate only waits for them, except at exit while
//!   parked, where they answer `CUDA_ERROR_DEINITIALIZED` as the shut-down
//!   driver's do.
//! - **Names** ([`NAMES`]): what a slot was first handed out as, set once
//!   when it is taken (the lookup path, which may allocate), read only by
//!   the slow path, so that the log names the call that resumed a parked
//!   process (issue 43: what wakes an idle JAX process).
//!
//! Other architectures have no table: [`forwarders_available`] is false
//! and parking is refused there.

use std::ffi::{CStr, c_void};
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crate::log::{log_at, log_once};
use crate::process::gate;

/// How many functions can be forwarded. cudart resolves its whole table of
/// driver functions (several hundred, the stream functions twice) and
/// frameworks add their own; a slot costs 40 bytes.
pub const PUBLIC_SLOTS: usize = 2048;
/// How many export-table functions can be forwarded (seven tables of 75
/// functions in all in a PyTorch process on the H200).
pub const DARK_SLOTS: usize = 256;
/// Every entry of the table: the public ones, then the export tables'.
pub const SLOTS: usize = PUBLIC_SLOTS + DARK_SLOTS;

/// Each entry's size in the table (a power of two: the assembly aligns to it).
const ENTRY_BYTES: usize = 32;

/// The real function of each slot; null while the slot is free.
static TARGETS: [AtomicPtr<c_void>; SLOTS] = [const { AtomicPtr::new(ptr::null_mut()) }; SLOTS];

/// Per slot, 0, or for a function of an export table `1 << 63 | table << 16
/// | index` (`table`: the first four bytes of its GUID), or [`NVML_TAG`]
/// for an NVML function.
static DARK: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Per slot, what the log calls its function when a call of it asks a
/// parked process to resume: the name it was first looked up under, or
/// its export table and index.
static NAMES: [OnceLock<Box<str>>; SLOTS] = [const { OnceLock::new() }; SLOTS];

/// Per slot, whether its function needs nothing of the GPU's memory
/// ([`is_quiet`]): with the driver left usable by the park, a call of it
/// neither waits at the gate nor resumes the process
/// ([`gate::pass_quiet`]).
static QUIET: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];

/// Whether the driver function `name` (as looked up: a version or stream
/// suffix is ignored) reads or changes nothing of the GPU's memory or
/// work: queries of contexts, devices, streams and functions, the
/// current context's changes, occupancy arithmetic and lookups in loaded
/// modules. Pointer queries are not among them: a parked block's address
/// has nothing mapped behind it.
pub fn is_quiet(name: &[u8]) -> bool {
    let base = match name.iter().position(|&c| c == b'_') {
        Some(i) => &name[..i],
        None => name,
    };
    const EXACT: &[&[u8]] = &[
        b"cuInit",
        b"cuDriverGetVersion",
        b"cuCtxSetCurrent",
        b"cuCtxPushCurrent",
        b"cuCtxPopCurrent",
        b"cuDeviceComputeCapability",
        b"cuDeviceTotalMem",
        b"cuDevicePrimaryCtxGetState",
        b"cuDeviceCanAccessPeer",
        b"cuModuleGetFunction",
        // A capture cannot begin while parked (its begin passes the gate).
        b"cuStreamIsCapturing",
    ];
    const PREFIX: &[&[u8]] = &[
        b"cuCtxGet",
        b"cuDeviceGet",
        b"cuStreamGet",
        b"cuFuncGet",
        b"cuKernelGet",
        b"cuGetError",
        b"cuOccupancy",
        b"cuLibraryGet",
    ];
    EXACT.contains(&base) || PREFIX.iter().any(|p| base.starts_with(p))
}

/// [`DARK`]'s tag of a public slot holding an NVML function: a gate that
/// cannot let it through answers NVML's codes, not CUDA's
/// ([`gate::nvml_code`]).
const NVML_TAG: u64 = 1 << 62;

/// Whether this build has forwarders (x86_64); parking needs them.
pub const fn forwarders_available() -> bool {
    cfg!(target_arch = "x86_64")
}

/// Whether parking, and so the forwarders, are enabled in this process.
pub fn parking_enabled() -> bool {
    forwarders_available() && gate::enabled()
}

/// What the program gets for the driver's function `real` (found under
/// `name`): its forwarder when parking is enabled, else `real` itself.
pub fn forwarder(name: &CStr, real: *mut c_void) -> *mut c_void {
    if real.is_null() || !forwarders_available() || !gate::enabled() || is_forwarder(real) {
        return real;
    }
    match slot_of(real) {
        Some(i) => {
            if name.to_bytes().starts_with(b"nvml") {
                let _ = DARK[i].compare_exchange(0, NVML_TAG, Ordering::Relaxed, Ordering::Relaxed);
            }
            NAMES[i].get_or_init(|| {
                format!("{}, which the shim only forwards,", name.to_string_lossy()).into()
            });
            if is_quiet(name.to_bytes()) {
                QUIET[i].store(true, Ordering::Relaxed);
            }
            entry(i)
        }
        None => {
            log_once!(
                Warn,
                "the {PUBLIC_SLOTS} forwarders are all taken; {name:?} is handed out ungated: a call to it while this process is parked waits inside the driver until `vramcap resume`"
            );
            real
        }
    }
}

/// The forwarder of slot `index` of the export table `table` (the first
/// four bytes of its GUID) holding `real`, a function of the driver; `None`
/// when the table of forwarders is full (said once).
pub fn dark_forwarder(real: *mut c_void, table: u32, index: u32) -> Option<*mut c_void> {
    if !forwarders_available() {
        return None;
    }
    let Some(i) = slot_in(&TARGETS[PUBLIC_SLOTS..], real).map(|i| PUBLIC_SLOTS + i) else {
        log_once!(
            Warn,
            "the {DARK_SLOTS} forwarders of export tables are all taken; export table {table:08x} is not gated: a call through it while this process is parked waits inside the driver until `vramcap resume`"
        );
        return None;
    };
    let tag = 1 << 63 | u64::from(table) << 16 | u64::from(index & 0xffff);
    let _ = DARK[i].compare_exchange(0, tag, Ordering::Relaxed, Ordering::Relaxed);
    NAMES[i].get_or_init(|| {
        format!("function {index} of the driver's export table {table:08x}").into()
    });
    Some(entry(i))
}

/// The public slot of `real` in the table.
fn slot_of(real: *mut c_void) -> Option<usize> {
    slot_in(&TARGETS[..PUBLIC_SLOTS], real)
}

/// The slot of `real` in `targets` (a power of two long): the one that
/// holds it, else the first free one on its probe sequence, taken; `None`
/// when every slot holds another. Slots are never freed, so a function
/// found once is found at the same slot by every later probe (nothing on
/// its sequence before it empties).
fn slot_in(targets: &[AtomicPtr<c_void>], real: *mut c_void) -> Option<usize> {
    let n = targets.len();
    let start = hash(real as usize, n);
    for k in 0..n {
        let i = (start + k) % n;
        let held = targets[i].load(Ordering::Acquire);
        if held == real {
            return Some(i);
        }
        if held.is_null() {
            match targets[i].compare_exchange(
                ptr::null_mut(),
                real,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(i),
                Err(other) if other == real => return Some(i),
                Err(_) => {}
            }
        }
    }
    None
}

/// Where an address starts its probe in a table of `n` (a power of two)
/// slots: Fibonacci hashing of the address without its alignment bits.
fn hash(addr: usize, n: usize) -> usize {
    let bits = n.trailing_zeros();
    if bits == 0 {
        return 0;
    }
    ((addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

/// Whether `p` is one of the forwarders (never forwarded again).
pub fn is_forwarder(p: *const c_void) -> bool {
    let base = table_base() as usize;
    let a = p as usize;
    a >= base && a < base + SLOTS * ENTRY_BYTES && (a - base).is_multiple_of(ENTRY_BYTES)
}

/// The forwarder of slot `i`.
fn entry(i: usize) -> *mut c_void {
    table_base().wrapping_add(i * ENTRY_BYTES).cast_mut().cast()
}

/// The gate's slow path, called by a forwarder whose gate word was not 0
/// or whose activity flag was clear: 0 to go on to the target, else the
/// answer the call returns instead (the process cannot continue). Never
/// unwinds into the trampoline.
extern "C" fn forward_wait(slot: u32) -> u32 {
    if QUIET
        .get(slot as usize)
        .is_some_and(|q| q.load(Ordering::Relaxed))
        && let Some(answer) = gate::pass_quiet()
    {
        return answer as u32;
    }
    let tag = DARK
        .get(slot as usize)
        .map_or(0, |d| d.load(Ordering::Relaxed));
    let nvml = tag == NVML_TAG;
    let dark = if nvml { 0 } else { tag };
    let answer = super::boundary("forwarder", 0, || {
        if gate::GATE.load(Ordering::Relaxed) != gate::RUNNING {
            log_at!(Debug, "parking: a forwarded call waits at the gate");
            if dark != 0 {
                log_at!(
                    Debug,
                    "parking: a call through export table {:08x} slot {} waits for the resume",
                    (dark >> 16) as u32,
                    dark & 0xffff
                );
            }
        }
        let who = NAMES
            .get(slot as usize)
            .and_then(OnceLock::get)
            .map_or("an unhooked driver function", |n| &**n);
        gate::gate_as(who) as u32
    });
    // An export table's function answers itself (its signature is
    // unknown): the gate only made it wait. At exit while parked it can
    // neither wait (nothing resumes the process) nor safely enter the
    // driver (whose lock may hold it for good): it answers
    // CUDA_ERROR_DEINITIALIZED, as the driver's own functions do once the
    // driver has shut down at exit, which the runtime expects there.
    let answer = if dark != 0 && answer != gate::CUDA_ERROR_DEINITIALIZED as u32 {
        0
    } else if nvml && answer != 0 {
        // NVML's callers read NVML's codes (pynvml turns one into a
        // message through nvmlErrorString).
        gate::nvml_code(answer as i32) as u32
    } else {
        answer
    };
    #[cfg(test)]
    scramble();
    answer
}

/// Unit tests only: overwrites every register the slow path must restore,
/// so that a missing restore fails the tests instead of passing by luck.
#[cfg(all(test, target_arch = "x86_64"))]
fn scramble() {
    // SAFETY: writes only the registers it declares clobbered.
    unsafe {
        core::arch::asm!(
            "mov rdi, -1", "mov rsi, -1", "mov rdx, -1", "mov rcx, -1",
            "mov r8, -1", "mov r9, -1", "mov rax, -1", "mov r11, -1",
            "pcmpeqd xmm0, xmm0", "pcmpeqd xmm1, xmm1", "pcmpeqd xmm2, xmm2",
            "pcmpeqd xmm3, xmm3", "pcmpeqd xmm4, xmm4", "pcmpeqd xmm5, xmm5",
            "pcmpeqd xmm6, xmm6", "pcmpeqd xmm7, xmm7",
            out("rdi") _, out("rsi") _, out("rdx") _, out("rcx") _,
            out("r8") _, out("r9") _, out("rax") _, out("r11") _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
        );
    }
}

#[cfg(target_arch = "x86_64")]
fn table_base() -> *const u8 {
    unsafe extern "C" {
        /// The first entry of the table made below.
        static vramcap_forwarders: u8;
    }
    // Only the address is taken; the symbol is defined below.
    &raw const vramcap_forwarders
}

#[cfg(not(target_arch = "x86_64"))]
fn table_base() -> *const u8 {
    ptr::null()
}

// The table: SLOTS entries of ENTRY_BYTES, each "gate open and activity
// recorded? jump to the target : call the slow path", then the shared slow
// path, which finds the entry's index from the return address its call
// pushed. The symbols are hidden: nothing outside the library sees them.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.vramcap_forwarders,\"ax\",@progbits",
    ".balign 32",
    ".globl vramcap_forwarders",
    ".hidden vramcap_forwarders",
    "vramcap_forwarders:",
    ".set vramcap_fwd_i, 0",
    ".rept {slots}",
    "cmp dword ptr [rip + {gate}], 0",
    "jne 2f",
    "cmp byte ptr [rip + {active}], 0",
    "je 2f",
    "jmp qword ptr [rip + {targets} + 8 * vramcap_fwd_i]",
    "2:",
    "call vramcap_forward_slow",
    ".balign 32, 0xcc",
    ".set vramcap_fwd_i, vramcap_fwd_i + 1",
    ".endr",
    // The return address names the entry; popped, the stack is the
    // caller's again: rsp 8 past a 16-byte boundary, so 200 bytes of
    // saves put it on one for our call.
    "vramcap_forward_slow:",
    "pop r11",
    "lea r10, [rip + vramcap_forwarders]",
    "sub r11, r10",
    "shr r11, 5",
    "sub rsp, 200",
    "mov qword ptr [rsp], rdi",
    "mov qword ptr [rsp + 8], rsi",
    "mov qword ptr [rsp + 16], rdx",
    "mov qword ptr [rsp + 24], rcx",
    "mov qword ptr [rsp + 32], r8",
    "mov qword ptr [rsp + 40], r9",
    "mov qword ptr [rsp + 48], rax",
    "mov qword ptr [rsp + 56], r11",
    "movaps xmmword ptr [rsp + 64], xmm0",
    "movaps xmmword ptr [rsp + 80], xmm1",
    "movaps xmmword ptr [rsp + 96], xmm2",
    "movaps xmmword ptr [rsp + 112], xmm3",
    "movaps xmmword ptr [rsp + 128], xmm4",
    "movaps xmmword ptr [rsp + 144], xmm5",
    "movaps xmmword ptr [rsp + 160], xmm6",
    "movaps xmmword ptr [rsp + 176], xmm7",
    "mov edi, r11d",
    "call {wait}",
    "test eax, eax",
    "jnz 3f",
    "movaps xmm0, xmmword ptr [rsp + 64]",
    "movaps xmm1, xmmword ptr [rsp + 80]",
    "movaps xmm2, xmmword ptr [rsp + 96]",
    "movaps xmm3, xmmword ptr [rsp + 112]",
    "movaps xmm4, xmmword ptr [rsp + 128]",
    "movaps xmm5, xmmword ptr [rsp + 144]",
    "movaps xmm6, xmmword ptr [rsp + 160]",
    "movaps xmm7, xmmword ptr [rsp + 176]",
    "mov rdi, qword ptr [rsp]",
    "mov rsi, qword ptr [rsp + 8]",
    "mov rdx, qword ptr [rsp + 16]",
    "mov rcx, qword ptr [rsp + 24]",
    "mov r8, qword ptr [rsp + 32]",
    "mov r9, qword ptr [rsp + 40]",
    "mov rax, qword ptr [rsp + 48]",
    "mov r11, qword ptr [rsp + 56]",
    "add rsp, 200",
    "lea r10, [rip + {targets}]",
    "jmp qword ptr [r10 + 8 * r11]",
    // The gate's answer is the call's: straight back to the caller.
    "3:",
    "add rsp, 200",
    "ret",
    ".popsection",
    slots = const SLOTS,
    gate = sym gate::GATE,
    active = sym gate::ACTIVE,
    targets = sym TARGETS,
    wait = sym forward_wait,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_function_gets_the_same_slot_and_others_another() {
        let a = 0x7f00_1234_5670usize as *mut c_void;
        let b = 0x7f00_1234_5680usize as *mut c_void;
        let sa = slot_of(a).expect("a free slot");
        let sb = slot_of(b).expect("a free slot");
        assert_ne!(sa, sb);
        assert_eq!(slot_of(a), Some(sa));
        assert_eq!(slot_of(b), Some(sb));
        assert!(is_forwarder(entry(sa)));
        assert!(!is_forwarder(entry(sa).cast::<u8>().wrapping_add(1).cast()));
    }

    #[test]
    fn a_function_in_an_export_table_and_handed_out_by_name_gets_two_forwarders() {
        let f = 0x7f00_4321_0a00usize as *mut c_void;
        let dark = dark_forwarder(f, 0x6bd5_fb6c, 2).expect("a free export-table slot");
        let public = entry(slot_of(f).expect("a free slot"));
        assert_ne!(dark, public);
        let i = |e: *mut c_void| (e as usize - table_base() as usize) / ENTRY_BYTES;
        assert!(i(dark) >= PUBLIC_SLOTS && i(public) < PUBLIC_SLOTS);
        assert_eq!(
            DARK[i(public)].load(Ordering::Relaxed),
            0,
            "the public one keeps its answers"
        );
        assert_eq!(
            DARK[i(dark)].load(Ordering::Relaxed),
            1 << 63 | 0x6bd5_fb6c << 16 | 2
        );
        assert_eq!(dark_forwarder(f, 0x6bd5_fb6c, 2), Some(dark));
    }

    fn table(n: usize) -> Vec<AtomicPtr<c_void>> {
        (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect()
    }

    #[test]
    fn a_full_table_answers_none_and_keeps_what_it_holds() {
        let t = table(4);
        let f = |a: usize| a as *mut c_void;
        let slots: Vec<_> = (1..=4).map(|a| slot_in(&t, f(a << 12))).collect();
        assert!(slots.iter().all(Option::is_some));
        let mut distinct = slots.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4);
        assert_eq!(slot_in(&t, f(5 << 12)), None, "the table is full");
        for (a, s) in (1..=4).zip(&slots) {
            assert_eq!(slot_in(&t, f(a << 12)), *s, "still found");
        }
    }

    #[test]
    fn threads_racing_for_the_same_functions_get_the_same_slots() {
        let t = std::sync::Arc::new(table(64));
        let runs: Vec<Vec<Option<usize>>> = (0..8)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    (1..=48usize)
                        .map(|a| slot_in(&t, (a * 0x40) as *mut c_void))
                        .collect()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect();
        assert!(runs[0].iter().all(Option::is_some));
        assert!(runs.iter().all(|r| *r == runs[0]), "{runs:?}");
        let mut s: Vec<_> = runs[0].clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 48, "one slot per function");
    }

    /// Twelve integer and ten floating-point arguments: every argument
    /// register and both kinds on the stack.
    #[allow(clippy::too_many_arguments)]
    extern "C" fn many(
        a: u64,
        b: u32,
        c: f64,
        d: i64,
        e: f32,
        f: u64,
        g: u8,
        h: u64,
        i: f64,
        j: f64,
        k: f64,
        l: f64,
        m: f64,
        n: f64,
        o: f64,
        p: u64,
        q: u16,
        r: u64,
        s: f64,
        t: u64,
    ) -> f64 {
        let ints = [
            a,
            u64::from(b),
            d as u64,
            f,
            u64::from(g),
            h,
            p,
            u64::from(q),
            r,
            t,
        ];
        let floats = [c, f64::from(e), i, j, k, l, m, n, o, s];
        let mut acc = 0.0f64;
        for (w, x) in ints.iter().enumerate() {
            acc = acc * 3.0 + (*x as f64) * (w as f64 + 1.0);
        }
        for (w, x) in floats.iter().enumerate() {
            acc = acc * 1.5 + *x * (w as f64 + 2.0);
        }
        acc
    }

    type Many = extern "C" fn(
        u64,
        u32,
        f64,
        i64,
        f32,
        u64,
        u8,
        u64,
        f64,
        f64,
        f64,
        f64,
        f64,
        f64,
        f64,
        u64,
        u16,
        u64,
        f64,
        u64,
    ) -> f64;

    fn call(f: Many) -> f64 {
        f(
            1, 2, 3.25, -4, 5.5, 6, 7, 8, 9.125, 10.5, 11.75, 12.0, 13.5, 14.25, 15.0, 16, 17, 18,
            19.5, 20,
        )
    }

    /// The forwarder of `many`, as a function of its type.
    fn forwarded_many() -> Many {
        let i = slot_of(many as *mut c_void).expect("a free slot");
        // SAFETY: the entry jumps to `many`, whose type this is.
        unsafe { std::mem::transmute::<*mut c_void, Many>(entry(i)) }
    }

    #[test]
    fn an_open_gate_passes_every_argument_and_the_result() {
        let _one = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let f = forwarded_many();
        assert_ne!(f as *const () as usize, many as *const () as usize);
        assert_eq!(call(f).to_bits(), call(many).to_bits());
    }

    #[test]
    fn a_closed_gate_holds_the_call_until_it_opens_and_keeps_every_argument() {
        let _one = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let f = forwarded_many();
        gate::set_state(1); // Parking: calls wait
        let caller = std::thread::spawn(move || call(f));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while gate::WAITERS.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the call never reached the gate"
            );
            std::thread::yield_now();
        }
        // It told the gate it waits; it cannot return before the gate opens.
        assert!(!caller.is_finished());
        gate::set_state(gate::RUNNING);
        let got = caller.join().expect("the caller does not panic");
        assert_eq!(got.to_bits(), call(many).to_bits());
    }

    #[test]
    fn a_clear_activity_flag_is_set_by_the_next_call_which_goes_through() {
        let _one = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let f = forwarded_many();
        gate::ACTIVE.store(false, Ordering::Relaxed);
        assert_eq!(call(f).to_bits(), call(many).to_bits());
        assert!(gate::ACTIVE.load(Ordering::Relaxed));
    }

    static CALLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    extern "C" fn counted(x: i32) -> i32 {
        CALLED.fetch_add(1, Ordering::Relaxed);
        x
    }

    #[test]
    fn a_process_that_cannot_continue_answers_the_gate_s_error_without_the_call() {
        let _one = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let i = slot_of(counted as *mut c_void).expect("a free slot");
        // SAFETY: the entry jumps to `counted`, whose type this is.
        let f = unsafe { std::mem::transmute::<*mut c_void, extern "C" fn(i32) -> i32>(entry(i)) };
        assert_eq!(f(7), 7);
        assert_eq!(CALLED.load(Ordering::Relaxed), 1);
        gate::set_state(gate::FAILED);
        let answer = f(7);
        gate::set_state(gate::RUNNING);
        assert_eq!(answer, gate::CUDA_ERROR_ILLEGAL_STATE);
        assert_eq!(
            CALLED.load(Ordering::Relaxed),
            1,
            "the target was not called"
        );
    }

    /// What parking hands out for `real`, looked up as `name`: its
    /// forwarder, callable as `real` is.
    fn handed_out(name: &CStr, real: extern "C" fn(i32) -> i32) -> extern "C" fn(i32) -> i32 {
        gate::enable(true);
        let p = forwarder(name, real as *mut c_void);
        gate::enable(false);
        assert!(is_forwarder(p));
        // SAFETY: the entry jumps to `real`, whose type this is.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn(i32) -> i32>(p) }
    }

    extern "C" fn nvml_like(x: i32) -> i32 {
        x
    }

    /// An NVML function's forwarder answers NVML's codes when the gate
    /// cannot let it through: NVML_ERROR_UNKNOWN (999) when the process
    /// cannot continue, never CUDA's 401, which no NVML caller knows.
    #[test]
    fn an_nvml_function_answers_nvml_s_codes_at_a_gate_that_cannot_open() {
        let _one = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let f = handed_out(c"nvmlDeviceGetLikeness", nvml_like);
        assert_eq!(f(5), 5);
        gate::set_state(gate::FAILED);
        let answer = f(5);
        gate::set_state(gate::RUNNING);
        assert_eq!(answer, 999);
    }

    extern "C" fn quiet_like(x: i32) -> i32 {
        x.wrapping_mul(3)
    }

    /// Issue 43: with the driver left usable by the park (the shim's
    /// moves), a context query goes through a parked gate into the driver
    /// at once: no resume asked for, no activity; a process that cannot
    /// continue still answers 401. With the checkpoint's moves it waits as
    /// every call does (the gate's own tests).
    #[test]
    fn a_quiet_call_goes_through_a_parked_gate_when_the_driver_stays_usable() {
        let _one = gate::TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let f = handed_out(c"cuCtxGetDevice", quiet_like);
        gate::set_driver_live(true);
        gate::set_state(gate::PARKED);
        gate::ACTIVE.store(false, Ordering::Relaxed);
        let parked = f(9);
        let active = gate::ACTIVE.load(Ordering::Relaxed);
        let wanted = gate::RESUME_WANTED.load(Ordering::Relaxed);
        gate::set_state(gate::FAILED);
        let failed = f(9);
        gate::set_state(gate::RUNNING);
        gate::set_driver_live(false);
        gate::ACTIVE.store(true, Ordering::Relaxed);
        assert_eq!(parked, 27, "it went into the target");
        assert!(!active, "no activity");
        assert!(!wanted, "no resume asked for");
        assert_eq!(failed, gate::CUDA_ERROR_ILLEGAL_STATE);
    }

    #[test]
    fn quiet_functions_are_queries_and_context_changes_only() {
        for q in [
            &b"cuCtxSetCurrent"[..],
            b"cuCtxGetDevice",
            b"cuCtxPushCurrent_v2",
            b"cuDeviceGetAttribute",
            b"cuStreamGetPriority_ptsz",
            b"cuStreamIsCapturing",
            b"cuStreamGetCaptureInfo_v2",
            b"cuOccupancyMaxActiveBlocksPerMultiprocessor",
        ] {
            assert!(is_quiet(q), "{}", String::from_utf8_lossy(q));
        }
        for n in [
            &b"cuLaunchKernel"[..],
            b"cuMemcpyDtoH_v2",
            b"cuPointerGetAttribute",
            b"cuCtxSynchronize",
            b"cuStreamSynchronize",
            b"cuMemsetD8_v2",
            b"cuGraphLaunch",
            b"cuStreamBeginCapture_v2",
            b"nvmlDeviceGetMemoryInfo",
        ] {
            assert!(!is_quiet(n), "{}", String::from_utf8_lossy(n));
        }
    }

    #[test]
    fn entries_are_the_table_s_size_and_in_the_library() {
        // Two entries apart by exactly ENTRY_BYTES, the first at the symbol.
        assert_eq!(entry(0).cast_const().cast::<u8>(), table_base());
        assert_eq!(entry(1) as usize - entry(0) as usize, ENTRY_BYTES);
        assert!(is_forwarder(entry(SLOTS - 1)));
        assert!(!is_forwarder(entry(SLOTS)));
    }
}
