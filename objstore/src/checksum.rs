//! The store's own checksum of an object, and what it proves.
//!
//! A checksum the store computed from the bytes it received (S3's
//! additional checksums: the client sends `x-amz-checksum-sha256` with a
//! put or a part, the store checks the bytes against it and keeps it) says
//! what the object holds; metadata sent with the object
//! (`x-amz-meta-ftpipe-sha256`) is only a claim. An object is reused only
//! when its store checksum is the one the local file's bytes give:
//!
//! - [`StoreChecksum::Sha256`]: the SHA-256 of the whole object (one put),
//!   compared with the file's SHA-256.
//! - [`StoreChecksum::OfParts`]: the SHA-256 over the concatenated binary
//!   SHA-256s of the object's parts in order (a multipart object, S3's
//!   `COMPOSITE` checksum `BASE64-N`), compared with the same digest over
//!   the file's parts at the part size the publisher uses, when the part
//!   count is the store's.
//!
//! Equal digests prove equal bytes (SHA-256's collision resistance: equal
//! part digests are equal parts); anything else proves nothing and the
//! object is written again.

use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type Sha256Digest = [u8; 32];

/// A checksum the store computed itself from the bytes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreChecksum {
    /// The SHA-256 of the whole object.
    Sha256(Sha256Digest),
    /// The SHA-256 over the SHA-256s of the object's `parts` parts, in
    /// part order.
    OfParts {
        /// The digest of the part digests.
        digest: Sha256Digest,
        /// How many parts the object was assembled from.
        parts: u64,
    },
}

impl StoreChecksum {
    /// The part count the checksum is over; `None` for a whole-object
    /// checksum.
    pub fn parts(&self) -> Option<u64> {
        match self {
            StoreChecksum::Sha256(_) => None,
            StoreChecksum::OfParts { parts, .. } => Some(*parts),
        }
    }

    /// Whether this checksum proves the object holds the bytes whose
    /// SHA-256 is `whole` (a whole-object checksum only).
    pub fn proves_whole(&self, whole: &Sha256Digest) -> bool {
        matches!(self, StoreChecksum::Sha256(d) if d == whole)
    }

    /// Whether this checksum proves the object holds the bytes whose parts
    /// have the SHA-256s `part_digests`, in order (a checksum over parts
    /// whose count is theirs only).
    pub fn proves_parts(&self, part_digests: &[Sha256Digest]) -> bool {
        match self {
            StoreChecksum::Sha256(_) => false,
            StoreChecksum::OfParts { digest, parts } => {
                u64::try_from(part_digests.len()).is_ok_and(|n| n == *parts)
                    && *digest == digest_of_parts(part_digests)
            }
        }
    }
}

impl std::fmt::Display for StoreChecksum {
    /// `sha256 HEX`, or `sha256 HEX over N parts`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |d: &Sha256Digest| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        match self {
            StoreChecksum::Sha256(d) => write!(f, "sha256 {}", hex(d)),
            StoreChecksum::OfParts { digest, parts } => {
                write!(f, "sha256 {} over {parts} parts", hex(digest))
            }
        }
    }
}

/// The SHA-256 of one part's bytes.
pub fn sha256_of(bytes: &[u8]) -> Sha256Digest {
    Sha256::digest(bytes).into()
}

/// The SHA-256 over the concatenated part digests, in order: what a store
/// reports as the checksum of an object assembled from those parts.
pub fn digest_of_parts(part_digests: &[Sha256Digest]) -> Sha256Digest {
    let mut h = Sha256::new();
    for d in part_digests {
        h.update(d);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_proves_only_the_bytes_it_was_computed_from() {
        let whole = sha256_of(b"abc");
        assert!(StoreChecksum::Sha256(whole).proves_whole(&whole));
        assert!(!StoreChecksum::Sha256(whole).proves_whole(&sha256_of(b"abd")));
        assert!(!StoreChecksum::Sha256(whole).proves_parts(&[whole]));

        let parts = [sha256_of(b"ab"), sha256_of(b"c")];
        let of_parts = StoreChecksum::OfParts {
            digest: digest_of_parts(&parts),
            parts: 2,
        };
        assert_eq!(of_parts.parts(), Some(2));
        assert!(of_parts.proves_parts(&parts));
        assert!(!of_parts.proves_parts(&[sha256_of(b"ab"), sha256_of(b"d")]));
        assert!(!of_parts.proves_parts(&parts[..1]));
        assert!(!of_parts.proves_whole(&whole));
        // The same digest claimed over another part count proves nothing.
        let miscounted = StoreChecksum::OfParts {
            digest: digest_of_parts(&parts),
            parts: 3,
        };
        assert!(!miscounted.proves_parts(&parts));
    }

    /// The composite S3 (and moto) report: base64 of SHA-256 over the
    /// binary part SHA-256s; computed here by hand for two known parts.
    #[test]
    fn the_digest_of_parts_is_sha256_over_the_binary_part_digests() {
        let a = sha256_of(b"a");
        let b = sha256_of(b"b");
        let mut joined = a.to_vec();
        joined.extend_from_slice(&b);
        assert_eq!(digest_of_parts(&[a, b]), sha256_of(&joined));
    }
}
