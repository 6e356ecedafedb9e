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

use std::path::PathBuf;

use crate::limit::{LIMIT_VAR, LimitSpec, parse_limit};

mod operator;
mod parse;
mod vars;

pub use operator::{OperatorError, read_operator_limit};
pub use parse::{
    CacheBound, ContextCharge, Counting, LogLevel, MANAGED_AS_HOST, SettingsError, Spill,
    SpillLimit, default_stats_dir, parse_cache, parse_context, parse_counting, parse_duration,
    parse_log_level, parse_park, parse_park_move, parse_park_wait, parse_spill, parse_spill_limit,
};
pub use vars::{
    CACHE_IDLE_VAR, CACHE_VAR, CONTEXT_VAR, COUNT_VAR, CUDA_LIBRARY_VAR, DISABLE_VAR,
    FREE_PROBE_VAR, GROUP_VAR, KNOWN_VARS, LIBRARY_VAR, LOG_VAR, NVIDIA_LIMIT_VAR,
    OPERATOR_LIMIT_PATH, PARK_MOVE_VAR, PARK_VAR, PARK_WAIT_VAR, SETTING_VARS, SOFT_LIMIT_VAR,
    SPILL_LIMIT_VAR, SPILL_VAR, STATS_DIR_VAR, STATS_VAR, TOOL_VARS, UnknownVar, unknown_vars,
    unknown_vars_in_env,
};

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
    /// `VRAMCAP_SPILL=managed` was asked for: `spill` is `Host`, and
    /// [`Settings::managed_as_host`] is the line that says so.
    pub spill_was_managed: bool,
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
    /// `VRAMCAP_PARK`: parking enabled (`None`: off, the gate stays open).
    pub park: Option<crate::park::ParkMode>,
    /// `VRAMCAP_PARK_WAIT`: how long an allocation waits for room when no
    /// group member can be parked (zero: refuse at once).
    pub park_wait: std::time::Duration,
    /// `VRAMCAP_PARK_MOVE`: what moves a parked process's memory.
    pub park_move: crate::park::ParkMove,
    /// `VRAMCAP_FREE_PROBE=1`: this process is the nvidia-smi a resume
    /// runs ([`FREE_PROBE_VAR`]); NVML's memory queries answer the
    /// driver's figures. It lifts no cap.
    pub free_probe: bool,
}

impl Settings {
    /// Reads the settings through `get`, which returns a variable's value or
    /// `None` when it is unset. A variable set to a value that is not valid
    /// UTF-8 should be passed as `Some` of its lossy text: it is then refused.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        // A set variable through its parser; `None` when it is unset.
        fn parsed<T>(
            value: Option<String>,
            parse: impl FnOnce(&str) -> Result<T, SettingsError>,
        ) -> Result<Option<T>, SettingsError> {
            value.as_deref().map(parse).transpose()
        }
        // The standard error for `var`'s `value`.
        fn bad(var: &'static str, value: &str, expected: &'static str) -> SettingsError {
            SettingsError::Other {
                var,
                value: value.to_string(),
                expected,
            }
        }
        let limit = parsed(get(LIMIT_VAR), |v| {
            parse_limit(v).map_err(SettingsError::Limit)
        })?
        .unwrap_or_default();
        let log = parsed(get(LOG_VAR), parse_log_level)?.unwrap_or(LogLevel::Warn);
        let cuda_library = parsed(get(CUDA_LIBRARY_VAR), |v| match v.trim().is_empty() {
            false => Ok(PathBuf::from(v)),
            true => Err(bad(
                CUDA_LIBRARY_VAR,
                v,
                "the path of the real libcuda.so.1 (e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1)",
            )),
        })?;
        let disabled = match get(DISABLE_VAR).as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(bad(
                    DISABLE_VAR,
                    v,
                    "1 to pass every call through, or 0/unset",
                ));
            }
        };
        let stats = match get(STATS_VAR).as_deref().map(str::trim) {
            None | Some("on") | Some("1") => true,
            Some("off") | Some("0") => false,
            Some(v) => {
                return Err(bad(
                    STATS_VAR,
                    v,
                    "on or off (off: no statistics page; the cap still holds)",
                ));
            }
        };
        let stats_dir = parsed(get(STATS_DIR_VAR), |v| match v.starts_with('/') {
            true => Ok(PathBuf::from(v)),
            false => Err(bad(
                STATS_DIR_VAR,
                v,
                "an absolute directory path (e.g. VRAMCAP_STATS_DIR=/dev/shm/vramcap-jobs)",
            )),
        })?;
        let cache = parsed(get(CACHE_VAR), parse_cache)?.unwrap_or(CacheBound::DEFAULT);
        let cache_idle = parsed(get(CACHE_IDLE_VAR), |v| {
            parse_duration(v).ok_or_else(|| {
                bad(
                    CACHE_IDLE_VAR,
                    v,
                    "a duration greater than zero, e.g. 5s, 500ms, 2m (a bare number is seconds)",
                )
            })
        })?
        .unwrap_or(std::time::Duration::from_secs(5));
        let (spill, spill_was_managed) =
            parsed(get(SPILL_VAR), parse_spill)?.unwrap_or((Spill::Off, false));
        let spill_limit = parsed(get(SPILL_LIMIT_VAR), parse_spill_limit)?.unwrap_or(match spill {
            Spill::Off => SpillLimit::PARKING_DEFAULT,
            _ => SpillLimit::DEFAULT,
        });
        let group = parsed(get(GROUP_VAR), |v| match crate::group::valid_name(v) {
            true => Ok(v.to_string()),
            false => Err(bad(
                GROUP_VAR,
                v,
                "1 to 63 letters, digits, '.', '_' or '-', not starting with '.' (e.g. VRAMCAP_GROUP=train-42)",
            )),
        })?;
        let counting = parsed(get(COUNT_VAR), parse_counting)?.unwrap_or(Counting::Held);
        let context = parsed(get(CONTEXT_VAR), parse_context)?.unwrap_or(ContextCharge::Auto);
        let nvidia_limit = parsed(get(NVIDIA_LIMIT_VAR), |v| match v.trim().parse::<u64>() {
            Ok(mib) if mib > 0 && mib <= u64::MAX >> 20 => Ok(mib << 20),
            _ => Err(bad(
                NVIDIA_LIMIT_VAR,
                v,
                "a whole number of MiB greater than 0, as NVIDIA's container toolkit takes it (e.g. NVIDIA_GPU_MEMORY_LIMIT=8192)",
            )),
        })?;
        let soft = parsed(get(SOFT_LIMIT_VAR), |v| {
            parse_limit(v).map_err(|_| {
                bad(
                    SOFT_LIMIT_VAR,
                    v,
                    "a soft limit in the grammar of VRAMCAP_LIMIT, e.g. VRAMCAP_SOFT_LIMIT=6GiB (with VRAMCAP_LIMIT=8GiB)",
                )
            })
        })?
        .unwrap_or_default();
        let park = parsed(get(PARK_VAR), parse_park)?;
        let park_wait =
            parsed(get(PARK_WAIT_VAR), parse_park_wait)?.unwrap_or(std::time::Duration::ZERO);
        let asked = parsed(get(PARK_MOVE_VAR), parse_park_move)?;
        // Unset: the shim's moves wherever they apply (parking on, no
        // host spill), the driver's checkpoint otherwise.
        let park_move = asked.unwrap_or(if park.is_some() && spill != Spill::Host {
            crate::park::ParkMove::Shim
        } else {
            crate::park::ParkMove::Checkpoint
        });
        let move_word = get(PARK_MOVE_VAR).unwrap_or_default();
        if park_move.moves_blocks() && spill == Spill::Host {
            return Err(bad(
                PARK_MOVE_VAR,
                move_word.trim(),
                "checkpoint with VRAMCAP_SPILL=host (the shim's moves do not spill yet), e.g. VRAMCAP_PARK_MOVE=shim with VRAMCAP_SPILL=off or tiered",
            ));
        }
        if park_move.moves_blocks() && park.is_none() {
            return Err(bad(
                PARK_MOVE_VAR,
                move_word.trim(),
                "checkpoint without VRAMCAP_PARK (the shim's moves apply to parking only), e.g. VRAMCAP_PARK=manual VRAMCAP_PARK_MOVE=shim",
            ));
        }
        let free_probe = match get(FREE_PROBE_VAR).as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(bad(
                    FREE_PROBE_VAR,
                    v,
                    "1, set by the shim for the nvidia-smi a resume runs, or unset",
                ));
            }
        };
        Ok(Settings {
            park,
            park_wait,
            park_move,
            free_probe,
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
            spill_was_managed,
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

    /// The one warning line for `VRAMCAP_SPILL=managed`, taken as host;
    /// `None` for any other mode.
    pub fn managed_as_host(&self) -> Option<&'static str> {
        self.spill_was_managed.then_some(MANAGED_AS_HOST)
    }

    /// Whether this process may ask the same user's idle processes to park
    /// for room (parking's policy, which reads their pages): only when it
    /// was started with `VRAMCAP_PARK` or a `VRAMCAP_PARK_WAIT` above zero.
    /// A process with neither never reads another process's page.
    pub fn asks_to_park(&self) -> bool {
        self.park.is_some() || !self.park_wait.is_zero()
    }

    /// The settings of a process the loader runs in secure-execution mode
    /// (set-user-ID, set-group-ID, file capabilities: `AT_SECURE`): its
    /// environment is the invoking user's, so nothing is read from it.
    /// Every setting is its default but the statistics page, which is off:
    /// where it would go, and who could write requests into it, would be
    /// the user's to choose. The operator's file still applies on top.
    pub fn for_secure_execution() -> Settings {
        let mut s = Settings::from_lookup(|_| None)
            .unwrap_or_else(|_| unreachable!("every setting has a valid default"));
        s.stats = false;
        s
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
