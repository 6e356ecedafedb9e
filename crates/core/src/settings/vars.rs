//! The names: every `VRAMCAP_*` variable, and the check of an environment
//! against that one list (a misspelt name is reported, never ignored).

use std::fmt;

use crate::limit::LIMIT_VAR;

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
/// Parking (issue 34): `manual` or `idle:DURATION`; and how long an
/// allocation waits for room when no group member can be parked.
pub const PARK_VAR: &str = "VRAMCAP_PARK";
pub const PARK_WAIT_VAR: &str = "VRAMCAP_PARK_WAIT";
/// What moves a parked process's memory (issue 43): `shim` (the default
/// with parking on and no host spill): the shim moves its VMM blocks
/// itself and leaves the rest; `shim+checkpoint`: then the driver's
/// checkpoint takes the rest; `checkpoint`: the driver's checkpoint of the
/// whole process (the default with `VRAMCAP_SPILL=host`).
pub const PARK_MOVE_VAR: &str = "VRAMCAP_PARK_MOVE";
/// Set by the shim in the environment of the nvidia-smi a resume runs
/// (`1`): a shim loaded into it all the same answers NVML's memory
/// queries with the driver's figures. It lifts no cap.
pub const FREE_PROBE_VAR: &str = "VRAMCAP_FREE_PROBE";
pub const CACHE_IDLE_VAR: &str = "VRAMCAP_CACHE_IDLE";
pub const STATS_DIR_VAR: &str = "VRAMCAP_STATS_DIR";
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
    PARK_VAR,
    PARK_WAIT_VAR,
    PARK_MOVE_VAR,
];

/// `VRAMCAP_*` names that are not settings but belong to vramcap's own
/// tools, so they are not warned about: `vramcap doctor`'s child check,
/// `scripts/demo.sh`'s cap, the release build's linker switch, and the
/// mark of the nvidia-smi a resume runs (its NVML memory queries are not
/// capped).
pub const TOOL_VARS: &[&str] = &[
    "VRAMCAP_PROBE_GPU",
    "VRAMCAP_DEMO_LIMIT",
    "VRAMCAP_ZIG_LINKER",
    "VRAMCAP_FREE_PROBE",
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
