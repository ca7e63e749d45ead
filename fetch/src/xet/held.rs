//! Decoded chunks of a xorb range kept for the terms not yet handed on
//! that read them (a body's later terms; a split file's other ranges,
//! `share`). A v2 reconstruction names one fetch range per xorb (or a few),
//! shared by every term that reads that xorb, and the terms of one xorb
//! need not be adjacent: a new revision's changed tensors, far apart in
//! the file, are chunks of one new xorb between runs of old ones. Asked
//! once per term, such a range crossed the wire once per term.
//!
//! Invariant: a range is fetched once per reconstruction. While a term's
//! range is read, every chunk a term not yet handed on reads is kept here
//! (at most [`MAX_HELD_BYTES`]; past that a later term fetches its range
//! again), and a term whose chunks are all held is handed on from
//! memory. Its chunks were checked as they were decoded (the range's
//! length, each chunk's framing); they are hashed and recorded like any
//! fetched term's before they are handed on, with no compressed bytes of
//! their own (the range's bytes were counted once, by the term that read
//! it).

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;

use super::wire::Term;

/// Decoded bytes a body keeps for its later terms, at most.
pub const MAX_HELD_BYTES: u64 = 128 << 20;

/// Chunks kept by (xorb, chunk index).
#[derive(Default)]
pub(super) struct Held {
    chunks: HashMap<(String, u64), Bytes>,
    bytes: u64,
}

impl Held {
    /// Keeps chunk `index` of `xorb` when `wanted` holds it and the cap
    /// allows.
    pub(super) fn offer(&mut self, xorb: &str, index: u64, chunk: &Bytes, wanted: &[Range<u64>]) {
        if !wanted.iter().any(|r| r.contains(&index)) {
            return;
        }
        let len = chunk.len() as u64;
        let key = (xorb.to_owned(), index);
        if self.chunks.contains_key(&key) || self.bytes.saturating_add(len) > MAX_HELD_BYTES {
            return;
        }
        self.chunks.insert(key, chunk.clone());
        self.bytes += len;
    }

    /// `term`'s chunks when every one is held and they add up to its
    /// length; the held chunks outside `wanted` (what terms still to be
    /// handed on read) are let go.
    pub(super) fn take(&mut self, term: &Term, wanted: &[Range<u64>]) -> Option<Vec<Bytes>> {
        let chunks: Vec<Bytes> = (term.chunk_start..term.chunk_end)
            .map(|i| self.chunks.get(&(term.xorb.clone(), i)).cloned())
            .collect::<Option<_>>()?;
        let length: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        if length != term.length {
            return None;
        }
        for i in term.chunk_start..term.chunk_end {
            if !wanted.iter().any(|r| r.contains(&i))
                && let Some(c) = self.chunks.remove(&(term.xorb.clone(), i))
            {
                self.bytes -= c.len() as u64;
            }
        }
        Some(chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted_by(later: &[Term], xorb: &str) -> Vec<Range<u64>> {
        later
            .iter()
            .filter(|t| t.xorb == xorb)
            .map(|t| t.chunk_start..t.chunk_end)
            .collect()
    }

    fn term(xorb: &str, chunks: Range<u64>, length: u64) -> Term {
        Term::for_test(xorb, chunks, length)
    }

    #[test]
    fn only_chunks_a_later_term_reads_are_kept_and_let_go_once_read() {
        let later = [term("x", 2..4, 6), term("y", 0..1, 1), term("x", 3..4, 3)];
        let wanted = wanted_by(&later, "x");
        let mut held = Held::default();
        for i in 0..5u64 {
            held.offer("x", i, &Bytes::from(vec![i as u8; 3]), &wanted);
        }
        assert_eq!(held.bytes, 6, "chunks 2 and 3 only");
        assert!(
            held.take(&term("x", 1..3, 6), &wanted_by(&later[1..], "x"))
                .is_none()
        );
        assert!(
            held.take(&term("x", 2..4, 5), &wanted_by(&later[1..], "x"))
                .is_none()
        );
        let got = held
            .take(&term("x", 2..4, 6), &wanted_by(&later[1..], "x"))
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(held.bytes, 3, "chunk 3 is read again later");
        assert!(held.take(&term("x", 3..4, 3), &[]).is_some());
        assert_eq!((held.bytes, held.chunks.len()), (0, 0));
    }

    #[test]
    fn nothing_past_the_cap_is_kept() {
        let wanted = vec![0..2, 2..3];
        let mut held = Held::default();
        let big = Bytes::from(vec![0u8; (MAX_HELD_BYTES / 2) as usize + 1]);
        held.offer("x", 0, &big, &wanted);
        held.offer("x", 1, &big, &wanted);
        held.offer("x", 2, &Bytes::from_static(b"ab"), &wanted);
        assert_eq!(held.chunks.len(), 2);
        assert_eq!(held.bytes, big.len() as u64 + 2);
    }
}
