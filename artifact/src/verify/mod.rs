//! `verify`: static, isolated verification of a converted artifact.
//!
//! Reads only the artifact directory — no database, no source checkpoint,
//! no network — so an artifact that was copied to another machine, restored
//! from a backup or handed over by someone else can be checked before a
//! runtime trusts it. The manifest is the single source of truth: its
//! fingerprint vouches for every component's path and digest, and every
//! byte on disk is compared against it.
//!
//! Every problem found goes into the [`VerifyReport`] as a [`Failure`]
//! naming the component, a short check id (see [`check`]) and what was
//! expected versus found, so one run lists everything wrong at once. `Err`
//! is reserved for "cannot even start": the directory does not exist, is
//! not a directory or cannot be listed.
//!
//! Components may be tens of GB, so nothing is read whole: headers are read
//! through a `BufReader` and bounded by the format crate's own limits, the
//! JSON files by named size limits. Without `deep`, verification touches
//! only metadata and headers (seconds for any size); with `deep`, every
//! component is streamed through SHA-256 and compared with the manifest.
//!
//! The checks:
//! 1. `manifest.json`: present, parses, schema, fingerprint, component
//!    paths (safe, canonical for their layout, unique), `size ==
//!    predicted_bytes` — [`verify_artifact`] here.
//! 2. Each component: a regular file (no symlink anywhere on its path) of
//!    the recorded size, with `deep` of the recorded SHA-256; FTW and
//!    FTEXPERT1 headers parse, match the file length and describe exactly
//!    the manifest's layout; global scales parse — `files`.
//! 3. Per PLE layer, the manifest's segments are `shard_0..shard_{N-1}`
//!    with `N` = the global scale's `segments` and sizes from the geometry;
//!    on disk the layer directory holds exactly those files — `tree`.
//! 4. Nothing else in the directory: extra files and stale temp files are
//!    reported one by one — `tree`.
//! 5. `placement.json`: present, parses, consistent with the manifest.

mod files;
mod tree;

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use ftpipe_fs::TEMP_SUFFIX;
use ftpipe_fs::paths::validate_repo_path;

use crate::ArtifactError;
use crate::manifest::{
    ComponentLayout, FTW_COMPONENT, MANIFEST_FILE, MANIFEST_SCHEMA, MANIFEST_SCHEMA_V1, Manifest,
    PLACEMENT_FILE, Placement,
};

/// Largest `manifest.json` read, checked before reading it. It lists every
/// tensor: a ~300k-tensor NVFP4 MoE export's is ~27 MB (see the test
/// `max_manifest_bytes_holds_a_300k_tensor_nvfp4_manifest_twice`).
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// Largest `placement.json` read (a few hundred bytes in practice; layer
/// lists of a few thousand layers at most).
pub const MAX_PLACEMENT_BYTES: u64 = 1024 * 1024;
/// Unexpected and stale temp files listed one by one before the rest are
/// summarized in a single failure (a report stays readable when someone
/// unpacked a whole checkpoint into the artifact directory).
pub const MAX_LISTED_EXTRAS: usize = 1000;
/// Most entries (files and directories) listed under the artifact
/// directory before the walk stops with a failure: an artifact has one
/// entry per component, and no real one comes near.
pub const MAX_ARTIFACT_ENTRIES: usize = 1_000_000;

/// Short ids of the checks, as they appear in [`Failure::check`].
pub mod check {
    /// `manifest.json` missing, too large, not a regular file or unparsable.
    pub const MANIFEST: &str = "manifest";
    /// The manifest's schema is not the one this build reads.
    pub const SCHEMA: &str = "schema";
    /// The recorded fingerprint differs from the one its contents imply.
    pub const FINGERPRINT: &str = "fingerprint";
    /// A component path is unsafe or not the canonical name for its layout.
    pub const COMPONENT_PATH: &str = "component_path";
    /// Two components share a path.
    pub const DUPLICATE_PATH: &str = "duplicate_path";
    /// A component's recorded size differs from its predicted size.
    pub const PREDICTED_SIZE: &str = "predicted_size";
    /// A recorded SHA-256 is not 64 lowercase hex digits.
    pub const DIGEST_FORMAT: &str = "digest_format";
    /// The FTW stream and the manifest's tensor list disagree in the manifest itself.
    pub const MANIFEST_LAYOUT: &str = "manifest_layout";
    /// A listed component is not on disk.
    pub const MISSING: &str = "missing";
    /// A listed component is a symlink, a directory or sits behind a symlink.
    pub const NOT_REGULAR_FILE: &str = "not_regular_file";
    /// A file could not be read.
    pub const IO: &str = "io";
    /// A component's size on disk differs from the manifest.
    pub const SIZE: &str = "size";
    /// A component's SHA-256 differs from the manifest (`deep` only).
    pub const SHA256: &str = "sha256";
    /// The FTW header does not parse or does not match the file length.
    pub const FTW_HEADER: &str = "ftw_header";
    /// The FTW tensor index differs from the manifest's `ftw_tensors`.
    pub const FTW_INDEX: &str = "ftw_index";
    /// An FTEXPERT1 header does not parse or does not match the file length.
    pub const FTEXPERT_HEADER: &str = "ftexpert_header";
    /// An FTEXPERT1 header describes another layer, count, record or fields.
    pub const FTEXPERT_LAYOUT: &str = "ftexpert_layout";
    /// A PLE layer's segment set is incomplete, gapped or has extra files.
    pub const Q3_SEGMENT_SET: &str = "q3_segment_set";
    /// A segment's size does not follow from its rows and width.
    pub const Q3_SEGMENT_SIZE: &str = "q3_segment_size";
    /// A global scale record is not a valid 2-byte bf16 scale.
    pub const Q3_GLOBAL_SCALE: &str = "q3_global_scale";
    /// A file in the artifact directory that the manifest does not list.
    pub const UNEXPECTED_FILE: &str = "unexpected_file";
    /// A temp file left by an interrupted conversion.
    pub const STALE_TEMP: &str = "stale_temp";
    /// `placement.json` missing, unparsable or inconsistent with the manifest.
    pub const PLACEMENT: &str = "placement";
}

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Artifact-relative path of the file at fault (a directory ends in `/`),
    /// `None` for the artifact as a whole.
    pub component: Option<String>,
    /// Short id from [`check`].
    pub check: String,
    /// What was expected and what was found.
    pub message: String,
}

/// The outcome of [`verify_artifact`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// No check failed.
    pub ok: bool,
    /// The artifact directory as given.
    pub dir: String,
    /// The manifest's recorded fingerprint, if the manifest parsed.
    pub fingerprint: Option<String>,
    /// The manifest's schema, if it parsed.
    pub schema: Option<String>,
    /// FTEXPERT1 sidecars (MoE layers) in the manifest.
    pub expert_layers: usize,
    /// Expert records over all layers.
    pub experts: u64,
    /// Experts per layer when every layer has the same count.
    pub experts_per_layer: Option<u64>,
    /// PLE layers (Q3_PLE_32 tables) in the manifest.
    pub ple_layers: usize,
    /// Expert layers the placement reads from the file tier.
    pub file_tier_layers: usize,
    /// Expert layers the placement keeps in RAM.
    pub resident_layers: usize,
    /// Components in the manifest.
    pub components: usize,
    /// Σ recorded component sizes.
    pub bytes: u64,
    /// Whether every component was hashed.
    pub deep: bool,
    /// Every failed check, in check order.
    pub failures: Vec<Failure>,
}

/// Collects failures; shared by the submodules.
#[derive(Debug, Default)]
pub(crate) struct Findings(Vec<Failure>);

impl Findings {
    /// Records a failure of `check` at `component`.
    pub(crate) fn fail(&mut self, component: Option<&str>, check: &str, message: String) {
        self.0.push(Failure {
            component: component.map(str::to_owned),
            check: check.to_owned(),
            message,
        });
    }
}

/// Verifies the artifact in `dir`; with `deep`, hashes every component.
///
/// Returns `Err` only when verification cannot start (no such directory,
/// not a directory, root not listable); every failed check is in the report.
pub fn verify_artifact(dir: &Path, deep: bool) -> Result<VerifyReport, ArtifactError> {
    verify_with(dir, deep, None)
}

/// Verifies the artifact in `dir` as if `manifest` (its bytes) were its
/// `manifest.json`, before they are written there: a receiver (`pull`)
/// publishes the manifest, the signal a runtime waits for, only once the
/// artifact it describes has passed. A `manifest.json` already in `dir` is
/// not read.
pub fn verify_artifact_with_manifest(
    dir: &Path,
    manifest: &[u8],
    deep: bool,
) -> Result<VerifyReport, ArtifactError> {
    verify_with(dir, deep, Some(manifest))
}

fn verify_with(
    dir: &Path,
    deep: bool,
    given_manifest: Option<&[u8]>,
) -> Result<VerifyReport, ArtifactError> {
    let meta = std::fs::metadata(dir).map_err(|e| ArtifactError::io("open artifact", dir, e))?;
    if !meta.is_dir() {
        return Err(ArtifactError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let listing = tree::walk(dir)?;
    let mut report = VerifyReport {
        ok: false,
        dir: dir.display().to_string(),
        fingerprint: None,
        schema: None,
        expert_layers: 0,
        experts: 0,
        experts_per_layer: None,
        ple_layers: 0,
        file_tier_layers: 0,
        resident_layers: 0,
        components: 0,
        bytes: 0,
        deep,
        failures: Vec::new(),
    };
    let mut found = Findings::default();
    found.0.extend(listing.failures.iter().cloned());

    let loaded = match given_manifest {
        Some(bytes) => parse_json::<Manifest>(MANIFEST_FILE, bytes),
        None => load_json::<Manifest>(dir, MANIFEST_FILE, MAX_MANIFEST_BYTES),
    };
    let manifest = match loaded {
        Ok(m) => Some(m),
        Err(message) => {
            found.fail(Some(MANIFEST_FILE), check::MANIFEST, message);
            None
        }
    };
    if let Some(m) = &manifest {
        summarize(m, &mut report);
        let checkable = check_manifest(m, &mut found);
        for c in m
            .components
            .iter()
            .filter(|c| checkable.contains(c.path.as_str()))
        {
            files::check_component(dir, c, m, deep, &mut found);
        }
        tree::check_q3_layers(m, &mut found);
    }
    tree::check_extras(&listing, manifest.as_ref(), &mut found);

    match load_json::<Placement>(dir, PLACEMENT_FILE, MAX_PLACEMENT_BYTES) {
        Ok(p) => {
            report.resident_layers = p.resident_layers.len();
            report.file_tier_layers = p.file_tier_layers.len();
            if let Some(m) = &manifest
                && let Err(e) = p.check(m)
            {
                found.fail(
                    Some(PLACEMENT_FILE),
                    check::PLACEMENT,
                    format!("{PLACEMENT_FILE} does not fit {MANIFEST_FILE}: {e}"),
                );
            }
        }
        Err(message) => found.fail(Some(PLACEMENT_FILE), check::PLACEMENT, message),
    }

    report.failures = found.0;
    report.ok = report.failures.is_empty();
    Ok(report)
}

/// Fills the report's summary counts from a parsed manifest.
fn summarize(m: &Manifest, r: &mut VerifyReport) {
    r.fingerprint = Some(m.fingerprint.clone());
    r.schema = Some(m.schema.clone());
    r.components = m.components.len();
    r.bytes = m
        .components
        .iter()
        .fold(0u64, |acc, c| acc.saturating_add(c.size));
    let counts: Vec<u64> = m
        .components
        .iter()
        .filter_map(|c| match c.layout {
            ComponentLayout::Ftexpert { experts, .. } => Some(experts),
            _ => None,
        })
        .collect();
    r.expert_layers = counts.len();
    r.experts = counts.iter().fold(0u64, |acc, n| acc.saturating_add(*n));
    r.experts_per_layer = match counts.split_first() {
        Some((first, rest)) if rest.iter().all(|n| n == first) => Some(*first),
        _ => None,
    };
    let ple: HashSet<u64> = m
        .components
        .iter()
        .filter_map(|c| match c.layout {
            ComponentLayout::Q3Segment { layer, .. }
            | ComponentLayout::Q3GlobalScale { layer, .. } => Some(layer),
            _ => None,
        })
        .collect();
    r.ple_layers = ple.len();
}

/// The artifact-relative path a component with `layout` must have: the
/// names the converter writes and a runtime opens.
pub fn canonical_path(layout: &ComponentLayout) -> String {
    match layout {
        ComponentLayout::Ftw { .. } => FTW_COMPONENT.to_owned(),
        ComponentLayout::Ftexpert { layer, .. } => format!("experts/layer_{layer:03}.ftexpert"),
        ComponentLayout::Q3Segment { layer, index, .. } => {
            format!("{}shard_{index}.q3", ple_dir(*layer))
        }
        ComponentLayout::Q3GlobalScale { layer, .. } => {
            format!("{}global_scale.bf16", ple_dir(*layer))
        }
    }
}

/// The directory of PLE layer `layer`, with a trailing `/`.
pub(crate) fn ple_dir(layer: u64) -> String {
    format!("ple/layer_{layer:03}/")
}

fn is_lower_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Manifest-only checks. Returns the paths safe to look up on disk: valid,
/// canonical and listed once (a duplicate is checked at its first listing).
fn check_manifest<'m>(m: &'m Manifest, found: &mut Findings) -> HashSet<&'m str> {
    if m.schema == MANIFEST_SCHEMA_V1 {
        found.fail(
            Some(MANIFEST_FILE),
            check::SCHEMA,
            format!(
                "schema is {MANIFEST_SCHEMA_V1:?}, written by an older ftpipe whose fingerprint \
                 left the tensor inventory, the FTW descriptors and the component layouts \
                 unprotected; expected {MANIFEST_SCHEMA:?}: run `ftpipe convert` (or `run`) on \
                 the output directory again, which keeps every component and rewrites the \
                 manifest, then publish again"
            ),
        );
    } else if m.schema != MANIFEST_SCHEMA {
        found.fail(
            Some(MANIFEST_FILE),
            check::SCHEMA,
            format!("schema is {:?}, expected {MANIFEST_SCHEMA:?}", m.schema),
        );
    }
    match m.compute_fingerprint() {
        Ok(computed) if computed == m.fingerprint => {}
        Ok(computed) => found.fail(
            Some(MANIFEST_FILE),
            check::FINGERPRINT,
            format!(
                "recorded fingerprint {}, but the manifest's other fields hash to {computed} \
                 (the manifest was edited)",
                m.fingerprint
            ),
        ),
        Err(e) => found.fail(
            Some(MANIFEST_FILE),
            check::FINGERPRINT,
            format!(
                "recorded fingerprint {}, which cannot be recomputed: {e}",
                m.fingerprint
            ),
        ),
    }
    let mut seen = HashSet::new();
    let mut checkable = HashSet::new();
    for c in &m.components {
        let p = Some(c.path.as_str());
        if c.size != c.predicted_bytes {
            found.fail(
                p,
                check::PREDICTED_SIZE,
                format!(
                    "manifest records {} bytes written but {} predicted",
                    c.size, c.predicted_bytes
                ),
            );
        }
        if !is_lower_hex64(&c.sha256) {
            found.fail(
                p,
                check::DIGEST_FORMAT,
                format!(
                    "recorded sha256 {:?} is not 64 lowercase hex digits",
                    c.sha256
                ),
            );
        }
        if !seen.insert(c.path.as_str()) {
            found.fail(
                p,
                check::DUPLICATE_PATH,
                "listed more than once in the manifest".to_owned(),
            );
            continue;
        }
        let reserved = [MANIFEST_FILE, PLACEMENT_FILE].contains(&c.path.as_str())
            || c.path.ends_with(TEMP_SUFFIX);
        if let Err(e) = validate_repo_path(&c.path) {
            found.fail(p, check::COMPONENT_PATH, format!("unsafe path: {e}"));
        } else if reserved {
            found.fail(
                p,
                check::COMPONENT_PATH,
                "a reserved name cannot be a component".to_owned(),
            );
        } else if c.path != canonical_path(&c.layout) {
            found.fail(
                p,
                check::COMPONENT_PATH,
                format!(
                    "a {} component must be named {}",
                    layout_kind(&c.layout),
                    canonical_path(&c.layout)
                ),
            );
        } else {
            checkable.insert(c.path.as_str());
        }
    }
    let ftw = m
        .components
        .iter()
        .filter(|c| matches!(c.layout, ComponentLayout::Ftw { .. }))
        .count();
    if ftw == 0 && !m.ftw_tensors.is_empty() {
        found.fail(
            Some(MANIFEST_FILE),
            check::MANIFEST_LAYOUT,
            format!(
                "lists {} ftw_tensors but no {FTW_COMPONENT} component",
                m.ftw_tensors.len()
            ),
        );
    }
    checkable
}

/// The layout's kind as serialized.
pub(crate) fn layout_kind(layout: &ComponentLayout) -> &'static str {
    match layout {
        ComponentLayout::Ftw { .. } => "ftw",
        ComponentLayout::Ftexpert { .. } => "ftexpert",
        ComponentLayout::Q3Segment { .. } => "q3_segment",
        ComponentLayout::Q3GlobalScale { .. } => "q3_global_scale",
    }
}

/// Reads and parses `dir/name` as JSON of at most `limit` bytes; the error
/// is a finished message naming the file.
fn load_json<T: DeserializeOwned>(dir: &Path, name: &str, limit: u64) -> Result<T, String> {
    let path = dir.join(name);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("{name} not found in the artifact directory"));
        }
        Err(e) => return Err(format!("cannot stat {name}: {e}")),
    };
    if !meta.is_file() {
        return Err(format!(
            "{name} is a {}, expected a regular file",
            files::file_kind(meta.file_type())
        ));
    }
    if meta.len() > limit {
        return Err(format!(
            "{name} is {} bytes, over the limit of {limit}",
            meta.len()
        ));
    }
    // At most `limit + 1` bytes read (one more than the limit means it
    // grew meanwhile), then parsed from memory: a reader-driven parse
    // takes several times longer on a manifest of many MB.
    let file =
        ftpipe_fs::nofollow::open_read(&path).map_err(|e| format!("cannot read {name}: {e}"))?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {name}: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{name} grew past the limit of {limit} bytes"));
    }
    parse_json(name, &bytes)
}

/// `bytes` of the file `name`, parsed.
fn parse_json<T: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("{name} does not parse: {e}"))
}
