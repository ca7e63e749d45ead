//! Errors of the pipeline.

use std::path::PathBuf;

use ftpipe_fs::ErrorClass;

use crate::state::IllegalTransition;

/// Everything the pipeline can fail with.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Another ftpipe process works on the same directory.
    #[error("{lock} is held by another ftpipe (pid {pid}); wait for it or stop it")]
    Locked {
        /// The lock file.
        lock: PathBuf,
        /// The holder's pid, as recorded in the lock file.
        pid: String,
    },
    /// Resolving the revision or talking to the hub failed.
    #[error(transparent)]
    Hub(#[from] ftpipe_hub::HubError),
    /// The fetch stage failed.
    #[error(transparent)]
    Fetch(#[from] ftpipe_fetch::FetchError),
    /// Planning or converting the source checkpoint failed.
    #[error(transparent)]
    Convert(#[from] ftpipe_convert::ConvertError),
    /// Reading, hashing or verifying the artifact failed.
    #[error(transparent)]
    Artifact(#[from] ftpipe_artifact::ArtifactError),
    /// A local filesystem operation of the audit or the bundle failed.
    #[error(transparent)]
    Io(#[from] ftpipe_fs::IoError),
    /// A path from the state database is unsafe, or a link lies on its way.
    #[error(transparent)]
    UnsafePath(#[from] ftpipe_fs::paths::PathError),
    /// `--out` names a file, or a path through a file: DIR must be a
    /// directory (a missing one is created).
    #[error(
        "--out {out}: {blocker} is not a directory; give a directory for the pin, state, \
         sources and artifact (a missing one is created)"
    )]
    OutNotDirectory {
        /// The `--out` given.
        out: PathBuf,
        /// The first existing path on the way to it that is no directory.
        blocker: PathBuf,
    },
    /// No pin yet.
    #[error("{dir} has no pinned revision yet; run `ftpipe fetch` first")]
    NotPinned {
        /// The output directory.
        dir: PathBuf,
    },
    /// Invalid user input (the bundle's path).
    #[error("invalid {what}: {message}")]
    InvalidInput {
        /// Which input is invalid.
        what: &'static str,
        /// Why it is invalid.
        message: String,
    },
    /// A broken invariant or a task that panicked or was cancelled: a bug,
    /// not bad input.
    #[error(transparent)]
    Internal(#[from] ftpipe_fs::InternalError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] ftpipe_receipts::StoreError),
    /// The event log holds an impossible sequence.
    #[error(transparent)]
    IllegalTransition(#[from] IllegalTransition),
    /// A local filesystem operation failed.
    #[error(transparent)]
    Fs(#[from] ftpipe_fs::FsError),
    /// The artifact failed verification at the end of `run` (as `ftpipe
    /// verify` would report it).
    #[error("{artifact}: verification failed: {}", problems.join("; "))]
    VerifyFailed {
        /// The artifact directory.
        artifact: PathBuf,
        /// Every problem verification found.
        problems: Vec<String>,
    },
    /// An object-storage request or its setup failed.
    #[error(transparent)]
    ObjStore(#[from] ftpipe_objstore::ObjStoreError),
    /// The prefix already holds another artifact's manifest.
    #[error(
        "{dest} already holds artifact {theirs}; refusing to publish artifact {ours} over it (publish it to another prefix)"
    )]
    PrefixHoldsAnother {
        /// `s3://BUCKET/PREFIX`.
        dest: String,
        /// The fingerprint of the manifest found there.
        theirs: String,
        /// The fingerprint of the artifact being published.
        ours: String,
    },
    /// A registry tag already names another manifest.
    #[error(
        "{tag} already names manifest {theirs}; refusing to point it at {ours} (pass --force-tag to move it, or publish under another tag)"
    )]
    TagHoldsAnother {
        /// `oci://REGISTRY/REPOSITORY:TAG`.
        tag: String,
        /// The manifest digest the tag names.
        theirs: String,
        /// The manifest digest of the artifact being published.
        ours: String,
    },
    /// A pulled tag names another manifest than the one this directory
    /// pinned.
    #[error(
        "{tag} moved: it named {pinned} when {dir} pinned it and names {now} now; refusing to mix two artifacts (pass --repin to start over from {now}, or pull @{pinned})"
    )]
    TagMoved {
        /// `oci://REGISTRY/REPOSITORY:TAG`.
        tag: String,
        /// The output directory.
        dir: PathBuf,
        /// The digest pinned.
        pinned: String,
        /// The digest the tag names now.
        now: String,
    },
    /// An object is not what the manifest or the upload says it is.
    #[error("{key}: {what}")]
    ObjectMismatch {
        /// `s3://BUCKET/KEY`.
        key: String,
        /// What differs (expected and found).
        what: String,
    },
    /// No manifest at the prefix.
    #[error("nothing is published at {dest}: {key} does not exist")]
    NothingPublished {
        /// `s3://BUCKET/PREFIX`.
        dest: String,
        /// The manifest's key.
        key: String,
    },
    /// A published manifest is malformed or hostile.
    #[error("{key}: {at}: {message}")]
    BadRemoteManifest {
        /// `s3://BUCKET/KEY` of the manifest.
        key: String,
        /// The JSON path at fault (`components[3].path`), or `.`.
        at: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// DIR already holds another pull or artifact.
    #[error("{dir} holds {theirs}; refusing to pull {ours} into it (use another --out)")]
    PullConflict {
        /// The output directory.
        dir: PathBuf,
        /// What it holds.
        theirs: String,
        /// What was asked.
        ours: String,
    },
    /// The directory has no ftpipe state.
    #[error("{dir} holds no ftpipe state (no .ftpipe/state.db); run `ftpipe fetch` first")]
    NoState {
        /// The directory without state.
        dir: PathBuf,
    },
}

impl PipelineError {
    /// Wraps an I/O error with the operation and path (a full disk stays
    /// the source, which is how the binary finds it: exit 5).
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PipelineError::Io(ftpipe_fs::IoError::new(op, path, source))
    }

    /// The hub's error this one is or carries (resolving, fetching, or a
    /// remote plan's read), if any: what the binary words its advice on.
    pub fn hub(&self) -> Option<&ftpipe_hub::HubError> {
        match self {
            PipelineError::Hub(e) => Some(e),
            PipelineError::Fetch(e) => e.hub(),
            PipelineError::Convert(e) => e.hub(),
            _ => None,
        }
    }

    /// This error's [`ErrorClass`]: the lock held elsewhere is
    /// [`ErrorClass::Locked`], a failed final verification
    /// [`ErrorClass::Verification`], a bug [`ErrorClass::Internal`], a
    /// stage's or the store's error its own class, a full disk anywhere in
    /// the chain [`ErrorClass::NoSpace`], everything else
    /// [`ErrorClass::Failure`].
    pub fn class(&self) -> ErrorClass {
        match self {
            PipelineError::Locked { .. } => ErrorClass::Locked,
            PipelineError::VerifyFailed { .. } => ErrorClass::Verification,
            PipelineError::Internal(_) => ErrorClass::Internal,
            PipelineError::Hub(e) => e.class(),
            PipelineError::Fetch(e) => e.class(),
            PipelineError::Convert(e) => e.class(),
            PipelineError::Artifact(e) => e.class(),
            PipelineError::Store(e) => e.class(),
            PipelineError::Fs(e) => e.class(),
            PipelineError::ObjStore(e) => e.class(),
            PipelineError::ObjectMismatch { .. } => ErrorClass::Verification,
            PipelineError::PrefixHoldsAnother { .. }
            | PipelineError::TagHoldsAnother { .. }
            | PipelineError::TagMoved { .. }
            | PipelineError::NothingPublished { .. }
            | PipelineError::BadRemoteManifest { .. }
            | PipelineError::PullConflict { .. } => ErrorClass::Failure,
            PipelineError::Io(_)
            | PipelineError::UnsafePath(_)
            | PipelineError::NotPinned { .. }
            | PipelineError::OutNotDirectory { .. }
            | PipelineError::InvalidInput { .. }
            | PipelineError::IllegalTransition(_)
            | PipelineError::NoState { .. } => ErrorClass::of_chain(self),
        }
    }

    /// A broken invariant (see [`PipelineError::Internal`]).
    pub fn internal(what: impl Into<String>) -> Self {
        PipelineError::Internal(ftpipe_fs::InternalError::new(what))
    }

    /// A failed task join or another internal failure with its cause.
    pub fn internal_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        PipelineError::Internal(ftpipe_fs::InternalError::with_source(what, source))
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = PipelineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let locked = PipelineError::Locked {
            lock: "DIR/.ftpipe/lock".into(),
            pid: "1".into(),
        };
        assert_eq!(locked.class(), ErrorClass::Locked);
        let verify = PipelineError::VerifyFailed {
            artifact: "a".into(),
            problems: vec!["x".into()],
        };
        assert_eq!(verify.class(), ErrorClass::Verification);
        let bug = PipelineError::internal_from("task", std::io::Error::other("panicked"));
        assert_eq!(bug.class(), ErrorClass::Internal);
        let full = PipelineError::io("write", "b", std::io::ErrorKind::StorageFull.into());
        assert_eq!(full.class(), ErrorClass::NoSpace);
        let store = PipelineError::Store(ftpipe_receipts::StoreError::Unsafe {
            path: "state.db".into(),
            source: std::io::ErrorKind::StorageFull.into(),
        });
        assert_eq!(store.class(), ErrorClass::NoSpace);
        let panics = ftpipe_fetch::FetchError::several(
            2,
            vec![
                ftpipe_fetch::FetchError::internal("a"),
                ftpipe_fetch::FetchError::internal("b"),
            ],
        )
        .unwrap();
        assert_eq!(PipelineError::Fetch(panics).class(), ErrorClass::Internal);
        let input = PipelineError::NotPinned { dir: "d".into() };
        assert_eq!(input.class(), ErrorClass::Failure);
    }
}
