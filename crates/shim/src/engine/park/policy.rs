//! The idle policy (`VRAMCAP_PARK=idle:T`, design items 8 and 10), in two
//! places:
//!
//! - **A group's budget**: when an allocation would be refused by it
//!   (after the cache was emptied), or a transparent resume's reservation
//!   would be, the process finds the member of its group idle longest past
//!   its own threshold that holds memory on the device.
//! - **A full GPU**: when the driver itself is out of memory (after the
//!   cache was emptied), or a transparent resume finds too little free on
//!   the GPU, the process finds the process idle longest past its own
//!   threshold that holds memory on that GPU (by UUID), in a group or not.
//!
//! Either way only the same user's processes started with
//! `VRAMCAP_PARK=idle:…` and running are candidates; the process posts the
//! chosen one a park-if-idle request on its page, waits for the answer (2 s
//! and 1 s per GiB it holds) and tries again. With no such process an
//! allocation waits up to `VRAMCAP_PARK_WAIT` for one or for room (0, the
//! default: refused as without parking); a resume tries again each tick.
//!
//! The directory may be shared, so its pages are trusted for nothing
//! (`vramcap_core::peers`): only a process started with `VRAMCAP_PARK` or
//! a `VRAMCAP_PARK_WAIT` reads them at all; the scan looks at a bounded
//! number of entries and copies pages (maps none); only a regular file
//! the user owns that no one else can write, reached by no link, is read
//! or asked; a request not taken within [`TAKE_WAIT`] is withdrawn; the
//! wait for an answer counts the bytes a page says it holds as no more
//! than the GPU's size; and one allocation takes at most
//! [`POLICY_ROUNDS`] rounds of the policy.
//!
//! Idle: the member's `last_activity` (written each tick when its gate saw
//! a call, or a call was in flight; set at its resume) is at least its
//! threshold ago, and the member itself confirms it (no call inside the
//! shim, none waiting at its gate) before it parks: a process waiting for
//! room or to resume is never parked. Members are found by their pages in
//! the statistics directory: the same user's, the same group's. Nothing is
//! held while waiting (a resume has given back its partial reservation).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vramcap_core::mailbox::{Mailbox, post_park, withdraw_park};
use vramcap_core::page::{PAGE_SIZE, Page, check_header, get_text};
use vramcap_core::park::{Ask, Outcome, ParkMode, ParkState};
use vramcap_core::peers::{SCAN_ENTRIES, SCAN_PAGES, open_own_page, stable_copy};
use vramcap_core::settings::default_stats_dir;

use super::Parking;
use crate::engine::accounting::page::now_unix_ns;
use crate::engine::driver::{Driver, unless_oom};
use crate::ffi::{CUDA_ERROR_OUT_OF_MEMORY, CUdevice, CUresult};
use crate::log::{log_at, log_once};
use crate::process::TICK;

/// Whose memory would make the room: a group's members (by name), or the
/// processes on one GPU (by UUID) that hold at least the bytes it is short
/// of (parking one that holds less would not make the room).
#[derive(Clone, Copy)]
pub(super) enum Among<'a> {
    Group(&'a str),
    Gpu([u8; 16], u64),
}

/// Another process's page, mapped for as long as it is asked something.
struct Mapped(*mut libc::c_void);

impl Mapped {
    /// Maps the page the scan opened and read (the same descriptor: a
    /// name renamed since cannot swap another file in), a complete page of
    /// this user that no one else can write
    /// (`vramcap_core::peers::open_own_page`: no link followed, the owner
    /// by `fstat`, never by a word in the file; no other user can truncate
    /// it under the mapping).
    fn open((file, len): &(std::fs::File, u64)) -> Option<Mapped> {
        let len = *len;
        // SAFETY: mapping PAGE_SIZE bytes of a file at least that long.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        let m = Mapped(map);
        // SAFETY: PAGE_SIZE mapped bytes.
        let head = unsafe { std::slice::from_raw_parts(map.cast::<u8>(), PAGE_SIZE) };
        check_header(len, head, Some(me().0)).ok()?;
        Some(m)
    }

    fn page(&self) -> &Page {
        // SAFETY: a checked page of PAGE_SIZE bytes, mapped while self lives
        // (its fields are atomics or written once before it was published).
        unsafe { &*self.0.cast::<Page>() }
    }
}

/// This process's (real uid, effective uid): pages carry the first and
/// are owned by the second.
fn me() -> (u32, u32) {
    // SAFETY: getuid and geteuid cannot fail.
    unsafe { (libc::getuid(), libc::geteuid()) }
}

/// A private copy of `path`'s page if it is one of this user's that no
/// one else can write (read with `pread`, never mapped: the scan maps
/// nothing).
fn read_peer(path: &Path) -> Option<((std::fs::File, u64), Box<Page>)> {
    let (file, len) = open_own_page(path, me().1).ok()?;
    let check = |b: &[u8]| check_header(len, b, Some(me().0)).map(|_| ());
    let copy = stable_copy::<Page, _>(&file, check).ok()?;
    Some(((file, len), copy))
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping what `open` mapped.
        unsafe { libc::munmap(self.0, PAGE_SIZE) };
    }
}

impl<D: Driver> Parking<'_, D> {
    /// The policy's hook, where an allocation of `bytes` on `device` would
    /// be refused by the group, `need` bytes short: true when a member was
    /// parked (or room for `bytes` came while waiting) and the reservation
    /// should be tried again.
    pub(in crate::engine) fn park_for_room(&self, device: CUdevice, need: u64, bytes: u64) -> bool {
        let settings = self.settings;
        let Some(group) = settings
            .group
            .as_deref()
            .filter(|_| settings.asks_to_park())
        else {
            return false;
        };
        let start = Instant::now();
        let mut said = false;
        loop {
            if self.park_idle_member(device, Among::Group(group), need, "") {
                return true;
            }
            if start.elapsed() >= settings.park_wait {
                return false;
            }
            if !std::mem::replace(&mut said, true) {
                log_at!(
                    Info,
                    "{need} more bytes needed on device {device}: waiting up to {:?} (VRAMCAP_PARK_WAIT) for an idle member of the group or for room",
                    settings.park_wait
                );
            }
            std::thread::sleep(TICK);
            let room = match (
                self.accounting.group().used(device),
                self.accounting.group().limit_now(device),
            ) {
                (Some(u), Some(l)) => u.saturating_add(bytes) <= l,
                _ => false,
            };
            if room {
                return true;
            }
        }
    }

    /// Where the driver is out of memory for `bytes` on `device` even with
    /// the cache emptied: parks the process idle longest on that GPU that
    /// holds what is missing, and runs `alloc` again, waiting up to
    /// `VRAMCAP_PARK_WAIT` for one or for room (trying `alloc` each tick).
    /// Out of memory as before when neither comes, and at once when the
    /// GPU has the bytes free (a pool at its maximum, managed memory: no
    /// parking makes that room).
    pub(in crate::engine) fn park_for_gpu_room<T>(
        &self,
        device: CUdevice,
        bytes: u64,
        mut alloc: impl FnMut() -> Result<T, CUresult>,
    ) -> Result<T, CUresult> {
        if !self.settings.asks_to_park() {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let Some(uuid) = self.gpu_of(device) else {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        let wait = self.settings.park_wait;
        let start = Instant::now();
        let mut said = false;
        loop {
            let free = self.driver.current_free();
            if free.is_some_and(|f| f >= bytes) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            let need = bytes - free.unwrap_or(0);
            if self.park_idle_member(device, Among::Gpu(uuid, need), need, "")
                && let Some(r) = unless_oom(alloc())
            {
                return r;
            }
            if start.elapsed() >= wait {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            if !std::mem::replace(&mut said, true) {
                log_at!(
                    Info,
                    "GPU {device} is full: waiting up to {wait:?} (VRAMCAP_PARK_WAIT) for an idle process on it or for room"
                );
            }
            std::thread::sleep(TICK);
            if let Some(r) = unless_oom(alloc()) {
                return r;
            }
        }
    }

    /// The UUID of `device` as this process's page records it (set at its
    /// first use), if known.
    pub(super) fn gpu_of(&self, device: CUdevice) -> Option<[u8; 16]> {
        let uuid = self.accounting.slot(device)?.uuid_bytes();
        (uuid != [0; 16]).then_some(uuid)
    }

    /// One try of the policy, for an allocation or (`to`: " to resume") a
    /// transparent resume: asks the process idle longest past its threshold
    /// among `among` on `device` to park if it still is idle, and waits
    /// for its answer (bounded: [`ask_park`]). True when it parked. `need`:
    /// the bytes short, for the log (0: the GPU is full).
    pub(super) fn park_idle_member(
        &self,
        device: CUdevice,
        among: Among<'_>,
        need: u64,
        to: &str,
    ) -> bool {
        let Some((pid, file)) = self.idle_member(among, device) else {
            return false;
        };
        let Some(m) = Mapped::open(&file) else {
            return false;
        };
        let most = self
            .driver
            .device_total_mem(device)
            .unwrap_or(MOST_ON_A_GPU);
        let start = Instant::now();
        let outcome = ask_park(m.page(), most);
        // Asked again each tick: a refusal is said once in a row.
        let key = match outcome {
            Some(Outcome::Ok) => 0,
            o => u64::from(pid) << 32 | o.map_or(u64::from(u32::MAX), |o| o.word() & 0xffff_ffff),
        };
        if self.park.said_asked.swap(key, Ordering::Relaxed) != key || key == 0 {
            let why = match among {
                Among::Group(g) => {
                    format!(
                        "group {g}: {need} more bytes needed on device {device}{to}; parking idle member"
                    )
                }
                Among::Gpu(..) => format!("GPU {device} is full{to}; parking idle process"),
            };
            log_at!(
                Info,
                "{why} {pid}: {} in {:.3}s",
                outcome.map_or("no answer".to_string(), |o| o.to_string()),
                start.elapsed().as_secs_f64()
            );
        }
        outcome == Some(Outcome::Ok)
    }

    /// The process among `among` idle longest past its own threshold that
    /// holds memory on `device` (for a group, this process's device index;
    /// for a GPU, the slot with its UUID), its PID and page, if any.
    fn idle_member(
        &self,
        among: Among<'_>,
        device: CUdevice,
    ) -> Option<(u32, (std::fs::File, u64))> {
        let settings = self.settings;
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() } as u32;
        let dir = settings
            .stats_dir
            .clone()
            .unwrap_or_else(|| default_stats_dir(self::me().0));
        let now = now_unix_ns();
        let mut best: Option<(u64, u32, (std::fs::File, u64))> = None;
        let mut read = 0;
        for (i, e) in std::fs::read_dir(&dir).ok()?.flatten().enumerate() {
            if i >= SCAN_ENTRIES || read >= SCAN_PAGES {
                log_once!(
                    Warn,
                    "parking: {} holds more files than one look for an idle process reads ({SCAN_ENTRIES} entries, {SCAN_PAGES} pages); the rest are not considered",
                    vramcap_core::text::path(&dir)
                );
                break;
            }
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".page"))
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|&p| p != me)
            else {
                continue;
            };
            // Only this user's files count against the bound (what another
            // user plants in a shared directory cannot use it up); the
            // entry's own type and owner, no link followed.
            let owned = e.metadata().is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.is_file() && m.uid() == self::me().1
            });
            if !owned {
                continue;
            }
            read += 1;
            let Some((file, copy)) = read_peer(&e.path()) else {
                continue;
            };
            let p = &*copy;
            let h = &p.header;
            let Some(ParkMode::Idle(t)) = ParkMode::from_word(h.park_mode) else {
                continue;
            };
            let (mine, holds) = match among {
                Among::Group(g) => (
                    get_text(&h.group) == g,
                    usize::try_from(device)
                        .ok()
                        .and_then(|d| p.slots.get(d))
                        .is_some_and(|s| s.budget.used() > 0),
                ),
                Among::Gpu(u, need) => (
                    true,
                    p.slots
                        .iter()
                        .any(|s| s.uuid_bytes() == u && s.budget.used() >= need.max(1)),
                ),
            };
            if !mine
                || ParkState::from_word(h.park_state.load(Ordering::Acquire)) != ParkState::Running
                || !holds
                || vramcap_core::liveness::start_time(pid) != Some(h.start_time)
            {
                continue;
            }
            let idle = h.idle_ns(now);
            if idle < t.as_nanos() as u64 {
                continue;
            }
            let past = idle - t.as_nanos() as u64;
            if best.as_ref().is_none_or(|b| past > b.0) {
                best = Some((past, pid, file));
            }
        }
        best.map(|(_, pid, file)| (pid, file))
    }
}

/// Rounds of the policy one allocation takes at most before it is
/// refused ([`Parking::park_for_room`] answered true that often and the
/// reservation still failed).
pub(in crate::engine) const POLICY_ROUNDS: u32 = 4;

/// How long the policy waits for a member to take its request (a live
/// member's background thread takes it within a tick or two) before it
/// withdraws it; once taken, it waits for the answer up to [`ask_bound`].
const TAKE_WAIT: Duration = Duration::from_secs(2);

/// What a GPU is taken to hold at most when the driver cannot say.
const MOST_ON_A_GPU: u64 = 288 << 30;

/// How long the policy waits for a member's answer: 2 s and 1 s per GiB
/// it says it holds, which is never taken as more than `most` (the
/// GPU's size, the shim's own figure: a page's word cannot stretch it).
pub(super) fn ask_bound(held: u64, most: u64) -> Duration {
    Duration::from_secs(2 + held.min(most).div_ceil(1 << 30))
}

/// Posts a park-if-idle request on `page` (the member re-checks that it
/// is idle: [`Ask::ParkIfIdle`]) and waits for its answer
/// ([`ask_bound`]); `None` when none came in time.
fn ask_park(page: &Page, most: u64) -> Option<Outcome> {
    let h = &page.header;
    let held = page
        .slots
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.budget.used()));
    let bound = ask_bound(held, most);
    let ticket = post_park(h, Ask::ParkIfIdle);
    let start = Instant::now();
    while !Mailbox::park(h).answered(ticket) {
        // A live member takes a request within a tick or two; one that has
        // not taken it by TAKE_WAIT (stopped, its thread not running) is
        // not waited for the whole bound: withdrawn, unless taken meanwhile.
        if start.elapsed() >= TAKE_WAIT && withdraw_park(h, Ask::ParkIfIdle) {
            return None;
        }
        if start.elapsed() >= bound {
            // Withdrawn if not taken yet: an ask given up on never parks
            // the member later (a stopped process after SIGCONT). Taken,
            // its park may still finish; the next round sees it parked.
            withdraw_park(h, Ask::ParkIfIdle);
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(Outcome::from_word(h.park_outcome.load(Ordering::Acquire)))
}
