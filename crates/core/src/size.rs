//! Byte sizes: parsing `8GiB`-style amounts and printing them for people.
//!
//! Every unit is a power of 1024, whatever its spelling (`K`, `KB`, `KiB` all
//! mean 1024 bytes), and units are case-insensitive. A bare number is bytes.
//! Numbers are decimal: a leading zero is refused rather than read as octal,
//! and a fraction (`1.5GiB`) is allowed when the result is a whole number of
//! bytes or larger than one unit (it is then rounded down to a byte).

use std::fmt;

/// Why a size could not be read. The `Display` text is meant to follow
/// "… is not a valid …: ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    Empty,
    NotANumber(String),
    LeadingZero(String),
    UnknownUnit(String),
    Overflow,
    Zero,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Empty => write!(f, "the size is empty"),
            SizeError::NotANumber(s) => write!(f, "\"{s}\" does not start with a decimal number"),
            SizeError::LeadingZero(s) => {
                write!(
                    f,
                    "\"{s}\" has a leading zero (numbers are decimal, write it without)"
                )
            }
            SizeError::UnknownUnit(u) => write!(
                f,
                "unknown unit \"{u}\" (use B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB; all are powers of 1024)"
            ),
            SizeError::Overflow => write!(f, "the size does not fit in 64 bits"),
            SizeError::Zero => write!(f, "the size must be greater than zero"),
        }
    }
}

impl std::error::Error for SizeError {}

/// The multiplier of a unit suffix, or `None` when the suffix is not a unit.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let lower = unit.to_ascii_lowercase();
    let shift = match lower.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    Some(1u64 << shift)
}

/// A decimal number split into its integer digits and fraction digits.
struct Decimal<'a> {
    int: &'a str,
    frac: &'a str,
    rest: &'a str,
}

/// Reads `DIGITS[.DIGITS]` from the start of `s`.
fn split_decimal(s: &str) -> Result<Decimal<'_>, SizeError> {
    let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let int = &s[..int_end];
    if int.is_empty() {
        return Err(SizeError::NotANumber(s.to_string()));
    }
    if int.len() > 1 && int.starts_with('0') {
        return Err(SizeError::LeadingZero(s.to_string()));
    }
    let after = &s[int_end..];
    let (frac, rest) = match after.strip_prefix('.') {
        Some(tail) => {
            let frac_end = tail
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(tail.len());
            if frac_end == 0 {
                return Err(SizeError::NotANumber(s.to_string()));
            }
            (&tail[..frac_end], &tail[frac_end..])
        }
        None => ("", after),
    };
    Ok(Decimal { int, frac, rest })
}

/// `int.frac × multiplier / divisor`, rounded down, in 128-bit arithmetic.
fn scale(d: &Decimal<'_>, multiplier: u128, divisor: u128) -> Result<u128, SizeError> {
    // More than 30 digits cannot be a meaningful size and would overflow u128.
    if d.int.len() + d.frac.len() > 30 {
        return Err(SizeError::Overflow);
    }
    let mut mantissa: u128 = 0;
    for b in d.int.bytes().chain(d.frac.bytes()) {
        mantissa = mantissa * 10 + u128::from(b - b'0');
    }
    let frac_scale = 10u128.pow(d.frac.len() as u32);
    let value = mantissa
        .checked_mul(multiplier)
        .ok_or(SizeError::Overflow)?
        / (frac_scale * divisor);
    Ok(value)
}

/// Parses a size such as `8GiB`, `512m`, `1.5G` or `4096`. Surrounding ASCII
/// whitespace is ignored; zero is refused.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let d = split_decimal(s)?;
    let unit = d.rest.trim_start();
    let multiplier =
        unit_multiplier(unit).ok_or_else(|| SizeError::UnknownUnit(unit.to_string()))?;
    let bytes = scale(&d, u128::from(multiplier), 1)?;
    let bytes = u64::try_from(bytes).map_err(|_| SizeError::Overflow)?;
    if bytes == 0 {
        return Err(SizeError::Zero);
    }
    Ok(bytes)
}

/// A share of something, stored in parts per million so that `12.5%` is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percent {
    ppm: u32,
}

impl Percent {
    pub const ONE_HUNDRED: Percent = Percent { ppm: 1_000_000 };
    pub const QUARTER: Percent = Percent { ppm: 250_000 };
    pub const THREE_QUARTERS: Percent = Percent { ppm: 750_000 };

    /// Parts per million, 1..=1_000_000.
    pub fn ppm(self) -> u32 {
        self.ppm
    }

    /// `self` of `whole`, rounded down.
    pub fn of(self, whole: u64) -> u64 {
        ((u128::from(whole) * u128::from(self.ppm)) / 1_000_000) as u64
    }

    /// Parses the number in front of a `%` sign (the sign already removed):
    /// greater than 0, at most 100, at most four decimals.
    pub fn parse_number(text: &str) -> Result<Percent, PercentError> {
        let s = text.trim();
        if s.is_empty() {
            return Err(PercentError::Empty);
        }
        let d = split_decimal(s).map_err(|_| PercentError::NotANumber(s.to_string()))?;
        if !d.rest.is_empty() {
            return Err(PercentError::NotANumber(s.to_string()));
        }
        if d.frac.len() > 4 {
            return Err(PercentError::TooPrecise(s.to_string()));
        }
        let ppm = scale(&d, 10_000, 1).map_err(|_| PercentError::OutOfRange(s.to_string()))?;
        if ppm == 0 || ppm > 1_000_000 {
            return Err(PercentError::OutOfRange(s.to_string()));
        }
        Ok(Percent { ppm: ppm as u32 })
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.ppm / 10_000;
        let frac = self.ppm % 10_000;
        if frac == 0 {
            write!(f, "{whole}%")
        } else {
            let digits = format!("{frac:04}");
            write!(f, "{whole}.{}%", digits.trim_end_matches('0'))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PercentError {
    Empty,
    NotANumber(String),
    TooPrecise(String),
    OutOfRange(String),
}

impl fmt::Display for PercentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PercentError::Empty => write!(f, "the percentage has no number before '%'"),
            PercentError::NotANumber(s) => write!(f, "\"{s}%\" is not a decimal percentage"),
            PercentError::TooPrecise(s) => {
                write!(f, "\"{s}%\" has more than four decimals")
            }
            PercentError::OutOfRange(s) => {
                write!(
                    f,
                    "\"{s}%\" is out of range (greater than 0 and at most 100)"
                )
            }
        }
    }
}

impl std::error::Error for PercentError {}

/// Formats bytes for people: `0 B`, `512 B`, `1.5 KiB`, `4.00 GiB`, with at most
/// three significant digits after scaling, so columns stay narrow.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value >= 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_table() {
        let ok: &[(&str, u64)] = &[
            ("1", 1),
            ("4096", 4096),
            ("1b", 1),
            ("1K", 1024),
            ("1kb", 1024),
            ("1KiB", 1024),
            ("2M", 2 << 20),
            ("2mib", 2 << 20),
            ("8GiB", 8 << 30),
            ("8gb", 8 << 30),
            ("8 GiB", 8 << 30),
            (" 8GiB ", 8 << 30),
            ("1T", 1 << 40),
            ("1TiB", 1 << 40),
            ("1.5GiB", 3 << 29),
            ("0.5K", 512),
            ("0.1K", 102),
            ("16777215T", 16_777_215u64 << 40),
            ("18446744073709551615", u64::MAX),
        ];
        for (text, want) in ok {
            assert_eq!(parse_size(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn size_errors_table() {
        let bad: &[(&str, SizeError)] = &[
            ("", SizeError::Empty),
            ("  ", SizeError::Empty),
            ("GiB", SizeError::NotANumber("GiB".into())),
            ("-1G", SizeError::NotANumber("-1G".into())),
            ("+1G", SizeError::NotANumber("+1G".into())),
            ("010", SizeError::LeadingZero("010".into())),
            ("0x10", SizeError::UnknownUnit("x10".into())),
            ("8XB", SizeError::UnknownUnit("XB".into())),
            ("8 G i B", SizeError::UnknownUnit("G i B".into())),
            ("8GiBs", SizeError::UnknownUnit("GiBs".into())),
            ("1.G", SizeError::NotANumber("1.G".into())),
            ("0", SizeError::Zero),
            ("0G", SizeError::Zero),
            ("0.0001K", SizeError::Zero),
            ("16777216T", SizeError::Overflow),
            ("18446744073709551616", SizeError::Overflow),
            ("99999999999999999999999999999999999", SizeError::Overflow),
        ];
        for (text, want) in bad {
            assert_eq!(parse_size(text).as_ref(), Err(want), "{text}");
        }
    }

    #[test]
    fn percent_table() {
        assert_eq!(Percent::parse_number("50").unwrap().ppm(), 500_000);
        assert_eq!(Percent::parse_number("12.5").unwrap().ppm(), 125_000);
        assert_eq!(Percent::parse_number("100").unwrap(), Percent::ONE_HUNDRED);
        assert_eq!(Percent::parse_number("0.0001").unwrap().ppm(), 1);
        assert_eq!(Percent::parse_number("50").unwrap().of(1000), 500);
        assert_eq!(Percent::parse_number("12.5").unwrap().to_string(), "12.5%");
        assert_eq!(Percent::parse_number("7").unwrap().to_string(), "7%");
        for bad in ["", "0", "0.00001", "100.5", "101", "x", "5x", "-5", "05"] {
            assert!(Percent::parse_number(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(4 << 30), "4.00 GiB");
        assert_eq!(human_bytes(143_771 << 20), "140 GiB");
        assert_eq!(human_bytes(15 << 20), "15.0 MiB");
    }
}
