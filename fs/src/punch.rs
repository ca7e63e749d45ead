//! Freeing the bytes of a file that are no longer needed while keeping
//! the rest at their offsets: `fallocate(FALLOC_FL_PUNCH_HOLE |
//! FALLOC_FL_KEEP_SIZE)`. The file keeps its length; a punched range reads
//! back as zeros and holds no block. Used by a budgeted run to keep only
//! the PLE spans of a converted source file (`convert::keep`).
//!
//! On a volume that cannot punch, [`copy_aside`] writes the kept ranges
//! back to back into a copy elsewhere, durably, so the file can go whole.
//!
//! A filesystem frees whole blocks only: a range is punched from and to
//! multiples of the volume's allocation unit ([`probe`]), so the bytes a
//! file still holds are exactly its kept ranges widened to that unit.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{FallocateFlags, fallocate};

use crate::nofollow;

/// The allocation unit of the volume holding `dir` when holes can be
/// punched in files there (checked on a scratch file: a block punched out
/// of it must stop being allocated); `None` when they cannot (the
/// filesystem refuses, or `dir` is not writable).
///
/// Scratch files a probe killed before its cleanup left in `dir` (named
/// for a process that no longer runs) are removed first.
pub fn probe(dir: &Path) -> Option<u64> {
    let unit = std::fs::metadata(dir).ok()?.blksize().max(512);
    remove_stale_probes(dir);
    let probe_no = PROBES.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{PROBE_PREFIX}{}-{probe_no}", std::process::id()));
    let probed = probe_file(&path, unit);
    let _ = std::fs::remove_file(&path);
    probed.then_some(unit)
}

/// The name of a probe's scratch file, less the prober's process id and
/// the probe's number in that process (`PID-N`: probes running at once in
/// one process, as threads of the test binary do, each have their own).
const PROBE_PREFIX: &str = ".ftpipe-punch-probe-";

/// Probes begun by this process: the `N` of the next scratch file.
static PROBES: AtomicU64 = AtomicU64::new(0);

/// Removes every probe scratch file in `dir` whose process is gone (no
/// `/proc/PID`): the files of a process still running, this one
/// included, are its probes in progress. Best effort: a file that cannot
/// be removed is left for the next probe.
fn remove_stale_probes(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PROBE_PREFIX))
            .map(|n| n.split_once('-').map_or(n, |(pid, _)| pid))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let running = Path::new("/proc").join(pid).exists();
        if !running && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn probe_file(path: &Path, unit: u64) -> bool {
    let Ok(file) = nofollow::create_truncated(path) else {
        return false;
    };
    let Ok(len) = usize::try_from(unit * 2) else {
        return false;
    };
    if std::io::Write::write_all(&mut &file, &vec![1u8; len]).is_err() || file.sync_all().is_err() {
        return false;
    }
    crate::crashpoint::hit(crate::crashpoint::CrashPoint::PunchProbing);
    let before = allocated(&file);
    punch(&file, 0, unit).is_ok() && allocated(&file) < before
}

/// Bytes the filesystem allocates to `file`.
fn allocated(file: &File) -> u64 {
    file.metadata()
        .map_or(0, |m| m.blocks().saturating_mul(512))
}

fn punch(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )
    .map_err(std::io::Error::from)
}

/// Punches every `(offset, len)` of `holes` out of the regular file at
/// `path` (never following a link), then syncs it. Punching a hole again
/// is a no-op, so a punch a crash interrupted is finished by doing it
/// again.
pub fn punch_holes(path: &Path, holes: &[(u64, u64)]) -> std::io::Result<()> {
    let file = nofollow::open_write(path)?;
    for &(offset, len) in holes.iter().filter(|(_, len)| *len > 0) {
        punch(&file, offset, len)?;
    }
    file.sync_all()
}

/// Copies the `(offset, len)` ranges of the regular file at `from` (never
/// following a link), back to back in the order given, into `to` under
/// `root`, durably: directories created and synced up to `root`, a temp
/// file beside `to` written, synced, renamed, its directory synced. Only
/// then may a row claim the copy. Returns the copy's length.
pub fn copy_aside(
    from: &Path,
    ranges: &[(u64, u64)],
    root: &Path,
    to: &Path,
) -> crate::error::Result<u64> {
    use crate::error::FsError;
    use std::os::unix::fs::FileExt;
    const CHUNK: u64 = 1 << 20;
    let dir = to.parent().unwrap_or(root);
    crate::durable::create_dirs_durably(root, dir).map_err(|e| FsError::io("create", dir, e))?;
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(crate::durable::temp_name(&name));
    let src = nofollow::open_read(from).map_err(|e| FsError::io("open", from, e))?;
    let out = nofollow::create_truncated(&tmp).map_err(|e| FsError::io("create", &tmp, e))?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut written = 0u64;
    for &(offset, len) in ranges {
        let mut at = 0u64;
        while at < len {
            let n = usize::try_from((len - at).min(CHUNK)).unwrap_or(buf.len());
            src.read_exact_at(&mut buf[..n], offset.saturating_add(at))
                .map_err(|e| FsError::io("read", from, e))?;
            out.write_all_at(&buf[..n], written)
                .map_err(|e| FsError::io("write", &tmp, e))?;
            at += n as u64;
            written = written.saturating_add(n as u64);
        }
    }
    crate::durable::publish(&out, &tmp, to)?;
    Ok(written)
}

/// Whether `e` says the filesystem cannot punch holes (`EOPNOTSUPP`).
pub fn is_unsupported(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error())
}

/// Bytes of the file at `path` that hold blocks on disk (at most its
/// length): what a punched file still takes.
pub fn held_bytes(path: &Path) -> std::io::Result<u64> {
    let m = std::fs::symlink_metadata(path)?;
    Ok(m.len().min(m.blocks().saturating_mul(512)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the scratch file was named for the process alone, so
    /// probes running at once in one process (threads of the e2e binary)
    /// truncated, punched and removed each other's file, and one of them
    /// could find the volume unable to punch: a test then expected the
    /// copy-aside minimum where ftpipe computed the smaller punched one.
    #[test]
    fn probes_at_once_in_one_process_agree() {
        let dir = tempfile::tempdir().unwrap();
        let first = probe(dir.path());
        let answers: Vec<Option<u64>> = std::thread::scope(|s| {
            let probes: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..25).map(|_| probe(dir.path())).collect::<Vec<_>>()))
                .collect();
            probes.into_iter().flat_map(|p| p.join().unwrap()).collect()
        });
        assert!(
            answers.iter().all(|a| *a == first),
            "{first:?} vs {answers:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "scratch files left: {left:?}");
    }

    #[test]
    fn a_probe_removes_scratch_files_of_processes_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(format!("{PROBE_PREFIX}4294967294"));
        let live = dir.path().join(format!("{PROBE_PREFIX}1"));
        let other = dir.path().join(format!("{PROBE_PREFIX}x"));
        for p in [&stale, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        let _ = probe(dir.path());
        assert!(!stale.exists(), "a dead process's probe file is removed");
        assert!(live.exists(), "pid 1 runs: its probe file is kept");
        assert!(other.exists(), "not a probe file name");
    }

    #[test]
    fn a_punched_range_reads_zeros_and_frees_its_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let Some(unit) = probe(dir.path()) else {
            eprintln!("this filesystem cannot punch holes: nothing to check");
            return;
        };
        let path = dir.path().join("f");
        let len = usize::try_from(unit * 4).unwrap();
        std::fs::write(&path, vec![7u8; len]).unwrap();
        let before = held_bytes(&path).unwrap();
        punch_holes(&path, &[(unit, unit * 2)]).unwrap();
        punch_holes(&path, &[(unit, unit * 2)]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), len, "the length is kept");
        let u = usize::try_from(unit).unwrap();
        assert!(bytes[..u].iter().all(|&b| b == 7));
        assert!(bytes[u..3 * u].iter().all(|&b| b == 0));
        assert!(bytes[3 * u..].iter().all(|&b| b == 7));
        assert_eq!(held_bytes(&path).unwrap(), before - 2 * unit);
    }
}
