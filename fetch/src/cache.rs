//! Taking a pinned file from a Hugging Face cache instead of the hub.
//!
//! Whole blob: place it (reflink or copy, never a hard link) at `<final>.hfcache`,
//! fsync, hash that file in full against the pinned identity, rename to the
//! final name, fsync the directory, and only then the receipt (one
//! transaction with the ledger and the candidate log). What is hashed is
//! what is published, so a cache file changed after the check cannot slip
//! in. Interrupted download: its prefix is copied (never moved) into an
//! empty `.part`, fsynced, and only then becomes the watermark; the usual
//! prefix re-hash, strict Range rules and final digest follow.

use std::io::Read;
use std::path::Path;

use tokio::task::block_in_place;

use ftpipe_receipts::{CacheCandidate, CacheKind, CacheOutcome, FileRow, Placement, Receipt};

use crate::ctx::FetchCtx;
use crate::error::{FetchError, Result};
use crate::part::{AppendError, PartFile};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::{create_dirs_durably, rename_durably, sync_dir};
use ftpipe_hub::hfcache::{Candidate, Lookup, LookupKind, place};
use ftpipe_hub::identity::{Expected, hash_file};
use ftpipe_hub::paths::{cache_temp_path, part_path};
use ftpipe_progress::ProgressEvent;

/// Copy buffer of a resume prefix.
const PREFIX_COPY_BUF: usize = 1 << 20;

fn kind_str(kind: LookupKind) -> CacheKind {
    match kind {
        LookupKind::Blob => CacheKind::Blob,
        LookupKind::Snapshot => CacheKind::Snapshot,
    }
}

fn lookup_kind(file: &FileRow) -> LookupKind {
    if file.lfs_sha256.is_some() {
        LookupKind::Blob
    } else {
        LookupKind::Snapshot
    }
}

/// Removes `path` if something is there (never following a link), then
/// fsyncs its directory.
fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => {
            std::fs::remove_file(path)?;
            sync_dir(path.parent().unwrap_or(Path::new(".")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

async fn reject(ctx: &FetchCtx, c: CacheCandidate) -> Result<()> {
    tracing::info!(path = %c.path, cache = %c.cache_path, detail = %c.detail, "cache candidate rejected");
    ctx.reporter.report(ProgressEvent::CacheRejected {
        path: c.path.clone(),
        cache_path: c.cache_path.clone(),
        reason: c.detail.clone(),
    });
    ctx.store.reject_cache_candidate(ctx.run, &c).await?;
    Ok(())
}

/// Publishes `file` from the cache when a candidate there verifies.
/// Returns whether it did; a missing, refused or mismatching candidate
/// leaves the file to the network (the latter two logged as rejected).
pub(crate) async fn adopt_whole(
    ctx: &FetchCtx,
    file: &FileRow,
    expected: &Expected,
    final_path: &Path,
) -> Result<bool> {
    let Some(candidate) = find_candidate(ctx, file).await? else {
        return Ok(false);
    };
    let record =
        |outcome: CacheOutcome, placement: Option<Placement>, detail: String| CacheCandidate {
            path: file.path.clone(),
            cache_path: candidate.blob.display().to_string(),
            kind: kind_str(candidate.kind),
            outcome,
            placement,
            bytes: file.size,
            detail,
        };
    let temp = cache_temp_path(final_path);
    let placed = block_in_place(|| place_and_hash(ctx, &candidate, file, expected, final_path));
    let (how, digest) = match placed {
        Ok(v) => v,
        Err(e) => {
            let _ = block_in_place(|| remove_if_present(&temp));
            let detail = format!("cannot place it: {e}");
            reject(ctx, record(CacheOutcome::Rejected, None, detail)).await?;
            return Ok(false);
        }
    };
    if digest != expected.hex() {
        block_in_place(|| remove_if_present(&temp))
            .map_err(|e| FetchError::io("remove", &temp, e))?;
        let detail = format!(
            "{} is {digest}, expected {}",
            expected.kind(),
            expected.hex()
        );
        reject(ctx, record(CacheOutcome::Rejected, Some(how), detail)).await?;
        return Ok(false);
    }
    // Verified and durable under the temp name; not published.
    crashpoint::hit(CrashPoint::CacheVerified);
    // Its bytes and its directory entry were synced above: the rename and
    // the directory's fsync are what is left.
    block_in_place(|| rename_durably(&temp, final_path))?;
    // Published under its final name, no receipt yet.
    crashpoint::hit(CrashPoint::CacheRenamed);
    let receipt = Receipt {
        path: file.path.clone(),
        size: file.size,
        digest_kind: expected.kind().to_owned(),
        digest,
        completed_at: String::new(),
        adopted: false,
    };
    let adopted = record(CacheOutcome::Adopted, Some(how), String::new());
    ctx.store
        .adopt_from_cache(ctx.run, &receipt, &adopted)
        .await?;
    // The receipt is durable: a partial `.part` of this file is stale.
    let part = part_path(final_path);
    block_in_place(|| remove_if_present(&part)).map_err(|e| FetchError::io("remove", &part, e))?;
    ctx.reporter.report(ProgressEvent::FileAdopted {
        path: file.path.clone(),
        size: file.size,
        placement: how.as_str().to_owned(),
    });
    Ok(true)
}

/// The cache's candidate for `file`, when there is a cache, the `.part` is
/// not already complete (it is verified where it is) and the cache holds
/// something under the pinned identity; a refused one is logged as
/// rejected and gives `None`.
async fn find_candidate(ctx: &FetchCtx, file: &FileRow) -> Result<Option<Candidate>> {
    let Some(cache) = &ctx.hf_cache else {
        return Ok(None);
    };
    let ledger = ctx.store.ledger_row(&file.path).await?;
    if ledger.committed >= file.size {
        return Ok(None);
    }
    match block_in_place(|| cache.lookup(&ctx.pin.repo, &ctx.pin.commit, file)) {
        Lookup::Absent => Ok(None),
        Lookup::Refused {
            path,
            reason,
            bytes,
        } => {
            let refused = CacheCandidate {
                path: file.path.clone(),
                cache_path: path.display().to_string(),
                kind: kind_str(lookup_kind(file)),
                outcome: CacheOutcome::Rejected,
                placement: None,
                bytes,
                detail: reason,
            };
            reject(ctx, refused).await?;
            Ok(None)
        }
        Lookup::Found(c) => Ok(Some(c)),
    }
}

/// Places the candidate's blob at `final_path`'s cache temp name, checks
/// its length, fsyncs it and its directory, and hashes what was placed:
/// the placement and the digest of the bytes that would be published.
fn place_and_hash(
    ctx: &FetchCtx,
    candidate: &Candidate,
    file: &FileRow,
    expected: &Expected,
    final_path: &Path,
) -> std::io::Result<(Placement, String)> {
    let temp = cache_temp_path(final_path);
    let dir = final_path.parent().unwrap_or(ctx.dest());
    create_dirs_durably(ctx.dest(), dir)?;
    remove_if_present(&temp)?;
    let how = place(&candidate.blob, &temp, file.size)?;
    let placed = ftpipe_fs::nofollow::open_read(&temp)?;
    let len = placed.metadata()?.len();
    if len != file.size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the blob holds {len} bytes, the listing {}", file.size),
        ));
    }
    placed.sync_all()?;
    sync_dir(dir)?;
    let digest = hash_file(&temp, expected, file.size)?;
    Ok((how, digest))
}

/// Copies the prefix of an interrupted download of `file` in the cache
/// into the empty `part`, fsyncs it, and makes its length the watermark.
/// Returns the bytes taken (0 when there is none).
pub(crate) async fn seed_from_incomplete(
    ctx: &FetchCtx,
    file: &FileRow,
    part: &mut PartFile,
) -> Result<u64> {
    let Some(cache) = &ctx.hf_cache else {
        return Ok(0);
    };
    if part.len() != 0 {
        return Ok(0);
    }
    let Some((incomplete, len)) = block_in_place(|| cache.incomplete(&ctx.pin.repo, file)) else {
        return Ok(0);
    };
    let io = |e| FetchError::io("copy from", &incomplete, e);
    let copied = block_in_place(|| -> Result<u64> {
        let src = ftpipe_fs::nofollow::open_read(&incomplete).map_err(io)?;
        let mut src = src.take(len);
        let mut buf = vec![0u8; PREFIX_COPY_BUF];
        loop {
            let n = src.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            match part.append(&buf[..n]) {
                Ok(()) => {}
                Err(AppendError::NoSpace) => {
                    return Err(FetchError::io(
                        "write",
                        ctx.dest(),
                        std::io::Error::from(std::io::ErrorKind::StorageFull),
                    ));
                }
                Err(AppendError::Io(e)) => return Err(FetchError::io("write", &incomplete, e)),
            }
        }
        Ok(part.len())
    })?;
    if copied == 0 {
        return Ok(0);
    }
    block_in_place(|| part.sync()).map_err(|e| FetchError::io("fsync", &incomplete, e))?;
    // The prefix is durable in `.part`; the ledger does not claim it yet.
    crashpoint::hit(CrashPoint::CachePrefixSynced);
    ctx.store
        .seed_from_cache(
            ctx.run,
            &file.path,
            copied,
            &CacheCandidate {
                path: file.path.clone(),
                cache_path: incomplete.display().to_string(),
                kind: CacheKind::Incomplete,
                outcome: CacheOutcome::Resumed,
                placement: Some(Placement::Copy),
                bytes: copied,
                detail: String::new(),
            },
        )
        .await?;
    ctx.reporter.report(ProgressEvent::FileResumedFromCache {
        path: file.path.clone(),
        bytes: copied,
    });
    Ok(copied)
}
