//! Errors of the fetch stage. Each variant names the file, header or value
//! at fault and what was expected; what the hub's HTTP itself can fail with
//! is a [`HubError`](ftpipe_hub::HubError) inside [`FetchError::Hub`].

use std::path::PathBuf;

use ftpipe_fs::ErrorClass;

/// Everything fetching the pinned files can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The hub refused a request, or a response broke the protocol.
    #[error(transparent)]
    Hub(#[from] ftpipe_hub::HubError),
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] ftpipe_receipts::StoreError),
    /// A byte source other than the hub failed (object storage, ...): its
    /// own error, with whether a retry may help and its class.
    #[error(transparent)]
    Source(SourceFailure),
    /// A local filesystem operation failed.
    #[error(transparent)]
    Io(#[from] ftpipe_fs::IoError),
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
    #[error(transparent)]
    InsufficientSpace(#[from] ftpipe_fs::InsufficientSpace),
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
    /// not bad input.
    #[error(transparent)]
    Internal(#[from] ftpipe_fs::InternalError),
    /// Retries were exhausted for a file. Its class is the last error's.
    #[error("{path}: giving up after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        /// The repo file that failed.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// The error of the last attempt (the source, so its class and its
        /// own causes are seen through this one).
        #[source]
        last: Box<FetchError>,
    },
    /// Several files failed. Its class is the most severe of the files'
    /// ([`FetchError::several`] keeps that file's error).
    #[error("{failed} of {total} files failed; the most severe: {worst}")]
    Several {
        /// Files that failed.
        failed: usize,
        /// Files attempted.
        total: usize,
        /// The first error of the most severe class among the files'
        /// (the source, so its class and causes are seen through this one).
        #[source]
        worst: Box<FetchError>,
    },
}

impl FetchError {
    /// Wraps an I/O error with the operation and path. A full disk
    /// (`ErrorKind::StorageFull`) stays the source, which is how the
    /// binary finds it anywhere in the chain (exit 5).
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FetchError::Io(ftpipe_fs::IoError::new(op, path, source))
    }

    /// A broken invariant (see [`FetchError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        FetchError::Internal(ftpipe_fs::InternalError::new(what))
    }

    /// A failed task join or another internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        FetchError::Internal(ftpipe_fs::InternalError::with_source(what, source))
    }

    /// The errors of several failed files as one: [`FetchError::Several`]
    /// keeping the first error of the most severe class (so two panicked
    /// tasks are still [`ErrorClass::Internal`], and a full disk is not
    /// hidden behind a network error of another file), or the one error
    /// when there is only one. `None` when `errors` is empty.
    pub fn several(total: usize, errors: Vec<FetchError>) -> Option<FetchError> {
        let failed = errors.len();
        let mut worst: Option<FetchError> = None;
        for e in errors {
            if worst.as_ref().is_none_or(|w| e.class() > w.class()) {
                worst = Some(e);
            }
        }
        let worst = worst?;
        Some(if failed == 1 {
            worst
        } else {
            FetchError::Several {
                failed,
                total,
                worst: Box::new(worst),
            }
        })
    }

    /// This error's [`ErrorClass`]: a bug is [`ErrorClass::Internal`]; a
    /// full disk ([`FetchError::NoSpace`], a failed preflight, the store's
    /// `SQLITE_FULL`, an I/O error's `ENOSPC` anywhere in the chain)
    /// [`ErrorClass::NoSpace`]; an aggregate the most severe of its parts;
    /// everything else (network, pin contradicted, a digest the hub's bytes
    /// do not match, conflicts, input) [`ErrorClass::Failure`]. A download
    /// whose digest differs is the hub serving wrong bytes, retried like a
    /// network fault; [`ErrorClass::Verification`] is for a finished
    /// artifact that fails verification (README, exit 6).
    pub fn class(&self) -> ErrorClass {
        match self {
            FetchError::Internal(_) => ErrorClass::Internal,
            FetchError::NoSpace { .. } | FetchError::InsufficientSpace(_) => ErrorClass::NoSpace,
            FetchError::Hub(e) => e.class(),
            FetchError::Store(e) => e.class(),
            FetchError::Source(e) => e.class,
            FetchError::RetriesExhausted { last, .. } => last.class(),
            FetchError::Several { worst, .. } => worst.class(),
            FetchError::Io(_)
            | FetchError::OfflineMissing { .. }
            | FetchError::UnsafePath(_)
            | FetchError::PinContradicted { .. }
            | FetchError::Stalled { .. }
            | FetchError::RangeIgnored { .. }
            | FetchError::DigestMismatch { .. }
            | FetchError::Conflict { .. }
            | FetchError::InvalidInput { .. } => ErrorClass::of_chain(self),
        }
    }

    /// The hub's error this one is or carries (through a retried file's
    /// last attempt, or the most severe of several files), if any.
    pub fn hub(&self) -> Option<&ftpipe_hub::HubError> {
        match self {
            FetchError::Hub(e) => Some(e),
            FetchError::RetriesExhausted { last, .. } => last.hub(),
            FetchError::Several { worst, .. } => worst.hub(),
            _ => None,
        }
    }

    /// Whether retrying the same request can help.
    pub fn is_transient(&self) -> bool {
        match self {
            FetchError::Hub(e) => e.is_transient(),
            FetchError::Stalled { .. } => true,
            FetchError::Source(e) => e.transient,
            _ => false,
        }
    }
}

/// A byte source's failure in no transport's terms: the source's own
/// error (its message and causes shown as they are), whether retrying the
/// same request may help, and its class. The source decides both.
#[derive(Debug)]
pub struct SourceFailure {
    /// Whether a later attempt may succeed (a dropped connection, a
    /// server error), or not (a missing object, a refused credential).
    pub transient: bool,
    /// Its class (exit code).
    pub class: ErrorClass,
    /// The source's error.
    pub error: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for SourceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// Transparent: the source's error stands for itself, its causes follow.
impl std::error::Error for SourceFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl From<ftpipe_fs::FsError> for FetchError {
    fn from(e: ftpipe_fs::FsError) -> Self {
        match e {
            ftpipe_fs::FsError::Io(e) => FetchError::Io(e),
            ftpipe_fs::FsError::InsufficientSpace(e) => FetchError::InsufficientSpace(e),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = FetchError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn panicked() -> FetchError {
        FetchError::internal_from("fetch task", std::io::Error::other("task panicked"))
    }

    fn network() -> FetchError {
        FetchError::Stalled {
            path: "a".into(),
            received: 0,
            window_secs: 1.0,
            min_rate: 1,
        }
    }

    fn full() -> FetchError {
        FetchError::io("write", "b.part", std::io::ErrorKind::StorageFull.into())
    }

    /// Regression: `Several` and `RetriesExhausted` did not keep their
    /// inner error as `#[source]`, and the binary's exit code looked at
    /// neither, so two panicked fetch tasks exited 1 where one exited 7.
    #[test]
    fn aggregates_take_the_most_severe_part_and_keep_it_as_source() {
        let two = FetchError::several(3, vec![panicked(), panicked()]).unwrap();
        assert!(matches!(
            two,
            FetchError::Several {
                failed: 2,
                total: 3,
                ..
            }
        ));
        assert_eq!(two.class(), ErrorClass::Internal);
        let source = std::error::Error::source(&two).expect("the part is the source");
        assert!(source.to_string().contains("task panicked"), "{source}");
        assert!(two.to_string().ends_with(&source.to_string()), "{two}");

        // The most severe wins whatever the order; among equals, the first.
        let mixed = FetchError::several(4, vec![network(), full(), panicked(), full()]).unwrap();
        assert_eq!(mixed.class(), ErrorClass::Internal);
        let mixed = FetchError::several(4, vec![network(), full()]).unwrap();
        assert_eq!(mixed.class(), ErrorClass::NoSpace);
        assert!(mixed.to_string().contains("b.part"), "{mixed}");
        let plain = FetchError::several(2, vec![network(), network()]).unwrap();
        assert_eq!(plain.class(), ErrorClass::Failure);

        let one = FetchError::several(2, vec![panicked()]).unwrap();
        assert!(matches!(one, FetchError::Internal(_)));
        assert!(FetchError::several(2, Vec::new()).is_none());

        let retried = FetchError::RetriesExhausted {
            path: "a".into(),
            attempts: 3,
            last: Box::new(full()),
        };
        assert_eq!(retried.class(), ErrorClass::NoSpace);
        let source = std::error::Error::source(&retried).expect("last is the source");
        assert!(
            retried.to_string().ends_with(&source.to_string()),
            "{retried}"
        );
        let retried = FetchError::RetriesExhausted {
            path: "a".into(),
            attempts: 3,
            last: Box::new(network()),
        };
        assert_eq!(retried.class(), ErrorClass::Failure);
    }

    #[test]
    fn a_source_failure_is_as_transient_and_as_severe_as_its_source_says() {
        let failure = |transient, class| {
            FetchError::Source(SourceFailure {
                transient,
                class,
                error: Box::new(std::io::Error::other("object gone")),
            })
        };
        let gone = failure(false, ErrorClass::Failure);
        assert!(!gone.is_transient());
        assert_eq!(gone.to_string(), "object gone");
        assert!(failure(true, ErrorClass::Failure).is_transient());
        assert_eq!(
            failure(false, ErrorClass::NoSpace).class(),
            ErrorClass::NoSpace
        );
    }

    #[test]
    fn classes_of_the_leaves() {
        assert_eq!(panicked().class(), ErrorClass::Internal);
        assert_eq!(full().class(), ErrorClass::NoSpace);
        assert_eq!(network().class(), ErrorClass::Failure);
        let hub = FetchError::Hub(ftpipe_hub::HubError::internal("x"));
        assert_eq!(hub.class(), ErrorClass::Internal);
        let preflight = FetchError::from(ftpipe_fs::FsError::InsufficientSpace(
            ftpipe_fs::InsufficientSpace {
                volume: "v".into(),
                available: 1,
                needed: 2,
            },
        ));
        assert_eq!(preflight.class(), ErrorClass::NoSpace);
        let input = FetchError::InvalidInput {
            what: "glob",
            message: "x".into(),
        };
        assert_eq!(input.class(), ErrorClass::Failure);
        let denied = FetchError::io("open", "x", std::io::ErrorKind::PermissionDenied.into());
        assert_eq!(denied.class(), ErrorClass::Failure);
    }
}
