//! Errors of the pipeline.

use std::path::PathBuf;

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
    /// A stage failed.
    #[error(transparent)]
    Stage(#[from] ftpipe_stages::StageError),
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
    /// The directory has no ftpipe state.
    #[error("{dir} holds no ftpipe state (no .ftpipe/state.db); run `ftpipe fetch` first")]
    NoState {
        /// The directory without state.
        dir: PathBuf,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = PipelineError> = std::result::Result<T, E>;
