//! Every no-progress loop of fetch ends in bounded time. The landed binary
//! restarted its retry budget after any attempt that appended bytes, so an
//! endless 200 body (cut at the expected size, the prefix committed again
//! each time) ran 650 retries and served 2.3 GB for a 349 KB file, and a
//! server that ignores Range and cuts every response got 582 GETs in 90 s;
//! a body trickling a few bytes per read was never a stall, since each read
//! returned within the read timeout; and a long `Retry-After` wait was
//! silent. Each test runs the real binary against the fixture hub under a
//! generous wall-clock limit (a bound, not a speed claim).

use std::process::{Command, Output};
use std::time::Duration;

use crate::common::*;
use ftpipe_fixtures::{Fault, FaultRule, RunningHub};

/// Far above what any of these runs needs, far below "never ends".
const BOUND: Duration = Duration::from_secs(120);

/// Runs `cmd`, killing it and failing the test if it outlives `BOUND`.
fn run_bounded(cmd: &mut Command) -> (Output, Duration) {
    run_watched(cmd, BOUND, Duration::from_millis(50), |_| {})
}

fn served(hub: &RunningHub, path: &str) -> u64 {
    body_gets(hub, path).iter().map(|r| r.body_bytes).sum()
}

/// The ledger of `path` adds up: transferred = committed + Σ discards.
fn assert_ledger_adds_up(out: &std::path::Path, path: &str) {
    let l = ledger(out, path);
    assert_eq!(
        l.transferred,
        l.committed + l.discarded,
        "ledger of {path}: {l:?}"
    );
}

#[test]
fn endless_body_is_cut_at_the_size_and_the_excess_is_a_discard() {
    let (hub, files, dir) = hub_2mib_and_tempdir(1201);
    let out = dir.path().join("out");
    let f = lfs_file(&files).clone();
    hub.inject(FaultRule::new(&f.path, Fault::EndlessBody).times(10_000));
    let (o, _) = run_bounded(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    // One response: cut at the size, then the complete .part is verified
    // without another request.
    assert_eq!(body_gets(&hub, &f.path).len(), 1);
    assert!(served(&hub, &f.path) < 16 * content_len(&f));
    let l = ledger(&out, &f.path);
    assert_eq!(l.committed, content_len(&f));
    assert!(l.discarded > 0, "the excess was not recorded: {l:?}");
    assert_eq!(discard_reasons(&out, &f.path), ["long_body_excess"]);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry"]);
    let err = query(
        &out,
        &format!(
            "SELECT error FROM attempts WHERE path = {}",
            sql_str(&f.path)
        ),
    );
    assert!(err[0].contains("runs past the expected size"), "{err:?}");
    assert_ledger_adds_up(&out, &f.path);
}

#[test]
fn range_ignoring_cutter_fails_in_bounded_time_saying_so() {
    let (hub, files, dir) = hub_2mib_and_tempdir(1203);
    let out = dir.path().join("out");
    let f = lfs_file(&files).clone();
    hub.inject(FaultRule::new(&f.path, Fault::IgnoreRangeShort { after: 300_000 }).times(10_000));
    let (o, _) = run_bounded(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--checkpoint-bytes", "65536"],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&f.path), "{err}");
    assert!(err.contains("ignores Range"), "{err}");
    assert!(
        err.contains("no response delivered the whole file"),
        "{err}"
    );
    // The first attempt moved the watermark (budget restarts once); every
    // later one re-sent the same prefix: default --retries 8 → 9 GETs.
    assert_eq!(body_gets(&hub, &f.path).len(), 9);
    assert!(!out.join("source").join(&f.path).exists());
    assert!(!has_receipt(&out, &f.path));
    assert_ledger_adds_up(&out, &f.path);
}

#[test]
fn trickle_is_a_stall_and_ends_after_the_retries() {
    let (hub, files, dir) = hub_2mib_and_tempdir(1204);
    let out = dir.path().join("out");
    let f = lfs_file(&files).clone();
    // 1000 bytes/s, each read well within the 30 s read timeout.
    hub.inject(
        FaultRule::new(
            &f.path,
            Fault::Trickle {
                bytes: 100,
                every_ms: 100,
            },
        )
        .times(10_000),
    );
    let (o, elapsed) = run_bounded(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--min-rate", "10000", "--stall-secs", "1", "--retries", "2"],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&f.path), "{err}");
    assert!(err.contains("stalled"), "{err}");
    assert!(
        err.contains("below the minimum rate of 10000 bytes/s"),
        "{err}"
    );
    // A stalled attempt appends bytes but never restarts the budget.
    assert_eq!(body_gets(&hub, &f.path).len(), 3);
    assert!(elapsed >= Duration::from_secs(3), "{elapsed:?}");
    assert_ledger_adds_up(&out, &f.path);
}

#[test]
fn one_trickling_response_is_a_stall_then_the_transfer_resumes() {
    let (hub, files, dir) = hub_2mib_and_tempdir(1205);
    let out = dir.path().join("out");
    let f = lfs_file(&files).clone();
    hub.inject(FaultRule::new(
        &f.path,
        Fault::Trickle {
            bytes: 100,
            every_ms: 100,
        },
    ));
    let (o, _) = run_bounded(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &[
            "--min-rate",
            "10000",
            "--stall-secs",
            "1",
            "--checkpoint-secs",
            "0.2",
        ],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "ok"]);
    // The trickled prefix was kept: the second request resumed after it.
    let gets = body_gets(&hub, &f.path);
    assert!(
        gets[1].range.as_deref().is_some_and(|r| r != "bytes=0-"),
        "{gets:#?}"
    );
}

#[test]
fn retry_after_wait_is_shown_with_its_length() {
    let (hub, files, dir) = hub_2mib_and_tempdir(1206);
    let out = dir.path().join("out");
    let f = files.iter().find(|f| f.path == "config.json").unwrap();
    hub.inject(FaultRule::new(
        &f.path,
        Fault::RetryAfter {
            status: 429,
            secs: 1,
        },
    ));
    let (o, _) = run_bounded(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("config.json: retry 1 in 1.0")
            && err.contains("(waiting for the hub: Retry-After 1 s, capped at 60 s)"),
        "{err}"
    );
}
