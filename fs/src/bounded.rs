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
//!
//! [`read_bounded_or_pipe`] also takes a pipe (a FIFO, or the `/dev/fd/N`
//! that process substitution such as `--token-file <(pass show hf)` hands
//! over): what a writer sends is read up to the same limit, within a
//! deadline, so a pipe nobody writes ends with an error naming it instead
//! of a hang.

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
    /// A pipe's writer sent nothing, or did not finish, within the deadline.
    #[error(
        "{path}: is a pipe, and {got} within {secs} s (a pipe is read until its writer \
         closes it; is the command that should write it running?)",
        path = path.display(),
        got = if *received == 0 { "nothing arrived".to_owned() } else { format!("its writer sent {received} bytes but did not close it") },
        secs = waited.as_secs()
    )]
    PipeTimedOut {
        /// The path read.
        path: PathBuf,
        /// Bytes that arrived before the deadline.
        received: u64,
        /// The deadline.
        waited: std::time::Duration,
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
            | BoundedReadError::PipeTimedOut { path, .. }
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
            BoundedReadError::PipeTimedOut { .. } => ErrorKind::TimedOut,
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
    let (file, meta) = open_nonblocking(path, links)?;
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

/// Opens `path` with `O_NONBLOCK` (a FIFO opens at once, writer or not) and
/// returns it with `fstat` of the open descriptor.
fn open_nonblocking(
    path: &Path,
    links: Links,
) -> Result<(File, std::fs::Metadata), BoundedReadError> {
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
    Ok((file, meta))
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

/// [`read_bounded`], or, when `path` is a pipe (a FIFO, `/dev/fd/N` of a
/// process substitution), what its writer sends until it closes it: at most
/// `limit` bytes, all within `deadline` from the call. Any other special
/// file is refused as [`read_bounded`] refuses it.
pub fn read_bounded_or_pipe(
    path: &Path,
    limit: u64,
    deadline: std::time::Duration,
) -> Result<Vec<u8>, BoundedReadError> {
    let (file, meta) = open_nonblocking(path, Links::Follow)?;
    match kind_of(meta.file_type()) {
        None => read_opened(path, file, limit),
        Some(FoundKind::Fifo) => read_pipe(path, file, limit, deadline),
        Some(found) => Err(BoundedReadError::NotRegular {
            path: path.into(),
            found,
        }),
    }
}

/// Reads the non-blocking pipe `file` until its writer closes it, waiting
/// with `poll(2)` for at most what is left of `deadline`.
fn read_pipe(
    path: &Path,
    mut file: File,
    limit: u64,
    deadline: std::time::Duration,
) -> Result<Vec<u8>, BoundedReadError> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let io = |source: std::io::Error| BoundedReadError::Io {
        path: path.into(),
        source,
    };
    let start = std::time::Instant::now();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_sub(start.elapsed());
        let timed_out = || BoundedReadError::PipeTimedOut {
            path: path.into(),
            received: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
            waited: deadline,
        };
        if left.is_zero() {
            return Err(timed_out());
        }
        let timeout = Timespec::try_from(left).map_err(|e| io(std::io::Error::other(e)))?;
        let mut fds = [PollFd::new(&file, PollFlags::IN)];
        // Linux reports no POLLHUP on a FIFO no writer has opened yet, so
        // this waits for a writer as well as for its bytes.
        let ready = poll(&mut fds, Some(&timeout)).map_err(|e| io(e.into()))?;
        if ready == 0 {
            return Err(timed_out());
        }
        match file.read(&mut buf) {
            Ok(0) => return Ok(bytes),
            Ok(n) => {
                bytes.extend_from_slice(buf.get(..n).unwrap_or_default());
                if u64::try_from(bytes.len()).map_or(true, |len| len > limit) {
                    return Err(BoundedReadError::TooLarge {
                        path: path.into(),
                        limit,
                    });
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(io(e)),
        }
    }
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

    /// A new FIFO `fifo` in `dir`.
    fn fifo_in(dir: &Path) -> PathBuf {
        let fifo = dir.join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        fifo
    }

    #[test]
    fn refuses_special_files_without_blocking_and_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_in(dir.path());
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
    fn a_pipe_is_read_until_its_writer_closes_it_within_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_in(dir.path());
        let wait = std::time::Duration::from_secs(5);
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                std::fs::write(&fifo, b"hf_token_value\n").unwrap();
            })
        };
        assert_eq!(
            read_bounded_or_pipe(&fifo, 100, wait).unwrap(),
            b"hf_token_value\n"
        );
        writer.join().unwrap();
        // Nobody writes: an error naming the pipe once the deadline passes.
        let short = std::time::Duration::from_millis(300);
        let started = std::time::Instant::now();
        let err = read_bounded_or_pipe(&fifo, 100, short).unwrap_err();
        assert!(started.elapsed() >= short, "{err}");
        assert!(
            matches!(err, BoundedReadError::PipeTimedOut { received: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("nothing arrived"), "{err}");
        // A writer that sends more than the limit.
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let _ = std::fs::write(&fifo, vec![b'a'; 10_000]);
            })
        };
        let err = read_bounded_or_pipe(&fifo, 100, wait).unwrap_err();
        assert!(err.to_string().contains("limit of 100 bytes"), "{err}");
        writer.join().unwrap();
        // Devices stay refused; regular files read as before.
        let err = read_bounded_or_pipe(Path::new("/dev/zero"), 10, wait).unwrap_err();
        assert!(err.to_string().contains("character device"), "{err}");
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(read_bounded_or_pipe(&p, 10, wait).unwrap(), b"abc");
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
