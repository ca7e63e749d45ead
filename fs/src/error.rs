//! Errors of the filesystem layer: each names the operation and the path,
//! and keeps the underlying I/O error as its source (so a full disk is
//! recognised by walking the chain).

use std::path::PathBuf;

/// What a durable filesystem operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation (`create`, `write`, `fsync`, `rename`, ...).
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The volume has less free space than a step needs.
    #[error(
        "not enough free space on {volume}: {available} bytes available, {needed} bytes still needed"
    )]
    InsufficientSpace {
        /// A path on the volume.
        volume: PathBuf,
        /// Bytes free for an unprivileged writer.
        available: u64,
        /// Bytes the step still needs.
        needed: u64,
    },
}

impl FsError {
    /// Wraps an I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FsError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = FsError> = std::result::Result<T, E>;
