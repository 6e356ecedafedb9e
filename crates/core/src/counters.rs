//! The per-GPU values of a statistics page, listed once.
//!
//! Each entry of the list in this file names a value of a device slot as
//! readers show it: its [`SlotSnapshot`] field and type, how it is read
//! from a [`DeviceSlot`], its key in `vramcap stat --json`, and, when the
//! exporter serves it, its metric (type, name, help). From that one list
//! come [`SlotSnapshot`]'s fields, [`SlotSnapshot::read`] and [`COUNTERS`],
//! which the CLI's JSON and the exporter's per-GPU metrics go through, in
//! the list's order. A test of the CLI holds the schema and metric table
//! of docs/statistics.md to them.
//!
//! Adding a value: a field in [`DeviceSlot`] (from its reserved words, so
//! offsets stay), which the shim updates, then one entry here, then the
//! docs/statistics.md lines that test asks for.
//!
//! [`DeviceSlot`]'s layout is not made here: it is the page's interface
//! between builds, pinned field by field in `page.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::budget::NO_CAP;
use crate::page::{DeviceSlot, FLAG_ACTIVE, Page, get_text};

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Gauge,
    Counter,
}

impl MetricKind {
    /// The name the exposition format's `# TYPE` line uses.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
        }
    }
}

/// How the exporter serves a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: MetricKind,
    pub help: &'static str,
}

/// One value of a device slot, as every reader shows it.
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    /// Its [`SlotSnapshot`] field.
    pub field: &'static str,
    /// Its key in `vramcap stat --json`.
    pub json: &'static str,
    /// Its exporter metric; `None` when the exporter does not serve it.
    pub metric: Option<Metric>,
    /// Its value in a snapshot; `None` for no value (a GPU without a cap
    /// has no limit): `null` in JSON, no sample in the exporter.
    pub value: fn(&SlotSnapshot) -> Option<u64>,
}

/// The types a snapshot field may have.
trait FieldValue {
    fn value(&self) -> Option<u64>;
}

impl FieldValue for u64 {
    fn value(&self) -> Option<u64> {
        Some(*self)
    }
}

impl FieldValue for Option<u64> {
    fn value(&self) -> Option<u64> {
        *self
    }
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Makes [`SlotSnapshot`], [`SlotSnapshot::read`] and [`COUNTERS`] from
/// entries of the form
/// `FIELD: TYPE = |slot| READ, json "KEY" [, Gauge|Counter "METRIC" "HELP"];`.
macro_rules! counters {
    (@metric) => {
        None
    };
    (@metric $kind:ident $name:literal $help:literal) => {
        Some(Metric {
            name: $name,
            kind: MetricKind::$kind,
            help: $help,
        })
    };
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = |$slot:ident| $read:expr, json $json:literal
        $(, $kind:ident $metric:literal $help:literal)?;
    )*) => {
        /// Plain values read from one device slot.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct SlotSnapshot {
            /// The device index, as the process sees it.
            pub device: u32,
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )*
            /// The device UUID's 16 bytes, zero if unknown.
            pub uuid: [u8; 16],
        }

        impl SlotSnapshot {
            /// Reads slot `device` with atomic loads, one per value (see
            /// `page.rs` on why no snapshot of one instant is needed). The
            /// one cross-field rule, `peak >= used`, is restored here, as
            /// `peak` is raised just after `used`.
            pub fn read(device: u32, slot: &DeviceSlot) -> SlotSnapshot {
                let mut snap = SlotSnapshot {
                    device,
                    $($field: {
                        let $slot = slot;
                        $read
                    },)*
                    uuid: slot.uuid_bytes(),
                };
                snap.peak = snap.peak.max(snap.used);
                snap
            }
        }

        /// Every value of a device slot, in the order readers show them.
        pub const COUNTERS: &[Counter] = &[$(
            Counter {
                field: stringify!($field),
                json: $json,
                metric: counters!(@metric $($kind $metric $help)?),
                value: |s| FieldValue::value(&s.$field),
            },
        )*];
    };
}

counters! {
    /// The cap; `None` when the device has none (or it is not worked out yet).
    limit: Option<u64> = |s| s.budget.limit().filter(|&l| l != NO_CAP),
        json "limit_bytes",
        Gauge "vramcap_gpu_memory_limit_bytes"
        "Bytes the process may hold on the GPU under its vramcap cap (no sample when the GPU has no cap).";
    /// Bytes held as the cap counts them, cached blocks included.
    used: u64 = |s| s.budget.used(), json "used_bytes", Gauge "vramcap_gpu_memory_used_bytes" "Bytes the process holds on the GPU as the cap counts them, cached blocks included.";
    /// The highest `used` so far.
    peak: u64 = |s| s.budget.peak(), json "peak_bytes", Gauge "vramcap_gpu_memory_peak_bytes" "Highest vramcap_gpu_memory_used_bytes of the process on the GPU so far.";
    /// The soft limit (`VRAMCAP_SOFT_LIMIT`); `None` when there is none.
    soft_limit: Option<u64> = |s| Some(load(&s.soft)).filter(|&v| v != 0 && v != NO_CAP),
        json "soft_limit_bytes",
        Gauge "vramcap_gpu_memory_soft_limit_bytes"
        "Bytes above which the shim trims its cache and prefers spill for the process on the GPU (VRAMCAP_SOFT_LIMIT; no sample when there is none).";
    /// Times the process went above its soft limit.
    soft_events: u64 = |s| load(&s.soft_events), json "soft_limit_events", Counter "vramcap_soft_limit_events_total" "Times the process went above its soft limit on the GPU.";
    /// The operator's cap, which no change of the cap passes; `None` when there is none.
    operator_limit: Option<u64> = |s| Some(load(&s.operator)).filter(|&v| v != 0 && v != NO_CAP), json "operator_limit_bytes";
    /// Bytes in freed blocks kept for reuse (part of `used`).
    cached: u64 = |s| load(&s.cached), json "cached_bytes", Gauge "vramcap_gpu_memory_cached_bytes" "Bytes in freed blocks the shim keeps for reuse (part of used).";
    /// Bytes the process's stream-ordered pools keep reserved, their live
    /// allocations included (part of `used`; 0 under `VRAMCAP_COUNT=allocations`).
    pools: u64 = |s| load(&s.pools), json "pool_bytes", Gauge "vramcap_gpu_memory_pool_bytes" "Bytes the process's stream-ordered memory pools keep reserved on the GPU, their live allocations included (part of used).";
    /// The device's graph memory (part of `used`).
    graphs: u64 = |s| load(&s.graphs), json "graph_bytes", Gauge "vramcap_gpu_memory_graph_bytes" "Bytes of graph memory (allocation nodes of launched CUDA graphs) the process holds on the GPU (part of used).";
    /// The context's footprint (part of `used`).
    context: u64 = |s| load(&s.context), json "context_bytes", Gauge "vramcap_gpu_memory_context_bytes" "Bytes the process's CUDA contexts, modules and libraries hold on the GPU beyond its allocations (part of used).";
    /// Bytes placed in host memory past the cap.
    spilled: u64 = |s| load(&s.spilled), json "spilled_bytes", Gauge "vramcap_gpu_memory_spilled_bytes" "Bytes the process allocated on the GPU that were placed in host memory past the cap.";
    /// Allocations that succeeded, cache hits and spills included.
    allocs: u64 = |s| load(&s.allocs), json "allocations", Counter "vramcap_allocations_total" "Allocations that succeeded, cache hits and spills included.";
    frees: u64 = |s| load(&s.frees), json "frees", Counter "vramcap_frees_total" "Frees of memory the process allocated.";
    /// Allocations answered with out-of-memory because of the cap.
    refusals: u64 = |s| load(&s.refusals), json "refusals", Counter "vramcap_refusals_total" "Allocations refused (out of memory) because of the cap.";
    cache_hits: u64 = |s| load(&s.cache_hits), json "cache_hits", Counter "vramcap_cache_hits_total" "Allocations served from the freed-block cache.";
    cache_misses: u64 = |s| load(&s.cache_misses), json "cache_misses", Counter "vramcap_cache_misses_total" "Allocations the freed-block cache could not serve.";
    /// Reuses the cache made after waiting for a synchronisation.
    cache_waits: u64 = |s| load(&s.cache_waits), json "cache_waits", Counter "vramcap_cache_waits_total" "Times the freed-block cache waited for the GPU (a context synchronisation) before reusing a block.";
    /// Reuses the cache ordered with an event on the legacy stream, no wait.
    cache_ordered: u64 = |s| load(&s.cache_ordered), json "cache_ordered", Counter "vramcap_cache_ordered_total" "Times the freed-block cache ordered a reuse after earlier work with an event on the legacy stream instead of waiting.";
    /// Cached blocks given back to the driver for the bound or idle time.
    evictions: u64 = |s| load(&s.evictions), json "evictions", Counter "vramcap_cache_evictions_total" "Cached blocks given back to the driver for the cache's bound or idle time.";
    /// Cache trims done at `vramcap trim`'s request.
    trims: u64 = |s| load(&s.trims), json "trims";
    /// Allocations placed in host memory past the cap.
    spill_allocs: u64 = |s| load(&s.spill_allocs), json "spill_allocations", Counter "vramcap_spill_allocations_total" "Allocations placed in host memory past the cap.";
    /// Tiered spill: blocks moved onto the GPU, and to the host.
    promotions: u64 = |s| load(&s.promotions), json "promotions", Counter "vramcap_spill_promotions_total" "Blocks tiered spill moved from host memory onto the GPU.";
    demotions: u64 = |s| load(&s.demotions), json "demotions", Counter "vramcap_spill_demotions_total" "Blocks tiered spill moved from the GPU to host memory.";
    /// Tiered spill: bytes of every move, either way.
    moved_bytes: u64 = |s| load(&s.moved_bytes), json "moved_bytes", Counter "vramcap_spill_moved_bytes_total" "Bytes tiered spill moved between the GPU and host memory, either way.";
}

/// Plain values read from a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageSnapshot {
    pub pid: u32,
    pub uid: u32,
    pub start_time: u64,
    pub created_unix_ns: u64,
    pub command: String,
    pub group: String,
    /// Kubernetes identity recorded by the shim ("" when absent).
    pub pod: String,
    pub namespace: String,
    pub container: String,
    /// The devices the process has used, in index order.
    pub devices: Vec<SlotSnapshot>,
    /// The directory the page was read from (filled in by the scan; empty
    /// until then).
    pub dir: std::path::PathBuf,
    /// Parking: the state, since when, the bytes parked.
    pub park: Box<crate::park::ParkSnapshot>,
}

impl Page {
    /// Reads every value with atomic loads. Call only after
    /// [`check_header`] accepted the page.
    pub fn snapshot(&self) -> PageSnapshot {
        let h = &self.header;
        let devices = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.flags.load(Ordering::Relaxed) & FLAG_ACTIVE != 0)
            .map(|(i, s)| SlotSnapshot::read(i as u32, s))
            .collect();
        PageSnapshot {
            pid: h.pid,
            uid: h.uid,
            start_time: h.start_time,
            created_unix_ns: h.created_unix_ns,
            command: get_text(&h.command),
            group: get_text(&h.group),
            pod: get_text(&h.pod),
            namespace: get_text(&h.namespace),
            container: get_text(&h.container),
            devices,
            dir: std::path::PathBuf::new(),
            park: Box::new(crate::park::ParkSnapshot {
                mode: crate::park::ParkMode::from_word(h.park_mode),
                state: crate::park::ParkState::from_word(h.park_state.load(Ordering::Acquire)),
                since_unix_ns: h.parked_since.load(Ordering::Acquire),
                parked: h.parked.iter().map(|w| w.load(Ordering::Acquire)).collect(),
                // In the tail, after the page: the reader adds it.
                host_kept: 0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_metrics_follow_the_conventions() {
        let mut json = HashSet::new();
        let mut metrics = HashSet::new();
        for c in COUNTERS {
            assert!(json.insert(c.json), "{} twice", c.json);
            let Some(m) = c.metric else { continue };
            assert!(metrics.insert(m.name), "{} twice", m.name);
            assert!(m.name.starts_with("vramcap_"), "{}", m.name);
            // Prometheus' naming: counters end in _total, and only they do.
            assert_eq!(
                m.name.ends_with("_total"),
                m.kind == MetricKind::Counter,
                "{}",
                m.name
            );
            assert!(
                m.help.ends_with('.') && !m.help.contains('\n'),
                "{}",
                m.name
            );
        }
    }

    /// Each value is read from its own word of the slot.
    #[test]
    fn each_value_reads_its_own_field() {
        // SAFETY: a slot is atomic integers, for which zero bytes are valid.
        let slot: DeviceSlot = unsafe { std::mem::zeroed() };
        slot.budget.set_limit(1000);
        assert_eq!(slot.budget.try_reserve(200, 1000), Ok(()));
        assert!(slot.budget.release(50)); // used 150, peak 200
        let words = [
            (&slot.cached, 3),
            (&slot.spilled, 4),
            (&slot.allocs, 5),
            (&slot.frees, 6),
            (&slot.refusals, 7),
            (&slot.cache_hits, 8),
            (&slot.cache_misses, 9),
            (&slot.evictions, 10),
            (&slot.trims, 11),
            (&slot.spill_allocs, 12),
            (&slot.pools, 13),
            (&slot.graphs, 14),
            (&slot.context, 15),
            (&slot.soft, 16),
            (&slot.soft_events, 17),
            (&slot.cache_waits, 18),
            (&slot.cache_ordered, 19),
            (&slot.operator, 20),
            (&slot.promotions, 21),
            (&slot.demotions, 22),
            (&slot.moved_bytes, 23),
        ];
        for (w, v) in words {
            w.store(v, Ordering::Relaxed);
        }
        slot.set_uuid([7; 16]);
        let s = SlotSnapshot::read(2, &slot);
        let got: Vec<(&str, Option<u64>)> =
            COUNTERS.iter().map(|c| (c.json, (c.value)(&s))).collect();
        let want = [
            ("limit_bytes", Some(1000)),
            ("used_bytes", Some(150)),
            ("peak_bytes", Some(200)),
            ("soft_limit_bytes", Some(16)),
            ("soft_limit_events", Some(17)),
            ("operator_limit_bytes", Some(20)),
            ("cached_bytes", Some(3)),
            ("pool_bytes", Some(13)),
            ("graph_bytes", Some(14)),
            ("context_bytes", Some(15)),
            ("spilled_bytes", Some(4)),
            ("allocations", Some(5)),
            ("frees", Some(6)),
            ("refusals", Some(7)),
            ("cache_hits", Some(8)),
            ("cache_misses", Some(9)),
            ("cache_waits", Some(18)),
            ("cache_ordered", Some(19)),
            ("evictions", Some(10)),
            ("trims", Some(11)),
            ("spill_allocations", Some(12)),
            ("promotions", Some(21)),
            ("demotions", Some(22)),
            ("moved_bytes", Some(23)),
        ];
        assert_eq!(got, want);
        assert_eq!((s.device, s.uuid), (2, [7; 16]));

        // No cap: no limit value; peak is never below used.
        // SAFETY: as above.
        let slot: DeviceSlot = unsafe { std::mem::zeroed() };
        slot.budget.reset();
        assert_eq!(slot.budget.try_reserve(10, NO_CAP), Ok(()));
        let s = SlotSnapshot::read(0, &slot);
        assert_eq!((s.limit, s.used, s.peak), (None, 10, 10));
    }
}
