//! Errors of the stages. Each variant names the file, header or value at
//! fault and what was expected, so the binary can print one clear line.

use std::path::PathBuf;

/// Everything a stage can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] ftpipe_receipts::StoreError),
    /// A local filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation that failed (read, fsync, create, rename...).
        op: &'static str,
        /// The file or directory it failed on.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The target volume ran out of space.
    #[error(
        "no space left on the volume holding {volume}: {still_needed} bytes still needed \
         ({committed} bytes of {path} are committed and kept; free space and re-run to resume)"
    )]
    NoSpace {
        /// A directory on the volume that filled up.
        volume: PathBuf,
        /// The repo file being written when the volume filled up.
        path: String,
        /// Bytes of `path` already committed, kept for the resume.
        committed: u64,
        /// Bytes still to be written (of the file, or of the whole fetch).
        still_needed: u64,
    },
    /// Not enough free space before starting.
    #[error(
        "not enough free space on {volume}: {available} bytes available, {needed} bytes still needed"
    )]
    InsufficientSpace {
        /// A directory on the volume that lacks space.
        volume: PathBuf,
        /// Bytes free on the volume.
        available: u64,
        /// Bytes the remaining work still needs.
        needed: u64,
    },
    /// Offline (`HF_HUB_OFFLINE=1` or `--offline`) and this needs the hub.
    #[error("offline (HF_HUB_OFFLINE or --offline): {what} needs the network")]
    Offline {
        /// What needed the network (the request or file, and why).
        what: String,
    },
    /// Offline, and selected files are neither durable in DIR nor in the
    /// Hugging Face cache.
    #[error(
        "offline (HF_HUB_OFFLINE or --offline): {} selected file(s) ({bytes} bytes still needed) \
         are neither durable in {dir} nor in the Hugging Face cache{}: {}",
        missing.len(),
        match cache { Some(c) => format!(" {}", c.display()), None => " (none used)".into() },
        missing.join(", ")
    )]
    OfflineMissing {
        /// The output directory.
        dir: PathBuf,
        /// The Hugging Face cache root consulted, if any.
        cache: Option<PathBuf>,
        /// Repo paths of the selected files found in neither.
        missing: Vec<String>,
        /// Bytes of those files still needed.
        bytes: u64,
    },
    /// A network request failed before any response.
    #[error("request to {url} failed: {source}")]
    Http {
        /// The URL requested (redacted when it may carry credentials).
        url: String,
        /// Without its URL (`url` is the redacted one).
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a status we cannot use.
    #[error("{url} answered HTTP {status}{detail}")]
    Status {
        /// The URL requested (redacted when it may carry credentials).
        url: String,
        /// The HTTP status code received.
        status: u16,
        /// Extra context appended to the message (starts with its separator, or empty).
        detail: String,
    },
    /// A JSON response exceeded its size limit.
    #[error("response from {url} exceeds the limit of {limit} bytes")]
    OversizedResponse {
        /// The URL requested.
        url: String,
        /// The size limit in bytes.
        limit: u64,
    },
    /// A JSON response did not parse.
    #[error("malformed JSON from {url}: {source}")]
    MalformedJson {
        /// The URL requested.
        url: String,
        /// The JSON parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A listing field failed validation.
    #[error("listing entry {path:?}: {problem}")]
    BadListing {
        /// The repo path of the listing entry.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A path from a listing is unsafe, or a link or non-directory on disk
    /// lies on its way.
    #[error(transparent)]
    UnsafePath(#[from] ftpipe_fs::paths::PathError),
    /// Too many redirects.
    #[error("too many redirects (more than {limit}) fetching {path}")]
    TooManyRedirects {
        /// The repo file being fetched.
        path: String,
        /// The most redirects followed.
        limit: usize,
    },
    /// A header is missing, malformed or disagrees with the request.
    #[error("{path}: header {header} is {actual:?}, expected {expected}")]
    BadHeader {
        /// The repo file being fetched.
        path: String,
        /// The header's name.
        header: &'static str,
        /// What the header should say.
        expected: String,
        /// What it said (empty when missing or not ASCII).
        actual: String,
    },
    /// Hub metadata (`X-Repo-Commit`, `X-Linked-Size`, `X-Linked-Etag`)
    /// contradicts the pinned listing: the hub now serves a different file
    /// under the pinned commit. Not transient.
    #[error(
        "{path}: {what} mismatch: the hub's {header} is {actual:?} but the pinned identity is \
         {expected}; the file changed under the pinned commit, refusing it"
    )]
    PinContradicted {
        /// The repo file being fetched.
        path: String,
        /// The header (`X-Repo-Commit`, `X-Linked-Size`, `X-Linked-Etag`).
        header: &'static str,
        /// What the pin says.
        expected: String,
        /// What the header says.
        actual: String,
        /// What the header describes (`commit`, `size`, `sha256 digest`).
        what: &'static str,
    },
    /// The response body ended before the promised length.
    #[error("{path}: body ended at byte {received} of {expected} promised")]
    ShortBody {
        /// The repo file being fetched.
        path: String,
        /// Bytes received before the body ended.
        received: u64,
        /// Bytes the response promised.
        expected: u64,
    },
    /// The response body is longer than the file.
    #[error("{path}: body runs past the expected size {expected}")]
    LongBody {
        /// The repo file being fetched.
        path: String,
        /// The expected size in bytes.
        expected: u64,
    },
    /// The body arrived slower than the minimum rate over the stall window.
    #[error(
        "{path}: stalled: {received} bytes in the last {window_secs:.0} s, below the minimum rate of {min_rate} bytes/s (--min-rate, --stall-secs)"
    )]
    Stalled {
        /// The repo file being fetched.
        path: String,
        /// Bytes received during the last window.
        received: u64,
        /// The stall window in seconds (`--stall-secs`).
        window_secs: f64,
        /// The minimum rate in bytes per second (`--min-rate`).
        min_rate: u64,
    },
    /// The server answers resume requests with `200` from byte 0 and no
    /// response delivered the whole file.
    #[error(
        "{path}: the server ignores Range (answered 200 from byte 0 to {ignored} resume request(s)) and no response delivered the whole file (at most {best} of {size} bytes); giving up after {attempts} attempts"
    )]
    RangeIgnored {
        /// The repo file being fetched.
        path: String,
        /// Resume requests answered with `200` from byte 0.
        ignored: u32,
        /// The most bytes of the file committed by any response.
        best: u64,
        /// The file's size in bytes.
        size: u64,
        /// Attempts made before giving up.
        attempts: u32,
    },
    /// A read stalled longer than the per-read timeout or the body failed.
    #[error("{path}: body transfer failed after {received} bytes: {message}")]
    BodyFailed {
        /// The repo file being fetched.
        path: String,
        /// Bytes received before the failure.
        received: u64,
        /// The transfer error's text.
        message: String,
    },
    /// The downloaded bytes do not match the pinned identity.
    #[error("{path}: {kind} digest mismatch: expected {expected}, got {actual} ({size} bytes)")]
    DigestMismatch {
        /// The repo file whose bytes were hashed.
        path: String,
        /// The digest algorithm (`sha256` for LFS files, `git-sha1` otherwise).
        kind: &'static str,
        /// The pinned digest (hex).
        expected: String,
        /// The digest of the downloaded bytes (hex).
        actual: String,
        /// Bytes hashed.
        size: u64,
    },
    /// A file on disk conflicts with the pinned identity.
    #[error(
        "{path} exists on disk but conflicts with the pinned identity: {problem}; move it away or delete it, then re-run"
    )]
    Conflict {
        /// The conflicting file on disk.
        path: PathBuf,
        /// How it conflicts with the pin.
        problem: String,
    },
    /// The branch moved and the user did not allow a repin.
    #[error(
        "--revision {requested} differs from the pinned revision {pinned} (commit {commit}); pass --repin to change the pin"
    )]
    PinMismatch {
        /// The `--revision` given.
        requested: String,
        /// The revision the directory is pinned to.
        pinned: String,
        /// The commit id of the pin.
        commit: String,
    },
    /// The output directory belongs to another repository.
    #[error("{dir} holds {pinned}, not {requested}")]
    OtherRepo {
        /// Where the other pin is stored (the directory's state database).
        dir: PathBuf,
        /// The repository it is pinned to.
        pinned: String,
        /// The repository requested.
        requested: String,
    },
    /// No pin yet.
    #[error("{dir} has no pinned revision yet; run `ftpipe fetch` first")]
    NotPinned {
        /// The output directory.
        dir: PathBuf,
    },
    /// Invalid user input (glob, endpoint, token file).
    #[error("invalid {what}: {message}")]
    InvalidInput {
        /// Which input is invalid (glob, endpoint, url, file...).
        what: &'static str,
        /// Why it is invalid.
        message: String,
    },
    /// A broken invariant or a task that panicked or was cancelled: a bug,
    /// not bad input. Durable state stays consistent (nothing is recorded
    /// for the work that failed), so a re-run resumes.
    #[error(
        "internal error (a bug, please report it): {what}{}",
        source.as_ref().map_or_else(String::new, |s| format!(": {s}"))
    )]
    Internal {
        /// The invariant or task that failed.
        what: String,
        /// The cause, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A state file ftpipe wrote under `DIR/.ftpipe` does not parse: it
    /// was damaged or edited since.
    #[error("{path}: damaged state file (ftpipe wrote it; it was changed since): {source}")]
    MalformedState {
        /// The state file.
        path: PathBuf,
        /// The JSON parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A state file ftpipe wrote parses but holds an impossible value.
    #[error("{path}: damaged state file (ftpipe wrote it; it was changed since): {problem}")]
    BadState {
        /// The state file.
        path: PathBuf,
        /// The impossible value and why.
        problem: String,
    },
    /// A repository id or revision breaks the hub's naming rules.
    #[error("{message}")]
    BadName {
        /// Which name breaks which rule.
        message: String,
    },
    /// Retries were exhausted for a file.
    #[error("{path}: giving up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        /// The repo file that failed.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// The error of the last attempt.
        last: Box<StageError>,
    },
    /// Several files failed.
    #[error("{failed} of {total} files failed; first: {first}")]
    Several {
        /// Files that failed.
        failed: usize,
        /// Files attempted.
        total: usize,
        /// The first file's error.
        first: Box<StageError>,
    },
    /// Planning or converting the source checkpoint failed.
    #[error(transparent)]
    Convert(#[from] crate::convert::ConvertError),
    /// Reading, hashing or verifying the artifact failed.
    #[error(transparent)]
    Artifact(#[from] ftpipe_artifact::ArtifactError),
}

impl StageError {
    /// Wraps an I/O error with the operation and path. A full disk
    /// (`ErrorKind::StorageFull`) stays the source, which is how the
    /// binary finds it anywhere in the chain (exit 5).
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StageError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// A broken invariant (see [`StageError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        StageError::Internal {
            what: what.into(),
            source: None,
        }
    }

    /// A failed task join or another internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StageError::Internal {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }

    /// Whether retrying the same request can help.
    pub fn is_transient(&self) -> bool {
        match self {
            StageError::Http { .. }
            | StageError::ShortBody { .. }
            | StageError::BodyFailed { .. }
            | StageError::BadHeader { .. }
            | StageError::LongBody { .. }
            | StageError::Stalled { .. }
            | StageError::TooManyRedirects { .. } => true,
            // 206 here means "206 to a request without Range": a lying
            // response like a wrong Content-Range (nothing was appended), so
            // it is retried like one instead of failing the file for good.
            StageError::Status { status, .. } => {
                *status == 206
                    || *status == 408
                    || *status == 416
                    || *status == 429
                    || *status >= 500
            }
            _ => false,
        }
    }
}

impl From<crate::convert::RecipeError> for StageError {
    fn from(e: crate::convert::RecipeError) -> Self {
        StageError::Convert(e.into())
    }
}

impl From<ftpipe_fs::FsError> for StageError {
    fn from(e: ftpipe_fs::FsError) -> Self {
        match e {
            ftpipe_fs::FsError::Io { op, path, source } => StageError::Io { op, path, source },
            ftpipe_fs::FsError::InsufficientSpace {
                volume,
                available,
                needed,
            } => StageError::InsufficientSpace {
                volume,
                available,
                needed,
            },
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = StageError> = std::result::Result<T, E>;
