//! The layout of a target directory `DIR`: one type, so every stage names
//! the same paths.
//!
//! ```text
//! DIR/source/        pinned source files, as the hub lists them
//! DIR/artifact/      the converted artifact (manifest.json, components)
//! DIR/.ftpipe/       state.db (receipts, ledger) and the run lock
//! DIR/.ftpipe/kept/  PLE spans of source files copied aside (a volume
//!                    that cannot punch holes), by source path
//! ```

use std::path::{Path, PathBuf};

/// The paths under one target directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    dir: PathBuf,
    source: PathBuf,
    artifact: PathBuf,
    state_dir: PathBuf,
}

impl Layout {
    /// The layout under `dir`.
    pub fn new(dir: &Path) -> Layout {
        Layout {
            dir: dir.to_owned(),
            source: dir.join("source"),
            artifact: dir.join("artifact"),
            state_dir: dir.join(".ftpipe"),
        }
    }

    /// `DIR` itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `DIR/source`.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// `DIR/artifact`.
    pub fn artifact(&self) -> &Path {
        &self.artifact
    }

    /// `DIR/.ftpipe`.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// `DIR/.ftpipe/state.db`.
    pub fn db(&self) -> PathBuf {
        self.state_dir.join("state.db")
    }

    /// `DIR/.ftpipe/kept`: the kept ranges of source files copied aside,
    /// each at its source path under it.
    pub fn kept(&self) -> PathBuf {
        self.state_dir.join("kept")
    }

    /// `DIR/.ftpipe/lock`.
    pub fn lock(&self) -> PathBuf {
        self.state_dir.join("lock")
    }
}
