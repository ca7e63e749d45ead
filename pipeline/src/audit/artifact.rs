//! The artifact half of the audit: component receipts against the files in
//! `DIR/artifact/`, the manifest, the placement and the plan.
//!
//! A component receipt carries three sizes that must all agree: the plan's
//! prediction, the receipt's `size` (= its `predicted_bytes`) and the file on
//! disk. Checking each pair separately is what makes a hand-edited receipt
//! visible: the database CHECK keeps `size = predicted_bytes` only while
//! nobody turns CHECKs off, the file keeps its real length, and the plan is
//! a separate file. The manifest is derived from the receipts, so any
//! disagreement between the two (path set, size, SHA-256) means one of them
//! was changed after the fact. Bytes that disagree are counted in the
//! reconciliation error; a SHA-256 disagreement counts the whole component.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;
use tokio::task::block_in_place;

use ftpipe_artifact::manifest::{MANIFEST_FILE, Manifest, PLACEMENT_FILE, Placement, sha256_hex};
use ftpipe_artifact::verify::{MAX_MANIFEST_BYTES, MAX_PLACEMENT_BYTES};
use ftpipe_fs::TEMP_SUFFIX;
use ftpipe_receipts::{ArtifactEvent, ArtifactRow, ComponentReceipt};

use super::{ComponentProblem, KindAudit, PendingComponent, walk};
use crate::error::{PipelineError, Result};
use ftpipe_fs::paths::safe_join;
use ftpipe_hub::identity::{Expected, LfsSha256, hash_file};

/// Component kinds this build writes.
const KINDS: &[&str] = &["ftw", "ftexpert", "q3_segment", "q3_global_scale"];

/// The part of a serialized `convert::Plan` the audit reads.
#[derive(Debug, Deserialize)]
struct PlanFile {
    components: Vec<PlannedComponent>,
    total_bytes: u64,
    #[serde(default)]
    omitted: Vec<PlannedOmission>,
    #[serde(default)]
    excluded_sources: Vec<PlannedExclusion>,
}

/// A source tensor the plan leaves out of the artifact (vision, MTP).
#[derive(Debug, Deserialize)]
struct PlannedOmission {
    bytes: u64,
    #[serde(default = "ftpipe_artifact::manifest::fetched_default")]
    fetched: bool,
}

/// A shard the fetch selection left out (its listed size).
#[derive(Debug, Deserialize)]
struct PlannedExclusion {
    bytes: u64,
}

#[derive(Debug, Deserialize)]
struct PlannedComponent {
    name: String,
    kind: String,
    predicted_bytes: u64,
}

/// What the artifact half found.
pub(super) struct ArtifactPart {
    pub kinds: BTreeMap<String, KindAudit>,
    pub known_target_total: u64,
    pub known_target_from: &'static str,
    pub plan_present: bool,
    pub manifest_present: bool,
    /// Count and source bytes of the fetched tensors the plan omits.
    pub omitted: (usize, u64),
    /// Count of the omitted tensors not fetched, and the listed bytes of
    /// their files.
    pub not_fetched: (usize, u64),
    pub pending: Vec<PendingComponent>,
    pub problems: Vec<ComponentProblem>,
    pub receipts_without_files: Vec<String>,
    pub files_without_receipts: Vec<String>,
    pub stale_temp_files: Vec<String>,
    pub error: u64,
}

impl ArtifactPart {
    /// Nothing pending, missing, unclaimed, half-written or inconsistent.
    pub fn is_ok(&self) -> bool {
        self.error == 0
            && self.pending.is_empty()
            && self.problems.is_empty()
            && self.receipts_without_files.is_empty()
            && self.files_without_receipts.is_empty()
            && self.stale_temp_files.is_empty()
    }

    fn problem(&mut self, path: &str, problem: String) {
        self.problems.push(ComponentProblem {
            path: path.to_owned(),
            problem,
        });
    }
}

/// Reads a JSON file the converter wrote (at most `limit` bytes, checked
/// before reading, never through a link); `None` when it does not exist.
fn read_optional(path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    match ftpipe_fs::bounded::read_bounded_nofollow(path, limit) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(PipelineError::io("read", path, e.into())),
    }
}

/// Audits the component receipts against `artifact_root`, its manifest and
/// placement, and the plan at `plan_path` (when given and present).
/// The artifact half of the audit of a pulled directory: no conversion
/// records, so the manifest (once written) and the files are checked as
/// `ftpipe verify` checks them (`deep`: every component re-hashed).
pub(super) fn audit_pulled(artifact_root: &Path, deep: bool) -> Result<ArtifactPart> {
    let mut out = ArtifactPart {
        kinds: BTreeMap::new(),
        known_target_total: 0,
        known_target_from: "manifest",
        plan_present: false,
        manifest_present: artifact_root.join(MANIFEST_FILE).is_file(),
        omitted: (0, 0),
        not_fetched: (0, 0),
        pending: Vec::new(),
        problems: Vec::new(),
        receipts_without_files: Vec::new(),
        files_without_receipts: Vec::new(),
        stale_temp_files: Vec::new(),
        error: 0,
    };
    if out.manifest_present {
        let report =
            block_in_place(|| ftpipe_artifact::verify::verify_artifact(artifact_root, deep))?;
        for line in crate::verify_problems(&report) {
            out.problem(MANIFEST_FILE, line);
        }
        out.known_target_total = report.bytes;
    }
    Ok(out)
}

pub(super) fn audit_artifact(
    receipts: &[ComponentReceipt],
    artifact_log: &[ArtifactRow],
    artifact_root: &Path,
    plan_path: Option<&Path>,
    deep: bool,
) -> Result<ArtifactPart> {
    let mut out = ArtifactPart {
        kinds: BTreeMap::new(),
        known_target_total: 0,
        known_target_from: "receipts",
        plan_present: false,
        manifest_present: false,
        omitted: (0, 0),
        not_fetched: (0, 0),
        pending: Vec::new(),
        problems: Vec::new(),
        receipts_without_files: Vec::new(),
        files_without_receipts: Vec::new(),
        stale_temp_files: Vec::new(),
        error: 0,
    };
    let by_path: BTreeMap<&str, &ComponentReceipt> =
        receipts.iter().map(|r| (r.path.as_str(), r)).collect();
    for r in receipts {
        check_receipt(&mut out, r, artifact_root, deep)?;
    }
    out.known_target_total = receipts.iter().map(|r| r.predicted_bytes).sum();
    let plan_bytes = match plan_path {
        Some(p) => read_optional(p, MAX_MANIFEST_BYTES)?,
        None => None,
    };
    if let Some(bytes) = plan_bytes {
        out.plan_present = true;
        match serde_json::from_slice::<PlanFile>(&bytes) {
            Ok(plan) => check_plan(&mut out, &plan, &by_path),
            Err(e) => out.problem("plan.json", format!("unreadable: {e}")),
        }
    }
    let manifest_path = artifact_root.join(MANIFEST_FILE);
    let manifest = match read_optional(&manifest_path, MAX_MANIFEST_BYTES)? {
        None => {
            // While components are pending the manifest is not due yet.
            if out.pending.is_empty() && (out.plan_present || !receipts.is_empty()) {
                out.problem(
                    MANIFEST_FILE,
                    "missing: every component has a receipt but no manifest was written".into(),
                );
            }
            None
        }
        Some(bytes) => {
            out.manifest_present = true;
            check_manifest_log(&mut out, &bytes, artifact_log);
            match serde_json::from_slice::<Manifest>(&bytes) {
                Ok(m) => {
                    check_manifest(&mut out, &m, &by_path);
                    Some(m)
                }
                Err(e) => {
                    out.problem(MANIFEST_FILE, format!("unreadable: {e}"));
                    None
                }
            }
        }
    };
    let placement_path = artifact_root.join(PLACEMENT_FILE);
    if let Some(bytes) = read_optional(&placement_path, MAX_PLACEMENT_BYTES)? {
        let checked = serde_json::from_slice::<Placement>(&bytes)
            .map_err(|e| format!("unreadable: {e}"))
            .and_then(|p| match &manifest {
                Some(m) => p.check(m),
                None if out.manifest_present => Ok(()),
                None => Err("present without manifest.json".into()),
            });
        if let Err(problem) = checked {
            out.problem(PLACEMENT_FILE, problem);
        }
    }
    let mut on_disk = Vec::new();
    walk(artifact_root, artifact_root, &mut on_disk)
        .map_err(|e| PipelineError::io("list", artifact_root, e))?;
    for rel in on_disk {
        if by_path.contains_key(rel.as_str()) || rel == MANIFEST_FILE || rel == PLACEMENT_FILE {
            continue;
        }
        if rel.ends_with(TEMP_SUFFIX) {
            out.stale_temp_files.push(format!("artifact/{rel}"));
        } else {
            out.files_without_receipts.push(format!("artifact/{rel}"));
        }
    }
    Ok(out)
}

/// One receipt against its own prediction and its file.
fn check_receipt(
    out: &mut ArtifactPart,
    r: &ComponentReceipt,
    artifact_root: &Path,
    deep: bool,
) -> Result<()> {
    let kind = out.kinds.entry(r.kind.clone()).or_default();
    kind.count += 1;
    kind.predicted_bytes += r.predicted_bytes;
    if !KINDS.contains(&r.kind.as_str()) {
        out.problem(&r.path, format!("unknown component kind {:?}", r.kind));
    }
    if r.size != r.predicted_bytes {
        out.problem(
            &r.path,
            format!(
                "receipt size {} differs from its prediction {}",
                r.size, r.predicted_bytes
            ),
        );
        out.error += r.size.abs_diff(r.predicted_bytes);
    }
    let path = match safe_join(artifact_root, &r.path) {
        Ok(p) => p,
        Err(e) => {
            out.problem(&r.path, e.to_string());
            out.error += r.size;
            return Ok(());
        }
    };
    let len = match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => m.len(),
        _ => {
            out.problem(&r.path, "receipt without its file".into());
            out.receipts_without_files
                .push(format!("artifact/{}", r.path));
            out.error += r.size;
            return Ok(());
        }
    };
    if let Some(k) = out.kinds.get_mut(&r.kind) {
        k.actual_bytes += len;
    }
    if len != r.size {
        out.problem(
            &r.path,
            format!("size {len} on disk, receipt says {}", r.size),
        );
        out.error += len.abs_diff(r.size);
    } else if deep {
        let Some(sha) = LfsSha256::parse(&r.sha256) else {
            out.problem(&r.path, format!("receipt sha256 {:?} is invalid", r.sha256));
            out.error += r.size;
            return Ok(());
        };
        let expected = Expected::Sha256(sha);
        let digest = block_in_place(|| hash_file(&path, &expected, len))
            .map_err(|e| PipelineError::io("hash", &path, e))?;
        if digest != expected.hex() {
            out.problem(
                &r.path,
                format!("sha256 on disk is {digest}, receipt says {}", r.sha256),
            );
            out.error += r.size;
        }
    }
    Ok(())
}

/// The plan against the receipts: same predictions and kinds; planned
/// components without a receipt are pending.
fn check_plan(
    out: &mut ArtifactPart,
    plan: &PlanFile,
    by_path: &BTreeMap<&str, &ComponentReceipt>,
) {
    out.known_target_from = "plan";
    let fetched = plan.omitted.iter().filter(|o| o.fetched);
    out.omitted = (fetched.clone().count(), fetched.map(|o| o.bytes).sum());
    out.not_fetched = (
        plan.omitted.iter().filter(|o| !o.fetched).count(),
        plan.excluded_sources.iter().map(|s| s.bytes).sum(),
    );
    out.known_target_total = plan.components.iter().map(|c| c.predicted_bytes).sum();
    if plan.total_bytes != out.known_target_total {
        out.problem(
            "plan.json",
            format!(
                "total_bytes {} differs from the sum of its components {}",
                plan.total_bytes, out.known_target_total
            ),
        );
    }
    let planned: BTreeSet<&str> = plan.components.iter().map(|c| c.name.as_str()).collect();
    for c in &plan.components {
        match by_path.get(c.name.as_str()) {
            None => {
                let k = out.kinds.entry(c.kind.clone()).or_default();
                k.pending += 1;
                k.pending_bytes += c.predicted_bytes;
                out.pending.push(PendingComponent {
                    path: c.name.clone(),
                    kind: c.kind.clone(),
                    predicted_bytes: c.predicted_bytes,
                });
            }
            Some(r) => {
                if r.predicted_bytes != c.predicted_bytes {
                    out.problem(
                        &c.name,
                        format!(
                            "receipt predicts {} bytes, plan.json {}",
                            r.predicted_bytes, c.predicted_bytes
                        ),
                    );
                    out.error += r.predicted_bytes.abs_diff(c.predicted_bytes);
                }
                if r.kind != c.kind {
                    out.problem(
                        &c.name,
                        format!("receipt kind {:?}, plan.json {:?}", r.kind, c.kind),
                    );
                }
            }
        }
    }
    for path in by_path.keys().filter(|p| !planned.contains(*p)) {
        out.problem(
            path,
            "receipt for a component plan.json does not have".into(),
        );
    }
}

/// The manifest against the receipts: same paths, sizes and digests, and a
/// fingerprint that matches its contents.
fn check_manifest(
    out: &mut ArtifactPart,
    m: &Manifest,
    by_path: &BTreeMap<&str, &ComponentReceipt>,
) {
    match m.compute_fingerprint() {
        Ok(computed) if computed == m.fingerprint => {}
        Ok(computed) => out.problem(
            MANIFEST_FILE,
            format!(
                "fingerprint {} does not match its contents ({computed})",
                m.fingerprint
            ),
        ),
        Err(e) => out.problem(
            MANIFEST_FILE,
            format!("fingerprint {} cannot be recomputed: {e}", m.fingerprint),
        ),
    }
    let listed: BTreeSet<&str> = m.components.iter().map(|c| c.path.as_str()).collect();
    for c in &m.components {
        let Some(r) = by_path.get(c.path.as_str()) else {
            out.problem(&c.path, "in manifest.json without a receipt".into());
            out.error += c.size;
            continue;
        };
        if c.size != r.size || c.predicted_bytes != r.predicted_bytes {
            out.problem(
                &c.path,
                format!(
                    "manifest.json says {} bytes (predicted {}), receipt {} (predicted {})",
                    c.size, c.predicted_bytes, r.size, r.predicted_bytes
                ),
            );
            out.error += c.size.abs_diff(r.size);
        }
        if c.sha256 != r.sha256 {
            out.problem(
                &c.path,
                format!("manifest.json sha256 {}, receipt {}", c.sha256, r.sha256),
            );
            out.error += r.size;
        }
    }
    for (path, r) in by_path.iter().filter(|(p, _)| !listed.contains(*p)) {
        out.problem(path, "receipt not listed in manifest.json".into());
        out.error += r.size;
    }
}

/// The manifest on disk against the last one the artifact log recorded
/// (a set-aside resets the log's claim).
fn check_manifest_log(out: &mut ArtifactPart, bytes: &[u8], log: &[ArtifactRow]) {
    // Every event of the log either claims a manifest or resets the claim.
    let last = log.last();
    if let Some(ArtifactRow {
        event,
        manifest_sha256: Some(recorded),
        ..
    }) = last
        && *event == ArtifactEvent::Manifest
    {
        let actual = sha256_hex(bytes);
        if &actual != recorded {
            out.problem(
                MANIFEST_FILE,
                format!("sha256 {actual}, the artifact log recorded {recorded}"),
            );
        }
    }
}
