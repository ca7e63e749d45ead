//! Positioned I/O on a large file that bypasses the page cache where the
//! filesystem allows it (`O_DIRECT`).
//!
//! Why: a fetch writes each byte once and never reads it again through the
//! cache (the digest is taken from memory, or read back once). Through the
//! page cache every byte costs a kernel copy into a fresh page, delayed
//! allocation and later writeback; measured on the bench VM, 4 GiB took
//! 5.4–12.0 s of system time buffered with `fdatasync` and 0.3 s with
//! `O_DIRECT` (`dd`, see docs/performance.md). A download of hundreds of GB
//! also no longer evicts everything else from the cache.
//!
//! Durability is unchanged: `O_DIRECT` says nothing about the device's
//! cache or the file's metadata, so callers `fdatasync` exactly as before
//! (through either descriptor: it is the inode that is synced).
//!
//! Rules, so that any offset and length are correct:
//! - whole [`DIRECT_ALIGN`] blocks at aligned offsets go through a second
//!   descriptor opened with `O_DIRECT`, from an aligned [`Bounce`] buffer;
//! - anything else (an unaligned head or tail, the end of the file) goes
//!   through the ordinary descriptor; the kernel keeps the two coherent
//!   (a direct write or read first writes back and drops cached pages of
//!   its range);
//! - a filesystem that refuses `O_DIRECT` (at open, or `EINVAL` on an
//!   aligned request) turns it off for the file and everything goes
//!   through the ordinary descriptor;
//! - so does a filesystem that keeps its files in memory (tmpfs, ramfs):
//!   there the page cache is the storage, nothing bypasses it, and the
//!   bounce buffer would only add a copy of every byte.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Alignment of offsets, lengths and memory of direct requests. 4 KiB
/// covers devices with 512-byte and 4 KiB logical blocks.
pub const DIRECT_ALIGN: usize = 4096;

/// A file's ordinary descriptor and, when the filesystem allows it, a
/// second one on the same inode opened with `O_DIRECT`.
#[derive(Debug)]
pub struct DirectFile {
    file: File,
    direct: Option<File>,
    direct_on: AtomicBool,
    /// Bytes written through `direct`.
    direct_written: AtomicU64,
}

/// How a [`DirectFile`] writes whole blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// Whole aligned blocks bypass the page cache.
    Direct,
    /// Everything goes through the page cache.
    Buffered,
}

impl DirectFile {
    /// Wraps `file`. With [`IoMode::Direct`] the same inode is opened a
    /// second time through `/proc/self/fd` (the open file, never a path
    /// that could have been replaced) with `O_DIRECT`; when that fails, or
    /// the file is on a filesystem kept in memory, the file is buffered
    /// only.
    pub fn new(file: File, mode: IoMode) -> DirectFile {
        let direct = match mode {
            IoMode::Direct if !in_memory(&file) => reopen_direct(&file).ok(),
            IoMode::Direct | IoMode::Buffered => None,
        };
        DirectFile {
            direct_on: AtomicBool::new(direct.is_some()),
            file,
            direct,
            direct_written: AtomicU64::new(0),
        }
    }

    /// The ordinary descriptor (sync, length, holes).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Bytes written past the page cache so far (through this value).
    pub fn direct_written(&self) -> u64 {
        self.direct_written.load(Ordering::Relaxed)
    }

    /// Whether whole blocks currently bypass the page cache.
    pub fn mode(&self) -> IoMode {
        if self.direct_on.load(Ordering::Relaxed) {
            IoMode::Direct
        } else {
            IoMode::Buffered
        }
    }

    fn direct(&self) -> Option<&File> {
        self.direct
            .as_ref()
            .filter(|_| self.direct_on.load(Ordering::Relaxed))
    }

    /// Writes the concatenation of `parts` (at least `len` bytes; only the
    /// first `len` are written) at `offset`: copied through `bounce` past
    /// the page cache, or, with direct I/O off, straight from `parts` with
    /// vectored writes.
    pub fn write_all_at<'a, I>(
        &self,
        bounce: &mut Bounce,
        parts: I,
        len: usize,
        offset: u64,
    ) -> io::Result<()>
    where
        I: IntoIterator<Item = &'a [u8]>,
        I::IntoIter: Clone,
    {
        if self.direct().is_none() {
            return write_vectored_at(&self.file, parts.into_iter(), len, offset);
        }
        let (mut at, mut left) = (offset, len);
        let mut parts = parts.into_iter();
        let mut part: &[u8] = &[];
        while left > 0 {
            // Fill the bounce buffer for the file range starting at `at`:
            // up to the next aligned offset when `at` is unaligned.
            let room = match at % DIRECT_ALIGN as u64 {
                0 => bounce.capacity(),
                r => DIRECT_ALIGN - r as usize,
            }
            .min(left);
            let buf = bounce.as_mut();
            let mut filled = 0;
            while filled < room {
                if part.is_empty() {
                    part = parts
                        .next()
                        .ok_or_else(|| io::Error::other("fewer bytes than the length to write"))?;
                    continue;
                }
                let n = part.len().min(room - filled);
                buf[filled..filled + n].copy_from_slice(&part[..n]);
                part = &part[n..];
                filled += n;
            }
            self.write_block_at(&buf[..filled], at)?;
            at += filled as u64;
            left -= filled;
        }
        Ok(())
    }

    /// `buf` starts at `at`; it is aligned in memory (a bounce buffer).
    fn write_block_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        let whole = buf.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        let mut done = 0;
        if whole > 0
            && at.is_multiple_of(DIRECT_ALIGN as u64)
            && let Some(direct) = self.direct()
        {
            match direct.write_all_at(&buf[..whole], at) {
                Ok(()) => {
                    done = whole;
                    self.direct_written
                        .fetch_add(whole as u64, Ordering::Relaxed);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_on.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(&buf[done..], at + done as u64)
    }

    /// Passes bytes `[from, to)` of the file to `f`, in order, read through
    /// `bounce`.
    pub fn read_range(
        &self,
        bounce: &mut Bounce,
        from: u64,
        to: u64,
        mut f: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut at = from;
        while at < to {
            let want = match at % DIRECT_ALIGN as u64 {
                0 => bounce.capacity() as u64,
                r => DIRECT_ALIGN as u64 - r,
            }
            .min(to - at) as usize;
            let buf = &mut bounce.as_mut()[..want];
            self.read_block_at(buf, at)?;
            f(buf);
            at += want as u64;
        }
        Ok(())
    }

    /// Reads bytes `[at, at + len)` into the start of `bounce` (`len` at
    /// most its capacity).
    pub fn read_into(&self, bounce: &mut Bounce, at: u64, len: usize) -> io::Result<()> {
        if len > bounce.capacity() {
            return Err(io::Error::other("read longer than the buffer"));
        }
        self.read_block_at(&mut bounce.as_mut()[..len], at)
    }

    fn read_block_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        let whole = buf.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        let mut done = 0;
        if whole > 0
            && at.is_multiple_of(DIRECT_ALIGN as u64)
            && let Some(direct) = self.direct()
        {
            match direct.read_exact_at(&mut buf[..whole], at) {
                Ok(()) => done = whole,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_on.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.file.read_exact_at(&mut buf[done..], at + done as u64)
    }
}

/// At most this many buffers per vectored write (Linux's `IOV_MAX` is 1024).
const MAX_IOVECS: usize = 64;

/// Writes the first `len` bytes of `parts` at `offset` through `file`,
/// vectored, never copied.
fn write_vectored_at<'a>(
    file: &File,
    parts: impl Iterator<Item = &'a [u8]> + Clone,
    len: usize,
    offset: u64,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let mut slices = Vec::with_capacity(MAX_IOVECS);
        let (mut skip, mut want) = (done, len - done);
        for p in parts.clone() {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let take = (p.len() - skip).min(want);
            slices.push(io::IoSlice::new(&p[skip..skip + take]));
            (skip, want) = (0, want - take);
            if want == 0 || slices.len() == MAX_IOVECS {
                break;
            }
        }
        if slices.is_empty() {
            return Err(io::Error::other("fewer bytes than the length to write"));
        }
        match rustix::io::pwritev(file, &slices, offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(w) => done += w,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `statfs` magic numbers (`linux/magic.h`) of filesystems whose files
/// live in memory: tmpfs, ramfs.
const IN_MEMORY_FILESYSTEMS: [i64; 2] = [0x0102_1994, 0x8584_58f6];

/// Whether `file` is on a filesystem kept in memory (unknown: no).
fn in_memory(file: &File) -> bool {
    rustix::fs::fstatfs(file).is_ok_and(|s| {
        IN_MEMORY_FILESYSTEMS
            .iter()
            .any(|m| i128::from(*m) == i128::from(s.f_type))
    })
}

fn reopen_direct(file: &File) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// A buffer aligned to [`DIRECT_ALIGN`] in memory, one per thread that
/// writes or reads through a [`DirectFile`].
#[derive(Debug)]
pub struct Bounce {
    raw: Vec<u8>,
    start: usize,
    capacity: usize,
}

impl Bounce {
    /// A buffer of `capacity` bytes rounded up to whole blocks.
    pub fn new(capacity: usize) -> Bounce {
        let capacity = capacity.max(1).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        let raw = vec![0u8; capacity + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        Bounce {
            raw,
            start,
            capacity,
        }
    }

    /// Bytes it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.capacity]
    }

    /// Its first `len` bytes (at most its capacity).
    pub fn head(&self, len: usize) -> &[u8] {
        &self.raw[self.start..self.start + len.min(self.capacity)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn open(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    #[test]
    fn writes_at_any_offset_and_length_read_back_the_same() {
        let d = dir();
        let path = d.path().join("f");
        let size = 3 * 65536 + 777;
        for mode in [IoMode::Direct, IoMode::Buffered] {
            let f = DirectFile::new(open(&path), mode);
            f.file().set_len(0).unwrap();
            f.file().set_len(size as u64).unwrap();
            let mut bounce = Bounce::new(3 * DIRECT_ALIGN);
            let want = pattern(size, 5);
            // Ranges with unaligned heads and tails, split over parts
            // whose boundaries fall anywhere, written out of order.
            let cuts = [0, 1000, 4096, 4097, 70_000, 131_072, 150_000, size];
            for w in cuts.windows(2).rev() {
                let (a, b) = (w[0], w[1]);
                let bytes = &want[a..b];
                let mid = bytes.len() / 3;
                let parts = [&bytes[..mid], &bytes[mid..], b"ignored past len"];
                f.write_all_at(&mut bounce, parts, b - a, a as u64).unwrap();
            }
            assert_eq!(std::fs::read(&path).unwrap(), want, "{mode:?}");
            let mut got = Vec::new();
            f.read_range(&mut bounce, 1000, size as u64, |b| got.extend_from_slice(b))
                .unwrap();
            assert_eq!(got, &want[1000..], "{mode:?}");
            if mode == IoMode::Buffered {
                assert_eq!(f.mode(), IoMode::Buffered);
            }
        }
    }

    /// On tmpfs `O_DIRECT` opens (Linux 6.6 and later) but bypasses
    /// nothing: the file is buffered, its bytes written straight from the
    /// caller's buffers, none through the bounce buffer.
    #[test]
    fn a_file_kept_in_memory_is_buffered_even_when_direct_is_asked() {
        let Ok(d) = tempfile::tempdir_in("/dev/shm") else {
            eprintln!("no /dev/shm here");
            return;
        };
        let path = d.path().join("f");
        let f = DirectFile::new(open(&path), IoMode::Direct);
        assert!(in_memory(f.file()), "/dev/shm is tmpfs on Linux");
        assert_eq!(f.mode(), IoMode::Buffered);
        let data = pattern(3 * DIRECT_ALIGN + 5, 9);
        let mut bounce = Bounce::new(DIRECT_ALIGN);
        f.write_all_at(&mut bounce, [&data[..100], &data[100..]], data.len(), 0)
            .unwrap();
        assert_eq!(f.direct_written(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    /// Where the volume takes `O_DIRECT`, whole blocks do bypass the cache
    /// (it is not turned off by the first write); where it does not, the
    /// test says why and the writes above cover the buffered path.
    #[test]
    fn direct_mode_is_taken_on_a_volume_that_has_it() {
        let d = dir();
        let path = d.path().join("f");
        let f = DirectFile::new(open(&path), IoMode::Direct);
        let mut bounce = Bounce::new(DIRECT_ALIGN);
        f.write_all_at(&mut bounce, [&[7u8; 8192][..]], 8192, 0)
            .unwrap();
        if let Err(e) = reopen_direct(f.file()) {
            eprintln!("no O_DIRECT here: {e}");
            return;
        }
        if in_memory(f.file()) {
            eprintln!("the temp dir is kept in memory: no O_DIRECT by design");
            return;
        }
        assert_eq!(f.mode(), IoMode::Direct);
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 8192]);
    }

    #[test]
    fn too_few_bytes_for_the_length_is_an_error() {
        let d = dir();
        let f = DirectFile::new(open(&d.path().join("f")), IoMode::Direct);
        let mut bounce = Bounce::new(DIRECT_ALIGN);
        let e = f
            .write_all_at(&mut bounce, [&[1u8; 10][..]], 20, 0)
            .unwrap_err();
        assert!(e.to_string().contains("fewer bytes"), "{e}");
    }
}
