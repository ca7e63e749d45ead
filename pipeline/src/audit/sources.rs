//! The source half of the audit: the byte ledger and download receipts of
//! every selected file against `DIR/source/`.
//!
//! Kept apart from the artifact half because its rules are the fetch's
//! (ledger invariants, git-sha1 versus sha256 identities, `.part` files of
//! in-progress downloads), and a retired source — deleted on purpose after
//! conversion, its receipt kept as history — is the one case where a
//! receipt without its file is correct.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

use tokio::task::block_in_place;

use ftpipe_receipts::Store;

use super::{FileAudit, Retirement, SourceTotals, walk};
use crate::error::{PipelineError, Result};
use ftpipe_fs::paths::{CACHE_TEMP_SUFFIX, PART_SUFFIX, safe_join};
use ftpipe_hub::identity::expected_identity;
use ftpipe_hub::identity::hash_file;

/// What the source half found.
pub(super) struct SourcePart {
    pub lines: Vec<FileAudit>,
    pub error: u64,
    pub metadata: SourceTotals,
    pub weight: SourceTotals,
    pub retirement: Retirement,
    pub orphans: Vec<String>,
    pub stale_temp_files: Vec<String>,
    pub receipts_without_files: Vec<String>,
    pub files_without_receipts: Vec<String>,
}

/// Whether a source path holds weights (everything else is metadata).
pub(crate) fn is_weight(path: &str) -> bool {
    path.ends_with(".safetensors")
}

/// Audits every selected source file against its ledger row, its receipt
/// and the disk.
pub(super) async fn audit_sources(
    store: &Store,
    source_root: &Path,
    deep: bool,
) -> Result<SourcePart> {
    let files = store.files().await?;
    let ledger: HashMap<String, _> = store
        .ledger()
        .await?
        .into_iter()
        .map(|l| (l.path.clone(), l))
        .collect();
    let receipts = store.receipts_by_path().await?;
    let retired: BTreeSet<String> = store.retired().await?;
    let attempt_bytes = store.attempt_bytes().await?;
    let mut out = SourcePart {
        lines: Vec::new(),
        error: 0,
        metadata: SourceTotals::default(),
        weight: SourceTotals::default(),
        retirement: Retirement::default(),
        orphans: Vec::new(),
        stale_temp_files: Vec::new(),
        receipts_without_files: Vec::new(),
        files_without_receipts: Vec::new(),
    };
    for f in files.iter().filter(|f| f.selected) {
        let totals = if is_weight(&f.path) {
            &mut out.weight
        } else {
            &mut out.metadata
        };
        totals.files += 1;
        totals.bytes += f.size;
        let mut line = FileAudit {
            path: f.path.clone(),
            expected_bytes: f.size,
            committed_bytes: 0,
            transferred_bytes: 0,
            attempt_bytes: attempt_bytes.get(&f.path).copied().unwrap_or(0),
            discarded_bytes: 0,
            adopted_bytes: 0,
            cache_bytes: 0,
            verified: false,
            retired: false,
            problem: None,
        };
        let Some(l) = ledger.get(&f.path) else {
            line.problem = Some("no ledger row".into());
            out.error += f.size;
            out.lines.push(line);
            continue;
        };
        line.committed_bytes = l.committed;
        line.transferred_bytes = l.transferred;
        line.discarded_bytes = l.discarded;
        line.adopted_bytes = l.adopted;
        line.cache_bytes = l.cache;
        // Bytes in come from the network or the cache; each is committed
        // or discarded.
        out.error += (l.transferred + l.cache).abs_diff(l.committed + l.discarded);
        if line.attempt_bytes != l.transferred {
            line.problem = Some(format!(
                "attempts received {} bytes, the ledger says {} transferred",
                line.attempt_bytes, l.transferred
            ));
            out.error += line.attempt_bytes.abs_diff(l.transferred);
        }
        if l.expected != f.size {
            line.problem = Some(format!(
                "ledger expects {} bytes, listing says {}",
                l.expected, f.size
            ));
            out.error += l.expected.abs_diff(f.size);
        }
        let final_path = safe_join(source_root, &f.path)?;
        let on_disk = std::fs::metadata(&final_path);
        let Some(r) = receipts.get(&f.path) else {
            line.problem.get_or_insert_with(|| "not published".into());
            if on_disk.is_ok() {
                out.files_without_receipts
                    .push(format!("source/{}", f.path));
            }
            out.lines.push(line);
            continue;
        };
        out.error += f.size.abs_diff(l.committed + l.adopted);
        if l.committed + l.adopted != f.size {
            line.problem.get_or_insert_with(|| {
                format!(
                    "published, but the ledger holds {} committed + {} adopted of {} bytes",
                    l.committed, l.adopted, f.size
                )
            });
        }
        line.verified = match on_disk {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && retired.contains(&f.path) => {
                line.retired = true;
                out.retirement.retired_files += 1;
                out.retirement.retired_bytes += f.size;
                if r.size != f.size {
                    line.problem = Some(format!(
                        "retired; receipt says {} bytes, expected {}",
                        r.size, f.size
                    ));
                    out.error += r.size.abs_diff(f.size);
                }
                line.problem.is_none()
            }
            Err(_) => {
                line.problem = Some("receipt without its file".into());
                out.receipts_without_files
                    .push(format!("source/{}", f.path));
                out.error += f.size;
                false
            }
            Ok(m) => {
                out.retirement.retained_files += 1;
                out.retirement.retained_bytes += m.len();
                if m.len() != f.size || r.size != f.size {
                    line.problem = Some(format!(
                        "size {} on disk, receipt {}, expected {}",
                        m.len(),
                        r.size,
                        f.size
                    ));
                    out.error += m.len().abs_diff(f.size).max(r.size.abs_diff(f.size));
                    false
                } else if deep {
                    let expected = expected_identity(f)?;
                    let digest = block_in_place(|| hash_file(&final_path, &expected, f.size))
                        .map_err(|e| PipelineError::io("hash", &final_path, e))?;
                    if digest != expected.hex() || digest != r.digest {
                        line.problem = Some(format!(
                            "{} on disk is {digest}, expected {}",
                            expected.kind(),
                            expected.hex()
                        ));
                        out.error += f.size;
                        false
                    } else {
                        line.problem.is_none()
                    }
                } else {
                    line.problem.is_none()
                }
            }
        };
        out.lines.push(line);
    }
    let mut on_disk = Vec::new();
    walk(source_root, source_root, &mut on_disk)
        .map_err(|e| PipelineError::io("list", source_root, e))?;
    let known: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    for rel in on_disk {
        if known.contains(rel.as_str()) {
            continue;
        }
        match rel.strip_suffix(PART_SUFFIX) {
            Some(base) if known.contains(base) && !receipts.contains_key(base) => {}
            Some(_) => out.stale_temp_files.push(rel),
            None if rel.ends_with(CACHE_TEMP_SUFFIX) => out.stale_temp_files.push(rel),
            None => out.orphans.push(rel),
        }
    }
    Ok(out)
}
