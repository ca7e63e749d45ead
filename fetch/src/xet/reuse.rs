//! Revision deltas: a term of a new reconstruction whose chunks an earlier
//! fetch recorded (in this directory's store, or in another directory's
//! with `--reuse-from`) is read back from the old files instead of fetched
//! from the CAS.
//!
//! A term names chunks `[start, end)` of a xorb. Recorded terms of that
//! xorb (looked up by xorb, [`ftpipe_receipts::Store::xet_chunk_runs`])
//! give each chunk's hash, length and place in an old file. The term is
//! reused only when every chunk is found and its bytes, read back from the
//! old file (path checked with `safe_join`, opened without following a
//! link, read at most [`MAX_CHUNK_BYTES`] per chunk), hash to the recorded
//! chunk hash. Any miss (an unknown chunk, a missing, short, changed or
//! punched file) and the term is fetched from the CAS as any other; a
//! tracing line says why. Invariants: no byte is handed on unchecked; a
//! reused term is recorded (its chunks' hashes, `reused` = its bytes)
//! before its bytes are handed on, exactly as a fetched one, so the file's
//! Xet hash check and the resume by term cover it.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::paths::safe_join;
use ftpipe_receipts::{ReadOnlyStore, Store, TermBytes, XetChunkRun, XetTermRow};

use super::cas::{Cursor, cut};
use super::hash::XetDigest;
use super::wire::Term;
use super::xorb::{MAX_CHUNK_BYTES, MAX_XORB_CHUNKS, MAX_XORB_PLAIN_BYTES};
use super::{Inner, XetFile};

/// A store whose recorded terms name chunks in the files under a root.
#[derive(Clone)]
enum Recorded {
    /// The state database of the directory being fetched into.
    Own(Arc<Store>),
    /// Another directory's, opened read-only (`--reuse-from`).
    Other(Arc<ReadOnlyStore>),
}

/// A directory whose earlier fetches' chunks may be reused: its store and
/// the root its recorded paths are under (`DIR/source`).
#[derive(Clone)]
struct ReuseDir {
    recorded: Recorded,
    source_root: PathBuf,
}

/// Where a Xet fetch looks for chunks it already has, in order: this
/// directory's earlier fetches first, then other directories'.
#[derive(Clone, Default)]
pub struct ChunkReuse {
    dirs: Vec<ReuseDir>,
}

impl ChunkReuse {
    /// Nothing is reused.
    pub fn none() -> ChunkReuse {
        ChunkReuse::default()
    }

    /// The chunks `store` recorded, in the files under `source_root` (the
    /// directory being fetched into).
    pub fn own(store: Arc<Store>, source_root: PathBuf) -> ChunkReuse {
        ChunkReuse {
            dirs: vec![ReuseDir {
                recorded: Recorded::Own(store),
                source_root,
            }],
        }
    }

    /// Also the chunks another directory's `store` recorded, in its files
    /// under `source_root` (read only).
    pub fn and_other(mut self, store: ReadOnlyStore, source_root: PathBuf) -> ChunkReuse {
        self.dirs.push(ReuseDir {
            recorded: Recorded::Other(Arc::new(store)),
            source_root,
        });
        self
    }
}

/// Where one chunk's bytes may be: `len` bytes at `offset` of `path` under
/// the root of `dir`, hashing to `hash`.
#[derive(Debug, Clone)]
struct Candidate {
    dir: usize,
    path: String,
    offset: u64,
    hash: String,
    len: u64,
}

/// Why a term was not reused (it is fetched instead).
#[derive(Debug, thiserror::Error)]
enum Miss {
    #[error("chunk {chunk} of the xorb was never recorded")]
    Unknown { chunk: u64 },
    #[error("the recorded chunks add up to {found} bytes, the reconstruction says {want}")]
    Length { found: u64, want: u64 },
    #[error("{what}: {detail}")]
    Unreadable { what: String, detail: String },
    #[error("{path} bytes {offset}..{end} no longer hash to chunk {chunk}'s recorded hash")]
    Changed {
        path: String,
        offset: u64,
        end: u64,
        chunk: u64,
    },
}

impl Cursor {
    /// `term`, whose first byte is `file_start` in the file, read back
    /// from old files and checked, recorded as reused and queued to be
    /// handed on (cut to the span) as a fetched term's chunks are; `false`
    /// when not every chunk was found and checked (fetch it). An error
    /// only when the record could not be written.
    pub(super) async fn reuse_term(
        &mut self,
        term: &Term,
        file_start: u64,
    ) -> Result<bool, String> {
        let Some(chunks) = self
            .inner
            .reused_chunks(&self.path, &self.file, term)
            .await?
        else {
            return Ok(false);
        };
        let (pieces, skipped, skip, left) = cut(&chunks.chunks, self.skip, self.left);
        let row = XetTermRow {
            path: self.path.clone(),
            xet_hash: self.file.xet_hash.clone(),
            file_start,
            file_end: file_start + term.length,
            xorb: term.xorb.clone(),
            chunk_start: term.chunk_start,
            chunk_end: term.chunk_end,
            chunks: chunks.hashes,
            fetched: 0,
            decoded: term.length,
            skipped,
        };
        self.inner
            .store
            .record_xet_term_from(&row, TermBytes::Reused)
            .await
            .map_err(|e| e.to_string())?;
        crashpoint::hit(CrashPoint::XetTermRecorded);
        (self.skip, self.left) = (skip, left);
        self.pending.extend(pieces);
        Ok(true)
    }
}

impl Inner {
    /// `term`'s chunks read back from old files, each checked against its
    /// recorded hash (`None`: a chunk not found or not checked; a tracing
    /// line says why).
    async fn reused_chunks(
        &self,
        path: &str,
        file: &XetFile,
        term: &Term,
    ) -> Result<Option<ReadBack>, String> {
        if self.reuse.dirs.is_empty() {
            return Ok(None);
        }
        let candidates = match self.reuse.candidates(path, file, term).await {
            Ok(c) => c,
            Err(miss) => {
                tracing::debug!(path, xorb = %term.xorb, "Xet term fetched: {miss}");
                return Ok(None);
            }
        };
        let roots: Vec<PathBuf> = self
            .reuse
            .dirs
            .iter()
            .map(|d| d.source_root.clone())
            .collect();
        let read = tokio::task::spawn_blocking(move || read_checked(&roots, &candidates))
            .await
            .map_err(|e| format!("reading reused chunks: {e}"))?;
        let miss = match read {
            Ok(back) => {
                let found: u64 = back.hashes.iter().map(|(_, n)| n).sum();
                if found == term.length {
                    return Ok(Some(back));
                }
                Miss::Length {
                    found,
                    want: term.length,
                }
            }
            Err(miss) => miss,
        };
        tracing::info!(
            path,
            xorb = %term.xorb,
            chunks = %format!("{}..{}", term.chunk_start, term.chunk_end),
            "Xet term fetched from the CAS, not reused: {miss}"
        );
        Ok(None)
    }
}

impl ChunkReuse {
    /// For each chunk of `term`, the places it was recorded at (this
    /// directory's first); a miss when a chunk was never recorded or the
    /// term is larger than a xorb holds.
    async fn candidates(
        &self,
        path: &str,
        file: &XetFile,
        term: &Term,
    ) -> Result<Vec<Vec<Candidate>>, Miss> {
        let (start, end) = (term.chunk_start, term.chunk_end);
        let count = end.saturating_sub(start);
        if count == 0 || count > MAX_XORB_CHUNKS as u64 || term.length > MAX_XORB_PLAIN_BYTES as u64
        {
            return Err(Miss::Length {
                found: count,
                want: term.length,
            });
        }
        let mut places: Vec<Vec<Candidate>> = vec![Vec::new(); count as usize];
        for (dir, d) in self.dirs.iter().enumerate() {
            let not_of = (path, file.xet_hash.as_str());
            let runs = match &d.recorded {
                Recorded::Own(s) => s.xet_chunk_runs(&term.xorb, start..end, not_of).await,
                Recorded::Other(s) => s.xet_chunk_runs(&term.xorb, start..end, not_of).await,
            };
            match runs {
                Ok(runs) => add_places(&mut places, dir, &runs, start..end),
                Err(e) => {
                    tracing::warn!(path, xorb = %term.xorb, "recorded Xet chunks not readable: {e}");
                }
            }
        }
        if let Some(i) = places.iter().position(Vec::is_empty) {
            return Err(Miss::Unknown {
                chunk: start + i as u64,
            });
        }
        let found: u64 = places.iter().map(|p| p[0].len).sum();
        if found != term.length {
            return Err(Miss::Length {
                found,
                want: term.length,
            });
        }
        Ok(places)
    }
}

/// Adds the chunks of `runs` within `want` to `places` (indexed from
/// `want.start`), each at its offset in its run's file.
fn add_places(
    places: &mut [Vec<Candidate>],
    dir: usize,
    runs: &[XetChunkRun],
    want: std::ops::Range<u64>,
) {
    for run in runs {
        let mut offset = run.file_start;
        for (k, (hash, len)) in run.chunks.iter().enumerate() {
            let chunk = run.chunk_start + k as u64;
            if want.contains(&chunk) && chunk < run.chunk_end {
                places[(chunk - want.start) as usize].push(Candidate {
                    dir,
                    path: run.path.clone(),
                    offset,
                    hash: hash.clone(),
                    len: *len,
                });
            }
            offset = offset.saturating_add(*len);
        }
    }
}

/// A term's chunks read back: their bytes and their (checked) hashes and
/// lengths, in order.
struct ReadBack {
    chunks: Vec<Bytes>,
    hashes: Vec<(String, u64)>,
}

/// Each chunk's bytes from the first of its places that still holds them
/// (hashing to the recorded hash), and the chunk hashes; a miss when one
/// chunk has none.
fn read_checked(roots: &[PathBuf], places: &[Vec<Candidate>]) -> Result<ReadBack, Miss> {
    let mut files: HashMap<(usize, String), Result<File, String>> = HashMap::new();
    let mut chunks = Vec::with_capacity(places.len());
    let mut hashes = Vec::with_capacity(places.len());
    for (i, candidates) in places.iter().enumerate() {
        let mut last = None;
        let mut got = None;
        for c in candidates {
            match read_one(roots, &mut files, c, i as u64) {
                Ok(bytes) => {
                    got = Some(bytes);
                    hashes.push((c.hash.clone(), c.len));
                    break;
                }
                Err(miss) => last = Some(miss),
            }
        }
        match got {
            Some(bytes) => chunks.push(bytes),
            None => {
                return Err(last.unwrap_or(Miss::Unknown { chunk: i as u64 }));
            }
        }
    }
    Ok(ReadBack { chunks, hashes })
}

/// One chunk read from its place and checked against its recorded hash.
fn read_one(
    roots: &[PathBuf],
    files: &mut HashMap<(usize, String), Result<File, String>>,
    c: &Candidate,
    chunk: u64,
) -> Result<Bytes, Miss> {
    let unreadable = |detail: String| Miss::Unreadable {
        what: c.path.clone(),
        detail,
    };
    if c.len == 0 || c.len > MAX_CHUNK_BYTES as u64 {
        return Err(unreadable(format!(
            "recorded chunk length {} is not 1..={MAX_CHUNK_BYTES}",
            c.len
        )));
    }
    let file = files
        .entry((c.dir, c.path.clone()))
        .or_insert_with(|| open_old(&roots[c.dir], &c.path));
    let file = file.as_ref().map_err(|e| unreadable(e.clone()))?;
    let mut buf = vec![0u8; c.len as usize];
    file.read_exact_at(&mut buf, c.offset)
        .map_err(|e| unreadable(format!("bytes {}..{}: {e}", c.offset, c.offset + c.len)))?;
    if XetDigest::of_chunk(&buf).hex() != c.hash {
        return Err(Miss::Changed {
            path: c.path.clone(),
            offset: c.offset,
            end: c.offset + c.len,
            chunk,
        });
    }
    Ok(Bytes::from(buf))
}

/// The old file `path` under `root`: the path checked against the tree,
/// opened without following a link, a regular file.
fn open_old(root: &std::path::Path, path: &str) -> Result<File, String> {
    let full = safe_join(root, path).map_err(|e| e.to_string())?;
    ftpipe_fs::nofollow::open_read(&full).map_err(|e| format!("{}: {e}", full.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(path: &str, offset: u64, bytes: &[u8]) -> Candidate {
        Candidate {
            dir: 0,
            path: path.into(),
            offset,
            hash: XetDigest::of_chunk(bytes).hex(),
            len: bytes.len() as u64,
        }
    }

    /// A chunk is taken from the first place that still holds its bytes;
    /// a changed, punched (zeros), short or missing place is passed over,
    /// and with no good place left the term is a miss.
    #[test]
    fn only_chunks_that_still_hash_right_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let good = b"0123456789abcdef".repeat(64);
        std::fs::write(root.join("old.bin"), &good).unwrap();
        std::fs::write(root.join("zeros.bin"), vec![0u8; good.len()]).unwrap();
        std::fs::write(root.join("short.bin"), &good[..100]).unwrap();
        let chunk = &good[256..512];
        let wrong_places = [
            candidate("zeros.bin", 256, chunk),
            candidate("short.bin", 256, chunk),
            candidate("gone.bin", 256, chunk),
            candidate("../old.bin", 256, chunk),
        ];
        let mut places = wrong_places.to_vec();
        places.push(candidate("old.bin", 256, chunk));
        let back = read_checked(std::slice::from_ref(&root), &[places]).unwrap();
        assert_eq!(back.chunks, [Bytes::copy_from_slice(chunk)]);
        assert_eq!(back.hashes[0].0, XetDigest::of_chunk(chunk).hex());
        let Err(miss) = read_checked(&[root], &[wrong_places.to_vec()]) else {
            panic!("a term was read back from places that do not hold it");
        };
        assert!(matches!(miss, Miss::Unreadable { .. }), "{miss}");
    }
}
