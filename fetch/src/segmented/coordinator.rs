//! The coordinator of one file fetched in ranges: each pass opens the
//! part against the store (tiling, lost bytes, crash tails), starts workers
//! on free connections, checkpoints (fsync, then every watermark in one
//! transaction), accounts each worker's end (attempt rows, discards,
//! retries with backoff, restarts), then verifies and publishes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet, block_in_place};

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::direct::DirectFile;
use ftpipe_fs::durable::publish;
use ftpipe_hub::HubError;
use ftpipe_hub::identity::{Expected, expected_identity, hash_part_prefix};
use ftpipe_hub::limits::MAX_RETRY_AFTER;
use ftpipe_hub::paths::part_path;
use ftpipe_progress::ProgressEvent;
use ftpipe_receipts::{AttemptOutcome, CrashTail, DiscardReason, FileRow, RangeProgress, RangeRow};

use super::claim::{Slot, contiguous_prefix, written_prefix};
use super::shared::{Digest, SPLIT_PAYS, SPLIT_UNJUDGED, Shared};
use super::worker::{Ended, WorkerEnd, worker};
use crate::attempt::{DIGEST_REFETCHES, record_published};
use crate::ctx::FetchCtx;
use crate::error::{FetchError, Result};
use crate::extent::{align_down, punch_hole, written_tail};
use crate::part::PartFile;
use crate::transfer::{discard, settle_stream_part};

/// How often the coordinator looks for free connections and due checkpoints.
pub(super) const SCHEDULE_TICK: Duration = Duration::from_millis(100);

/// What one pass over the file came to.
pub(super) enum Pass {
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
    if crate::cache::adopt_whole(&ctx, &file, &expected, &final_path).await? {
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

pub(super) struct Coordinator {
    pub(super) ctx: Arc<FetchCtx>,
    pub(super) file: FileRow,
    pub(super) expected: Expected,
    pub(super) final_path: PathBuf,
    /// Connections held and not in use by a worker.
    pub(super) permits: Vec<OwnedSemaphorePermit>,
    /// Fetch as one stream (the server ignores ranges).
    pub(super) single: bool,
    pub(super) range_ignored: u32,
    pub(super) digest_failures: u32,
    /// An interrupted download in the Hugging Face cache was looked for.
    pub(super) cache_prefix_tried: bool,
    /// This pass already decided to start again.
    pub(super) restarting: bool,
}

/// The tail a crash left past one range's watermark (`range`: its index),
/// written by `attempt`.
struct RangeTail {
    range: usize,
    attempt: i64,
    tail: CrashTail,
}

/// The state of one pass: the open part file and the digest so far.
pub(super) struct PassState {
    pub(super) shared: Arc<Shared>,
    pub(super) cancel: watch::Sender<bool>,
    pub(super) last_checkpoint: Instant,
    /// The digest reading back the written prefix, while it does: beside
    /// the checkpoints, never waited for by one ([`Coordinator::follow_digest`]).
    /// Joined before the comparison, before the part is emptied and when a
    /// range fails; a pass ended by an error of its own leaves it to end
    /// alone (its reads stop at the written prefix, nothing is compared).
    pub(super) reading_back: Option<JoinHandle<std::io::Result<()>>>,
}

impl Coordinator {
    pub(super) fn path(&self) -> &str {
        &self.file.path
    }

    pub(super) fn part_path(&self) -> PathBuf {
        part_path(&self.final_path)
    }

    pub(super) fn io(&self, op: &'static str, e: std::io::Error) -> FetchError {
        FetchError::io(op, self.part_path(), e)
    }

    pub(super) fn rewound(&self, to: u64, reason: DiscardReason) {
        self.ctx.reporter.report(ProgressEvent::FileRewound {
            path: self.path().to_owned(),
            to,
            reason: reason.to_string(),
        });
    }

    pub(super) async fn discard(
        &self,
        reason: DiscardReason,
        bytes: u64,
        committed: u64,
        received: bool,
    ) -> Result<()> {
        discard(&self.ctx, self.path(), reason, bytes, committed, received).await
    }

    /// Brings `.part`, ledger and ranges into agreement and opens the pass.
    pub(super) async fn open(&mut self) -> Result<PassState> {
        let path = self.path().to_owned();
        let size = self.file.size;
        let part_path = self.part_path();
        let mut part =
            block_in_place(|| PartFile::open(self.ctx.dest(), &part_path, self.ctx.opts.io_mode))
                .map_err(|e| self.io("open", e))?;
        let mut ranges = self.settle_ranges(&mut part).await?;
        let direct = part.into_file();
        block_in_place(|| direct.file().set_len(size)).map_err(|e| self.io("size", e))?;
        self.cut_crash_tails(&direct, &mut ranges).await?;
        let ledger = self.ctx.store.ledger_row(&path).await?;
        if self.ctx.offline && ranges.iter().any(|r| !r.complete()) {
            return Err(FetchError::Hub(HubError::Offline {
                what: format!(
                    "{path} ({} of {size} bytes durable, not in the Hugging Face cache)",
                    ledger.committed
                ),
            }));
        }
        let validator = if ledger.committed > 0 || ranges.len() > 1 {
            ledger.validator
        } else {
            None
        };
        let (cancel, cancelled) = watch::channel(false);
        let shared = self.share(direct, &ranges, validator, cancelled)?;
        self.ctx.reporter.report(ProgressEvent::FileStarted {
            path,
            size,
            resumed_from: ledger.committed,
        });
        Ok(PassState {
            shared,
            cancel,
            last_checkpoint: Instant::now(),
            reading_back: None,
        })
    }

    /// The stored ranges, when they still describe the part; else none are
    /// kept, and a single-stream prefix carries over, cut to the alignment,
    /// as the first range of a new tiling.
    async fn settle_ranges(&mut self, part: &mut PartFile) -> Result<Vec<RangeRow>> {
        let store = &self.ctx.store;
        let path = self.path().to_owned();
        let size = self.file.size;
        let mut ranges = store.ranges(&path).await?;
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
            settle_stream_part(&self.ctx, &self.file, part, &mut self.cache_prefix_tried).await?;
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
        Ok(ranges)
    }

    /// Un-checkpointed tails a crash left behind. A tail an attempt in
    /// flight wrote (its process died) is measured: what the source proves
    /// its own (recorded chunk hashes) is fsynced, then claimed, and the
    /// rest recorded as discarded, in one transaction per range. Then every
    /// byte past a watermark that no claim covers is punched out and the
    /// holes fsynced before any worker starts: the rest of a tail just
    /// recorded, and bytes whose attempt was measured already (a crash
    /// between its record and its punch), so a later crash cannot count
    /// them again.
    async fn cut_crash_tails(&self, file: &DirectFile, ranges: &mut [RangeRow]) -> Result<()> {
        let (tails, mut stale) = self.measure_crash_tails(file, ranges).await?;
        if tails.iter().any(|t| t.tail.kept > 0) {
            block_in_place(|| file.file().sync_data()).map_err(|e| self.io("fsync", e))?;
            // The proven tails are durable; the store does not claim them yet.
            crashpoint::hit(CrashPoint::TailProven);
        }
        for t in &tails {
            self.ctx
                .store
                .settle_crash_tail(
                    self.ctx.run,
                    self.path(),
                    ranges[t.range].start,
                    t.tail,
                    DiscardReason::UncheckpointedTail,
                    t.attempt,
                )
                .await?;
            let r = &mut ranges[t.range];
            r.watermark += t.tail.kept;
            if t.tail.kept > 0 {
                self.ctx.reporter.report(ProgressEvent::FileTailKept {
                    path: self.path().to_owned(),
                    from: t.tail.watermark,
                    to: r.watermark,
                });
            }
            // Claimed and recorded; the rest past it not yet punched.
            crashpoint::hit(CrashPoint::TailClaimed);
            if t.tail.rest > 0 {
                self.rewound(r.watermark, DiscardReason::UncheckpointedTail);
                stale.push((r.watermark, t.tail.rest));
            }
        }
        if !stale.is_empty() {
            for &(at, len) in &stale {
                block_in_place(|| punch_hole(file.file(), at, len));
            }
            block_in_place(|| file.file().sync_data()).map_err(|e| self.io("fsync", e))?;
        }
        Ok(())
    }

    /// The bytes past each incomplete range's watermark: a tail of an
    /// attempt still in flight (its process died), with what of it the
    /// source proves; or stale bytes no attempt owns (counted already, or
    /// never received: see `Store::discard`), as `(offset, length)`.
    async fn measure_crash_tails(
        &self,
        file: &DirectFile,
        ranges: &[RangeRow],
    ) -> Result<(Vec<RangeTail>, Vec<(u64, u64)>)> {
        let (mut tails, mut stale) = (Vec::new(), Vec::new());
        for (i, r) in ranges.iter().enumerate().filter(|(_, r)| !r.complete()) {
            let written = block_in_place(|| written_tail(file.file(), r.watermark, r.end))
                .map_err(|e| self.io("seek", e))?;
            if written == 0 {
                continue;
            }
            let store = &self.ctx.store;
            match store.in_flight_attempt(self.path(), r.start, r.end).await? {
                Some(attempt) => {
                    let kept = self.proven_tail(file, r, written).await?;
                    tails.push(RangeTail {
                        range: i,
                        attempt,
                        tail: CrashTail {
                            watermark: r.watermark,
                            kept,
                            rest: written - kept,
                        },
                    });
                }
                None => stale.push((r.watermark, written)),
            }
        }
        Ok((tails, stale))
    }

    /// Of the `written` bytes past `r`'s watermark, those the source
    /// proves its own, cut to the write alignment (a range's watermark is
    /// aligned unless it is the range's end).
    async fn proven_tail(&self, file: &DirectFile, r: &RangeRow, written: u64) -> Result<u64> {
        let to = r.watermark + written;
        let proven = self
            .ctx
            .source
            .proven_tail(self.path(), file, r.watermark, to)
            .await?
            .clamp(r.watermark, to);
        let end = if proven == r.end {
            proven
        } else {
            align_down(proven).max(r.watermark)
        };
        Ok(end - r.watermark)
    }

    /// What the pass's coordinator and workers share: the part, the slots
    /// of `ranges`, the digest of the durable prefix re-hashed from disk.
    fn share(
        &self,
        direct: DirectFile,
        ranges: &[RangeRow],
        validator: Option<String>,
        cancelled: watch::Receiver<bool>,
    ) -> Result<Arc<Shared>> {
        let size = self.file.size;
        let slots: Vec<Slot> = ranges.iter().map(Slot::from_row).collect();
        let prefix = contiguous_prefix(&slots);
        let mut hasher = self.expected.hasher(size);
        block_in_place(|| hash_part_prefix(&direct, prefix, &mut hasher))
            .map_err(|e| self.io("re-hash prefix of", e))?;
        let digest = Digest {
            hasher,
            hashed: prefix,
            catch_up: 0,
            bounce: None,
        };
        Ok(Arc::new(Shared {
            ctx: self.ctx.clone(),
            path: self.path().to_owned(),
            size,
            lfs_sha256: self.file.lfs_sha256.clone(),
            part_path: self.part_path(),
            file: direct,
            bounces: Mutex::new(Vec::new()),
            pass: self.ctx.next_pass.fetch_add(1, Ordering::SeqCst),
            split_verdict: std::sync::atomic::AtomicU8::new(
                if self.ctx.split_paid_before(self.path()) {
                    SPLIT_PAYS
                } else {
                    SPLIT_UNJUDGED
                },
            ),
            slots: Mutex::new(slots),
            validator: Mutex::new(validator),
            splittable: std::sync::atomic::AtomicBool::new(!self.single),
            digest: Mutex::new(digest),
            wrote: Notify::new(),
            cancel: cancelled,
        }))
    }

    /// One pass: fetch every range, verify, publish.
    pub(super) async fn pass(&mut self) -> Result<Pass> {
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
        let mut delays: HashMap<u64, backon::ExponentialBackoff> = HashMap::new();
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
                || received_since(&st.shared)
                    >= self.ctx.opts.checkpoint_bytes.for_file(self.file.size);
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
                tracing::warn!(path = self.path(), error = %c, after = %e, "checkpoint after a failed range failed");
            }
            if let Err(d) = self.join_read_back(&mut st).await {
                tracing::warn!(path = self.path(), error = %d, after = %e, "the digest's read-back failed");
            }
            return Err(e);
        }
        if let Some(pass) = restart {
            if let Pass::Restart { reason, .. } = &pass {
                self.discard_everything(&mut st, *reason).await?;
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
    pub(super) fn schedule(
        &mut self,
        st: &PassState,
        workers: &mut JoinSet<WorkerEnd>,
        ends: &mpsc::UnboundedSender<WorkerEnd>,
    ) {
        // A source that decodes its bodies gains nothing from more ranges
        // than cores, and each one holds its socket buffers' worth of
        // bytes that a kill throws away.
        let most = if self.ctx.source.decodes_bodies(self.path()) {
            super::shared::cores()
        } else {
            usize::MAX
        };
        loop {
            if workers.len() >= most {
                break;
            }
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
    pub(super) async fn worker_ended(
        &mut self,
        st: &mut PassState,
        end: WorkerEnd,
        schedule: &ExponentialBuilder,
        delays: &mut HashMap<u64, backon::ExponentialBackoff>,
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
        let (progressed, stored) = self
            .account(st, start, unproductive, unkept, excess, attempt.id)
            .await?;
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
                self.range_not_honoured(st, validator).await
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

    /// Records what a worker received and did not store, and releases its
    /// slot; `(progressed, stored)`: whether the attempt counts as progress,
    /// and the bytes it stored.
    async fn account(
        &self,
        st: &PassState,
        start: u64,
        unproductive: bool,
        unkept: u64,
        excess: u64,
        attempt: i64,
    ) -> Result<(bool, u64)> {
        for (reason, bytes) in [
            (DiscardReason::UnalignedRemainder, unkept),
            (DiscardReason::RangeBodyExcess, excess),
        ] {
            if bytes > 0 {
                self.ctx
                    .store
                    .discard_unkept(self.ctx.run, self.path(), reason, bytes, attempt, false)
                    .await?;
            }
        }
        let released = {
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
        Ok(released)
    }

    /// A `200` to a range request: one restart per pass, however many
    /// ranges saw it; as one stream when the server ignores ranges.
    async fn range_not_honoured(
        &mut self,
        st: &PassState,
        validator: Option<String>,
    ) -> Result<Next> {
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

    /// fsync, then every range's watermark and the ledger in one
    /// transaction; then the digest follows the written prefix.
    pub(super) async fn checkpoint(&self, st: &mut PassState) -> Result<()> {
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
        let began = Instant::now();
        block_in_place(|| st.shared.file.file().sync_data()).map_err(|e| self.io("fsync", e))?;
        let synced = began.elapsed();
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
        tracing::debug!(
            path = self.path(),
            ranges = progress.len(),
            fsync_ms = synced.as_millis(),
            commit_ms = (began.elapsed() - synced).as_millis(),
            "checkpoint"
        );
        self.follow_digest(st).await
    }

    /// Starts the digest reading back the written prefix it could not hash
    /// from memory, on a blocking thread beside the checkpoints, unless a
    /// read-back runs (an ended one's error is returned here): a
    /// checkpoint that waited for it would hold every range's watermark
    /// back while the ranges write on.
    async fn follow_digest(&self, st: &mut PassState) -> Result<()> {
        if st.reading_back.as_ref().is_some_and(|r| !r.is_finished()) {
            return Ok(());
        }
        self.join_read_back(st).await?;
        let behind = match st.shared.digest.try_lock() {
            Ok(d) => d.hashed < written_prefix(&st.shared.slots()),
            // A worker hashing its bytes from memory: not behind.
            Err(_) => false,
        };
        if behind {
            let shared = st.shared.clone();
            st.reading_back = Some(tokio::task::spawn_blocking(move || {
                shared.catch_up_digest()
            }));
        }
        Ok(())
    }

    /// Waits for the digest's read-back, when one runs.
    async fn join_read_back(&self, st: &mut PassState) -> Result<()> {
        let Some(reading) = st.reading_back.take() else {
            return Ok(());
        };
        reading
            .await
            .map_err(|e| FetchError::internal_from("digest read-back", e))?
            .map_err(|e| self.io("hash", e))
    }

    /// Every byte of the file, durable or not, is thrown away (recorded).
    pub(super) async fn discard_everything(
        &self,
        st: &mut PassState,
        reason: DiscardReason,
    ) -> Result<()> {
        // Its reads end before the file is emptied under them.
        if let Err(e) = self.join_read_back(st).await {
            tracing::warn!(path = self.path(), error = %e, "the digest's read-back failed");
        }
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
    pub(super) async fn finish(&mut self, mut st: PassState) -> Result<Pass> {
        let size = self.file.size;
        self.join_read_back(&mut st).await?;
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
            self.discard_everything(&mut st, DiscardReason::DigestMismatch)
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
        self.ctx.source.check_whole(self.path()).await?;
        crashpoint::hit(CrashPoint::FetchVerified);
        let part = self.part_path();
        let final_path = self.final_path.clone();
        block_in_place(|| publish(st.shared.file.file(), &part, &final_path))?;
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

pub(super) enum Next {
    Continue,
    Fail(FetchError),
    Restart(Pass),
}

/// Keeps the first failure or restart and cancels the file's other ranges.
pub(super) fn stop_on(
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

/// When every incomplete range is idle and waiting to retry: the earliest
/// retry.
pub(super) fn only_waiting(shared: &Shared) -> Option<Instant> {
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
pub(super) fn next_tick(shared: &Shared) -> Duration {
    let now = Instant::now();
    shared
        .slots()
        .iter()
        .filter(|s| s.waiting(now))
        .filter_map(|s| s.retry_at)
        .map(|t| t - now)
        .fold(SCHEDULE_TICK, Duration::min)
}

pub(super) fn all_complete(shared: &Shared) -> bool {
    shared.slots().iter().all(Slot::complete)
}

pub(super) fn received_since(shared: &Shared) -> u64 {
    shared.slots().iter().map(|s| s.received).sum()
}

/// Whether `ranges` (by start) cover `[0, size)` exactly, without gaps.
pub(super) fn tiles(ranges: &[RangeRow], size: u64) -> bool {
    let mut at = 0;
    for r in ranges {
        if r.start != at || r.end <= r.start {
            return false;
        }
        at = r.end;
    }
    at == size
}
