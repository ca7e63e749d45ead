//! What a budgeted run keeps of a PLE file once the file is converted
//! (issue 35): its PLE spans, not the whole file.
//!
//! Every span of a verified file that feeds an FTW or FTEXPERT1 component
//! is written (and claimed) when the file is converted; only the spans of
//! the Q3 components (the PLE table's segments and, for an FP8 table,
//! their scales) are read again, once every PLE file is in. So once a PLE
//! file is converted everything else in it can go: holes are punched over
//! the rest ([`ftpipe_fs::punch`]) and the file keeps its length, its
//! header and its PLE spans at their offsets, where the Q3 writer reads
//! them.
//!
//! A filesystem frees whole allocation units, so the kept ranges are the
//! header, every PLE span and the file's last partial unit, each widened
//! to multiples of the unit and merged: exactly the bytes the file still
//! holds on disk. [`Release`] says whether the volume can punch at all;
//! when it cannot, the PLE spans are copied aside, back to back
//! ([`crate::copied`]), and the file is released whole: the kept ranges
//! are then the PLE spans exactly, and the bytes held the copy's length.

use std::collections::BTreeMap;

use crate::component::{ComponentContent, SourceSpan};
use crate::plan::Plan;

/// How a converted PLE file's bytes leave the disk before it is retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The file is held whole until it is retired (what the schedule
    /// gave before spans were held; kept to compare with).
    WholeFiles,
    /// The volume cannot punch holes: the PLE spans are copied aside and
    /// the file released whole.
    CopyAside,
    /// Everything but its kept ranges is punched, in units of `unit` bytes
    /// (the volume's allocation unit).
    Spans {
        /// The allocation unit, in bytes (> 0).
        unit: u64,
    },
}

impl Release {
    /// The allocation unit (1 for whole files and copies: no rounding).
    pub fn unit(self) -> u64 {
        match self {
            Release::WholeFiles | Release::CopyAside => 1,
            Release::Spans { unit } => unit,
        }
    }

    /// The bytes a converted `len`-byte PLE file keeping `kept` holds:
    /// punched, [`held_bytes`]; copied aside, the copy's length.
    pub fn held(self, kept: &[Range], len: u64) -> u64 {
        match self {
            Release::WholeFiles => len,
            Release::CopyAside => total(kept),
            Release::Spans { unit } => held_bytes(kept, len, unit),
        }
    }

    /// The bytes a PLE file of `len` holds at its peak, keeping `kept`
    /// bytes once converted: copied aside, the whole file and its copy at
    /// once; otherwise the file.
    pub fn peak(self, len: u64, kept: u64) -> u64 {
        match self {
            Release::CopyAside => len.saturating_add(kept),
            Release::WholeFiles | Release::Spans { .. } => len,
        }
    }

    /// What the volume holding `dir` allows ([`ftpipe_fs::punch::probe`]),
    /// probed in `dir` or, when it does not exist yet, its nearest existing
    /// ancestor (a scratch file, removed at once).
    pub fn probe(dir: &std::path::Path) -> Release {
        let existing = dir.ancestors().find(|d| d.is_dir()).unwrap_or(dir);
        match ftpipe_fs::punch::probe(existing) {
            Some(unit) => Release::Spans { unit },
            None => Release::CopyAside,
        }
    }
}

/// A byte range of a file: `(offset, len)`.
pub type Range = (u64, u64);

/// Every span of a Q3 component (segments and FP8 scales), by file, in
/// offset order, each once.
pub fn ple_spans(plan: &Plan) -> BTreeMap<&str, Vec<Range>> {
    let mut out: BTreeMap<&str, Vec<Range>> = BTreeMap::new();
    fn add(s: &SourceSpan) -> (&str, Range) {
        (&*s.file, (s.offset, s.len))
    }
    let mut spans: Vec<(&str, Range)> = Vec::new();
    for c in &plan.components {
        match &c.content {
            ComponentContent::Q3Segment { source, scale, .. } => {
                spans.push(add(source));
                spans.extend(scale.iter().map(add));
            }
            ComponentContent::Q3GlobalScale {
                segments, scales, ..
            } => spans.extend(segments.iter().chain(scales).map(add)),
            ComponentContent::Ftw { .. } | ComponentContent::Experts { .. } => {}
        }
    }
    for (file, range) in spans {
        out.entry(file).or_default().push(range);
    }
    // A segment is named by its own component and by its table's scale.
    for ranges in out.values_mut() {
        ranges.sort_unstable();
        ranges.dedup();
    }
    out
}

/// The ranges of every PLE file of `plan` kept under `release` once it is
/// converted: punched, the header and PLE spans widened to units; copied
/// aside, the PLE spans merged; `None` under [`Release::WholeFiles`].
pub fn kept_of_plan(plan: &Plan, release: Release) -> Option<BTreeMap<String, Vec<Range>>> {
    let (unit, with_header) = match release {
        Release::WholeFiles => return None,
        Release::CopyAside => (1, false),
        Release::Spans { unit } => (unit, true),
    };
    let spans = ple_spans(plan);
    Some(
        plan.sources
            .iter()
            .filter_map(|s| {
                let ple = spans.get(s.file.as_str())?;
                let header_end = if with_header {
                    s.header_bytes.saturating_add(8)
                } else {
                    0
                };
                Some((s.file.clone(), kept_ranges(ple, header_end, s.bytes, unit)))
            })
            .collect(),
    )
}

/// The ranges kept of a `len`-byte file whose header ends at `header_end`
/// and whose PLE spans are `spans`: the header, the spans and the last
/// partial unit, each widened to multiples of `unit`, merged and clipped
/// to `len`, in offset order.
pub fn kept_ranges(spans: &[Range], header_end: u64, len: u64, unit: u64) -> Vec<Range> {
    let unit = unit.max(1);
    let down = |x: u64| x - x % unit;
    let up = |x: u64| down(x).saturating_add(if x.is_multiple_of(unit) { 0 } else { unit });
    let mut wide: Vec<(u64, u64)> = spans
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|&(o, n)| (down(o), up(o.saturating_add(n)).min(len)))
        .collect();
    wide.push((0, up(header_end).min(len)));
    wide.push((down(len), len));
    wide.retain(|(s, e)| s < e);
    wide.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in wide {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// The ranges of a `len`-byte file outside `kept` (sorted, disjoint).
pub fn holes(kept: &[Range], len: u64) -> Vec<Range> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for &(o, n) in kept {
        if o > at {
            out.push((at, o - at));
        }
        at = at.max(o.saturating_add(n));
    }
    if len > at {
        out.push((at, len - at));
    }
    out
}

/// The bytes a `len`-byte file punched down to `kept` (unit-aligned but
/// for the end at `len`) is counted as holding on disk: every allocation
/// unit a range touches, whole (the last partial unit is a whole block
/// too), plus [`METADATA_UNITS`] for the filesystem's own record of the
/// holes, at most `len`. A file found holding more once punched is
/// counted at what it holds.
pub fn held_bytes(kept: &[Range], len: u64, unit: u64) -> u64 {
    let unit = unit.max(1);
    kept.iter()
        .map(|(_, n)| n.div_ceil(unit).saturating_mul(unit))
        .fold(METADATA_UNITS.saturating_mul(unit), u64::saturating_add)
        .min(len)
}

/// Allocation units allowed per punched file for the filesystem's extent
/// records: splitting a file's extents at its holes can take a block of
/// them (ext4 keeps four extents in the inode, more in a tree block that
/// counts in the file's blocks).
pub const METADATA_UNITS: u64 = 1;

/// Σ lengths of `ranges`.
pub fn total(ranges: &[Range]) -> u64 {
    ranges.iter().map(|(_, n)| *n).fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_widened_to_units_merged_and_the_tail_kept() {
        // Header ends at 100; spans at 5000..5100 and 5200..9000; length
        // 20_000 (last partial unit 16_384..20_000).
        let kept = kept_ranges(&[(5000, 100), (5200, 3800)], 100, 20_000, 4096);
        assert_eq!(kept, [(0, 12_288), (16_384, 3616)]);
        assert_eq!(holes(&kept, 20_000), [(12_288, 4096)]);
        assert_eq!(total(&kept), 12_288 + 3616);
        // The last partial unit takes a whole block.
        assert_eq!(held_bytes(&kept, 20_000, 4096), 20_000);
        assert_eq!(held_bytes(&kept, 40_000, 4096), 16_384 + 4096);
        // A file smaller than a unit is kept whole.
        assert_eq!(kept_ranges(&[(10, 5)], 8, 300, 4096), [(0, 300)]);
        assert!(holes(&[(0, 300)], 300).is_empty());
        // Far-apart spans leave holes between them.
        let kept = kept_ranges(&[(40_000, 10)], 50, 81_920, 4096);
        assert_eq!(kept, [(0, 4096), (36_864, 4096)]);
        assert_eq!(holes(&kept, 81_920), [(4096, 32_768), (40_960, 40_960)]);
    }

    #[test]
    fn a_copy_aside_keeps_the_spans_exactly() {
        // No header, no tail, no widening: the spans merged.
        let kept = kept_ranges(&[(5000, 100), (5100, 50), (9000, 10)], 0, 20_000, 1);
        assert_eq!(kept, [(5000, 150), (9000, 10)]);
        assert_eq!(Release::CopyAside.held(&kept, 20_000), 160);
        // The whole file and its copy at once, until the file is released.
        assert_eq!(Release::CopyAside.peak(20_000, 160), 20_160);
        assert_eq!(Release::Spans { unit: 4096 }.peak(20_000, 8192), 20_000);
    }
}
