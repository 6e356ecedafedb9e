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

use std::fmt;

use crate::size::{Percent, SizeError, parse_size};

/// Devices a process can see that vramcap keeps counters for.
pub const MAX_DEVICES: usize = 64;

/// The environment variable holding the limit.
pub const LIMIT_VAR: &str = "VRAMCAP_LIMIT";

/// Shown after every error so the user sees a correct value next to theirs.
pub const LIMIT_EXAMPLE: &str = "8GiB, 50%, 0=8GiB,1=4GiB or 4GiB,GPU-5ca1ab1e=2GiB";

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

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{LIMIT_VAR}=\"{}\" is not a valid limit: {}; expected a size or percentage per GPU, e.g. {LIMIT_EXAMPLE}",
            self.value.escape_debug(),
            self.reason
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
        } else if e.len() > 4 && e[..4].eq_ignore_ascii_case("gpu-") {
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
mod tests {
    use super::*;

    fn pct(s: &str) -> Amount {
        Amount::Percent(Percent::parse_number(s).unwrap())
    }

    #[test]
    fn valid_specs() {
        let gib = 1u64 << 30;
        let s = parse_limit("8GiB").unwrap();
        assert_eq!(s.default, Some(Amount::Bytes(8 * gib)));
        assert!(s.entries.is_empty());

        let s = parse_limit("50%").unwrap();
        assert_eq!(s.default, Some(pct("50")));

        let s = parse_limit("0=8GiB,1=4GiB").unwrap();
        assert_eq!(s.default, None);
        assert_eq!(
            s.entries,
            vec![
                (Key::Ordinal(0), Amount::Bytes(8 * gib)),
                (Key::Ordinal(1), Amount::Bytes(4 * gib))
            ]
        );

        let s = parse_limit("4GiB, 1 = 2GiB").unwrap();
        assert_eq!(s.default, Some(Amount::Bytes(4 * gib)));
        assert_eq!(s.entries, vec![(Key::Ordinal(1), Amount::Bytes(2 * gib))]);

        let s = parse_limit("GPU-5CA1ab1e=25%").unwrap();
        assert_eq!(
            s.entries,
            vec![(Key::UuidPrefix("gpu-5ca1ab1e".into()), pct("25"))]
        );
        assert!(s.needs_uuid());
    }

    #[test]
    fn invalid_specs_name_the_problem() {
        let cases: &[(&str, &str)] = &[
            ("", "the value is empty"),
            ("8XB", "unknown unit \"XB\""),
            ("-4GiB", "does not start with a decimal number"),
            ("0", "greater than zero"),
            ("010G", "leading zero"),
            ("200%", "out of range"),
            ("0%", "out of range"),
            ("%", "no number before '%'"),
            ("4G,,1=2G", "empty"),
            ("4G,2G", "more than one entry without a device"),
            ("0=1G,0=2G", "device 0 is given more than once"),
            ("=1G", "no device before it"),
            ("x=1G", "is not a device"),
            ("64=1G", "beyond the 64 devices"),
            ("00=1G", "leading zero"),
            ("GPU-=1G", "no hex digits"),
            ("GPU-zz=1G", "not a GPU UUID prefix"),
            ("0=", "has no amount"),
            ("99999999T", "does not fit in 64 bits"),
        ];
        for (value, needle) in cases {
            let err = parse_limit(value).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(needle),
                "{value:?}: {text:?} lacks {needle:?}"
            );
            assert!(
                text.starts_with(&format!("VRAMCAP_LIMIT=\"{value}\"")),
                "{text}"
            );
            assert!(text.contains(LIMIT_EXAMPLE), "{text}");
            assert!(!text.contains('\n'));
        }
    }

    #[test]
    fn amounts_per_device() {
        let s = parse_limit("4GiB,1=2GiB,GPU-5ca1ab1e-0000=1GiB,GPU-5ca1=3GiB").unwrap();
        let g = 1u64 << 30;
        let u0 = "GPU-5CA1AB1E-0000-4000-8000-000000000000";
        let other = "GPU-aaaa";
        assert_eq!(s.amount_for(0, Some(other)), Some(Amount::Bytes(4 * g)));
        assert_eq!(s.amount_for(1, Some(other)), Some(Amount::Bytes(2 * g)));
        // Longest UUID prefix wins, and UUID beats the ordinal entry.
        assert_eq!(s.amount_for(1, Some(u0)), Some(Amount::Bytes(g)));
        assert_eq!(
            s.amount_for(2, Some("gpu-5ca1ffff")),
            Some(Amount::Bytes(3 * g))
        );
        assert_eq!(s.amount_for(2, None), Some(Amount::Bytes(4 * g)));

        let s = parse_limit("1=2GiB").unwrap();
        assert_eq!(s.amount_for(0, None), None);
        assert!(
            parse_limit("50%")
                .unwrap()
                .amount_for(3, None)
                .unwrap()
                .resolve(1000)
                == 500
        );
    }

    #[test]
    fn ordinals_after_cuda_visible_devices() {
        let u = "GPU-5ca1ab1e-0000-4000-8000-000000000001";
        assert_eq!(cuda_ordinal(1, u, None), Some(1));
        assert_eq!(cuda_ordinal(1, u, Some("1,0")), Some(0));
        assert_eq!(cuda_ordinal(0, "GPU-aa", Some("1,0")), Some(1));
        assert_eq!(cuda_ordinal(2, "GPU-aa", Some("1,0")), None);
        assert_eq!(
            cuda_ordinal(1, u, Some("GPU-5CA1AB1E-0000-4000-8000-000000000001")),
            Some(0)
        );
        assert_eq!(cuda_ordinal(1, u, Some("0,GPU-5ca1")), Some(1));
        assert_eq!(
            cuda_ordinal(1, u, Some("0,x,1")),
            None,
            "CUDA stops at an unreadable entry"
        );
        assert_eq!(cuda_ordinal(0, u, Some("")), None);
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(s in "\\PC{0,40}") {
                let _ = parse_limit(&s);
            }

            #[test]
            fn sizes_round_trip(n in 1u64..(1 << 40), unit in prop::sample::select(vec![("", 1u64), ("K", 1 << 10), ("MiB", 1 << 20), ("gb", 1 << 30)])) {
                let (suffix, mul) = unit;
                if let Some(want) = n.checked_mul(mul) {
                    let spec = parse_limit(&format!("{n}{suffix}")).unwrap();
                    prop_assert_eq!(spec.default, Some(Amount::Bytes(want)));
                }
            }

            #[test]
            fn per_device_round_trip(caps in prop::collection::btree_map(0u32..64, 1u64..(1 << 50), 1..8)) {
                let text = caps.iter().map(|(d, b)| format!("{d}={b}")).collect::<Vec<_>>().join(",");
                let spec = parse_limit(&text).unwrap();
                for d in 0..64u32 {
                    prop_assert_eq!(spec.amount_for(d, None), caps.get(&d).map(|b| Amount::Bytes(*b)));
                }
            }
        }
    }
}
