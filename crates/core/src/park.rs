//! Parking (issue 34, docs/design/parking.md): the words a parked process's
//! page carries, the request a reader posts, the outcomes and their fixed
//! texts, and `VRAMCAP_PARK`'s grammar. Plain values: the shim acts on
//! them, the CLI reads and posts them.
//!
//! The page's header holds the state ([`ParkState`]), the request counter
//! and its acknowledgement (with [`Ask`], what was asked), the last
//! outcome ([`Outcome`], packed as `code | detail << 32`), when the process
//! was parked, when it was last seen active, the parked bytes of GPUs
//! `0..PARK_DEVICES` and its mode ([`ParkMode::word`]). `VRAMCAP_PARK`'s
//! grammar is in `settings` (`parse_park`).

use std::fmt;
use std::time::Duration;

/// GPUs whose parked bytes the page records (0..8); a process holding
/// memory on a later index is refused ([`Outcome::TooManyDevices`]).
pub const PARK_DEVICES: usize = 8;
/// The real free memory a resume needs beyond the parked bytes.
pub const RESUME_MARGIN: u64 = 64 << 20;

/// Whether nvidia-smi's `free` of a GPU whose driver total is `total` can
/// be true. NVML counts memory the driver's total leaves out (the H200 at
/// r580: 143771 MiB against 143157, and 64 KiB more free than the
/// driver's total on an empty GPU), so a true answer may pass the total a
/// little; one past it by more than a sixteenth is no measure (a resume
/// trusted to it could restore into no room and stick). `total` 0 (not
/// read) trusts any answer.
pub fn believable_free(free: u64, total: u64) -> bool {
    total == 0 || free <= total.saturating_add(total / 16)
}

/// The process's parking state (`Header::park_state`); 0 is `Running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum ParkState {
    #[default]
    Running = 0,
    Parking = 1,
    Parked = 2,
    Resuming = 3,
    /// A restore failed: the driver holds the process stuck; never retried.
    Failed = 4,
}

impl ParkState {
    pub fn from_word(w: u64) -> ParkState {
        match w {
            1 => ParkState::Parking,
            2 => ParkState::Parked,
            3 => ParkState::Resuming,
            4 => ParkState::Failed,
            _ => ParkState::Running,
        }
    }

    /// The word readers show (`stat`, `--json`, `top`, the exporter).
    pub fn name(self) -> &'static str {
        match self {
            ParkState::Running => "running",
            ParkState::Parking => "parking",
            ParkState::Parked => "parked",
            ParkState::Resuming => "resuming",
            ParkState::Failed => "failed",
        }
    }
}

/// What readers show of a process's parking (read by `Page::snapshot`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParkSnapshot {
    /// Started with `VRAMCAP_PARK`.
    pub mode: Option<ParkMode>,
    pub state: ParkState,
    /// Unix ns, 0 when not parked.
    pub since_unix_ns: u64,
    /// Bytes parked per GPU (index order; `PARK_DEVICES` of them, or
    /// none in a default value).
    pub parked: Vec<u64>,
    /// Host memory kept for the next park by the shim's moves
    /// (`page::Tail`; 0 in a page without it).
    pub host_kept: u64,
}

impl ParkSnapshot {
    /// Every GPU's parked bytes, saturating: the words are a page's,
    /// which anyone who may write it can set, so their sum may not fit.
    pub fn bytes(&self) -> u64 {
        self.parked
            .iter()
            .fold(0u64, |sum, &b| sum.saturating_add(b))
    }

    /// The bytes parked of GPU `index` (0 past [`PARK_DEVICES`]).
    pub fn on(&self, index: u32) -> u64 {
        self.parked.get(index as usize).copied().unwrap_or(0)
    }

    /// Seconds parked at `now_ns`, `None` when not parked.
    pub fn seconds(&self, now_ns: u64) -> Option<f64> {
        (self.since_unix_ns != 0).then(|| now_ns.saturating_sub(self.since_unix_ns) as f64 / 1e9)
    }

    /// What a table shows before the command: `[parked 1.00 GiB, 12s] `,
    /// `[failed] ` and the like; empty when running.
    pub fn label(&self, now_ns: u64) -> String {
        match self.state {
            ParkState::Running if self.host_kept > 0 => format!(
                "[{} host memory kept for parking] ",
                crate::human_bytes(self.host_kept)
            ),
            ParkState::Running => String::new(),
            ParkState::Parked => format!(
                "[parked {}, {:.0}s] ",
                crate::human_bytes(self.bytes()),
                self.seconds(now_ns).unwrap_or(0.0)
            ),
            s => format!("[{}] ", s.name()),
        }
    }
}

/// What a request asks (`Header::park_ask`, written before the counter is raised).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Ask {
    Park = 1,
    Resume = 2,
    /// Park only if idle now by the process's own `idle:T` (the policy's
    /// ask: the member re-checks, so a process that became active or
    /// waits inside a call is never parked).
    ParkIfIdle = 3,
}

impl Ask {
    pub fn from_word(w: u64) -> Option<Ask> {
        match w {
            1 => Some(Ask::Park),
            2 => Some(Ask::Resume),
            3 => Some(Ask::ParkIfIdle),
            _ => None,
        }
    }
}

/// The last request's outcome (`Header::park_outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    ManagedMemory,
    IpcExport,
    Nccl,
    Capture,
    TieredMoving,
    NotEnabled,
    /// The detail is the device index that lacked room.
    NoRoom(u32),
    NoCheckpointApi,
    /// The detail is the driver's error code.
    DriverError(u32),
    /// The detail is the device index past [`PARK_DEVICES`].
    TooManyDevices(u32),
    /// A restore failed and the process is stuck (the detail: the driver's code).
    Stuck(u32),
    /// A CUDA call of the program did not end within the lock's timeout.
    Busy,
    /// Asked [`Ask::ParkIfIdle`]: the process was active within its
    /// threshold, or a call of it is waiting inside the shim.
    NotIdle,
    /// The free memory of a GPU it holds memory on cannot be measured (the
    /// detail: its index), so a resume could never be allowed.
    Unmeasured(u32),
    /// Nothing was asked when the request was answered: it was withdrawn
    /// (by an asker that gave up), or an earlier answer took its ask.
    /// Nothing was done for it.
    Withdrawn,
}

impl Outcome {
    /// `code | detail << 32`.
    pub fn word(self) -> u64 {
        let (code, detail) = match self {
            Outcome::Ok => (0, 0),
            Outcome::ManagedMemory => (1, 0),
            Outcome::IpcExport => (2, 0),
            Outcome::Nccl => (3, 0),
            Outcome::Capture => (4, 0),
            Outcome::TieredMoving => (5, 0),
            Outcome::NotEnabled => (6, 0),
            Outcome::NoRoom(d) => (7, d),
            Outcome::NoCheckpointApi => (8, 0),
            Outcome::DriverError(n) => (9, n),
            Outcome::TooManyDevices(d) => (10, d),
            Outcome::Stuck(n) => (11, n),
            Outcome::Busy => (12, 0),
            Outcome::NotIdle => (13, 0),
            Outcome::Unmeasured(d) => (14, d),
            Outcome::Withdrawn => (15, 0),
        };
        code | u64::from(detail) << 32
    }

    pub fn from_word(w: u64) -> Outcome {
        let d = (w >> 32) as u32;
        match w & 0xffff_ffff {
            0 => Outcome::Ok,
            1 => Outcome::ManagedMemory,
            2 => Outcome::IpcExport,
            3 => Outcome::Nccl,
            4 => Outcome::Capture,
            5 => Outcome::TieredMoving,
            6 => Outcome::NotEnabled,
            7 => Outcome::NoRoom(d),
            8 => Outcome::NoCheckpointApi,
            10 => Outcome::TooManyDevices(d),
            11 => Outcome::Stuck(d),
            12 => Outcome::Busy,
            13 => Outcome::NotIdle,
            14 => Outcome::Unmeasured(d),
            15 => Outcome::Withdrawn,
            _ => Outcome::DriverError(d),
        }
    }
}

/// The fixed texts: what follows "cannot park: " or "cannot resume: ".
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok => f.write_str("done"),
            Outcome::ManagedMemory => f.write_str(
                "it holds managed (unified) memory, which neither the driver's checkpoint nor the shim's moves take",
            ),
            Outcome::IpcExport => f.write_str(
                "it exported GPU memory to other processes (an IPC or shareable handle), which the driver cannot checkpoint",
            ),
            Outcome::Nccl => f.write_str(
                "it has NCCL loaded and uses more than one GPU (NCCL's peer transfers cannot be checkpointed)",
            ),
            Outcome::Capture => f.write_str("a stream capture is in progress"),
            Outcome::TieredMoving => f.write_str("tiered spill is moving memory"),
            Outcome::NotEnabled => f.write_str(
                "it was not started with parking (VRAMCAP_PARK); start it as vramcap run --park manual …",
            ),
            Outcome::NoRoom(d) => write!(f, "no room on GPU {d} for its parked memory"),
            Outcome::NoCheckpointApi => f.write_str(
                "the driver lacks the checkpoint API (cuCheckpointProcess*, driver r570 or later)",
            ),
            Outcome::DriverError(n) => write!(f, "the driver's checkpoint call failed (error {n})"),
            Outcome::TooManyDevices(d) => write!(
                f,
                "it holds memory on GPU {d}; parking covers GPUs 0 to {}",
                PARK_DEVICES - 1
            ),
            Outcome::Stuck(n) => write!(
                f,
                "the driver's restore or unlock failed (error {n}): the process is stuck and cannot continue"
            ),
            Outcome::Busy => f.write_str(
                "a CUDA call of the program did not end within 10 s (try again when it is idle)",
            ),
            Outcome::NotIdle => f.write_str(
                "it is not idle (it called CUDA within its VRAMCAP_PARK=idle threshold, or a call of it is waiting)",
            ),
            Outcome::Unmeasured(d) => write!(
                f,
                "the free memory of GPU {d} cannot be measured, so it could never resume (a resume runs nvidia-smi: put it on the process's PATH, or in /usr/bin)"
            ),
            Outcome::Withdrawn => f.write_str(
                "the request was withdrawn or answered with another before it was read; nothing was done (ask again)",
            ),
        }
    }
}

/// `VRAMCAP_PARK_MOVE`: what moves a parked process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParkMove {
    /// The driver's checkpoint of the whole process.
    #[default]
    Checkpoint,
    /// The shim moves its blocks (VMM memory behind fixed addresses) to
    /// host memory and back itself, and leaves the rest on the GPU.
    Shim,
    /// The shim moves its blocks, then the driver's checkpoint takes the
    /// rest (the context, small and pool allocations): nothing of the
    /// process stays on the GPU.
    ShimThenCheckpoint,
}

impl ParkMove {
    /// Whether the shim moves the blocks itself (they are made as VMM
    /// memory for it).
    pub fn moves_blocks(self) -> bool {
        matches!(self, ParkMove::Shim | ParkMove::ShimThenCheckpoint)
    }

    /// Whether the driver's checkpoint is part of a park.
    pub fn checkpoints(self) -> bool {
        matches!(self, ParkMove::Checkpoint | ParkMove::ShimThenCheckpoint)
    }
}

/// `VRAMCAP_PARK`: parked only when asked, or also by the idle policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkMode {
    Manual,
    Idle(Duration),
}

/// `Header::park_mode` of a process started without parking.
pub const MODE_OFF: u64 = 0;
/// `Header::park_mode` of [`ParkMode::Manual`].
pub const MODE_MANUAL: u64 = u64::MAX;

impl ParkMode {
    /// The page word: [`MODE_MANUAL`], or the idle threshold in ms (at least 1).
    pub fn word(self) -> u64 {
        match self {
            ParkMode::Manual => MODE_MANUAL,
            ParkMode::Idle(t) => (t.as_millis() as u64).clamp(1, MODE_MANUAL - 1),
        }
    }

    /// The mode a page word records, `None` for [`MODE_OFF`].
    pub fn from_word(w: u64) -> Option<ParkMode> {
        match w {
            MODE_OFF => None,
            MODE_MANUAL => Some(ParkMode::Manual),
            ms => Some(ParkMode::Idle(Duration::from_millis(ms))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_a_little_past_the_total_is_believed() {
        // Seen on the H200: nvidia-smi's free of an empty GPU against the driver's total.
        assert!(believable_free(150_109_945_856, 150_109_880_320));
        let t = 16 << 30;
        assert!(believable_free(t + (1 << 30), t));
        assert!(!believable_free(t + (1 << 30) + 1, t));
        assert!(!believable_free(99_999_999 << 20, 150_109_880_320));
        assert!(believable_free(u64::MAX, 0));
        assert!(believable_free(u64::MAX, u64::MAX));
    }

    #[test]
    fn a_running_process_with_host_memory_kept_says_so() {
        let s = ParkSnapshot {
            host_kept: 12 << 30,
            ..Default::default()
        };
        assert_eq!(s.label(0), "[12.0 GiB host memory kept for parking] ");
        assert_eq!(ParkSnapshot::default().label(0), "");
    }

    #[test]
    fn parked_bytes_saturate() {
        let s = ParkSnapshot {
            parked: vec![u64::MAX, 1, u64::MAX - 5],
            ..Default::default()
        };
        assert_eq!(s.bytes(), u64::MAX);
        let s = ParkSnapshot {
            parked: vec![1 << 30, 2 << 30],
            ..Default::default()
        };
        assert_eq!(s.bytes(), 3 << 30);
    }

    #[test]
    fn words_round_trip() {
        for m in [ParkMode::Manual, ParkMode::Idle(Duration::from_secs(600))] {
            assert_eq!(ParkMode::from_word(m.word()), Some(m));
        }
        assert_eq!(ParkMode::from_word(MODE_OFF), None);
        for s in 0..5 {
            assert_eq!(ParkState::from_word(s) as u64, s);
        }
        for o in [
            Outcome::Ok,
            Outcome::ManagedMemory,
            Outcome::IpcExport,
            Outcome::Nccl,
            Outcome::Capture,
            Outcome::TieredMoving,
            Outcome::NotEnabled,
            Outcome::NoRoom(3),
            Outcome::NoCheckpointApi,
            Outcome::DriverError(801),
            Outcome::TooManyDevices(9),
            Outcome::Stuck(304),
            Outcome::Busy,
            Outcome::NotIdle,
            Outcome::Unmeasured(2),
            Outcome::Withdrawn,
        ] {
            assert_eq!(Outcome::from_word(o.word()), o);
        }
        assert_eq!(Outcome::Withdrawn.word(), 15);
        assert_eq!(Outcome::DriverError(801).word(), 9 | 801 << 32);
    }

    #[test]
    fn outcome_texts_are_fixed() {
        assert_eq!(
            Outcome::ManagedMemory.to_string(),
            "it holds managed (unified) memory, which neither the driver's checkpoint nor the shim's moves take"
        );
        assert_eq!(
            Outcome::Stuck(304).to_string(),
            "the driver's restore or unlock failed (error 304): the process is stuck and cannot continue"
        );
        assert_eq!(
            Outcome::TooManyDevices(8).to_string(),
            "it holds memory on GPU 8; parking covers GPUs 0 to 7"
        );
    }
}
