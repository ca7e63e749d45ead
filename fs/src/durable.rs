//! How bytes become durable under `DIR`. The rule every writer follows:
//! temp file in the target directory → write → `sync_all` → rename → fsync
//! the directory; only then may the state database claim the file. A new
//! directory is durable once it and every parent up to `DIR` are fsynced.
//!
//! Temp files carry [`TEMP_SUFFIX`], are never hashed into anything, and are
//! removed by [`remove_temp_files`] at the start of a run.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::error::{FsError, Result};
use crate::nofollow;

/// Suffix of a temp file, created beside its final name in the same
/// directory so the publishing rename is atomic.
pub const TEMP_SUFFIX: &str = ".ftpipe-tmp";

/// The temp name of `name` (same directory).
pub fn temp_name(name: &str) -> String {
    format!("{name}{TEMP_SUFFIX}")
}

/// Fsyncs a directory so a create or rename inside it is durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Fsyncs every directory from `dir` up to and including `root`, so every
/// entry on the path is durable whoever created it (another task, or a run
/// killed between its mkdir and its fsync). `dir` must lie under `root`.
pub fn sync_dirs_up_to(root: &Path, dir: &Path) -> std::io::Result<()> {
    let mut d = Some(dir);
    while let Some(cur) = d {
        sync_dir(cur)?;
        if cur == root {
            break;
        }
        d = cur.parent();
    }
    Ok(())
}

/// `create_dir_all(dir)`, then [`sync_dirs_up_to`]`(root, dir)`.
pub fn create_dirs_durably(root: &Path, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    sync_dirs_up_to(root, dir)
}

/// The rename every durable rename of ftpipe goes through; each caller
/// fsyncs the directory after it.
#[expect(
    clippy::disallowed_methods,
    reason = "the one rename of ftpipe: both callers fsync the directory after it"
)]
fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| FsError::io("rename", from, e))
}

/// Renames `from` to `to` (same directory or same volume) and fsyncs the
/// directory of `to`, so the new name survives a power cut.
pub fn rename_durably(from: &Path, to: &Path) -> Result<()> {
    rename(from, to)?;
    let dir = to.parent().unwrap_or(Path::new("."));
    sync_dir(dir).map_err(|e| FsError::io("fsync", dir, e))
}

/// [`rename_durably`], then fsyncs every directory from `to`'s up to
/// `root` ([`sync_dirs_up_to`]): for a file published into directories
/// another task (or a killed run) may have created without fsyncing them.
pub fn rename_durably_up_to(root: &Path, from: &Path, to: &Path) -> Result<()> {
    rename(from, to)?;
    let dir = to.parent().unwrap_or(Path::new("."));
    sync_dirs_up_to(root, dir).map_err(|e| FsError::io("fsync", dir, e))
}

/// Publishes a finished temp file: `sync_all` of its bytes, rename to
/// `to`, fsync of `to`'s directory. Every file ftpipe writes under a temp
/// name (a `.part`, a cache copy, a component, a bundle) gets its final
/// name this way, and only then may a row claim it.
pub fn publish(file: &File, from: &Path, to: &Path) -> Result<()> {
    file.sync_all().map_err(|e| FsError::io("fsync", from, e))?;
    rename_durably(from, to)
}

/// Neither the final name nor its temp may be a link: the rename would
/// publish one.
fn check_names(path: &Path, tmp: &Path) -> Result<()> {
    for p in [path, tmp] {
        nofollow::check_absent_or_regular(p).map_err(|e| FsError::io("open", p, e))?;
    }
    Ok(())
}

/// The same bytes are already at `path`, maybe from a run killed before its
/// fsyncs: make them durable before anything is recorded about them.
fn make_existing_durable(f: &File, path: &Path, dir: &Path) -> Result<()> {
    f.sync_all().map_err(|e| FsError::io("fsync", path, e))?;
    sync_dir(dir).map_err(|e| FsError::io("fsync", dir, e))
}

/// Writes `bytes` to `dir/name` atomically: temp → fsync → rename → fsync
/// dir. A file already holding exactly `bytes` is kept (and made durable).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(temp_name(name));
    check_names(&path, &tmp)?;
    if let Ok(mut f) = nofollow::open_read(&path) {
        let mut old = Vec::new();
        if f.read_to_end(&mut old).is_ok() && old == bytes {
            return make_existing_durable(&f, &path, dir);
        }
    }
    let mut f = nofollow::create_truncated(&tmp).map_err(|e| FsError::io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| FsError::io("write", &tmp, e))?;
    rename_durably(&tmp, &path)
}

/// How [`write_atomic_json`] lays out the JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonStyle {
    /// Indented (`serde_json::to_writer_pretty`) rather than compact.
    pub pretty: bool,
    /// A trailing newline after the value.
    pub newline: bool,
}

/// A writer that hashes what is written and, when given a file, compares
/// it with the rest of that file, failing at the first difference.
struct Checking<'a, W> {
    hasher: sha2::Sha256,
    same_as: Option<BufReader<&'a File>>,
    buf: Vec<u8>,
    out: W,
}

impl<'a, W: Write> Checking<'a, W> {
    /// A check of bytes written to `out` (and compared with `same_as`),
    /// behind a 64 KiB buffer: serde_json writes fragments of a few bytes,
    /// hashed and compared here a block at a time.
    fn buffered(same_as: Option<BufReader<&'a File>>, out: W) -> BufWriter<Self> {
        let check = Checking {
            hasher: sha2::Sha256::new(),
            same_as,
            buf: Vec::new(),
            out,
        };
        BufWriter::with_capacity(1 << 16, check)
    }
}

impl<W: Write> Write for Checking<'_, W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(r) = &mut self.same_as {
            self.buf.resize(b.len(), 0);
            r.read_exact(&mut self.buf)?;
            if self.buf != b {
                return Err(std::io::Error::other("differs"));
            }
        }
        self.out.write_all(b)?;
        self.hasher.update(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// [`write_atomic`] of `value` as JSON, streamed: neither the new bytes nor
/// the file already there are ever held whole (a ~300k-tensor source has a
/// skeleton with tens of MB of saved headers and a manifest of as many
/// inventory entries). Returns the SHA-256 (hex) of the bytes. A value that
/// fails to serialize is an error, never an empty file.
pub fn write_atomic_json<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
    style: JsonStyle,
) -> Result<String> {
    let to = |w: &mut dyn Write| -> std::io::Result<()> {
        if style.pretty {
            serde_json::to_writer_pretty(&mut *w, value)?;
        } else {
            serde_json::to_writer(&mut *w, value)?;
        }
        if style.newline {
            w.write_all(b"\n")?;
        }
        Ok(())
    };
    let path = dir.join(name);
    let tmp = dir.join(temp_name(name));
    check_names(&path, &tmp)?;
    if let Ok(f) = nofollow::open_read(&path) {
        let mut same =
            Checking::buffered(Some(BufReader::with_capacity(1 << 16, &f)), std::io::sink());
        let written = to(&mut same).and_then(|()| same.flush()).is_ok();
        let (mut same, _) = same.into_parts();
        let equal = written
            && same
                .same_as
                .as_mut()
                .is_some_and(|r| r.read(&mut [0u8; 1]).is_ok_and(|n| n == 0));
        if equal {
            make_existing_durable(&f, &path, dir)?;
            return Ok(hex::encode(same.hasher.finalize()));
        }
    }
    let f = nofollow::create_truncated(&tmp).map_err(|e| FsError::io("create", &tmp, e))?;
    let mut w = Checking::buffered(None, f);
    to(&mut w)
        .and_then(|()| w.flush())
        .and_then(|()| w.get_ref().out.sync_all())
        .map_err(|e| FsError::io("write", &tmp, e))?;
    rename_durably(&tmp, &path)?;
    let (w, _) = w.into_parts();
    Ok(hex::encode(w.hasher.finalize()))
}

/// Removes leftover temp files (names ending in [`TEMP_SUFFIX`]) under
/// `dir`, refusing a link planted at one; returns them. A missing `dir` has
/// none.
pub fn remove_temp_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(FsError::io("list", &d, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| FsError::io("list", &d, e))?;
            let path = entry.path();
            let ft = entry
                .file_type()
                .map_err(|e| FsError::io("stat", &path, e))?;
            if ft.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
                // A link where ftpipe writes its temp files was planted.
                nofollow::check_absent_or_regular(&path)
                    .map_err(|e| FsError::io("open", &path, e))?;
                std::fs::remove_file(&path).map_err(|e| FsError::io("remove", &path, e))?;
                removed.push(path);
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_keeps_equal_bytes() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "a.json", b"one").unwrap();
        write_atomic(dir.path(), "a.json", b"two").unwrap();
        assert_eq!(std::fs::read(dir.path().join("a.json")).unwrap(), b"two");
        assert!(!dir.path().join(temp_name("a.json")).exists());
    }

    #[test]
    fn write_atomic_refuses_a_symlink_at_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"keep").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("a.json")).unwrap();
        let err = write_atomic(dir.path(), "a.json", b"two").unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"keep");
    }

    #[test]
    fn write_atomic_json_hashes_what_it_wrote_and_what_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let style = JsonStyle {
            pretty: true,
            newline: true,
        };
        let value = serde_json::json!({"a": [1, 2, 3]});
        let first = write_atomic_json(dir.path(), "m.json", &value, style).unwrap();
        let bytes = std::fs::read(dir.path().join("m.json")).unwrap();
        assert_eq!(first, hex::encode(sha2::Sha256::digest(&bytes)));
        assert!(bytes.ends_with(b"\n"));
        let kept = write_atomic_json(dir.path(), "m.json", &value, style).unwrap();
        assert_eq!(kept, first);
        let other = serde_json::json!({"a": [1, 2]});
        let second = write_atomic_json(dir.path(), "m.json", &other, style).unwrap();
        assert_ne!(second, first);
    }

    /// Values past the 64 KiB buffer in front of the check: one equal to
    /// the file is kept, one differing only in its last bytes, or a prefix
    /// of the file, is written.
    #[test]
    fn write_atomic_json_compares_past_its_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let style = JsonStyle {
            pretty: false,
            newline: false,
        };
        let long = |tail: &str| serde_json::json!(["x".repeat(300_000), tail]);
        let read = || std::fs::read(dir.path().join("big.json")).unwrap();
        let first = write_atomic_json(dir.path(), "big.json", &long("a"), style).unwrap();
        let kept = write_atomic_json(dir.path(), "big.json", &long("a"), style).unwrap();
        assert_eq!(kept, first);
        let changed = write_atomic_json(dir.path(), "big.json", &long("b"), style).unwrap();
        assert_ne!(changed, first);
        assert_eq!(read(), serde_json::to_vec(&long("b")).unwrap());
        let prefix = serde_json::json!(["x".repeat(300_000)]);
        write_atomic_json(dir.path(), "big.json", &long("bb"), style).unwrap();
        let shorter = write_atomic_json(dir.path(), "big.json", &prefix, style).unwrap();
        assert_eq!(read(), serde_json::to_vec(&prefix).unwrap());
        assert_eq!(shorter, hex::encode(sha2::Sha256::digest(read())));
    }

    #[test]
    fn remove_temp_files_finds_nested_temps_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("x/y")).unwrap();
        std::fs::write(dir.path().join("x/y").join(temp_name("c.bin")), b"t").unwrap();
        std::fs::write(dir.path().join("x/keep.bin"), b"k").unwrap();
        let removed = remove_temp_files(dir.path()).unwrap();
        assert_eq!(removed.len(), 1);
        assert!(dir.path().join("x/keep.bin").exists());
        assert!(
            remove_temp_files(&dir.path().join("absent"))
                .unwrap()
                .is_empty()
        );
    }
}
