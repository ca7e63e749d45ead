//! A worker: one connection streaming claimed ranges into the part file.
//! It asks the byte source for its range under the file's validator while
//! the claim commits, has the answer judged by the one response check
//! (`crate::attempt::check`), writes whole aligned blocks (hashing them
//! from memory when they are the digest's next bytes), and claims the next
//! range itself when one is done.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::block_in_place;

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::direct::Bounce;
use ftpipe_hub::HubError;
use ftpipe_progress::ProgressEvent;
use ftpipe_receipts::Attempt;

use super::claim::Claim;
use super::shared::{Shared, WRITE_BATCH};
use crate::attempt::{Pinned, RateWindow, Verdict, check, new_attempt, record_reply, whole_length};
use crate::error::{FetchError, Result};
use crate::extent::align_down;
use crate::part::consume_front;
use crate::source::{Ask, Body, Reply, Span};

/// How long a quiet body may go unobserved before the rate rule is checked.
pub(super) const BODY_TICK: Duration = Duration::from_secs(1);

/// How a worker's response ended.
pub(super) enum Ended {
    /// Its range is complete.
    Done,
    /// A `200` to a range request: ranges ignored or the file changed.
    RangeNotHonoured { validator: Option<String> },
    /// Stopped because the coordinator cancelled the file.
    Cancelled,
}

/// A worker's report.
pub(super) struct WorkerEnd {
    pub(super) start: u64,
    pub(super) result: Result<Ended>,
    pub(super) attempt: Attempt,
    /// Received but not stored (a buffered remainder below the alignment).
    pub(super) unkept: u64,
    /// Received past the end of the range the request asked for (a body
    /// longer than its `Content-Range`, possible without `Content-Length`).
    pub(super) excess: u64,
    pub(super) retry_after: Option<u64>,
    /// The attempt cannot count as progress (a stall).
    pub(super) unproductive: bool,
    /// The worker's connection; taken by the coordinator when it hands the
    /// connection on before handling the end.
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

/// Streams ranges into the part file over one connection: the claimed
/// one, then, as long as each ends complete and the file has work left,
/// the next claimed at once (its end is reported on `ends`), so the
/// connection never waits for the coordinator. Returns with the last
/// range's end and the connection.
pub(super) async fn worker(
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
pub(super) async fn fetch_range(shared: Arc<Shared>, claim: Claim) -> WorkerEnd {
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

pub(super) struct RangeWorker {
    pub(super) shared: Arc<Shared>,
    pub(super) start: u64,
    /// Range starts the claim made in memory, durable with the attempt.
    pub(super) boundaries: Vec<u64>,
    /// Received, not yet written (from `written` on): the response's own
    /// chunks, written with one vectored write and never copied.
    pub(super) buffer: VecDeque<Bytes>,
    /// Bytes in `buffer`.
    pub(super) buffered: usize,
    /// Where whole blocks are copied to be written (taken from and given
    /// back to [`Shared::bounces`]).
    pub(super) bounce: Option<Bounce>,
    /// Bytes received past the end this request asked for.
    pub(super) excess: u64,
    pub(super) retry_after: Option<u64>,
    pub(super) unproductive: bool,
    pub(super) attempt: Attempt,
}

impl RangeWorker {
    pub(super) fn path(&self) -> &str {
        &self.shared.path
    }

    /// Fetches what is left of the range: the request (while the claim
    /// commits), the check of the answer, the body.
    pub(super) async fn run(&mut self) -> Result<Ended> {
        let Some((from, end)) = self.begin() else {
            return Ok(Ended::Done);
        };
        let validator = self.shared.validator();
        let ask = Ask {
            span: Span::Range { from, end },
            validator: validator.as_deref(),
        };
        let Some(reply) = self.request(&ask).await? else {
            return Ok(Ended::Cancelled);
        };
        let mut body = match self.judge(&ask, reply, from, end)? {
            Ok(body) => body,
            Err(ended) => return Ok(ended),
        };
        self.receive(&mut body, from, end).await
    }

    /// Where the range's unwritten bytes start and where it ends; `None`
    /// when nothing of it is left.
    fn begin(&self) -> Option<(u64, u64)> {
        let mut slots = self.shared.slots();
        let s = slots.iter_mut().find(|s| s.start == self.start)?;
        s.pos = s.written;
        (s.written < s.end).then_some((s.written, s.end))
    }

    /// Sends `ask` while the claim commits; `None` when the file was
    /// cancelled before an answer came.
    async fn request(&mut self, ask: &Ask<'_>) -> Result<Option<Reply>> {
        let shared = self.shared.clone();
        let ctx = &shared.ctx;
        let path = shared.path.as_str();
        self.attempt = new_attempt(path, ctx.source.host(path)?, ask);
        let mut cancel = shared.cancel.clone();
        // The request goes out while the claim (the range's split, if any,
        // and the attempt's row) commits, an fsync: both are done before
        // any byte of the response is written, so every written byte lies
        // in a durable range and belongs to a durable attempt.
        let claimed = ctx.store.claim_range(
            ctx.run,
            path,
            &self.boundaries,
            ask.validator,
            &self.attempt,
        );
        let (id, answer) = tokio::join!(claimed, async {
            tokio::select! {
                b = ctx.source.read(path, *ask) => Some(b),
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
        let Some(answer) = answer else {
            return Ok(None);
        };
        let reply = answer?;
        record_reply(&mut self.attempt, &reply);
        Ok(Some(reply))
    }

    /// The one response check ([`crate::attempt::check`]) and what it means
    /// for a range: the first validator is learned; the whole file is read
    /// as one stream when nothing was known of it, else it ends the range
    /// (`Ok(Err(..))`). `Ok(Ok(body))`: the body to receive.
    fn judge(
        &mut self,
        ask: &Ask<'_>,
        reply: Reply,
        from: u64,
        end: u64,
    ) -> Result<std::result::Result<Body, Ended>> {
        let shared = self.shared.clone();
        let size = shared.size;
        let pinned = Pinned {
            path: &shared.path,
            size,
            commit: &shared.ctx.pin.commit,
            lfs_sha256: shared.lfs_sha256.as_deref(),
        };
        match check(&pinned, ask, reply)? {
            Verdict::Accepted {
                validator: now,
                body,
            } => {
                if ask.validator.is_none() {
                    self.learn_validator(now)?;
                }
                Ok(Ok(body))
            }
            Verdict::RangeIgnored {
                validator: now,
                length,
                body,
            } if from == 0 && end == size && ask.validator.is_none() => {
                // Ranges ignored on a file with nothing yet: one stream.
                shared.splittable.store(false, Ordering::SeqCst);
                self.learn_validator(now)?;
                whole_length(&shared.path, length, size)?;
                Ok(Ok(body))
            }
            Verdict::RangeIgnored { validator: now, .. } => {
                Ok(Err(Ended::RangeNotHonoured { validator: now }))
            }
            Verdict::Refused { retry_after, error } => {
                self.retry_after = retry_after;
                Err(error)
            }
        }
    }

    /// Reads the body into the buffer, writing whole batches, until the
    /// range (which may shrink by a split meanwhile) is complete.
    async fn receive(&mut self, body: &mut Body, from: u64, end: u64) -> Result<Ended> {
        let shared = self.shared.clone();
        let path = shared.path.as_str();
        let mut cancel = shared.cancel.clone();
        let min_rate = if shared.ctx.source.rate_rule_holds(path) {
            shared.ctx.opts.min_rate
        } else {
            0
        };
        let mut rate = RateWindow::new(min_rate, shared.ctx.opts.stall_window);
        // Time spent on the last chunk, from its arrival until the worker
        // asked for more; added to the slot with the next chunk.
        let mut handled = Duration::ZERO;
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout(BODY_TICK, body.chunk()) => n,
                _ = cancel.wait_for(|c| *c) => return Ok(Ended::Cancelled),
            };
            let Ok(next) = next else {
                if let Err(e) = rate.check(path, 0) {
                    self.unproductive = true;
                    return Err(e);
                }
                continue;
            };
            let chunk = match next {
                Ok(Some(c)) => c,
                Ok(None) => return self.body_ended(from, end),
                Err(e) => {
                    return Err(FetchError::Hub(HubError::BodyFailed {
                        path: path.to_owned(),
                        received: self.claimed().0 - from,
                        message: e.0,
                    }));
                }
            };
            let arrived = Instant::now();
            let Some((keep, done)) = self.take(&chunk, arrived, handled, end) else {
                return Ok(Ended::Done);
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
            if let Err(e) = rate.check(path, keep) {
                self.unproductive = true;
                return Err(e);
            }
            handled = arrived.elapsed();
        }
    }

    /// Claims what of `chunk` is still this range's (it may have been split
    /// since) and measures the connection; `(kept, range complete)`, or
    /// `None` when the range is gone.
    fn take(
        &mut self,
        chunk: &Bytes,
        arrived: Instant,
        handled: Duration,
        end: u64,
    ) -> Option<(u64, bool)> {
        let mut slots = self.shared.slots();
        let s = slots.iter_mut().find(|s| s.start == self.start)?;
        let keep = (chunk.len() as u64).min(s.end - s.pos);
        s.pos += keep;
        if s.first_byte.is_none() {
            s.first_byte = Some((arrived, s.pos));
            s.handling = Duration::ZERO;
        } else {
            s.handling += handled;
        }
        // Past the requested end (not a split's shorter end): the server
        // sent more than its Content-Range said.
        if s.end == end {
            self.excess += chunk.len() as u64 - keep;
        }
        Some((keep, s.pos == s.end))
    }

    /// The body ended: done if the range is complete, else a short body.
    fn body_ended(&self, from: u64, end: u64) -> Result<Ended> {
        let pos = self.claimed();
        if pos.0 >= pos.1 {
            Ok(Ended::Done)
        } else {
            Err(FetchError::Hub(HubError::ShortBody {
                path: self.shared.path.clone(),
                received: pos.0 - from,
                expected: end - from,
            }))
        }
    }

    /// Takes `now` as the file's validator, unless another range already
    /// learned a different one: bytes of two versions are never combined.
    pub(super) fn learn_validator(&self, now: Option<String>) -> Result<()> {
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
                let learned = v.is_none() && now.is_some();
                *v = now;
                drop(v);
                if learned {
                    // The file can be split from now on: the coordinator
                    // need not wait for its tick (a host already found slow
                    // per connection splits the file at once).
                    self.shared.wrote.notify_one();
                }
                Ok(())
            }
        }
    }

    /// `(pos, end)` of this worker's range.
    pub(super) fn claimed(&self) -> (u64, u64) {
        let slots = self.shared.slots();
        slots
            .iter()
            .find(|s| s.start == self.start)
            .map_or((0, 0), |s| (s.pos, s.end))
    }

    /// Writes the whole aligned blocks of the buffer (all of it when `all`,
    /// at the range's end).
    pub(super) fn flush(&mut self, all: bool) -> Result<()> {
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

    pub(super) fn no_space(&self, at: u64) -> FetchError {
        FetchError::NoSpace {
            volume: self.shared.ctx.dest().to_owned(),
            path: self.path().to_owned(),
            committed: at,
            still_needed: self.shared.size.saturating_sub(at),
        }
    }
}

/// Calls `f` with the first `len` bytes of `chunks`, in order.
pub(super) fn for_each_slice(chunks: &VecDeque<Bytes>, len: usize, mut f: impl FnMut(&[u8])) {
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
