//! Validation of repository paths from untrusted listings.
//!
//! A listing decides where bytes land on the user's volume, so each path is
//! checked before it reaches the database, and again against the real tree
//! (a symlink already under `source/` must not redirect a write outside).

use std::path::{Component, Path, PathBuf};

use crate::error::{Result, StageError};
use crate::limits::MAX_PATH_LEN;

/// Suffix of in-progress downloads; never a valid repository path suffix.
pub const PART_SUFFIX: &str = ".part";

/// Checks a repository-relative path from a listing.
pub fn validate_repo_path(path: &str) -> Result<()> {
    let bad = |reason| {
        Err(StageError::UnsafePath {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("empty path");
    }
    if path.len() > MAX_PATH_LEN {
        return bad("path too long");
    }
    if path.contains('\0') {
        return bad("NUL byte");
    }
    if path.contains('\\') {
        return bad("backslash");
    }
    if path.starts_with('/') {
        return bad("absolute path");
    }
    if path.chars().any(|c| c.is_control()) {
        return bad("control character");
    }
    for part in path.split('/') {
        match part {
            "" => return bad("empty component"),
            "." | ".." => return bad("dot component"),
            _ => {}
        }
    }
    if path.ends_with(PART_SUFFIX) {
        return bad("reserved .part suffix");
    }
    if path == ".ftpipe" || path.starts_with(".ftpipe/") {
        return bad("reserved .ftpipe directory");
    }
    Ok(())
}

/// Joins a validated repository path under `root`, refusing any existing
/// component that is a symlink or not a directory (no escape through a link
/// planted in the tree).
pub fn safe_join(root: &Path, path: &str) -> Result<PathBuf> {
    validate_repo_path(path)?;
    let mut out = root.to_path_buf();
    let parts: Vec<&str> = path.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        out.push(part);
        debug_assert!(matches!(
            Path::new(part).components().next(),
            Some(Component::Normal(_))
        ));
        match std::fs::symlink_metadata(&out) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(StageError::UnsafeOnDisk {
                    path: path.to_owned(),
                    on_disk: out,
                    problem: "is a symlink",
                });
            }
            Ok(meta) if i + 1 < parts.len() && !meta.is_dir() => {
                return Err(StageError::UnsafeOnDisk {
                    path: path.to_owned(),
                    on_disk: out,
                    problem: "is not a directory",
                });
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The in-progress path beside a final path.
pub fn part_path(final_path: &Path) -> PathBuf {
    let mut s = final_path.as_os_str().to_owned();
    s.push(PART_SUFFIX);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_hostile_paths() {
        for p in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a\\b",
            "a\0b",
            "a//b",
            "./a",
            "a/.",
            "x.part",
            ".ftpipe/state.db",
            "a\nb",
        ] {
            assert!(validate_repo_path(p).is_err(), "{p:?} accepted");
        }
        for p in ["config.json", "a/b/c.safetensors", "..a", "a..b/c"] {
            assert!(validate_repo_path(p).is_ok(), "{p:?} rejected");
        }
    }

    #[test]
    fn refuses_symlink_escape() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("evil")).unwrap();
        let err = safe_join(dir.path(), "evil/x.bin").unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(safe_join(dir.path(), "good/x.bin").is_ok());
    }
}
