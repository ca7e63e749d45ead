//! The bytes a crash left written past a watermark, proven by the chunk
//! hashes recorded before they were handed on ([`ByteSource::proven_tail`]).
//!
//! Every chunk a Xet file's bytes are handed on in was recorded first, with
//! its hash and length, at its place in the file (`xet_terms`, a batch at
//! a time). So after a kill the bytes written past a range's last
//! checkpoint need not be thrown away: chunk after chunk from the
//! watermark, each is read back from the part and hashed, and the run of
//! chunks that match is kept. A chunk that does not match (a power cut
//! lost it, it was never written: a hole reads zeros) ends the run. Reads
//! only: the caller fsyncs before it claims anything.
//!
//! [`ByteSource::proven_tail`]: crate::source::ByteSource::proven_tail

use std::collections::BTreeMap;

use ftpipe_fs::direct::{Bounce, DirectFile};
use ftpipe_receipts::XetTermRow;

use super::hash::XetDigest;
use super::xorb::MAX_CHUNK_BYTES;
use super::{Inner, XetFile};
use crate::error::Result;

impl Inner {
    /// How far the bytes of `part` from `from` (up to `to`) are chunks of
    /// `path` whose recorded hashes they match: `from` when none is.
    pub(super) async fn proven_tail(
        &self,
        path: &str,
        file: &XetFile,
        part: &DirectFile,
        from: u64,
        to: u64,
    ) -> Result<u64> {
        if from >= to {
            return Ok(from);
        }
        // Proving a tail only saves a refetch: a record that cannot be
        // read proves nothing (the file's Xet hash check reads it again).
        let rows = match self
            .store
            .xet_terms_within(path, &file.xet_hash, from..to)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(path, from, "the recorded chunks past the watermark: {e}");
                return Ok(from);
            }
        };
        let chunks = chunks_by_start(&rows);
        let proven = tokio::task::block_in_place(|| prove(part, &chunks, from, to));
        match proven {
            Proven::Matched(end) => Ok(end),
            Proven::Unreadable { at, end, error } => {
                tracing::warn!(
                    path,
                    at,
                    "reading back the tail past the watermark: {error}"
                );
                Ok(end)
            }
        }
    }
}

/// Recorded chunks by their first byte in the file: `(hash, length)`.
/// Terms recorded for different spans may hold the same chunk; a chunk's
/// place and hash are the same in every row that holds it. A row whose
/// hash does not parse names no chunk.
fn chunks_by_start(rows: &[XetTermRow]) -> BTreeMap<u64, (XetDigest, u64)> {
    let mut by_start = BTreeMap::new();
    for row in rows {
        let mut at = row.file_start;
        for (hex, len) in &row.chunks {
            if let Some(digest) = XetDigest::parse(hex) {
                by_start.insert(at, (digest, *len));
            }
            at = at.saturating_add(*len);
        }
    }
    by_start
}

/// How far a run of matching chunks reached.
#[derive(Debug)]
enum Proven {
    /// Every chunk up to `.0` matched (the next one did not, was not
    /// recorded, or reaches past `to`).
    Matched(u64),
    /// The chunk at `at` could not be read; `end`: how far the chunks
    /// before it matched.
    Unreadable {
        at: u64,
        end: u64,
        error: std::io::Error,
    },
}

/// The run of chunks from the one holding `from` whose bytes in `part`
/// hash to their recorded hash, up to `to` at most.
fn prove(
    part: &DirectFile,
    chunks: &BTreeMap<u64, (XetDigest, u64)>,
    from: u64,
    to: u64,
) -> Proven {
    let mut bounce = Bounce::new(MAX_CHUNK_BYTES);
    let mut bytes = Vec::with_capacity(MAX_CHUNK_BYTES);
    let mut at = from;
    while at < to {
        let Some((&start, &(digest, len))) = chunks.range(..=at).next_back() else {
            break;
        };
        let Some(end) = start.checked_add(len) else {
            break;
        };
        if end <= at || end > to || len > MAX_CHUNK_BYTES as u64 {
            break;
        }
        bytes.clear();
        if let Err(error) = part.read_range(&mut bounce, start, end, |b| bytes.extend_from_slice(b))
        {
            return Proven::Unreadable {
                at: start,
                end: at,
                error,
            };
        }
        if XetDigest::of_chunk(&bytes) != digest {
            break;
        }
        at = end;
    }
    Proven::Matched(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftpipe_fs::direct::IoMode;

    fn row(file_start: u64, chunks: &[&[u8]]) -> XetTermRow {
        XetTermRow {
            path: "a".into(),
            xet_hash: "0".repeat(64),
            file_start,
            file_end: file_start + chunks.iter().map(|c| c.len() as u64).sum::<u64>(),
            xorb: "1".repeat(64),
            chunk_start: 0,
            chunk_end: chunks.len() as u64,
            chunks: chunks
                .iter()
                .map(|c| (XetDigest::of_chunk(c).hex(), c.len() as u64))
                .collect(),
            fetched: 0,
            decoded: 0,
            skipped: 0,
        }
    }

    fn matched(p: Proven) -> u64 {
        match p {
            Proven::Matched(end) => end,
            other @ Proven::Unreadable { .. } => panic!("{other:?}"),
        }
    }

    fn part_holding(bytes: &[u8]) -> (tempfile::TempDir, DirectFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.part");
        std::fs::write(&path, bytes).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (dir, DirectFile::new(file, IoMode::Buffered))
    }

    /// Three chunks of 5000, 7000 and 3000 bytes from byte 0, recorded in
    /// two rows that overlap by the middle chunk.
    fn three() -> (Vec<u8>, BTreeMap<u64, (XetDigest, u64)>) {
        let file: Vec<u8> = (0..15_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (a, b, c) = (&file[..5000], &file[5000..12_000], &file[12_000..]);
        let rows = [row(0, &[a, b]), row(5000, &[b, c])];
        (file.clone(), chunks_by_start(&rows))
    }

    #[test]
    fn a_run_of_matching_chunks_is_proven_from_inside_its_first_chunk() {
        let (file, chunks) = three();
        let (_d, part) = part_holding(&file);
        assert_eq!(matched(prove(&part, &chunks, 4096, 15_000)), 15_000);
        // A chunk reaching past `to` is not proven.
        assert_eq!(matched(prove(&part, &chunks, 4096, 14_999)), 12_000);
    }

    #[test]
    fn a_changed_or_lost_chunk_ends_the_run() {
        let (mut file, chunks) = three();
        file[6000] ^= 1;
        let (_d, part) = part_holding(&file);
        assert_eq!(matched(prove(&part, &chunks, 0, 15_000)), 5000);
        // A tail the file does not hold (a power cut lost it) reads as
        // nothing there: unreadable past the end, nothing claimed past it.
        let (mut file, chunks) = three();
        file.truncate(13_000);
        let (_d, part) = part_holding(&file);
        match prove(&part, &chunks, 0, 15_000) {
            Proven::Unreadable { at, end, .. } => assert_eq!((at, end), (12_000, 12_000)),
            other @ Proven::Matched(_) => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_is_proven_where_no_chunk_was_recorded() {
        let (file, _) = three();
        let (_d, part) = part_holding(&file);
        let rows = [row(5000, &[&file[5000..12_000]])];
        let chunks = chunks_by_start(&rows);
        assert_eq!(matched(prove(&part, &chunks, 4096, 15_000)), 4096);
        assert_eq!(matched(prove(&part, &chunks, 5000, 15_000)), 12_000);
    }
}
