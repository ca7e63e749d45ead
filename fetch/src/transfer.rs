//! One file: resume from the durable watermark, append only bytes that a
//! validated response promised, checkpoint, verify, publish.
//!
//! Invariant: the ledger watermark W never exceeds the fsynced length of the
//! `.part` file, and `transferred = committed + discarded` after every
//! ledger write (see docs/design.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::block_in_place;

use ftpipe_receipts::{Attempt, AttemptOutcome, DiscardReason, FileRow};

use crate::attempt::{
    DIGEST_REFETCHES, Pinned, RateWindow, Verdict, check, new_attempt, record_published,
    record_reply, whole_length,
};
use crate::ctx::FetchCtx;
use crate::error::{FetchError, Result};
use crate::extent::written_tail;
use crate::part::{AppendError, PartFile};
use crate::source::{Ask, Body, Span};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_hub::HubError;
use ftpipe_hub::identity::{Expected, IdentityHasher, expected_identity, hash_part_prefix};
use ftpipe_hub::limits::MAX_RETRY_AFTER;
use ftpipe_hub::paths::part_path;
use ftpipe_progress::ProgressEvent;

/// Records a discard of `path` (the watermark set to `committed`) and
/// reports the rewind.
pub(crate) async fn discard(
    ctx: &FetchCtx,
    path: &str,
    reason: DiscardReason,
    bytes: u64,
    committed: u64,
    also_transferred: bool,
) -> Result<()> {
    ctx.store
        .discard(ctx.run, path, reason, bytes, committed, also_transferred)
        .await?;
    ctx.reporter.report(ProgressEvent::FileRewound {
        path: path.to_owned(),
        to: committed,
        reason: reason.to_string(),
    });
    Ok(())
}

/// Empties a `.part` that holds bytes of a pin a repin superseded (see
/// `Store::save_pin`). Its durable bytes were recorded by the repin; the
/// tails the old pin's in-flight attempts wrote past their watermarks are
/// measured against the old ranges (holes are not bytes), counted for
/// those attempts and recorded as `superseded_by_repin`, then the part is
/// cut to nothing and the old ranges forgotten, in that order: a crash in
/// between measures no tail twice (each attempt is marked measured).
async fn settle_superseded_part(ctx: &FetchCtx, file: &FileRow, part: &mut PartFile) -> Result<()> {
    let store = &ctx.store;
    let old = store.superseded_part(&file.path).await?;
    if old.is_empty() {
        return Ok(());
    }
    for r in old.iter().filter(|r| !r.complete()) {
        let Some(attempt) = store.in_flight_attempt(&file.path, r.start, r.end).await? else {
            continue;
        };
        let tail = block_in_place(|| written_tail(part.file().file(), r.watermark, r.end))
            .map_err(|e| FetchError::io("seek", part.path(), e))?;
        if tail > 0 {
            store
                .discard_unkept(
                    ctx.run,
                    &file.path,
                    DiscardReason::SupersededByRepin,
                    tail,
                    attempt,
                    true,
                )
                .await?;
            // A tail recorded (its attempt marked measured), the part not
            // yet emptied.
            crashpoint::hit(CrashPoint::SupersededTailRecorded);
        }
    }
    block_in_place(|| part.truncate(0)).map_err(|e| FetchError::io("truncate", part.path(), e))?;
    // The part is empty and durable; the old ranges are still stored.
    crashpoint::hit(CrashPoint::SupersededPartEmptied);
    store.end_superseded_part(&file.path).await?;
    ctx.reporter.report(ProgressEvent::FileRewound {
        path: file.path.clone(),
        to: 0,
        reason: DiscardReason::SupersededByRepin.to_string(),
    });
    Ok(())
}

/// Keeps the bytes a crash left past a stream's watermark that the source
/// proves its own (see [`crate::source::ByteSource::proven_tail`]):
/// fsynced, then claimed for the attempt in flight that received them, in
/// one transaction. What follows them is cut by the caller as before. A
/// stream's watermark needs no alignment. Nothing is kept when no attempt
/// whose tail was not yet measured is in flight (the bytes were not
/// received by one: see `Store::measure_stream_tails`).
async fn keep_proven_stream_tail(ctx: &FetchCtx, file: &FileRow, part: &PartFile) -> Result<()> {
    let watermark = ctx.store.ledger_row(&file.path).await?.committed;
    let on_disk = part.len();
    if on_disk <= watermark {
        return Ok(());
    }
    let proven = ctx
        .source
        .proven_tail(&file.path, part.file(), watermark, on_disk)
        .await?
        .clamp(watermark, on_disk);
    if proven == watermark {
        return Ok(());
    }
    block_in_place(|| part.file().file().sync_data())
        .map_err(|e| FetchError::io("fsync", part.path(), e))?;
    crashpoint::hit(CrashPoint::TailProven);
    if ctx
        .store
        .claim_stream_tail(&file.path, watermark, proven - watermark)
        .await?
    {
        ctx.reporter.report(ProgressEvent::FileTailKept {
            path: file.path.clone(),
            from: watermark,
            to: proven,
        });
        // Claimed; the rest past it not yet cut off.
        crashpoint::hit(CrashPoint::TailClaimed);
    }
    Ok(())
}

/// Brings a `.part` fetched as one stream and its watermark into agreement:
/// bytes of a superseded pin are settled first (above), bytes past the
/// watermark are cut and recorded (they were received), a part shorter
/// than the watermark lowers it; an empty part is seeded once from an
/// interrupted download in the Hugging Face cache. Returns the ledger row
/// as it was before.
pub(crate) async fn settle_stream_part(
    ctx: &FetchCtx,
    file: &FileRow,
    part: &mut PartFile,
    cache_prefix_tried: &mut bool,
) -> Result<ftpipe_receipts::LedgerRow> {
    settle_superseded_part(ctx, file, part).await?;
    keep_proven_stream_tail(ctx, file, part).await?;
    let ledger = ctx.store.ledger_row(&file.path).await?;
    let (watermark, on_disk) = (ledger.committed, part.len());
    if on_disk > watermark {
        block_in_place(|| part.truncate(watermark))
            .map_err(|e| FetchError::io("truncate", part.path(), e))?;
        discard(
            ctx,
            &file.path,
            DiscardReason::UncheckpointedTail,
            on_disk - watermark,
            watermark,
            true,
        )
        .await?;
    } else if on_disk < watermark {
        discard(
            ctx,
            &file.path,
            DiscardReason::PartShorterThanWatermark,
            watermark - on_disk,
            on_disk,
            false,
        )
        .await?;
    }
    // The part agrees with its watermark: what a dead attempt wrote is
    // settled, and bytes found past the watermark later are not its own.
    ctx.store.measure_stream_tails(&file.path).await?;
    if !*cache_prefix_tried && part.len() == 0 {
        *cache_prefix_tried = true;
        crate::cache::seed_from_incomplete(ctx, file, part).await?;
    }
    Ok(ledger)
}

/// Per-file state carried across attempts.
struct FileTask {
    ctx: Arc<FetchCtx>,
    file: FileRow,
    expected: Expected,
    final_path: PathBuf,
    part_path: PathBuf,
    /// Seconds the hub asked to wait (`Retry-After` of a 429 or 503).
    retry_after: Option<u64>,
    /// The attempt cannot count as progress whatever it appended: a resume
    /// answered from byte 0, a body past the expected size, a stall.
    unproductive: bool,
    /// Resume requests answered with `200` from byte 0.
    range_ignored: u32,
    /// The attempt in flight: each checkpoint adds its bytes to it.
    attempt_id: Option<i64>,
    /// An interrupted download in the cache was already considered as a
    /// resume prefix (at most once per run: a bad one is not retried).
    cache_prefix_tried: bool,
}

/// Fetches, verifies and publishes one file, retrying transient failures,
/// on `connection`: given back to the pool while a retry waits, taken
/// again when it is due.
pub async fn fetch_file(
    ctx: Arc<FetchCtx>,
    file: FileRow,
    final_path: PathBuf,
    connection: OwnedSemaphorePermit,
) -> Result<()> {
    let mut connection = Some(connection);
    let expected = expected_identity(&file)?;
    let part_path = part_path(&final_path);
    let mut task = FileTask {
        ctx,
        file,
        expected,
        final_path,
        part_path,
        retry_after: None,
        unproductive: false,
        range_ignored: 0,
        attempt_id: None,
        cache_prefix_tried: false,
    };
    if crate::cache::adopt_whole(&task.ctx, &task.file, &task.expected, &task.final_path).await? {
        return Ok(());
    }
    let schedule = ExponentialBuilder::default()
        .with_min_delay(task.ctx.opts.retry_base)
        .with_max_delay(Duration::from_secs(10))
        .with_max_times(task.ctx.opts.retries as usize)
        .with_jitter();
    let mut backoff = schedule.build();
    let mut attempts = 0u32;
    let mut digest_failures = 0u32;
    // The best durable watermark so far: the retry budget restarts only
    // after an attempt that moved it further, so an attempt that re-sends
    // what is already durable (or trickles, or overruns) uses up the budget.
    let mut best = task.ctx.store.ledger_row(task.path()).await?.committed;
    loop {
        attempts += 1;
        task.unproductive = false;
        let err = match task.attempt().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if let FetchError::DigestMismatch { .. } = err {
            digest_failures += 1;
            if digest_failures > DIGEST_REFETCHES {
                return Err(err);
            }
            task.report_retry(attempts, Duration::ZERO, None, &err);
            continue;
        }
        if !err.is_transient() {
            return Err(err);
        }
        let now = task.ctx.store.ledger_row(task.path()).await?.committed;
        if now > best && !task.unproductive {
            backoff = schedule.build();
        }
        best = best.max(now);
        let Some(mut delay) = backoff.next() else {
            return Err(task.exhausted(attempts, best, err));
        };
        let retry_after = task.retry_after.take();
        if let Some(after) = retry_after {
            delay = delay.max(Duration::from_secs(after).min(MAX_RETRY_AFTER));
        }
        task.report_retry(attempts, delay, retry_after, &err);
        drop(connection.take());
        tokio::time::sleep(delay).await;
        connection = Some(
            task.ctx
                .connections
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| FetchError::internal_from("connection pool", e))?,
        );
    }
}

impl FileTask {
    fn path(&self) -> &str {
        &self.file.path
    }

    /// `--min-rate` where the source holds this file's bodies to it, else
    /// 0 (no rate rule).
    fn min_rate(&self) -> u64 {
        if self.ctx.source.rate_rule_holds(self.path()) {
            self.ctx.opts.min_rate
        } else {
            0
        }
    }

    /// The error once the retry budget is spent after `attempts`, with
    /// `best` bytes durable at most: ranges ignored when resumes were
    /// answered from byte 0 and the file never completed, else the last
    /// error.
    fn exhausted(&self, attempts: u32, best: u64, last: FetchError) -> FetchError {
        if self.range_ignored > 0 && best < self.file.size {
            return FetchError::RangeIgnored {
                path: self.file.path.clone(),
                ignored: self.range_ignored,
                best,
                size: self.file.size,
                attempts,
            };
        }
        FetchError::RetriesExhausted {
            path: self.file.path.clone(),
            attempts,
            last: Box::new(last),
        }
    }

    fn report_retry(
        &self,
        attempt: u32,
        delay: Duration,
        retry_after_secs: Option<u64>,
        err: &FetchError,
    ) {
        tracing::warn!(path = self.path(), attempt, ?delay, error = %err, "retrying");
        self.ctx.reporter.report(ProgressEvent::FileRetry {
            path: self.path().to_owned(),
            attempt,
            delay,
            retry_after_secs,
            error: err.to_string(),
        });
    }

    fn io(&self, op: &'static str, e: std::io::Error) -> FetchError {
        FetchError::io(op, &self.part_path, e)
    }

    async fn discard(
        &self,
        reason: DiscardReason,
        bytes: u64,
        committed: u64,
        also_transferred: bool,
    ) -> Result<()> {
        discard(
            &self.ctx,
            self.path(),
            reason,
            bytes,
            committed,
            also_transferred,
        )
        .await
    }

    /// Brings the `.part` file and the ledger into agreement and returns the
    /// open part file with the digest state of its committed prefix.
    async fn open_resume_point(&mut self) -> Result<(PartFile, IdentityHasher, Option<String>)> {
        let mut part = block_in_place(|| {
            PartFile::open(self.ctx.dest(), &self.part_path, self.ctx.opts.io_mode)
        })
        .map_err(|e| self.io("open", e))?;
        let ledger = settle_stream_part(
            &self.ctx,
            &self.file,
            &mut part,
            &mut self.cache_prefix_tried,
        )
        .await?;
        let mut hasher = self.expected.hasher(self.file.size);
        let len = part.len();
        block_in_place(|| hash_part_prefix(part.file(), len, &mut hasher))
            .map_err(|e| self.io("re-hash prefix of", e))?;
        let validator = if len > 0 { ledger.validator } else { None };
        Ok((part, hasher, validator))
    }

    async fn attempt(&mut self) -> Result<()> {
        let size = self.file.size;
        let (mut part, mut hasher, mut validator) = self.open_resume_point().await?;
        self.ctx.reporter.report(ProgressEvent::FileStarted {
            path: self.path().to_owned(),
            size,
            resumed_from: part.len(),
        });
        if self.ctx.offline && part.len() < size {
            return Err(FetchError::Hub(HubError::Offline {
                what: format!(
                    "{} ({} of {size} bytes durable, not in the Hugging Face cache)",
                    self.path(),
                    part.len()
                ),
            }));
        }
        let actual = if part.len() < size {
            self.transfer(&mut part, &mut hasher, &mut validator)
                .await?
        } else {
            // A complete `.part` left by an earlier run: verify, no request.
            self.verify(&mut part, hasher).await?
        };
        // The whole file is durable in `.part` and verified, not published.
        crashpoint::hit(CrashPoint::FetchVerified);
        let final_path = self.final_path.clone();
        let direct_io_bytes = part.direct_written();
        block_in_place(|| part.publish(&final_path))?;
        // Published under its final name, no receipt yet.
        crashpoint::hit(CrashPoint::FetchRenamed);
        record_published(
            &self.ctx,
            &self.file,
            &self.expected,
            actual,
            None,
            direct_io_bytes,
        )
        .await
    }

    /// Compares the digest of the complete `.part` with the pinned identity.
    /// On a mismatch the `size` bytes become a `digest_mismatch` discard and
    /// the file restarts from zero.
    async fn verify(&self, part: &mut PartFile, hasher: IdentityHasher) -> Result<String> {
        let size = self.file.size;
        let actual = hasher.finish_hex();
        if actual != self.expected.hex() {
            block_in_place(|| part.truncate(0)).map_err(|e| self.io("truncate", e))?;
            self.discard(DiscardReason::DigestMismatch, size, 0, false)
                .await?;
            return Err(FetchError::DigestMismatch {
                path: self.path().to_owned(),
                kind: self.expected.kind(),
                expected: self.expected.hex().to_owned(),
                actual,
                size,
            });
        }
        self.ctx.source.check_whole(self.path()).await?;
        Ok(actual)
    }

    /// One attempt from the current watermark, recorded in `attempts`.
    /// Returns the verified digest of the complete file.
    async fn transfer(
        &mut self,
        part: &mut PartFile,
        hasher: &mut IdentityHasher,
        validator: &mut Option<String>,
    ) -> Result<String> {
        let start = part.len();
        let sent = validator.clone();
        let ask = Ask {
            span: if start > 0 {
                Span::From(start)
            } else {
                Span::Whole
            },
            validator: sent.as_deref(),
        };
        let host = self.ctx.source.host(self.path())?;
        let mut attempt = new_attempt(self.path(), host, &ask);
        attempt.id = self.ctx.store.start_attempt(self.ctx.run, &attempt).await?;
        self.attempt_id = Some(attempt.id);
        let result = match self
            .stream(ask, part, hasher, validator, &mut attempt)
            .await
        {
            // Verified before the attempt is closed: an attempt is `ok` only
            // if the bytes it delivered match the pinned digest; a mismatch
            // closes it as `failed` (docs/design.md, step 5.6).
            Ok(()) => self.verify(part, hasher.clone()).await,
            Err(e) => Err(e),
        };
        attempt.outcome = match &result {
            Ok(_) => AttemptOutcome::Ok,
            Err(e) if e.is_transient() => AttemptOutcome::Retry,
            Err(_) => AttemptOutcome::Failed,
        };
        attempt.error = result.as_ref().err().map(ToString::to_string);
        self.attempt_id = None;
        let finished = self.ctx.store.finish_attempt(&attempt).await;
        // On a full volume this write can fail too: the error that ended the
        // attempt is the one reported (the row stays `in_flight`, as after a
        // crash).
        match (result, finished) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(f)) => Err(f.into()),
            (Ok(v), Ok(())) => Ok(v),
        }
    }

    /// Sends `ask`, keeps what the answer validly holds, checkpointing on
    /// the way; fails unless the whole file is then in `part`.
    async fn stream(
        &mut self,
        ask: Ask<'_>,
        part: &mut PartFile,
        hasher: &mut IdentityHasher,
        validator: &mut Option<String>,
        attempt: &mut Attempt,
    ) -> Result<()> {
        let mut body = self.request(ask, part, hasher, validator, attempt).await?;
        let mut st = BodyState {
            // Where this attempt's bytes start (0 after a prefix was dropped).
            from: part.len(),
            since: 0,
            last: Instant::now(),
            rate: RateWindow::new(self.min_rate(), self.ctx.opts.stall_window),
            excess: 0,
        };
        let validator = validator.as_deref();
        let outcome = self
            .read_body(&mut body, part, hasher, validator, attempt, &mut st)
            .await?;
        self.end_body(outcome, part, validator, attempt, &mut st)
            .await
    }

    /// Sends `ask` and checks the answer ([`crate::attempt::check`]). The
    /// whole file to a resume drops the prefix: the source will not resume
    /// (no range support, or the validator changed), the prefix cannot be
    /// trusted. The validator of a whole file becomes the file's.
    async fn request(
        &mut self,
        ask: Ask<'_>,
        part: &mut PartFile,
        hasher: &mut IdentityHasher,
        validator: &mut Option<String>,
        attempt: &mut Attempt,
    ) -> Result<Body> {
        let size = self.file.size;
        let path = self.path().to_owned();
        let reply = self.ctx.source.read(&path, ask).await?;
        record_reply(attempt, &reply);
        let pinned = Pinned {
            path: &path,
            size,
            commit: &self.ctx.pin.commit,
            lfs_sha256: self.file.lfs_sha256.as_deref(),
        };
        match check(&pinned, &ask, reply)? {
            Verdict::Accepted {
                validator: now,
                body,
            } => {
                if ask.span == Span::Whole {
                    *validator = now;
                }
                Ok(body)
            }
            Verdict::RangeIgnored {
                validator: now,
                length,
                body,
            } => {
                let start = part.len();
                block_in_place(|| part.truncate(0)).map_err(|e| self.io("truncate", e))?;
                self.discard(DiscardReason::RangeNotHonoured, start, 0, false)
                    .await?;
                *hasher = self.expected.hasher(size);
                self.unproductive = true;
                self.range_ignored += 1;
                whole_length(&path, length, size)?;
                *validator = now;
                Ok(body)
            }
            Verdict::Refused { retry_after, error } => {
                self.retry_after = retry_after;
                Err(error)
            }
        }
    }

    /// Reads the body into `part` until its end or a failure. The failure
    /// that ends the body is `Ok(Err(..))` (what arrived before it is still
    /// kept); a checkpoint that fails on the way ends the attempt at once
    /// (`Err(..)`).
    async fn read_body(
        &mut self,
        body: &mut Body,
        part: &mut PartFile,
        hasher: &mut IdentityHasher,
        validator: Option<&str>,
        attempt: &mut Attempt,
        st: &mut BodyState,
    ) -> Result<Result<()>> {
        let interval = self.ctx.opts.checkpoint_interval;
        loop {
            // While bytes wait for a checkpoint, a quiet connection must not
            // keep them un-durable: wake up at the interval and checkpoint.
            let next = if st.since > 0 || part.held() > 0 {
                let wait = interval.saturating_sub(st.last.elapsed());
                match tokio::time::timeout(wait, body.chunk()).await {
                    Ok(next) => next,
                    Err(_) => {
                        if let Err(e) = self.quiet_checkpoint(part, validator, attempt, st).await? {
                            return Ok(Err(e));
                        }
                        continue;
                    }
                }
            } else {
                body.chunk().await
            };
            let chunk = match next {
                Ok(Some(c)) => c,
                Ok(None) => return Ok(Ok(())),
                Err(e) => {
                    return Ok(Err(FetchError::Hub(HubError::BodyFailed {
                        path: self.path().to_owned(),
                        received: part.end() - st.from,
                        message: e.0,
                    })));
                }
            };
            if let Err(e) = self
                .take_chunk(chunk, part, hasher, validator, attempt, st)
                .await?
            {
                return Ok(Err(e));
            }
        }
    }

    /// A quiet connection's checkpoint at the interval, then the rate rule.
    async fn quiet_checkpoint(
        &mut self,
        part: &mut PartFile,
        validator: Option<&str>,
        attempt: &mut Attempt,
        st: &mut BodyState,
    ) -> Result<Result<()>> {
        match self.flush(part).await {
            Ok(n) => st.since += self.stored_bytes(n),
            Err(e) => return Ok(Err(e)),
        }
        attempt.body_bytes = stored(part, st.from);
        self.checkpoint(part, st.since, validator).await?;
        st.since = 0;
        st.last = Instant::now();
        if let Err(e) = st.rate.check(self.path(), 0) {
            self.unproductive = true;
            return Ok(Err(e));
        }
        Ok(Ok(()))
    }

    /// Hashes and appends one chunk (cut at the expected size), then
    /// checkpoints when due; the same two levels of failure as
    /// [`FileTask::read_body`].
    async fn take_chunk(
        &mut self,
        mut chunk: Bytes,
        part: &mut PartFile,
        hasher: &mut IdentityHasher,
        validator: Option<&str>,
        attempt: &mut Attempt,
        st: &mut BodyState,
    ) -> Result<Result<()>> {
        let size = self.file.size;
        if part.end() + chunk.len() as u64 > size {
            // Keep the bytes up to the expected size; the rest is waste.
            let keep = size - part.end();
            st.excess = chunk.len() as u64 - keep;
            chunk.truncate(usize::try_from(keep).unwrap_or(0));
        }
        // Another job found the volume full and freed the space reserve
        // for the ledger: do not eat it with more file bytes.
        let full = self.ctx.volume_full.load(Ordering::SeqCst);
        // Hashed as received: a failed write ends the attempt, and the
        // next one hashes the file's durable prefix afresh.
        hasher.update(&chunk);
        let len = chunk.len() as u64;
        match block_in_place(|| {
            if full {
                Err(AppendError::NoSpace)
            } else {
                part.push(chunk)
            }
        }) {
            Ok(n) => st.since += self.stored_bytes(n),
            Err(e) => return Ok(Err(self.append_error(part, e))),
        }
        // Counted once stored, like the ledger's `transferred`.
        attempt.body_bytes = stored(part, st.from);
        if st.since + part.held() >= self.ctx.opts.checkpoint_bytes.for_file(size)
            || st.last.elapsed() >= self.ctx.opts.checkpoint_interval
        {
            match self.flush(part).await {
                Ok(n) => st.since += self.stored_bytes(n),
                Err(e) => return Ok(Err(e)),
            }
            attempt.body_bytes = stored(part, st.from);
            self.checkpoint(part, st.since, validator).await?;
            st.since = 0;
            st.last = Instant::now();
        }
        if st.excess > 0 {
            self.unproductive = true;
            return Ok(Err(FetchError::Hub(HubError::LongBody {
                path: self.path().to_owned(),
                expected: size,
            })));
        }
        if let Err(e) = st.rate.check(self.path(), len) {
            self.unproductive = true;
            return Ok(Err(e));
        }
        Ok(Ok(()))
    }

    /// After the body: bytes of a validated response that arrived before a
    /// failure are a correct prefix, made durable rather than fetched
    /// again; the excess of a long body is recorded; a body that ended
    /// early is a short body.
    async fn end_body(
        &mut self,
        outcome: Result<()>,
        part: &mut PartFile,
        validator: Option<&str>,
        attempt: &mut Attempt,
        st: &mut BodyState,
    ) -> Result<()> {
        let size = self.file.size;
        let path = self.path().to_owned();
        let outcome = match (outcome, self.flush(part).await) {
            (outcome, Ok(n)) => {
                st.since += self.stored_bytes(n);
                outcome
            }
            (Ok(()), Err(e)) => Err(e),
            // The failure that ended the body is the one reported.
            (Err(first), Err(e)) => {
                tracing::warn!(path = %path, error = %e, after = %first, "bytes held back after a failed body were not written");
                Err(first)
            }
        };
        attempt.body_bytes = stored(part, st.from);
        let saved = self.checkpoint(part, st.since, validator).await;
        // The failure that ended the body (e.g. no space) is the one
        // reported; a checkpoint that failed with it leaves the watermark
        // where it was.
        if let (Err(first), Err(e)) = (&outcome, &saved) {
            tracing::warn!(path = %path, error = %e, after = %first, "checkpoint after a failed body did not commit");
        }
        if st.excess > 0 && saved.is_ok() {
            self.discard(DiscardReason::LongBodyExcess, st.excess, part.len(), true)
                .await?;
            attempt.body_bytes += st.excess;
        }
        outcome?;
        saved?;
        if part.len() < size {
            return Err(FetchError::Hub(HubError::ShortBody {
                path,
                received: part.len(),
                expected: size,
            }));
        }
        Ok(())
    }

    /// Reports `n` bytes stored in the file (progress moves as bytes are
    /// written, not as they are received and held back); returns `n`.
    fn stored_bytes(&self, n: u64) -> u64 {
        if n > 0 {
            self.ctx.reporter.report(ProgressEvent::FileBytes {
                path: self.path().to_owned(),
                bytes: n,
            });
        }
        n
    }

    /// Writes what `part` holds back; the bytes written.
    async fn flush(&self, part: &mut PartFile) -> Result<u64> {
        let full = self.ctx.volume_full.load(Ordering::SeqCst);
        let flushed = block_in_place(|| {
            if full && part.held() > 0 {
                Err(AppendError::NoSpace)
            } else {
                part.flush()
            }
        });
        flushed.map_err(|e| self.append_error(part, e))
    }

    fn append_error(&self, part: &PartFile, e: AppendError) -> FetchError {
        match e {
            AppendError::NoSpace => {
                // The state database is on this volume too: freeing the
                // reserve lets the checkpoint after the body, the attempt
                // and the stage event still be written.
                self.ctx.mark_volume_full();
                FetchError::NoSpace {
                    volume: self.ctx.dest().to_owned(),
                    path: self.path().to_owned(),
                    committed: part.len(),
                    still_needed: self.file.size - part.len(),
                }
            }
            AppendError::Io(e) => self.io("write", e),
        }
    }

    /// fsync, then advance the watermark (never the other way round).
    async fn checkpoint(
        &self,
        part: &mut PartFile,
        delta: u64,
        validator: Option<&str>,
    ) -> Result<()> {
        if delta > 0 {
            block_in_place(|| part.sync()).map_err(|e| self.io("fsync", e))?;
            // Bytes durable past the watermark the ledger still holds.
            crashpoint::hit(CrashPoint::CheckpointSynced);
        }
        let store = &self.ctx.store;
        match store
            .checkpoint(self.path(), part.len(), delta, validator, self.attempt_id)
            .await
        {
            // The ledger write can be the first to meet a full volume (the
            // WAL grows too): with the space reserve freed, one more commit
            // keeps the fsynced bytes; the next append then stops.
            Err(e) if e.is_disk_full() => {
                self.ctx.mark_volume_full();
                store
                    .checkpoint(self.path(), part.len(), delta, validator, self.attempt_id)
                    .await?;
            }
            r => r?,
        }
        Ok(())
    }
}

/// Where one attempt's body stands.
struct BodyState {
    /// Where this attempt's bytes start in the part.
    from: u64,
    /// Bytes stored since the last checkpoint, and when that was.
    since: u64,
    last: Instant,
    rate: RateWindow,
    /// Bytes of a body past the expected size (cut there, discarded).
    excess: u64,
}

/// Bytes an attempt whose bytes started at `from` has stored in `part`.
fn stored(part: &PartFile, from: u64) -> u64 {
    part.len().saturating_sub(from)
}
