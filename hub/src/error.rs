//! Errors of the hub client and resolve. Each variant names the URL,
//! header, listing entry or value at fault and what was expected, so the
//! binary can print one clear line.

use std::path::PathBuf;

use crate::says::HubSays;

use ftpipe_fs::ErrorClass;

/// Everything talking to the hub (or reading a pinned file's bytes through
/// it) can fail with.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] ftpipe_receipts::StoreError),
    /// A local filesystem operation failed.
    #[error(transparent)]
    Io(#[from] ftpipe_fs::IoError),
    /// Offline (`HF_HUB_OFFLINE=1` or `--offline`) and this needs the hub.
    #[error("offline (HF_HUB_OFFLINE or --offline): {what} needs the network")]
    Offline {
        /// What needed the network (the request or file, and why).
        what: String,
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
    #[error("{url} answered HTTP {status}{detail}{hub}")]
    Status {
        /// The URL requested (redacted when it may carry credentials).
        url: String,
        /// The HTTP status code received.
        status: u16,
        /// Extra context appended to the message (starts with its separator, or empty).
        detail: String,
        /// The hub's `X-Error-Code` / `X-Error-Message` (bounded, redacted).
        hub: HubSays,
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
    /// `--revision` named a full commit and the hub answered with another.
    #[error(
        "--revision {requested} names a commit, but the hub resolved it to commit {answered}; \
         refusing to pin another commit than the one asked for (check the repo id, the \
         endpoint, and that no branch or tag is named like this commit)"
    )]
    RevisionNotHonoured {
        /// The 40-hex commit asked for.
        requested: String,
        /// The commit the hub (or mirror) answered.
        answered: String,
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
    /// A repository id or revision breaks the hub's naming rules.
    #[error("{message}")]
    BadName {
        /// Which name breaks which rule.
        message: String,
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
}

impl HubError {
    /// Wraps an I/O error with the operation and path. A full disk
    /// (`ErrorKind::StorageFull`) stays the source, which is how the
    /// binary finds it anywhere in the chain (exit 5).
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HubError::Io(ftpipe_fs::IoError::new(op, path, source))
    }

    /// A broken invariant (see [`HubError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        HubError::Internal(ftpipe_fs::InternalError::new(what))
    }

    /// A failed task join or another internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        HubError::Internal(ftpipe_fs::InternalError::with_source(what, source))
    }

    /// This error's [`ErrorClass`]: a bug is [`ErrorClass::Internal`], a
    /// full disk (the store's, or an I/O error's anywhere in the chain)
    /// [`ErrorClass::NoSpace`], everything else (network, status, listing,
    /// input) [`ErrorClass::Failure`].
    pub fn class(&self) -> ErrorClass {
        match self {
            HubError::Internal(_) => ErrorClass::Internal,
            HubError::Store(e) => e.class(),
            _ => ErrorClass::of_chain(self),
        }
    }

    /// Why a request got no answer at all, when this is such a failure.
    pub fn unreachable(&self) -> Option<Unreachable> {
        let HubError::Http { source, .. } = self else {
            return None;
        };
        if source.is_timeout() {
            return Some(Unreachable::Timeout);
        }
        if !source.is_connect() {
            return None;
        }
        Some(unreachable_kind(source))
    }

    /// Whether retrying the same request can help.
    pub fn is_transient(&self) -> bool {
        match self {
            HubError::Http { .. }
            | HubError::ShortBody { .. }
            | HubError::BodyFailed { .. }
            | HubError::BadHeader { .. }
            | HubError::LongBody { .. }
            | HubError::TooManyRedirects { .. } => true,
            // 206 here means "206 to a request without Range": a lying
            // response like a wrong Content-Range (nothing was appended), so
            // it is retried like one instead of failing the file for good.
            HubError::Status { status, .. } => {
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

/// Why a request to the hub got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreachable {
    /// Nothing listens at the endpoint's address (connection refused).
    Refused,
    /// The endpoint's host name does not resolve.
    NameNotResolved,
    /// No connection or no answer within the timeout.
    Timeout,
    /// The connection failed otherwise (TLS, unreachable network, reset).
    Other,
}

/// Tells a refused connection and an unresolvable name apart from other
/// connect failures. The resolver's error is private to the HTTP stack and
/// says `dns error` in its text; a refusal is an io error of its kind.
fn unreachable_kind(err: &reqwest::Error) -> Unreachable {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return Unreachable::Refused;
        }
        if c.to_string().starts_with("dns error") {
            return Unreachable::NameNotResolved;
        }
        cause = c.source();
    }
    Unreachable::Other
}

impl From<ftpipe_fs::FsError> for HubError {
    fn from(e: ftpipe_fs::FsError) -> Self {
        match e {
            ftpipe_fs::FsError::Io(e) => HubError::Io(e),
            other @ ftpipe_fs::FsError::InsufficientSpace(_) => {
                HubError::internal_from("a space check in the hub client", other)
            }
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = HubError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(HubError::internal("x").class(), ErrorClass::Internal);
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(
            HubError::io("write", "x", full).class(),
            ErrorClass::NoSpace
        );
        let store = HubError::Store(ftpipe_receipts::StoreError::Unsafe {
            path: "state.db".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert_eq!(store.class(), ErrorClass::NoSpace);
        let input = HubError::InvalidInput {
            what: "glob",
            message: "x".into(),
        };
        assert_eq!(input.class(), ErrorClass::Failure);
        let status = HubError::Status {
            url: "u".into(),
            status: 404,
            detail: String::new(),
            hub: HubSays::default(),
        };
        assert_eq!(status.class(), ErrorClass::Failure);
    }
}
