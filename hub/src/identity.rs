//! The three identities a hub gives a file, kept apart as distinct types.
//!
//! A git blob id is a SHA-1 over `blob <len>\0<content>`; an LFS oid is the
//! SHA-256 of the content; a Xet hash is a content-defined Merkle hash we
//! record but cannot recompute. They are never compared with one another:
//! LFS files are verified by SHA-256, small files by git blob id.

use sha1::Sha1;
use sha2::{Digest, Sha256};

use ftpipe_receipts::FileRow;

use crate::error::{HubError, Result};

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

macro_rules! hex_id {
    ($name:ident, $len:expr, $what:expr) => {
        #[doc = concat!("A validated ", $what, " (", stringify!($len), " lowercase hex digits).")]
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("Parses a ", $what, "; `None` unless it is ", stringify!($len), " hex digits.")]
            pub fn parse(s: &str) -> Option<Self> {
                let lower = s.to_ascii_lowercase();
                is_lower_hex(&lower, $len).then_some(Self(lower))
            }
            /// The hex text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

hex_id!(GitOid, 40, "git blob id");
hex_id!(LfsSha256, 64, "LFS content SHA-256");
hex_id!(XetHash, 64, "Xet content hash");
hex_id!(CommitId, 40, "git commit id");

/// What a downloaded file is verified against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// LFS file: SHA-256 of the content.
    Sha256(LfsSha256),
    /// Small file: git blob id of the content.
    GitBlob(GitOid),
}

impl Expected {
    /// `sha256` or `git-sha1`, as stored in receipts.
    pub fn kind(&self) -> &'static str {
        match self {
            Expected::Sha256(_) => "sha256",
            Expected::GitBlob(_) => "git-sha1",
        }
    }
    /// The expected hex digest.
    pub fn hex(&self) -> &str {
        match self {
            Expected::Sha256(h) => h.as_str(),
            Expected::GitBlob(h) => h.as_str(),
        }
    }
    /// A streaming hasher for a file of `size` bytes.
    pub fn hasher(&self, size: u64) -> IdentityHasher {
        match self {
            Expected::Sha256(_) => IdentityHasher::Sha256(Sha256::new()),
            Expected::GitBlob(_) => git_blob_hasher(size),
        }
    }
}

/// The hasher of a git blob id of `size` content bytes (the `blob SIZE\0`
/// header fed).
fn git_blob_hasher(size: u64) -> IdentityHasher {
    let mut h = Sha1::new();
    h.update(format!("blob {size}\0").as_bytes());
    IdentityHasher::GitBlob(h)
}

/// Streaming digest matching an [`Expected`] identity.
#[derive(Clone)]
pub enum IdentityHasher {
    /// SHA-256 of content.
    Sha256(Sha256),
    /// SHA-1 of the git blob header and content.
    GitBlob(Sha1),
}

impl IdentityHasher {
    /// Feeds content bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            IdentityHasher::Sha256(h) => h.update(bytes),
            IdentityHasher::GitBlob(h) => h.update(bytes),
        }
    }
    /// The hex digest.
    pub fn finish_hex(self) -> String {
        match self {
            IdentityHasher::Sha256(h) => hex::encode(h.finalize()),
            IdentityHasher::GitBlob(h) => hex::encode(h.finalize()),
        }
    }
}

/// Hashes the first `len` bytes of `file` into `hasher` (used to rebuild the
/// digest state of a resumed prefix, and by audit and adoption), reading
/// and hashing on two threads ([`ftpipe_fs::overlapped::read_prefix`]): the
/// re-hash is the whole cost of a resume.
pub fn hash_prefix(
    file: &mut std::fs::File,
    len: u64,
    hasher: &mut IdentityHasher,
) -> std::io::Result<()> {
    ftpipe_fs::overlapped::read_prefix(file, len, |bytes| hasher.update(bytes))
}

/// [`hash_prefix`] for a download's own `.part`, whose prefix is not in the
/// page cache (written past it, or left by a crash): read past the cache
/// too where `file` writes past it. On the bench VM a 2.15 GB prefix took
/// 4.36 s through the cache, cold.
pub fn hash_part_prefix(
    file: &ftpipe_fs::direct::DirectFile,
    len: u64,
    hasher: &mut IdentityHasher,
) -> std::io::Result<()> {
    ftpipe_fs::overlapped::read_prefix_direct(file, len, |bytes| hasher.update(bytes))
}

/// Hashes a whole file against `expected` and returns the hex digest. The
/// file is opened without following a link and must be a regular file:
/// every caller hashes a file ftpipe placed under `DIR`.
pub fn hash_file(
    path: &std::path::Path,
    expected: &Expected,
    size: u64,
) -> std::io::Result<String> {
    let mut file = ftpipe_fs::nofollow::open_read(path)?;
    let mut hasher = expected.hasher(size);
    hash_prefix(&mut file, size, &mut hasher)?;
    Ok(hasher.finish_hex())
}

/// The git blob id and the SHA-256 of the first `size` bytes of the file
/// at `path`, from one read: a file the hub stores in git is verified by
/// its blob id, and addressed by its SHA-256 where only that is kept (an
/// object store mirror). Opened as [`hash_file`] opens it.
pub fn git_blob_and_sha256(path: &std::path::Path, size: u64) -> std::io::Result<(String, String)> {
    let mut file = ftpipe_fs::nofollow::open_read(path)?;
    let mut git = git_blob_hasher(size);
    let mut sha = IdentityHasher::Sha256(Sha256::new());
    ftpipe_fs::overlapped::read_prefix(&mut file, size, |bytes| {
        git.update(bytes);
        sha.update(bytes);
    })?;
    Ok((git.finish_hex(), sha.finish_hex()))
}

/// The identity a listing row is verified against.
pub fn expected_identity(file: &FileRow) -> Result<Expected> {
    let bad = |what: &str| HubError::BadListing {
        path: file.path.clone(),
        problem: format!("stored {what} is invalid"),
    };
    Ok(match &file.lfs_sha256 {
        Some(sha) => Expected::Sha256(LfsSha256::parse(sha).ok_or_else(|| bad("lfs sha256"))?),
        None => Expected::GitBlob(GitOid::parse(&file.git_oid).ok_or_else(|| bad("git oid"))?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftpipe_fs::overlapped::READ_BUF;

    #[test]
    fn git_blob_and_sha256_of_hello_from_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hello");
        std::fs::write(&path, b"hello\n").unwrap();
        let (git, sha) = git_blob_and_sha256(&path, 6).unwrap();
        assert_eq!(git, "ce013625030ba8dba906f756967f9e9ca394464a");
        assert_eq!(
            sha,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert!(git_blob_and_sha256(&path, 7).is_err(), "a short file");
    }

    #[test]
    fn git_blob_id_of_hello() {
        // `printf 'hello\n' | git hash-object --stdin`
        let expected =
            Expected::GitBlob(GitOid::parse("ce013625030ba8dba906f756967f9e9ca394464a").unwrap());
        let mut h = expected.hasher(6);
        h.update(b"hello\n");
        assert_eq!(h.finish_hex(), expected.hex());
    }

    #[test]
    fn prefix_hash_equals_one_shot_hash_and_reports_short_files() {
        use std::io::Write;
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(3 * READ_BUF + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        file.write_all(&data).unwrap();
        for len in [0, 1, READ_BUF as u64, data.len() as u64 - 5] {
            let expected = Expected::Sha256(LfsSha256::parse(&"0".repeat(64)).unwrap());
            let mut streamed = expected.hasher(len);
            hash_prefix(&mut file, len, &mut streamed).unwrap();
            let mut one_shot = expected.hasher(len);
            one_shot.update(&data[..len as usize]);
            assert_eq!(streamed.finish_hex(), one_shot.finish_hex(), "prefix {len}");
        }
        let mut h = Expected::Sha256(LfsSha256::parse(&"0".repeat(64)).unwrap()).hasher(0);
        let err = hash_prefix(&mut file, data.len() as u64 + 1, &mut h).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn parse_rejects_wrong_length_and_non_hex() {
        assert!(GitOid::parse("abc").is_none());
        assert!(LfsSha256::parse(&"g".repeat(64)).is_none());
        assert!(XetHash::parse(&"*".repeat(64)).is_none());
        assert!(CommitId::parse(&"A".repeat(40)).is_some());
    }
}
