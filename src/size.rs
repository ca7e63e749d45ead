//! Sizes on the command line: one parser for every size flag
//! (`--disk-budget`, `--ram-budget`, `--reserve`, `--segment-threshold`,
//! `--min-range`, `--piece-size`, `--split-below-rate`), so that a unit
//! means the same thing everywhere.
//!
//! Units are exact and case-insensitive: `kB`, `MB`, `GB`, `TB` are powers
//! of 1000 (as disks and `df -H` count), `KiB`, `MiB`, `GiB`, `TiB` powers
//! of 1024, `B` or nothing bytes. A bare `K`, `M`, `G` or `T` is refused:
//! it is read either way by different tools, and a disk budget 7 % off is
//! a wrong budget. A fraction is taken when it gives a whole number of
//! bytes (`1.5GiB`, `0.5MB`), computed in integers, never through a float.

/// The units, lower-case, with their value in bytes.
const UNITS: [(&str, u64); 10] = [
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("", 1),
];

/// Digits of a fraction at most (finer than a byte at any unit).
const MAX_FRACTION_DIGITS: usize = 13;

/// Parses `123`, `64KiB`, `1.5GiB`, `380GB` into bytes; the error says
/// what is wrong and what is expected.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let Some(&(_, scale)) = UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(if matches!(unit.as_str(), "k" | "m" | "g" | "t") {
            format!(
                "{s:?}: a bare {unit:?} is ambiguous; write {num}{u}B (powers of 1000) or {num}{u}iB (powers of 1024)",
                u = unit.to_ascii_uppercase()
            )
        } else {
            format!("{s:?}: unknown unit {unit:?} (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)")
        });
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || !(frac.is_empty() || digits(frac)) || num.ends_with('.') {
        return Err(format!("{s:?} is not a size (e.g. 64GiB, 380GB, 1048576)"));
    }
    if frac.len() > MAX_FRACTION_DIGITS {
        return Err(format!(
            "{s:?}: at most {MAX_FRACTION_DIGITS} digits after the point"
        ));
    }
    let out_of_range = || format!("{s:?} is more than {} bytes", u64::MAX);
    let int: u128 = int.parse().map_err(|_| out_of_range())?;
    let whole = int
        .checked_mul(u128::from(scale))
        .ok_or_else(out_of_range)?;
    let (frac_value, denominator) = if frac.is_empty() {
        (0, 1)
    } else {
        // At most MAX_FRACTION_DIGITS digits times a u64 scale: fits.
        let v: u128 = frac.parse().map_err(|_| out_of_range())?;
        (v * u128::from(scale), 10u128.pow(frac.len() as u32))
    };
    if frac_value % denominator != 0 {
        return Err(format!("{s:?} is not a whole number of bytes"));
    }
    let total = whole
        .checked_add(frac_value / denominator)
        .ok_or_else(out_of_range)?;
    u64::try_from(total).map_err(|_| out_of_range())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: an integer part that fits u128 but not times its unit
    /// overflowed (a panic in debug builds, a wrapped size in release).
    #[test]
    fn a_size_past_u128_times_its_unit_is_refused() {
        let e = parse_size("400000000000000000000000000000000000TiB").unwrap_err();
        assert!(e.contains("is more than"), "{e}");
    }

    #[test]
    fn units_are_exact() {
        for (s, want) in [
            ("0", 0),
            ("123", 123),
            ("123B", 123),
            ("64KiB", 64 << 10),
            ("4MiB", 4 << 20),
            ("1.5GiB", 3 << 29),
            ("380GB", 380_000_000_000),
            ("102.5 GB", 102_500_000_000),
            ("0.5MB", 500_000),
            ("2tib", 2 << 40),
            ("1kB", 1000),
            (" 7 ", 7),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn ambiguous_or_inexact_sizes_are_refused_saying_why() {
        let err = parse_size("2G").unwrap_err();
        assert!(err.contains("2GB") && err.contains("2GiB"), "{err}");
        assert!(parse_size("0.1KiB").unwrap_err().contains("whole number"));
        assert!(parse_size("1.2.3GB").unwrap_err().contains("not a size"));
        assert!(parse_size("GB").unwrap_err().contains("not a size"));
        assert!(parse_size("1.GB").unwrap_err().contains("not a size"));
        assert!(parse_size("-1").unwrap_err().contains("unknown unit"));
        assert!(parse_size("5 bits").unwrap_err().contains("unknown unit"));
        assert!(parse_size("16EiB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("17000000TiB").unwrap_err().contains("more than"));
        assert!(
            parse_size("99999999999999999999999999999999999999999")
                .unwrap_err()
                .contains("more than")
        );
    }
}
