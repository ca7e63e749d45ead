//! Segmented fetch: a file at or above the segment threshold is fetched as
//! several HTTP ranges into one sparse `.part` with positioned writes.
//!
//! Each range `[start, end)` has its own durable watermark in the store
//! (`fetch_ranges`); the ledger's committed bytes are their sum, written in
//! the same transaction. One coordinator per file checkpoints (fsync, then
//! all watermarks at once), accounts each range's end, and starts workers
//! on free connections. A worker streams a range and writes it, and when
//! it is done claims the next one itself: a piece of the file's unclaimed
//! bytes, front to back, or once all is claimed a split of the largest
//! remaining gap (work stealing, never below the minimum range size). A
//! claim is made in memory and made durable with the attempt's row in one
//! transaction while the request is on its way. One sequential digest
//! follows the contiguous written prefix (from memory at the front, read
//! back behind it), so verification needs no second pass over the file
//! and, as ranges complete roughly in file order, little of it waits for
//! the last byte.
//!
//! A file takes another connection only while that can raise its rate:
//! its connections are slower than `split_below_rate` (a capped server),
//! not limited by this machine ([`Shared::another_connection_pays`]). Whole
//! blocks bypass the page cache (`ftpipe_fs::direct`): each byte is written
//! once and hashed from memory or read back once.
//!
//! Writes are aligned: a worker writes whole [`WRITE_ALIGN`] blocks (only a
//! range's end may be unaligned) and keeps the remainder in memory, so
//! after a crash the bytes written past a watermark are exactly the data
//! extent that `SEEK_DATA` / `SEEK_HOLE` find there: the un-checkpointed
//! tail, recorded as a discard before the range is fetched again.
//!
//! Strictness is that of one stream: every request carries `If-Range` with
//! the validator, and each 206 must carry exactly the requested
//! `Content-Range` and that validator. A file is split only once a strong
//! validator is known. A `200` to a range request means the server ignores
//! ranges (same validator: the file falls back to one stream) or the file
//! changed (another validator); either way every byte of the file is
//! discarded, recorded, and the file starts again.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, IF_RANGE, RANGE};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, watch};
use tokio::task::{JoinSet, block_in_place};

use ftpipe_fs::direct::{Bounce, DirectFile};
use ftpipe_receipts::{Attempt, AttemptOutcome, DiscardReason, FileRow, RangeProgress, RangeRow};

use super::FetchCtx;
use super::part::consume_front;
use super::transfer::{
    DIGEST_REFETCHES, RateWindow, discard, error_chain, header_value, record_published,
    settle_stream_part,
};
use crate::{FetchError, Result};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::sync_dir;
use ftpipe_hub::HubError;
use ftpipe_hub::headers::{
    check_linked_meta, check_range, etag, retry_after_secs, strong_validator,
};
use ftpipe_hub::identity::{Expected, IdentityHasher, expected_identity, hash_part_prefix};
use ftpipe_hub::limits::MAX_RETRY_AFTER;
use ftpipe_hub::paths::part_path;
use ftpipe_progress::ProgressEvent;

/// Range boundaries and writes are aligned to this (a multiple of every
/// common filesystem block size), so a written tail is a whole extent.
pub const WRITE_ALIGN: u64 = 64 * 1024;
/// A worker writes once this much is buffered (a multiple of the alignment).
const WRITE_BATCH: usize = 4 * WRITE_ALIGN as usize;
/// Chunk of the digest's reads of the written prefix.
const HASH_CHUNK: u64 = 1 << 20;
/// A worker's write buffer: whole blocks are copied there (aligned in
/// memory) to be written past the page cache; one write call each.
const WRITE_BOUNCE: usize = 2 * WRITE_BATCH;
/// A connection's rate is judged over at least this long: a rate below a
/// quarter of `split_below_rate` is a capped connection at once; a rate
/// nearer the limit is judged over [`RATE_WINDOW_FULL`]. Judged over 100 ms
/// alone, the loopback bench's shards were split in all three rounds (37–66
/// requests), while every file starts at once; over 250 ms, in one of three.
const RATE_WINDOW: Duration = Duration::from_millis(100);
const RATE_WINDOW_FULL: Duration = Duration::from_millis(500);
/// A file is split only while its connections kept their workers waiting
/// for bytes at least this share of the time: the machine has room for
/// more (see [`delivered`]).
const MIN_WAITING_SHARE: f64 = 0.25;
/// [`Shared::split_verdict`] values.
const SPLIT_UNJUDGED: u8 = 0;
const SPLIT_PAYS: u8 = 1;
const SPLIT_DOES_NOT_PAY: u8 = 2;
/// How often the coordinator looks for free connections and due checkpoints.
const SCHEDULE_TICK: Duration = Duration::from_millis(100);
/// How long a quiet body may go unobserved before the rate rule is checked.
const BODY_TICK: Duration = Duration::from_secs(1);

fn align_down(v: u64) -> u64 {
    v - v % WRITE_ALIGN
}

/// What a file's busy connections delivered, for the split rule.
#[derive(Debug, PartialEq)]
struct Delivered {
    /// Bytes per second over the connections measured for at least
    /// [`RATE_WINDOW`]; `None` while none is.
    rate: Option<f64>,
    /// Of their time, the share their workers spent waiting for bytes.
    waiting: f64,
    /// The longest of those measurements.
    longest: Duration,
}

/// Bytes received since each busy range's first byte after its claim, per
/// second, and the share of that time its worker waited for them (all of
/// it but the time spent on the bytes it had, so that a wait still going
/// on counts: a server that sends in bursts leaves long ones). A
/// connection slower than this machine keeps its worker waiting; one this
/// machine cannot keep up with (a slow disk, the digest) has its next
/// bytes ready whenever the worker asks, and a rate that says nothing
/// about the server: the kernel keeps receiving while the worker writes
/// and hashes. `None` without a busy range.
fn delivered(slots: &[Slot], now: Instant) -> Option<Delivered> {
    let (mut busy, mut bytes, mut secs, mut waited) = (false, 0u64, 0f64, 0f64);
    let mut longest = Duration::ZERO;
    for s in slots.iter().filter(|s| s.busy) {
        busy = true;
        let Some((at, pos)) = s.first_byte else {
            continue;
        };
        let elapsed = now.saturating_duration_since(at);
        if elapsed >= RATE_WINDOW {
            bytes += s.pos.saturating_sub(pos);
            secs += elapsed.as_secs_f64();
            waited += elapsed.saturating_sub(s.handling).as_secs_f64();
            longest = longest.max(elapsed);
        }
    }
    busy.then(|| Delivered {
        rate: (secs > 0.0).then(|| bytes as f64 / secs),
        waiting: if secs > 0.0 { waited / secs } else { 0.0 },
        longest,
    })
}

/// The split rule's verdict on what a file's connections delivered, or
/// `None` while it cannot be told yet: a rate below a quarter of `limit`
/// with the workers waiting at least [`MIN_WAITING_SHARE`] of the time
/// pays at once; otherwise, once a connection has been measured for
/// [`RATE_WINDOW_FULL`], a rate below `limit` with the same waiting pays
/// and anything else does not.
fn split_pays(limit: u64, d: &Delivered) -> Option<bool> {
    let rate = d.rate?;
    let waits = d.waiting >= MIN_WAITING_SHARE;
    if rate < limit as f64 / 4.0 && waits {
        Some(true)
    } else if d.longest >= RATE_WINDOW_FULL {
        Some(waits && rate < limit as f64)
    } else {
        None
    }
}

fn align_up(v: u64) -> u64 {
    v.div_ceil(WRITE_ALIGN).saturating_mul(WRITE_ALIGN)
}

/// One range and what its worker has done with it.
#[derive(Debug, Clone)]
struct Slot {
    start: u64,
    /// One past the range's last byte; shrinks when the range is split.
    end: u64,
    /// Checkpointed: in the store.
    durable: u64,
    /// On disk (`durable ≤ written`), not yet fsynced past `durable`.
    written: u64,
    /// Claimed by the worker: on disk or in its buffer (`written ≤ pos`).
    pos: u64,
    /// Bytes written since the last checkpoint.
    received: u64,
    /// The attempt fetching the range, and every byte it has stored.
    attempt: Option<i64>,
    attempt_bytes: u64,
    busy: bool,
    /// A retry is not started before this (backoff, `Retry-After`): until
    /// then the range is idle and holds no connection.
    retry_at: Option<Instant>,
    /// Consecutive failed attempts without progress.
    failures: u32,
    /// When its first bytes since the claim arrived, and `pos` then: its
    /// rate is measured from there, in bytes received (not written, which
    /// moves in whole batches), and not from the claim (the request, the
    /// claim's transaction and the first byte's wait are not the
    /// connection's rate).
    first_byte: Option<(Instant, u64)>,
    /// Of the time since `first_byte`, what its worker spent on the bytes
    /// it had (storing them, until it asked for more): the rest it waited
    /// for the connection, including any wait still going on.
    handling: Duration,
}

impl Slot {
    fn from_row(r: &RangeRow) -> Slot {
        Slot {
            start: r.start,
            end: r.end,
            durable: r.watermark,
            written: r.watermark,
            pos: r.watermark,
            received: 0,
            attempt: None,
            attempt_bytes: 0,
            busy: false,
            retry_at: None,
            failures: 0,
            first_byte: None,
            handling: Duration::ZERO,
        }
    }

    fn complete(&self) -> bool {
        self.durable == self.end
    }

    /// Idle and incomplete, with a retry not yet due at `now`.
    fn waiting(&self, now: Instant) -> bool {
        !self.busy && !self.complete() && self.retry_at.is_some_and(|t| t > now)
    }
}

/// What the coordinator shares with its workers.
struct Shared {
    ctx: Arc<FetchCtx>,
    path: String,
    size: u64,
    lfs_sha256: Option<String>,
    part_path: PathBuf,
    /// The part file; whole blocks bypass the page cache where the
    /// volume allows (see `ftpipe_fs::direct`).
    file: DirectFile,
    /// Workers' write buffers, kept between ranges.
    bounces: Mutex<Vec<Bounce>>,
    /// This pass's id in `FetchCtx::remaining`.
    pass: u64,
    /// Whether splitting pays, once judged ([`Shared::another_connection_pays`]).
    split_verdict: std::sync::atomic::AtomicU8,
    slots: Mutex<Vec<Slot>>,
    /// The strong validator, once known (the store's, or the first response's).
    validator: Mutex<Option<String>>,
    /// False once a response shows the file cannot be split (no strong
    /// validator, or ranges ignored).
    splittable: std::sync::atomic::AtomicBool,
    /// The file's digest so far.
    digest: Mutex<Digest>,
    /// Wakes the coordinator when bytes were written.
    wrote: Notify,
    cancel: watch::Receiver<bool>,
}

/// See [`Shared::piece`].
fn piece(opts: &super::FetchOptions, gap: u64) -> u64 {
    let share = gap / (2 * opts.connections.max(1) as u64);
    opts.piece_size
        .max(share)
        .max(opts.min_range)
        .max(WRITE_ALIGN)
}

/// See [`Shared::claim_size`]; `waiting`: files wait to start.
fn claim_size(opts: &super::FetchOptions, gap: u64, total: u64, waiting: bool) -> u64 {
    let share = total.max(gap) / opts.connections.max(1) as u64;
    if share >= opts.piece_size || waiting {
        return piece(opts, gap);
    }
    share.max(opts.min_range).max(WRITE_ALIGN)
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.ctx.remaining_after(self.pass, 0);
    }
}

impl Shared {
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A write buffer for a worker: a kept one, or a new one.
    fn bounce(&self) -> Bounce {
        let kept = self.bounces.lock().unwrap_or_else(|p| p.into_inner()).pop();
        kept.unwrap_or_else(|| Bounce::new(WRITE_BOUNCE))
    }

    fn give_back(&self, bounce: Bounce) {
        self.bounces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(bounce);
    }

    fn digest(&self) -> std::sync::MutexGuard<'_, Digest> {
        self.digest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hashes the file's contiguous written prefix as far as it reaches,
    /// reading back what the workers could not hash as they wrote it.
    fn catch_up_digest(&self) -> std::io::Result<()> {
        let mut d = self.digest();
        loop {
            let (prefix, all_written) = {
                let slots = self.slots();
                (
                    written_prefix(&slots),
                    slots.iter().all(|s| s.written == s.end),
                )
            };
            let from = d.hashed;
            if from >= prefix {
                return Ok(());
            }
            let Digest { hasher, bounce, .. } = &mut *d;
            let bounce = bounce.get_or_insert_with(|| Bounce::new(HASH_CHUNK as usize));
            self.file
                .read_range(bounce, from, prefix, |b| hasher.update(b))?;
            d.hashed = prefix;
            if all_written {
                d.catch_up += prefix - from;
            }
        }
    }

    fn validator(&self) -> Option<String> {
        self.validator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn io(&self, op: &'static str, e: std::io::Error) -> FetchError {
        FetchError::io(op, &self.part_path, e)
    }

    /// Bytes a new range claims off the front of an unclaimed gap of
    /// `gap` bytes, when every file fetched in ranges has `total` bytes
    /// left. While that leaves a piece for every connection (or files wait
    /// to start): a piece, or a `2 × connections`-th of the gap when that
    /// is larger (fewer requests early). Below it, the end of the whole
    /// fetch: a `connections`-th of `total` (at least the minimum range),
    /// so the last ranges shrink together and the connections run out
    /// together, instead of pieces claimed in the last seconds being
    /// halved by idle connections (each halving cuts its owner's response
    /// and closes its connection: 5 of 38 requests of one capped fetch,
    /// 12 of 51 of another). Judged on all files, not this one: a file
    /// near its own end while others have much left keeps whole pieces.
    fn claim_size(&self, gap: u64, total: u64) -> u64 {
        let waiting = self.ctx.unstarted.load(Ordering::SeqCst) > 0;
        claim_size(&self.ctx.opts, gap, total, waiting)
    }

    /// A piece of a gap of `gap` bytes: `piece_size`, or a
    /// `2 × connections`-th of the gap when that is larger.
    fn piece(&self, gap: u64) -> u64 {
        piece(&self.ctx.opts, gap)
    }

    /// Whether a connection added to this file may raise its rate: its
    /// busy connections, measured in bytes received since their first byte
    /// after the claim over [`RATE_WINDOW`] (well below the limit) or
    /// [`RATE_WINDOW_FULL`], have delivered less than `split_below_rate`
    /// per second on average, and kept their workers waiting for bytes at
    /// least [`MIN_WAITING_SHARE`] of the time ([`delivered`]). A
    /// server or path that caps each connection keeps them below it; a
    /// connection above it is limited by this machine (the one-core digest,
    /// the disk), where a second range of the file only adds bytes written
    /// ahead of the digest, read back from disk. Judged once per pass, at
    /// the first measurement (until then: no), so that stealing at the end
    /// never waits for young ranges to be measured. With no busy connection
    /// (all waiting to retry) there is nothing to judge: yes.
    fn another_connection_pays(&self, slots: &[Slot], now: Instant) -> bool {
        let limit = self.ctx.opts.split_below_rate;
        if limit == 0 {
            return true;
        }
        match self.split_verdict.load(Ordering::SeqCst) {
            SPLIT_PAYS => return true,
            SPLIT_DOES_NOT_PAY => return false,
            _ => {}
        }
        let Some(d) = delivered(slots, now) else {
            return true;
        };
        let Some(pays) = split_pays(limit, &d) else {
            return false;
        };
        let verdict = if pays { SPLIT_PAYS } else { SPLIT_DOES_NOT_PAY };
        self.split_verdict.store(verdict, Ordering::SeqCst);
        pays
    }

    /// The next range for a connection, marked busy; the split it needs is
    /// made in memory only and becomes durable with the attempt's row
    /// ([`Claim`]). Ranges are claimed front to back so that they complete
    /// roughly in file order and the digest, which follows the contiguous
    /// written prefix, keeps up with them instead of hashing most of the
    /// file after its last byte. In order:
    /// 1. the first idle incomplete range whose retry (if any) is due; when
    ///    it is longer than a piece, the rest is split off as a new idle
    ///    range;
    /// 2. else the busy or waiting range with the largest remaining gap:
    ///    when that gap holds two pieces, its owner keeps one and the rest
    ///    becomes an idle range, taken by step 1; otherwise its upper half
    ///    becomes a new busy range (work stealing). Never below the
    ///    minimum range size.
    ///
    /// Called by the coordinator for a new connection and by a worker whose
    /// range is done, which goes on at once on the same connection.
    fn claim(&self) -> Option<Claim> {
        let min = self.ctx.opts.min_range.max(WRITE_ALIGN);
        let splittable = self.splittable.load(Ordering::SeqCst) && self.validator().is_some();
        let mut slots = self.slots();
        let left = slots
            .iter()
            .filter(|s| !s.complete())
            .fold(0u64, |a, s| a.saturating_add(s.end - s.pos));
        let total = self.ctx.remaining_after(self.pass, left);
        let mut boundaries = Vec::new();
        loop {
            let now = Instant::now();
            if let Some(i) = slots
                .iter()
                .position(|s| !s.busy && !s.complete() && !s.waiting(now))
            {
                let s = &mut slots[i];
                s.busy = true;
                s.retry_at = None;
                s.first_byte = None;
                s.handling = Duration::ZERO;
                let start = s.start;
                let size = self.claim_size(s.end - s.written, total);
                let at = align_up(s.written.saturating_add(size));
                if splittable && at < s.end && s.end - at >= min {
                    split_slot(&mut slots, i, at, false);
                    boundaries.push(at);
                }
                return Some(Claim { start, boundaries });
            }
            if !splittable {
                return None;
            }
            let (i, s) = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.busy || s.waiting(now))
                .max_by_key(|(_, s)| s.end - s.pos)?;
            if !self.another_connection_pays(&slots, now) {
                return None;
            }
            let remaining = s.end - s.pos;
            let piece = self.piece(remaining);
            // A piece off the front leaves the rest idle (taken by step 1);
            // a half is a new busy range, taken now.
            let (at, busy) = if remaining >= 2 * piece {
                (align_up(s.pos + piece), false)
            } else if remaining >= 2 * min {
                (align_up(s.pos + remaining / 2), true)
            } else {
                return None;
            };
            if at <= s.pos || at >= s.end || s.end - at < min {
                return None;
            }
            split_slot(&mut slots, i, at, busy);
            boundaries.push(at);
            if busy {
                return Some(Claim {
                    start: at,
                    boundaries,
                });
            }
        }
    }
}

/// The digest of one pass. It follows the contiguous written prefix from
/// byte 0: a worker whose bytes are the digest's next hashes them from
/// memory as it writes them; the coordinator reads back the rest (ranges
/// written ahead of the digest) at its checkpoints and before the final
/// comparison. After a crash the pass starts over from the durable prefix,
/// re-hashed from disk, so hashing bytes not yet durable is safe.
struct Digest {
    hasher: IdentityHasher,
    /// `[0, hashed)` is hashed.
    hashed: u64,
    /// Bytes read back once every byte of the file was written.
    catch_up: u64,
    /// Read-back buffer (aligned for reads past the page cache), made on
    /// first use.
    bounce: Option<Bounce>,
}

/// A range claimed for a connection: where it starts, and the positions
/// the claim made range starts in memory. They become durable in the same
/// transaction as the attempt's row ([`ftpipe_receipts::Store::claim_range`]),
/// which commits while the request is on its way and before any byte of
/// the response is written; claims commit in any order (a boundary already
/// there is kept), so no claim waits for another.
struct Claim {
    start: u64,
    boundaries: Vec<u64>,
}

/// How a worker's response ended.
enum Ended {
    /// Its range is complete.
    Done,
    /// A `200` to a range request: ranges ignored or the file changed.
    RangeNotHonoured { validator: Option<String> },
    /// Stopped because the coordinator cancelled the file.
    Cancelled,
}

/// A worker's report.
struct WorkerEnd {
    start: u64,
    result: Result<Ended>,
    attempt: Attempt,
    /// Received but not stored (a buffered remainder below the alignment).
    unkept: u64,
    /// Received past the end of the range the request asked for (a body
    /// longer than its `Content-Range`, possible without `Content-Length`).
    excess: u64,
    retry_after: Option<u64>,
    /// The attempt cannot count as progress (a stall).
    unproductive: bool,
    /// The worker's connection; taken by the coordinator when it hands the
    /// connection on before handling the end.
    permit: Option<OwnedSemaphorePermit>,
}

/// What one pass over the file came to.
enum Pass {
    Published,
    /// Every byte must be discarded for `reason`; start again (`single`:
    /// as one stream).
    Restart {
        single: bool,
        reason: DiscardReason,
    },
}

/// Fetches, verifies and publishes one file in ranges, starting with
/// `permit` (its first connection). A connection is held only by a range
/// whose request is being made or read, never by one waiting to retry.
pub async fn fetch_segmented(
    ctx: Arc<FetchCtx>,
    file: FileRow,
    final_path: PathBuf,
    permit: OwnedSemaphorePermit,
) -> Result<()> {
    let expected = expected_identity(&file)?;
    if super::cache::adopt_whole(&ctx, &file, &expected, &final_path).await? {
        return Ok(());
    }
    let mut task = Coordinator {
        ctx,
        file,
        expected,
        final_path,
        permits: vec![permit],
        single: false,
        range_ignored: 0,
        digest_failures: 0,
        cache_prefix_tried: false,
        restarting: false,
    };
    loop {
        match task.pass().await? {
            Pass::Published => return Ok(()),
            Pass::Restart { single, .. } => task.single |= single,
        }
    }
}

struct Coordinator {
    ctx: Arc<FetchCtx>,
    file: FileRow,
    expected: Expected,
    final_path: PathBuf,
    /// Connections held and not in use by a worker.
    permits: Vec<OwnedSemaphorePermit>,
    /// Fetch as one stream (the server ignores ranges).
    single: bool,
    range_ignored: u32,
    digest_failures: u32,
    /// An interrupted download in the Hugging Face cache was looked for.
    cache_prefix_tried: bool,
    /// This pass already decided to start again.
    restarting: bool,
}

/// The state of one pass: the open part file and the digest so far.
struct PassState {
    shared: Arc<Shared>,
    cancel: watch::Sender<bool>,
    last_checkpoint: Instant,
}

impl Coordinator {
    fn path(&self) -> &str {
        &self.file.path
    }

    fn part_path(&self) -> PathBuf {
        part_path(&self.final_path)
    }

    fn io(&self, op: &'static str, e: std::io::Error) -> FetchError {
        FetchError::io(op, self.part_path(), e)
    }

    fn rewound(&self, to: u64, reason: DiscardReason) {
        self.ctx.reporter.report(ProgressEvent::FileRewound {
            path: self.path().to_owned(),
            to,
            reason: reason.to_string(),
        });
    }

    async fn discard(
        &self,
        reason: DiscardReason,
        bytes: u64,
        committed: u64,
        received: bool,
    ) -> Result<()> {
        discard(&self.ctx, self.path(), reason, bytes, committed, received).await
    }

    /// Brings `.part`, ledger and ranges into agreement and opens the pass.
    async fn open(&mut self) -> Result<PassState> {
        let store = &self.ctx.store;
        let path = self.path().to_owned();
        let size = self.file.size;
        let part_path = self.part_path();
        let mut ranges = store.ranges(&path).await?;
        let mut part = block_in_place(|| {
            super::part::PartFile::open(self.ctx.layout.source(), &part_path, self.ctx.opts.io_mode)
        })
        .map_err(|e| self.io("open", e))?;
        if !ranges.is_empty() && !tiles(&ranges, size) {
            // Not a tiling of this file (stored for another size): the
            // ranges say nothing about its bytes.
            let committed = store.ledger_row(&path).await?.committed;
            block_in_place(|| part.truncate(0)).map_err(|e| self.io("truncate", e))?;
            self.discard(DiscardReason::RangesDoNotTileTheFile, committed, 0, false)
                .await?;
            store.end_ranges(&path).await?;
            ranges.clear();
        }
        if !ranges.is_empty() {
            let durable_end = ranges
                .iter()
                .filter(|r| r.watermark > r.start)
                .map(|r| r.watermark)
                .max()
                .unwrap_or(0);
            if part.len() < durable_end {
                // The part lost bytes the ranges claim: nothing in it can be trusted.
                let committed = store.ledger_row(&path).await?.committed;
                block_in_place(|| part.truncate(0)).map_err(|e| self.io("truncate", e))?;
                self.discard(DiscardReason::PartShorterThanWatermark, committed, 0, false)
                    .await?;
                store.end_ranges(&path).await?;
                ranges.clear();
            }
        }
        if ranges.is_empty() {
            // A single-stream prefix carries over, cut to the alignment.
            settle_stream_part(
                &self.ctx,
                &self.file,
                &mut part,
                &mut self.cache_prefix_tried,
            )
            .await?;
            let kept = part.len();
            let aligned = align_down(kept);
            if aligned < kept {
                // The watermark comes down first: the store never claims
                // more than the file holds, even if the cut is lost.
                self.discard(
                    DiscardReason::SegmentAlignment,
                    kept - aligned,
                    aligned,
                    false,
                )
                .await?;
                block_in_place(|| part.truncate(aligned)).map_err(|e| self.io("truncate", e))?;
            }
            ranges = store.begin_ranges(&path).await?;
        }
        let direct = part.into_file();
        let file = direct.file();
        block_in_place(|| file.set_len(size)).map_err(|e| self.io("size", e))?;
        // Un-checkpointed tails a crash left behind: only where an attempt
        // was in flight when the process died; measured, recorded, then
        // punched out so a second crash cannot count them again.
        for r in ranges.iter().filter(|r| !r.complete()) {
            let Some(attempt) = store.in_flight_attempt(&path, r.start, r.end).await? else {
                continue;
            };
            let tail = block_in_place(|| written_tail(file, r.watermark, r.end))
                .map_err(|e| self.io("seek", e))?;
            if tail > 0 {
                store
                    .discard_unkept(
                        self.ctx.run,
                        &path,
                        DiscardReason::UncheckpointedTail,
                        tail,
                        attempt,
                        true,
                    )
                    .await?;
                self.rewound(r.watermark, DiscardReason::UncheckpointedTail);
                block_in_place(|| punch_hole(file, r.watermark, tail));
            }
        }
        let ledger = store.ledger_row(&path).await?;
        if self.ctx.offline && ranges.iter().any(|r| !r.complete()) {
            return Err(FetchError::Hub(HubError::Offline {
                what: format!(
                    "{path} ({} of {size} bytes durable, not in the Hugging Face cache)",
                    ledger.committed
                ),
            }));
        }
        let slots: Vec<Slot> = ranges.iter().map(Slot::from_row).collect();
        let prefix = contiguous_prefix(&slots);
        let mut hasher = self.expected.hasher(size);
        block_in_place(|| hash_part_prefix(&direct, prefix, &mut hasher))
            .map_err(|e| self.io("re-hash prefix of", e))?;
        let validator = if ledger.committed > 0 || ranges.len() > 1 {
            ledger.validator
        } else {
            None
        };
        let (cancel, cancelled) = watch::channel(false);
        let digest = Digest {
            hasher,
            hashed: prefix,
            catch_up: 0,
            bounce: None,
        };
        let shared = Arc::new(Shared {
            ctx: self.ctx.clone(),
            path,
            size,
            lfs_sha256: self.file.lfs_sha256.clone(),
            part_path,
            file: direct,
            bounces: Mutex::new(Vec::new()),
            pass: self.ctx.next_pass.fetch_add(1, Ordering::SeqCst),
            split_verdict: std::sync::atomic::AtomicU8::new(SPLIT_UNJUDGED),
            slots: Mutex::new(slots),
            validator: Mutex::new(validator),
            splittable: std::sync::atomic::AtomicBool::new(!self.single),
            digest: Mutex::new(digest),
            wrote: Notify::new(),
            cancel: cancelled,
        });
        self.ctx.reporter.report(ProgressEvent::FileStarted {
            path: self.path().to_owned(),
            size,
            resumed_from: ledger.committed,
        });
        Ok(PassState {
            shared,
            cancel,
            last_checkpoint: Instant::now(),
        })
    }

    /// One pass: fetch every range, verify, publish.
    async fn pass(&mut self) -> Result<Pass> {
        self.restarting = false;
        let mut st = self.open().await?;
        let schedule = ExponentialBuilder::default()
            .with_min_delay(self.ctx.opts.retry_base)
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(self.ctx.opts.retries as usize)
            .with_jitter();
        let mut workers: JoinSet<WorkerEnd> = JoinSet::new();
        let mut failure: Option<FetchError> = None;
        let mut restart: Option<Pass> = None;
        let mut delays: std::collections::HashMap<u64, backon::ExponentialBackoff> =
            std::collections::HashMap::new();
        // Ends of ranges whose worker went on to another range.
        let (ends_tx, mut ends) = mpsc::unbounded_channel::<WorkerEnd>();
        loop {
            // A worker reports an end here before its task can finish, so
            // none is left unhandled once the tasks are all joined.
            while let Ok(end) = ends.try_recv() {
                let outcome = self
                    .worker_ended(&mut st, end, &schedule, &mut delays)
                    .await?;
                stop_on(outcome, &st.cancel, &mut failure, &mut restart);
            }
            if failure.is_none() && restart.is_none() {
                self.schedule(&st, &mut workers, &ends_tx);
            }
            if workers.is_empty() {
                if failure.is_some() || restart.is_some() || all_complete(&st.shared) {
                    break;
                }
                if let Some(due) = only_waiting(&st.shared) {
                    // Every range left waits to retry: no connection is
                    // held meanwhile, another file may use it.
                    self.permits.clear();
                    tokio::time::sleep_until(due.into()).await;
                    continue;
                }
                // Work is left but no connection is held: wait for one, fairly.
                let permit = self
                    .ctx
                    .connections
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| FetchError::internal_from("connection pool", e))?;
                self.permits.push(permit);
                continue;
            }
            let due = st.last_checkpoint.elapsed() >= self.ctx.opts.checkpoint_interval
                || received_since(&st.shared) >= self.ctx.opts.checkpoint_bytes;
            if due {
                self.checkpoint(&mut st).await?;
            }
            tokio::select! {
                joined = workers.join_next() => {
                    let Some(joined) = joined else { continue };
                    let mut end = joined.map_err(|e| FetchError::internal_from("range task", e))?;
                    if matches!(end.result, Ok(Ended::Done)) && failure.is_none() && restart.is_none() {
                        // The connection goes on to the next range before this
                        // range's checkpoint (an fsync). The ended slot stays
                        // busy until handled.
                        self.permits.extend(end.permit.take());
                        self.schedule(&st, &mut workers, &ends_tx);
                    }
                    let outcome = self.worker_ended(&mut st, end, &schedule, &mut delays).await?;
                    stop_on(outcome, &st.cancel, &mut failure, &mut restart);
                }
                Some(end) = ends.recv() => {
                    let outcome = self.worker_ended(&mut st, end, &schedule, &mut delays).await?;
                    stop_on(outcome, &st.cancel, &mut failure, &mut restart);
                }
                _ = st.shared.wrote.notified() => {}
                _ = tokio::time::sleep(next_tick(&st.shared)) => {}
            }
        }
        if let Some(e) = failure {
            // What was written by validated responses is a correct prefix of
            // each range: keep it.
            if let Err(c) = self.checkpoint(&mut st).await {
                tracing::warn!(path = self.path(), error = %c, after = %e, "checkpoint after a failed range did not commit");
            }
            return Err(e);
        }
        if let Some(pass) = restart {
            if let Pass::Restart { reason, .. } = &pass {
                self.discard_everything(&st, *reason).await?;
            }
            return Ok(pass);
        }
        // Every range is written: the last connections serve other files
        // while this one is checkpointed, hashed to its end and published.
        self.permits.clear();
        self.checkpoint(&mut st).await?;
        self.finish(st).await
    }

    /// Starts workers while connections and work are available. A
    /// connection is in hand before work is claimed, so a range is split
    /// only for a worker that starts on it at once.
    fn schedule(
        &mut self,
        st: &PassState,
        workers: &mut JoinSet<WorkerEnd>,
        ends: &mpsc::UnboundedSender<WorkerEnd>,
    ) {
        loop {
            let permit = match self.permits.pop() {
                Some(p) => p,
                None if self.ctx.may_add_connection() => {
                    match self.ctx.connections.clone().try_acquire_owned() {
                        Ok(p) => p,
                        Err(_) => break,
                    }
                }
                None => break,
            };
            let Some(claim) = st.shared.claim() else {
                self.permits.push(permit);
                break;
            };
            workers.spawn(worker(st.shared.clone(), claim, permit, ends.clone()));
        }
        // Connections held without a use go back to the pool.
        if !workers.is_empty() {
            self.permits.clear();
        }
    }

    /// Handles a worker's end: checkpoint, account, retry or stop.
    async fn worker_ended(
        &mut self,
        st: &mut PassState,
        end: WorkerEnd,
        schedule: &ExponentialBuilder,
        delays: &mut std::collections::HashMap<u64, backon::ExponentialBackoff>,
    ) -> Result<Next> {
        let WorkerEnd {
            start,
            result,
            mut attempt,
            unkept,
            excess,
            retry_after,
            unproductive,
            permit,
        } = end;
        self.permits.extend(permit);
        self.checkpoint(st).await?;
        for (reason, bytes) in [
            (DiscardReason::UnalignedRemainder, unkept),
            (DiscardReason::RangeBodyExcess, excess),
        ] {
            if bytes > 0 {
                self.ctx
                    .store
                    .discard_unkept(self.ctx.run, self.path(), reason, bytes, attempt.id, false)
                    .await?;
            }
        }
        let (progressed, stored) = {
            let mut slots = st.shared.slots();
            let s = slots.iter_mut().find(|s| s.start == start);
            match s {
                Some(s) => {
                    s.busy = false;
                    let stored = s.attempt_bytes;
                    s.attempt = None;
                    s.attempt_bytes = 0;
                    (stored > 0 && !unproductive, stored)
                }
                None => (false, 0),
            }
        };
        attempt.body_bytes = stored + unkept + excess;
        attempt.outcome = match &result {
            Ok(Ended::Done) => AttemptOutcome::Ok,
            Ok(Ended::Cancelled) => AttemptOutcome::Cancelled,
            Ok(Ended::RangeNotHonoured { .. }) => AttemptOutcome::Retry,
            Err(e) if e.is_transient() => AttemptOutcome::Retry,
            Err(_) => AttemptOutcome::Failed,
        };
        attempt.error = result.as_ref().err().map(ToString::to_string);
        self.ctx.store.finish_attempt(&attempt).await?;
        match result {
            Ok(Ended::Done) | Ok(Ended::Cancelled) => Ok(Next::Continue),
            Ok(Ended::RangeNotHonoured { validator }) => {
                // One restart per pass, however many ranges saw the 200.
                if self.restarting {
                    return Ok(Next::Continue);
                }
                self.restarting = true;
                self.range_ignored += 1;
                if self.range_ignored > self.ctx.opts.retries {
                    return Ok(Next::Fail(FetchError::RangeIgnored {
                        path: self.path().to_owned(),
                        ignored: self.range_ignored,
                        best: self.ctx.store.ledger_row(self.path()).await?.committed,
                        size: self.file.size,
                        attempts: self.range_ignored,
                    }));
                }
                // The same validator: the server ignores ranges; another:
                // the file changed, and may be split again.
                let same = validator.is_some() && validator == st.shared.validator();
                let single = same || validator.is_none();
                Ok(Next::Restart(Pass::Restart {
                    single,
                    reason: if single {
                        DiscardReason::RangeNotHonoured
                    } else {
                        DiscardReason::ValidatorChanged
                    },
                }))
            }
            Err(e) if e.is_transient() => {
                let mut slots = st.shared.slots();
                let Some(s) = slots.iter_mut().find(|s| s.start == start) else {
                    return Ok(Next::Continue);
                };
                if progressed {
                    s.failures = 0;
                    delays.remove(&start);
                }
                s.failures += 1;
                let backoff = delays.entry(start).or_insert_with(|| schedule.build());
                let Some(mut delay) = backoff.next() else {
                    return Ok(Next::Fail(FetchError::RetriesExhausted {
                        path: self.path().to_owned(),
                        attempts: s.failures,
                        last: Box::new(e),
                    }));
                };
                if let Some(after) = retry_after {
                    delay = delay.max(Duration::from_secs(after).min(MAX_RETRY_AFTER));
                }
                s.retry_at = Some(Instant::now() + delay);
                drop(slots);
                tracing::warn!(path = self.path(), range = start, ?delay, error = %e, "retrying range");
                self.ctx.reporter.report(ProgressEvent::FileRetry {
                    path: self.path().to_owned(),
                    attempt: 1,
                    delay,
                    retry_after_secs: retry_after,
                    error: e.to_string(),
                });
                Ok(Next::Continue)
            }
            Err(e) => Ok(Next::Fail(e)),
        }
    }

    /// fsync, then every range's watermark and the ledger in one
    /// transaction; then the digest catches up with the written prefix.
    async fn checkpoint(&self, st: &mut PassState) -> Result<()> {
        st.last_checkpoint = Instant::now();
        let progress: Vec<RangeProgress> = {
            let mut slots = st.shared.slots();
            slots
                .iter_mut()
                .filter(|s| s.written > s.durable || s.received > 0)
                .map(|s| {
                    let received = std::mem::take(&mut s.received);
                    RangeProgress {
                        start: s.start,
                        watermark: s.written,
                        attempt: s.attempt,
                        received,
                    }
                })
                .collect()
        };
        if progress.is_empty() {
            return Ok(());
        }
        block_in_place(|| st.shared.file.file().sync_data()).map_err(|e| self.io("fsync", e))?;
        // Bytes durable past the watermarks the store still holds.
        crashpoint::hit(CrashPoint::CheckpointSynced);
        let validator = st.shared.validator();
        let store = &self.ctx.store;
        match store
            .checkpoint_ranges(self.path(), &progress, validator.as_deref())
            .await
        {
            Err(e) if e.is_disk_full() => {
                self.ctx.mark_volume_full();
                store
                    .checkpoint_ranges(self.path(), &progress, validator.as_deref())
                    .await?;
            }
            r => r?,
        }
        {
            let mut slots = st.shared.slots();
            for p in &progress {
                if let Some(s) = slots.iter_mut().find(|s| s.start == p.start) {
                    s.durable = p.watermark;
                }
            }
        }
        let shared = &st.shared;
        block_in_place(|| shared.catch_up_digest()).map_err(|e| self.io("hash", e))
    }

    /// Every byte of the file, durable or not, is thrown away (recorded).
    async fn discard_everything(&self, st: &PassState, reason: DiscardReason) -> Result<()> {
        let store = &self.ctx.store;
        // Bytes are received only by a range's current attempt, which the
        // slot names until that attempt's end is handled.
        let unkept: Vec<(Option<i64>, u64)> = {
            let slots = st.shared.slots();
            slots
                .iter()
                .filter(|s| s.received > 0)
                .map(|s| (s.attempt, s.received))
                .collect()
        };
        for (attempt, bytes) in unkept {
            let attempt = attempt.ok_or_else(|| {
                FetchError::internal(format!(
                    "{}: {bytes} bytes received by a range with no attempt",
                    self.path()
                ))
            })?;
            store
                .discard_unkept(
                    self.ctx.run,
                    self.path(),
                    DiscardReason::UncheckpointedTail,
                    bytes,
                    attempt,
                    false,
                )
                .await?;
        }
        let committed = store.ledger_row(self.path()).await?.committed;
        block_in_place(|| st.shared.file.file().set_len(0)).map_err(|e| self.io("truncate", e))?;
        block_in_place(|| st.shared.file.file().sync_all()).map_err(|e| self.io("fsync", e))?;
        self.discard(reason, committed, 0, false).await?;
        store.end_ranges(self.path()).await?;
        Ok(())
    }

    /// Verifies the digest of the whole file and publishes it.
    async fn finish(&mut self, st: PassState) -> Result<Pass> {
        let size = self.file.size;
        let shared = &st.shared;
        block_in_place(|| shared.catch_up_digest()).map_err(|e| self.io("hash", e))?;
        let (hashed, catch_up, actual) = {
            let d = shared.digest();
            (d.hashed, d.catch_up, d.hasher.clone().finish_hex())
        };
        if hashed != size {
            return Err(FetchError::Hub(HubError::ShortBody {
                path: self.path().to_owned(),
                received: hashed,
                expected: size,
            }));
        }
        if actual != self.expected.hex() {
            self.discard_everything(&st, DiscardReason::DigestMismatch)
                .await?;
            self.digest_failures += 1;
            let err = FetchError::DigestMismatch {
                path: self.path().to_owned(),
                kind: self.expected.kind(),
                expected: self.expected.hex().to_owned(),
                actual,
                size,
            };
            if self.digest_failures > DIGEST_REFETCHES {
                return Err(err);
            }
            self.ctx.reporter.report(ProgressEvent::FileRetry {
                path: self.path().to_owned(),
                attempt: self.digest_failures,
                delay: Duration::ZERO,
                retry_after_secs: None,
                error: err.to_string(),
            });
            return Ok(Pass::Restart {
                single: false,
                reason: DiscardReason::DigestMismatch,
            });
        }
        crashpoint::hit(CrashPoint::FetchVerified);
        let part = self.part_path();
        let final_path = self.final_path.clone();
        block_in_place(|| -> std::io::Result<()> {
            st.shared.file.file().sync_all()?;
            std::fs::rename(&part, &final_path)?;
            sync_dir(final_path.parent().unwrap_or(Path::new(".")))
        })
        .map_err(|e| FetchError::io("publish", &final_path, e))?;
        crashpoint::hit(CrashPoint::FetchRenamed);
        record_published(
            &self.ctx,
            &self.file,
            &self.expected,
            actual,
            Some(catch_up),
            st.shared.file.direct_written(),
        )
        .await?;
        Ok(Pass::Published)
    }
}

enum Next {
    Continue,
    Fail(FetchError),
    Restart(Pass),
}

/// Keeps the first failure or restart and cancels the file's other ranges.
fn stop_on(
    next: Next,
    cancel: &watch::Sender<bool>,
    failure: &mut Option<FetchError>,
    restart: &mut Option<Pass>,
) {
    match next {
        Next::Continue => {}
        Next::Fail(e) => {
            let _ = cancel.send(true);
            failure.get_or_insert(e);
        }
        Next::Restart(p) => {
            let _ = cancel.send(true);
            restart.get_or_insert(p);
        }
    }
}

/// Ends `slots[i]` at `at`; `[at, old end)` becomes a new range after it,
/// `busy` when a worker starts on it now.
fn split_slot(slots: &mut Vec<Slot>, i: usize, at: u64, busy: bool) {
    let old_end = std::mem::replace(&mut slots[i].end, at);
    let mut new = Slot::from_row(&RangeRow {
        start: at,
        end: old_end,
        watermark: at,
    });
    new.busy = busy;
    slots.insert(i + 1, new);
}

/// When every incomplete range is idle and waiting to retry: the earliest
/// retry.
fn only_waiting(shared: &Shared) -> Option<Instant> {
    let now = Instant::now();
    let slots = shared.slots();
    let mut left = slots.iter().filter(|s| !s.complete()).peekable();
    left.peek()?;
    left.map(|s| s.waiting(now).then_some(s.retry_at).flatten())
        .collect::<Option<Vec<Instant>>>()?
        .into_iter()
        .min()
}

/// How long the coordinator may sleep: the schedule tick, or less when a
/// retry falls due sooner.
fn next_tick(shared: &Shared) -> Duration {
    let now = Instant::now();
    shared
        .slots()
        .iter()
        .filter(|s| s.waiting(now))
        .filter_map(|s| s.retry_at)
        .map(|t| t - now)
        .fold(SCHEDULE_TICK, Duration::min)
}

fn all_complete(shared: &Shared) -> bool {
    shared.slots().iter().all(Slot::complete)
}

fn received_since(shared: &Shared) -> u64 {
    shared.slots().iter().map(|s| s.received).sum()
}

/// Whether `ranges` (by start) cover `[0, size)` exactly, without gaps.
fn tiles(ranges: &[RangeRow], size: u64) -> bool {
    let mut at = 0;
    for r in ranges {
        if r.start != at || r.end <= r.start {
            return false;
        }
        at = r.end;
    }
    at == size
}

/// End of the written bytes that follow on from byte 0.
fn written_prefix(slots: &[Slot]) -> u64 {
    prefix_up_to(slots, |s| s.written)
}

/// End of the durable bytes that follow on from byte 0.
fn contiguous_prefix(slots: &[Slot]) -> u64 {
    prefix_up_to(slots, |s| s.durable)
}

/// End of the bytes from 0 that ranges hold up to `mark`, without a gap.
fn prefix_up_to(slots: &[Slot], mark: impl Fn(&Slot) -> u64) -> u64 {
    let mut prefix = 0;
    for s in slots {
        if s.start != prefix {
            break;
        }
        prefix = mark(s);
        if prefix < s.end {
            break;
        }
    }
    prefix
}

/// Calls `f` with the first `len` bytes of `chunks`, in order.
fn for_each_slice(chunks: &VecDeque<Bytes>, len: usize, mut f: impl FnMut(&[u8])) {
    let mut want = len;
    for c in chunks {
        if want == 0 {
            break;
        }
        let take = c.len().min(want);
        f(&c[..take]);
        want -= take;
    }
}

/// Bytes written past `watermark` (before `end`): the data extent that
/// starts there. Writes are aligned, so an extent is exactly what was
/// written; a filesystem without `SEEK_DATA` reports the rest of the range
/// (an over-count, never an under-count).
pub(super) fn written_tail(file: &File, watermark: u64, end: u64) -> std::io::Result<u64> {
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
/// cannot punch holes keeps the stale bytes (they are overwritten before
/// they are claimed).
fn punch_hole(file: &File, offset: u64, len: u64) {
    use rustix::fs::{FallocateFlags, fallocate};
    let _ = fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    );
}

/// Streams ranges into the part file over one connection: the claimed
/// one, then, as long as each ends complete and the file has work left,
/// the next claimed at once (its end is reported on `ends`), so the
/// connection never waits for the coordinator. Returns with the last
/// range's end and the connection.
async fn worker(
    shared: Arc<Shared>,
    mut claim: Claim,
    permit: OwnedSemaphorePermit,
    ends: mpsc::UnboundedSender<WorkerEnd>,
) -> WorkerEnd {
    loop {
        let end = fetch_range(shared.clone(), claim).await;
        if matches!(end.result, Ok(Ended::Done))
            && !*shared.cancel.borrow()
            && let Some(next) = shared.claim()
        {
            // The coordinator outlives its workers; were it gone, the
            // end would have no one to account it anyway.
            let _ = ends.send(end);
            claim = next;
            continue;
        }
        return WorkerEnd {
            permit: Some(permit),
            ..end
        };
    }
}

/// Streams one range into the part file.
async fn fetch_range(shared: Arc<Shared>, claim: Claim) -> WorkerEnd {
    let mut w = RangeWorker {
        shared,
        start: claim.start,
        boundaries: claim.boundaries,
        buffer: VecDeque::new(),
        buffered: 0,
        bounce: None,
        excess: 0,
        retry_after: None,
        unproductive: false,
        attempt: Attempt::default(),
    };
    // `run` stops at its own await points (the request, each chunk) when
    // the file is cancelled, never inside a database write.
    let result = if *w.shared.cancel.borrow() {
        Ok(Ended::Cancelled)
    } else {
        w.run().await
    };
    // Whole blocks of the buffer are still worth writing; the remainder
    // below the alignment is not kept.
    let flushed = w.flush(false);
    let unkept = w.buffered as u64;
    if let Some(b) = w.bounce.take() {
        w.shared.give_back(b);
    }
    let result = match (result, flushed) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(v), Ok(())) => Ok(v),
    };
    WorkerEnd {
        start: w.start,
        result,
        attempt: w.attempt,
        unkept,
        excess: w.excess,
        retry_after: w.retry_after,
        unproductive: w.unproductive,
        permit: None,
    }
}

struct RangeWorker {
    shared: Arc<Shared>,
    start: u64,
    /// Range starts the claim made in memory, durable with the attempt.
    boundaries: Vec<u64>,
    /// Received, not yet written (from `written` on): the response's own
    /// chunks, written with one vectored write and never copied.
    buffer: VecDeque<Bytes>,
    /// Bytes in `buffer`.
    buffered: usize,
    /// Where whole blocks are copied to be written (taken from and given
    /// back to [`Shared::bounces`]).
    bounce: Option<Bounce>,
    /// Bytes received past the end this request asked for.
    excess: u64,
    retry_after: Option<u64>,
    unproductive: bool,
    attempt: Attempt,
}

impl RangeWorker {
    fn path(&self) -> &str {
        &self.shared.path
    }

    async fn run(&mut self) -> Result<Ended> {
        let shared = self.shared.clone();
        let ctx = &shared.ctx;
        let size = shared.size;
        let path = shared.path.clone();
        let (from, end) = {
            let mut slots = shared.slots();
            let Some(s) = slots.iter_mut().find(|s| s.start == self.start) else {
                return Ok(Ended::Done);
            };
            s.pos = s.written;
            (s.written, s.end)
        };
        if from >= end {
            return Ok(Ended::Done);
        }
        let validator = shared.validator();
        let mut headers = HeaderMap::new();
        headers.insert(RANGE, header_value(&format!("bytes={from}-{}", end - 1))?);
        self.attempt = Attempt {
            path: path.clone(),
            range_start: Some(from),
            ..Attempt::default()
        };
        if let Some(v) = validator.as_deref() {
            headers.insert(IF_RANGE, header_value(v)?);
            self.attempt.if_range = Some(v.to_owned());
        }
        let url = ctx
            .client
            .resolve_url(&ctx.pin.repo, &ctx.pin.commit, &path)?;
        self.attempt.host = url
            .host_str()
            .ok_or_else(|| {
                FetchError::internal(format!(
                    "file URL {} has no host",
                    ftpipe_hub::client::redact(&url)
                ))
            })?
            .to_owned();
        let mut cancel = shared.cancel.clone();
        // The request goes out while the claim (the range's split, if any,
        // and the attempt's row) commits, an fsync: both are done before
        // any byte of the response is written, so every written byte lies
        // in a durable range and belongs to a durable attempt.
        let claimed = ctx.store.claim_range(
            ctx.run,
            &path,
            &self.boundaries,
            validator.as_deref(),
            &self.attempt,
        );
        let (id, body) = tokio::join!(claimed, async {
            tokio::select! {
                b = ctx.client.get_body(&path, url, headers) => Some(b),
                _ = cancel.wait_for(|c| *c) => None,
            }
        });
        self.attempt.id = id?;
        if !self.boundaries.is_empty() {
            // A split is durable and nothing of its range is written yet.
            crashpoint::hit(CrashPoint::RangeSplit);
        }
        {
            let mut slots = shared.slots();
            if let Some(s) = slots.iter_mut().find(|s| s.start == self.start) {
                s.attempt = Some(self.attempt.id);
                s.attempt_bytes = 0;
            }
        }
        let Some(body) = body else {
            return Ok(Ended::Cancelled);
        };
        let body = body?;
        self.attempt.host = body.host.clone();
        let mut resp = body.response;
        let status = resp.status();
        self.attempt.status = Some(status.as_u16());
        self.attempt.etag = etag(resp.headers());
        self.attempt.content_range = resp
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        check_linked_meta(
            &body.meta,
            &ctx.pin.commit,
            size,
            shared.lfs_sha256.as_deref(),
        )
        .map_err(|c| FetchError::PinContradicted {
            path: path.clone(),
            header: c.header,
            expected: c.expected,
            actual: c.actual,
            what: c.what,
        })?;
        let now = strong_validator(resp.headers());
        match status {
            StatusCode::PARTIAL_CONTENT => {
                check_range(&path, resp.headers(), from, end, size)?;
                match &validator {
                    Some(v) if now.as_ref() != Some(v) => {
                        // Message only: a missing ETag shows as "".
                        return Err(FetchError::Hub(HubError::BadHeader {
                            path,
                            header: "ETag",
                            expected: v.clone(),
                            actual: now.unwrap_or_default(),
                        }));
                    }
                    Some(_) => {}
                    None => self.learn_validator(now)?,
                }
                if let Some(len) = resp.content_length()
                    && len != end - from
                {
                    return Err(FetchError::Hub(HubError::BadHeader {
                        path,
                        header: "Content-Length",
                        expected: (end - from).to_string(),
                        actual: len.to_string(),
                    }));
                }
            }
            StatusCode::OK if from == 0 && end == size && validator.is_none() => {
                // Ranges ignored on a file with nothing yet: one stream.
                shared.splittable.store(false, Ordering::SeqCst);
                self.learn_validator(now)?;
                if let Some(len) = resp.content_length()
                    && len != size
                {
                    return Err(FetchError::Hub(HubError::BadHeader {
                        path,
                        header: "Content-Length",
                        expected: size.to_string(),
                        actual: len.to_string(),
                    }));
                }
            }
            StatusCode::OK => return Ok(Ended::RangeNotHonoured { validator: now }),
            other => {
                if matches!(other.as_u16(), 429 | 503) {
                    self.retry_after = retry_after_secs(resp.headers());
                }
                return Err(FetchError::Hub(HubError::Status {
                    url: ftpipe_hub::client::redact(resp.url()),
                    status: other.as_u16(),
                    detail: format!(" (fetching {path}, range {from}-{})", end - 1),
                }));
            }
        }
        let mut rate = RateWindow::new(ctx.opts.min_rate, ctx.opts.stall_window);
        // Time spent on the last chunk, from its arrival until the worker
        // asked for more; added to the slot with the next chunk.
        let mut handled = Duration::ZERO;
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout(BODY_TICK, resp.chunk()) => n,
                _ = cancel.wait_for(|c| *c) => return Ok(Ended::Cancelled),
            };
            let Ok(next) = next else {
                if let Err(e) = rate.check(&path, 0) {
                    self.unproductive = true;
                    return Err(e);
                }
                continue;
            };
            let chunk = match next {
                Ok(Some(c)) => c,
                Ok(None) => {
                    let pos = self.claimed();
                    return if pos.0 >= pos.1 {
                        Ok(Ended::Done)
                    } else {
                        Err(FetchError::Hub(HubError::ShortBody {
                            path,
                            received: pos.0 - from,
                            expected: end - from,
                        }))
                    };
                }
                Err(e) => {
                    return Err(FetchError::Hub(HubError::BodyFailed {
                        path: path.clone(),
                        received: self.claimed().0 - from,
                        message: error_chain(&e),
                    }));
                }
            };
            let arrived = Instant::now();
            // The range may have been split since: keep what is still ours.
            let (keep, done) = {
                let mut slots = shared.slots();
                let Some(s) = slots.iter_mut().find(|s| s.start == self.start) else {
                    return Ok(Ended::Done);
                };
                let keep = (chunk.len() as u64).min(s.end - s.pos);
                s.pos += keep;
                if s.first_byte.is_none() {
                    s.first_byte = Some((arrived, s.pos));
                    s.handling = Duration::ZERO;
                } else {
                    s.handling += handled;
                }
                // Past the requested end (not a split's shorter end): the
                // server sent more than its Content-Range said.
                if s.end == end {
                    self.excess += chunk.len() as u64 - keep;
                }
                (keep, s.pos == s.end)
            };
            if keep > 0 {
                self.buffered += keep as usize;
                self.buffer.push_back(chunk.slice(..keep as usize));
            }
            if done || self.buffered >= WRITE_BATCH {
                self.flush(done)?;
            }
            if done {
                return Ok(Ended::Done);
            }
            if let Err(e) = rate.check(&path, keep) {
                self.unproductive = true;
                return Err(e);
            }
            handled = arrived.elapsed();
        }
    }

    /// Takes `now` as the file's validator, unless another range already
    /// learned a different one: bytes of two versions are never combined.
    fn learn_validator(&self, now: Option<String>) -> Result<()> {
        if now.is_none() {
            self.shared.splittable.store(false, Ordering::SeqCst);
        }
        let mut v = self
            .shared
            .validator
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match (&*v, &now) {
            (Some(known), Some(got)) if known != got => Err(FetchError::Hub(HubError::BadHeader {
                path: self.shared.path.clone(),
                header: "ETag",
                expected: known.clone(),
                actual: got.clone(),
            })),
            // `v` is Some in this arm; the default is never taken.
            (Some(_), None) => Err(FetchError::Hub(HubError::BadHeader {
                path: self.shared.path.clone(),
                header: "ETag",
                expected: v.clone().unwrap_or_default(),
                actual: String::new(),
            })),
            _ => {
                *v = now;
                Ok(())
            }
        }
    }

    /// `(pos, end)` of this worker's range.
    fn claimed(&self) -> (u64, u64) {
        let slots = self.shared.slots();
        slots
            .iter()
            .find(|s| s.start == self.start)
            .map_or((0, 0), |s| (s.pos, s.end))
    }

    /// Writes the whole aligned blocks of the buffer (all of it when `all`,
    /// at the range's end).
    fn flush(&mut self, all: bool) -> Result<()> {
        let shared = self.shared.clone();
        let written = {
            let slots = shared.slots();
            match slots.iter().find(|s| s.start == self.start) {
                Some(s) => s.written,
                None => return Ok(()),
            }
        };
        let upto = written + self.buffered as u64;
        let n = if all {
            upto - written
        } else {
            align_down(upto).saturating_sub(written)
        };
        if n == 0 {
            return Ok(());
        }
        if shared.ctx.volume_full.load(Ordering::SeqCst) {
            return Err(self.no_space(written));
        }
        let (buffer, len) = (&self.buffer, n as usize);
        let wrote = block_in_place(|| {
            let bounce = self.bounce.get_or_insert_with(|| shared.bounce());
            let parts = buffer.iter().map(|c| &c[..]);
            shared.file.write_all_at(bounce, parts, len, written)?;
            // The digest's next bytes are hashed from memory, not read
            // back. Never waited for: while the coordinator holds the
            // digest it reads these back itself (it follows the written
            // prefix until it has caught up).
            if let Ok(mut d) = shared.digest.try_lock()
                && d.hashed == written
            {
                for_each_slice(buffer, len, |b| d.hasher.update(b));
                d.hashed += n;
            }
            Ok::<(), std::io::Error>(())
        });
        match wrote {
            Ok(()) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::StorageFull
                    || e.kind() == std::io::ErrorKind::QuotaExceeded =>
            {
                shared.ctx.mark_volume_full();
                return Err(self.no_space(written));
            }
            Err(e) => return Err(shared.io("write", e)),
        }
        {
            let mut slots = shared.slots();
            if let Some(s) = slots.iter_mut().find(|s| s.start == self.start) {
                s.written += n;
                s.received += n;
                s.attempt_bytes += n;
            }
        }
        consume_front(&mut self.buffer, n as usize);
        self.buffered -= n as usize;
        shared.ctx.reporter.report(ProgressEvent::FileBytes {
            path: self.path().to_owned(),
            bytes: n,
        });
        shared.wrote.notify_one();
        Ok(())
    }

    fn no_space(&self, at: u64) -> FetchError {
        FetchError::NoSpace {
            volume: self.shared.ctx.layout.source().to_owned(),
            path: self.path().to_owned(),
            committed: at,
            still_needed: self.shared.size.saturating_sub(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FetchOptions;

    const MIB: u64 = 1 << 20;

    fn opts() -> FetchOptions {
        FetchOptions {
            connections: 8,
            piece_size: 64 * MIB,
            min_range: 4 * MIB,
            ..FetchOptions::default()
        }
    }

    #[test]
    fn claims_are_pieces_until_the_whole_fetch_nears_its_end() {
        let o = opts();
        // Early: a 16th of a large gap, at least a piece.
        assert_eq!(claim_size(&o, 1536 * MIB, 2400 * MIB, false), 96 * MIB);
        assert_eq!(claim_size(&o, 600 * MIB, 2400 * MIB, false), 64 * MIB);
        // A file near its own end keeps whole pieces while others have a
        // lot left.
        assert_eq!(claim_size(&o, 100 * MIB, 2000 * MIB, false), 64 * MIB);
        // The end of the whole fetch: an 8th of what is left overall.
        assert_eq!(claim_size(&o, 300 * MIB, 320 * MIB, false), 40 * MIB);
        assert_eq!(claim_size(&o, 40 * MIB, 40 * MIB, false), 5 * MIB);
        // Never below the minimum range.
        assert_eq!(claim_size(&o, 8 * MIB, 8 * MIB, false), 4 * MIB);
        // Files waiting to start: not the end.
        assert_eq!(claim_size(&o, 300 * MIB, 320 * MIB, true), 64 * MIB);
    }

    #[test]
    fn a_file_alone_is_its_own_total() {
        // Its last claim counted only what was left then: never smaller
        // than the gap in hand.
        let o = opts();
        assert_eq!(claim_size(&o, 320 * MIB, 0, false), 40 * MIB);
    }

    /// A busy range that received `bytes` over `secs` since its first
    /// byte, of which its worker spent `waiting_secs` waiting for them.
    fn measured(now: Instant, bytes: u64, secs: f64, waiting_secs: f64) -> Slot {
        let handling = (secs - waiting_secs).max(0.0);
        let mut s = Slot::from_row(&RangeRow {
            start: 0,
            end: 1 << 40,
            watermark: 0,
        });
        s.busy = true;
        s.first_byte = Some((now - Duration::from_secs_f64(secs), 0));
        s.pos = bytes;
        s.handling = Duration::from_secs_f64(handling);
        s
    }

    #[test]
    fn a_connection_is_judged_by_its_rate_and_how_long_its_worker_waited() {
        let now = Instant::now();
        // Capped: 10 MB in 0.5 s, the worker waiting 0.49 s of it.
        let capped = delivered(&[measured(now, 10_000_000, 0.5, 0.49)], now).unwrap();
        assert_eq!(capped.rate, Some(20_000_000.0));
        assert!((capped.waiting - 0.98).abs() < 1e-9, "{capped:?}");
        // The same bytes from a slow disk: the next bytes were always there.
        let slow_disk = delivered(&[measured(now, 10_000_000, 0.5, 0.01)], now).unwrap();
        assert_eq!(slow_disk.rate, Some(20_000_000.0));
        assert!(slow_disk.waiting < MIN_WAITING_SHARE, "{slow_disk:?}");
        // Shares are over all measured ranges; handling never exceeds its time.
        let mut busy = measured(now, 1, 0.5, 0.0);
        busy.handling = Duration::from_secs(9);
        let both = delivered(
            &[measured(now, 1, 0.5, 0.5), busy, measured(now, 1, 1.0, 0.5)],
            now,
        )
        .unwrap();
        assert!((both.waiting - 0.5).abs() < 1e-9, "{both:?}");
    }

    #[test]
    fn the_split_verdict_waits_for_the_full_window_unless_a_split_clearly_pays() {
        let limit = 128 * MIB;
        let d = |rate: f64, waiting: f64, ms: u64| Delivered {
            rate: Some(rate),
            waiting,
            longest: Duration::from_millis(ms),
        };
        let capped = 20e6;
        // Capped and waiting: pays after the short window.
        assert_eq!(split_pays(limit, &d(capped, 0.95, 100)), Some(true));
        // Slow but never waiting (a slow disk): not judged until the full
        // window, then does not pay.
        assert_eq!(split_pays(limit, &d(capped, 0.05, 100)), None);
        assert_eq!(split_pays(limit, &d(capped, 0.05, 500)), Some(false));
        // Near the limit: judged after the full window only.
        assert_eq!(split_pays(limit, &d(100e6, 0.6, 200)), None);
        assert_eq!(split_pays(limit, &d(100e6, 0.6, 500)), Some(true));
        // Above the limit: does not pay.
        assert_eq!(split_pays(limit, &d(300e6, 0.9, 500)), Some(false));
        // Nothing measured yet.
        let none = Delivered {
            rate: None,
            waiting: 0.0,
            longest: Duration::ZERO,
        };
        assert_eq!(split_pays(limit, &none), None);
    }

    #[test]
    fn only_ranges_measured_long_enough_count() {
        let now = Instant::now();
        let young = measured(now, 1, 0.05, 0.0);
        let old = measured(now, 30_000_000, 0.6, 0.0);
        let d = delivered(&[young.clone(), old], now).unwrap();
        assert_eq!(d.rate, Some(50_000_000.0));
        assert_eq!(d.longest, Duration::from_secs_f64(0.6));
        // Busy but not measured yet: no rate; nothing busy: no answer.
        assert_eq!(
            delivered(std::slice::from_ref(&young), now).unwrap().rate,
            None
        );
        let mut idle = young;
        idle.busy = false;
        assert_eq!(delivered(&[idle], now), None);
    }
}
