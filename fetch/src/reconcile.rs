//! Start-of-run reconciliation of disk against the database, before any
//! byte moves: adopt verified final files without receipts, revoke receipts
//! whose file vanished, and stop on any conflict *before* cleaning up.

use std::collections::HashMap;
use std::path::PathBuf;

use tokio::task::block_in_place;

use ftpipe_receipts::{DiscardReason, FileRow, Receipt, RunId, Store};

use crate::error::{FetchError, Result};
use ftpipe_fs::durable::sync_dir;
use ftpipe_fs::paths::safe_join;
use ftpipe_hub::identity::expected_identity;
use ftpipe_hub::identity::hash_file;
use ftpipe_hub::paths::part_path;
use ftpipe_progress::{ProgressEvent, Reporter};

enum Action {
    Adopt {
        path: String,
        digest: String,
        kind: &'static str,
        size: u64,
        ours: bool,
    },
    Revoke {
        path: String,
    },
}

/// What reconciliation found and did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ReconcileReport {
    /// Final files without receipts that were re-hashed and adopted.
    pub adopted: Vec<String>,
    /// Receipts whose files were missing (the files will be refetched).
    pub revoked: Vec<String>,
    /// Stale `.part` files removed (their file was already published).
    pub removed_parts: Vec<PathBuf>,
}

/// Reconciles the selected files under `source_root` with the store.
pub async fn reconcile(
    store: &Store,
    run: RunId,
    source_root: &std::path::Path,
    files: &[FileRow],
    reporter: &dyn Reporter,
) -> Result<ReconcileReport> {
    let receipts = store.receipts_by_path().await?;
    let ledger: HashMap<String, u64> = store
        .ledger()
        .await?
        .into_iter()
        .map(|l| (l.path, l.committed))
        .collect();
    // Paths whose earlier publication was superseded by a repin (see
    // `Store::save_pin`): a final file there that does not match the new
    // identity is our own old version, replaced by the publishing rename
    // once the new bytes are verified; it is not a conflict.
    let superseded: std::collections::HashSet<String> = store
        .discards()
        .await?
        .into_iter()
        .filter(|d| d.reason == DiscardReason::SupersededByRepin)
        .map(|d| d.path)
        .collect();
    let mut actions = Vec::new();
    let mut conflicts = Vec::new();
    for f in files.iter().filter(|f| f.selected) {
        let final_path = safe_join(source_root, &f.path)?;
        let part = ftpipe_hub::paths::part_path(&final_path);
        if let Err(e) = ftpipe_fs::nofollow::check_absent_or_regular(&part) {
            conflicts.push((part, e.to_string()));
            continue;
        }
        let receipt = receipts.get(&f.path);
        match std::fs::symlink_metadata(&final_path) {
            Ok(meta) if !meta.is_file() => {
                conflicts.push((final_path, "not a regular file".to_owned()));
            }
            Ok(meta)
                if meta.len() != f.size && receipt.is_none() && superseded.contains(&f.path) => {}
            Ok(meta) if meta.len() != f.size => conflicts.push((
                final_path,
                format!("size {} on disk, expected {}", meta.len(), f.size),
            )),
            Ok(_) if receipt.is_some() => {}
            Ok(_) => {
                let expected = expected_identity(f)?;
                let digest = block_in_place(|| hash_file(&final_path, &expected, f.size))
                    .map_err(|e| FetchError::io("hash", &final_path, e))?;
                if digest == expected.hex() {
                    actions.push(Action::Adopt {
                        path: f.path.clone(),
                        digest,
                        kind: expected.kind(),
                        size: f.size,
                        ours: ledger.get(&f.path) == Some(&f.size),
                    });
                } else if !superseded.contains(&f.path) {
                    conflicts.push((
                        final_path,
                        format!(
                            "{} is {digest}, expected {}",
                            expected.kind(),
                            expected.hex()
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if receipt.is_some() {
                    actions.push(Action::Revoke {
                        path: f.path.clone(),
                    });
                }
            }
            Err(e) => return Err(FetchError::io("stat", &final_path, e)),
        }
    }
    if let Some((path, problem)) = conflicts.into_iter().next() {
        return Err(FetchError::Conflict { path, problem });
    }
    let mut report = ReconcileReport::default();
    for action in actions {
        match action {
            Action::Adopt {
                path,
                digest,
                kind,
                size,
                ours,
            } => {
                store
                    .put_receipt(
                        run,
                        &Receipt {
                            path: path.clone(),
                            size,
                            digest_kind: kind.to_owned(),
                            digest,
                            completed_at: String::new(),
                            adopted: !ours,
                        },
                    )
                    .await?;
                reporter.report(ProgressEvent::Note {
                    message: format!(
                        "{path}: found on disk without a receipt; re-hashed and adopted"
                    ),
                });
                report.adopted.push(path);
            }
            Action::Revoke { path } => {
                store
                    .revoke_receipt(run, &path, DiscardReason::PublishedFileMissing)
                    .await?;
                reporter.report(ProgressEvent::Note {
                    message: format!("{path}: receipt without its file; it will be fetched again"),
                });
                report.revoked.push(path);
            }
        }
    }
    // Only now, with no conflict, remove our own stale temp files.
    let published = store.receipts_by_path().await?;
    // A cache blob placed but never renamed (a crash between the two) is
    // never claimed by the database: always ours to remove.
    for f in files {
        let temp = ftpipe_hub::paths::cache_temp_path(&safe_join(source_root, &f.path)?);
        if std::fs::symlink_metadata(&temp).is_ok() {
            std::fs::remove_file(&temp).map_err(|e| FetchError::io("remove", &temp, e))?;
            if let Some(dir) = temp.parent() {
                sync_dir(dir).map_err(|e| FetchError::io("fsync", dir, e))?;
            }
            report.removed_parts.push(temp);
        }
    }
    for f in files.iter().filter(|f| published.contains_key(&f.path)) {
        let part = part_path(&safe_join(source_root, &f.path)?);
        if part.is_file() {
            std::fs::remove_file(&part).map_err(|e| FetchError::io("remove", &part, e))?;
            if let Some(dir) = part.parent() {
                sync_dir(dir).map_err(|e| FetchError::io("fsync", dir, e))?;
            }
            report.removed_parts.push(part);
        }
    }
    Ok(report)
}
