//! The one way a byte count is shown to people: decimal units with one
//! decimal (`102.5 GB`, `11.6 MB`, `500 B`), the units `--disk-budget`
//! and the hub's model pages use. Exact byte counts stay in `--json`, the
//! audit's reconciliation rows and error messages beside this.

/// `bytes` for people (see the module doc).
pub fn bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (1_000_000_000_000_000, "PB"),
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
        (1_000, "kB"),
    ];
    match UNITS.iter().find(|(scale, _)| bytes >= *scale) {
        Some((scale, unit)) => format!("{:.1} {unit}", bytes as f64 / *scale as f64),
        None => format!("{bytes} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_000), "1.0 kB");
        assert_eq!(bytes(295_330), "295.3 kB");
        assert_eq!(bytes(10_333_762), "10.3 MB");
        assert_eq!(bytes(102_500_000_000), "102.5 GB");
        assert_eq!(bytes(u64::MAX), "18446.7 PB");
    }
}
