//! Errors of the fetch stage. Each variant names the file, header or value
//! at fault and what was expected; what the hub's HTTP itself can fail with
//! is a [`HubError`](ftpipe_hub::HubError) inside [`FetchError::Hub`].

use std::path::PathBuf;

/// Everything fetching the pinned files can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The hub refused a request, or a response broke the protocol.
    #[error(transparent)]
    Hub(#[from] ftpipe_hub::HubError),
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
    /// A path from a listing is unsafe, or a link or non-directory on disk
    /// lies on its way.
    #[error(transparent)]
    UnsafePath(#[from] ftpipe_fs::paths::PathError),
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
    /// Retries were exhausted for a file.
    #[error("{path}: giving up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        /// The repo file that failed.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// The error of the last attempt.
        last: Box<FetchError>,
    },
    /// Several files failed.
    #[error("{failed} of {total} files failed; first: {first}")]
    Several {
        /// Files that failed.
        failed: usize,
        /// Files attempted.
        total: usize,
        /// The first file's error.
        first: Box<FetchError>,
    },
}

impl FetchError {
    /// Wraps an I/O error with the operation and path. A full disk
    /// (`ErrorKind::StorageFull`) stays the source, which is how the
    /// binary finds it anywhere in the chain (exit 5).
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FetchError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// A broken invariant (see [`FetchError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        FetchError::Internal {
            what: what.into(),
            source: None,
        }
    }

    /// A failed task join or another internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        FetchError::Internal {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }

    /// Whether retrying the same request can help.
    pub fn is_transient(&self) -> bool {
        match self {
            FetchError::Hub(e) => e.is_transient(),
            FetchError::Stalled { .. } => true,
            _ => false,
        }
    }
}

impl From<ftpipe_fs::FsError> for FetchError {
    fn from(e: ftpipe_fs::FsError) -> Self {
        match e {
            ftpipe_fs::FsError::Io { op, path, source } => FetchError::Io { op, path, source },
            ftpipe_fs::FsError::InsufficientSpace {
                volume,
                available,
                needed,
            } => FetchError::InsufficientSpace {
                volume,
                available,
                needed,
            },
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = FetchError> = std::result::Result<T, E>;
