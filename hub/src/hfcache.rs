//! A Hugging Face hub cache (`hf download`, `huggingface_hub`) as a source
//! of pinned files: `<root>/models--ORG--NAME/blobs/<etag>` plus
//! `snapshots/<commit>/<path>` links, interrupted downloads left as
//! `blobs/<etag>.<id>.incomplete` or `blobs/<etag>.incomplete`.
//!
//! With Xet on (huggingface_hub 2.x with `hf_xet`, its default), a Xet
//! file's `blobs/<etag>` is instead a relative link into the cache-wide
//! shared store, `<root>/blobs/<2 hex>/<xet hash>` (a regular, read-only
//! file; `<root>/blobs/.huggingface-shared-blobs` marks the store), written
//! as `../../blobs/<2 hex>/<xet hash>`.
//!
//! Everything under the cache is untrusted input: a name is only ever
//! looked up by the pinned identity, a snapshot link is followed only when
//! its target stays inside the repo's `blobs/` directory, a repo blob link
//! only when it is exactly one relative link into this cache's shared store
//! (see [`shared_store_target`]), only regular files of the pinned size (a
//! prefix no longer than it) are considered, and a candidate is adopted only
//! after its copy hashes to the pinned identity.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Serialize;

use ftpipe_receipts::FileRow;

use crate::identity::{CommitId, LfsSha256};
use ftpipe_fs::paths::validate_repo_path;

/// The longest link chain followed under `snapshots/` (hf writes one link).
const MAX_LINK_HOPS: usize = 8;

/// Where a hub cache is and where that choice came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HfCache {
    /// The hub cache directory (the one holding `models--ORG--NAME`).
    pub root: PathBuf,
    /// `--hf-cache`, `HF_HUB_CACHE`, `HF_HOME` or `default`.
    pub from: &'static str,
}

/// How a cached file is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupKind {
    /// An LFS file: `blobs/<sha256>`.
    Blob,
    /// A small file: `snapshots/<commit>/<path>` resolved into `blobs/`.
    Snapshot,
}

/// A cached file that may hold the pinned bytes (not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The real file in `blobs/` (no link left on the way).
    pub blob: PathBuf,
    /// How it was found.
    pub kind: LookupKind,
}

/// What a lookup found for one pinned file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Nothing under the pinned identity.
    Absent,
    /// A candidate of the pinned size.
    Found(Candidate),
    /// Something under the pinned identity that cannot be the file (a
    /// link escaping `blobs/`, not a regular file, the wrong size).
    Refused {
        /// The cache path looked at.
        path: PathBuf,
        /// Why it is not used.
        reason: String,
        /// Its size when it is a regular file.
        bytes: u64,
    },
}

impl HfCache {
    /// The cache huggingface_hub would use: `HF_HUB_CACHE`, else
    /// `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`. `None` when no home can be found.
    pub fn from_env() -> Option<HfCache> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(p) = var("HF_HUB_CACHE") {
            return Some(HfCache {
                root: p,
                from: "HF_HUB_CACHE",
            });
        }
        if let Some(home) = var("HF_HOME") {
            return Some(HfCache {
                root: home.join("hub"),
                from: "HF_HOME",
            });
        }
        let base = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
        Some(HfCache {
            root: base.join("huggingface").join("hub"),
            from: "default",
        })
    }

    /// A cache the user named.
    pub fn at(root: PathBuf) -> HfCache {
        HfCache {
            root,
            from: "--hf-cache",
        }
    }

    /// Whether the cache directory exists (a missing one is not an error:
    /// the user simply has none).
    pub fn exists(&self) -> bool {
        std::fs::metadata(&self.root).is_ok_and(|m| m.is_dir())
    }

    /// `models--ORG--NAME` for a validated repo id.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// Looks `file` up by its pinned identity at `commit`.
    pub fn lookup(&self, repo: &str, commit: &str, file: &FileRow) -> Lookup {
        let repo_dir = self.repo_dir(repo);
        let blobs = repo_dir.join("blobs");
        // The blobs directory itself must be a real directory.
        let Some(blobs_real) = real_dir(&blobs) else {
            return Lookup::Absent;
        };
        match &file.lfs_sha256 {
            Some(sha) => {
                let Some(sha) = LfsSha256::parse(sha) else {
                    return Lookup::Absent;
                };
                let path = blobs_real.join(sha.as_str());
                match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.file_type().is_symlink() => {
                        match shared_store_target(&self.root, &path, file.xet_hash.as_deref()) {
                            Ok(target) => check_regular(&target, file.size, LookupKind::Blob),
                            Err(reason) => Lookup::Refused {
                                path,
                                reason: reason.to_string(),
                                bytes: 0,
                            },
                        }
                    }
                    _ => check_regular(&path, file.size, LookupKind::Blob),
                }
            }
            None => {
                if CommitId::parse(commit).is_none() || validate_repo_path(&file.path).is_err() {
                    return Lookup::Absent;
                }
                let link = repo_dir.join("snapshots").join(commit).join(&file.path);
                match resolve_inside(&repo_dir, &link, &blobs_real) {
                    Ok(None) => Lookup::Absent,
                    Ok(Some(blob)) => check_regular(&blob, file.size, LookupKind::Snapshot),
                    Err(reason) => Lookup::Refused {
                        path: link,
                        reason,
                        bytes: 0,
                    },
                }
            }
        }
    }

    /// The longest interrupted download of the LFS file `file` in the
    /// cache (`blobs/<sha256>.incomplete`, `blobs/<sha256>.<id>.incomplete`),
    /// at most `file.size` bytes and not empty, with its length.
    pub fn incomplete(&self, repo: &str, file: &FileRow) -> Option<(PathBuf, u64)> {
        let sha = LfsSha256::parse(file.lfs_sha256.as_deref()?)?;
        let blobs = real_dir(&self.repo_dir(repo).join("blobs"))?;
        let prefix = format!("{}.", sha.as_str());
        let mut best: Option<(PathBuf, u64)> = None;
        for entry in std::fs::read_dir(&blobs).ok()?.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let id_ok = rest == "incomplete"
                || rest.strip_suffix(".incomplete").is_some_and(|id| {
                    !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric())
                });
            if !id_ok {
                continue;
            }
            // `symlink_metadata`: a link here is never followed.
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            let len = meta.len();
            if meta.is_file()
                && len > 0
                && len <= file.size
                && best.as_ref().is_none_or(|b| len > b.1)
            {
                best = Some((entry.path(), len));
            }
        }
        best
    }
}

/// The directory `dir` when it and every component of it is what it says
/// (canonicalized; `None` when missing or not a directory).
fn real_dir(dir: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(dir).ok()?;
    std::fs::metadata(&real).ok()?.is_dir().then_some(real)
}

/// Why a repo blob link is not followed into the shared store. The
/// messages are the reasons recorded for a refused cache candidate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharedLinkRefusal {
    /// The link could not be read.
    #[error("cannot read the link: {0}")]
    Unreadable(String),
    /// An absolute target (huggingface_hub writes relative ones).
    #[error("links to the absolute path {0}, not relative into the cache's shared store")]
    Absolute(PathBuf),
    /// A `.`/`..` after a name, or anything else that is not `../`s then names.
    #[error("links to {0}, not `../`s followed by names")]
    NotPlain(PathBuf),
    /// More `..` than there are directories up to the filesystem root.
    #[error("links to {0}, above the filesystem root")]
    AboveRoot(PathBuf),
    /// A target outside `<cache>/blobs/<2 hex>/<64 hex>`.
    #[error("links to {target}, outside the cache's shared store {store}/<2 hex>/<xet hash>")]
    OutsideStore {
        /// Where the link leads (lexically, from the link's real directory).
        target: PathBuf,
        /// The cache's shared store.
        store: PathBuf,
    },
    /// The store's name is not the Xet hash the pin lists.
    #[error("links to the shared blob of Xet hash {found}, the pinned listing's is {pinned}")]
    OtherXetHash {
        /// The hash the link names.
        found: String,
        /// The hash the pinned listing gives.
        pinned: String,
    },
    /// The store directory or its prefix directory is not a real directory.
    #[error("{0} is not a directory (a link or missing)")]
    NotADirectory(PathBuf),
    /// The store entry is itself a link.
    #[error("its shared blob {0} is a link (a second level of links)")]
    SecondLink(PathBuf),
    /// The store entry is a directory, FIFO, socket or device.
    #[error("its shared blob {0} is not a regular file")]
    NotRegular(PathBuf),
    /// Nothing at the store entry.
    #[error("its shared blob {0} is missing: {1}")]
    Missing(PathBuf, String),
}

/// The shared store entry the repo blob link `link` names: exactly one
/// relative link (`../`s then names, read once, never followed by the
/// kernel) from the link's real directory to `<real root>/blobs/<2 hex>/
/// <64 hex>` with the prefix being the hash's first two digits and, when
/// the listing gives one, the hash being `pinned_xet`. The store directory
/// and the prefix directory must be real directories (`lstat`) and the
/// entry a regular file (`lstat`: no second link); it is later opened with
/// `O_NOFOLLOW` and hashed as placed, so a swap after this check cannot
/// publish other bytes.
pub fn shared_store_target(
    root: &Path,
    link: &Path,
    pinned_xet: Option<&str>,
) -> std::result::Result<PathBuf, SharedLinkRefusal> {
    use std::path::Component;
    let raw = std::fs::read_link(link).map_err(|e| SharedLinkRefusal::Unreadable(e.to_string()))?;
    if raw.is_absolute() {
        return Err(SharedLinkRefusal::Absolute(raw));
    }
    // `link`'s directory is canonical (`real_dir`), so applying `..`
    // lexically is what the kernel would do.
    let mut target = link
        .parent()
        .ok_or_else(|| SharedLinkRefusal::NotPlain(raw.clone()))?
        .to_path_buf();
    let mut names = false;
    for c in raw.components() {
        match c {
            Component::ParentDir if !names => {
                if !target.pop() {
                    return Err(SharedLinkRefusal::AboveRoot(raw));
                }
            }
            Component::Normal(n) => {
                names = true;
                target.push(n);
            }
            _ => return Err(SharedLinkRefusal::NotPlain(raw)),
        }
    }
    let store = std::fs::canonicalize(root)
        .unwrap_or_else(|_| root.to_path_buf())
        .join("blobs");
    let outside = || SharedLinkRefusal::OutsideStore {
        target: target.clone(),
        store: store.clone(),
    };
    let rel = target.strip_prefix(&store).map_err(|_| outside())?;
    let parts: Option<Vec<&str>> = rel.iter().map(|p| p.to_str()).collect();
    let Some([prefix, hash]) = parts.as_deref() else {
        return Err(outside());
    };
    let (prefix, hash) = (*prefix, *hash);
    let lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if hash.len() != 64 || !lower_hex(hash) || prefix.len() != 2 || !hash.starts_with(prefix) {
        return Err(outside());
    }
    if let Some(pinned) = pinned_xet
        && !pinned.eq_ignore_ascii_case(hash)
    {
        return Err(SharedLinkRefusal::OtherXetHash {
            found: hash.to_owned(),
            pinned: pinned.to_owned(),
        });
    }
    for dir in [store.clone(), store.join(prefix)] {
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Err(SharedLinkRefusal::NotADirectory(dir));
        }
    }
    match std::fs::symlink_metadata(&target) {
        Err(e) => Err(SharedLinkRefusal::Missing(target, e.to_string())),
        Ok(m) if m.file_type().is_symlink() => Err(SharedLinkRefusal::SecondLink(target)),
        Ok(m) if !m.is_file() => Err(SharedLinkRefusal::NotRegular(target)),
        Ok(_) => Ok(target),
    }
}

/// Follows the link at `link` (and any chain, relative or absolute) and
/// returns the real path it names, which must lie directly in `blobs`.
/// `Ok(None)` when nothing is there.
fn resolve_inside(
    repo_dir: &Path,
    link: &Path,
    blobs: &Path,
) -> std::result::Result<Option<PathBuf>, String> {
    // Every directory between the repo dir and the link must be real.
    let parent = link.parent().ok_or("no parent")?;
    match std::fs::symlink_metadata(parent) {
        Err(_) => return Ok(None),
        Ok(_) => {
            let real_parent = std::fs::canonicalize(parent).map_err(|e| e.to_string())?;
            let real_repo = std::fs::canonicalize(repo_dir).map_err(|e| e.to_string())?;
            if !real_parent.starts_with(&real_repo) {
                return Err(format!(
                    "{} leads outside {}",
                    parent.display(),
                    repo_dir.display()
                ));
            }
        }
    }
    let mut cur = link.to_path_buf();
    for _ in 0..MAX_LINK_HOPS {
        let meta = match std::fs::symlink_metadata(&cur) {
            Ok(m) => m,
            Err(_) if cur == link => return Ok(None),
            Err(e) => return Err(format!("link target {}: {e}", cur.display())),
        };
        if !meta.file_type().is_symlink() {
            let real = std::fs::canonicalize(&cur).map_err(|e| e.to_string())?;
            return if real.parent() == Some(blobs) {
                Ok(Some(real))
            } else {
                Err(format!(
                    "resolves to {}, outside {}",
                    real.display(),
                    blobs.display()
                ))
            };
        }
        let target = std::fs::read_link(&cur).map_err(|e| e.to_string())?;
        cur = match cur.parent() {
            Some(dir) => dir.join(target),
            None => target,
        };
    }
    Err(format!("more than {MAX_LINK_HOPS} links"))
}

/// A regular file (never a link) of exactly `size` bytes at `path`.
fn check_regular(path: &Path, size: u64, kind: LookupKind) -> Lookup {
    match std::fs::symlink_metadata(path) {
        Err(_) => Lookup::Absent,
        Ok(m) if !m.is_file() => Lookup::Refused {
            path: path.to_owned(),
            reason: "not a regular file".into(),
            bytes: 0,
        },
        Ok(m) if m.len() != size => Lookup::Refused {
            path: path.to_owned(),
            reason: format!("size {} in the cache, expected {size}", m.len()),
            bytes: m.len(),
        },
        Ok(_) => Lookup::Found(Candidate {
            blob: path.to_owned(),
            kind,
        }),
    }
}

/// How a cached blob was placed at the temp path (stored as
/// `cache_candidates.placement`).
pub use ftpipe_receipts::Placement;

/// Places `blob` at `dest` (which must not exist): a reflink where the
/// filesystem can, else a copy of at most `size + 1` bytes (a blob that grew
/// since it was looked up is not copied whole). `dest` is created without
/// following links; nothing is written to the cache. The caller checks
/// `dest`'s length against `size`, fsyncs and verifies it.
///
/// Never a hard link: it would share the inode with the cache's blob, so a
/// program rewriting the blob in place (the cache is not ftpipe's) would
/// change `DIR/source` after it was verified, and an artifact would be
/// built from bytes that are not the pin's. A reflink shares extents
/// copy-on-write, so the blob's later writes never reach the copy
/// (`docs/design.md`, "Adopted bytes stay the pinned bytes").
pub fn place(blob: &Path, dest: &Path, size: u64) -> std::io::Result<Placement> {
    use std::io::Read;
    let src = ftpipe_fs::nofollow::open_read(blob)?;
    let mut out = create_new(dest)?;
    if rustix::fs::ioctl_ficlone(&out, &src).is_ok() {
        return Ok(Placement::Reflink);
    }
    std::io::copy(&mut src.take(size.saturating_add(1)), &mut out)?;
    Ok(Placement::Copy)
}

fn create_new(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, size: u64, sha: Option<&str>) -> FileRow {
        FileRow {
            path: path.into(),
            size,
            git_oid: "0".repeat(40),
            lfs_sha256: sha.map(str::to_owned),
            xet_hash: None,
            selected: true,
        }
    }

    #[test]
    fn snapshot_links_escaping_blobs_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = HfCache::at(tmp.path().join("hub"));
        let repo = cache.repo_dir("acme/tiny");
        let commit = "a".repeat(40);
        let snap = repo.join("snapshots").join(&commit);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs/good"), b"hello\n").unwrap();
        std::fs::write(tmp.path().join("secret"), b"secret").unwrap();
        std::os::unix::fs::symlink("../../blobs/good", snap.join("config.json")).unwrap();
        std::os::unix::fs::symlink("../../../../secret", snap.join("evil.json")).unwrap();
        let found = cache.lookup("acme/tiny", &commit, &row("config.json", 6, None));
        assert!(matches!(
            found,
            Lookup::Found(Candidate {
                kind: LookupKind::Snapshot,
                ..
            })
        ));
        let evil = cache.lookup("acme/tiny", &commit, &row("evil.json", 6, None));
        assert!(
            matches!(&evil, Lookup::Refused { reason, .. } if reason.contains("outside")),
            "{evil:?}"
        );
        let wrong_size = cache.lookup("acme/tiny", &commit, &row("config.json", 7, None));
        assert!(matches!(wrong_size, Lookup::Refused { bytes: 6, .. }));
        assert_eq!(
            cache.lookup("acme/tiny", &commit, &row("missing.json", 6, None)),
            Lookup::Absent
        );
    }

    /// A cache laid out as huggingface_hub 2.4 with Xet writes it: the repo
    /// blob `blobs/<sha256>` links to `../../blobs/<2 hex>/<xet hash>`.
    fn xet_cache(tmp: &Path, bytes: &[u8]) -> (HfCache, PathBuf, PathBuf, String) {
        let cache = HfCache::at(tmp.join("hub"));
        let blobs = cache.repo_dir("acme/tiny").join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        let xet = "ab".repeat(32);
        let store = cache.root.join("blobs/ab");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join(&xet), bytes).unwrap();
        let link = blobs.join("c".repeat(64));
        std::os::unix::fs::symlink(format!("../../blobs/ab/{xet}"), &link).unwrap();
        (cache, link, store.join(&xet), xet)
    }

    fn refusal(found: Lookup) -> String {
        match found {
            Lookup::Refused { reason, .. } => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_repo_blob_link_into_the_shared_store_is_a_candidate() {
        let tmp = tempfile::tempdir().unwrap();
        let (cache, _, entry, xet) = xet_cache(tmp.path(), b"weights");
        let sha = "c".repeat(64);
        let mut file = row("m.safetensors", 7, Some(&sha));
        let Lookup::Found(c) = cache.lookup("acme/tiny", &"a".repeat(40), &file) else {
            panic!("not found");
        };
        assert_eq!(c.blob, std::fs::canonicalize(&entry).unwrap());
        file.xet_hash = Some(xet);
        assert!(matches!(
            cache.lookup("acme/tiny", &"a".repeat(40), &file),
            Lookup::Found(_)
        ));
        file.xet_hash = Some("cd".repeat(32));
        let why = refusal(cache.lookup("acme/tiny", &"a".repeat(40), &file));
        assert!(why.contains("pinned listing"), "{why}");
    }

    #[test]
    fn repo_blob_links_anywhere_else_are_refused_with_their_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let (cache, link, entry, xet) = xet_cache(tmp.path(), b"weights");
        let sha = "c".repeat(64);
        let file = row("m.safetensors", 7, Some(&sha));
        let commit = "a".repeat(40);
        let relink = |target: &str| {
            std::fs::remove_file(&link).unwrap();
            std::os::unix::fs::symlink(target, &link).unwrap();
            refusal(cache.lookup("acme/tiny", &commit, &file))
        };
        let outside = tmp.path().join(&xet);
        std::fs::write(&outside, b"weights").unwrap();
        assert!(relink(outside.to_str().unwrap()).contains("absolute"));
        let escaping = relink(&format!("../../../{xet}"));
        assert!(
            escaping.contains("outside the cache's shared store"),
            "{escaping}"
        );
        let dotted = relink(&format!("../../blobs/ab/../ab/{xet}"));
        assert!(dotted.contains("not `../`s followed by names"), "{dotted}");
        let wrong_prefix = relink(&format!("../../blobs/cd/{xet}"));
        assert!(wrong_prefix.contains("outside"), "{wrong_prefix}");
        // The store entry itself a link: a second level.
        std::fs::remove_file(&entry).unwrap();
        std::os::unix::fs::symlink(&outside, &entry).unwrap();
        let second = relink(&format!("../../blobs/ab/{xet}"));
        assert!(second.contains("second level"), "{second}");
        // A directory where the blob should be.
        std::fs::remove_file(&entry).unwrap();
        std::fs::create_dir(&entry).unwrap();
        let dir = refusal(cache.lookup("acme/tiny", &commit, &file));
        assert!(dir.contains("not a regular file"), "{dir}");
        // The prefix directory a link to elsewhere.
        std::fs::remove_dir(&entry).unwrap();
        let prefix = cache.root.join("blobs/ab");
        std::fs::remove_dir(&prefix).unwrap();
        std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
        std::fs::write(tmp.path().join("elsewhere").join(&xet), b"weights").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &prefix).unwrap();
        let linked_dir = refusal(cache.lookup("acme/tiny", &commit, &file));
        assert!(linked_dir.contains("is not a directory"), "{linked_dir}");
    }

    #[test]
    fn incomplete_blobs_by_pinned_sha_only() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = HfCache::at(tmp.path().to_owned());
        let blobs = cache.repo_dir("acme/tiny").join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        let sha = "b".repeat(64);
        std::fs::write(blobs.join(format!("{sha}.incomplete")), [1u8; 10]).unwrap();
        std::fs::write(blobs.join(format!("{sha}.0a1b2c3d.incomplete")), [1u8; 20]).unwrap();
        std::fs::write(blobs.join(format!("{sha}.x.y.incomplete")), [1u8; 30]).unwrap();
        std::fs::write(blobs.join(format!("{sha}.ffff.incomplete")), [1u8; 200]).unwrap();
        let (p, len) = cache
            .incomplete("acme/tiny", &row("m.safetensors", 100, Some(&sha)))
            .unwrap();
        assert_eq!(len, 20);
        assert!(p.ends_with(format!("{sha}.0a1b2c3d.incomplete")));
    }
}
