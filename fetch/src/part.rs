//! The `.part` file: the only place downloaded bytes are written before
//! publication. It lives beside its final name on the target volume, so the
//! publishing rename is atomic and no staging copy exists elsewhere.
//!
//! A stream's bytes are held back until whole blocks can be written past
//! the page cache (`O_DIRECT`, see `ftpipe_fs::direct`); what a checkpoint
//! needs on disk is written out first ([`PartFile::flush`]).

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use ftpipe_fs::direct::{Bounce, DIRECT_ALIGN, DirectFile, IoMode};
use ftpipe_fs::durable::sync_dirs_up_to;

/// A stream writes once this much is held back (whole blocks of it).
const STREAM_BATCH: usize = 256 * 1024;

/// An open `.part` file whose first `len` bytes are known good.
pub struct PartFile {
    file: DirectFile,
    path: PathBuf,
    len: u64,
    /// Pushed, not yet written: the bytes from `len` on.
    held: VecDeque<Bytes>,
    held_len: usize,
    bounce: Option<Bounce>,
}

/// Outcome of an append that hit a full disk.
#[derive(Debug)]
pub enum AppendError {
    /// The volume is full; the file was cut back to the last good length.
    NoSpace,
    /// Any other I/O failure.
    Io(std::io::Error),
}

impl PartFile {
    /// Opens (creating, with parents) the part file under `root` without
    /// truncating it, never through a link (see `nofollow::open_write`). A newly created entry is made durable by fsyncing its
    /// directory and every one above it up to `root`.
    pub fn open(root: &Path, path: &Path, mode: IoMode) -> std::io::Result<PartFile> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let existed = std::fs::symlink_metadata(path).is_ok();
        let file = ftpipe_fs::nofollow::open_write(path)?;
        if !existed {
            sync_dirs_up_to(root, dir)?;
        }
        let len = file.metadata()?.len();
        Ok(PartFile {
            file: DirectFile::new(file, mode),
            path: path.to_owned(),
            len,
            held: VecDeque::new(),
            held_len: 0,
            bounce: None,
        })
    }

    /// Where the part file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes currently in the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Bytes in the file and held back: where the next pushed byte goes.
    pub fn end(&self) -> u64 {
        self.len + self.held_len as u64
    }

    /// Bytes pushed and not yet written.
    pub fn held(&self) -> u64 {
        self.held_len as u64
    }

    /// The underlying file (for re-hashing the prefix).
    pub fn file(&self) -> &DirectFile {
        &self.file
    }

    /// Cuts the file to `len` bytes and makes that durable; drops what is
    /// held back.
    pub fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.drop_held();
        self.file.file().set_len(len)?;
        self.file.file().sync_all()?;
        self.len = len;
        Ok(())
    }

    /// Appends `chunk` at the end, held back until whole blocks of at
    /// least [`STREAM_BATCH`] are there; returns the bytes written to the
    /// file by this call. A failed write drops everything held back and
    /// cuts the file back to [`PartFile::len`].
    pub fn push(&mut self, chunk: Bytes) -> Result<u64, AppendError> {
        if chunk.is_empty() {
            return Ok(0);
        }
        self.held_len += chunk.len();
        self.held.push_back(chunk);
        if self.held_len < STREAM_BATCH {
            return Ok(0);
        }
        let end = self.end();
        let whole = end - end % DIRECT_ALIGN as u64;
        self.write_held(whole.saturating_sub(self.len))
    }

    /// Writes everything held back; returns the bytes written.
    pub fn flush(&mut self) -> Result<u64, AppendError> {
        self.write_held(self.held_len as u64)
    }

    fn write_held(&mut self, n: u64) -> Result<u64, AppendError> {
        if n == 0 {
            return Ok(0);
        }
        // `n` never exceeds what is held back (a usize).
        let len = usize::try_from(n).unwrap_or(usize::MAX).min(self.held_len);
        let bounce = self.bounce.get_or_insert_with(|| Bounce::new(STREAM_BATCH));
        let parts = self.held.iter().map(|c| &c[..]);
        match self.file.write_all_at(bounce, parts, len, self.len) {
            Ok(()) => {
                self.len += len as u64;
                consume_front(&mut self.held, len);
                self.held_len -= len;
                Ok(len as u64)
            }
            Err(e) => {
                self.drop_held();
                Err(self.cut_back(e))
            }
        }
    }

    fn drop_held(&mut self) {
        self.held.clear();
        self.held_len = 0;
    }

    /// After a failed write: the file back to `len`, so it never ends in a
    /// torn write (best effort: the ledger only claims `len`).
    fn cut_back(&mut self, e: std::io::Error) -> AppendError {
        let full = e.kind() == ErrorKind::StorageFull || e.kind() == ErrorKind::QuotaExceeded;
        let _ = self.file.file().set_len(self.len);
        if full {
            AppendError::NoSpace
        } else {
            AppendError::Io(e)
        }
    }

    /// Appends `bytes` at the end at once (after anything held back). On a
    /// full disk, cuts back to the length before the call so the file never
    /// ends in a torn chunk.
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), AppendError> {
        use std::os::unix::fs::FileExt;
        self.flush()?;
        match self.file.file().write_all_at(bytes, self.len) {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => Err(self.cut_back(e)),
        }
    }

    /// The open file, for positioned writes of a segmented fetch (nothing
    /// may be held back).
    pub fn into_file(self) -> DirectFile {
        debug_assert_eq!(self.held_len, 0, "bytes held back");
        self.file
    }

    /// Makes every written byte durable (not those held back: see
    /// [`PartFile::flush`]).
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.file.file().sync_data()
    }

    /// Bytes written past the page cache since the file was opened.
    pub fn direct_written(&self) -> u64 {
        self.file.direct_written()
    }

    /// Publishes through [`ftpipe_fs::durable::publish`]: `sync_all` →
    /// rename to `final_path` → fsync the directory. Anything still held
    /// back is not part of it.
    pub fn publish(self, final_path: &Path) -> Result<(), ftpipe_fs::FsError> {
        debug_assert_eq!(self.held_len, 0, "bytes held back");
        ftpipe_fs::durable::publish(self.file.file(), &self.path, final_path)
    }
}

/// Drops the first `n` bytes of `chunks` (a partly written chunk is sliced,
/// not copied).
pub(crate) fn consume_front(chunks: &mut VecDeque<Bytes>, mut n: usize) {
    while n > 0 {
        let Some(front) = chunks.front_mut() else {
            return;
        };
        if front.len() <= n {
            n -= front.len();
            chunks.pop_front();
        } else {
            bytes::Buf::advance(front, n);
            n = 0;
        }
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

    fn open(dir: &Path, mode: IoMode) -> PartFile {
        PartFile::open(dir, &dir.join("f.part"), mode).unwrap()
    }

    fn on_disk(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join("f.part")).unwrap()
    }

    #[test]
    fn pushed_bytes_are_held_until_whole_blocks_of_a_batch_then_flushed() {
        for mode in [IoMode::Direct, IoMode::Buffered] {
            let dir = tempfile::tempdir().unwrap();
            let mut part = open(dir.path(), mode);
            let data = pattern(3 * STREAM_BATCH + 5000, 1);
            let small = Bytes::copy_from_slice(&data[..1000]);
            assert_eq!(part.push(small).unwrap(), 0, "{mode:?}");
            assert_eq!((part.len(), part.held(), part.end()), (0, 1000, 1000));
            assert!(on_disk(dir.path()).is_empty());
            // Past a batch: everything up to the last whole block is written.
            let big = Bytes::copy_from_slice(&data[1000..STREAM_BATCH + 3000]);
            let wrote = part.push(big).unwrap();
            let end = (STREAM_BATCH + 3000) as u64;
            assert_eq!(wrote, end - end % DIRECT_ALIGN as u64);
            assert_eq!(part.len() + part.held(), end);
            for c in data[STREAM_BATCH + 3000..].chunks(7777) {
                part.push(Bytes::copy_from_slice(c)).unwrap();
            }
            let before = part.len();
            assert_eq!(part.flush().unwrap(), data.len() as u64 - before);
            assert_eq!((part.len(), part.held()), (data.len() as u64, 0));
            part.sync().unwrap();
            assert_eq!(on_disk(dir.path()), data, "{mode:?}");
        }
    }

    #[test]
    fn a_stream_resumes_behind_an_unaligned_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let data = pattern(2 * STREAM_BATCH + 123, 2);
        let cut = 10_001;
        std::fs::write(dir.path().join("f.part"), &data[..cut]).unwrap();
        let mut part = open(dir.path(), IoMode::Direct);
        assert_eq!(part.len(), cut as u64);
        part.push(Bytes::copy_from_slice(&data[cut..])).unwrap();
        part.flush().unwrap();
        assert_eq!(on_disk(dir.path()), data);
    }

    #[test]
    fn truncate_and_append_drop_or_write_what_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let mut part = open(dir.path(), IoMode::Direct);
        part.push(Bytes::from_static(b"held")).unwrap();
        // An immediate append goes behind the held bytes.
        part.append(b" then appended").unwrap();
        assert_eq!(on_disk(dir.path()), b"held then appended");
        part.push(Bytes::from_static(b" dropped")).unwrap();
        part.truncate(4).unwrap();
        assert_eq!((part.len(), part.held()), (4, 0));
        assert_eq!(part.flush().unwrap(), 0);
        assert_eq!(on_disk(dir.path()), b"held");
    }
}
