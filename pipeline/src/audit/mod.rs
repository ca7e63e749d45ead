//! Audit: reconcile everything the state database claims against the disk.
//!
//! A run leaves claims in three places: the byte ledger and download
//! receipts (sources), the component receipts and `manifest.json` (the
//! artifact), and the plan (`DIR/.ftpipe/plan.json`, what the artifact is
//! supposed to become). The audit re-derives every total from those claims
//! and checks each against the files actually present, because a claim
//! nobody re-checks is only a hope: a receipt whose file vanished, a ledger
//! row edited by hand or a component whose size drifted from its prediction
//! must all surface as a non-zero `reconciliation_error` or a named problem.
//!
//! - Sources ([`sources`]): per file, `transferred = committed + discarded`
//!   and `transferred = Σ attempt bytes`,
//!   and with a receipt `expected = committed + adopted`, the file on disk
//!   with the expected size (and digest with `deep`). A source deliberately
//!   deleted by `convert --retire-sources` is counted as retired, not missing.
//! - Artifact ([`artifact`]): each component receipt's file exists with the
//!   receipt's size (= its prediction, = the plan's; SHA-256 with `deep`), the
//!   manifest agrees with the receipts, nothing unclaimed or half-written
//!   lies in `DIR/artifact/`, and planned components without a receipt are
//!   listed as pending.
//!
//! Every byte that cannot be accounted for is added to `reconciliation_error`;
//! `ok` holds only when it is 0 and nothing is missing or inconsistent.
//! Failed attempts are kept and shown as failed, never relabelled.

mod artifact;
mod sources;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use ftpipe_receipts::Store;
/// The recorded values the report holds, typed as the store keeps them.
pub use ftpipe_receipts::{AttemptOutcome, CacheOutcome, DiscardReason};

use crate::error::{PipelineError, Result};
use ftpipe_convert::engine::PLAN_FILE;

/// One file's line in the audit.
#[derive(Debug, Clone, Serialize)]
pub struct FileAudit {
    /// Repository path.
    pub path: String,
    /// Size from the pinned listing.
    pub expected_bytes: u64,
    /// Durable watermark.
    pub committed_bytes: u64,
    /// Every body byte received.
    pub transferred_bytes: u64,
    /// Σ body bytes of the file's attempts (must equal `transferred_bytes`).
    pub attempt_bytes: u64,
    /// Bytes thrown away (sum of discards).
    pub discarded_bytes: u64,
    /// Bytes adopted from disk.
    pub adopted_bytes: u64,
    /// Bytes taken from a Hugging Face cache (part of `committed_bytes`,
    /// not of `transferred_bytes`).
    pub cache_bytes: u64,
    /// Receipt present, ledger consistent, and the file present with the
    /// right size (and digest with deep) — or, for a retired source,
    /// deliberately gone (see `retired`).
    pub verified: bool,
    /// The file was retired by `convert --retire-sources` and is absent.
    pub retired: bool,
    /// Bytes a budgeted run (or one with `--retire-sources`) released from
    /// the file once its spans other than the PLE table's were converted:
    /// punched out, or, its PLE spans copied aside, the file released
    /// (0 when neither).
    pub punched_bytes: u64,
    /// Why the file holds fewer bytes than its size (punched, or released
    /// after a copy aside).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub punched: Option<String>,
    /// What is wrong, if anything.
    pub problem: Option<String>,
}

/// Count and bytes of a group of source files (sizes from the listing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SourceTotals {
    /// Selected files in the group.
    pub files: usize,
    /// Their expected bytes.
    pub bytes: u64,
}

/// Published sources still on disk versus deliberately retired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Retirement {
    /// Published sources present in `DIR/source/` (or held as a copy
    /// aside of their PLE spans in `DIR/.ftpipe/kept/`).
    pub retained_files: usize,
    /// Their bytes on disk.
    pub retained_bytes: u64,
    /// Sources retired after conversion and absent from `DIR/source/`.
    pub retired_files: usize,
    /// Their bytes (from the listing).
    pub retired_bytes: u64,
    /// Retained sources held down to their PLE spans, punched or copied
    /// aside (their kept bytes, or the copy's, count in `retained_bytes`).
    pub punched_files: usize,
    /// The bytes punched out of them.
    pub punched_bytes: u64,
}

/// Totals of one component kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KindAudit {
    /// Component receipts of this kind.
    pub count: usize,
    /// Σ predicted bytes of those receipts.
    pub predicted_bytes: u64,
    /// Σ sizes on disk of their files (a missing file counts 0).
    pub actual_bytes: u64,
    /// Planned components of this kind without a receipt.
    pub pending: usize,
    /// Their predicted bytes.
    pub pending_bytes: u64,
}

/// A planned component without a receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingComponent {
    /// Path relative to `DIR/artifact/`.
    pub path: String,
    /// Component kind.
    pub kind: String,
    /// Size the plan predicts.
    pub predicted_bytes: u64,
}

/// Something wrong with a component, the manifest, the placement or the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentProblem {
    /// Path relative to `DIR/artifact/` (or `manifest.json`, `placement.json`,
    /// `plan.json`).
    pub path: String,
    /// What is wrong.
    pub problem: String,
}

/// An attempt that did not end `ok`, shown with its outcome as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptLine {
    /// Repository path.
    pub path: String,
    /// Recorded outcome (`failed`, `retry`, `cancelled`, `in_flight`),
    /// never relabelled.
    pub outcome: AttemptOutcome,
    /// HTTP status, if any.
    pub status: Option<u16>,
    /// First byte requested.
    pub range_start: Option<u64>,
    /// Body bytes received.
    pub body_bytes: u64,
    /// Error text.
    pub error: Option<String>,
    /// When it started.
    pub started_at: String,
}

/// The whole audit.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// True when the reconciliation error is 0 and nothing is missing or
    /// inconsistent (`sources_ok && artifact_ok`).
    pub ok: bool,
    /// Set when another process held DIR's lock as the audit began: a run
    /// in progress, so the report is a snapshot of unfinished work, not a
    /// verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_run: Option<crate::lock::LiveRun>,
    /// Every selected source verified (or retired), no orphans or stale
    /// `.part` files, source ledger reconciles.
    pub sources_ok: bool,
    /// Every component receipt matches its file, the manifest and the plan;
    /// nothing pending, unclaimed or half-written in `DIR/artifact/`.
    pub artifact_ok: bool,
    /// Repository and commit audited.
    pub repo: String,
    /// Pinned commit.
    pub commit: String,
    /// Sum of expected bytes of selected files (the body ledger's "expected").
    pub expected_bytes: u64,
    /// Sum of committed bytes (the body ledger's "committed").
    pub committed_bytes: u64,
    /// Sum of transferred bytes.
    pub transferred_bytes: u64,
    /// Sum of adopted bytes.
    pub adopted_bytes: u64,
    /// Sum of bytes taken from a Hugging Face cache (whole blobs and
    /// resume prefixes), counted as committed, not transferred.
    pub cache_bytes: u64,
    /// What Xet storage brought: compressed xorb bytes fetched, the bytes
    /// they decoded to, and those outside the spans asked (decoded, never
    /// handed to the transfer; the ledger counts the rest as transferred).
    pub xet: ftpipe_receipts::XetTotals,
    /// Discarded bytes by reason (listed in the order of the reasons'
    /// names).
    pub waste_by_reason: BTreeMap<DiscardReason, u64>,
    /// Selected sources that are not `*.safetensors`.
    pub metadata_sources: SourceTotals,
    /// Selected `*.safetensors` sources.
    pub weight_sources: SourceTotals,
    /// Retained versus retired sources.
    pub retirement: Retirement,
    /// The last `run --disk-budget`: its budget and the peak of source
    /// bytes held under that budget by it and the runs before it that it
    /// resumed with the same budget (none when no run had a budget).
    pub disk_budget: Option<ftpipe_receipts::DiskBudgetRecord>,
    /// Component totals by kind (`ftw`, `ftexpert`, `q3_segment`,
    /// `q3_global_scale`).
    pub components: BTreeMap<String, KindAudit>,
    /// Σ predicted bytes of the plan when `plan.json` exists, else of the
    /// component receipts.
    pub known_target_total: u64,
    /// `plan` or `receipts`: where `known_target_total` comes from.
    pub known_target_from: String,
    /// Whether `DIR/.ftpipe/plan.json` was found.
    pub plan_present: bool,
    /// Whether `DIR/artifact/manifest.json` was found.
    pub manifest_present: bool,
    /// Source tensors of other partitions (vision, MTP) the plan leaves out
    /// of the artifact.
    pub omitted_tensors: usize,
    /// Their source bytes.
    pub omitted_bytes: u64,
    /// Omitted tensors whose files the fetch selection left out.
    pub not_fetched_tensors: usize,
    /// The listed bytes of those files (never downloaded).
    pub not_fetched_bytes: u64,
    /// Planned components without a receipt.
    pub pending_components: Vec<PendingComponent>,
    /// Problems with components, the manifest, the placement or the plan.
    pub component_problems: Vec<ComponentProblem>,
    /// Bytes the ledger and receipts cannot account for (0 when all
    /// reconciles), sources and components together.
    pub reconciliation_error: u64,
    /// Attempts that did not succeed (kept, never relabelled).
    pub failed_attempts: usize,
    /// Attempts left `in_flight` by a crash.
    pub interrupted_attempts: usize,
    /// Every attempt whose outcome is not `ok`, as recorded.
    pub unsuccessful_attempts: Vec<AttemptLine>,
    /// Every Hugging Face cache file looked at: adopted, resumed from, or
    /// rejected (with why).
    pub cache_candidates: Vec<ftpipe_receipts::CacheCandidate>,
    /// What `publish` sent from this directory (empty when it never ran).
    pub uploads: UploadSummary,
    /// Every publication of this directory's artifact.
    pub publications: Vec<ftpipe_receipts::Publication>,
    /// Whether the re-hash was done.
    pub deep: bool,
    /// Per-file lines.
    pub files: Vec<FileAudit>,
    /// Files on disk under `source/` that nobody claims.
    pub orphans: Vec<String>,
    /// Stale temp files: `.part` of published files or of unknown paths
    /// (relative to `source/`), and component temp files (as
    /// `artifact/<path>`).
    pub stale_temp_files: Vec<String>,
    /// Receipts whose file is missing, as `source/<path>` or
    /// `artifact/<path>` (retired sources are not listed).
    pub receipts_without_files: Vec<String>,
    /// Files without a receipt: selected sources present but unpublished
    /// (`source/<path>`) and unclaimed files in the artifact
    /// (`artifact/<path>`, except `manifest.json` and `placement.json`).
    pub files_without_receipts: Vec<String>,
}

impl AuditReport {
    /// Whether the audited DIR was pulled (its files are the artifact's
    /// components, and it has no sources, plan or conversion).
    pub fn pulled(&self) -> bool {
        crate::pull::is_pull_repo(&self.repo)
    }
}

/// Lists every non-directory entry under `dir`, relative to `root`, with
/// `/` separators; a missing `dir` is empty.
pub(crate) fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let ty = entry.file_type()?;
        let path = entry.path();
        if ty.is_dir() {
            walk(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// The upload records of `publish`, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UploadSummary {
    /// Objects uploaded and checked (upload receipts).
    pub verified: usize,
    /// Multipart uploads in progress (a killed publish resumes them).
    pub in_progress: usize,
    /// Uploads given up.
    pub abandoned: usize,
    /// Objects found at their key and reused: the store's checksum proved
    /// their bytes (receipts, nothing sent).
    pub reused_proven: usize,
    /// Objects found at their key and uploaded again over: their store
    /// checksum did not prove their bytes, or they had none.
    pub replaced_unproven: usize,
    /// Parts the server acknowledged.
    pub parts: usize,
    /// Bytes of the acknowledged parts.
    pub part_bytes: u64,
    /// Requests made.
    pub requests: usize,
    /// Requests that failed.
    pub failed_requests: usize,
    /// Requests left `in_flight` by a kill.
    pub interrupted_requests: usize,
    /// Body bytes sent by every request (re-sent parts included).
    pub sent_bytes: u64,
}

/// The last budgeted run's record, its peak the highest of the latest
/// consecutive runs under the same budget (a resumed chain).
fn last_budget(
    mut rows: Vec<ftpipe_receipts::DiskBudgetRecord>,
) -> Option<ftpipe_receipts::DiskBudgetRecord> {
    let mut last = rows.pop()?;
    while let Some(r) = rows.pop().filter(|r| r.budget == last.budget) {
        last.peak_held = last.peak_held.max(r.peak_held);
    }
    Some(last)
}

async fn upload_summary(store: &Store) -> Result<UploadSummary> {
    use ftpipe_receipts::{FoundObject, UploadOutcome, UploadState};
    let uploads = store.uploads().await?;
    let attempts = store.upload_attempts().await?;
    let uploads_in = |state| uploads.iter().filter(|u| u.state == state).count();
    let attempts_ended = |outcome| attempts.iter().filter(|a| a.outcome == outcome).count();
    let found = |f: &[FoundObject]| {
        uploads
            .iter()
            .filter(|u| u.found.is_some_and(|x| f.contains(&x)))
            .count()
    };
    let mut s = UploadSummary {
        verified: uploads_in(UploadState::Verified),
        in_progress: uploads_in(UploadState::Uploading),
        abandoned: uploads_in(UploadState::Abandoned),
        reused_proven: found(&[FoundObject::Proven]),
        replaced_unproven: found(&[FoundObject::NotProven, FoundObject::NoChecksum]),
        requests: attempts.len(),
        failed_requests: attempts_ended(UploadOutcome::Failed),
        interrupted_requests: attempts_ended(UploadOutcome::InFlight),
        sent_bytes: attempts.iter().map(|a| a.bytes).sum(),
        ..UploadSummary::default()
    };
    for u in &uploads {
        for p in store.upload_parts(u.id).await? {
            s.parts += 1;
            s.part_bytes += p.size;
        }
    }
    Ok(s)
}

/// The two halves of the audit for `pin`: a pulled artifact's components
/// are its listing, fetched into `artifact/` (its manifest the publisher's,
/// checked by verify); otherwise the sources under `source_root` and the
/// artifact built from them.
async fn audit_halves(
    store: &Store,
    pin: &ftpipe_receipts::Pin,
    source_root: &Path,
    artifact_root: &Path,
    deep: bool,
) -> Result<(sources::SourcePart, artifact::ArtifactPart)> {
    if crate::pull::is_pull_pin(pin) {
        let mut src = sources::audit_sources(store, artifact_root, deep).await?;
        src.orphans.retain(|o| {
            o != ftpipe_artifact::manifest::MANIFEST_FILE
                && o != ftpipe_artifact::manifest::PLACEMENT_FILE
        });
        return Ok((src, artifact::audit_pulled(artifact_root, deep)?));
    }
    let src = sources::audit_sources(store, source_root, deep).await?;
    let plan_path = store.path().parent().map(|d| d.join(PLAN_FILE));
    let art = artifact::audit_artifact(
        &store.components().await?,
        &store.artifact_log().await?,
        artifact_root,
        plan_path.as_deref(),
        deep,
    )?;
    Ok((src, art))
}

/// What the attempts of every fetch recorded: the ones that did not end
/// `ok`, as recorded, and how many failed and how many a kill left
/// `in_flight`.
struct AttemptsSeen {
    unsuccessful: Vec<AttemptLine>,
    failed: usize,
    interrupted: usize,
}

async fn attempts_seen(store: &Store) -> Result<AttemptsSeen> {
    let attempts = store.attempts().await?;
    let unsuccessful = attempts
        .iter()
        .filter(|a| a.outcome != AttemptOutcome::Ok)
        .map(|a| AttemptLine {
            path: a.path.clone(),
            outcome: a.outcome,
            status: a.status,
            range_start: a.range_start,
            body_bytes: a.body_bytes,
            error: a.error.clone(),
            started_at: a.started_at.clone(),
        })
        .collect();
    Ok(AttemptsSeen {
        unsuccessful,
        failed: attempts
            .iter()
            .filter(|a| !matches!(a.outcome, AttemptOutcome::Ok | AttemptOutcome::InFlight))
            .count(),
        interrupted: attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::InFlight)
            .count(),
    })
}

async fn waste_by_reason(store: &Store) -> Result<BTreeMap<DiscardReason, u64>> {
    let mut waste = BTreeMap::new();
    for d in store.discards().await? {
        let total = waste.entry(d.reason).or_insert(0u64);
        *total = total.saturating_add(d.bytes);
    }
    Ok(waste)
}

/// Audits the state of one output directory: sources under `source_root`
/// (`DIR/source`), components under `artifact_root` (`DIR/artifact`), and
/// the plan beside the database (`DIR/.ftpipe/plan.json`). `deep` re-hashes
/// every source and component. Read-only.
pub async fn audit(
    store: &Store,
    source_root: &Path,
    artifact_root: &Path,
    deep: bool,
) -> Result<AuditReport> {
    // `dir` only names the directory in the message.
    let pin = store.pin().await?.ok_or_else(|| PipelineError::NotPinned {
        dir: source_root
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    })?;
    store.integrity_check().await?;
    let (src, art) = audit_halves(store, &pin, source_root, artifact_root, deep).await?;
    let attempts = attempts_seen(store).await?;
    let lines = src.lines;
    let sources_ok = src.error == 0
        && lines.iter().all(|l| l.verified)
        && src.orphans.is_empty()
        && src.stale_temp_files.is_empty();
    let artifact_ok = art.is_ok();
    let sum = |f: fn(&FileAudit) -> u64| lines.iter().map(f).sum::<u64>();
    let mut stale_temp_files = src.stale_temp_files;
    stale_temp_files.extend(art.stale_temp_files);
    let mut receipts_without_files = src.receipts_without_files;
    receipts_without_files.extend(art.receipts_without_files);
    let mut files_without_receipts = src.files_without_receipts;
    files_without_receipts.extend(art.files_without_receipts);
    Ok(AuditReport {
        ok: sources_ok && artifact_ok,
        live_run: None,
        sources_ok,
        artifact_ok,
        repo: pin.repo,
        commit: pin.commit,
        expected_bytes: sum(|l| l.expected_bytes),
        committed_bytes: sum(|l| l.committed_bytes),
        transferred_bytes: sum(|l| l.transferred_bytes),
        adopted_bytes: sum(|l| l.adopted_bytes),
        cache_bytes: sum(|l| l.cache_bytes),
        xet: store.xet_totals().await?,
        waste_by_reason: waste_by_reason(store).await?,
        metadata_sources: src.metadata,
        weight_sources: src.weight,
        retirement: src.retirement,
        disk_budget: last_budget(store.disk_budgets().await?),
        components: art.kinds,
        known_target_total: art.known_target_total,
        known_target_from: art.known_target_from.to_owned(),
        plan_present: art.plan_present,
        manifest_present: art.manifest_present,
        omitted_tensors: art.omitted.0,
        omitted_bytes: art.omitted.1,
        not_fetched_tensors: art.not_fetched.0,
        not_fetched_bytes: art.not_fetched.1,
        pending_components: art.pending,
        component_problems: art.problems,
        reconciliation_error: src.error.saturating_add(art.error),
        failed_attempts: attempts.failed,
        interrupted_attempts: attempts.interrupted,
        unsuccessful_attempts: attempts.unsuccessful,
        cache_candidates: store.cache_candidates().await?,
        uploads: upload_summary(store).await?,
        publications: store.publications().await?,
        deep,
        files: lines,
        orphans: src.orphans,
        stale_temp_files,
        receipts_without_files,
        files_without_receipts,
    })
}
