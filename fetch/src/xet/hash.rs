//! Xet hashing (xet-core's `merklehash`, written against its spec and
//! checked against files the reference uploader `hf_xet` hashed): a chunk's
//! hash is BLAKE3 keyed with the data key; a file's hash is the Merkle
//! aggregation of its chunks' `(hash, size)` pairs, keyed again with a
//! zero salt. Hashes are written as xet-core prints them: each 8-byte
//! quarter as a little-endian `u64` in 16 hex digits.

/// The key of a chunk's hash (xet-core `DATA_KEY`).
const DATA_KEY: [u8; 32] = [
    102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28, 157, 228, 33, 16,
    155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41,
];

/// The key of an interior node's hash (xet-core `INTERNAL_NODE_HASH`).
const INTERNAL_NODE_KEY: [u8; 32] = [
    1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230, 93, 221, 83, 111, 55,
    199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63,
];

/// Mean branching factor of the aggregation tree; a node closes after at
/// least 2 children at a child whose hash is 0 modulo it, or at 9.
const BRANCHING: u64 = 4;
const MAX_GROUP: usize = 2 * BRANCHING as usize + 1;

/// A 32-byte Xet hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct XetDigest(pub [u8; 32]);

impl XetDigest {
    /// The hash of one chunk's bytes.
    pub fn of_chunk(bytes: &[u8]) -> XetDigest {
        XetDigest(*blake3::keyed_hash(&DATA_KEY, bytes).as_bytes())
    }

    fn quarter(&self, i: usize) -> u64 {
        let mut q = [0u8; 8];
        q.copy_from_slice(&self.0[i * 8..i * 8 + 8]);
        u64::from_le_bytes(q)
    }

    /// The hash as xet-core prints it (64 hex digits).
    pub fn hex(&self) -> String {
        (0..4)
            .map(|i| format!("{:016x}", self.quarter(i)))
            .collect()
    }

    /// Reads [`XetDigest::hex`]'s form (`None` unless 64 hex digits).
    pub fn parse(hex: &str) -> Option<XetDigest> {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 32];
        for i in 0..4 {
            let q = u64::from_str_radix(hex.get(i * 16..i * 16 + 16)?, 16).ok()?;
            out[i * 8..i * 8 + 8].copy_from_slice(&q.to_le_bytes());
        }
        Some(XetDigest(out))
    }
}

/// Where the next node of `nodes` closes (xet-core `next_merge_cut`).
fn next_cut(nodes: &[(XetDigest, u64)]) -> usize {
    if nodes.len() <= 2 {
        return nodes.len();
    }
    let end = MAX_GROUP.min(nodes.len());
    (2..end)
        .find(|&i| nodes[i].0.quarter(3).is_multiple_of(BRANCHING))
        .map_or(end, |i| i + 1)
}

/// One interior node: the keyed hash of `"{hash} : {size}\n"` per child.
fn merged(nodes: &[(XetDigest, u64)]) -> (XetDigest, u64) {
    let mut text = String::with_capacity(nodes.len() * 88);
    let mut total = 0u64;
    for (h, size) in nodes {
        text.push_str(&h.hex());
        text.push_str(" : ");
        text.push_str(&size.to_string());
        text.push('\n');
        total = total.wrapping_add(*size);
    }
    let digest = blake3::keyed_hash(&INTERNAL_NODE_KEY, text.as_bytes());
    (XetDigest(*digest.as_bytes()), total)
}

/// The file hash of a file made of `chunks` (`(hash, size)` in order); the
/// empty file's is all zeros.
pub fn file_hash(chunks: &[(XetDigest, u64)]) -> XetDigest {
    if chunks.is_empty() {
        return XetDigest::default();
    }
    let mut level = chunks.to_vec();
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len() / 2 + 1);
        let mut at = 0;
        while at < level.len() {
            let cut = at + next_cut(&level[at..]);
            next.push(merged(&level[at..cut]));
            at = cut;
        }
        level = next;
    }
    XetDigest(*blake3::keyed_hash(&[0u8; 32], &level[0].0.0).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_reads_back_as_it_prints() {
        let h = XetDigest::of_chunk(b"abc");
        assert_eq!(XetDigest::parse(&h.hex()), Some(h));
        assert!(XetDigest::parse("zz").is_none());
    }

    /// A one-chunk file has no interior node: its hash is the chunk's,
    /// keyed with the zero salt. (Many-chunk files are checked against
    /// `hf_xet`'s hashes in the e2e tests.)
    #[test]
    fn one_chunk_file_hash_is_the_salted_chunk_hash() {
        let h = XetDigest::of_chunk(b"hello");
        let want = XetDigest(*blake3::keyed_hash(&[0u8; 32], &h.0).as_bytes());
        assert_eq!(file_hash(&[(h, 5)]), want);
    }
}
