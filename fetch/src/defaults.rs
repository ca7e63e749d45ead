//! Defaults of the fetch tunables (`FetchOptions`), each a command-line
//! option of `fetch` and `run`.

use std::time::Duration;

/// A file's durable checkpoint interval in bytes, unless
/// `--checkpoint-bytes` names one: this share of the file's size
/// (1/256: a kill loses at most about 0.4 % of a file's bytes, plus what
/// sat in buffers), within [`MIN_CHECKPOINT_BYTES`] and
/// [`MAX_CHECKPOINT_BYTES`].
pub const CHECKPOINT_SHARE_OF_FILE: u64 = 256;
/// The per-file checkpoint interval is never below this (small files
/// are not fsynced every few hundred KiB).
pub const MIN_CHECKPOINT_BYTES: u64 = 4 * 1024 * 1024;
/// The per-file checkpoint interval is never above this (the largest
/// files: a kill loses at most this much per file and connection pass).
pub const MAX_CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;
/// Default budget of HTTP requests in flight (`--connections`).
pub const DEFAULT_CONNECTIONS: usize = 8;
/// Files at least this large may be fetched as several ranges.
pub const DEFAULT_SEGMENT_THRESHOLD: u64 = 256 * 1024 * 1024;
/// Ranges are never split below this size.
pub const DEFAULT_MIN_RANGE: u64 = 4 * 1024 * 1024;
/// A new range claims at least this much of a file's unclaimed front.
pub const DEFAULT_PIECE_SIZE: u64 = 64 * 1024 * 1024;
/// A connection delivering this much per second (about 1 Gbit/s) is not
/// capped by its server: another range of the same file would not raise
/// the file's rate (see `crate::segmented::Shared::another_connection_pays`).
pub const DEFAULT_SPLIT_BELOW_RATE: u64 = 128 * 1024 * 1024;
/// Default durable checkpoint interval in time.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(2);
/// Minimum body rate (bytes per second) of a transfer, averaged over
/// [`DEFAULT_STALL_WINDOW`]; slower is a stall (`--min-rate`, 0 = off).
pub const DEFAULT_MIN_RATE: u64 = 1024;
/// Window over which [`DEFAULT_MIN_RATE`] is measured (`--stall-secs`).
pub const DEFAULT_STALL_WINDOW: Duration = Duration::from_secs(30);
