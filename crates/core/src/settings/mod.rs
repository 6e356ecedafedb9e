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
    CacheBound, ContextCharge, Counting, LogLevel, SettingsError, Spill, SpillLimit,
    default_stats_dir, parse_cache, parse_context, parse_counting, parse_duration, parse_log_level,
    parse_park, parse_park_wait, parse_spill, parse_spill_limit,
};
pub use vars::{
    CACHE_IDLE_VAR, CACHE_VAR, CONTEXT_VAR, COUNT_VAR, CUDA_LIBRARY_VAR, DISABLE_VAR, GROUP_VAR,
    KNOWN_VARS, LIBRARY_VAR, LOG_VAR, NVIDIA_LIMIT_VAR, OPERATOR_LIMIT_PATH, PARK_VAR,
    PARK_WAIT_VAR, SETTING_VARS, SOFT_LIMIT_VAR, SPILL_LIMIT_VAR, SPILL_VAR, STATS_DIR_VAR,
    STATS_VAR, TOOL_VARS, UnknownVar, unknown_vars, unknown_vars_in_env,
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
        let park = match get(PARK_VAR) {
            None => None,
            Some(v) => Some(parse_park(&v)?),
        };
        let park_wait = match get(PARK_WAIT_VAR) {
            None => std::time::Duration::ZERO,
            Some(v) => parse_park_wait(&v)?,
        };
        Ok(Settings {
            park,
            park_wait,
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
