//! Q3 segment-set validation must never panic. The first three bytes pick
//! a geometry; the rest is read both as an FTW file and as a list of
//! (name, length) entries with the first two bytes as the global scale.
#![no_main]

use ftpipe_formats::{FtwView, Q3Geometry, Q3SegmentSet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [a, b, c, rest @ ..] = data else { return };
    let Ok(geo) = Q3Geometry::uniform(1 + u64::from(*a % 8), u64::from(*b % 16), 32 * (1 + u64::from(*c % 4))) else {
        return;
    };
    if let Ok(v) = FtwView::new(rest) {
        let _ = Q3SegmentSet::from_ftw(&v, &geo);
    }
    let list: Vec<(String, u64)> = rest
        .chunks(6)
        .map(|c| {
            let name = if c[0] < 200 { format!("shard_{}", c[0] % 12) } else { String::from_utf8_lossy(c).into_owned() };
            let len = c.get(2..6).map_or(0, |l| u64::from(u32::from_le_bytes(l.try_into().unwrap())) % 2048);
            (name, len)
        })
        .collect();
    let _ = Q3SegmentSet::validate(&geo, list, rest.get(..2));
});
