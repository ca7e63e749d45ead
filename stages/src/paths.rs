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

/// Suffix of the temp file a Hugging Face cache blob is placed at before
/// it is verified and renamed to its final name.
pub const CACHE_TEMP_SUFFIX: &str = ".hfcache";

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
    if path.ends_with(CACHE_TEMP_SUFFIX) {
        return bad("reserved .hfcache suffix");
    }
    if path == ".ftpipe" || path.starts_with(".ftpipe/") {
        return bad("reserved .ftpipe directory");
    }
    Ok(())
}

/// Longest repository id the hub accepts.
pub const MAX_REPO_ID_LEN: usize = 96;
/// Longest revision accepted (git refs are at most 255 bytes in practice).
pub const MAX_REVISION_LEN: usize = 255;

/// Checks a repository id with the hub's rules (huggingface_hub's
/// `validate_repo_id`): `[namespace/]name`, each part of ASCII letters,
/// digits, `-`, `_`, `.`, starting and ending with a letter, digit or `_`,
/// no `--` or `..`, at most [`MAX_REPO_ID_LEN`] bytes.
pub fn validate_repo_id(id: &str) -> std::result::Result<(), String> {
    let bad = |why: &str| Err(format!("invalid repository id {id:?}: {why}"));
    if id.is_empty() {
        return bad("empty");
    }
    if id.len() > MAX_REPO_ID_LEN {
        return bad(&format!("longer than {MAX_REPO_ID_LEN} bytes"));
    }
    if id.contains("--") || id.contains("..") {
        return bad("'--' and '..' are forbidden");
    }
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 2 {
        return bad("at most one '/' (namespace/name)");
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    for part in parts {
        let bytes = part.as_bytes();
        if bytes.is_empty() {
            return bad("empty namespace or name");
        }
        if !bytes.iter().all(|&b| word(b) || b == b'-' || b == b'.') {
            return bad("only letters, digits, '-', '_' and '.' are allowed");
        }
        if !word(bytes[0]) || !word(bytes[bytes.len() - 1]) {
            return bad("namespace and name must start and end with a letter, digit or '_'");
        }
    }
    Ok(())
}

/// Checks a revision (branch, tag, `refs/pr/N` or commit) with git's ref
/// name rules: no `..`, `@{`, control characters, space or `~^:?*[\`, no
/// empty, leading-dot or `.lock` component, at most [`MAX_REVISION_LEN`]
/// bytes. It is sent percent-encoded as one path segment.
pub fn validate_revision(rev: &str) -> std::result::Result<(), String> {
    let bad = |why: &str| Err(format!("invalid revision {rev:?}: {why}"));
    if rev.is_empty() {
        return bad("empty");
    }
    if rev.len() > MAX_REVISION_LEN {
        return bad(&format!("longer than {MAX_REVISION_LEN} bytes"));
    }
    if rev.contains("..") || rev.contains("@{") || rev == "@" {
        return bad("'..' and '@{' are forbidden");
    }
    if rev
        .chars()
        .any(|c| c.is_control() || c == ' ' || "~^:?*[\\".contains(c))
    {
        return bad("control characters, space and ~^:?*[\\ are forbidden");
    }
    for part in rev.split('/') {
        if part.is_empty() {
            return bad("empty component (leading, trailing or double '/')");
        }
        if part.starts_with('.') || part.ends_with(".lock") {
            return bad("a component starts with '.' or ends with '.lock'");
        }
    }
    if rev.ends_with('.') {
        return bad("ends with '.'");
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

/// The cache-adoption temp path beside a final path.
pub fn cache_temp_path(final_path: &Path) -> PathBuf {
    let mut s = final_path.as_os_str().to_owned();
    s.push(CACHE_TEMP_SUFFIX);
    PathBuf::from(s)
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
    fn repo_ids_follow_the_hub_rules() {
        for ok in [
            "gpt2",
            "Qwen/Qwen3-30B-A3B",
            "a_b/c.d-e",
            "_x/y_",
            &format!("{}/{}", "a".repeat(40), "b".repeat(55)),
        ] {
            assert!(validate_repo_id(ok).is_ok(), "{ok:?} refused");
        }
        for bad in [
            "",
            "../../../etc",
            "a/b/c",
            "/a",
            "a/",
            "a--b/c",
            "a..b",
            "-a/b",
            "a/b.",
            ".a",
            "a b/c",
            "a/b?x=1",
            "a/ü",
            &"a".repeat(97),
        ] {
            assert!(validate_repo_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn revisions_follow_git_ref_rules() {
        for ok in [
            "main",
            "v1.0",
            "refs/pr/1",
            "0123456789abcdef0123456789abcdef01234567",
        ] {
            assert!(validate_revision(ok).is_ok(), "{ok:?} refused");
        }
        for bad in [
            "", "..", "../x", "a/../b", "/main", "main/", "a//b", ".hidden", "x.lock", "a b",
            "a~1", "a^", "a:b", "a?", "a*", "a[", "a\\b", "a@{1}", "a\n", "x.",
        ] {
            assert!(validate_revision(bad).is_err(), "{bad:?} accepted");
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
