//! The claim policy, pure over a file's ranges in memory: which range a
//! connection takes next, how large a claim is (pieces early, shrinking
//! together at the end of the whole fetch), where a range is split, and
//! the split rule's judgement of what a file's connections delivered.
//! Nothing here touches the network, the disk or the store, so the policy
//! is tested as plain functions.

use std::time::{Duration, Instant};

use ftpipe_receipts::RangeRow;

use crate::ctx::FetchOptions;
use crate::extent::{WRITE_ALIGN, align_up};

/// A connection's rate is judged over at least this long: a rate below a
/// quarter of `split_below_rate` is a capped connection at once; a rate
/// nearer the limit is judged over [`RATE_WINDOW_FULL`]. Judged over 100 ms
/// alone, the loopback bench's shards were split in all three rounds (37–66
/// requests), while every file starts at once; over 250 ms, in one of three.
pub(super) const RATE_WINDOW: Duration = Duration::from_millis(100);
pub(super) const RATE_WINDOW_FULL: Duration = Duration::from_millis(500);

/// A file is split only while its connections kept their workers waiting
/// for bytes at least this share of the time: the machine has room for
/// more (see [`delivered`]).
pub(super) const MIN_WAITING_SHARE: f64 = 0.25;

/// What a file's busy connections delivered, for the split rule.
#[derive(Debug, PartialEq)]
pub(super) struct Delivered {
    /// Bytes per second over the connections measured for at least
    /// [`RATE_WINDOW`]; `None` while none is.
    pub(super) rate: Option<f64>,
    /// Of their time, the share their workers spent waiting for bytes.
    pub(super) waiting: f64,
    /// The longest of those measurements.
    pub(super) longest: Duration,
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
pub(super) fn delivered(slots: &[Slot], now: Instant) -> Option<Delivered> {
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

/// How long a rate nearer the limit is measured before it is judged:
/// [`RATE_WINDOW_FULL`] while other files share the connections and the
/// machine (where a short window split files that did not need it); for
/// a file `alone` (none other in flight or waiting to start: a budgeted
/// run admits its shards one at a time), [`RATE_WINDOW`], as every other
/// connection is idle until the file is done and a split that does not
/// pay costs only its requests.
pub(super) fn judged_after(alone: bool) -> Duration {
    if alone { RATE_WINDOW } else { RATE_WINDOW_FULL }
}

/// The split rule's verdict on what a file's connections delivered, or
/// `None` while it cannot be told yet: a rate below a quarter of `limit`
/// with the workers waiting at least [`MIN_WAITING_SHARE`] of the time
/// pays at once; otherwise, once a connection has been measured for
/// `window` ([`judged_after`]), a rate below `limit` with the same
/// waiting pays and anything else does not.
pub(super) fn split_pays(limit: u64, d: &Delivered, window: Duration) -> Option<bool> {
    let rate = d.rate?;
    let waits = d.waiting >= MIN_WAITING_SHARE;
    if rate < limit as f64 / 4.0 && waits {
        Some(true)
    } else if d.longest >= window {
        Some(waits && rate < limit as f64)
    } else {
        None
    }
}

/// One range and what its worker has done with it.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) start: u64,
    /// One past the range's last byte; shrinks when the range is split.
    pub(super) end: u64,
    /// Checkpointed: in the store.
    pub(super) durable: u64,
    /// On disk (`durable ≤ written`), not yet fsynced past `durable`.
    pub(super) written: u64,
    /// Claimed by the worker: on disk or in its buffer (`written ≤ pos`).
    pub(super) pos: u64,
    /// Bytes written since the last checkpoint.
    pub(super) received: u64,
    /// The attempt fetching the range, and every byte it has stored.
    pub(super) attempt: Option<i64>,
    pub(super) attempt_bytes: u64,
    pub(super) busy: bool,
    /// A retry is not started before this (backoff, `Retry-After`): until
    /// then the range is idle and holds no connection.
    pub(super) retry_at: Option<Instant>,
    /// Consecutive failed attempts without progress.
    pub(super) failures: u32,
    /// When its first bytes since the claim arrived, and `pos` then: its
    /// rate is measured from there, in bytes received (not written, which
    /// moves in whole batches), and not from the claim (the request, the
    /// claim's transaction and the first byte's wait are not the
    /// connection's rate).
    pub(super) first_byte: Option<(Instant, u64)>,
    /// Of the time since `first_byte`, what its worker spent on the bytes
    /// it had (storing them, until it asked for more): the rest it waited
    /// for the connection, including any wait still going on.
    pub(super) handling: Duration,
}

impl Slot {
    pub(super) fn from_row(r: &RangeRow) -> Slot {
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

    pub(super) fn complete(&self) -> bool {
        self.durable == self.end
    }

    /// Idle and incomplete, with a retry not yet due at `now`.
    pub(super) fn waiting(&self, now: Instant) -> bool {
        !self.busy && !self.complete() && self.retry_at.is_some_and(|t| t > now)
    }
}

/// A piece of a gap of `gap` bytes: `piece_size`, or a
/// `2 × connections`-th of the gap when that is larger.
pub(super) fn piece(opts: &FetchOptions, gap: u64) -> u64 {
    let share = gap / (2 * opts.connections.max(1) as u64);
    opts.piece_size
        .max(share)
        .max(opts.min_range)
        .max(WRITE_ALIGN)
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
/// `waiting`: files wait to start.
pub(super) fn claim_size(opts: &FetchOptions, gap: u64, total: u64, waiting: bool) -> u64 {
    let share = total.max(gap) / opts.connections.max(1) as u64;
    if share >= opts.piece_size || waiting {
        return piece(opts, gap);
    }
    share.max(opts.min_range).max(WRITE_ALIGN)
}

/// A range claimed for a connection: where it starts, and the positions
/// the claim made range starts in memory. They become durable in the same
/// transaction as the attempt's row ([`ftpipe_receipts::Store::claim_range`]),
/// which commits while the request is on its way and before any byte of
/// the response is written; claims commit in any order (a boundary already
/// there is kept), so no claim waits for another.
pub(super) struct Claim {
    pub(super) start: u64,
    pub(super) boundaries: Vec<u64>,
}

/// Ends `slots[i]` at `at`; `[at, old end)` becomes a new range after it,
/// `busy` when a worker starts on it now.
pub(super) fn split_slot(slots: &mut Vec<Slot>, i: usize, at: u64, busy: bool) {
    let old_end = std::mem::replace(&mut slots[i].end, at);
    let mut new = Slot::from_row(&RangeRow {
        start: at,
        end: old_end,
        watermark: at,
    });
    new.busy = busy;
    slots.insert(i + 1, new);
}

/// End of the written bytes that follow on from byte 0.
pub(super) fn written_prefix(slots: &[Slot]) -> u64 {
    prefix_up_to(slots, |s| s.written)
}

/// End of the durable bytes that follow on from byte 0.
pub(super) fn contiguous_prefix(slots: &[Slot]) -> u64 {
    prefix_up_to(slots, |s| s.durable)
}

/// End of the bytes from 0 that ranges hold up to `mark`, without a gap.
pub(super) fn prefix_up_to(slots: &[Slot], mark: impl Fn(&Slot) -> u64) -> u64 {
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

/// What a claim is judged on besides the ranges themselves.
pub(super) struct Policy<'a> {
    pub(super) opts: &'a FetchOptions,
    /// Bytes every file fetched in ranges has left (this one included).
    pub(super) total: u64,
    /// Files wait to start.
    pub(super) waiting: bool,
    /// Ranges may be split: a strong validator is known and the server
    /// honours ranges.
    pub(super) splittable: bool,
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
/// `pays` judges whether another connection may raise the file's rate
/// (`Shared::another_connection_pays`).
pub(super) fn next_claim(
    slots: &mut Vec<Slot>,
    policy: &Policy<'_>,
    mut pays: impl FnMut(&[Slot], Instant) -> bool,
) -> Option<Claim> {
    let opts = policy.opts;
    let min = opts.min_range.max(WRITE_ALIGN);
    let splittable = policy.splittable;
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
            let size = claim_size(opts, s.end - s.written, policy.total, policy.waiting);
            let at = align_up(s.written.saturating_add(size));
            if splittable && at < s.end && s.end - at >= min {
                split_slot(slots, i, at, false);
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
        if !pays(slots, now) {
            return None;
        }
        let remaining = s.end - s.pos;
        let piece = piece(opts, remaining);
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
        split_slot(slots, i, at, busy);
        boundaries.push(at);
        if busy {
            return Some(Claim {
                start: at,
                boundaries,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        const FULL: Duration = RATE_WINDOW_FULL;
        let capped = 20e6;
        // Capped and waiting: pays after the short window.
        assert_eq!(split_pays(limit, &d(capped, 0.95, 100), FULL), Some(true));
        // Slow but never waiting (a slow disk): not judged until the full
        // window, then does not pay.
        assert_eq!(split_pays(limit, &d(capped, 0.05, 100), FULL), None);
        assert_eq!(split_pays(limit, &d(capped, 0.05, 500), FULL), Some(false));
        // Near the limit: judged after the full window only.
        assert_eq!(split_pays(limit, &d(100e6, 0.6, 200), FULL), None);
        assert_eq!(split_pays(limit, &d(100e6, 0.6, 500), FULL), Some(true));
        // Above the limit: does not pay.
        assert_eq!(split_pays(limit, &d(300e6, 0.9, 500), FULL), Some(false));
        // Nothing measured yet.
        let none = Delivered {
            rate: None,
            waiting: 0.0,
            longest: Duration::ZERO,
        };
        assert_eq!(split_pays(limit, &none, FULL), None);
    }

    #[test]
    fn a_file_alone_is_judged_after_the_short_window() {
        let limit = 128 * MIB;
        let d = |rate: f64, waiting: f64| Delivered {
            rate: Some(rate),
            waiting,
            longest: RATE_WINDOW,
        };
        let alone = judged_after(true);
        let shared = judged_after(false);
        // A capped connection near the limit, its worker waiting.
        assert_eq!(split_pays(limit, &d(50e6, 0.9), shared), None);
        assert_eq!(split_pays(limit, &d(50e6, 0.9), alone), Some(true));
        // The machine's own limit (the worker never waits): no split.
        assert_eq!(split_pays(limit, &d(50e6, 0.05), alone), Some(false));
        assert_eq!(split_pays(limit, &d(300e6, 0.9), alone), Some(false));
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
