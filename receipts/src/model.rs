//! Plain rows of the state database. Byte counts are `u64` in Rust and
//! checked on the way in and out of SQLite's signed integers.

use serde::Serialize;

pub use crate::events::RunId;
use crate::events::{
    AttemptOutcome, CacheKind, CacheOutcome, DiscardReason, Placement, Stage, StageEvent,
};

/// The pinned revision of the repository being acquired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pin {
    /// Repository id, e.g. `acme/tiny-moe`.
    pub repo: String,
    /// The revision the user asked for (branch, tag or commit).
    pub revision: String,
    /// The 40-hex commit it resolved to; all later requests use it.
    pub commit: String,
    /// Endpoint origin (never carries credentials).
    pub endpoint: String,
}

/// The include/exclude globs a fetch selection was made with, in the
/// order given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SelectionGlobs {
    /// `--include` globs (every file when empty).
    pub include: Vec<String>,
    /// `--exclude` globs.
    pub exclude: Vec<String>,
}

/// One file of the pinned listing with its three distinct identities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileRow {
    /// Repository-relative path, validated before it reaches the database.
    pub path: String,
    /// Size in bytes from the listing (for LFS files, `lfs.size`).
    pub size: u64,
    /// Git blob id (SHA-1 of `blob <len>\0<content>`), or of the LFS pointer.
    pub git_oid: String,
    /// LFS content SHA-256 when the file lives in LFS.
    pub lfs_sha256: Option<String>,
    /// Xet content hash, recorded but not used for verification.
    pub xet_hash: Option<String>,
    /// Whether the include/exclude filters selected this file.
    pub selected: bool,
}

/// The ledger row of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerRow {
    /// Repository-relative path.
    pub path: String,
    /// Bytes the file must have.
    pub expected: u64,
    /// Durable watermark: body bytes appended by us and fsynced.
    pub committed: u64,
    /// Every body byte received, including discarded ones.
    pub transferred: u64,
    /// Bytes of a final file adopted after re-hashing.
    pub adopted: u64,
    /// Strong validator (ETag or Last-Modified) the watermark was built against.
    pub validator: Option<String>,
    /// Sum of all discards recorded for this file.
    pub discarded: u64,
    /// Bytes taken from a Hugging Face cache (a whole blob or a resume
    /// prefix) instead of the network.
    pub cache: u64,
}

/// A file of a Hugging Face cache looked at for a pinned file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheCandidate {
    /// Repository-relative path of the pinned file.
    pub path: String,
    /// The cache file (never a token; a path on the user's disk).
    pub cache_path: String,
    /// What kind of cache file it is.
    pub kind: CacheKind,
    /// What became of it.
    pub outcome: CacheOutcome,
    /// How it was placed, when it was.
    pub placement: Option<Placement>,
    /// Bytes adopted, resumed from, or found in the rejected file.
    pub bytes: u64,
    /// Why it was rejected (empty otherwise).
    pub detail: String,
}

/// One discard: bytes received and then thrown away, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscardRow {
    /// Repository-relative path.
    pub path: String,
    /// Why the bytes were dropped.
    pub reason: DiscardReason,
    /// How many bytes.
    pub bytes: u64,
    /// When.
    pub at: String,
}

/// One HTTP attempt at a file body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// Database id (0 until inserted).
    pub id: i64,
    /// Repository-relative path.
    pub path: String,
    /// Host that answered (never a full URL: query strings may hold signatures).
    pub host: String,
    /// First byte requested, when a Range was sent.
    pub range_start: Option<u64>,
    /// The If-Range validator sent.
    pub if_range: Option<String>,
    /// HTTP status received.
    pub status: Option<u16>,
    /// Content-Range received.
    pub content_range: Option<String>,
    /// ETag received.
    pub etag: Option<String>,
    /// Body bytes received in this attempt.
    pub body_bytes: u64,
    /// How it ended (`in_flight` until it does).
    pub outcome: AttemptOutcome,
    /// Error text for unsuccessful attempts.
    pub error: Option<String>,
    /// When the attempt started.
    pub started_at: String,
}

/// A receipt: the durable claim that a file is published and verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Receipt {
    /// Repository-relative path.
    pub path: String,
    /// Published size.
    pub size: u64,
    /// `sha256` (LFS content) or `git-sha1` (git blob id).
    pub digest_kind: String,
    /// Hex digest that was verified.
    pub digest: String,
    /// When it was published.
    pub completed_at: String,
    /// True when the file was found on disk and adopted after re-hashing.
    pub adopted: bool,
}

/// One stage event, in log order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageEventRow {
    /// Log position.
    pub id: i64,
    /// The run that appended it.
    pub run_id: RunId,
    /// The stage.
    pub stage: Stage,
    /// What happened to it.
    pub event: StageEvent,
    /// Free text (e.g. the error that failed the stage).
    pub detail: String,
    /// When.
    pub at: String,
}
