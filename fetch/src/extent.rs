//! Extents of a `.part` file: the block alignment of range writes, and the
//! data extent a crash left past a watermark. Both fetch paths measure
//! such tails (a stream's part superseded by a repin, a range's
//! un-checkpointed tail), so this lives beside them rather than in either.

use std::fs::File;

/// Range boundaries and writes are aligned to this (a multiple of every
/// common filesystem block size), so a written tail is a whole extent.
pub const WRITE_ALIGN: u64 = 64 * 1024;

/// `v` rounded down to [`WRITE_ALIGN`].
pub(crate) fn align_down(v: u64) -> u64 {
    v - v % WRITE_ALIGN
}

/// `v` rounded up to [`WRITE_ALIGN`] (saturating).
pub(crate) fn align_up(v: u64) -> u64 {
    v.div_ceil(WRITE_ALIGN).saturating_mul(WRITE_ALIGN)
}

/// Bytes written past `watermark` (before `end`): the data extent that
/// starts there. Writes are aligned, so an extent is exactly what was
/// written; a filesystem without `SEEK_DATA` reports the rest of the range
/// (an over-count, never an under-count).
pub(crate) fn written_tail(file: &File, watermark: u64, end: u64) -> std::io::Result<u64> {
    use rustix::fs::{SeekFrom, seek};
    let data = match seek(file, SeekFrom::Data(watermark)) {
        Ok(d) => d,
        Err(rustix::io::Errno::NXIO) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    if data != watermark {
        return Ok(0);
    }
    let hole = seek(file, SeekFrom::Hole(watermark)).map_err(std::io::Error::from)?;
    Ok(hole.min(end).saturating_sub(watermark))
}

/// Makes `[offset, offset + len)` a hole again, so that a later crash
/// finds only what was written after it. Best effort: a filesystem that
/// cannot punch holes (ext4, xfs, btrfs and tmpfs can) keeps the stale
/// bytes, and a resume after a later crash may then prove them part of a
/// tail the attempt in flight never received (e2e
/// `xet_tail::a_tails_rest_left_by_a_crash_is_never_credited_to_a_later_attempt`).
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) {
    use rustix::fs::{FallocateFlags, fallocate};
    let _ = fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    );
}
