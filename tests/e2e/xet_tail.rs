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

/// How a run's killed fetch and its resume went.
struct Resumed {
    size: u64,
    /// The watermark the kill left.
    killed_at: u64,
    /// Attempts the kill left in flight (a range each).
    in_flight: u64,
    /// Every `(from, to)` the resume said it kept.
    kept: Vec<(u64, u64)>,
    /// Xorb bytes fetched by the killed run and the resume, beyond a clean
    /// fetch's.
    again: u64,
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

/// Fetches one Xet shard of a repo of `repo_bytes` with `layout`
/// (checkpoints every `checkpoint` bytes), killed at about 90 %;
/// `damage` (a share of the file) changes the `.part`'s byte there before
/// the resume; `crash_at` aborts the first resume at that point (the
/// second then finishes). The file must end whole and the audit clean.
fn kill_and_resume(
    seed: u64,
    repo_bytes: u64,
    layout: &[&str],
    checkpoint: u64,
    damage: Option<(u64, u64)>,
    crash_at: Option<&str>,
) -> Resumed {
    let (hub, files, _cas, proxy, _hashes) = xet_served_sized(seed, repo_bytes);
    let f = lfs_file(&files);
    let size = content_len(f);
    let tmp = tempfile::tempdir().unwrap();
    let (clean, _) = clean_xorb_bytes(&hub, &proxy, &tmp.path().join("clean"), &f.path);
    let every = checkpoint.to_string();
    let args = [
        layout,
        &["--include", &f.path, "--checkpoint-bytes", &every],
    ]
    .concat();
    let at = format!("xet-term-recorded#{}", size * 9 / 10 / BATCH);
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
    let part = out.join("source").join(format!("{}.part", f.path));
    if let Some((num, den)) = damage {
        let mut bytes = std::fs::read(&part).unwrap();
        let i = usize::try_from(size * num / den).unwrap();
        bytes[i] ^= 0x5a;
        std::fs::write(&part, bytes).unwrap();
    }
    let mut said = String::new();
    if let Some(point) = crash_at {
        let o = run(fetch_cmd(&hub.endpoint(), &out, &args).env("FTPIPE_CRASH_AT", point));
        assert!(
            stderr(&o).contains(&format!("FTPIPE_CRASH_AT={point}#")),
            "{point} not reached: {}",
            stderr(&o)
        );
        said.push_str(&stderr(&o));
    }
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args));
    assert!(o.status.success(), "{}", stderr(&o));
    said.push_str(&stderr(&o));
    assert_eq!(
        std::fs::read(out.join("source").join(&f.path)).unwrap(),
        ftpipe_fixtures::checkpoint::content_bytes(f)
            .unwrap()
            .as_ref()
    );
    assert_clean_audit(&out);
    let both = recorded_fetched(&out, &f.path);
    let r = Resumed {
        size,
        killed_at,
        in_flight,
        kept: kept_lines(&said),
        again: both.saturating_sub(clean),
        tail_discarded: tail_discarded(&out, &f.path),
    };
    eprintln!(
        "{size} bytes, watermark {killed_at} and {in_flight} attempts in flight at the kill; \
         kept {:?}; {} xorb bytes again; {} discarded as uncheckpointed_tail",
        r.kept, r.again, r.tail_discarded
    );
    r
}

/// The kill cost, per range in flight, at most the batch being recorded,
/// the batch read ahead and a chunk, and the write alignment.
fn assert_little_fetched_again(r: &Resumed) {
    assert!(
        r.again <= r.in_flight.max(1) * (2 * BATCH + 128 * 1024) + 64 * 1024,
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
    let one_stream = [
        "--jobs",
        "1",
        "--connections",
        "1",
        "--segment-threshold",
        "1GiB",
    ];
    let r = kill_and_resume(391, 32 << 20, &one_stream, 64 << 20, None, None);
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
    let ranges = [
        "--jobs",
        "1",
        "--connections",
        "2",
        "--segment-threshold",
        "4MiB",
    ];
    let r = kill_and_resume(392, 64 << 20, &ranges, 4 << 20, None, None);
    assert!(!r.kept.is_empty(), "nothing kept");
    assert_little_discarded(&r, 2);
    assert_little_fetched_again(&r);
}

/// A byte changed in the tail after the kill: the run of kept chunks ends
/// before it, what follows is discarded and fetched again, and the file
/// is published right.
#[test]
fn a_tail_changed_after_the_kill_is_kept_only_up_to_the_change() {
    let one_stream = [
        "--jobs",
        "1",
        "--connections",
        "1",
        "--segment-threshold",
        "1GiB",
    ];
    let r = kill_and_resume(393, 32 << 20, &one_stream, 64 << 20, Some((1, 2)), None);
    let changed = r.size / 2;
    assert_eq!(r.kept.len(), 1, "kept {:?}", r.kept);
    let (from, to) = r.kept[0];
    assert!(
        from < to && to <= changed,
        "kept {from}..{to}, byte {changed} changed"
    );
    assert!(
        to + 128 * 1024 > changed,
        "kept {from}..{to}: the chunks before byte {changed} are whole"
    );
    assert!(
        r.tail_discarded > 0,
        "nothing past the change was discarded"
    );
}

/// A resume aborted once its proven tail is fsynced and not yet claimed
/// (`tail-proven`) claims nothing; the next proves and keeps it again.
#[test]
fn a_resume_killed_between_proving_and_claiming_a_tail_keeps_it_next_time() {
    let ranges = [
        "--jobs",
        "1",
        "--connections",
        "2",
        "--segment-threshold",
        "4MiB",
    ];
    let r = kill_and_resume(394, 64 << 20, &ranges, 4 << 20, None, Some("tail-proven"));
    assert!(!r.kept.is_empty(), "nothing kept");
    assert_little_fetched_again(&r);
}
