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
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The target volume ran out of space.
    #[error(
        "no space left on the volume holding {volume}: {still_needed} bytes still needed \
         ({committed} bytes of {path} are committed and kept; free space and re-run to resume)"
    )]
    NoSpace {
        volume: PathBuf,
        path: String,
        committed: u64,
        still_needed: u64,
    },
    /// Not enough free space before starting.
    #[error(
        "not enough free space on {volume}: {available} bytes available, {needed} bytes still needed"
    )]
    InsufficientSpace {
        volume: PathBuf,
        available: u64,
        needed: u64,
    },
    /// Offline (`HF_HUB_OFFLINE=1` or `--offline`) and this needs the hub.
    #[error("offline (HF_HUB_OFFLINE or --offline): {what} needs the network")]
    Offline { what: String },
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
        dir: PathBuf,
        cache: Option<PathBuf>,
        missing: Vec<String>,
        bytes: u64,
    },
    /// A network request failed before any response.
    #[error("request to {url} failed: {source}")]
    Http {
        url: String,
        /// Without its URL (`url` is the redacted one).
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a status we cannot use.
    #[error("{url} answered HTTP {status}{detail}")]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    /// A JSON response exceeded its size limit.
    #[error("response from {url} exceeds the limit of {limit} bytes")]
    OversizedResponse { url: String, limit: u64 },
    /// A JSON response did not parse.
    #[error("malformed JSON from {url}: {source}")]
    MalformedJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    /// A listing field failed validation.
    #[error("listing entry {path:?}: {problem}")]
    BadListing { path: String, problem: String },
    /// A path from a listing is unsafe, or a link or non-directory on disk
    /// lies on its way.
    #[error(transparent)]
    UnsafePath(#[from] ftpipe_fs::paths::PathError),
    /// Too many redirects.
    #[error("too many redirects (more than {limit}) fetching {path}")]
    TooManyRedirects { path: String, limit: usize },
    /// A header is missing, malformed or disagrees with the request.
    #[error("{path}: header {header} is {actual:?}, expected {expected}")]
    BadHeader {
        path: String,
        header: &'static str,
        expected: String,
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
        path: String,
        header: &'static str,
        expected: String,
        actual: String,
        what: &'static str,
    },
    /// The response body ended before the promised length.
    #[error("{path}: body ended at byte {received} of {expected} promised")]
    ShortBody {
        path: String,
        received: u64,
        expected: u64,
    },
    /// The response body is longer than the file.
    #[error("{path}: body runs past the expected size {expected}")]
    LongBody { path: String, expected: u64 },
    /// The body arrived slower than the minimum rate over the stall window.
    #[error(
        "{path}: stalled: {received} bytes in the last {window_secs:.0} s, below the minimum rate of {min_rate} bytes/s (--min-rate, --stall-secs)"
    )]
    Stalled {
        path: String,
        received: u64,
        window_secs: f64,
        min_rate: u64,
    },
    /// The server answers resume requests with `200` from byte 0 and no
    /// response delivered the whole file.
    #[error(
        "{path}: the server ignores Range (answered 200 from byte 0 to {ignored} resume request(s)) and no response delivered the whole file (at most {best} of {size} bytes); giving up after {attempts} attempts"
    )]
    RangeIgnored {
        path: String,
        ignored: u32,
        best: u64,
        size: u64,
        attempts: u32,
    },
    /// A read stalled longer than the per-read timeout or the body failed.
    #[error("{path}: body transfer failed after {received} bytes: {message}")]
    BodyFailed {
        path: String,
        received: u64,
        message: String,
    },
    /// The downloaded bytes do not match the pinned identity.
    #[error("{path}: {kind} digest mismatch: expected {expected}, got {actual} ({size} bytes)")]
    DigestMismatch {
        path: String,
        kind: &'static str,
        expected: String,
        actual: String,
        size: u64,
    },
    /// A file on disk conflicts with the pinned identity.
    #[error(
        "{path} exists on disk but conflicts with the pinned identity: {problem}; move it away or delete it, then re-run"
    )]
    Conflict { path: PathBuf, problem: String },
    /// The branch moved and the user did not allow a repin.
    #[error(
        "--revision {requested} differs from the pinned revision {pinned} (commit {commit}); pass --repin to change the pin"
    )]
    PinMismatch {
        requested: String,
        pinned: String,
        commit: String,
    },
    /// The output directory belongs to another repository.
    #[error("{dir} holds {pinned}, not {requested}")]
    OtherRepo {
        dir: PathBuf,
        pinned: String,
        requested: String,
    },
    /// No pin yet.
    #[error("{dir} has no pinned revision yet; run `ftpipe fetch` first")]
    NotPinned { dir: PathBuf },
    /// Invalid user input (glob, endpoint, token file).
    #[error("invalid {what}: {message}")]
    InvalidInput { what: &'static str, message: String },
    /// A broken invariant or a task that panicked or was cancelled: a bug,
    /// not bad input. Durable state stays consistent (nothing is recorded
    /// for the work that failed), so a re-run resumes.
    #[error(
        "internal error (a bug, please report it): {what}{}",
        source.as_ref().map_or_else(String::new, |s| format!(": {s}"))
    )]
    Internal {
        what: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A state file ftpipe wrote under `DIR/.ftpipe` does not parse: it
    /// was damaged or edited since.
    #[error("{path}: damaged state file (ftpipe wrote it; it was changed since): {source}")]
    MalformedState {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A state file ftpipe wrote parses but holds an impossible value.
    #[error("{path}: damaged state file (ftpipe wrote it; it was changed since): {problem}")]
    BadState { path: PathBuf, problem: String },
    /// A repository id or revision breaks the hub's naming rules.
    #[error("{message}")]
    BadName { message: String },
    /// Retries were exhausted for a file.
    #[error("{path}: giving up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        path: String,
        attempts: u32,
        last: Box<StageError>,
    },
    /// Several files failed.
    #[error("{failed} of {total} files failed; first: {first}")]
    Several {
        failed: usize,
        total: usize,
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
