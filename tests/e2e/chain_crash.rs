//! Crash points of the whole chain resolve → plan → fetch → convert → verify.
//!
//! The first test aborts `ftpipe run` at every named crash point
//! (`FTPIPE_CRASH_AT`, one per window between two durable steps; see the
//! crash table in docs/design.md), checks the state the abort left, and
//! resumes with a plain `ftpipe run`, which must finish with the manifest of
//! an uninterrupted run.
//!
//! The second is a kill storm: `ftpipe run` is killed with SIGKILL at
//! seeded random moments (≥ 100, `KILLS=N` for more) spread over whole
//! chains from scratch — whenever a chain completes, a fresh directory
//! starts, so kills keep landing in live work. After every kill the ledger
//! and component invariants hold; after every completed chain the manifest
//! equals the uninterrupted run's, `verify --deep` and the deep audit pass
//! with reconciliation 0, and the ledger adds up. It prints where the kills
//! landed (which stage was running, or between two stages). The seed is
//! printed; `FTPIPE_CRASH_SEED` replays the delays.

use crate::common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ftpipe_fixtures::RunningHub;
use ftpipe_fixtures::checkpoint::SplitMix64;
use ftpipe_fixtures::qwen4::QwenShape;

/// Frequent checkpoints, so fetch kills land before, during and after them.
pub(crate) const ARGS: &[&str] = &["--checkpoint-bytes", "65536", "--checkpoint-secs", "0.02"];

/// Every named crash point on the path of a first `ftpipe run`, in chain
/// order, with the stage whose work it interrupts.
/// Online the fetch drives the conversion: without a budget the skeleton
/// is saved by the fetch stage beside its first transfers, components are
/// written as their shards are verified.
const CRASH_POINTS: &[(&str, &str)] = &[
    ("resolve-done", "resolve"),
    ("resolve-completed", "resolve"),
    ("punch-probing", "plan"),
    ("plan-done", "plan"),
    ("plan-completed", "plan"),
    ("skeleton-written", "fetch"),
    ("checkpoint-synced", "fetch"),
    ("fetch-verified", "fetch"),
    ("fetch-renamed", "fetch"),
    ("span-synced", "fetch"),
    ("span-claimed", "fetch"),
    ("component-renamed", "fetch"),
    ("fetch-done", "fetch"),
    ("fetch-completed", "fetch"),
    ("manifest-written", "convert"),
    ("manifest-recorded", "convert"),
    ("convert-done", "convert"),
    ("convert-completed", "convert"),
    ("verify-done", "verify"),
    ("verify-completed", "verify"),
];

fn shape() -> QwenShape {
    QwenShape::small_test()
}

/// An uninterrupted run's manifest SHA-256.
fn reference_manifest(hub: &RunningHub, tmp: &Path) -> String {
    let out = tmp.join("reference");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, ARGS));
    manifest_sha(&out)
}

/// Every component receipt names a file with the receipt's size and
/// SHA-256 (a receipt is committed only after its file is durable).
pub(crate) fn check_components_after_kill(out: &Path, label: &str) -> usize {
    let Ok(rows) = try_query(
        out,
        "SELECT path || '|' || size || '|' || sha256 FROM components",
    ) else {
        return 0; // killed before the table existed
    };
    for row in &rows {
        let mut it = row.splitn(3, '|');
        let (path, size, sha) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let file = out.join("artifact").join(path);
        let bytes = std::fs::read(&file)
            .unwrap_or_else(|e| panic!("{label}: receipt for {path} without its file: {e}"));
        assert_eq!(bytes.len().to_string(), size, "{label}: size of {path}");
        assert_eq!(sha256_hex(&bytes), sha, "{label}: {path}");
    }
    rows.len()
}

/// Finishes `out` and checks it against the reference: manifest, deep
/// verify, deep audit with reconciliation 0, ledger, no leftovers.
fn finish_and_check(hub: &RunningHub, out: &Path, reference: &str, label: &str) {
    let o = run(&mut run_cmd(&hub.endpoint(), out, ARGS));
    assert!(o.status.success(), "{label}: final run: {}", stderr(&o));
    check_finished(hub, out, reference, label);
}

pub(crate) fn check_finished(hub: &RunningHub, out: &Path, reference: &str, label: &str) {
    assert_eq!(manifest_sha(out), reference, "{label}: manifest differs");
    let v = run(ftpipe()
        .arg("verify")
        .arg(out.join("artifact"))
        .arg("--deep"));
    assert!(v.status.success(), "{label}: verify --deep: {}", stderr(&v));
    assert_clean_audit(out);
    for r in ledger_snapshot(out) {
        assert!(r.receipt, "{label}: {r:?}");
        assert_eq!((r.committed, r.adopted), (r.expected, 0), "{label}: {r:?}");
        assert_eq!(r.transferred, r.committed + r.discarded, "{label}: {r:?}");
    }
    let reasons = query(out, "SELECT DISTINCT reason FROM discards");
    for reason in &reasons {
        assert!(
            reason == "uncheckpointed_tail" || reason == "stale_part",
            "{label}: discard reason {reason} in a crash-only run"
        );
    }
    // `run` now answers from durable state alone.
    let o = run_ok(&mut run_cmd(&hub.endpoint(), out, ARGS));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("nothing to do"),
        "{label}: not a no-op: {text}"
    );
}

/// Body GETs of `.safetensors` files in the hub's log.
fn shard_body_gets(hub: &RunningHub) -> usize {
    hub.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(".safetensors"))
        .filter(|r| r.status == 200 || r.status == 206)
        .count()
}

/// Regression (issue 16): a `run` killed after a file's last checkpoint but
/// before its publish left a `.part` holding every byte, a watermark equal
/// to the size and no receipt. The plan stage judged "all sources local"
/// from the watermarks (`bytes_still_needed == 0`), read `source/` where
/// the file was not yet published, and failed with "… is missing from the
/// source checkpoint" on every later run, never reaching the fetch that
/// would publish it. The plan now reads a file from disk only if it has a
/// receipt, and every other file's header from the hub.
#[test]
fn a_run_killed_between_the_last_checkpoint_and_the_publish_finishes() {
    let hub = qwen4_hub(61, shape());
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference_manifest(&hub, tmp.path());
    let out = tmp.path().join("out");
    // One file at a time; abort at the last file's publish, so that every
    // other file is published and this one is complete in `.part`.
    let files = hub.listing(REPO, "main").unwrap().len();
    let point = format!("fetch-verified#{files}");
    let mut cmd = run_cmd(&hub.endpoint(), &out, ARGS);
    let o = run(cmd.args(["--jobs", "1"]).env("FTPIPE_CRASH_AT", &point));
    assert!(
        stderr(&o).contains(&format!("FTPIPE_CRASH_AT={point}: aborting here")),
        "{}",
        stderr(&o)
    );
    // The state of the report: complete `.part`, watermark = size, no receipt.
    let complete_unpublished: Vec<_> = ledger_snapshot(&out)
        .into_iter()
        .filter(|r| !r.receipt && r.committed == r.expected)
        .filter(|r| on_disk_len(&out, &r.path) == r.expected)
        .collect();
    assert_eq!(complete_unpublished.len(), 1, "{complete_unpublished:?}");
    let published = ledger_snapshot(&out).iter().filter(|r| r.receipt).count();
    assert_eq!(published, files - 1);
    let part = part_path(&out, &complete_unpublished[0].path);
    assert!(part.is_file(), "{}", part.display());
    // `convert` alone also judges from receipts: it names the file.
    let o = run(&mut convert_cmd(&out, &[]));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&complete_unpublished[0].path)
            && stderr(&o).contains("no download receipt"),
        "{}",
        stderr(&o)
    );
    finish_and_check(&hub, &out, &reference, "after fetch-verified");
}

#[test]
fn every_named_crash_point_of_the_chain_resumes_to_the_reference() {
    let hub = qwen4_hub(62, shape());
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference_manifest(&hub, tmp.path());
    for (i, (point, stage)) in CRASH_POINTS.iter().enumerate() {
        let out = tmp.path().join(format!("out-{i}-{point}"));
        let o = run(run_cmd(&hub.endpoint(), &out, ARGS).env("FTPIPE_CRASH_AT", point));
        assert!(
            !o.status.success()
                && stderr(&o).contains(&format!("FTPIPE_CRASH_AT={point}#1: aborting")),
            "{point}: the crash point was not reached ({:?}): {}",
            o.status,
            stderr(&o)
        );
        check_after_kill(&out, point);
        check_components_after_kill(&out, point);
        // The stage interrupted is the one the log shows running, or (at a
        // `-completed` point) the last one completed.
        let last = query(
            &out,
            "SELECT stage || ':' || event FROM stage_events ORDER BY id DESC LIMIT 1",
        );
        let want = if point.ends_with("-completed") {
            format!("{stage}:completed")
        } else {
            format!("{stage}:started")
        };
        assert_eq!(last, [want], "{point}: last stage event");
        let fetched_before = shard_body_gets(&hub);
        finish_and_check(&hub, &out, &reference, point);
        // Once the fetch stage completed, resuming transfers no shard bytes:
        // the plan reads published files from disk.
        let fetch_was_done = CRASH_POINTS
            .iter()
            .position(|(p, _)| *p == "fetch-done")
            .is_some_and(|done| i >= done);
        if fetch_was_done {
            assert_eq!(
                shard_body_gets(&hub),
                fetched_before,
                "{point}: shard bytes were requested again"
            );
        }
    }
}

/// Where a kill landed, from the last stage event of the killed run.
pub(crate) fn landed_in(out: &Path) -> String {
    let rows = try_query(
        out,
        "SELECT stage || ':' || event FROM stage_events
         WHERE run_id = (SELECT MAX(id) FROM runs) ORDER BY id DESC LIMIT 1",
    )
    .unwrap_or_default();
    match rows.first().map(|r| r.split_once(':').unwrap()) {
        None => "start-up".to_owned(),
        Some((stage, "started")) => stage.to_owned(),
        Some((stage, _)) => format!("after {stage}"),
    }
}

/// Milliseconds since `spawned` (an upper bound of a finished child's run).
fn child_finished_in(spawned: Instant) -> u64 {
    spawned.elapsed().as_millis() as u64
}

#[test]
fn kill_storm_over_whole_chains_keeps_every_invariant() {
    let _heavy = heavy();
    let t0 = Instant::now();
    let kills: usize = std::env::var("KILLS")
        .ok()
        .map(|k| k.parse().expect("KILLS must be a number"))
        .unwrap_or(100);
    let seed = crash_seed();
    eprintln!("kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let hub = qwen4_hub(63, shape());
    let tmp = tempfile::tempdir().unwrap();
    // Calibration: one uninterrupted chain (T) gives the reference.
    let start = Instant::now();
    let reference = reference_manifest(&hub, tmp.path());
    let mut chain_ms = (start.elapsed().as_millis() as u64).max(20);
    eprintln!("calibration: a whole chain takes {chain_ms} ms; kill delays in 0..{chain_ms} ms");

    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    let mut chains = 0usize;
    let mut exited = 0usize;
    let mut mid_file = 0usize;
    let mut in_convert = 0usize;
    let new_dir = |n: usize| -> PathBuf { tmp.path().join(format!("chain-{n}")) };
    let mut out = new_dir(0);
    // No kill has landed in `out` yet: a run there is a whole chain.
    let mut from_scratch = true;
    let mut kill = 0;
    while kill < kills {
        let delay = rng.next_u64() % chain_ms;
        let spawned = Instant::now();
        let mut child = run_cmd(&hub.endpoint(), &out, ARGS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ftpipe");
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill(); // SIGKILL
        let status = child.wait().expect("wait");
        let label = format!("kill {} after {delay} ms in {}", kill + 1, out.display());
        assert!(
            status.success() || status.code().is_none(),
            "{label}: run exited with {status} on its own"
        );
        if status.success() {
            // The chain finished before the kill (not counted as a kill):
            // check it, start afresh. If it ran from scratch, a whole chain
            // is never longer than that: a calibration slowed by a busy
            // machine would otherwise keep the delays past most chains'
            // ends. A resumed run's time bounds only what was left of its
            // chain, so it says nothing about a whole one.
            if from_scratch && child_finished_in(spawned) < chain_ms {
                chain_ms = child_finished_in(spawned).max(20);
            }
            exited += 1;
            chains += 1;
            check_finished(&hub, &out, &reference, &label);
            out = new_dir(chains);
            from_scratch = true;
            continue;
        }
        kill += 1;
        from_scratch = false;
        let st = check_after_kill(&out, &label);
        mid_file += usize::from(st.mid_file);
        let receipted = check_components_after_kill(&out, &label);
        let place = landed_in(&out);
        // The pipelined run converts inside its fetch stage: a kill there
        // with a component receipted or a span claimed and no manifest
        // landed in the conversion too.
        let claimed = try_query(&out, "SELECT COUNT(*) FROM component_spans")
            .ok()
            .and_then(|r| r.first().and_then(|n| n.parse::<usize>().ok()))
            .unwrap_or(0);
        let manifest = out.join("artifact").join("manifest.json").exists();
        if place == "convert" || (place == "fetch" && receipted + claimed > 0 && !manifest) {
            in_convert += 1;
        }
        *landed.entry(place).or_default() += 1;
    }
    finish_and_check(&hub, &out, &reference, "last chain");
    chains += 1;
    let in_fetch = landed.get("fetch").copied().unwrap_or(0);
    let between: usize = landed
        .iter()
        .filter(|(k, _)| k.starts_with("after "))
        .map(|(_, v)| v)
        .sum();
    eprintln!(
        "kill storm (seed {seed}): {kills} kills over {chains} chains in {:?}: {in_fetch} in fetch, \
         {in_convert} in the conversion (its stage, or the fetch stage once a span is claimed), {between} between stages, {mid_file} left a file \
         mid-transfer; {exited} runs finished before their kill; by place: {landed:?}",
        t0.elapsed()
    );
    assert!(
        in_fetch > 0 && in_convert > 0 && mid_file > 0,
        "the storm missed the fetch or the conversion: {landed:?}"
    );
}
