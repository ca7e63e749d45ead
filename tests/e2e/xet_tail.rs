//! Bytes written past the last checkpoint survive a kill (issue 37, the
//! kill goal). A Xet fetch records every chunk's hash and place before it
//! hands the chunk's bytes on, yet a kill threw away everything written
//! past a range's last checkpoint all the same (`uncheckpointed_tail`):
//! with a 1 GiB file's 4 MiB checkpoint interval and two ranges, up to
//! 8 MiB, about half of what `bench/xet.sh` measured fetched again after a
//! kill. Now the resume reads those bytes back and keeps the run of chunks
//! whose recorded hashes they match (fsynced, then claimed in one
//! transaction with the rest's discard); only what follows is fetched
//! again. A byte changed on disk after the kill ends the run at its chunk.
//!
//! The CAS is `local_cas_server` behind the recording proxy
//! (`xet_source::xet_served_sized`); the kill is the abort at
//! `xet-term-recorded#N` (a batch recorded, not yet handed on) at about
//! 90 % of the file, with checkpoints far apart so that the tail is most
//! of the file.

use std::path::Path;

use crate::common::*;
use crate::xet_source::{clean_xorb_bytes, recorded_fetched, xet_served_sized};

/// The batch the Xet source records and hands on at a time.
const BATCH: u64 = 1 << 20;

/// The shard fetched as one stream.
const ONE_STREAM: &[&str] = &[
    "--jobs",
    "1",
    "--connections",
    "1",
    "--segment-threshold",
    "1GiB",
];

/// The shard fetched as two ranges (one per core).
const TWO_RANGES: &[&str] = &[
    "--jobs",
    "1",
    "--connections",
    "2",
    "--segment-threshold",
    "4MiB",
];

/// The shard's ranges (as [`TWO_RANGES`] made them) fetched one at a time.
const RANGES_ONE_AT_A_TIME: &[&str] = &[
    "--jobs",
    "1",
    "--connections",
    "1",
    "--segment-threshold",
    "4MiB",
];

/// How a run's killed fetch and its resume went.
struct Resumed {
    size: u64,
    /// The watermark the kill left.
    killed_at: u64,
    /// Attempts the kill left in flight (a range each).
    in_flight: u64,
    /// The byte changed before the resume.
    damaged: Option<u64>,
    /// Every `(from, to)` the resumes said they kept.
    kept: Vec<(u64, u64)>,
    /// Those the last resume (the one that finished) said it kept.
    kept_last: Vec<(u64, u64)>,
    /// Xorb bytes fetched by the killed run and the resume, beyond a clean
    /// fetch's.
    again: u64,
    /// Decoded bytes those runs fetched and skipped: chunks before a
    /// range's start that its first term holds (a clean fetch, one stream,
    /// skips none). How a split or a resume divides the ranges depends on
    /// the rates it measures, so this moves from run to run.
    skipped: u64,
    /// A range's tail at the kill reached a chunk and the write
    /// alignment past its watermark, which was past the range's start: the
    /// resume had something it could keep.
    keepable: bool,
    /// Bytes recorded as `uncheckpointed_tail`.
    tail_discarded: u64,
}

/// The `(from, to)` of every "kept … (bytes FROM..TO)" line in `stderr`.
fn kept_lines(stderr: &str) -> Vec<(u64, u64)> {
    stderr
        .lines()
        .filter(|l| l.contains("written past the last checkpoint"))
        .filter_map(|l| {
            let span = l.split("(bytes ").nth(1)?.split(')').next()?;
            let (a, b) = span.split_once("..")?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// Whether a range of `path` in `out` whose watermark is past its start
/// holds written bytes a chunk and the write alignment past it (a hole
/// reads as zeros; the fixture's tensor bytes are not).
fn keepable_tail(out: &Path, path: &str) -> bool {
    const PAST: u64 = (128 + 64) * 1024;
    let part = std::fs::read(out.join("source").join(format!("{path}.part"))).unwrap();
    let rows = query(
        out,
        &format!(
            "SELECT watermark || ' ' || end_ FROM fetch_ranges WHERE path = {} \
             AND watermark > start AND watermark < end_",
            sql_str(path)
        ),
    );
    rows.iter().any(|row| {
        let (w, end) = row.split_once(' ').unwrap();
        let (w, end): (u64, u64) = (w.parse().unwrap(), end.parse().unwrap());
        let from = usize::try_from(w + PAST).unwrap();
        let to = usize::try_from((w + PAST + 4096).min(end)).unwrap();
        from < to
            && part
                .get(from..to)
                .is_some_and(|b| b.iter().any(|&x| x != 0))
    })
}

fn skipped(out: &Path, path: &str) -> u64 {
    query(
        out,
        &format!(
            "SELECT COALESCE(SUM(skipped), 0) FROM xet_terms WHERE path = {}",
            sql_str(path)
        ),
    )[0]
    .parse()
    .unwrap()
}

fn tail_discarded(out: &Path, path: &str) -> u64 {
    query(
        out,
        &format!(
            "SELECT COALESCE(SUM(bytes), 0) FROM discards WHERE path = {} \
             AND reason = 'uncheckpointed_tail'",
            sql_str(path)
        ),
    )[0]
    .parse()
    .unwrap()
}

/// One kill and its resume.
struct Case {
    seed: u64,
    /// The repo's size (two shards of half each; one is fetched).
    repo_bytes: u64,
    layout: &'static [&'static str],
    /// `--checkpoint-bytes`.
    checkpoint: u64,
    /// Where the fetch is killed (`FTPIPE_CRASH_AT`); `None`: right after
    /// the batch at about 90 % of the file was recorded.
    kill_at: Option<&'static str>,
    /// A byte of the `.part` changed before the resume.
    damage: Damage,
    /// The resumes before the last abort there, one each, in order.
    crash_at: &'static [&'static str],
    /// The layout those resumes take instead of `layout`.
    aborted_layout: Option<&'static [&'static str]>,
}

/// Which byte of the `.part` a case changes after the kill.
#[derive(Clone, Copy)]
enum Damage {
    None,
    /// The byte at this share (numerator, denominator) of the file.
    AtShare(u64, u64),
    /// The byte this far past the watermark of the first range whose
    /// watermark is past its start and short of its end.
    PastARangesWatermark(u64),
}

/// Fetches one Xet shard as `case` says, killed, then resumed. The file
/// must end whole and the audit clean.
fn kill_and_resume(case: &Case) -> Resumed {
    let (hub, files, _cas, proxy, _hashes) = xet_served_sized(case.seed, case.repo_bytes);
    let f = lfs_file(&files);
    let size = content_len(f);
    let tmp = tempfile::tempdir().unwrap();
    let (clean, _) = clean_xorb_bytes(&hub, &proxy, &tmp.path().join("clean"), &f.path);
    let every = case.checkpoint.to_string();
    let selection = ["--include", f.path.as_str(), "--checkpoint-bytes", &every];
    let args = [case.layout, &selection].concat();
    let at = case.kill_at.map_or_else(
        || format!("xet-term-recorded#{}", size * 9 / 10 / BATCH),
        str::to_owned,
    );
    let out = tmp.path().join("out");
    let o = run(fetch_cmd(&hub.endpoint(), &out, &args).env("FTPIPE_CRASH_AT", &at));
    assert!(!o.status.success(), "{}", stderr(&o));
    let killed_at = ledger(&out, &f.path).committed;
    let in_flight = query(
        &out,
        &format!(
            "SELECT count(*) FROM attempts WHERE path = {} AND outcome = 'in_flight'",
            sql_str(&f.path)
        ),
    )[0]
    .parse()
    .unwrap();
    let keepable = keepable_tail(&out, &f.path);
    let damaged = damage(&out, &f.path, size, case.damage);
    let mut said = String::new();
    for point in case.crash_at {
        let aborted = [case.aborted_layout.unwrap_or(case.layout), &selection].concat();
        let o = run(fetch_cmd(&hub.endpoint(), &out, &aborted).env("FTPIPE_CRASH_AT", point));
        let name = point.split('#').next().unwrap_or(point);
        assert!(
            stderr(&o).contains(&format!("FTPIPE_CRASH_AT={name}#")),
            "{point} not reached: {}",
            stderr(&o)
        );
        said.push_str(&stderr(&o));
    }
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args));
    assert!(o.status.success(), "{}", stderr(&o));
    let kept_last = kept_lines(&stderr(&o));
    said.push_str(&stderr(&o));
    assert_files_match(&out, std::slice::from_ref(f));
    assert_clean_audit(&out);
    let both = recorded_fetched(&out, &f.path);
    let r = Resumed {
        size,
        killed_at,
        in_flight,
        damaged,
        kept: kept_lines(&said),
        kept_last,
        again: both.saturating_sub(clean),
        skipped: skipped(&out, &f.path),
        keepable,
        tail_discarded: tail_discarded(&out, &f.path),
    };
    eprintln!(
        "{size} bytes, watermark {killed_at} and {in_flight} attempts in flight at the kill; \
         a keepable tail {keepable}; byte {damaged:?} changed; kept {:?}; {} xorb bytes again, \
         {} decoded bytes skipped; {} discarded as uncheckpointed_tail",
        r.kept, r.again, r.skipped, r.tail_discarded
    );
    r
}

/// Changes the byte of `path`'s `.part` in `out` that `how` names; which.
fn damage(out: &Path, path: &str, size: u64, how: Damage) -> Option<u64> {
    let at = match how {
        Damage::None => return None,
        Damage::AtShare(num, den) => size * num / den,
        Damage::PastARangesWatermark(past) => {
            let w = query(
                out,
                &format!(
                    "SELECT MIN(watermark) FROM fetch_ranges WHERE path = {} \
                     AND watermark > start AND watermark < end_",
                    sql_str(path)
                ),
            );
            w[0].parse::<u64>().expect("a range part way through") + past
        }
    };
    let part = out.join("source").join(format!("{path}.part"));
    let mut bytes = std::fs::read(&part).unwrap();
    bytes[usize::try_from(at).unwrap()] ^= 0x5a;
    std::fs::write(&part, bytes).unwrap();
    Some(at)
}

/// The kill cost, per range in flight, at most what its reader's pipeline
/// holds, each at most a batch (1 MiB and the chunk that filled it): the
/// chunks its writer has taken, those read ahead for it (1 MiB), the rest
/// of the batch they came from, the batch recorded at the kill and the
/// body bytes of the chunk being decoded; and the write alignment.
fn assert_little_fetched_again(r: &Resumed) {
    let per_range = 4 * (BATCH + 128 * 1024);
    assert!(
        r.again <= r.in_flight.max(1) * per_range + 64 * 1024,
        "{} xorb bytes fetched again, {} attempts in flight at the kill",
        r.again,
        r.in_flight
    );
}

/// At most the write alignment and a chunk per range was discarded as
/// `uncheckpointed_tail`.
fn assert_little_discarded(r: &Resumed, ranges: u64) {
    assert!(
        r.tail_discarded <= ranges * (64 + 128) * 1024,
        "{} bytes discarded as uncheckpointed_tail",
        r.tail_discarded
    );
}

/// One stream: everything written since byte 0 is kept.
#[test]
fn a_killed_streams_tail_past_its_checkpoint_is_kept() {
    let r = kill_and_resume(&Case {
        seed: 391,
        repo_bytes: 32 << 20,
        layout: ONE_STREAM,
        checkpoint: 64 << 20,
        kill_at: None,
        damage: Damage::None,
        crash_at: &[],
        aborted_layout: None,
    });
    assert!(
        r.killed_at < r.size / 2,
        "the kill left watermark {}",
        r.killed_at
    );
    let kept: u64 = r.kept.iter().map(|(a, b)| b - a).sum();
    assert!(kept > r.size / 2, "kept {kept} of {}", r.size);
    assert_little_discarded(&r, 1);
    assert_little_fetched_again(&r);
}

/// Two ranges, checkpoints every 4 MiB: each range's tail past its
/// watermark is kept but for what lies past its write alignment (64 KiB)
/// or in a chunk not yet whole on disk. A range whose watermark is still
/// its start keeps nothing when its first chunk begins in the range before
/// it (that chunk cannot be hashed whole): the interval here puts every
/// range's watermark past its start before the kill.
#[test]
fn the_tails_of_a_killed_files_ranges_are_kept() {
    let r = kill_and_resume(&Case {
        seed: 392,
        repo_bytes: 64 << 20,
        layout: TWO_RANGES,
        checkpoint: 4 << 20,
        kill_at: None,
        damage: Damage::None,
        crash_at: &[],
        aborted_layout: None,
    });
    // Which range the kill finds depends on the rates: one a split had
    // just made may have written nothing past its watermark. (A kill at a
    // checkpoint's fsync instead always leaves a tail, but the range the
    // split made may not have committed a watermark yet; its tail is then
    // discarded whole when its first chunk begins in the range before it,
    // past what `assert_little_discarded` allows: 2.36 MB in a CI run.)
    assert!(
        !r.keepable || !r.kept.is_empty(),
        "a range had a tail to keep, nothing was kept"
    );
    assert_little_discarded(&r, 2);
    assert_little_fetched_again(&r);
}

/// A byte changed in the tail after the kill (a stream's, then a range's):
/// the run of kept chunks ends before it, what follows is discarded and
/// fetched again, and the file is published right.
#[test]
fn a_tail_changed_after_the_kill_is_kept_only_up_to_the_change() {
    let stream = kill_and_resume(&Case {
        seed: 393,
        repo_bytes: 32 << 20,
        layout: ONE_STREAM,
        checkpoint: 64 << 20,
        kill_at: None,
        damage: Damage::AtShare(1, 2),
        crash_at: &[],
        aborted_layout: None,
    });
    assert_kept_up_to_the_change(&stream);
    // A checkpoint's bytes fsynced and not claimed: every range has a
    // tail past its watermark.
    let ranges = kill_and_resume(&Case {
        seed: 395,
        repo_bytes: 64 << 20,
        layout: TWO_RANGES,
        checkpoint: 4 << 20,
        kill_at: Some("checkpoint-synced#2"),
        damage: Damage::PastARangesWatermark(300_000),
        crash_at: &[],
        aborted_layout: None,
    });
    assert_kept_up_to_the_change(&ranges);
}

/// The kept run that holds the changed byte's range ends before it, within
/// a chunk (and the write alignment) of it, and something was discarded.
fn assert_kept_up_to_the_change(r: &Resumed) {
    let changed = r.damaged.expect("a byte was changed");
    let (from, to) = *r
        .kept
        .iter()
        .filter(|(from, _)| *from <= changed)
        .max()
        .unwrap_or_else(|| panic!("nothing kept before byte {changed}: {:?}", r.kept));
    assert!(
        from < to && to <= changed,
        "kept {from}..{to}, byte {changed} changed"
    );
    assert!(
        to + (128 + 64) * 1024 > changed,
        "kept {from}..{to}: the chunks before byte {changed} are whole"
    );
    assert!(
        r.tail_discarded > 0,
        "nothing past the change was discarded"
    );
}

/// A resume aborted once its proven tails are fsynced and not yet claimed
/// (`tail-proven`) claims nothing, one aborted once they are claimed and
/// the rest recorded (`tail-claimed`) claims them once; the next resume
/// keeps what is left. The kill is a checkpoint's fsync whose watermarks
/// were not committed, so every range has a tail.
#[test]
fn a_resume_killed_while_it_settles_a_tail_keeps_it_once() {
    let cases: [(u64, &'static [&'static str]); 2] =
        [(394, &["tail-proven"]), (396, &["tail-claimed"])];
    for (seed, crash_at) in cases {
        let r = kill_and_resume(&Case {
            seed,
            repo_bytes: 64 << 20,
            layout: TWO_RANGES,
            checkpoint: 4 << 20,
            kill_at: Some("checkpoint-synced#3"),
            damage: Damage::None,
            crash_at,
            aborted_layout: None,
        });
        assert!(!r.kept.is_empty(), "{crash_at:?}: nothing kept");
        assert_little_fetched_again(&r);
    }
}

/// A tail's rest recorded as discarded but not yet punched out (a resume
/// aborted at `tail-claimed`, as a power cut before the punch's fsync
/// would leave it) is owned by no attempt: the next resume punches it out
/// before any worker starts. Left in place, the bytes past a damaged
/// chunk were good: once the next resume's attempt wrote over the damaged
/// chunk and died, the resume after it proved its bytes and the stale
/// ones after them as one run and credited that attempt with bytes it
/// never received. Here the kill leaves a 4 MiB tail in each range, a
/// byte 300 KB past the first range's watermark is changed, the first
/// resume keeps the whole chunks before it (cut to the 64 KiB write
/// alignment) and stops at `tail-claimed`, the
/// second (one connection: the first range, then the second) dies once
/// three batches are recorded (at most two written, the first surely; a
/// batch is cut at the chunk that fills 1 MiB), and the third may keep
/// only what the second wrote, to the write alignment.
#[test]
fn a_tails_rest_left_by_a_crash_is_never_credited_to_a_later_attempt() {
    let r = kill_and_resume(&Case {
        seed: 397,
        repo_bytes: 64 << 20,
        layout: TWO_RANGES,
        checkpoint: 8 << 20,
        kill_at: Some("checkpoint-synced#2"),
        damage: Damage::PastARangesWatermark(300_000),
        crash_at: &["tail-claimed", "xet-term-recorded#3"],
        aborted_layout: Some(RANGES_ONE_AT_A_TIME),
    });
    let kept: u64 = r.kept_last.iter().map(|(a, b)| b - a).sum();
    assert!(
        kept <= 2 * (BATCH + 128 * 1024) + 64 * 1024,
        "the last resume kept {:?}: more than the resume before it could have written",
        r.kept_last
    );
}
