//! One setting's value at a time: the kinds a variable can hold, each
//! parsed with the standard error that names the variable and an example.

use std::fmt;
use std::path::PathBuf;

use super::{
    CACHE_VAR, CONTEXT_VAR, COUNT_VAR, LOG_VAR, PARK_MOVE_VAR, PARK_VAR, PARK_WAIT_VAR,
    SPILL_LIMIT_VAR, SPILL_VAR,
};
use crate::limit::LimitError;

/// What the cap counts (`VRAMCAP_COUNT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Everything the process holds on the GPU: its allocations, what its
    /// stream-ordered pools keep reserved, graph memory and the context's
    /// footprint (the default).
    Held,
    /// Its allocations only, as vramcap counted before 0.2: pools' retained
    /// memory, graph memory and the context are not capped.
    Allocations,
}

impl Counting {
    pub fn name(self) -> &'static str {
        match self {
            Counting::Held => "held",
            Counting::Allocations => "allocations",
        }
    }

    /// The value of [`crate::page::Header::counting`].
    pub fn page_code(self) -> u64 {
        match self {
            Counting::Held => crate::page::COUNTING_HELD,
            Counting::Allocations => crate::page::COUNTING_ALLOCATIONS,
        }
    }
}

/// Parses `VRAMCAP_COUNT` with the standard error.
pub fn parse_counting(value: &str) -> Result<Counting, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "held" => Ok(Counting::Held),
        "allocations" => Ok(Counting::Allocations),
        _ => Err(SettingsError::Other {
            var: COUNT_VAR,
            value: value.to_string(),
            expected: "held (everything the process holds on the GPU, the default) or allocations (its allocations only), e.g. VRAMCAP_COUNT=held",
        }),
    }
}

/// How the context's footprint is found (`VRAMCAP_CONTEXT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextCharge {
    /// Measured: NVML's figure for the process minus what vramcap counts
    /// of it; [`ContextCharge::FALLBACK`] where NVML cannot tell which
    /// process is this one.
    Auto,
    /// This many bytes per device the process uses, never measured.
    Bytes(u64),
}

impl ContextCharge {
    /// Charged when the footprint cannot be measured: a CUDA 12/13 context
    /// with the usual libraries loaded on a current data-centre GPU (an
    /// H200 with PyTorch measured 518 MiB; see the README).
    pub const FALLBACK: u64 = 512 << 20;
}

/// Parses `VRAMCAP_CONTEXT` with the standard error.
pub fn parse_context(value: &str) -> Result<ContextCharge, SettingsError> {
    let t = value.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(ContextCharge::Auto);
    }
    if t == "0" {
        return Ok(ContextCharge::Bytes(0));
    }
    crate::size::parse_size(t)
        .map(ContextCharge::Bytes)
        .map_err(|_| SettingsError::Other {
            var: CONTEXT_VAR,
            value: value.to_string(),
            expected: "auto (measured through NVML, the default) or a size charged per GPU, 0 for none (e.g. VRAMCAP_CONTEXT=600MiB)",
        })
}

/// Where allocations go once the cap is reached. There is no managed mode:
/// `VRAMCAP_SPILL=managed` is taken as [`Spill::Host`] with the warning
/// [`MANAGED_AS_HOST`] (docs/design/spill-modes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spill {
    Off,
    /// Pinned host memory mapped into the device's address space.
    Host,
    /// Plain device memory becomes managed memory that vramcap moves
    /// between the GPU and the host by how often kernels use it: the
    /// most-used blocks on the GPU, within the cap, the rest on the host.
    Tiered,
}

impl Spill {
    pub fn name(self) -> &'static str {
        match self {
            Spill::Off => "off",
            Spill::Host => "host",
            Spill::Tiered => "tiered",
        }
    }
}

/// The most host memory spill may take per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillLimit {
    Bytes(u64),
    /// Of the machine's physical memory.
    Percent(crate::size::Percent),
}

impl SpillLimit {
    /// The default: a quarter of the machine's memory.
    pub const DEFAULT: SpillLimit = SpillLimit::Percent(crate::size::Percent::QUARTER);
    /// With spill off, the limit bounds only parking's moves
    /// (`VRAMCAP_PARK_MOVE=shim`), whose host memory replaces the GPU
    /// memory the process gives up: three quarters of RAM, so that a
    /// 40 GiB notebook parks whole on a 128 GiB machine (the driver's
    /// checkpoint, the other move, is bounded by nothing).
    pub const PARKING_DEFAULT: SpillLimit =
        SpillLimit::Percent(crate::size::Percent::THREE_QUARTERS);

    pub fn resolve(self, host_bytes: u64) -> u64 {
        match self {
            SpillLimit::Bytes(b) => b,
            SpillLimit::Percent(p) => p.of(host_bytes),
        }
    }
}

/// The one line said when `VRAMCAP_SPILL=managed` is asked for: the mode is
/// gone (managed memory past the cap is memory the program could move onto
/// the GPU, unseen by NVML) and host spill serves instead.
pub const MANAGED_AS_HOST: &str = "VRAMCAP_SPILL=managed is taken as host (e.g. VRAMCAP_SPILL=host): managed memory past the cap could be moved onto the GPU by the program, unseen by NVML";

/// Parses `VRAMCAP_SPILL` with the standard error; the second value is
/// whether it asked for the removed managed mode (taken as host).
pub fn parse_spill(value: &str) -> Result<(Spill, bool), SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "off" => Ok((Spill::Off, false)),
        "managed" => Ok((Spill::Host, true)),
        "host" => Ok((Spill::Host, false)),
        "tiered" => Ok((Spill::Tiered, false)),
        _ => Err(SettingsError::Other {
            var: SPILL_VAR,
            value: value.to_string(),
            expected: "off, host or tiered (e.g. VRAMCAP_SPILL=host)",
        }),
    }
}

/// Parses `VRAMCAP_SPILL_LIMIT` with the standard error.
pub fn parse_spill_limit(value: &str) -> Result<SpillLimit, SettingsError> {
    let err = || SettingsError::Other {
        var: SPILL_LIMIT_VAR,
        value: value.to_string(),
        expected: "a size (e.g. 8GiB) or a percentage of the machine's memory (e.g. 25%)",
    };
    let t = value.trim();
    if let Some(n) = t.strip_suffix('%') {
        return crate::size::Percent::parse_number(n)
            .map(SpillLimit::Percent)
            .map_err(|_| err());
    }
    crate::size::parse_size(t)
        .map(SpillLimit::Bytes)
        .map_err(|_| err())
}

/// How much freed memory the shim may keep per device for reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheBound {
    Off,
    Bytes(u64),
    /// Of the device's cap, or of its memory when it has no cap.
    Percent(crate::size::Percent),
}

impl CacheBound {
    /// The default: a quarter of the cap.
    pub const DEFAULT: CacheBound = CacheBound::Percent(crate::size::Percent::QUARTER);

    /// The bound in bytes for a device whose cap (or memory) is `base`.
    pub fn resolve(self, base: u64) -> u64 {
        match self {
            CacheBound::Off => 0,
            CacheBound::Bytes(b) => b,
            CacheBound::Percent(p) => p.of(base),
        }
    }
}

/// Parses a duration: `500ms`, `5s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    parse_duration_or_zero(text).filter(|d| !d.is_zero())
}

/// A duration as [`parse_duration`] takes it, zero included (`0`, `0s`,
/// `0ms` and `0.0m` alike): for the settings where zero means "none" or
/// "at once". Whatever unit, a zero is a zero and a positive value is
/// positive, so `0s` and `0` are never told apart.
pub fn parse_duration_or_zero(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => return None,
    };
    (0.0..=86_400.0 * 365.0)
        .contains(&secs)
        .then(|| std::time::Duration::from_secs_f64(secs))
}

/// Where pages go when `VRAMCAP_STATS_DIR` is unset: `$XDG_RUNTIME_DIR/vramcap`
/// when `XDG_RUNTIME_DIR` is the user's own private directory, else
/// `/dev/shm/vramcap-<uid>` (see [`crate::stats_dir`], which also checks
/// that the directory is the user's before anything goes in it).
pub fn default_stats_dir(uid: u32) -> PathBuf {
    crate::stats_dir::default_dir(
        uid,
        std::env::var_os(crate::stats_dir::RUNTIME_VAR).as_deref(),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl LogLevel {
    pub fn parse(text: &str) -> Option<LogLevel> {
        match text.trim().to_ascii_lowercase().as_str() {
            "error" => Some(LogLevel::Error),
            "warn" | "warning" => Some(LogLevel::Warn),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsError {
    Limit(LimitError),
    /// The operator's cap file is root's but holds no cap (the line says why).
    Operator(String),
    Other {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsError::Limit(e) => e.fmt(f),
            SettingsError::Operator(why) => f.write_str(why),
            SettingsError::Other {
                var,
                value,
                expected,
            } => {
                write!(
                    f,
                    "{var}=\"{}\" is not valid: expected {expected}",
                    value.escape_debug()
                )
            }
        }
    }
}

impl std::error::Error for SettingsError {}

/// Parses a log level value with the standard error.
pub fn parse_log_level(value: &str) -> Result<LogLevel, SettingsError> {
    LogLevel::parse(value).ok_or_else(|| SettingsError::Other {
        var: LOG_VAR,
        value: value.to_string(),
        expected: "one of error, warn, info, debug (e.g. VRAMCAP_LOG=info)",
    })
}

/// Parses a `VRAMCAP_CACHE` value with the standard error.
pub fn parse_cache(value: &str) -> Result<CacheBound, SettingsError> {
    let err = || SettingsError::Other {
        var: CACHE_VAR,
        value: value.to_string(),
        expected: "a size (e.g. 2GiB), a percentage of each GPU's cap (e.g. 25%), or off",
    };
    let t = value.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(CacheBound::Off);
    }
    if let Some(n) = t.strip_suffix('%') {
        return crate::size::Percent::parse_number(n)
            .map(CacheBound::Percent)
            .map_err(|_| err());
    }
    crate::size::parse_size(t)
        .map(CacheBound::Bytes)
        .map_err(|_| err())
}

const PARK_EXPECTED: &str = "manual (parked only by vramcap park) or idle:DURATION (also parked when idle that long and a group member needs room), e.g. VRAMCAP_PARK=idle:10m";

/// Parses `VRAMCAP_PARK` (`manual` or `idle:DURATION`).
pub fn parse_park(value: &str) -> Result<crate::park::ParkMode, SettingsError> {
    let t = value.trim();
    let err = || SettingsError::Other {
        var: PARK_VAR,
        value: value.to_string(),
        expected: PARK_EXPECTED,
    };
    if t.eq_ignore_ascii_case("manual") {
        return Ok(crate::park::ParkMode::Manual);
    }
    let rest = t
        .get(..5)
        .filter(|p| p.eq_ignore_ascii_case("idle:"))
        .map(|_| &t[5..])
        .ok_or_else(err)?;
    // `idle:0` is "idle as soon as no call is in flight", as `idle:1ms`
    // is (idleness is judged once a tick): zero is no threshold, not an
    // error, whatever its unit.
    parse_duration_or_zero(rest)
        .map(crate::park::ParkMode::Idle)
        .ok_or_else(err)
}

/// Parses `VRAMCAP_PARK_MOVE`: `checkpoint`, `shim` or `shim+checkpoint`.
pub fn parse_park_move(value: &str) -> Result<crate::park::ParkMove, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "checkpoint" => Ok(crate::park::ParkMove::Checkpoint),
        "shim" => Ok(crate::park::ParkMove::Shim),
        "shim+checkpoint" => Ok(crate::park::ParkMove::ShimThenCheckpoint),
        _ => Err(SettingsError::Other {
            var: PARK_MOVE_VAR,
            value: value.to_string(),
            expected: "shim (the default), shim+checkpoint or checkpoint, e.g. VRAMCAP_PARK_MOVE=shim+checkpoint",
        }),
    }
}

/// Parses `VRAMCAP_PARK_WAIT` (how long an allocation waits for room when
/// no group member can be parked; `0` is the default, refuse at once).
pub fn parse_park_wait(value: &str) -> Result<std::time::Duration, SettingsError> {
    // `0`, `0s`, `0ms`: all "none".
    parse_duration_or_zero(value).ok_or_else(|| SettingsError::Other {
        var: PARK_WAIT_VAR,
        value: value.to_string(),
        expected: "a duration, 0 or 0s for none (the default), e.g. VRAMCAP_PARK_WAIT=30s",
    })
}
