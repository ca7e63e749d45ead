//! The free-space preflight: one check, used before fetching, before
//! converting and before a whole run, so every stage refuses a volume that
//! cannot hold its output before writing a byte.

use std::path::Path;

use crate::error::{FsError, InsufficientSpace, Result};

/// Free bytes on the volume holding `path` (for an unprivileged writer).
pub fn available(path: &Path) -> Result<u64> {
    fs4::available_space(path).map_err(|e| FsError::io("statvfs", path, e))
}

/// `Ok(available)` when the volume holding `volume` has at least `needed`
/// bytes free, else [`FsError::InsufficientSpace`].
pub fn require_space(volume: &Path, needed: u64) -> Result<u64> {
    let available = available(volume)?;
    if needed > available {
        return Err(FsError::InsufficientSpace(InsufficientSpace {
            volume: volume.to_owned(),
            available,
            needed,
        }));
    }
    Ok(available)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_the_volume_holds() {
        let dir = tempfile::tempdir().unwrap();
        let free = require_space(dir.path(), 0).unwrap();
        let err = require_space(dir.path(), u64::MAX).unwrap_err();
        match err {
            FsError::InsufficientSpace(InsufficientSpace {
                available, needed, ..
            }) => {
                assert_eq!(needed, u64::MAX);
                assert!(available >= free / 2, "free space changed wildly");
            }
            other @ FsError::Io(_) => panic!("expected InsufficientSpace, got {other}"),
        }
    }
}
