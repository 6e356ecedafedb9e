//! Every `VRAMCAP_*` setting, read once into a struct.
//!
//! The shim reads these in its constructor and exits with status 2 on any bad
//! value, before the program's `main`; the CLI uses the same code to refuse a
//! bad `--limit` before it starts anything.
//!
//! [`KNOWN_VARS`] is the one list of `VRAMCAP_*` names: the shim (at load),
//! `vramcap run`/`env` (a warning each) and `vramcap doctor` (a failure)
//! check the environment against it with [`unknown_vars`], so a misspelt
//! setting (`VRAMCAP_LIMT`, `vramcap_limit`) is never silently ignored.

use std::fmt;
use std::path::PathBuf;

use crate::limit::{LIMIT_VAR, LimitError, LimitSpec, parse_limit};

pub const LOG_VAR: &str = "VRAMCAP_LOG";
pub const CUDA_LIBRARY_VAR: &str = "VRAMCAP_CUDA_LIBRARY";
pub const DISABLE_VAR: &str = "VRAMCAP_DISABLE";
pub const STATS_VAR: &str = "VRAMCAP_STATS";
pub const CACHE_VAR: &str = "VRAMCAP_CACHE";
pub const SPILL_VAR: &str = "VRAMCAP_SPILL";
pub const GROUP_VAR: &str = "VRAMCAP_GROUP";
pub const SPILL_LIMIT_VAR: &str = "VRAMCAP_SPILL_LIMIT";
pub const COUNT_VAR: &str = "VRAMCAP_COUNT";
pub const SOFT_LIMIT_VAR: &str = "VRAMCAP_SOFT_LIMIT";
pub const CONTEXT_VAR: &str = "VRAMCAP_CONTEXT";
/// NVIDIA's per-container GPU memory limit (the container toolkit's
/// `apply-cuda-memory-limits` hook, drivers r615+): whole MiB, every GPU.
pub const NVIDIA_LIMIT_VAR: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// The operator's cap: a file only root can write (mounted read-only into a
/// container), in the `VRAMCAP_LIMIT` grammar. It only ever makes the cap
/// stricter; nothing in the process's environment lifts it.
pub const OPERATOR_LIMIT_PATH: &str = "/run/vramcap/operator-limit";
/// Read by the CLI only: where `vramcap run`/`env` find the shim.
pub const LIBRARY_VAR: &str = "VRAMCAP_LIBRARY";

/// Every `VRAMCAP_*` setting a user may set: the shim's and the CLI's. A
/// misspelt name is told the closest of these.
pub const SETTING_VARS: &[&str] = &[
    LIMIT_VAR,
    LOG_VAR,
    CUDA_LIBRARY_VAR,
    DISABLE_VAR,
    CACHE_VAR,
    CACHE_IDLE_VAR,
    SPILL_VAR,
    SPILL_LIMIT_VAR,
    GROUP_VAR,
    COUNT_VAR,
    CONTEXT_VAR,
    SOFT_LIMIT_VAR,
    STATS_VAR,
    STATS_DIR_VAR,
    LIBRARY_VAR,
];

/// `VRAMCAP_*` names that are not settings but belong to vramcap's own
/// tools, so they are not warned about: `vramcap doctor`'s child check,
/// `scripts/demo.sh`'s cap and the release build's linker switch.
pub const TOOL_VARS: &[&str] = &[
    "VRAMCAP_PROBE_GPU",
    "VRAMCAP_DEMO_LIMIT",
    "VRAMCAP_ZIG_LINKER",
];

/// Every known `VRAMCAP_*` name: [`SETTING_VARS`] and [`TOOL_VARS`].
pub const KNOWN_VARS: [&[&str]; 2] = [SETTING_VARS, TOOL_VARS];

/// An environment variable that looks like a vramcap setting but is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    pub name: String,
    pub value: String,
    /// The known setting closest to `name`.
    pub closest: &'static str,
}

impl fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value: String = self.value.chars().take(100).collect();
        write!(
            f,
            "{}={}{}: not a vramcap setting; did you mean {}?",
            self.name.escape_debug(),
            value.escape_debug(),
            if value.len() < self.value.len() {
                "…"
            } else {
                ""
            },
            self.closest
        )
    }
}

/// Edit distance (insertions, deletions, substitutions and swaps of two
/// neighbours all cost one), over bytes.
fn distance(a: &[u8], b: &[u8]) -> usize {
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

/// The variables among `vars` (name, value) whose name starts with
/// `VRAMCAP_` in any case but is no known name exactly, each with the
/// closest setting (case ignored; the first in [`SETTING_VARS`] on a tie).
pub fn unknown_vars<N: AsRef<str>, V: AsRef<str>>(
    vars: impl IntoIterator<Item = (N, V)>,
) -> Vec<UnknownVar> {
    let mut out = Vec::new();
    for (name, value) in vars {
        let name = name.as_ref();
        let looks_like_ours = name
            .get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("VRAMCAP_"));
        if !looks_like_ours || KNOWN_VARS.iter().any(|list| list.contains(&name)) {
            continue;
        }
        let upper = name.to_ascii_uppercase();
        let closest = SETTING_VARS
            .iter()
            .min_by_key(|k| distance(upper.as_bytes(), k.as_bytes()))
            .copied()
            .unwrap_or(LIMIT_VAR);
        out.push(UnknownVar {
            name: name.to_string(),
            value: value.as_ref().to_string(),
            closest,
        });
    }
    out
}

/// [`unknown_vars`] of the process environment (names and values that are
/// not UTF-8 are read lossily).
pub fn unknown_vars_in_env() -> Vec<UnknownVar> {
    unknown_vars(std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    }))
}

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

/// Where allocations go once the cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spill {
    Off,
    /// Managed memory advised to live on the host and be read by the device.
    Managed,
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
            Spill::Managed => "managed",
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

    pub fn resolve(self, host_bytes: u64) -> u64 {
        match self {
            SpillLimit::Bytes(b) => b,
            SpillLimit::Percent(p) => p.of(host_bytes),
        }
    }
}

/// Parses `VRAMCAP_SPILL` with the standard error.
pub fn parse_spill(value: &str) -> Result<Spill, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "off" => Ok(Spill::Off),
        "managed" => Ok(Spill::Managed),
        "host" => Ok(Spill::Host),
        "tiered" => Ok(Spill::Tiered),
        _ => Err(SettingsError::Other {
            var: SPILL_VAR,
            value: value.to_string(),
            expected: "off, managed, host or tiered (e.g. VRAMCAP_SPILL=tiered)",
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
pub const CACHE_IDLE_VAR: &str = "VRAMCAP_CACHE_IDLE";

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
    (secs > 0.0 && secs <= 86_400.0 * 365.0).then(|| std::time::Duration::from_secs_f64(secs))
}
pub const STATS_DIR_VAR: &str = "VRAMCAP_STATS_DIR";

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
pub struct Settings {
    pub limit: LimitSpec,
    pub log: LogLevel,
    /// Where the real driver is, when `libcuda.so.1` on the search path is not it.
    pub cuda_library: Option<PathBuf>,
    /// `VRAMCAP_DISABLE=1`: the shim passes every call straight through.
    pub disabled: bool,
    /// `VRAMCAP_STATS=off`: no statistics page (the cap still holds).
    pub stats: bool,
    /// `VRAMCAP_STATS_DIR`: where pages go, instead of [`default_stats_dir`].
    pub stats_dir: Option<PathBuf>,
    /// `VRAMCAP_CACHE`: the freed-block cache's bound per device.
    pub cache: CacheBound,
    /// `VRAMCAP_CACHE_IDLE`: cached blocks unused this long go back to the driver.
    pub cache_idle: std::time::Duration,
    /// `VRAMCAP_SPILL`: where allocations go past the cap.
    pub spill: Spill,
    /// `VRAMCAP_SPILL_LIMIT`: host memory spill may take per process.
    pub spill_limit: SpillLimit,
    /// `VRAMCAP_GROUP`: share one budget per GPU with this group's members.
    pub group: Option<String>,
    /// `VRAMCAP_LIMIT` as given (a group's first member records it).
    pub limit_text: String,
    /// `VRAMCAP_COUNT`: what the cap counts.
    pub counting: Counting,
    /// `VRAMCAP_CONTEXT`: how the context's footprint is found.
    pub context: ContextCharge,
    /// `VRAMCAP_SOFT_LIMIT`: above it the shim trims its cache and prefers
    /// spill (the `VRAMCAP_LIMIT` grammar; empty: none).
    pub soft: LimitSpec,
    /// `NVIDIA_GPU_MEMORY_LIMIT` in bytes: a cap for every GPU, made one
    /// with `VRAMCAP_LIMIT` by taking the stricter.
    pub nvidia_limit: Option<u64>,
    /// The operator's cap ([`OPERATOR_LIMIT_PATH`]), when the file is there
    /// ([`read_operator_limit`]); `from_lookup` never sets it.
    pub operator: Option<LimitSpec>,
}

/// Reads the operator's cap at `path`: `Ok(None)` when there is no file.
///
/// A file the caller could have written itself (its own, unless the caller
/// is root, or writable by group or others) is `Err(Unusable)`: the shim
/// warns and goes on with the caps it has, which ignoring such a file never
/// loosens. Any other file binds: if it cannot be opened or read, is not a
/// regular file (no link is followed: the file is opened first, then looked
/// at), is not UTF-8, or holds no usable cap, that is `Err(Bad)` and the
/// shim refuses to run. Blank lines and `#` comments are skipped; what is
/// left is one `VRAMCAP_LIMIT` value with a default (every GPU gets a cap)
/// and no index keys (indices follow `CUDA_VISIBLE_DEVICES`, which the
/// process chooses; UUID keys do not).
pub fn read_operator_limit(path: &std::path::Path) -> Result<Option<LimitSpec>, OperatorError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display();
    // SAFETY: geteuid cannot fail.
    let caller = unsafe { libc::geteuid() };
    let mine = |uid: u32| uid == caller && caller != 0;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let owner = std::fs::symlink_metadata(path)
                .map(|m| m.uid())
                .unwrap_or(0);
            if mine(owner) {
                return Err(OperatorError::Unusable(format!(
                    "{shown} is a symbolic link of yours"
                )));
            }
            return Err(OperatorError::Bad(format!(
                "{shown} is a symbolic link; the operator's cap must be a regular file (in Kubernetes, mount the ConfigMap key with subPath)"
            )));
        }
        Err(e) => return Err(OperatorError::Bad(format!("cannot open {shown}: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| OperatorError::Bad(format!("cannot inspect {shown}: {e}")))?;
    if mine(meta.uid()) || meta.mode() & 0o022 != 0 {
        return Err(OperatorError::Unusable(format!(
            "{shown} could have been written by this user (owner uid {}, mode {:o}); the operator's cap is a file only root writes",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    if !meta.is_file() {
        return Err(OperatorError::Bad(format!("{shown} is not a regular file")));
    }
    let mut bytes = Vec::new();
    file.take(4097)
        .read_to_end(&mut bytes)
        .map_err(|e| OperatorError::Bad(format!("cannot read {shown}: {e}")))?;
    let bad = |why: String| {
        OperatorError::Bad(format!(
            "{shown}: {why} (the file holds the operator's cap in the grammar of {LIMIT_VAR}, with a default and UUID keys only, e.g. a line 8GiB)"
        ))
    };
    if bytes.len() > 4096 {
        return Err(bad("longer than 4096 bytes".to_string()));
    }
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".to_string()))?;
    let value: Vec<&str> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    let one = match value.as_slice() {
        [one] => *one,
        [] => return Err(bad("it is empty".to_string())),
        _ => return Err(bad(format!("{} values, expected one", value.len()))),
    };
    let spec = parse_limit(one)
        .map_err(|e| bad(e.to_string().replacen(&format!("{LIMIT_VAR}="), "", 1)))?;
    if spec.default.is_none() {
        return Err(bad(format!(
            "{one:?} has no default, so a GPU it does not name would have no cap"
        )));
    }
    if let Some((k, _)) = spec
        .entries
        .iter()
        .find(|(k, _)| matches!(k, crate::limit::Key::Ordinal(_)))
    {
        return Err(bad(format!(
            "{one:?} names GPU {k} by index, which CUDA_VISIBLE_DEVICES changes"
        )));
    }
    Ok(Some(spec))
}

/// Why the operator's cap file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorError {
    /// One the caller could have written: ignored with a warning.
    Unusable(String),
    /// One that binds but holds no usable cap: the shim refuses to run.
    Bad(String),
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

impl Settings {
    /// Reads the settings through `get`, which returns a variable's value or
    /// `None` when it is unset. A variable set to a value that is not valid
    /// UTF-8 should be passed as `Some` of its lossy text: it is then refused.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let limit = match get(LIMIT_VAR) {
            None => LimitSpec::default(),
            Some(v) => parse_limit(&v).map_err(SettingsError::Limit)?,
        };
        let log = match get(LOG_VAR) {
            None => LogLevel::Warn,
            Some(v) => parse_log_level(&v)?,
        };
        let cuda_library = match get(CUDA_LIBRARY_VAR) {
            None => None,
            Some(v) if v.trim().is_empty() => {
                return Err(SettingsError::Other {
                    var: CUDA_LIBRARY_VAR,
                    value: v,
                    expected: "the path of the real libcuda.so.1 (e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1)",
                });
            }
            Some(v) => Some(PathBuf::from(v)),
        };
        let disabled = match get(DISABLE_VAR).as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(SettingsError::Other {
                    var: DISABLE_VAR,
                    value: v.to_string(),
                    expected: "1 to pass every call through, or 0/unset",
                });
            }
        };
        let stats = match get(STATS_VAR).as_deref().map(str::trim) {
            None | Some("on") | Some("1") => true,
            Some("off") | Some("0") => false,
            Some(v) => {
                return Err(SettingsError::Other {
                    var: STATS_VAR,
                    value: v.to_string(),
                    expected: "on or off (off: no statistics page; the cap still holds)",
                });
            }
        };
        let stats_dir = match get(STATS_DIR_VAR) {
            None => None,
            Some(v) if v.starts_with('/') => Some(PathBuf::from(v)),
            Some(v) => {
                return Err(SettingsError::Other {
                    var: STATS_DIR_VAR,
                    value: v,
                    expected: "an absolute directory path (e.g. VRAMCAP_STATS_DIR=/dev/shm/vramcap-jobs)",
                });
            }
        };
        let cache = match get(CACHE_VAR) {
            None => CacheBound::DEFAULT,
            Some(v) => parse_cache(&v)?,
        };
        let cache_idle = match get(CACHE_IDLE_VAR) {
            None => std::time::Duration::from_secs(5),
            Some(v) => parse_duration(&v).ok_or_else(|| SettingsError::Other {
                var: CACHE_IDLE_VAR,
                value: v.clone(),
                expected: "a duration greater than zero, e.g. 5s, 500ms, 2m (a bare number is seconds)",
            })?,
        };
        let spill = match get(SPILL_VAR) {
            None => Spill::Off,
            Some(v) => parse_spill(&v)?,
        };
        let spill_limit = match get(SPILL_LIMIT_VAR) {
            None => SpillLimit::DEFAULT,
            Some(v) => parse_spill_limit(&v)?,
        };
        let group = match get(GROUP_VAR) {
            None => None,
            Some(v) if crate::group::valid_name(&v) => Some(v),
            Some(v) => {
                return Err(SettingsError::Other {
                    var: GROUP_VAR,
                    value: v,
                    expected: "1 to 63 letters, digits, '.', '_' or '-', not starting with '.' (e.g. VRAMCAP_GROUP=train-42)",
                });
            }
        };
        let counting = match get(COUNT_VAR) {
            None => Counting::Held,
            Some(v) => parse_counting(&v)?,
        };
        let context = match get(CONTEXT_VAR) {
            None => ContextCharge::Auto,
            Some(v) => parse_context(&v)?,
        };
        let nvidia_limit = match get(NVIDIA_LIMIT_VAR) {
            None => None,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(mib) if mib > 0 && mib <= u64::MAX >> 20 => Some(mib << 20),
                _ => {
                    return Err(SettingsError::Other {
                        var: NVIDIA_LIMIT_VAR,
                        value: v,
                        expected: "a whole number of MiB greater than 0, as NVIDIA's container toolkit takes it (e.g. NVIDIA_GPU_MEMORY_LIMIT=8192)",
                    });
                }
            },
        };
        let soft = match get(SOFT_LIMIT_VAR) {
            None => LimitSpec::default(),
            Some(v) => parse_limit(&v).map_err(|_| SettingsError::Other {
                var: SOFT_LIMIT_VAR,
                value: v.clone(),
                expected: "a soft limit in the grammar of VRAMCAP_LIMIT, e.g. VRAMCAP_SOFT_LIMIT=6GiB (with VRAMCAP_LIMIT=8GiB)",
            })?,
        };
        Ok(Settings {
            limit,
            nvidia_limit,
            operator: None,
            counting,
            context,
            soft,
            log,
            cuda_library,
            disabled,
            stats,
            stats_dir,
            cache,
            cache_idle,
            spill,
            spill_limit,
            group,
            limit_text: get(LIMIT_VAR).unwrap_or_default(),
        })
    }

    /// The one line the shim warns with when `VRAMCAP_DISABLE` is on while
    /// a cap is asked for (`VRAMCAP_LIMIT`, `VRAMCAP_GROUP` or
    /// `NVIDIA_GPU_MEMORY_LIMIT`): the process runs uncapped, and says so at
    /// the default log level. `None` when the switch is off or nothing asks
    /// for a cap.
    pub fn disabled_over_cap(&self) -> Option<String> {
        if !self.disabled {
            return None;
        }
        let mut asked = Vec::new();
        if !self.limit.is_unlimited() {
            asked.push(format!("{LIMIT_VAR}={:?}", self.limit_text));
        }
        if let Some(g) = &self.group {
            asked.push(format!("{GROUP_VAR}={g:?}"));
        }
        if let Some(b) = self.nvidia_limit {
            asked.push(format!("{NVIDIA_LIMIT_VAR}={}", b >> 20));
        }
        if asked.is_empty() {
            return None;
        }
        Some(format!(
            "{DISABLE_VAR}=1 turns vramcap off in this process: {} {} not enforced and it runs uncapped; unset {DISABLE_VAR} to cap it (e.g. env -u {DISABLE_VAR} python train.py)",
            asked.join(" and "),
            if asked.len() > 1 { "are" } else { "is" }
        ))
    }

    /// Reads the settings from the process environment.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Settings::from_lookup(|name| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        })
    }
}

#[cfg(test)]
mod tests;
