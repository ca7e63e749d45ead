//! The `.part` file: the only place downloaded bytes are written before
//! publication. It lives beside its final name on the target volume, so the
//! publishing rename is atomic and no staging copy exists elsewhere.

use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use ftpipe_fs::durable::{sync_dir, sync_dirs_up_to};

/// An open `.part` file whose first `len` bytes are known good.
pub struct PartFile {
    file: File,
    path: PathBuf,
    len: u64,
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
    pub fn open(root: &Path, path: &Path) -> std::io::Result<PartFile> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let existed = std::fs::symlink_metadata(path).is_ok();
        let file = ftpipe_fs::nofollow::open_write(path)?;
        if !existed {
            sync_dirs_up_to(root, dir)?;
        }
        let len = file.metadata()?.len();
        Ok(PartFile {
            file,
            path: path.to_owned(),
            len,
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

    /// The underlying file (for re-hashing the prefix).
    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// Cuts the file to `len` bytes and makes that durable.
    pub fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)?;
        self.file.sync_all()?;
        self.len = len;
        Ok(())
    }

    /// Appends `bytes` at the end. On a full disk, cuts back to the length
    /// before the call so the file never ends in a torn chunk.
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), AppendError> {
        use std::os::unix::fs::FileExt;
        let res = self.file.write_all_at(bytes, self.len);
        match res {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let full =
                    e.kind() == ErrorKind::StorageFull || e.kind() == ErrorKind::QuotaExceeded;
                // Best effort: drop the torn tail; the ledger only claims `len`.
                let _ = self.file.set_len(self.len);
                if full {
                    Err(AppendError::NoSpace)
                } else {
                    Err(AppendError::Io(e))
                }
            }
        }
    }

    /// The open file, for positioned writes of a segmented fetch.
    pub fn into_file(self) -> File {
        self.file
    }

    /// Makes every appended byte durable.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Publishes: `sync_all` → rename to `final_path` → fsync the directory.
    pub fn publish(self, final_path: &Path) -> std::io::Result<()> {
        self.file.sync_all()?;
        drop(self.file);
        std::fs::rename(&self.path, final_path)?;
        sync_dir(final_path.parent().unwrap_or(Path::new(".")))
    }
}
