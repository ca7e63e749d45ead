//! The directory as a whole: PLE segment sets, extra files, temp files.
//!
//! A runtime discovers a PLE table's segments by listing its layer
//! directory, so the directory must hold exactly the manifest's set: an
//! extra `shard_9.q3` would silently become part of the table. Elsewhere an
//! extra file is harmless to a runtime but means the artifact is not what
//! the fingerprint vouches for (or someone unpacked something into it), so
//! it is reported too. The walk never follows symlinks.

use std::collections::{BTreeMap, HashSet};
use std::fs::FileType;
use std::path::{Path, PathBuf};

use ftpipe_formats::q3_segment_len;

use ftpipe_fs::TEMP_SUFFIX;

use super::files::file_kind;
use super::{Failure, Findings, MAX_ARTIFACT_ENTRIES, MAX_LISTED_EXTRAS, check, ple_dir};
use crate::ArtifactError;
use crate::manifest::{ComponentLayout, MANIFEST_FILE, Manifest, PLACEMENT_FILE};

/// One non-directory entry under the artifact directory.
#[derive(Debug)]
pub(crate) struct Listed {
    /// Artifact-relative path with `/` separators (lossy if not UTF-8).
    pub rel: String,
    /// Its type, not following symlinks.
    pub file_type: FileType,
}

/// Every non-directory entry, plus failures met below the root.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub entries: Vec<Listed>,
    pub failures: Vec<Failure>,
}

/// Lists `dir` recursively without following symlinks. Only an unreadable
/// root is an error; an unreadable subdirectory is a failure in the report.
pub(crate) fn walk(dir: &Path) -> Result<Listing, ArtifactError> {
    let mut listing = Listing::default();
    let mut found = Findings::default();
    let mut stack: Vec<(PathBuf, String)> = vec![(dir.to_path_buf(), String::new())];
    let mut seen = 0usize;
    while let Some((abs, rel)) = stack.pop() {
        let rd = match std::fs::read_dir(&abs) {
            Ok(rd) => rd,
            Err(e) if rel.is_empty() => return Err(ArtifactError::io("list", &abs, e)),
            Err(e) => {
                found.fail(Some(&rel), check::IO, format!("cannot list {rel}: {e}"));
                continue;
            }
        };
        for entry in rd {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    found.fail(Some(&rel), check::IO, format!("cannot list {rel}: {e}"));
                    break;
                }
            };
            seen += 1;
            if seen > MAX_ARTIFACT_ENTRIES {
                found.fail(
                    None,
                    check::UNEXPECTED_FILE,
                    format!("more than {MAX_ARTIFACT_ENTRIES} entries; stopped listing"),
                );
                listing.failures = found.0;
                return Ok(listing);
            }
            let child = format!("{rel}{}", entry.file_name().to_string_lossy());
            let file_type = match entry.file_type() {
                Ok(ft) => ft,
                Err(e) => {
                    found.fail(Some(&child), check::IO, format!("cannot stat {child}: {e}"));
                    continue;
                }
            };
            if file_type.is_dir() {
                stack.push((entry.path(), format!("{child}/")));
            } else {
                listing.entries.push(Listed {
                    rel: child,
                    file_type,
                });
            }
        }
    }
    listing.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
    listing.failures = found.0;
    Ok(listing)
}

/// One PLE layer as the manifest describes it.
#[derive(Debug, Default)]
struct PleLayer {
    /// Segment index → (rows, width, recorded size, path).
    segments: BTreeMap<u64, (u64, u64, u64, String)>,
    /// Segments the global scale covers, if the layer has one.
    scale_segments: Option<u64>,
}

fn ple_layers(m: &Manifest) -> BTreeMap<u64, PleLayer> {
    let mut layers: BTreeMap<u64, PleLayer> = BTreeMap::new();
    for c in &m.components {
        match c.layout {
            ComponentLayout::Q3Segment {
                layer,
                index,
                rows,
                width,
            } => {
                layers
                    .entry(layer)
                    .or_default()
                    .segments
                    .insert(index, (rows, width, c.size, c.path.clone()));
            }
            ComponentLayout::Q3GlobalScale { layer, segments } => {
                layers.entry(layer).or_default().scale_segments = Some(segments);
            }
            _ => {}
        }
    }
    layers
}

/// Manifest-side checks of every PLE layer's segment set and geometry.
pub(crate) fn check_q3_layers(m: &Manifest, found: &mut Findings) {
    for (layer, set) in ple_layers(m) {
        let dir = ple_dir(layer);
        let n = set.segments.len() as u64;
        let indices: Vec<u64> = set.segments.keys().copied().collect();
        if indices.iter().copied().ne(0..n) {
            found.fail(
                Some(&dir),
                check::Q3_SEGMENT_SET,
                format!(
                    "{dir}: the manifest lists segments {indices:?}, expected shard_0..shard_{} \
                     without gaps",
                    n.saturating_sub(1)
                ),
            );
        }
        match set.scale_segments {
            None => found.fail(
                Some(&dir),
                check::Q3_SEGMENT_SET,
                format!("{dir}: {n} segments but no global_scale.bf16 component"),
            ),
            Some(s) if s != n => found.fail(
                Some(&dir),
                check::Q3_SEGMENT_SET,
                format!(
                    "{dir}: the global scale covers {s} segments, the manifest lists {n} \
                     shard_*.q3 components"
                ),
            ),
            Some(_) => {}
        }
        let widths: HashSet<u64> = set.segments.values().map(|s| s.1).collect();
        if widths.len() > 1 {
            let mut widths: Vec<u64> = widths.into_iter().collect();
            widths.sort_unstable();
            found.fail(
                Some(&dir),
                check::Q3_SEGMENT_SET,
                format!("{dir}: segments have different row widths {widths:?}, expected one"),
            );
        }
        for (rows, width, size, path) in set.segments.values() {
            match q3_segment_len(*rows, *width) {
                Ok(want) if want == *size => {}
                Ok(want) => found.fail(
                    Some(path),
                    check::Q3_SEGMENT_SIZE,
                    format!(
                        "{path}: {rows} rows × {width} imply {want} bytes, the manifest \
                         records {size}"
                    ),
                ),
                Err(e) => found.fail(
                    Some(path),
                    check::Q3_SEGMENT_SIZE,
                    format!("{path}: invalid geometry {rows} rows × {width}: {e}"),
                ),
            }
        }
    }
}

/// Reports every listed file that is not the manifest, the placement or a
/// component: temp files as `stale_temp`, files in a PLE layer directory
/// as `q3_segment_set`, anything else as `unexpected_file`. Without a
/// manifest only temp files are reported (everything would be "extra").
pub(crate) fn check_extras(listing: &Listing, m: Option<&Manifest>, found: &mut Findings) {
    // Without a manifest nothing is expected and no layer is PLE (see above).
    let expected: HashSet<&str> = m
        .map(|m| m.components.iter().map(|c| c.path.as_str()).collect())
        .unwrap_or_default();
    let ple: BTreeMap<String, String> = m
        .map(|m| {
            ple_layers(m)
                .into_iter()
                .map(|(layer, set)| {
                    let dir = ple_dir(layer);
                    let n = set.segments.len();
                    let want = match n {
                        0 => "only global_scale.bf16".to_owned(),
                        _ => format!("shard_0.q3..shard_{}.q3 + global_scale.bf16", n - 1),
                    };
                    (dir, want)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut listed = 0usize;
    let mut unlisted = 0usize;
    for e in &listing.entries {
        let rel = e.rel.as_str();
        let (check, message) = if rel.ends_with(TEMP_SUFFIX) {
            (
                check::STALE_TEMP,
                format!("stale temp file {rel}, left by an interrupted conversion"),
            )
        } else if m.is_none() || rel == MANIFEST_FILE || rel == PLACEMENT_FILE {
            // The JSON files are checked when loaded.
            continue;
        } else if expected.contains(rel) {
            // A listed component that is not a regular file is reported by
            // its component check.
            continue;
        } else if let Some((dir, want)) = ple.iter().find(|(dir, _)| {
            rel.strip_prefix(dir.as_str())
                .is_some_and(|rest| !rest.contains('/'))
        }) {
            (
                check::Q3_SEGMENT_SET,
                format!("{rel}: not in the manifest's segment set of {dir} (expected {want})"),
            )
        } else {
            (
                check::UNEXPECTED_FILE,
                format!(
                    "unexpected file {rel} ({}): not listed in {MANIFEST_FILE}",
                    file_kind(e.file_type)
                ),
            )
        };
        if listed < MAX_LISTED_EXTRAS {
            listed += 1;
            found.fail(Some(rel), check, message);
        } else {
            unlisted += 1;
        }
    }
    if unlisted > 0 {
        found.fail(
            None,
            check::UNEXPECTED_FILE,
            format!("{unlisted} more unexpected or temp files not listed"),
        );
    }
}
