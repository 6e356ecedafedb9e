//! The `VRAMCAP_LIMIT` grammar.
//!
//! ```text
//! spec   := item ("," item)*
//! item   := [key "="] amount
//! key    := ordinal | uuid-prefix
//! ordinal:= decimal device index as the process sees it (after CUDA_VISIBLE_DEVICES), 0..63
//! uuid-prefix := "GPU-" hex digits and dashes (case-insensitive), matched as a prefix
//! amount := size | number "%"
//! ```
//!
//! At most one item without a key (the default for every device not named);
//! a device named twice is an error. When a device matches both an ordinal and
//! a UUID entry, the UUID entry wins (it names the physical GPU); when several
//! UUID prefixes match, the longest wins.
//!
//! Parsing is pure: percentages and UUIDs are resolved per device later, by
//! [`LimitSpec::amount_for`], once the driver has told the shim what it has.
//!
//! A value is at most [`LIMIT_MAX_LEN`] bytes: a group records its limit in
//! a field of that size (`LIMIT_TEXT_LEN` with its NUL), and one
//! length everywhere means a limit `vramcap run` accepts is never cut.
//!
//! A key must name a GPU: [`LimitSpec::unmatched_keys`] lists those that
//! name none (an index beyond the devices the process sees, a UUID prefix of
//! no GPU on the machine), and [`UnmatchedKeys`] is the one line the shim,
//! `vramcap run` and `vramcap doctor` all print about them. A UUID of a GPU
//! that is on the machine but not visible to the process (a setting shared
//! under `CUDA_VISIBLE_DEVICES`) is not an error.
//!
//! [`LimitSpec::canonical`] writes a spec back in this grammar: parsing it
//! gives the same spec (property-tested below).

use std::fmt;

use crate::size::{Percent, SizeError, parse_size};

/// Devices a process can see that vramcap keeps counters for.
pub const MAX_DEVICES: usize = 64;

/// The environment variable holding the limit.
pub const LIMIT_VAR: &str = "VRAMCAP_LIMIT";

/// Shown after every error so the user sees a correct value next to theirs.
pub const LIMIT_EXAMPLE: &str = "8GiB, 50%, 0=8GiB,1=4GiB or 4GiB,GPU-5ca1ab1e=2GiB";

/// The size of a group page's limit field (`group::GroupHeader`), which
/// holds a value with its NUL.
pub const LIMIT_TEXT_LEN: usize = 512;

/// The longest value accepted, in bytes: what a group page's limit field
/// holds (its last byte is the NUL).
pub const LIMIT_MAX_LEN: usize = LIMIT_TEXT_LEN - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Bytes(u64),
    Percent(Percent),
}

impl Amount {
    /// The cap in bytes for a device with `device_total` bytes of memory.
    pub fn resolve(self, device_total: u64) -> u64 {
        match self {
            Amount::Bytes(b) => b,
            Amount::Percent(p) => p.of(device_total),
        }
    }
}

impl Amount {
    /// The amount in the grammar, parsing back to itself: bytes in the
    /// largest unit that divides them (`8GiB`, `1536MiB`, `4097`), or the
    /// percentage (`12.5%`).
    pub fn canonical(self) -> String {
        match self {
            Amount::Bytes(b) => {
                for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
                    if b.trailing_zeros() >= shift {
                        return format!("{}{unit}", b >> shift);
                    }
                }
                b.to_string()
            }
            Amount::Percent(p) => p.to_string(),
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Bytes(b) => write!(f, "{b} bytes"),
            Amount::Percent(p) => write!(f, "{p} of device memory"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Ordinal(u32),
    /// Lower-case, including the `gpu-` prefix.
    UuidPrefix(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Ordinal(n) => write!(f, "{n}"),
            Key::UuidPrefix(p) => write!(f, "GPU-{}", &p[4..]),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitSpec {
    pub default: Option<Amount>,
    pub entries: Vec<(Key, Amount)>,
}

/// Why a `VRAMCAP_LIMIT` value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitError {
    pub value: String,
    pub reason: String,
}

/// `text` with its control characters escaped (a newline or a terminal
/// escape in a value must not break the one line, nor reach a terminal).
fn without_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A value as error lines show it: escaped, and cut after 64 characters
/// when it is longer than 100 (so the line keeps its example).
fn shown(value: &str) -> String {
    if value.chars().count() <= 100 {
        return value.escape_debug().to_string();
    }
    let head: String = value.chars().take(64).collect();
    format!("{}…", head.escape_debug())
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{LIMIT_VAR}=\"{}\" is not a valid limit: {}; expected a size or percentage per GPU, e.g. {LIMIT_EXAMPLE}",
            shown(&self.value),
            without_controls(&self.reason)
        )
    }
}

impl std::error::Error for LimitError {}

fn parse_amount(text: &str) -> Result<Amount, String> {
    let t = text.trim();
    if let Some(number) = t.strip_suffix('%') {
        return Percent::parse_number(number)
            .map(Amount::Percent)
            .map_err(|e| e.to_string());
    }
    match parse_size(t) {
        Ok(b) => Ok(Amount::Bytes(b)),
        Err(SizeError::Empty) => Err("an entry has no amount".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_key(text: &str) -> Result<Key, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("an entry has '=' but no device before it".to_string());
    }
    if t.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("gpu-")) {
        let rest = &t[4..];
        if let Some(bad) = rest.chars().find(|c| !(c.is_ascii_hexdigit() || *c == '-')) {
            return Err(format!(
                "\"{t}\" is not a GPU UUID prefix ('{bad}' is not a hex digit)"
            ));
        }
        if !rest.chars().any(|c| c.is_ascii_hexdigit()) {
            return Err(format!("\"{t}\" has no hex digits after GPU-"));
        }
        return Ok(Key::UuidPrefix(t.to_ascii_lowercase()));
    }
    if !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "\"{t}\" is not a device (use its index as the process sees it, e.g. 0, or a GPU-… UUID prefix)"
        ));
    }
    if t.len() > 1 && t.starts_with('0') {
        return Err(format!("device index \"{t}\" has a leading zero"));
    }
    match t.parse::<u32>() {
        Ok(n) if (n as usize) < MAX_DEVICES => Ok(Key::Ordinal(n)),
        _ => Err(format!(
            "device index {t} is beyond the {MAX_DEVICES} devices vramcap supports"
        )),
    }
}

/// Parses a whole `VRAMCAP_LIMIT` value.
pub fn parse_limit(value: &str) -> Result<LimitSpec, LimitError> {
    parse_limit_inner(value).map_err(|reason| LimitError {
        value: value.to_string(),
        reason,
    })
}

fn parse_limit_inner(value: &str) -> Result<LimitSpec, String> {
    if value.trim().is_empty() {
        return Err("the value is empty (unset the variable to run without a cap)".to_string());
    }
    if value.len() > LIMIT_MAX_LEN {
        return Err(format!(
            "the value is {} bytes long, more than the {LIMIT_MAX_LEN} a limit may have (a UUID key can be a short prefix, e.g. GPU-5ca1ab1e)",
            value.len()
        ));
    }
    let mut spec = LimitSpec::default();
    for item in value.split(',') {
        if item.trim().is_empty() {
            return Err("an entry between commas is empty".to_string());
        }
        match item.split_once('=') {
            None => {
                let amount = parse_amount(item)?;
                if spec.default.is_some() {
                    return Err(
                        "more than one entry without a device (only one default is allowed)"
                            .to_string(),
                    );
                }
                spec.default = Some(amount);
            }
            Some((key, amount)) => {
                let key = parse_key(key)?;
                let amount = parse_amount(amount)?;
                if spec.entries.iter().any(|(k, _)| *k == key) {
                    return Err(format!("device {key} is given more than once"));
                }
                spec.entries.push((key, amount));
            }
        }
    }
    Ok(spec)
}

impl LimitSpec {
    /// True when no device has a cap (the variable was unset).
    pub fn is_unlimited(&self) -> bool {
        self.default.is_none() && self.entries.is_empty()
    }

    /// True when some entry needs the device UUID to be matched.
    pub fn needs_uuid(&self) -> bool {
        self.entries
            .iter()
            .any(|(k, _)| matches!(k, Key::UuidPrefix(_)))
    }

    /// The amount that applies to the device with this ordinal and UUID
    /// (`GPU-…` text, any case), or `None` when the device is uncapped.
    pub fn amount_for(&self, ordinal: u32, uuid: Option<&str>) -> Option<Amount> {
        if let Some(uuid) = uuid {
            let uuid = uuid.to_ascii_lowercase();
            let best = self
                .entries
                .iter()
                .filter_map(|(k, a)| match k {
                    Key::UuidPrefix(p) if uuid.starts_with(p.as_str()) => Some((p.len(), *a)),
                    _ => None,
                })
                .max_by_key(|(len, _)| *len);
            if let Some((_, a)) = best {
                return Some(a);
            }
        }
        self.entries
            .iter()
            .find(|(k, _)| *k == Key::Ordinal(ordinal))
            .map(|(_, a)| *a)
            .or(self.default)
    }
}

impl fmt::Display for LimitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            let s = if first { "" } else { ", " };
            first = false;
            f.write_str(s)
        };
        if let Some(d) = self.default {
            sep(f)?;
            write!(f, "every GPU {d}")?;
        }
        for (k, a) in &self.entries {
            sep(f)?;
            write!(f, "GPU {k} {a}")?;
        }
        if self.is_unlimited() {
            write!(f, "no cap")?;
        }
        Ok(())
    }
}

impl LimitSpec {
    /// The spec in the grammar: the default first, then the entries in
    /// their order, each amount as [`Amount::canonical`] writes it.
    /// [`parse_limit`] of it gives this spec back (when it fits in
    /// [`LIMIT_MAX_LEN`]); an unlimited spec gives the empty text.
    pub fn canonical(&self) -> String {
        let mut items: Vec<String> = Vec::new();
        if let Some(d) = self.default {
            items.push(d.canonical());
        }
        for (k, a) in &self.entries {
            items.push(format!("{k}={}", a.canonical()));
        }
        items.join(",")
    }

    /// Checks that every key names a GPU: an index below `visible` (the
    /// devices the process sees), a UUID prefix of some GPU in `gpus` (the
    /// ones the process sees and, where known, the rest of the machine's).
    /// `value` is the variable's text, for the error line.
    pub fn check_keys(&self, value: &str, visible: u32, gpus: &[Gpu]) -> Result<(), UnmatchedKeys> {
        let unmatched: Vec<&(Key, Amount)> = self
            .entries
            .iter()
            .filter(|(k, _)| match k {
                Key::Ordinal(n) => *n >= visible,
                Key::UuidPrefix(p) => !gpus.iter().any(|g| {
                    g.uuid
                        .as_deref()
                        .is_some_and(|u| u.to_ascii_lowercase().starts_with(p.as_str()))
                }),
            })
            .collect();
        let Some((_, amount)) = unmatched.first() else {
            return Ok(());
        };
        Err(UnmatchedKeys {
            value: value.to_string(),
            keys: unmatched.iter().map(|(k, _)| k.clone()).collect(),
            amount: *amount,
            gpus: gpus.to_vec(),
        })
    }
}

/// A GPU as the key check knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its index as the process sees it; `None` for a GPU on the machine
    /// that the process does not see.
    pub index: Option<u32>,
    /// Its UUID as `GPU-…` text, when it could be read.
    pub uuid: Option<String>,
    /// Its name, when known.
    pub name: Option<String>,
}

/// Keys of a `VRAMCAP_LIMIT` that name no GPU, and the GPUs there are: its
/// `Display` is the one line every part of vramcap prints about them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnmatchedKeys {
    pub value: String,
    pub keys: Vec<Key>,
    /// The amount of the first such key, for the example.
    pub amount: Amount,
    pub gpus: Vec<Gpu>,
}

impl UnmatchedKeys {
    /// Whether a UUID key is among them (only those can still match a GPU
    /// that the process does not see).
    pub fn has_uuid_key(&self) -> bool {
        self.keys.iter().any(|k| matches!(k, Key::UuidPrefix(_)))
    }
}

impl fmt::Display for UnmatchedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{LIMIT_VAR}=\"{}\": ", shown(&self.value))?;
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        match keys.as_slice() {
            [one] => write!(f, "device {one} names no GPU")?,
            more => write!(f, "devices {} name no GPU", more.join(", "))?,
        }
        let gpu = |g: &Gpu| {
            let uuid = g.uuid.as_deref().unwrap_or("(UUID unreadable)");
            match &g.name {
                Some(n) => format!("{uuid} ({})", n.escape_debug()),
                None => uuid.to_string(),
            }
        };
        let visible: Vec<&Gpu> = self.gpus.iter().filter(|g| g.index.is_some()).collect();
        if visible.is_empty() {
            write!(f, "; this process sees no GPU")?;
        } else {
            let list: Vec<String> = visible
                .iter()
                .map(|g| format!("{} {}", g.index.unwrap_or_default(), gpu(g)))
                .collect();
            write!(
                f,
                "; this process sees {}: {}",
                visible.len(),
                list.join(", ")
            )?;
        }
        let hidden: Vec<String> = self
            .gpus
            .iter()
            .filter(|g| g.index.is_none())
            .map(gpu)
            .collect();
        if !hidden.is_empty() {
            write!(f, "; the machine also has {}", hidden.join(", "))?;
        }
        let amount = self.amount.canonical();
        let last = visible.last();
        let index = last.and_then(|g| g.index).unwrap_or(0);
        write!(
            f,
            "; a device is its index or a prefix of its UUID, e.g. {index}={amount}"
        )?;
        if let Some(uuid) = last.and_then(|g| g.uuid.as_deref()) {
            write!(f, " or {uuid}={amount}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnmatchedKeys {}

/// The CUDA ordinal of the GPU that NVML calls `nvml_index`, given
/// `CUDA_VISIBLE_DEVICES` (`cvd`): its position among the visible devices,
/// which are listed by index or UUID prefix; CUDA ignores entries after the
/// first it cannot read. `None` when the process cannot see the device.
/// Without the variable, devices are assumed to keep NVML's order.
pub fn cuda_ordinal(nvml_index: u32, uuid: &str, cvd: Option<&str>) -> Option<u32> {
    let Some(cvd) = cvd else {
        return Some(nvml_index);
    };
    let uuid = uuid.to_ascii_lowercase();
    for (k, entry) in cvd.split(',').enumerate() {
        let e = entry.trim();
        if let Ok(i) = e.parse::<u32>() {
            if i == nvml_index {
                return u32::try_from(k).ok();
            }
        } else if e.len() > 4 && e.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("gpu-")) {
            if uuid.starts_with(&e.to_ascii_lowercase()) {
                return u32::try_from(k).ok();
            }
        } else {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests;
