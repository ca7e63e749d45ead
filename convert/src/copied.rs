//! Copying a converted PLE file's spans aside, on a volume that cannot
//! punch holes ([`crate::keep::Release::CopyAside`]), and taking a copy
//! back after a restart.
//!
//! Order: the kept ranges (the PLE spans, merged) are hashed from the
//! verified file; they are copied back to back, in offset order, to
//! `DIR/.ftpipe/kept/<path>` durably ([`ftpipe_fs::punch::copy_aside`]:
//! temp, write, sync, rename, directory sync); only then is the row that
//! claims the copy logged ([`Store::log_punch`], method `copy_aside`); only
//! then is the source file unlinked and its directory synced. A kill
//! before the row leaves a whole verified file and a copy no row claims
//! (removed by [`remove_stale`] on the next run, which copies again); a
//! kill after it leaves a live copy and maybe the file, which [`resume`]
//! unlinks after checking every range of the copy by its digest. The Q3
//! writer reads the spans from the copy ([`crate::write::Sources`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokio::task::block_in_place;

use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_receipts::{KeptMethod, PunchRecord, RunId, Store};

use crate::error::{ConvertError, Result};
use crate::keep::{Range, total};
use crate::punched::{hash_ranges, range_sha256};
use crate::retire::unlink_durably;

/// Where the copy of source `file`'s kept ranges lives.
pub fn copy_path(paths: &Layout, file: &str) -> Result<PathBuf> {
    Ok(ftpipe_fs::paths::safe_join(&paths.kept(), file)?)
}

/// Copies the kept ranges of source `file` (the version with receipt
/// digest `digest`, `size` bytes, verified and converted) aside, logs the
/// copy, and releases the file: see the module documentation. Returns the
/// record logged.
pub(crate) async fn copy_aside(
    store: &Store,
    run: RunId,
    paths: &Layout,
    (file, digest, size): (&str, &str, u64),
    kept: &[Range],
) -> Result<PunchRecord> {
    let path = ftpipe_fs::paths::safe_join(paths.source(), file)?;
    let copy = copy_path(paths, file)?;
    let hashed = block_in_place(|| hash_ranges(&path, kept))?;
    let len =
        block_in_place(|| ftpipe_fs::punch::copy_aside(&path, kept, paths.state_dir(), &copy))?;
    if len != total(kept) {
        return Err(ConvertError::internal(format!(
            "the copy of {file}'s PLE spans has {len} bytes, expected {}",
            total(kept)
        )));
    }
    crashpoint::hit(CrashPoint::KeptCopied);
    let record = PunchRecord {
        run_id: run,
        path: file.to_owned(),
        digest: digest.to_owned(),
        size,
        method: KeptMethod::CopyAside,
        kept_bytes: len,
        kept: hashed,
    };
    store.log_punch(&record).await?;
    crashpoint::hit(CrashPoint::CopyLogged);
    unlink_durably(paths.source(), file)?;
    crashpoint::hit(CrashPoint::CopyReleased);
    Ok(record)
}

/// After a restart: checks every range of the live copy `record` claims
/// by its digest, then releases the source file if a kill left it.
/// Returns the copy's length (the bytes it holds).
pub fn resume(paths: &Layout, record: &PunchRecord) -> Result<u64> {
    check_copy(paths, record)?;
    unlink_durably(paths.source(), &record.path)?;
    Ok(record.kept_bytes)
}

/// Checks the copy `record` claims: its length, and every range by its
/// digest (the audit's deep check of a source copied aside).
pub fn check_copy(paths: &Layout, record: &PunchRecord) -> Result<()> {
    let copy = copy_path(paths, &record.path)?;
    let broken = |offset: u64, len: u64, at: u64, problem: String| ConvertError::KeptCopyChanged {
        source_file: record.path.clone(),
        copy: copy.display().to_string(),
        offset,
        len,
        at,
        problem,
    };
    block_in_place(|| {
        let file = ftpipe_fs::nofollow::open_read(&copy)
            .map_err(|e| broken(0, 0, 0, format!("cannot be opened ({e})")))?;
        let found = file
            .metadata()
            .map_err(|e| broken(0, 0, 0, format!("cannot be read ({e})")))?
            .len();
        if found != record.kept_bytes {
            return Err(broken(
                0,
                0,
                0,
                format!(
                    "is missing: the copy has {found} bytes, {} logged",
                    record.kept_bytes
                ),
            ));
        }
        let mut at = 0u64;
        for k in &record.kept {
            let digest = range_sha256(&file, at, k.len)
                .map_err(|e| broken(k.offset, k.len, at, format!("cannot be read ({e})")))?;
            if digest != k.sha256 {
                let problem = format!("now has SHA-256 {digest}, recorded {}", k.sha256);
                return Err(broken(k.offset, k.len, at, problem));
            }
            at = at.saturating_add(k.len);
        }
        Ok(())
    })
}

/// Removes the copy of `file` (retired: the retirement's row ended its
/// record), if present, and syncs its directory.
pub fn remove(paths: &Layout, file: &str) -> Result<()> {
    unlink_durably(&paths.kept(), file)
}

/// Removes every file under `DIR/.ftpipe/kept` that no live copy in
/// `live` claims (a copy a kill left before its row, or after the
/// retirement that ended it; a temp file). Returns what was removed.
pub fn remove_stale(paths: &Layout, live: &BTreeMap<String, PunchRecord>) -> Result<Vec<String>> {
    let root = paths.kept();
    let mut found = Vec::new();
    block_in_place(|| files_under(&root, &root, &mut found))?;
    let mut removed = Vec::new();
    for rel in found {
        let claimed = live
            .get(&rel)
            .is_some_and(|r| r.method == KeptMethod::CopyAside);
        if !claimed {
            unlink_durably(&root, &rel)?;
            removed.push(rel);
        }
    }
    Ok(removed)
}

/// Every regular file under `dir`, relative to `root` ('/'-separated).
fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ConvertError::io("list", dir, e)),
    };
    for e in entries {
        let e = e.map_err(|e| ConvertError::io("list", dir, e))?;
        let t = e
            .file_type()
            .map_err(|err| ConvertError::io("stat", e.path(), err))?;
        if t.is_dir() {
            files_under(root, &e.path(), out)?;
        } else if t.is_file()
            && let Ok(rel) = e.path().strip_prefix(root)
        {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// Where each kept range of `record` sits in its copy:
/// `(source offset, len, copy offset)`, in source order.
pub fn copy_ranges(record: &PunchRecord) -> Vec<(u64, u64, u64)> {
    let mut at = 0u64;
    record
        .kept
        .iter()
        .map(|k| {
            let r = (k.offset, k.len, at);
            at = at.saturating_add(k.len);
            r
        })
        .collect()
}
