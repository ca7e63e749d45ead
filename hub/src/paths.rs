//! Hub names from the command line and listings: repository ids and
//! revisions, checked with the hub's and git's rules; and the names of a
//! download's in-progress files beside its final path. Repository paths are
//! checked by `ftpipe_fs::paths`.

use std::path::{Path, PathBuf};

use ftpipe_fs::paths::{CACHE_TEMP_SUFFIX, PART_SUFFIX};

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
}
