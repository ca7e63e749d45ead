//! Xorb chunks as stored (xet-core `xorb_object`, the format its spec
//! documents): each chunk is an 8-byte header (version 0, compressed
//! length in 3 bytes little-endian, compression scheme, uncompressed length
//! in 3 bytes) then its compressed bytes. Schemes: 0 none, 1 an LZ4 frame,
//! 2 an LZ4 frame of the bytes split into 4 interleaved groups.
//!
//! Invariant: a chunk decodes to exactly its header's uncompressed length,
//! never more than [`MAX_CHUNK_BYTES`], and a range to at most
//! [`MAX_XORB_CHUNKS`] chunks and [`MAX_XORB_PLAIN_BYTES`] in all (a larger
//! claim is refused before anything is allocated for it).

use bytes::Bytes;

/// A chunk header's length.
pub const HEADER_BYTES: usize = 8;
/// The largest chunk xet-core writes (2 × the 64 KiB target).
pub const MAX_CHUNK_BYTES: usize = 128 * 1024;
/// The most chunks a xorb holds (xet-core's `MAX_XORB_CHUNKS`).
pub const MAX_XORB_CHUNKS: usize = 8 * 1024;
/// The most bytes a xorb's chunks hold (xet-core's `MAX_XORB_BYTES`).
pub const MAX_XORB_PLAIN_BYTES: usize = 64 * 1024 * 1024;

/// Why xorb bytes could not be decoded; `at` is the byte offset in the
/// range fetched.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum XorbError {
    /// The bytes end inside a header or a chunk.
    #[error("xorb bytes end at {len} inside chunk {index} (which starts at byte {at})")]
    Truncated {
        /// The chunk's index in the range.
        index: usize,
        /// Where it starts.
        at: usize,
        /// The bytes received.
        len: usize,
    },
    /// A header this client cannot read.
    #[error("chunk {index} at byte {at}: {what}")]
    BadHeader {
        /// The chunk's index in the range.
        index: usize,
        /// Where it starts.
        at: usize,
        /// What is wrong.
        what: String,
    },
    /// More chunks, or more bytes in them, than one xorb can hold: tiny
    /// compressed chunks that would decode to far more than their range.
    #[error("{what}, more than a xorb holds")]
    Oversized {
        /// What was claimed.
        what: String,
    },
    /// Bytes left after the chunks the term needs.
    #[error("{extra} bytes after the last of {count} chunks")]
    Trailing {
        /// Chunks decoded.
        count: usize,
        /// Bytes past them.
        extra: usize,
    },
}

/// Decodes `count` chunks from the start of `bytes`, which must hold
/// exactly them.
#[cfg(test)]
pub fn decode_chunks(bytes: &[u8], count: usize) -> Result<Vec<Bytes>, XorbError> {
    let mut stream = ChunkStream::new(count)?;
    stream.push(bytes)?;
    let mut out = Vec::with_capacity(count.min(1024));
    while let Some(chunk) = stream.next_chunk()? {
        out.push(chunk);
    }
    stream.finish()?;
    Ok(out)
}

/// The chunks of a xorb range decoded as its bytes arrive: bytes are
/// [`push`](ChunkStream::push)ed, each chunk is taken as soon as all its
/// bytes are in ([`next_chunk`](ChunkStream::next_chunk)), and
/// [`finish`](ChunkStream::finish) says whether the range held exactly
/// `count` chunks. Holds at most one chunk's bytes and what came after
/// them in one push.
#[derive(Debug)]
pub struct ChunkStream {
    count: usize,
    /// Chunks taken so far (the index of the next).
    index: usize,
    /// Bytes received; those from `head` on are not yet taken as a chunk.
    buf: Vec<u8>,
    head: usize,
    /// Offset in the range of `buf`'s first byte.
    at: usize,
    /// Decoded bytes of the chunks taken.
    plain_total: usize,
}

impl ChunkStream {
    /// A decoder of a range of `count` chunks (more than a xorb holds is
    /// refused before anything is read).
    pub fn new(count: usize) -> Result<ChunkStream, XorbError> {
        if count > MAX_XORB_CHUNKS {
            return Err(XorbError::Oversized {
                what: format!("{count} chunks asked"),
            });
        }
        Ok(ChunkStream {
            count,
            index: 0,
            buf: Vec::new(),
            head: 0,
            at: 0,
            plain_total: 0,
        })
    }

    /// Chunks taken so far.
    pub fn taken(&self) -> usize {
        self.index
    }

    /// More bytes of the range; bytes past the last chunk are refused as
    /// soon as they come.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), XorbError> {
        self.buf.drain(..self.head);
        self.head = 0;
        self.buf.extend_from_slice(bytes);
        self.check_trailing()
    }

    fn check_trailing(&self) -> Result<(), XorbError> {
        if self.index == self.count && self.buf.len() > self.head {
            return Err(XorbError::Trailing {
                count: self.count,
                extra: self.buf.len() - self.head,
            });
        }
        Ok(())
    }

    /// The next chunk, decoded, when all its bytes are in.
    pub fn next_chunk(&mut self) -> Result<Option<Bytes>, XorbError> {
        let rest = &self.buf[self.head..];
        if self.index == self.count || rest.len() < HEADER_BYTES {
            return Ok(None);
        }
        let (index, at) = (self.index, self.at);
        let bad = |what: String| XorbError::BadHeader { index, at, what };
        let header = &rest[..HEADER_BYTES];
        if header[0] != 0 {
            return Err(bad(format!(
                "header version {} (this client reads 0)",
                header[0]
            )));
        }
        let compressed = three_bytes(&header[1..4]);
        let scheme = header[4];
        let plain = three_bytes(&header[5..8]);
        if plain > MAX_CHUNK_BYTES || compressed > 2 * MAX_CHUNK_BYTES {
            return Err(bad(format!(
                "lengths {compressed} compressed / {plain} plain exceed a chunk's {MAX_CHUNK_BYTES}"
            )));
        }
        if plain == 0 {
            return Err(bad("an empty chunk (xet-core writes none)".into()));
        }
        let total = self.plain_total + plain;
        if total > MAX_XORB_PLAIN_BYTES {
            return Err(XorbError::Oversized {
                what: format!("chunks 0..={index} claim {total} bytes decoded"),
            });
        }
        let end = HEADER_BYTES + compressed;
        if rest.len() < end {
            return Ok(None);
        }
        let chunk = decode_one(&rest[HEADER_BYTES..end], scheme, plain).map_err(bad)?;
        self.head += end;
        self.at += end;
        self.index += 1;
        self.plain_total = total;
        self.check_trailing()?;
        Ok(Some(Bytes::from(chunk)))
    }

    /// The range ended: all `count` chunks taken and nothing after them.
    pub fn finish(&self) -> Result<(), XorbError> {
        if self.index < self.count {
            return Err(XorbError::Truncated {
                index: self.index,
                at: self.at,
                len: self.at + self.buf.len() - self.head,
            });
        }
        self.check_trailing()
    }
}

fn three_bytes(b: &[u8]) -> usize {
    usize::from(b[0]) | usize::from(b[1]) << 8 | usize::from(b[2]) << 16
}

/// One chunk's bytes, decoded to exactly `plain` bytes.
fn decode_one(body: &[u8], scheme: u8, plain: usize) -> Result<Vec<u8>, String> {
    let decoded = match scheme {
        0 => body.to_vec(),
        1 => super::lz4frame::decode(body, plain)?,
        2 => regroup(&super::lz4frame::decode(body, plain)?),
        other => return Err(format!("unknown compression scheme {other}")),
    };
    if decoded.len() != plain {
        return Err(format!(
            "decoded to {} bytes, its header says {plain}",
            decoded.len()
        ));
    }
    Ok(decoded)
}

/// Byte grouping undone: group `k` holds bytes `4i + k`; the first
/// `len % 4` groups are one byte longer. Four zipped slices: no division
/// and no bounds check per byte, no zeroed buffer first (this runs over
/// every byte of a BG4 chunk).
fn regroup(g: &[u8]) -> Vec<u8> {
    let n = g.len();
    let (whole, rem) = (n / 4, n % 4);
    let len = |k: usize| whole + usize::from(k < rem);
    let (g0, rest) = g.split_at(len(0));
    let (g1, rest) = rest.split_at(len(1));
    let (g2, g3) = rest.split_at(len(2));
    let mut out = Vec::with_capacity(n);
    for (((a, b), c), d) in g0.iter().zip(g1).zip(g2).zip(g3) {
        out.extend_from_slice(&[*a, *b, *c, *d]);
    }
    // The last `rem` bytes: one more of each of the first `rem` groups.
    out.extend([g0, g1, g2].iter().take(rem).map(|g| g[whole]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(scheme: u8, body: &[u8], plain: usize) -> Vec<u8> {
        let c = body.len().to_le_bytes();
        let p = plain.to_le_bytes();
        let mut v = vec![0, c[0], c[1], c[2], scheme, p[0], p[1], p[2]];
        v.extend_from_slice(body);
        v
    }

    fn lz4(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn regroup_undoes_byte_grouping_at_every_remainder() {
        for n in (0..=70usize).chain([4099, 65_536, 65_537]) {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 1) as u8).collect();
            let grouped: Vec<u8> = (0..4)
                .flat_map(|k| data.iter().skip(k).step_by(4).copied())
                .collect();
            assert_eq!(regroup(&grouped), data, "{n} bytes");
        }
    }

    #[test]
    fn every_scheme_decodes_and_a_short_range_is_truncated() {
        let data: Vec<u8> = (0..1003u32).map(|i| (i * 7 % 251) as u8).collect();
        // Groups as xet-core's bg4_split writes them.
        let mut grouped = Vec::new();
        for k in 0..4 {
            grouped.extend(data.iter().skip(k).step_by(4));
        }
        let mut bytes = chunk(0, &data, data.len());
        bytes.extend(chunk(1, &lz4(&data), data.len()));
        bytes.extend(chunk(2, &lz4(&grouped), data.len()));
        let got = decode_chunks(&bytes, 3).unwrap();
        assert!(got.iter().all(|c| c[..] == data[..]));
        assert!(matches!(
            decode_chunks(&bytes[..bytes.len() - 1], 3),
            Err(XorbError::Truncated { index: 2, .. })
        ));
        assert!(matches!(
            decode_chunks(&bytes, 2),
            Err(XorbError::Trailing { count: 2, .. })
        ));
    }

    /// Bytes pushed as they arrive, one at a time: each chunk is taken as
    /// soon as its last byte is in, the same chunks as from the whole
    /// range; an end inside a chunk is truncated, a byte past the last
    /// chunk is refused when it comes.
    #[test]
    fn chunks_are_taken_as_their_bytes_arrive() {
        let data: Vec<u8> = (0..777u32).map(|i| (i * 13 % 251) as u8).collect();
        let first = chunk(0, &data, data.len());
        let mut bytes = first.clone();
        bytes.extend(chunk(1, &lz4(&data), data.len()));
        let mut stream = ChunkStream::new(2).unwrap();
        let mut got = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            stream.push(&[*b]).unwrap();
            if let Some(c) = stream.next_chunk().unwrap() {
                got.push((i + 1, c));
            }
        }
        stream.finish().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, first.len());
        assert_eq!(got[1].0, bytes.len());
        assert!(got.iter().all(|(_, c)| c[..] == data[..]));
        assert!(matches!(
            stream.push(&[0]),
            Err(XorbError::Trailing { count: 2, extra: 1 })
        ));
        let mut cut = ChunkStream::new(2).unwrap();
        cut.push(&bytes[..first.len() + 3]).unwrap();
        assert!(cut.next_chunk().unwrap().is_some());
        assert!(cut.next_chunk().unwrap().is_none());
        assert!(matches!(
            cut.finish(),
            Err(XorbError::Truncated { index: 1, .. })
        ));
        let mut empty = ChunkStream::new(1).unwrap();
        empty.push(&chunk(0, b"", 0)).unwrap();
        assert!(matches!(
            empty.next_chunk(),
            Err(XorbError::BadHeader { .. })
        ));
    }

    /// Regression: nothing bounded a range's chunks in all, so a range of
    /// minimal LZ4 chunks (~520 bytes each, 128 KiB decoded) could decode
    /// to hundreds of times its size before the term's length was checked.
    #[test]
    fn a_range_claiming_more_than_a_xorb_holds_is_refused() {
        let zeros = lz4(&vec![0u8; MAX_CHUNK_BYTES]);
        let n = MAX_XORB_PLAIN_BYTES / MAX_CHUNK_BYTES + 1;
        let mut bomb = Vec::new();
        for _ in 0..n {
            bomb.extend(chunk(1, &zeros, MAX_CHUNK_BYTES));
        }
        assert!(bomb.len() < MAX_XORB_PLAIN_BYTES / 100, "{}", bomb.len());
        assert!(matches!(
            decode_chunks(&bomb, n),
            Err(XorbError::Oversized { .. })
        ));
        assert!(matches!(
            decode_chunks(&bomb, MAX_XORB_CHUNKS + 1),
            Err(XorbError::Oversized { .. })
        ));
    }

    #[test]
    fn a_header_claiming_more_than_a_chunk_or_a_wrong_length_is_refused() {
        let big = chunk(0, b"x", MAX_CHUNK_BYTES + 1);
        assert!(matches!(
            decode_chunks(&big, 1),
            Err(XorbError::BadHeader { .. })
        ));
        let short = chunk(1, &lz4(b"abc"), 4);
        assert!(matches!(
            decode_chunks(&short, 1),
            Err(XorbError::BadHeader { .. })
        ));
    }
}
