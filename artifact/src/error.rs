//! Errors of the artifact crate. A failed *check* is not an error: it is a
//! [`crate::verify::Failure`] in the report. An error means the work could
//! not be done at all: the artifact directory cannot be opened or listed,
//! or a value to be hashed or written does not serialize.

use std::path::PathBuf;

use ftpipe_fs::ErrorClass;

/// Why an artifact operation could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A filesystem operation on the artifact directory failed.
    #[error(transparent)]
    Fs(#[from] ftpipe_fs::FsError),
    /// The path given as the artifact directory is not a directory.
    #[error("invalid artifact directory: {path} is not a directory")]
    NotADirectory {
        /// The path as given.
        path: PathBuf,
    },
    /// A value could not be serialized to JSON, so it is neither hashed nor
    /// written (never replaced by empty bytes).
    #[error("cannot serialize {what} as JSON: {source}")]
    Serialize {
        /// What was being serialized (`the fingerprint input`, `the manifest`).
        what: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
}

impl ArtifactError {
    /// This error's [`ErrorClass`]: its filesystem error's, else
    /// [`ErrorClass::Failure`] (a full disk anywhere is
    /// [`ErrorClass::NoSpace`]).
    pub fn class(&self) -> ErrorClass {
        match self {
            ArtifactError::Fs(e) => e.class(),
            ArtifactError::NotADirectory { .. } | ArtifactError::Serialize { .. } => {
                ErrorClass::of_chain(self)
            }
        }
    }

    /// Wraps an I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ArtifactError::Fs(ftpipe_fs::FsError::io(op, path, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_no_space_and_the_rest_a_failure() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(
            ArtifactError::io("write", "m", full).class(),
            ErrorClass::NoSpace
        );
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(
            ArtifactError::io("open", "m", denied).class(),
            ErrorClass::Failure
        );
        let not_dir = ArtifactError::NotADirectory { path: "x".into() };
        assert_eq!(not_dir.class(), ErrorClass::Failure);
    }
}
