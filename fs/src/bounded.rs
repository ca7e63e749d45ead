//! Bounded reads of files a user or another program controls.
//!
//! A token, a recipe, `config.json`, the index, a saved skeleton: each is
//! small, and each path may name something that is not a small regular
//! file. A FIFO blocks `open(2)` until a writer appears; `/dev/zero` reports
//! `st_size` 0 and never ends; a 64 MiB "token" would be sent as a header.
//! [`read_bounded`] opens with `O_NONBLOCK` (so a FIFO opens at once),
//! refuses anything `fstat` of the open descriptor does not call a regular
//! file, and reads at most `limit + 1` bytes whatever `st_size` says, so a
//! file that grows or lies is caught without being read whole. Every error
//! names the path, and the limit or the kind of file found.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What was found at a path where a regular file was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundKind {
    /// A named pipe.
    Fifo,
    /// A character device (`/dev/zero`, a tty).
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A directory.
    Directory,
    /// A Unix socket.
    Socket,
    /// A symbolic link (only when links are not followed).
    Symlink,
    /// Anything else that is not a regular file.
    Other,
}

impl std::fmt::Display for FoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FoundKind::Fifo => "a FIFO (named pipe)",
            FoundKind::CharDevice => "a character device",
            FoundKind::BlockDevice => "a block device",
            FoundKind::Directory => "a directory",
            FoundKind::Socket => "a socket",
            FoundKind::Symlink => "a symlink",
            FoundKind::Other => "not a regular file",
        })
    }
}

/// Why a bounded read failed; every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    /// Nothing at the path.
    #[error("{path}: no such file", path = path.display())]
    NotFound {
        /// The path read.
        path: PathBuf,
    },
    /// The path is not a regular file; nothing was read from it.
    #[error(
        "{path}: is {found}, not a regular file; ftpipe reads only regular files here",
        path = path.display()
    )]
    NotRegular {
        /// The path read.
        path: PathBuf,
        /// What was there.
        found: FoundKind,
    },
    /// The file has other names (hard links); nothing was read from it.
    #[error(
        "{path}: has {links} links: another name shares its bytes and can change them after \
         they were verified; delete it and run again (it is fetched anew)",
        path = path.display()
    )]
    Shared {
        /// The path read.
        path: PathBuf,
        /// How many names the file has.
        links: u64,
    },
    /// The file holds more than `limit` bytes.
    #[error("{path}: larger than the limit of {limit} bytes", path = path.display())]
    TooLarge {
        /// The path read.
        path: PathBuf,
        /// The named limit it exceeds.
        limit: u64,
    },
    /// Opening or reading failed.
    #[error("{path}: cannot read: {source}", path = path.display())]
    Io {
        /// The path read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl BoundedReadError {
    /// Whether nothing was at the path (callers that treat absence as
    /// "not given" branch on this).
    pub fn is_not_found(&self) -> bool {
        matches!(self, BoundedReadError::NotFound { .. })
    }

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            BoundedReadError::NotFound { path }
            | BoundedReadError::NotRegular { path, .. }
            | BoundedReadError::Shared { path, .. }
            | BoundedReadError::TooLarge { path, .. }
            | BoundedReadError::Io { path, .. } => path,
        }
    }
}

impl From<BoundedReadError> for std::io::Error {
    fn from(e: BoundedReadError) -> Self {
        let kind = match &e {
            BoundedReadError::NotFound { .. } => ErrorKind::NotFound,
            BoundedReadError::NotRegular { .. } | BoundedReadError::Shared { .. } => {
                ErrorKind::InvalidInput
            }
            BoundedReadError::TooLarge { .. } => ErrorKind::InvalidData,
            BoundedReadError::Io { source, .. } => source.kind(),
        };
        std::io::Error::new(kind, e)
    }
}

/// Whether the final path component is followed when it is a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow a link (a token file, an HF cache snapshot entry → blob).
    Follow,
    /// Refuse a link at the final component (files under `DIR`).
    Refuse,
    /// Refuse a link at the final component, and a file with more than one
    /// name (a hard link shares its bytes with a file another program can
    /// rewrite after they were verified): the sources under `DIR/source`.
    RefuseShared,
}

fn kind_of(ft: std::fs::FileType) -> Option<FoundKind> {
    if ft.is_file() {
        None
    } else if ft.is_fifo() {
        Some(FoundKind::Fifo)
    } else if ft.is_char_device() {
        Some(FoundKind::CharDevice)
    } else if ft.is_block_device() {
        Some(FoundKind::BlockDevice)
    } else if ft.is_dir() {
        Some(FoundKind::Directory)
    } else if ft.is_socket() {
        Some(FoundKind::Socket)
    } else if ft.is_symlink() {
        Some(FoundKind::Symlink)
    } else {
        Some(FoundKind::Other)
    }
}

/// Opens `path` for reading without blocking and refuses anything but a
/// regular file (judged by `fstat` of the open descriptor).
pub fn open_regular(path: &Path, links: Links) -> Result<File, BoundedReadError> {
    let mut flags = libc::O_NONBLOCK;
    if links != Links::Follow {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|source| match source.kind() {
            ErrorKind::NotFound => BoundedReadError::NotFound { path: path.into() },
            _ if source.raw_os_error() == Some(libc::ELOOP) && links != Links::Follow => {
                BoundedReadError::NotRegular {
                    path: path.into(),
                    found: FoundKind::Symlink,
                }
            }
            _ => BoundedReadError::Io {
                path: path.into(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| BoundedReadError::Io {
        path: path.into(),
        source,
    })?;
    if let Some(found) = kind_of(meta.file_type()) {
        return Err(BoundedReadError::NotRegular {
            path: path.into(),
            found,
        });
    }
    if links == Links::RefuseShared && meta.nlink() > 1 {
        return Err(BoundedReadError::Shared {
            path: path.into(),
            links: meta.nlink(),
        });
    }
    Ok(file)
}

/// Reads `path` (following a link at its end) when it is a regular file of
/// at most `limit` bytes. Never blocks on a FIFO and never reads more than
/// `limit + 1` bytes, whatever `st_size` says.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedReadError> {
    read_opened(path, open_regular(path, Links::Follow)?, limit)
}

/// [`read_bounded`], refusing a link at the final component and a file
/// with other names (the sources under `DIR/source`: see [`Links`]).
pub fn read_bounded_unshared(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedReadError> {
    read_opened(path, open_regular(path, Links::RefuseShared)?, limit)
}

/// [`read_bounded`], refusing a link at the final component (files under
/// `DIR`, which whoever can plant an entry there must not redirect).
pub fn read_bounded_nofollow(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedReadError> {
    read_opened(path, open_regular(path, Links::Refuse)?, limit)
}

fn read_opened(path: &Path, file: File, limit: u64) -> Result<Vec<u8>, BoundedReadError> {
    let too_large = || BoundedReadError::TooLarge {
        path: path.into(),
        limit,
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > limit {
        return Err(too_large());
    }
    // `len` is at most `limit` here; a lying or growing file is caught by
    // `take` below.
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| BoundedReadError::Io {
            path: path.into(),
            source,
        })?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > limit) {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_special_files_without_blocking_and_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        let err = read_bounded(&fifo, 10).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        assert!(err.to_string().contains("fifo"), "{err}");
        let err = read_bounded(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(
            err.to_string().contains("/dev/zero: is a character device"),
            "{err}"
        );
        let err = read_bounded(dir.path(), 10).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        let err = read_bounded(&dir.path().join("absent"), 10).unwrap_err();
        assert!(err.is_not_found(), "{err}");
    }

    #[test]
    fn limits_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![b'x'; 100]).unwrap();
        assert_eq!(read_bounded(&p, 100).unwrap().len(), 100);
        let err = read_bounded(&p, 99).unwrap_err();
        assert!(err.to_string().contains("limit of 99 bytes"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert_eq!(read_bounded(&link, 100).unwrap().len(), 100);
        let err = read_bounded_nofollow(&link, 100).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
}
