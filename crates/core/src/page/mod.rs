//! The per-process statistics page: one shared-memory file per process under
//! the shim, written by the shim and read by the CLI.
//!
//! # Layout (version 1)
//! A [`Header`] of 1024 bytes, then [`SLOTS`] [`DeviceSlot`]s of 256 bytes,
//! one per device index the process sees. Every number is little-endian
//! native `u64`/`u32` at a fixed offset (pinned by a test); `reserved` fields
//! are zero and leave room for growth without a version change. None is
//! left in the header and the slots: the page grows by words appended after
//! the slots, its `page_size` longer ([`MAX_PAGE_SIZE`] at most), which
//! readers accept, reading the first [`PAGE_SIZE`] bytes as [`Page`] and
//! what they know of the rest. The first such words are the [`Tail`]
//! ([`FILE_SIZE`] in all). A reader checks magic, version and sizes before
//! trusting anything else.
//!
//! # Why per-field atomics and no seqlock
//! The device slot's `limit`/`used`/`peak` *are* the shim's budget (see
//! [`crate::budget`]): the cap is decided on the page itself, so the page can
//! never disagree with the cap. Every field is an `AtomicU64` updated with one
//! atomic instruction, so a reader never sees a torn value. Fields are not a
//! consistent snapshot of one instant (a reader may see an allocation counted
//! in `allocs` a few nanoseconds before its bytes reach `used`); for a
//! monitor that is harmless, while a seqlock would add two stores and fences
//! to every allocation and make readers retry under load. The one cross-field
//! rule a reader relies on, `peak >= used`, is restored by the reader taking
//! `max(peak, used)`, since `peak` is raised just after `used`.
//!
//! # Lifecycle
//! The shim creates the page on its first CUDA call (not at load, so the
//! thousand non-CUDA processes of a shell session leave no pages), marks it
//! ready after filling the header, and removes it at normal exit. A killed
//! process leaves it behind; the CLI recognises it by a dead PID or a start
//! time that differs from the live process's and removes it.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::budget::DeviceBudget;

mod check;
pub use check::{PageProblem, check_header};

pub const MAGIC: [u8; 8] = *b"vramcap\0";
pub const VERSION: u32 = 1;
/// Device slots per page; device indices past this are not tracked.
pub const SLOTS: usize = crate::limit::MAX_DEVICES;
pub const HEADER_SIZE: usize = 1024;
pub const SLOT_SIZE: usize = 256;
pub const PAGE_SIZE: usize = HEADER_SIZE + SLOTS * SLOT_SIZE;
/// The longest page a reader accepts: a later layout may append words after
/// the slots (its `page_size` says so), and this reader reads the first
/// [`PAGE_SIZE`] bytes of it.
pub const MAX_PAGE_SIZE: usize = 64 << 10;
pub const COMMAND_LEN: usize = 512;
pub const GROUP_LEN: usize = 64;

/// `Header::state` before the header is complete.
pub const STATE_INITIALISING: u32 = 0;
/// `Header::state` once the header is complete.
pub const STATE_READY: u32 = 1;

/// Whether a request counter's acknowledgement `acks` has reached `ticket`
/// (the request's number), wrap-safe: both words only move forward, so
/// `acks` is at or past `ticket` exactly when it is less than 2^63 ahead
/// (serial-number arithmetic, RFC 1982). A plain `acks >= ticket` takes a
/// request numbered 0 (the counter wrapped at `u64::MAX`) as answered at
/// once.
pub fn acknowledged(acks: u64, ticket: u64) -> bool {
    acks.wrapping_sub(ticket) < 1 << 63
}

/// The file name of a process's page in the stats directory.
pub fn file_name(pid: u32) -> String {
    format!("{pid}.page")
}

#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub page_size: u32,
    pub slot_size: u32,
    pub slot_count: u32,
    pub pid: u32,
    pub uid: u32,
    pub state: AtomicU32,
    /// Process start time in clock ticks after boot (field 22 of /proc/PID/stat).
    pub start_time: u64,
    /// When the page was created, nanoseconds since the Unix epoch.
    pub created_unix_ns: u64,
    /// Raised by `vramcap trim`; the process empties its cache and then sets
    /// `trim_acks` to the value it saw.
    pub trim_requests: AtomicU64,
    pub trim_acks: AtomicU64,
    /// What the process's cap counts (`VRAMCAP_COUNT`): [`COUNTING_HELD`]
    /// or [`COUNTING_ALLOCATIONS`]; 0 in pages of shims before the field.
    pub counting: u64,
    /// Raised by `vramcap limit` after it has written the slots'
    /// `requested` words; the shim applies them and sets `limit_acks` to
    /// the value it saw.
    pub limit_requests: AtomicU64,
    pub limit_acks: AtomicU64,
    /// Parking ([`crate::park`]): the state (`ParkState as u64`), raised by
    /// `vramcap park`/`resume` (and a group member's policy) after writing
    /// `park_ask`; the shim acts, writes `park_outcome` (an
    /// `Outcome::word`) and sets `park_acks` to the value it saw. These
    /// five words were reserved (zero) before. The shim takes the ask by
    /// swapping `park_ask` to 0 (which asks nothing: answered `Withdrawn`,
    /// no action); a reader that gives up waiting withdraws its request by a
    /// compare-and-swap of its ask back to 0, which succeeds only while
    /// the shim has not taken it.
    pub park_state: AtomicU64,
    pub park_requests: AtomicU64,
    pub park_acks: AtomicU64,
    pub park_ask: AtomicU64,
    pub park_outcome: AtomicU64,
    /// `VRAMCAP_GROUP`, NUL-padded (empty when none).
    pub group: [u8; GROUP_LEN],
    /// The command line, arguments joined by spaces, NUL-padded, cut to fit.
    pub command: [u8; COMMAND_LEN],
    /// Kubernetes identity from the process's environment when it has it
    /// (`POD_NAME` or `KUBERNETES_POD_NAME`, `POD_NAMESPACE`,
    /// `CONTAINER_NAME`), so readers outside its PID namespace see it too.
    pub pod: [u8; 96],
    pub namespace: [u8; 64],
    pub container: [u8; 64],
    /// `VRAMCAP_PARK` (`ParkMode::word`; 0 for none). Then, while parked,
    /// since when (Unix ns, 0 otherwise); when the program last called the
    /// driver, as the background thread saw it (Unix ns); and the bytes
    /// parked per GPU (`park::PARK_DEVICES`). These were reserved before.
    pub park_mode: u64,
    pub parked_since: AtomicU64,
    pub last_activity: AtomicU64,
    pub parked: [AtomicU64; crate::park::PARK_DEVICES],
}

/// Where the page's identity fields come from, by field.
pub const IDENTITY_VARS: [(&str, &[&str]); 3] = [
    ("pod", &["POD_NAME", "KUBERNETES_POD_NAME"]),
    ("namespace", &["POD_NAMESPACE"]),
    ("container", &["CONTAINER_NAME"]),
];

/// Counters of one device. `budget` holds `limit`, `used` and `peak`.
/// What readers show of it, and how, is listed in [`crate::counters`].
#[repr(C)]
pub struct DeviceSlot {
    pub budget: DeviceBudget,
    /// Bit 0: the process has used this device.
    pub flags: AtomicU64,
    pub cached: AtomicU64,
    pub spilled: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// Allocations answered with out-of-memory because of the cap.
    pub refusals: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub evictions: AtomicU64,
    pub trims: AtomicU64,
    pub spill_allocs: AtomicU64,
    /// Tiered spill (`VRAMCAP_SPILL=tiered`): blocks moved from the host
    /// onto the GPU (this word was reserved, always zero, before).
    pub promotions: AtomicU64,
    /// The device UUID's 16 bytes (two native-endian words), zero if unknown.
    pub uuid: [AtomicU64; 2],
    /// Parts of `budget.used` (all zero under `VRAMCAP_COUNT=allocations`):
    /// what the process's stream-ordered pools keep reserved (their live
    /// allocations included), the device's graph memory, and the context's
    /// footprint (context, modules and what else the driver holds for the
    /// process on the GPU beyond its allocations). `used` minus the three
    /// is the process's other allocations.
    pub pools: AtomicU64,
    pub graphs: AtomicU64,
    pub context: AtomicU64,
    /// The process's own cap in force ([`crate::budget::NO_CAP`] for none;
    /// 0 before it is worked out). `budget`'s limit is it made stricter by
    /// the group's.
    pub own: AtomicU64,
    /// The own cap the process started with (what `VRAMCAP_LIMIT` gave it;
    /// the program may raise its cap up to it, never above).
    pub ceiling: AtomicU64,
    /// A new own cap asked for by `vramcap limit`, applied at the next
    /// round ([`Header::limit_requests`]); 0 for none.
    pub requested: AtomicU64,
    /// The device's memory (`cuDeviceTotalMem`), for percentages.
    pub total: AtomicU64,
    /// Times the cap was changed while the process ran.
    pub limit_changes: AtomicU64,
    /// The soft limit (`VRAMCAP_SOFT_LIMIT`) in bytes, 0 for none; and the
    /// times the process went above it.
    pub soft: AtomicU64,
    pub soft_events: AtomicU64,
    /// Reuses of a freed block the cache waited for a synchronisation
    /// before, and those it ordered after the work before the free with an
    /// event on the legacy stream instead (no wait).
    pub cache_waits: AtomicU64,
    pub cache_ordered: AtomicU64,
    /// The operator's cap (`settings::OPERATOR_LIMIT_PATH`) in bytes; 0 or
    /// [`crate::budget::NO_CAP`] for none. No change of the cap passes it.
    pub operator: AtomicU64,
    /// Tiered spill: blocks moved from the GPU to the host, and the bytes
    /// of every move either way (these two words were reserved before).
    pub demotions: AtomicU64,
    pub moved_bytes: AtomicU64,
}

/// [`Header::counting`]: everything the process holds on the GPU is capped.
pub const COUNTING_HELD: u64 = 1;
/// [`Header::counting`]: only allocations are capped (`VRAMCAP_COUNT=allocations`).
pub const COUNTING_ALLOCATIONS: u64 = 2;

pub const FLAG_ACTIVE: u64 = 1;

#[repr(C)]
pub struct Page {
    pub header: Header,
    pub slots: [DeviceSlot; SLOTS],
}

/// Words after the slots, in the file the shim makes ([`FILE_SIZE`]; its
/// `page_size` says so). A reader copies [`Page`] first, then these when
/// the page is long enough (a page of an earlier library has none: they
/// read as zero).
#[repr(C)]
pub struct Tail {
    /// Host memory the shim's parking moves keep for the next park
    /// (`VRAMCAP_PARK_MOVE=shim`): bytes, while the process runs.
    pub park_host_kept: AtomicU64,
    pub reserved: [AtomicU64; 31],
}

pub const TAIL_SIZE: usize = 256;
/// The length of the file the shim makes: the page and its tail.
pub const FILE_SIZE: usize = PAGE_SIZE + TAIL_SIZE;

/// The shim's whole mapping: the page, then its tail.
#[repr(C)]
pub struct PageFile {
    pub page: Page,
    pub tail: Tail,
}

const _: () = assert!(size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(size_of::<DeviceSlot>() == SLOT_SIZE);
const _: () = assert!(size_of::<Page>() == PAGE_SIZE);
const _: () = assert!(offset_of!(Page, slots) == HEADER_SIZE);
const _: () = assert!(size_of::<Tail>() == TAIL_SIZE);
const _: () = assert!(size_of::<PageFile>() == FILE_SIZE);
const _: () = assert!(offset_of!(PageFile, tail) == PAGE_SIZE);
const _: () = assert!(FILE_SIZE <= MAX_PAGE_SIZE);

impl DeviceSlot {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn mark_active(&self) {
        if self.flags.load(Ordering::Relaxed) & FLAG_ACTIVE == 0 {
            self.flags.fetch_or(FLAG_ACTIVE, Ordering::Relaxed);
        }
    }

    pub fn set_uuid(&self, bytes: [u8; 16]) {
        let (a, b) = bytes.split_at(8);
        // Both halves are exactly 8 bytes by construction.
        self.uuid[0].store(
            u64::from_ne_bytes(a.try_into().unwrap_or_default()),
            Ordering::Relaxed,
        );
        self.uuid[1].store(
            u64::from_ne_bytes(b.try_into().unwrap_or_default()),
            Ordering::Relaxed,
        );
    }

    pub fn uuid_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.uuid[0].load(Ordering::Relaxed).to_ne_bytes());
        out[8..].copy_from_slice(&self.uuid[1].load(Ordering::Relaxed).to_ne_bytes());
        out
    }

    /// Zeroes every counter (a fresh page, or a child after fork).
    pub fn reset(&self) {
        self.budget.reset();
        for c in [
            &self.flags,
            &self.cached,
            &self.spilled,
            &self.allocs,
            &self.frees,
            &self.refusals,
            &self.cache_hits,
            &self.cache_misses,
            &self.evictions,
            &self.trims,
            &self.spill_allocs,
            &self.promotions,
            &self.pools,
            &self.graphs,
            &self.context,
            &self.own,
            &self.ceiling,
            &self.requested,
            &self.total,
            &self.limit_changes,
            &self.soft,
            &self.soft_events,
            &self.cache_waits,
            &self.cache_ordered,
            &self.operator,
            &self.demotions,
            &self.moved_bytes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        for c in &self.uuid {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Copies `text` into a NUL-padded field, cut at a character boundary.
pub fn put_text(field: &mut [u8], text: &str) {
    field.fill(0);
    let mut end = text.len().min(field.len() - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    field[..end].copy_from_slice(&text.as_bytes()[..end]);
}

/// The text of a NUL-padded field (lossy: a foreign page may hold anything).
pub fn get_text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

impl Header {
    /// Nanoseconds since the program last called the driver at `now_ns`
    /// (since the page was made, if never): what the idle policy measures.
    pub fn idle_ns(&self, now_ns: u64) -> u64 {
        let last = match self.last_activity.load(Ordering::Acquire) {
            0 => self.created_unix_ns,
            l => l,
        };
        now_ns.saturating_sub(last)
    }

    /// Fills every field but `state`, which the writer sets to
    /// [`STATE_READY`] last.
    pub fn fill(
        &mut self,
        pid: u32,
        uid: u32,
        start_time: u64,
        created_unix_ns: u64,
        command: &str,
        group: &str,
    ) {
        self.magic = MAGIC;
        self.version = VERSION;
        self.header_size = HEADER_SIZE as u32;
        self.page_size = PAGE_SIZE as u32;
        self.slot_size = SLOT_SIZE as u32;
        self.slot_count = SLOTS as u32;
        self.pid = pid;
        self.uid = uid;
        self.start_time = start_time;
        self.created_unix_ns = created_unix_ns;
        self.trim_requests = AtomicU64::new(0);
        self.trim_acks = AtomicU64::new(0);
        self.counting = 0;
        self.limit_requests = AtomicU64::new(0);
        self.limit_acks = AtomicU64::new(0);
        for w in [
            &self.park_state,
            &self.park_requests,
            &self.park_acks,
            &self.park_ask,
            &self.park_outcome,
            &self.parked_since,
            &self.last_activity,
        ] {
            w.store(0, Ordering::Relaxed);
        }
        self.park_mode = 0;
        for w in &self.parked {
            w.store(0, Ordering::Relaxed);
        }
        put_text(&mut self.group, group);
        put_text(&mut self.command, command);
    }

    /// Fills the identity fields through `get` (an environment lookup).
    pub fn fill_identity(&mut self, get: impl Fn(&str) -> Option<String>) {
        let pick = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| get(n).filter(|v| !v.is_empty()))
                .unwrap_or_default()
        };
        put_text(&mut self.pod, &pick(IDENTITY_VARS[0].1));
        put_text(&mut self.namespace, &pick(IDENTITY_VARS[1].1));
        put_text(&mut self.container, &pick(IDENTITY_VARS[2].1));
    }
}

/// The canonical `GPU-…` text of a UUID, or `None` for all zeroes.
pub fn uuid_text(bytes: &[u8; 16]) -> Option<String> {
    if bytes.iter().all(|&b| b == 0) {
        return None;
    }
    let mut s = String::from("GPU-");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout is an interface between builds: these numbers never change
    /// within a version.
    #[test]
    fn identity_takes_the_first_non_empty_variable_of_each() {
        let fill = |env: &[(&str, &str)]| {
            // SAFETY: zeroed bytes are a valid header.
            let mut h: Header = unsafe { std::mem::zeroed() };
            h.fill_identity(|name| {
                env.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            });
            (
                get_text(&h.pod),
                get_text(&h.namespace),
                get_text(&h.container),
            )
        };
        let s = String::from;
        assert_eq!(
            fill(&[
                ("POD_NAMESPACE", "ml"),
                ("KUBERNETES_POD_NAME", "k8s"),
                ("CONTAINER_NAME", "")
            ]),
            (s("k8s"), s("ml"), s(""))
        );
        assert_eq!(
            fill(&[
                ("KUBERNETES_POD_NAME", "k8s"),
                ("POD_NAME", "p"),
                ("CONTAINER_NAME", "c")
            ]),
            (s("p"), s(""), s("c"))
        );
        assert_eq!(fill(&[("POD_NAMEX", "no")]), (s(""), s(""), s("")));
    }

    #[test]
    fn acknowledgements_are_compared_across_the_wrap() {
        assert!(acknowledged(5, 5) && acknowledged(6, 5) && !acknowledged(4, 5));
        // The counter was at u64::MAX: the request is number 0, and the
        // acknowledgement of the one before it (u64::MAX) is not its own.
        assert!(!acknowledged(u64::MAX, 0));
        assert!(acknowledged(0, 0) && acknowledged(1, 0));
        assert!(acknowledged(0, u64::MAX) && !acknowledged(u64::MAX - 1, u64::MAX));
    }

    #[test]
    fn layout_is_pinned() {
        assert_eq!(size_of::<Header>(), 1024);
        assert_eq!(size_of::<DeviceSlot>(), 256);
        assert_eq!(size_of::<Page>(), 1024 + 64 * 256);
        let h = [
            (offset_of!(Header, magic), 0),
            (offset_of!(Header, version), 8),
            (offset_of!(Header, header_size), 12),
            (offset_of!(Header, page_size), 16),
            (offset_of!(Header, slot_size), 20),
            (offset_of!(Header, slot_count), 24),
            (offset_of!(Header, pid), 28),
            (offset_of!(Header, uid), 32),
            (offset_of!(Header, state), 36),
            (offset_of!(Header, start_time), 40),
            (offset_of!(Header, created_unix_ns), 48),
            (offset_of!(Header, trim_requests), 56),
            (offset_of!(Header, trim_acks), 64),
            (offset_of!(Header, counting), 72),
            (offset_of!(Header, limit_requests), 80),
            (offset_of!(Header, limit_acks), 88),
            (offset_of!(Header, park_state), 96),
            (offset_of!(Header, park_requests), 104),
            (offset_of!(Header, park_acks), 112),
            (offset_of!(Header, park_ask), 120),
            (offset_of!(Header, park_outcome), 128),
            (offset_of!(Header, group), 136),
            (offset_of!(Header, command), 200),
            (offset_of!(Header, pod), 712),
            (offset_of!(Header, namespace), 808),
            (offset_of!(Header, container), 872),
            (offset_of!(Header, park_mode), 936),
            (offset_of!(Header, parked_since), 944),
            (offset_of!(Header, last_activity), 952),
            (offset_of!(Header, parked), 960),
        ];
        for (got, want) in h {
            assert_eq!(got, want);
        }
        let s = [
            (offset_of!(DeviceSlot, budget), 0),
            (offset_of!(DeviceSlot, flags), 24),
            (offset_of!(DeviceSlot, cached), 32),
            (offset_of!(DeviceSlot, spilled), 40),
            (offset_of!(DeviceSlot, allocs), 48),
            (offset_of!(DeviceSlot, frees), 56),
            (offset_of!(DeviceSlot, refusals), 64),
            (offset_of!(DeviceSlot, cache_hits), 72),
            (offset_of!(DeviceSlot, cache_misses), 80),
            (offset_of!(DeviceSlot, evictions), 88),
            (offset_of!(DeviceSlot, trims), 96),
            (offset_of!(DeviceSlot, spill_allocs), 104),
            (offset_of!(DeviceSlot, promotions), 112),
            (offset_of!(DeviceSlot, uuid), 120),
            (offset_of!(DeviceSlot, pools), 136),
            (offset_of!(DeviceSlot, graphs), 144),
            (offset_of!(DeviceSlot, context), 152),
            (offset_of!(DeviceSlot, own), 160),
            (offset_of!(DeviceSlot, ceiling), 168),
            (offset_of!(DeviceSlot, requested), 176),
            (offset_of!(DeviceSlot, total), 184),
            (offset_of!(DeviceSlot, limit_changes), 192),
            (offset_of!(DeviceSlot, soft), 200),
            (offset_of!(DeviceSlot, soft_events), 208),
            (offset_of!(DeviceSlot, cache_waits), 216),
            (offset_of!(DeviceSlot, cache_ordered), 224),
            (offset_of!(DeviceSlot, operator), 232),
            (offset_of!(DeviceSlot, demotions), 240),
            (offset_of!(DeviceSlot, moved_bytes), 248),
        ];
        for (got, want) in s {
            assert_eq!(got, want);
        }
        // The budget's three words, in this order.
        assert_eq!(size_of::<DeviceBudget>(), 24);
    }

    #[test]
    fn text_fields() {
        let mut f = [0u8; 8];
        put_text(&mut f, "abcdefghij");
        assert_eq!(get_text(&f), "abcdefg");
        put_text(&mut f, "añb");
        assert_eq!(get_text(&f), "añb");
        put_text(&mut f, "aaaaaañ");
        assert_eq!(get_text(&f), "aaaaaa");
        assert_eq!(uuid_text(&[0; 16]), None);
        let mut u = [0u8; 16];
        u[0] = 0x5c;
        u[15] = 1;
        assert_eq!(
            uuid_text(&u).unwrap(),
            "GPU-5c000000-0000-0000-0000-000000000001"
        );
    }
}
