//! The driver's export tables (`cuGetExportTable`), gated for parking.
//!
//! cudart, and every library that carries a copy of it, reaches the driver
//! through private tables of function pointers as well as through
//! `cuGetProcAddress`: the primary context, per-context storage, module
//! loading (docs/design/parking-resume.md). A call through one of them while
//! the process is parked would enter the driver directly and block on the
//! checkpoint lock with no one to ask for the resume. So, with parking
//! enabled (the hook is handed out only then, flag
//! `parking`), each table the driver returns has its function slots pointed
//! at forwarders (`forward.rs`) that only wait at the gate, then jump to
//! the driver's function.
//!
//! - **In place, once per table**: the driver's own table is written
//!   (`mprotect` to add write, the stores, the protection put back as it
//!   was), never a copy. cudart's integrity check hashes the tables'
//!   addresses, which stay the same; the integrity table itself
//!   ([`INTEGRITY`]) is never touched.
//! - **Only functions**: a slot is forwarded only when it points into the
//!   executable mappings of the object that holds the table (the driver),
//!   which leaves size words and data alone.
//!   A table starts with its size in bytes (then its functions), except
//!   the headerless ones (word 0 is already a function), which end at a
//!   null or all-ones word; at most [`MAX_SLOTS`] are read.
//! - **Races**: one lock serialises the patching; each slot is one aligned
//!   8-byte store, so a reader in another thread sees the driver's
//!   function or its forwarder, both correct. A table the lock has seen is
//!   not walked again.
//! - Anything unexpected (no mapping, `mprotect` refused, no forwarder
//!   left) leaves the table as the driver made it and says so once: the
//!   program runs; only a call through that table while parked waits in
//!   the driver for `vramcap resume`.

use std::ffi::c_void;
use std::sync::Mutex;

use super::RealDriver;
use super::forward::{dark_forwarder, is_forwarder, parking_enabled};
use crate::engine::Engine;
use crate::ffi::{CUDA_SUCCESS, CUresult, CUuuid};
use crate::log::{log_at, log_once};

/// The integrity-check table (D4082055-BDE6-704B-8D34-BA123C66E1F2, as its
/// bytes): cudart checks a hash over its function's address.
const INTEGRITY: [u8; 16] = [
    0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2,
];

/// The most slots read from one table (the largest known has 26).
const MAX_SLOTS: usize = 256;

/// The tables already gated (their addresses), and the lock of the patching.
static DONE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `cuGetExportTable`: the driver's answer, its table gated in place when
/// parking is enabled.
///
/// # Safety
/// The driver function's contract.
pub unsafe fn get_export_table(
    _engine: &'static Engine<RealDriver>,
    real: impl FnOnce() -> CUresult,
    table: *mut *const c_void,
    id: *const CUuuid,
) -> CUresult {
    let rc = real();
    if rc != CUDA_SUCCESS || !parking_enabled() || table.is_null() || id.is_null() {
        return rc;
    }
    // SAFETY: the driver accepted both and wrote `*table`.
    let (t, guid) = unsafe { (*table, (*id).bytes) };
    // A table is an array of 8-byte words; anything else is left alone.
    if !t.is_null() && (t as usize).is_multiple_of(8) && guid != INTEGRITY {
        gate_table(t.cast_mut().cast(), guid);
    }
    rc
}

/// Points the function slots of the table at `t` at their forwarders.
fn gate_table(t: *mut usize, guid: [u8; 16]) {
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if done.contains(&(t as usize)) {
        return;
    }
    done.push(t as usize);
    let tag = u32::from_be_bytes([guid[0], guid[1], guid[2], guid[3]]);
    let maps = match std::fs::read_to_string("/proc/self/maps") {
        Ok(m) => m,
        Err(e) => {
            log_once!(
                Warn,
                "parking: cannot read /proc/self/maps ({e}); the driver's export tables are not gated"
            );
            return;
        }
    };
    let rows: Vec<Row> = maps.lines().filter_map(Row::parse).collect();
    // The table lies in the driver's own image, as its functions do.
    let Some(code) = code_of(&rows, t as usize) else {
        log_once!(
            Warn,
            "parking: the driver's code is not in /proc/self/maps; its export tables are not gated"
        );
        return;
    };
    let is_code = |v: usize| code.iter().any(|&(lo, hi)| v >= lo && v < hi);
    let Some((prot, end)) = mapping_at(&rows, t as usize) else {
        log_once!(
            Warn,
            "parking: an export table of the driver is in no mapping; it is not gated"
        );
        return;
    };
    // Never read past the table's mapping.
    let room = ((end - t as usize) / 8).min(MAX_SLOTS);
    // SAFETY: the driver's table: its first word is readable.
    let first = unsafe { t.read_volatile() };
    let (start, len) = if first < 0x1_0000 && first.is_multiple_of(8) {
        (1, (first / 8).min(room))
    } else {
        // Headerless: up to the first word that is not a function.
        let mut n = 0;
        // SAFETY: inside the mapping.
        while n < room && is_code(unsafe { t.add(n).read_volatile() }) {
            n += 1;
        }
        (0, n)
    };
    let mut slots: Vec<(usize, usize)> = Vec::new();
    for i in start..len {
        // SAFETY: inside the table's length and its mapping.
        let v = unsafe { t.add(i).read_volatile() };
        if is_code(v) && !is_forwarder(v as *const c_void) {
            slots.push((i, v));
        }
    }
    if slots.is_empty() {
        return;
    }
    let page = page_size();
    let lo = (t as usize) & !(page - 1);
    let hi = (t as usize + 8 * len).next_multiple_of(page);
    let writable = prot & libc::PROT_WRITE != 0
        // SAFETY: pages of the driver's own mapping, made writable and put
        // back to exactly their protection below.
        || unsafe { libc::mprotect(lo as *mut c_void, hi - lo, prot | libc::PROT_WRITE) } == 0;
    if !writable {
        log_once!(
            Warn,
            "parking: an export table of the driver cannot be made writable ({}); it is not gated",
            std::io::Error::last_os_error()
        );
        return;
    }
    let mut gated = 0;
    for &(i, v) in &slots {
        if let Some(f) = dark_forwarder(v as *mut c_void, tag, i as u32) {
            // SAFETY: writable now; one aligned word, the table's own.
            unsafe { t.add(i).write_volatile(f as usize) };
            gated += 1;
        }
    }
    let restored = prot & libc::PROT_WRITE != 0
        // SAFETY: the same pages, back to their own protection.
        || unsafe { libc::mprotect(lo as *mut c_void, hi - lo, prot) } == 0;
    if !restored {
        log_once!(
            Warn,
            "parking: an export table's protection could not be restored ({})",
            std::io::Error::last_os_error()
        );
    }
    log_at!(
        Debug,
        "parking: export table {tag:08x}: {gated} of {} functions gated in place",
        slots.len()
    );
}

/// The executable ranges of the object whose mapping holds `addr`.
fn code_of(rows: &[Row], addr: usize) -> Option<Vec<(usize, usize)>> {
    let path = rows
        .iter()
        .find(|r| r.lo <= addr && addr < r.hi && !r.path.is_empty())?
        .path;
    Some(
        rows.iter()
            .filter(|r| r.path == path && r.prot & libc::PROT_EXEC != 0)
            .map(|r| (r.lo, r.hi))
            .collect(),
    )
}

/// The protection and the end of the mapping that holds `addr`.
fn mapping_at(rows: &[Row], addr: usize) -> Option<(i32, usize)> {
    rows.iter()
        .find(|r| r.lo <= addr && addr < r.hi)
        .map(|r| (r.prot, r.hi))
}

fn page_size() -> usize {
    // SAFETY: no arguments beyond the name.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// One line of /proc/self/maps: `lo-hi perms offset dev inode [path]`.
struct Row<'a> {
    lo: usize,
    hi: usize,
    prot: i32,
    path: &'a str,
}

impl<'a> Row<'a> {
    fn parse(line: &'a str) -> Option<Row<'a>> {
        let mut cols = line.split_ascii_whitespace();
        let (lo, hi) = cols.next()?.split_once('-')?;
        let perms = cols.next()?.as_bytes();
        let path = cols.nth(3).unwrap_or("");
        let bit = |i: usize, c: u8, p: i32| if perms.get(i) == Some(&c) { p } else { 0 };
        Some(Row {
            lo: usize::from_str_radix(lo, 16).ok()?,
            hi: usize::from_str_radix(hi, 16).ok()?,
            prot: bit(0, b'r', libc::PROT_READ)
                | bit(1, b'w', libc::PROT_WRITE)
                | bit(2, b'x', libc::PROT_EXEC),
            path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
7f0000000000-7f0000100000 r--p 00000000 08:01 42 /usr/lib/libcuda.so.1
7f0000100000-7f0000400000 r-xp 00100000 08:01 42 /usr/lib/libcuda.so.1
7f0000400000-7f0000500000 r--p 00400000 08:01 42 /usr/lib/libcuda.so.1
7f0000500000-7f0000510000 rw-p 00500000 08:01 42 /usr/lib/libcuda.so.1
7f0000600000-7f0000700000 r-xp 00000000 08:01 43 /usr/lib/libc.so.6
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";

    fn rows() -> Vec<Row<'static>> {
        MAPS.lines().filter_map(Row::parse).collect()
    }

    #[test]
    fn the_driver_s_code_is_its_executable_mappings_only() {
        assert_eq!(
            code_of(&rows(), 0x7f00_0020_0000),
            Some(vec![(0x7f00_0010_0000, 0x7f00_0040_0000)])
        );
        assert_eq!(
            code_of(&rows(), 0x7f00_0000_1000),
            Some(vec![(0x7f00_0010_0000, 0x7f00_0040_0000)])
        );
        assert_eq!(code_of(&rows(), 0x1000), None);
    }

    #[test]
    fn a_table_s_mapping_gives_its_protection_and_end() {
        let end = 0x7f00_0050_0000;
        assert_eq!(
            mapping_at(&rows(), 0x7f00_0040_0100),
            Some((libc::PROT_READ, end))
        );
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        assert_eq!(mapping_at(&rows(), end), Some((rw, 0x7f00_0051_0000)));
        assert_eq!(mapping_at(&rows(), 0x7f00_0058_0000), None);
    }
}
