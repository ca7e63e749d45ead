//! The errors every crate of ftpipe shares instead of re-declaring them:
//! [`IoError`] (a filesystem operation with its path, the underlying I/O
//! error kept as the source, so a full disk is recognised by walking the
//! chain), [`InsufficientSpace`] (a failed free-space preflight) and
//! [`InternalError`] (a bug). Each crate's error enum wraps them
//! (`#[error(transparent)]`), so their text is the same everywhere.
//! [`FsError`] is what this crate's own operations fail with.

use std::path::PathBuf;

use crate::class::ErrorClass;

/// A filesystem operation that failed, with the path it was applied to.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct IoError {
    /// The operation (`create`, `write`, `fsync`, `rename`, ...).
    pub op: &'static str,
    /// The path it was applied to.
    pub path: PathBuf,
    /// The underlying error.
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    /// Wraps an I/O error with the operation and path.
    pub fn new(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IoError {
            op,
            path: path.into(),
            source,
        }
    }

    /// [`ErrorClass::NoSpace`] for a full disk (also one the I/O error
    /// wraps), else [`ErrorClass::Failure`].
    pub fn class(&self) -> ErrorClass {
        ErrorClass::of_chain(self)
    }
}

/// The volume has less free space than a step needs (the preflight of
/// [`crate::require_space`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "not enough free space on {volume}: {available} bytes available ({}), {needed} bytes still \
     needed ({})",
    ftpipe_progress::human::bytes(*available),
    ftpipe_progress::human::bytes(*needed)
)]
pub struct InsufficientSpace {
    /// A path on the volume.
    pub volume: PathBuf,
    /// Bytes free for an unprivileged writer.
    pub available: u64,
    /// Bytes the step still needs.
    pub needed: u64,
}

/// A broken invariant or a task that panicked or was cancelled: a bug, not
/// bad input ([`ErrorClass::Internal`]). Durable state stays consistent
/// (nothing is recorded for the work that failed), so a re-run resumes.
#[derive(Debug, thiserror::Error)]
#[error(
    "internal error (a bug, please report it): {what}{}",
    source.as_ref().map_or_else(String::new, |s| format!(": {s}"))
)]
pub struct InternalError {
    /// The invariant or task that failed.
    pub what: String,
    /// The cause, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl InternalError {
    /// A broken invariant without a cause.
    pub fn new(what: impl Into<String>) -> Self {
        InternalError {
            what: what.into(),
            source: None,
        }
    }

    /// A failed task join or another internal failure with its cause.
    pub fn with_source(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        InternalError {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// What a durable filesystem operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The volume has less free space than a step needs.
    #[error(transparent)]
    InsufficientSpace(#[from] InsufficientSpace),
}

impl FsError {
    /// Wraps an I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FsError::Io(IoError::new(op, path, source))
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    /// The text users see (and e2e tests match) is the one each crate's
    /// enum printed before it wrapped these (the preflight's sizes for
    /// people added beside its exact bytes).
    #[test]
    fn the_shared_errors_print_what_the_enums_printed() {
        let io = IoError::new(
            "rename",
            "DIR/source/a.part",
            std::io::Error::other("no such thing"),
        );
        assert_eq!(io.to_string(), "rename DIR/source/a.part: no such thing");
        let source = io.source().expect("the I/O error is the source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
        let space = InsufficientSpace {
            volume: "DIR".into(),
            available: 1_500_000,
            needed: 2_000_000,
        };
        assert_eq!(
            space.to_string(),
            "not enough free space on DIR: 1500000 bytes available (1.5 MB), 2000000 bytes \
             still needed (2.0 MB)"
        );
        assert_eq!(
            InternalError::new("a task vanished").to_string(),
            "internal error (a bug, please report it): a task vanished"
        );
        let joined = InternalError::with_source("fetch task", std::io::Error::other("panicked"));
        assert_eq!(
            joined.to_string(),
            "internal error (a bug, please report it): fetch task: panicked"
        );
        assert!(joined.source().is_some());
        let wrapped = FsError::from(io);
        assert_eq!(
            wrapped.to_string(),
            "rename DIR/source/a.part: no such thing"
        );
        let source = wrapped.source().expect("transparent: the I/O error");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
    }
}
