//! Start-of-run reconciliation of disk against the database, before any
//! byte moves: adopt verified final files without receipts, revoke receipts
//! whose file vanished, and stop on any conflict *before* cleaning up.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

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

/// What the store says about the files before reconciliation.
struct Recorded {
    receipts: BTreeMap<String, Receipt>,
    /// Committed bytes per path, from the ledger.
    committed: HashMap<String, u64>,
    /// Paths whose earlier publication was superseded by a repin (see
    /// `Store::save_pin`): a final file there that does not match the new
    /// identity is our own old version, replaced by the publishing rename
    /// once the new bytes are verified; it is not a conflict.
    superseded: HashSet<String>,
}

impl Recorded {
    async fn load(store: &Store) -> Result<Recorded> {
        let receipts = store.receipts_by_path().await?;
        let committed = store
            .ledger()
            .await?
            .into_iter()
            .map(|l| (l.path, l.committed))
            .collect();
        let superseded = store
            .discards()
            .await?
            .into_iter()
            .filter(|d| d.reason == DiscardReason::SupersededByRepin)
            .map(|d| d.path)
            .collect();
        Ok(Recorded {
            receipts,
            committed,
            superseded,
        })
    }
}

/// What one selected file on disk calls for.
enum Finding {
    /// Disk and store agree (or the file is simply not there yet).
    Nothing,
    /// The store must follow the disk.
    Act(Action),
    /// The disk holds something that is not ours to touch.
    Conflict { path: PathBuf, problem: String },
}

/// Reconciles the selected files under `source_root` with the store.
pub async fn reconcile(
    store: &Store,
    run: RunId,
    source_root: &std::path::Path,
    files: &[FileRow],
    reporter: &dyn Reporter,
) -> Result<ReconcileReport> {
    let recorded = Recorded::load(store).await?;
    let mut actions = Vec::new();
    let mut conflicts = Vec::new();
    for f in files.iter().filter(|f| f.selected) {
        match inspect(source_root, f, &recorded)? {
            Finding::Nothing => {}
            Finding::Act(action) => actions.push(action),
            Finding::Conflict { path, problem } => conflicts.push((path, problem)),
        }
    }
    if let Some((path, problem)) = conflicts.into_iter().next() {
        return Err(FetchError::Conflict { path, problem });
    }
    let mut report = ReconcileReport::default();
    for action in actions {
        apply(store, run, action, reporter, &mut report).await?;
    }
    // Only now, with no conflict, remove our own stale temp files.
    remove_stale_temps(store, source_root, files, &mut report).await?;
    Ok(report)
}

/// Compares one selected file's `.part` and final file with what the store
/// records of it.
fn inspect(source_root: &Path, f: &FileRow, recorded: &Recorded) -> Result<Finding> {
    let final_path = safe_join(source_root, &f.path)?;
    let part = part_path(&final_path);
    if let Err(e) = ftpipe_fs::nofollow::check_absent_or_regular(&part) {
        return Ok(Finding::Conflict {
            path: part,
            problem: e.to_string(),
        });
    }
    let receipt = recorded.receipts.get(&f.path);
    let superseded = recorded.superseded.contains(&f.path);
    let conflict = |problem: String| {
        Ok(Finding::Conflict {
            path: final_path.clone(),
            problem,
        })
    };
    match std::fs::symlink_metadata(&final_path) {
        Ok(meta) if !meta.is_file() => conflict("not a regular file".to_owned()),
        Ok(meta) if meta.len() != f.size && receipt.is_none() && superseded => Ok(Finding::Nothing),
        Ok(meta) if meta.len() != f.size => {
            conflict(format!("size {} on disk, expected {}", meta.len(), f.size))
        }
        Ok(_) if receipt.is_some() => Ok(Finding::Nothing),
        Ok(_) => {
            let expected = expected_identity(f)?;
            let digest = block_in_place(|| hash_file(&final_path, &expected, f.size))
                .map_err(|e| FetchError::io("hash", &final_path, e))?;
            if digest == expected.hex() {
                Ok(Finding::Act(Action::Adopt {
                    path: f.path.clone(),
                    digest,
                    kind: expected.kind(),
                    size: f.size,
                    ours: recorded.committed.get(&f.path) == Some(&f.size),
                }))
            } else if superseded {
                Ok(Finding::Nothing)
            } else {
                conflict(format!(
                    "{} is {digest}, expected {}",
                    expected.kind(),
                    expected.hex()
                ))
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(match receipt {
            Some(_) => Finding::Act(Action::Revoke {
                path: f.path.clone(),
            }),
            None => Finding::Nothing,
        }),
        Err(e) => Err(FetchError::io("stat", &final_path, e)),
    }
}

/// Records one action in the store, says so, and adds it to `report`.
async fn apply(
    store: &Store,
    run: RunId,
    action: Action,
    reporter: &dyn Reporter,
    report: &mut ReconcileReport,
) -> Result<()> {
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
                message: format!("{path}: found on disk without a receipt; re-hashed and adopted"),
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
    Ok(())
}

/// Removes the cache blobs placed but never renamed, and the `.part` files
/// of files already published: both are ours, no receipt claims them.
async fn remove_stale_temps(
    store: &Store,
    source_root: &Path,
    files: &[FileRow],
    report: &mut ReconcileReport,
) -> Result<()> {
    let published = store.receipts_by_path().await?;
    // A cache blob placed but never renamed (a crash between the two) is
    // never claimed by the database: always ours to remove.
    for f in files {
        let temp = ftpipe_hub::paths::cache_temp_path(&safe_join(source_root, &f.path)?);
        if std::fs::symlink_metadata(&temp).is_ok() {
            remove_durably(&temp)?;
            report.removed_parts.push(temp);
        }
    }
    for f in files.iter().filter(|f| published.contains_key(&f.path)) {
        let part = part_path(&safe_join(source_root, &f.path)?);
        if part.is_file() {
            remove_durably(&part)?;
            report.removed_parts.push(part);
        }
    }
    Ok(())
}

/// Removes `path` and syncs its directory, so the removal survives a crash.
fn remove_durably(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(|e| FetchError::io("remove", path, e))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir).map_err(|e| FetchError::io("fsync", dir, e))?;
    }
    Ok(())
}
