//! Why an object-storage request or its setup failed. Every message names
//! the object key (or the location, endpoint or file) and what was
//! expected; none carries a credential (they are registered with the
//! redaction point, and no variant holds one).

use std::path::PathBuf;

use ftpipe_fs::ErrorClass;

/// A `Result` with [`ObjStoreError`].
pub type Result<T, E = ObjStoreError> = std::result::Result<T, E>;

/// An object-storage failure.
#[derive(Debug, thiserror::Error)]
pub enum ObjStoreError {
    /// The `s3://BUCKET/PREFIX` argument is malformed.
    #[error("{given:?} is not an S3 location: {reason} (expected s3://BUCKET/PREFIX)")]
    BadLocation {
        /// What was given.
        given: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The endpoint URL is malformed or not allowed.
    #[error("S3 endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint, without any userinfo.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No credentials could be found, or a credentials file is malformed.
    #[error("S3 credentials: {reason}")]
    Credentials {
        /// What is missing or wrong (never a value).
        reason: String,
    },
    /// A shared credentials or config file could not be read.
    #[error("S3 credentials: reading {}: {source}", path.display())]
    CredentialsFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ftpipe_fs::bounded::BoundedReadError,
    },
    /// The client could not be built from the configuration.
    #[error("S3 client for bucket {bucket}: {source}")]
    Client {
        /// The bucket.
        bucket: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// A request failed (network, server error, refused credentials).
    #[error("S3 {op} of {key}: {source}")]
    Request {
        /// What was asked (`get`, `head`, `put`, `upload part`, ...).
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// A request made with the client of its own (the checksum HEAD)
    /// failed before an answer (network, timeout); the URL is left out (it
    /// holds the signature).
    #[error("S3 {op} of {key}: {source}")]
    Http {
        /// What was asked.
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// A request made with the client of its own was refused.
    #[error("S3 {op} of {key}: the server answered HTTP {status}")]
    Status {
        /// What was asked.
        op: &'static str,
        /// The object key, `s3://BUCKET/KEY`.
        key: String,
        /// The status.
        status: u16,
    },
    /// The object does not exist.
    #[error("S3 object {key} does not exist")]
    NotFound {
        /// The object key.
        key: String,
    },
    /// The object is larger than the most that is read of it.
    #[error("S3 object {key} has {size} bytes or more; at most {max} are read")]
    TooLarge {
        /// The object key.
        key: String,
        /// The size seen so far (or announced).
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A listing holds more objects than the most that are read of it.
    #[error("S3 prefix {prefix} holds more than {max} objects; at most {max} are listed")]
    TooManyObjects {
        /// The prefix listed, `s3://BUCKET/PREFIX`.
        prefix: String,
        /// The limit.
        max: usize,
    },
    /// A create-only put found an object already there.
    #[error("S3 object {key} already exists")]
    AlreadyExists {
        /// The object key.
        key: String,
    },
    /// A multipart upload id is no longer known to the server (completed,
    /// aborted, or expired by a lifecycle rule).
    #[error("S3 multipart upload of {key} is no longer known to the server: {source}")]
    UploadGone {
        /// The object key.
        key: String,
        /// The server's answer.
        #[source]
        source: object_store::Error,
    },
    /// An answer contradicts what was asked (no ETag, a range that is not
    /// the one asked).
    #[error("S3 {op} of {key}: {what}")]
    BadAnswer {
        /// The request.
        op: &'static str,
        /// The object key.
        key: String,
        /// What is wrong.
        what: String,
    },
}

impl ObjStoreError {
    /// What kind of failure this is: all of them are the user's to fix
    /// (a location, credentials, a server) or a re-run's to retry.
    pub fn class(&self) -> ErrorClass {
        match self {
            ObjStoreError::CredentialsFile { source, .. } => ErrorClass::of_chain(source),
            _ => ErrorClass::Failure,
        }
    }

    /// Whether retrying the same request may help: what `object_store`
    /// could not cure with its own retries (a dropped connection, a 5xx)
    /// may pass on a later attempt; a missing object, a refused
    /// credential or a malformed setup will not.
    pub fn is_transient(&self) -> bool {
        match self {
            ObjStoreError::Request { source, .. } => !matches!(
                source,
                object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }
            ),
            ObjStoreError::Http { .. } => true,
            ObjStoreError::Status { status, .. } => *status >= 500 || matches!(status, 408 | 429),
            _ => false,
        }
    }

    /// Whether this is the server answering a ranged get with the whole
    /// object (a `200` to a `Range`), which `object_store` refuses itself
    /// with an error it does not expose as a type: recognised by its
    /// message, the only mark it leaves.
    pub fn is_range_ignored(&self) -> bool {
        const NOT_PARTIAL: &str = "non-partial response when range requested";
        match self {
            ObjStoreError::Request { source, .. } => {
                let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(e) = cur {
                    if e.to_string().contains(NOT_PARTIAL) {
                        return true;
                    }
                    cur = e.source();
                }
                false
            }
            _ => false,
        }
    }

    /// A request's error, with its key, sorted into the variants a caller
    /// decides on (missing, already there, upload gone).
    pub(crate) fn request(op: &'static str, key: String, source: object_store::Error) -> Self {
        match source {
            object_store::Error::NotFound { .. } => ObjStoreError::NotFound { key },
            object_store::Error::AlreadyExists { .. } => ObjStoreError::AlreadyExists { key },
            source => ObjStoreError::Request { op, key, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(source: object_store::Error) -> ObjStoreError {
        ObjStoreError::Request {
            op: "get",
            key: "s3://b/k".into(),
            source,
        }
    }

    fn generic(message: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::other(message.to_owned())),
        }
    }

    #[test]
    fn a_200_to_a_range_is_recognised_and_a_refused_credential_is_not_transient() {
        let ignored = request(generic(
            "Received non-partial response when range requested",
        ));
        assert!(ignored.is_range_ignored());
        assert!(!request(generic("connection reset")).is_range_ignored());
        assert!(request(generic("connection reset")).is_transient());
        let denied = request(object_store::Error::PermissionDenied {
            path: "k".into(),
            source: Box::new(std::io::Error::other("403")),
        });
        assert!(!denied.is_transient());
        let gone = ObjStoreError::NotFound { key: "k".into() };
        assert!(!gone.is_transient() && !gone.is_range_ignored());
    }
}
