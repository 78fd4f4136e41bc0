//! Sizes as people write and read them: [`Bytes`] shows a count of bytes
//! in the largest binary unit that keeps it above 1, and parses what a
//! command line or a config file says (`1.5GiB`, `300MB`, `4096`).

use std::fmt;

/// Bytes in a human unit (B, KiB, MiB, GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.2} {}", UNITS[unit])
        }
    }
}

/// A size: a whole or decimal number of bytes with an optional unit.
/// Binary units: `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` (powers
/// of 1024); decimal units: `KB`, `MB`, `GB`, `TB` (powers of 1000), as
/// their names say; `B` or nothing: bytes. Past 2^64 - 1 bytes, negative,
/// or in another unit: refused, with the reason.
impl std::str::FromStr for Bytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        if text.starts_with('-') {
            return Err(format!("a size cannot be negative: {text:?}"));
        }
        let at = text
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(at);
        let scale: u64 = match unit.trim() {
            "" | "B" | "b" => 1,
            "K" | "k" | "KiB" | "kiB" => 1 << 10,
            "M" | "m" | "MiB" => 1 << 20,
            "G" | "g" | "GiB" => 1 << 30,
            "T" | "t" | "TiB" => 1 << 40,
            "KB" | "kB" | "kb" => 1_000,
            "MB" | "mb" => 1_000_000,
            "GB" | "gb" => 1_000_000_000,
            "TB" | "tb" => 1_000_000_000_000,
            other => {
                return Err(format!(
                    "unknown unit {other:?} in {text:?} (K, M, G, T or KiB, MiB, GiB, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000)"
                ));
            }
        };
        let too_large = || format!("{text:?} is more than 2^64 - 1 bytes");
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(format!("not a size: {text:?}"));
        }
        // Exact in integers: the whole part, then the fraction's digits, each
        // scaled (a float would turn 99999999999999999999 into 2^64 - 1).
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_large())?
        };
        let mut bytes = whole.checked_mul(u128::from(scale)).ok_or_else(too_large)?;
        if !fraction.is_empty() {
            // Bytes are whole: the fraction's part rounds down.
            let digits = fraction.len().min(18);
            let numerator: u128 = fraction[..digits]
                .parse()
                .map_err(|_| format!("not a size: {text:?}"))?;
            bytes += numerator * u128::from(scale) / 10u128.pow(digits as u32);
        }
        u64::try_from(bytes).map(Bytes).map_err(|_| too_large())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_exactly_in_binary_and_decimal_units() {
        let parse = |text: &str| text.parse::<Bytes>().map(|b| b.0);
        assert_eq!(parse("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse("300MB"), Ok(300_000_000));
        assert_eq!(parse("300M"), Ok(300 << 20));
        assert_eq!(parse("18446744073709551615"), Ok(u64::MAX));
        for bad in ["18446744073709551616", "-5M", "12x", "", "1e3"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
