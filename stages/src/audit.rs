//! Audit: reconcile the byte ledger, receipts and the files on disk.
//!
//! The ledger must add up on its own (`transferred = committed + discarded`
//! per file) and against the disk (a receipt's file exists with the expected
//! size, and with `deep` the expected digest). Any byte that cannot be
//! accounted for is counted in `reconciliation_error`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio::task::block_in_place;

use ftpipe_receipts::Store;

use crate::error::{Result, StageError};
use crate::fetch::expected_identity;
use crate::identity::hash_file;
use crate::paths::{PART_SUFFIX, safe_join};

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
    /// Bytes thrown away (sum of discards).
    pub discarded_bytes: u64,
    /// Bytes adopted from disk.
    pub adopted_bytes: u64,
    /// Receipt present, file present with the right size (and digest with deep).
    pub verified: bool,
    /// What is wrong, if anything.
    pub problem: Option<String>,
}

/// The whole audit.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// True when every selected file is verified and everything reconciles.
    pub ok: bool,
    /// Repository and commit audited.
    pub repo: String,
    /// Pinned commit.
    pub commit: String,
    /// Sum of expected bytes of selected files.
    pub expected_bytes: u64,
    /// Sum of committed bytes.
    pub committed_bytes: u64,
    /// Sum of transferred bytes.
    pub transferred_bytes: u64,
    /// Sum of adopted bytes.
    pub adopted_bytes: u64,
    /// Discarded bytes by reason.
    pub waste_by_reason: BTreeMap<String, u64>,
    /// Bytes the ledger cannot account for (0 when all reconciles).
    pub reconciliation_error: u64,
    /// Attempts that did not succeed (kept, never relabelled).
    pub failed_attempts: usize,
    /// Attempts left `in_flight` by a crash.
    pub interrupted_attempts: usize,
    /// Whether the re-hash was done.
    pub deep: bool,
    /// Per-file lines.
    pub files: Vec<FileAudit>,
    /// Files on disk under `source/` that nobody claims.
    pub orphans: Vec<String>,
    /// Stale temp files (`.part` of published files, or of unknown paths).
    pub stale_temp_files: Vec<String>,
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
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

/// Audits the fetch state under `out_dir`.
pub async fn audit(store: &Store, source_root: &Path, deep: bool) -> Result<AuditReport> {
    let pin = store.pin().await?.ok_or_else(|| StageError::NotPinned {
        dir: source_root
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    })?;
    store.integrity_check().await?;
    let files = store.files().await?;
    let ledger: HashMap<String, _> = store
        .ledger()
        .await?
        .into_iter()
        .map(|l| (l.path.clone(), l))
        .collect();
    let receipts: HashMap<String, _> = store
        .receipts()
        .await?
        .into_iter()
        .map(|r| (r.path.clone(), r))
        .collect();
    let mut waste_by_reason = BTreeMap::new();
    for d in store.discards().await? {
        *waste_by_reason.entry(d.reason).or_insert(0u64) += d.bytes;
    }
    let attempts = store.attempts().await?;
    let mut lines = Vec::new();
    let mut error = 0u64;
    for f in files.iter().filter(|f| f.selected) {
        let Some(l) = ledger.get(&f.path) else {
            lines.push(FileAudit {
                path: f.path.clone(),
                expected_bytes: f.size,
                committed_bytes: 0,
                transferred_bytes: 0,
                discarded_bytes: 0,
                adopted_bytes: 0,
                verified: false,
                problem: Some("no ledger row".into()),
            });
            error += f.size;
            continue;
        };
        error += l.transferred.abs_diff(l.committed + l.discarded);
        let mut problem = None;
        if l.expected != f.size {
            problem = Some(format!(
                "ledger expects {} bytes, listing says {}",
                l.expected, f.size
            ));
            error += l.expected.abs_diff(f.size);
        }
        let final_path: PathBuf = safe_join(source_root, &f.path)?;
        let verified = match receipts.get(&f.path) {
            None => {
                problem.get_or_insert_with(|| "not published".into());
                false
            }
            Some(r) => {
                error += f.size.abs_diff(l.committed + l.adopted);
                match std::fs::metadata(&final_path) {
                    Err(_) => {
                        problem = Some("receipt without its file".into());
                        error += f.size;
                        false
                    }
                    Ok(m) if m.len() != f.size || r.size != f.size => {
                        problem = Some(format!(
                            "size {} on disk, receipt {}, expected {}",
                            m.len(),
                            r.size,
                            f.size
                        ));
                        error += m.len().abs_diff(f.size);
                        false
                    }
                    Ok(_) if deep => {
                        let expected = expected_identity(f)?;
                        let digest = block_in_place(|| hash_file(&final_path, &expected, f.size))
                            .map_err(|e| StageError::io("hash", &final_path, e))?;
                        if digest != expected.hex() || digest != r.digest {
                            problem = Some(format!(
                                "{} on disk is {digest}, expected {}",
                                expected.kind(),
                                expected.hex()
                            ));
                            error += f.size;
                            false
                        } else {
                            true
                        }
                    }
                    Ok(_) => problem.is_none(),
                }
            }
        };
        lines.push(FileAudit {
            path: f.path.clone(),
            expected_bytes: f.size,
            committed_bytes: l.committed,
            transferred_bytes: l.transferred,
            discarded_bytes: l.discarded,
            adopted_bytes: l.adopted,
            verified,
            problem,
        });
    }
    let mut on_disk = Vec::new();
    walk(source_root, source_root, &mut on_disk)
        .map_err(|e| StageError::io("list", source_root, e))?;
    let known: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let mut orphans = Vec::new();
    let mut stale_temp_files = Vec::new();
    for rel in on_disk {
        if known.contains(rel.as_str()) {
            continue;
        }
        match rel.strip_suffix(PART_SUFFIX) {
            Some(base) if known.contains(base) && !receipts.contains_key(base) => {}
            Some(_) => stale_temp_files.push(rel),
            None => orphans.push(rel),
        }
    }
    let sum = |f: fn(&FileAudit) -> u64| lines.iter().map(f).sum::<u64>();
    let ok = error == 0
        && lines.iter().all(|l| l.verified)
        && orphans.is_empty()
        && stale_temp_files.is_empty();
    Ok(AuditReport {
        ok,
        repo: pin.repo,
        commit: pin.commit,
        expected_bytes: sum(|l| l.expected_bytes),
        committed_bytes: sum(|l| l.committed_bytes),
        transferred_bytes: sum(|l| l.transferred_bytes),
        adopted_bytes: sum(|l| l.adopted_bytes),
        waste_by_reason,
        reconciliation_error: error,
        failed_attempts: attempts
            .iter()
            .filter(|a| a.outcome != "ok" && a.outcome != "in_flight")
            .count(),
        interrupted_attempts: attempts.iter().filter(|a| a.outcome == "in_flight").count(),
        deep,
        files: lines,
        orphans,
        stale_temp_files,
    })
}
