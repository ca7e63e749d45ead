//! Crash test: `ftpipe fetch` is killed with SIGKILL at seeded random moments,
//! resumed, and the outcome is compared with a reference model.
//!
//! The seed is printed; re-run with `FTPIPE_CRASH_SEED=<seed>` to replay the
//! same kill delays (the delays are reproducible, the exact instruction a kill
//! lands on is not: it depends on scheduling).
//!
//! Setup: a generated ~32 MiB repo (3 LFS safetensors shards + 4 small
//! files, LFS redirected to the fixture CDN), `--jobs 2`,
//! `--checkpoint-bytes 262144 --checkpoint-secs 0.05` so checkpoints are
//! frequent and kills land before, during and after them. One uninterrupted
//! fetch into a scratch directory calibrates the run time T (printed); each
//! kill then waits a seeded random delay in `0..W` ms with `W` derived from T,
//! so most kills land mid-transfer and some during start-up (open, migrate,
//! resolve, reconcile, prefix re-hash) or publication. When a directory is
//! complete before the kills run out (a slow calibration on a busy machine),
//! it is finished and checked, and a new *round* starts in a fresh directory
//! with shorter delays, so every kill interrupts real work.
//!
//! After every kill (no process running), the state is checked read-only:
//!
//! * durability ordering: for every file, `committed ≤` the on-disk length of
//!   its `.part` (or of the final file once published) — "the ledger never
//!   claims bytes that are not on disk". kill -9 does not lose the page cache,
//!   so this checks the *ordering* of write → fsync → ledger commit, not that
//!   the fsync itself reached the platter;
//! * `transferred = committed + Σ discards` (holds after every transaction);
//! * `committed + adopted ≤ expected`, nothing adopted (all bytes are ours);
//! * a receipt implies the final file with `expected` bytes;
//! * `PRAGMA integrity_check` is `ok`.
//!
//! After the kills (and at the end of each round), one fetch runs to
//! completion and the reference model is:
//!
//! * every final file is byte-identical to the hub's, no `.part` left, deep
//!   audit ok with `reconciliation_error = 0`, integrity ok;
//! * per file `committed = expected`, `adopted = 0`,
//!   `transferred = committed + Σ discards`;
//! * the only discard reasons are `uncheckpointed_tail` and `stale_part`
//!   (bytes on disk past the watermark at a kill). Crashes alone never cause
//!   `part_shorter_than_watermark` (that would mean the watermark was
//!   committed before its bytes were written), nor `range_not_honoured` or
//!   `digest_mismatch`;
//! * nothing is double-counted, bounded from both sides per file:
//!   `Σ body_bytes of finished attempts (ok/retry/failed) ≤ transferred ≤
//!   Σ body bytes the hub handed to the connection`. The lower bound holds
//!   because a finished attempt has checkpointed every byte it received
//!   (no faults are injected, so no chunk is refused); attempts left
//!   `in_flight` by a kill are excluded here (they hold what their
//!   checkpoints committed; that Σ of all attempts = transferred is the
//!   audit's own check, which must pass). The upper
//!   bound holds because every byte counted as transferred was read from a
//!   response; the hub may have sent more (socket buffers lost at a kill);
//! * watermarks never move backwards in a crash-only run, so the `Range`
//!   starts of a file's successive GETs are non-decreasing; every ranged GET
//!   carries `If-Range` and got a `206` (never a `200` to a range).
//!
//! Per-run statistics (kills, kills that landed mid-file, wasted bytes by
//! reason) are printed.

use crate::common::*;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ftpipe_fixtures::checkpoint::SplitMix64;

const KILLS: usize = 32;
const REPO_BYTES: u64 = 32 << 20;
const ARGS: &[&str] = &[
    "--jobs",
    "2",
    "--checkpoint-bytes",
    "262144",
    "--checkpoint-secs",
    "0.05",
];

#[test]
fn sigkill_at_random_moments_then_resume_matches_reference_model() {
    let _heavy = heavy();
    let t0 = Instant::now();
    let seed = crash_seed();
    eprintln!("crash seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let (hub, files) = hub_with_repo(seed % 1000, REPO_BYTES);
    let expected_total: u64 = files.iter().map(content_len).sum();
    let dir = tempfile::tempdir().unwrap();

    // Calibration: one uninterrupted fetch (T), then a no-op re-run (S:
    // process start, open, resolve, reconcile, audit).
    let cal = dir.path().join("calibrate");
    let start = Instant::now();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &cal, ARGS));
    let full = start.elapsed();
    assert!(o.status.success(), "calibration fetch: {}", stderr(&o));
    let start = Instant::now();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &cal, ARGS));
    let startup = start.elapsed();
    assert!(o.status.success(), "calibration re-run: {}", stderr(&o));
    // A quarter of the kills land in start-up (0..S); the rest at S plus a
    // slice of 0..2Y, Y chosen so that together they cover about 2x the
    // transfer time T - S: most land mid-transfer while the fetch is still
    // incomplete (resumes also re-hash their prefix, which slows progress).
    let s_ms = (startup.as_millis() as u64).max(5);
    let x_ms = (full.as_millis() as u64).saturating_sub(s_ms).max(50);
    let y_ms = (x_ms * 2 * 4 / (3 * KILLS as u64)).max(5);
    eprintln!(
        "calibration: {} files, {expected_total} bytes: full fetch T = {full:?}, no-op re-run S = {startup:?}; \
         kill delays: 1/4 in 0..{s_ms} ms, 3/4 in {s_ms}..{} ms",
        files.len(),
        s_ms + 2 * y_ms
    );
    hub.clear_requests();

    // A round is one output directory killed until it is complete; the next
    // round starts afresh with shorter delays, so every kill hits real work.
    let mut rounds: u32 = 1;
    let mut out = dir.path().join("out-1");
    let mut waste: BTreeMap<String, u64> = BTreeMap::new();
    let mut transferred = 0u64;
    let mut interrupted = 0u64;
    let mut y_ms = y_ms;
    let mut mid_file_kills = 0;
    let mut exited_before_kill = 0;
    for kill in 1..=KILLS {
        let delay = if rng.next_u64().is_multiple_of(4) {
            rng.next_u64() % s_ms
        } else {
            s_ms + rng.next_u64() % (2 * y_ms)
        };
        let mut child = fetch_cmd(&hub.endpoint(), &out, ARGS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ftpipe");
        std::thread::sleep(Duration::from_millis(delay));
        if child.try_wait().expect("try_wait").is_some() {
            exited_before_kill += 1;
        }
        let _ = child.kill(); // SIGKILL on unix
        let status = child.wait().expect("wait");
        // Exit 0 means it finished before the kill; any other code is a bug.
        assert!(
            status.success() || status.code().is_none(),
            "kill {kill}: fetch exited with {status} on its own"
        );
        let st = check_after_kill(&out, &format!("kill {kill}"));
        mid_file_kills += usize::from(st.mid_file);
        eprintln!(
            "kill {kill:>2} after {delay:>4} ms: {} of {expected_total} bytes committed, {} files published{}",
            st.committed,
            st.published,
            if st.mid_file { ", mid-file" } else { "" }
        );
        if st.published == files.len() && kill < KILLS {
            let a = finish_and_check(&hub, &out, &files, expected_total);
            for (reason, bytes) in a["waste_by_reason"].as_object().unwrap() {
                *waste.entry(reason.clone()).or_default() += bytes.as_u64().unwrap();
            }
            transferred += a["transferred_bytes"].as_u64().unwrap();
            interrupted += a["interrupted_attempts"].as_u64().unwrap();
            rounds += 1;
            out = dir.path().join(format!("out-{rounds}"));
            y_ms = (y_ms * 2 / 3).max(5);
            hub.clear_requests();
            eprintln!(
                "round {rounds}: fresh directory, kill delays now {s_ms}..{} ms",
                s_ms + 2 * y_ms
            );
        }
    }

    // Resume the last round to completion.
    let a = finish_and_check(&hub, &out, &files, expected_total);
    for (reason, bytes) in a["waste_by_reason"].as_object().unwrap() {
        *waste.entry(reason.clone()).or_default() += bytes.as_u64().unwrap();
    }
    transferred += a["transferred_bytes"].as_u64().unwrap();
    interrupted += a["interrupted_attempts"].as_u64().unwrap();
    assert!(
        mid_file_kills > 0,
        "no kill landed mid-file (seed {seed}): resume was not exercised"
    );
    eprintln!(
        "crash run (seed {seed}): {KILLS} kills in {rounds} round(s) ({mid_file_kills} mid-file, \
         {exited_before_kill} after the fetch had already exited), transferred {transferred} for \
         {} expected, wasted by reason {waste:?}, interrupted attempts {interrupted}, total {:?}",
        expected_total * u64::from(rounds),
        t0.elapsed()
    );
}

/// Runs the fetch in `out` to completion and checks it against the reference
/// model (see the module doc). Returns the deep audit.
fn finish_and_check(
    hub: &ftpipe_fixtures::RunningHub,
    out: &Path,
    files: &[ftpipe_fixtures::RepoFile],
    expected_total: u64,
) -> serde_json::Value {
    // Resume to completion.
    let o = run(&mut fetch_cmd(&hub.endpoint(), out, ARGS));
    assert!(o.status.success(), "final fetch: {}", stderr(&o));
    assert_files_match(out, files);
    assert_clean_audit(out);
    assert_eq!(query(out, "PRAGMA journal_mode"), ["wal"]);

    // Reference model, per file.
    let rows = ledger_snapshot(out);
    assert_eq!(rows.len(), files.len());
    let mut finished_attempt_bytes: BTreeMap<String, u64> = BTreeMap::new();
    for row in query(
        out,
        "SELECT path || '|' || body_bytes FROM attempts WHERE outcome != 'in_flight'",
    ) {
        let (p, b) = row.rsplit_once('|').unwrap();
        *finished_attempt_bytes.entry(p.to_owned()).or_default() += b.parse::<u64>().unwrap();
    }
    for r in &rows {
        assert!(r.receipt, "{r:?}");
        assert_eq!(r.committed, r.expected, "{r:?}");
        assert_eq!(r.adopted, 0, "{r:?}");
        assert_eq!(r.transferred, r.committed + r.discarded, "{r:?}");
        let reqs = body_requests(hub, &r.path);
        let served: u64 = reqs.iter().map(|q| q.body_bytes).sum();
        let finished = finished_attempt_bytes.get(&r.path).copied().unwrap_or(0);
        assert!(
            finished <= r.transferred && r.transferred <= served,
            "{}: finished attempts {finished} ≤ transferred {} ≤ served {served} violated",
            r.path,
            r.transferred
        );
        let mut last_start = 0u64;
        for q in &reqs {
            let start = match &q.range {
                None => {
                    assert_eq!(q.status, 200, "{}: {q:?}", r.path);
                    0
                }
                Some(range) => {
                    assert_eq!(q.status, 206, "{}: 200 to a ranged request {q:?}", r.path);
                    assert!(
                        q.if_range.is_some(),
                        "{}: Range without If-Range {q:?}",
                        r.path
                    );
                    range
                        .strip_prefix("bytes=")
                        .and_then(|s| s.strip_suffix('-'))
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| panic!("{}: odd range {range}", r.path))
                }
            };
            assert!(
                start >= last_start,
                "{}: resume went backwards from {last_start} to {start}",
                r.path
            );
            last_start = start;
        }
    }
    let a = audit_json(out, true);
    let waste = a["waste_by_reason"].as_object().unwrap();
    for reason in waste.keys() {
        assert!(
            reason == "uncheckpointed_tail" || reason == "stale_part",
            "unexpected discard reason {reason} in a crash-only run: {a:#}"
        );
    }
    let wasted: u64 = waste.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(
        a["transferred_bytes"].as_u64().unwrap(),
        expected_total + wasted
    );

    a
}

/// Regression: a kill -9 while SQLite is creating `state.db` (before the WAL
/// header is written) leaves a file that SQLite rolls back to empty on the
/// next open. `Store::open` decided "bootstrap" by the file's existence, so
/// it skipped `journal_mode = WAL` and the directory stayed in rollback-
/// journal mode for good (seen as `SQLITE_READONLY_ROLLBACK` from a read-only
/// reader after such a kill). The empty file is exactly that rolled-back
/// state.
#[test]
fn database_whose_creation_was_killed_still_ends_up_in_wal() {
    let (hub, files) = hub_with_repo(11, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join(".ftpipe")).unwrap();
    std::fs::write(out.join(".ftpipe/state.db"), b"").unwrap();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    assert_eq!(query(&out, "PRAGMA journal_mode"), ["wal"]);
}
