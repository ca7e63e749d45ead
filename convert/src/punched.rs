//! Punching a converted PLE file down to its kept ranges ([`crate::keep`])
//! durably, and taking a punched file back after a restart.
//!
//! Order: the kept ranges are hashed from the verified file, the punch is
//! logged with those digests ([`Store::log_punch`]), then the holes are
//! punched and the file synced. A kill after the row leaves a logged punch
//! of a file that may still be whole: [`resume`] punches again (a no-op
//! where the holes are) and checks every kept range by its digest before
//! anything reads it. A kill before the row leaves a whole, verified file,
//! converted again from its span claims as any other.

use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};
use tokio::task::block_in_place;

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_receipts::{KeptMethod, KeptRange, PunchRecord, RunId, Store};

use crate::error::{ConvertError, Result};
use crate::keep::{Range, held_bytes, holes};

/// The SHA-256 (hex) of `len` bytes at `offset` of `file`.
pub(crate) fn range_sha256(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<String> {
    const CHUNK: u64 = 1 << 20;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        file.read_exact_at(&mut buf[..n], offset + at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Hashes `kept` of the file at `path`.
pub(crate) fn hash_ranges(path: &Path, kept: &[Range]) -> Result<Vec<KeptRange>> {
    let file =
        ftpipe_fs::nofollow::open_read(path).map_err(|e| ConvertError::io("open", path, e))?;
    kept.iter()
        .map(|&(offset, len)| {
            let sha256 =
                range_sha256(&file, offset, len).map_err(|e| ConvertError::io("read", path, e))?;
            Ok(KeptRange {
                offset,
                len,
                sha256,
            })
        })
        .collect()
}

/// Punches source `file` under `root` (the version with receipt digest
/// `digest`, `size` bytes, verified and converted) down to `kept`, in
/// allocation units of `unit` bytes: hashed, logged, punched, synced.
/// Returns the record logged.
pub(crate) async fn punch(
    store: &Store,
    run: RunId,
    root: &Path,
    (file, digest, size): (&str, &str, u64),
    (kept, unit): (&[Range], u64),
) -> Result<PunchRecord> {
    let path = ftpipe_fs::paths::safe_join(root, file)?;
    let record = PunchRecord {
        run_id: run,
        path: file.to_owned(),
        digest: digest.to_owned(),
        size,
        method: KeptMethod::Punch,
        kept_bytes: held_bytes(kept, size, unit),
        kept: block_in_place(|| hash_ranges(&path, kept))?,
    };
    store.log_punch(&record).await?;
    crashpoint::hit(CrashPoint::PunchLogged);
    punch_holes(&path, &record)?;
    crashpoint::hit(CrashPoint::PunchDone);
    Ok(record)
}

fn punch_holes(path: &Path, record: &PunchRecord) -> Result<()> {
    let kept: Vec<Range> = record.kept.iter().map(|k| (k.offset, k.len)).collect();
    block_in_place(|| ftpipe_fs::punch::punch_holes(path, &holes(&kept, record.size)))
        .map_err(|e| ConvertError::io("punch holes in", path, e))
}

/// After a restart: finishes the logged punch of `record.path` under
/// `root` (punching again is a no-op where the holes are) and checks each
/// kept range against its digest. Returns the bytes it holds
/// ([`held_after`]).
/// A file punched on a volume that cannot punch holes (copied there since)
/// keeps its zeros on disk and is counted at what it holds.
pub fn resume(root: &Path, record: &PunchRecord) -> Result<u64> {
    let path = ftpipe_fs::paths::safe_join(root, &record.path)?;
    match punch_holes(&path, record) {
        Err(ConvertError::Io(e)) if ftpipe_fs::punch::is_unsupported(&e.source) => {
            tracing::warn!(file = %record.path, "this volume cannot punch holes: the punched file is held whole");
        }
        other => other?,
    }
    check_kept(root, record)?;
    held_after(&path, record)
}

/// The bytes punched file `path` holds: `record.kept_bytes`, or what the
/// filesystem says it holds when that is more.
pub(crate) fn held_after(path: &Path, record: &PunchRecord) -> Result<u64> {
    let held = ftpipe_fs::punch::held_bytes(path).map_err(|e| ConvertError::io("stat", path, e))?;
    Ok(held.max(record.kept_bytes))
}

/// Checks every range `record` keeps of its file under `root` against its
/// digest (the audit's deep check of a punched source).
pub fn check_kept(root: &Path, record: &PunchRecord) -> Result<()> {
    let path = ftpipe_fs::paths::safe_join(root, &record.path)?;
    block_in_place(|| {
        let file = ftpipe_fs::nofollow::open_read(&path)
            .map_err(|e| ConvertError::io("open", &path, e))?;
        for k in &record.kept {
            let found = range_sha256(&file, k.offset, k.len)
                .map_err(|e| ConvertError::io("read", &path, e))?;
            if found != k.sha256 {
                return Err(ConvertError::KeptRangeChanged {
                    source_file: record.path.clone(),
                    offset: k.offset,
                    len: k.len,
                    expected: k.sha256.clone(),
                    found,
                });
            }
        }
        Ok(())
    })
}
