//! One ftpipe per output directory: an exclusive advisory lock on
//! `DIR/.ftpipe/lock`, holding the owner's PID for the error message.
//! The kernel releases the lock when the process dies, even on `kill -9`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{PipelineError, Result};
use ftpipe_fs::FsError;

/// Most bytes of the lock file read for the holder's PID (a PID is at
/// most 10 digits; the file is in `DIR`, which others can write).
const MAX_PID_BYTES: u64 = 32;

/// A process holding a directory's lock: a run in progress.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRun {
    /// The holder's PID as its lock file says (`unknown` when it holds no
    /// decimal number).
    pub pid: String,
    /// The lock file.
    pub lock: PathBuf,
}

/// Held for as long as the value lives.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Takes the lock or fails at once naming the holder's PID.
    pub fn acquire(path: &Path) -> Result<DirLock> {
        let io = |op, source| PipelineError::from(FsError::io(op, path, source));
        let mut file = ftpipe_fs::nofollow::open_write(path).map_err(|e| io("open", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(PipelineError::Locked {
                    lock: path.to_owned(),
                    pid: holder_pid(&mut file),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
        }
        file.set_len(0).map_err(|e| io("truncate", e))?;
        file.seek(SeekFrom::Start(0)).map_err(|e| io("seek", e))?;
        write!(file, "{}", std::process::id()).map_err(|e| io("write", e))?;
        file.flush().map_err(|e| io("write", e))?;
        Ok(DirLock {
            _file: file,
            path: path.to_owned(),
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The process holding the lock at `path` now, if any: a shared lock
    /// is tried and let go at once, so this takes nothing a run keeps (a
    /// run starting in that instant is refused as locked, as beside any
    /// other ftpipe). Nothing is created or written.
    pub fn holder(path: &Path) -> Result<Option<LiveRun>> {
        let io = |op, source| PipelineError::from(FsError::io(op, path, source));
        let mut file = match ftpipe_fs::nofollow::open_read(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", e)),
        };
        match file.try_lock_shared() {
            // Released as `file` closes.
            Ok(()) => Ok(None),
            Err(std::fs::TryLockError::WouldBlock) => Ok(Some(LiveRun {
                pid: holder_pid(&mut file),
                lock: path.to_owned(),
            })),
            Err(std::fs::TryLockError::Error(e)) => Err(io("lock", e)),
        }
    }
}

/// The PID the holder wrote into the lock file, or `unknown`.
fn holder_pid(file: &mut File) -> String {
    // The holder wrote its PID; anyone could have written more.
    let mut raw = Vec::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.take(MAX_PID_BYTES).read_to_end(&mut raw);
    // Only a decimal PID is shown: the file is anyone's to fill.
    std::str::from_utf8(raw.trim_ascii())
        .ok()
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or("unknown")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `audit` tells a live run from a finished one by the lock alone: the
    /// probe sees the holder while the lock is held (by another open file,
    /// as another process would), nothing once it is released or when the
    /// lock file does not exist, and takes nothing a run needs.
    #[test]
    fn the_holder_is_seen_only_while_the_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        assert!(DirLock::holder(&path).unwrap().is_none(), "no lock file");
        let held = DirLock::acquire(&path).unwrap();
        let live = DirLock::holder(&path).unwrap().expect("held");
        assert_eq!(live.pid, std::process::id().to_string());
        assert_eq!(live.lock, path);
        drop(held);
        assert!(DirLock::holder(&path).unwrap().is_none(), "released");
        // The probe left the lock free for the next run.
        let _again = DirLock::acquire(&path).unwrap();
    }
}
