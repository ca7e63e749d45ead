//! Opening files under the output directory without following links.
//!
//! Whoever can plant an entry in `DIR` must not be able to make ftpipe
//! (often run as root) write anywhere else. Every file ftpipe creates or
//! writes under `DIR` goes through [`open_write`] (or [`create_truncated`]),
//! which opens the final component with `O_NOFOLLOW` and refuses, before a
//! byte is written, anything that is not a plain regular file with a single
//! link: a symlink, a FIFO, a device, a directory, or a hard link to a file
//! elsewhere. Parent directories are checked with [`check_real_dirs`]; a
//! directory swapped for a link *between* that check and the open is not
//! defended against (that needs `openat2(RESOLVE_NO_SYMLINKS)`).

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Error, ErrorKind};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why an entry was refused; the caller's error names the path.
pub fn refused(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{what}; ftpipe never reads or writes through it (remove it and re-run)"),
    )
}

/// `Ok` when `meta` (from `lstat` or `fstat`) is a regular file that is safe
/// to write: not a link, and not hard-linked from elsewhere.
fn check_writable(meta: &Metadata) -> std::io::Result<()> {
    check_regular(meta)?;
    if meta.nlink() > 1 {
        return Err(refused("is a hard link to another file"));
    }
    Ok(())
}

fn check_regular(meta: &Metadata) -> std::io::Result<()> {
    let ft = meta.file_type();
    if ft.is_symlink() {
        Err(refused("is a symlink"))
    } else if ft.is_dir() {
        Err(refused("is a directory, not a regular file"))
    } else if !ft.is_file() {
        Err(refused("is not a regular file (a FIFO, socket or device)"))
    } else {
        Ok(())
    }
}

/// A symlink at the final component makes `O_NOFOLLOW` fail with `ELOOP`.
fn map_open_error(e: Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        refused("is a symlink")
    } else {
        e
    }
}

/// `Ok` when `path` is absent or a regular file with a single link (what
/// ftpipe may create or overwrite), judged without following it.
pub fn check_absent_or_regular(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => check_writable(&meta),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every directory from `root` (exclusive) down to `dir` (inclusive) that
/// exists is a real directory, not a link. Returns the offending path.
pub fn check_real_dirs(root: &Path, dir: &Path) -> Result<(), (std::path::PathBuf, Error)> {
    let Ok(rel) = dir.strip_prefix(root) else {
        return Ok(());
    };
    let mut cur = root.to_path_buf();
    for part in rel.components() {
        cur.push(part);
        match std::fs::symlink_metadata(&cur) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err((cur, refused("is a symlink")));
            }
            Ok(meta) if !meta.is_dir() => {
                return Err((cur, refused("is not a directory")));
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err((cur, e)),
        }
    }
    Ok(())
}

/// Opens `path` read-write, creating it when absent and never truncating,
/// without following a link; refuses a non-regular or multiply-linked file
/// before anything is written.
pub fn open_write(path: &Path) -> std::io::Result<File> {
    // `lstat` first: opening a FIFO for writing would block.
    check_absent_or_regular(path)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(map_open_error)?;
    // The entry may have been swapped between the `lstat` and the open.
    check_writable(&file.metadata()?)?;
    Ok(file)
}

/// [`open_write`], then cut to zero length (a fresh temp file).
pub fn create_truncated(path: &Path) -> std::io::Result<File> {
    let file = open_write(path)?;
    file.set_len(0)?;
    Ok(file)
}

/// Opens `path` for reading without following a link; refuses anything but
/// a regular file.
pub fn open_read(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(map_open_error)?;
    check_regular(&file.metadata()?)?;
    Ok(file)
}

/// [`open_read`], also refusing a file with more than one link: another
/// name for the same inode (a hard link into a cache another program
/// writes) could change its bytes after they were verified. Sources are
/// opened this way before conversion reads them.
pub fn open_read_unshared(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    let file = open_read(path)?;
    let links = file.metadata()?.nlink();
    if links > 1 {
        return Err(refused(&format!(
            "has {links} links: another name shares its bytes and can change them after they were verified"
        )));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_links_and_special_files_and_leaves_the_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = create_truncated(&link).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        let err = open_read(&link).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        let hard = dir.path().join("hard");
        std::fs::hard_link(&victim, &hard).unwrap();
        let err = create_truncated(&hard).unwrap_err();
        assert!(err.to_string().contains("hard link"), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let err = open_write(dir.path()).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        let fresh = dir.path().join("fresh");
        let f = create_truncated(&fresh).unwrap();
        assert!(f.metadata().unwrap().is_file());
    }

    #[test]
    fn real_dirs_refuses_a_linked_parent() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("evil")).unwrap();
        let (p, _) = check_real_dirs(dir.path(), &dir.path().join("evil/sub")).unwrap_err();
        assert_eq!(p, dir.path().join("evil"));
        assert!(check_real_dirs(dir.path(), &dir.path().join("absent/sub")).is_ok());
    }
}
