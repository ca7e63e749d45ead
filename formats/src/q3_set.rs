//! The Q3_PLE_32 table as a set of segments `shard_0` … `shard_{N−1}` plus
//! one 2-byte global scale record named [`Q3_GLOBAL_SCALE_NAME`].
//!
//! N and the rows of each segment come from the source checkpoint; the
//! reader accepts exactly that set: a missing, extra, duplicated or
//! mis-sized segment is an error naming it. Names must be canonical
//! (`shard_7`, never `shard_07`).

use std::collections::HashSet;

use crate::dtype::Dtype;
use crate::error::{FormatError, Result};
use crate::ftw::FtwView;
use crate::q3::{Q3_GLOBAL_SCALE_BYTES, Q3GlobalScale, q3_segment_len};

/// Name of the global scale record.
pub const Q3_GLOBAL_SCALE_NAME: &str = "global_scale";
/// Prefix of segment names.
pub const Q3_SEGMENT_PREFIX: &str = "shard_";
/// Maximum number of segments.
pub const MAX_Q3_SEGMENTS: u64 = 1 << 16;

/// Name of segment `i`.
pub fn q3_segment_name(i: u64) -> String {
    format!("{Q3_SEGMENT_PREFIX}{i}")
}

/// Parse a canonical segment name to its index.
fn segment_index(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(Q3_SEGMENT_PREFIX)?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// Expected geometry of the table: row width and rows per segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q3Geometry {
    width: u64,
    segment_rows: Vec<u64>,
    segment_lens: Vec<u64>,
    total_len: u64,
}

impl Q3Geometry {
    /// General geometry: segment `i` has `segment_rows[i]` rows.
    pub fn new(width: u64, segment_rows: Vec<u64>) -> Result<Self> {
        if segment_rows.len() as u64 > MAX_Q3_SEGMENTS {
            return Err(FormatError::TooMany {
                what: "Q3 segment",
                count: segment_rows.len() as u64,
                max: MAX_Q3_SEGMENTS,
            });
        }
        let segment_lens = segment_rows
            .iter()
            .map(|&r| q3_segment_len(r, width))
            .collect::<Result<Vec<_>>>()?;
        let total_len = segment_lens
            .iter()
            .try_fold(0u64, |a, &l| a.checked_add(l))
            .ok_or_else(|| FormatError::Overflow {
                what: "Q3 table length".into(),
            })?;
        Ok(Q3Geometry {
            width,
            segment_rows,
            segment_lens,
            total_len,
        })
    }

    /// `segments` segments of `rows_per_segment` rows each.
    pub fn uniform(segments: u64, rows_per_segment: u64, width: u64) -> Result<Self> {
        if segments > MAX_Q3_SEGMENTS {
            return Err(FormatError::TooMany {
                what: "Q3 segment",
                count: segments,
                max: MAX_Q3_SEGMENTS,
            });
        }
        Self::new(width, vec![rows_per_segment; segments as usize])
    }

    /// Row width in elements.
    pub fn width(&self) -> u64 {
        self.width
    }
    /// Number of segments N.
    pub fn segments(&self) -> u64 {
        self.segment_rows.len() as u64
    }
    /// Rows of segment `i`.
    pub fn rows(&self, i: u64) -> Option<u64> {
        self.segment_rows.get(usize::try_from(i).ok()?).copied()
    }
    /// Byte length of segment `i`.
    pub fn segment_len(&self, i: u64) -> Option<u64> {
        self.segment_lens.get(usize::try_from(i).ok()?).copied()
    }
    /// Sum of all segment lengths (the global scale's 2 bytes excluded).
    pub fn total_len(&self) -> u64 {
        self.total_len
    }
}

/// A validated segment set: every segment present once with its exact
/// size, plus a valid global scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q3SegmentSet {
    geometry: Q3Geometry,
    global_scale: Q3GlobalScale,
}

impl Q3SegmentSet {
    /// Check `segments` (name, byte length) against `geometry`, and the
    /// global scale record's bytes (`None` if absent). Any name other than
    /// a canonical `shard_i` with `i < N` is an extra segment.
    pub fn validate<S: AsRef<str>>(
        geometry: &Q3Geometry,
        segments: impl IntoIterator<Item = (S, u64)>,
        global_scale: Option<&[u8]>,
    ) -> Result<Self> {
        let mut seen = HashSet::new();
        for (name, len) in segments {
            let name = name.as_ref();
            let i = segment_index(name).filter(|&i| i < geometry.segments());
            let Some(i) = i else {
                return Err(FormatError::Q3ExtraSegment {
                    name: name.to_owned(),
                });
            };
            if !seen.insert(i) {
                return Err(FormatError::Q3DuplicateSegment {
                    name: name.to_owned(),
                });
            }
            let expected = geometry.segment_len(i).unwrap_or(0);
            if len != expected {
                return Err(FormatError::Q3SegmentSize {
                    name: name.to_owned(),
                    expected,
                    found: len,
                });
            }
        }
        if let Some(i) = (0..geometry.segments()).find(|i| !seen.contains(i)) {
            return Err(FormatError::Q3MissingSegment {
                name: q3_segment_name(i),
            });
        }
        let g = global_scale.ok_or(FormatError::Q3MissingGlobalScale)?;
        if g.len() as u64 != Q3_GLOBAL_SCALE_BYTES {
            return Err(FormatError::Q3GlobalScaleSize {
                found: g.len() as u64,
            });
        }
        Ok(Q3SegmentSet {
            geometry: geometry.clone(),
            global_scale: Q3GlobalScale::from_bytes(g)?,
        })
    }

    /// Validate a table stored as FTW tensors: `shard_i` with dtype
    /// Q3_PLE_32 and shape `[rows_i, width]`, and `global_scale` with dtype
    /// BF16 and shape `[]`. Every tensor in the file must belong to the set.
    pub fn from_ftw(view: &FtwView<'_>, geometry: &Q3Geometry) -> Result<Self> {
        let mut segments = Vec::new();
        let mut global = None;
        for t in view.tensors() {
            let e = t.entry;
            if e.key() == Q3_GLOBAL_SCALE_NAME {
                if e.dtype() != Dtype::BF16 || !e.shape().is_empty() {
                    return Err(FormatError::Q3GlobalScaleSize { found: e.len() });
                }
                global = Some(t.data);
                continue;
            }
            if let Some(rows) = segment_index(e.key()).and_then(|i| geometry.rows(i)) {
                let expected = vec![rows, geometry.width];
                if e.dtype() != Dtype::Q3Ple32 || e.shape() != expected.as_slice() {
                    return Err(FormatError::Q3SegmentShape {
                        name: e.key().to_owned(),
                        dtype: e.dtype(),
                        shape: e.shape().to_vec(),
                        expected,
                    });
                }
            }
            segments.push((e.key(), e.len()));
        }
        Self::validate(geometry, segments, global)
    }

    /// The geometry checked against.
    pub fn geometry(&self) -> &Q3Geometry {
        &self.geometry
    }

    /// The table's global scale.
    pub fn global_scale(&self) -> Q3GlobalScale {
        self.global_scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_names_only() {
        assert_eq!(segment_index("shard_0"), Some(0));
        assert_eq!(segment_index("shard_127"), Some(127));
        assert_eq!(segment_index("shard_07"), None);
        assert_eq!(segment_index("shard_"), None);
        assert_eq!(segment_index("shard_+1"), None);
        assert_eq!(segment_index("shard_99999999999999999999999"), None);
    }

    #[test]
    fn real_geometry() {
        let g = Q3Geometry::uniform(128, 2_500_012, 160).unwrap();
        assert_eq!(g.total_len(), 22_400_107_520);
        assert_eq!(g.segment_len(127), Some(175_000_840));
    }
}
