//! One reconstruction shared by the bodies of a file fetched as several
//! ranges. A server names, per reconstruction request, the xorb spans
//! that request's terms need: ranges each asking their own got spans of
//! their own, so a span two ranges read crossed the wire once per range,
//! and the chunks one range's span held for another were let go (a repin
//! of a split shard fetched its new xorb once per range).
//!
//! So the ranges of a split file (`Span::Range` reads) read the terms
//! they hold whole from one reconstruction of the whole file: asked once,
//! kept while any of its bodies lives and for at most [`SHARE_FOR`], and
//! dropped (asked again by the next body) once a body of it failed, since
//! a failure may be an expired URL. Its bodies share the chunks held for
//! terms not yet handed on, which terms were handed on, and which spans
//! are being read: a term whose span another body is reading waits for
//! that read to end (at most the read timeout) and takes its chunks from
//! what it held. The terms on a range's edges, which it holds only part
//! of, come from reconstructions of those parts alone (the server cuts
//! their spans to the chunks the part needs, so ranges inside one large
//! term still fetch in parallel).
//!
//! Invariant: a span of the reconstruction crosses the wire once while
//! the chunks held for its other terms fit in
//! [`MAX_HELD_BYTES`](super::held::MAX_HELD_BYTES), the body reading it
//! is not cut off, and it is read within the wait. A one-stream read
//! (`Span::Whole`, `Span::From`) and a range's edges have reconstructions
//! of their own ([`Share::private`]).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::held::Held;
use super::wire::{Reconstruction, Term, XorbFetch};

/// A shared reconstruction is used by new bodies for at most this long
/// after it was asked (its URLs are presigned for longer; a body that
/// started on it keeps it, as a one-stream body keeps its own).
pub const SHARE_FOR: Duration = Duration::from_secs(300);

/// A xorb span as the reconstruction names it.
type SpanKey = (String, u64, u64);

fn span_key(term: &Term) -> SpanKey {
    let XorbFetch { first, last, .. } = term.fetch;
    (term.xorb.clone(), first, last)
}

/// A reconstruction and what the bodies reading it share.
pub(super) struct Share {
    pub(super) recon: Reconstruction,
    /// Where each term starts in the file.
    starts: Vec<u64>,
    asked: Instant,
    stale: AtomicBool,
    next_reading: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: Held,
    /// Terms a body handed on whole.
    done: Vec<bool>,
    /// Spans being read, by the id of their [`Reading`].
    reading: HashMap<SpanKey, (u64, watch::Receiver<()>)>,
}

/// A span being read; its waiters wake when it is dropped.
pub(super) struct Reading {
    share: Arc<Share>,
    key: SpanKey,
    id: u64,
    _tx: watch::Sender<()>,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut st = self.share.state();
        if st
            .reading
            .get(&self.key)
            .is_some_and(|(id, _)| *id == self.id)
        {
            st.reading.remove(&self.key);
        }
    }
}

impl Share {
    /// `recon`, asked for a span starting at `from` (read by one body).
    pub(super) fn private(recon: Reconstruction, from: u64) -> Result<Share, String> {
        Share::new(recon, from)
    }

    /// `recon` of the whole file (read by a split file's ranges).
    pub(super) fn whole_file(recon: Reconstruction) -> Result<Share, String> {
        Share::new(recon, 0)
    }

    fn new(recon: Reconstruction, from: u64) -> Result<Share, String> {
        let base = from
            .checked_sub(recon.offset)
            .ok_or_else(|| format!("offset {} before byte 0", recon.offset))?;
        let mut starts = Vec::with_capacity(recon.terms.len());
        let mut at = base;
        for t in &recon.terms {
            starts.push(at);
            at = at
                .checked_add(t.length)
                .ok_or_else(|| "term lengths overflow".to_owned())?;
        }
        let state = State {
            done: vec![false; recon.terms.len()],
            ..State::default()
        };
        Ok(Share {
            recon,
            starts,
            asked: Instant::now(),
            stale: AtomicBool::new(false),
            next_reading: AtomicU64::new(0),
            state: Mutex::new(state),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a new body may read it.
    pub(super) fn usable(&self) -> bool {
        !self.stale.load(Ordering::Relaxed) && self.asked.elapsed() < SHARE_FOR
    }

    /// A body of it failed: new bodies ask again.
    pub(super) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// The term holding byte `at` of the file and where it starts.
    pub(super) fn locate(&self, at: u64) -> Option<(usize, u64)> {
        let i = self.starts.partition_point(|&s| s <= at).checked_sub(1)?;
        let start = self.starts[i];
        (at - start < self.recon.terms[i].length).then_some((i, start))
    }

    /// Where term `index` starts in the file.
    pub(super) fn start(&self, index: usize) -> u64 {
        self.starts[index]
    }

    /// Where term `index` ends in the file.
    pub(super) fn end(&self, index: usize) -> u64 {
        self.starts[index] + self.recon.terms[index].length
    }

    /// The terms lying whole within `[from, end)`.
    pub(super) fn inside(&self, from: u64, end: u64) -> Range<usize> {
        let first = self.starts.partition_point(|&s| s < from);
        let mut last = self.starts.partition_point(|&s| s < end);
        while last > first && self.end(last - 1) > end {
            last -= 1;
        }
        first..last
    }

    /// Chunk ranges of `xorb` that terms other than `index` read and no
    /// body handed on yet.
    fn wanted(&self, st: &State, index: usize, xorb: &str) -> Vec<Range<u64>> {
        self.recon
            .terms
            .iter()
            .enumerate()
            .filter(|&(j, t)| t.xorb == xorb && !st.done[j] && j != index)
            .map(|(_, t)| t.chunk_start..t.chunk_end)
            .collect()
    }

    /// What term `index`, about to be fetched, keeps of its span for
    /// other terms.
    pub(super) fn wanted_by_others(&self, index: usize) -> Vec<Range<u64>> {
        let st = self.state();
        self.wanted(&st, index, &self.recon.terms[index].xorb)
    }

    /// Term `index`'s chunks when every one is held; the held chunks no
    /// term still wants are let go.
    pub(super) fn take_held(&self, index: usize) -> Option<Vec<Bytes>> {
        let term = &self.recon.terms[index];
        let mut st = self.state();
        let wanted = self.wanted(&st, index, &term.xorb);
        st.held.take(term, &wanted)
    }

    /// Keeps chunk `index` of `xorb` when `wanted` holds it (and the cap
    /// allows).
    pub(super) fn offer(&self, xorb: &str, index: u64, chunk: &Bytes, wanted: &[Range<u64>]) {
        if wanted.iter().any(|r| r.contains(&index)) {
            self.state().held.offer(xorb, index, chunk, wanted);
        }
    }

    /// Term `index` was handed on.
    pub(super) fn handed_on(&self, index: usize) {
        if let Some(d) = self.state().done.get_mut(index) {
            *d = true;
        }
    }

    /// The read of `term`'s span: this body's to make (registered until
    /// the [`Reading`] is dropped), or another body's to wait for. One
    /// look and one registration under one lock, so two bodies never both
    /// take a span.
    pub(super) fn claim_span(self: &Arc<Self>, term: &Term) -> Claim {
        let mut st = self.state();
        if let Some((_, rx)) = st.reading.get(&span_key(term)) {
            return Claim::Wait(rx.clone());
        }
        Claim::Mine(self.register(&mut st, term))
    }

    /// The read of `term`'s span taken by this body whoever else reads it
    /// (its waiters wait for this read from now on).
    pub(super) fn take_span(self: &Arc<Self>, term: &Term) -> Reading {
        let mut st = self.state();
        self.register(&mut st, term)
    }

    fn register(self: &Arc<Self>, st: &mut State, term: &Term) -> Reading {
        let (tx, rx) = watch::channel(());
        let id = self.next_reading.fetch_add(1, Ordering::Relaxed);
        let key = span_key(term);
        st.reading.insert(key.clone(), (id, rx));
        Reading {
            share: self.clone(),
            key,
            id,
            _tx: tx,
        }
    }
}

/// Who reads a span.
pub(super) enum Claim {
    /// This body: its read, registered while it lasts.
    Mine(Reading),
    /// Another body, whose read ends when this receiver's sender drops.
    Wait(watch::Receiver<()>),
}

impl Claim {
    /// Waits for another body's read to end, at most `limit`.
    pub(super) async fn wait(mut rx: watch::Receiver<()>, limit: Duration) {
        // Nothing is sent: `changed` ends when the reader drops its sender.
        let _ = tokio::time::timeout(limit, rx.changed()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(xorb: &str, chunks: Range<u64>, length: u64) -> Term {
        Term::for_test(xorb, chunks, length)
    }

    /// Terms of 10, 20 and 30 bytes: x 0..2, y 0..1, x 2..4.
    fn share() -> Arc<Share> {
        let recon = Reconstruction {
            offset: 0,
            terms: vec![
                term("x", 0..2, 10),
                term("y", 0..1, 20),
                term("x", 2..4, 30),
            ],
        };
        Arc::new(Share::whole_file(recon).unwrap())
    }

    #[test]
    fn terms_are_found_by_byte_and_those_inside_a_span_listed() {
        let s = share();
        assert_eq!(s.locate(0), Some((0, 0)));
        assert_eq!(s.locate(29), Some((1, 10)));
        assert_eq!(s.locate(30), Some((2, 30)));
        assert_eq!(s.locate(60), None);
        assert_eq!(s.inside(0, 60), 0..3);
        assert_eq!(s.inside(5, 60), 1..3);
        assert_eq!(s.inside(5, 59), 1..2);
        assert!(s.inside(11, 29).is_empty());
        let private = Share::private(
            Reconstruction {
                offset: 4,
                terms: vec![term("x", 0..2, 10)],
            },
            100,
        )
        .unwrap();
        assert_eq!(private.locate(100), Some((0, 96)));
    }

    #[test]
    fn chunks_are_held_for_terms_not_yet_handed_on_only() {
        let s = share();
        assert_eq!(s.wanted_by_others(0), vec![2..4]);
        s.handed_on(2);
        assert!(s.wanted_by_others(0).is_empty(), "term 2 was handed on");
        let s = share();
        let wanted = s.wanted_by_others(0);
        for i in 0..4u64 {
            s.offer("x", i, &Bytes::from(vec![i as u8; 15]), &wanted);
        }
        assert!(s.take_held(0).is_none(), "chunks 0 and 1 were not wanted");
        let got = s.take_held(2).unwrap();
        assert_eq!(got.len(), 2);
        assert!(s.take_held(2).is_none(), "let go once taken");
    }

    /// Two bodies never both read a span: the second is told to wait,
    /// and wakes when the first's read is dropped.
    #[tokio::test]
    async fn a_span_is_read_by_one_body_and_its_waiter_wakes_when_it_ends() {
        let s = share();
        let Claim::Mine(reading) = s.claim_span(&s.recon.terms[0]) else {
            panic!("the first claim waits");
        };
        let Claim::Wait(rx) = s.claim_span(&s.recon.terms[2]) else {
            panic!("a span being read was claimed again");
        };
        let waiter = tokio::spawn(Claim::wait(rx, Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(reading);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter woke")
            .unwrap();
        assert!(matches!(s.claim_span(&s.recon.terms[0]), Claim::Mine(_)));
    }
}
