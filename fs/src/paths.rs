//! Validation of relative paths from untrusted input (a hub listing, a
//! manifest, a set-aside marker) before they name a file under a root.
//!
//! A listing decides where bytes land on the user's volume, and a manifest
//! which files a receiver opens, so each path is checked as text
//! ([`validate_repo_path`]) and again against the real tree ([`safe_join`]:
//! a symlink already under the root must not redirect a read or a write
//! outside it).

use std::path::{Component, Path, PathBuf};

/// Longest relative path accepted, in bytes.
pub const MAX_PATH_LEN: usize = 1024;

/// Suffix of in-progress downloads; never a valid repository path suffix.
pub const PART_SUFFIX: &str = ".part";

/// Suffix of the temp file a Hugging Face cache blob is placed at before
/// it is verified and renamed to its final name.
pub const CACHE_TEMP_SUFFIX: &str = ".hfcache";

/// Why a relative path was refused.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The path breaks a rule of [`validate_repo_path`].
    #[error("unsafe path {path:?} in listing: {reason}")]
    Unsafe {
        /// The path as given.
        path: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// An entry on disk on the way to `path` is a link or not a directory.
    #[error(
        "{on_disk} {problem} (on the path of {path:?}); ftpipe never reads or writes through it (remove it and re-run)"
    )]
    OnDisk {
        /// The relative path being joined.
        path: String,
        /// The entry at fault.
        on_disk: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Checks a relative path (`/`-separated, as a listing or a manifest
/// spells it): not empty, not absolute, no `.`/`..` or empty component, no
/// backslash, NUL or control character, at most [`MAX_PATH_LEN`] bytes, not
/// ending in [`PART_SUFFIX`] or [`CACHE_TEMP_SUFFIX`], not under `.ftpipe/`.
pub fn validate_repo_path(path: &str) -> Result<(), PathError> {
    let bad = |reason| {
        Err(PathError::Unsafe {
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
    if path.ends_with(CACHE_TEMP_SUFFIX) {
        return bad("reserved .hfcache suffix");
    }
    if path == ".ftpipe" || path.starts_with(".ftpipe/") {
        return bad("reserved .ftpipe directory");
    }
    Ok(())
}

/// Joins a validated relative path under `root`, refusing any existing
/// component that is a symlink or not a directory (no escape through a link
/// planted in the tree).
pub fn safe_join(root: &Path, path: &str) -> Result<PathBuf, PathError> {
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
                return Err(PathError::OnDisk {
                    path: path.to_owned(),
                    on_disk: out,
                    problem: "is a symlink",
                });
            }
            Ok(meta) if i + 1 < parts.len() && !meta.is_dir() => {
                return Err(PathError::OnDisk {
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
