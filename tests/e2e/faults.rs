//! End-to-end fault injection: every misbehaviour of the fixture hub ends in
//! a verified file or a clear error, never in a published wrong byte.
//!
//! Each test runs the real `ftpipe` binary against the loopback hub, with a
//! small `--checkpoint-bytes` so partial progress is durable, and checks the
//! exit code, the bytes on disk, the ledger (`transferred = committed +
//! discarded`, with the specific discard reasons), the `attempts` rows and
//! the requests the hub saw.

use std::time::{Duration, Instant};

use crate::common::*;
use ftpipe_fixtures::{Fault, FaultRule, RepoFile, RunningHub, checkpoint};

const CKPT: &[&str] = &["--checkpoint-bytes", "65536"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v: Vec<&'a str> = CKPT.to_vec();
    v.extend_from_slice(extra);
    v
}

/// Success: exit 0, bytes equal the hub's, audit clean, ledger adds up.
fn assert_success(o: &std::process::Output, out: &std::path::Path, files: &[RepoFile]) {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(o)
    );
    assert_files_match(out, files);
    assert_clean_audit(out);
}

/// `Range: bytes=N-` with N > 0 and an `If-Range` was sent for `path`.
fn assert_resumed_with_if_range(hub: &RunningHub, path: &str) -> u64 {
    let gets = body_gets(hub, path);
    gets.iter()
        .find_map(|r| {
            let n: u64 = r
                .range
                .as_deref()?
                .strip_prefix("bytes=")?
                .strip_suffix('-')?
                .parse()
                .ok()?;
            (n > 0 && r.if_range.is_some()).then_some(n)
        })
        .unwrap_or_else(|| panic!("no resume request with Range and If-Range: {gets:#?}"))
}

/// Resets the first body GET of `path` mid-body, then answers the resuming
/// request with `fault`.
fn interrupt_then(hub: &RunningHub, path: &str, fault: Fault) {
    hub.inject(FaultRule::new(path, Fault::ResetMidBody { after: 300_000 }));
    hub.inject(FaultRule::new(path, fault).nth(2));
}

fn assert_nothing_published(out: &std::path::Path, path: &str) {
    assert!(
        !out.join("source").join(path).exists(),
        "{path} was published"
    );
    assert!(!has_receipt(out, path), "{path} has a receipt");
}

#[test]
fn reset_mid_body_resumes_with_range_and_if_range() {
    let (hub, files, dir) = hub_2mib_and_tempdir(11);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(
        &f.path,
        Fault::ResetMidBody { after: 300_000 },
    ));
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    let n = assert_resumed_with_if_range(&hub, &f.path);
    assert!(n <= 300_000, "resumed at {n}, past what was sent");
    let l = ledger(&out, &f.path);
    assert_eq!(l.transferred, l.committed + l.discarded);
    assert_eq!(l.discarded, 0, "{:?}", discards(&out, &f.path));
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "ok"]);
    assert_eq!(hub.pending_faults(), 0);
}

#[test]
fn short_body_resumes() {
    let (hub, files, dir) = hub_2mib_and_tempdir(12);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::ShortBody { after: 200_000 }));
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    assert_resumed_with_if_range(&hub, &f.path);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "ok"]);
    let l = ledger(&out, &f.path);
    assert_eq!(l.discarded, 0);
    assert_eq!(l.transferred, content_len(f));
}

#[test]
fn ignored_range_discards_prefix_and_restarts_from_zero() {
    let (hub, files, dir) = hub_2mib_and_tempdir(13);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    interrupt_then(&hub, &f.path, Fault::IgnoreRange);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    let n = assert_resumed_with_if_range(&hub, &f.path);
    let gets = body_gets(&hub, &f.path);
    assert_eq!(gets.len(), 2, "{gets:#?}");
    assert_eq!(gets[1].status, 200, "the fault answers 200 to the range");
    let l = ledger(&out, &f.path);
    assert_eq!(discards(&out, &f.path), [format!("range_not_honoured:{n}")]);
    assert_eq!(l.committed, content_len(f));
    assert_eq!(l.transferred, n + content_len(f));
    assert_eq!(l.transferred, l.committed + l.discarded);
}

#[test]
fn wrong_content_range_on_resume_is_never_appended() {
    let (hub, files, dir) = hub_2mib_and_tempdir(14);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    interrupt_then(&hub, &f.path, Fault::WrongContentRange);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "retry", "ok"]);
    // The lying 206 contributed no byte: nothing discarded, nothing counted.
    let l = ledger(&out, &f.path);
    assert_eq!(l.discarded, 0, "{:?}", discards(&out, &f.path));
    assert_eq!(l.transferred, content_len(f));
    let cr = query(
        &out,
        &format!(
            "SELECT content_range || '|' || body_bytes || '|' || error FROM attempts WHERE path = {} ORDER BY id",
            sql_str(&f.path)
        ),
    );
    assert!(cr[1].contains("Content-Range"), "{cr:?}");
    let gets = body_gets(&hub, &f.path);
    assert_eq!(gets.len(), 3);
    assert_eq!(
        gets[1].range, gets[2].range,
        "the retry asks for the same range"
    );
}

/// Regression: a 206 answering a request that had no `Range` at all (the fixture's
/// WrongContentRange on a first request) is a lying server, like a wrong
/// `Content-Range` on a resume: nothing may be appended, and the request
/// is retried rather than failing the file for good.
#[test]
fn wrong_content_range_on_first_request_is_retried() {
    let (hub, files, dir) = hub_2mib_and_tempdir(15);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::WrongContentRange));
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "ok"]);
    let l = ledger(&out, &f.path);
    assert_eq!(l.discarded, 0);
    assert_eq!(l.transferred, content_len(f));
}

fn changed(f: &RepoFile) -> Vec<u8> {
    let mut b = checkpoint::content_bytes(f).unwrap().to_vec();
    let mid = b.len() / 2;
    b[mid] ^= 0x55;
    b
}

/// Content and ETag change under the pinned commit after a partial
/// download. (Regression: the refetch then saw `X-Linked-Etag` contradict
/// the pin, which was a transient `BadHeader` retried ~8 times with backoff
/// for ~8 s before "giving up"; it now fails at once, saying digest mismatch.) If-Range makes the hub send a 200 with the new body, so the
/// prefix is discarded and the file restarts; the new bytes fail the pinned
/// digest (twice: the refetch sees the same lie) and the run fails naming
/// the file, without publishing anything.
#[test]
fn changed_content_of_lfs_file_fails_with_digest_mismatch() {
    let _time_bounded = time_bounded();
    let (hub, files, dir) = hub_2mib_and_tempdir(16);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(
        &f.path,
        Fault::ResetMidBody { after: 300_000 },
    ));
    hub.inject(
        FaultRule::new(
            &f.path,
            Fault::ChangeContent {
                new: changed(f).into(),
            },
        )
        .nth(2),
    );
    let t = Instant::now();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(err.contains(&f.path), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_nothing_published(&out, &f.path);
    assert_resumed_with_if_range(&hub, &f.path);
    let reasons = discard_reasons(&out, &f.path);
    assert_eq!(reasons[0], "range_not_honoured", "{reasons:?}");
    assert!(
        reasons.contains(&"digest_mismatch".to_owned()),
        "{reasons:?}"
    );
    let l = ledger(&out, &f.path);
    assert_eq!(l.transferred, l.committed + l.discarded);
    let outcomes = attempt_outcomes(&out, &f.path);
    assert_eq!(outcomes.first().map(String::as_str), Some("retry"));
    assert_eq!(
        outcomes.last().map(String::as_str),
        Some("failed"),
        "{outcomes:?}"
    );
    // The other files are fine and published.
    for g in files.iter().filter(|g| g.path != f.path) {
        assert!(has_receipt(&out, &g.path), "{}", g.path);
    }
}

/// Same for a small file served by the hub itself (git blob identity).
#[test]
fn changed_content_of_small_file_fails_with_digest_mismatch() {
    let (hub, files, dir) = hub_2mib_and_tempdir(17);
    let out = dir.path().join("out");
    let f = files.iter().find(|f| f.path == "tokenizer.json").unwrap();
    assert!(
        content_len(f) > 2 * 1024,
        "tokenizer.json is big enough to cut"
    );
    hub.inject(FaultRule::new(&f.path, Fault::ResetMidBody { after: 1024 }));
    hub.inject(
        FaultRule::new(
            &f.path,
            Fault::ChangeContent {
                new: changed(f).into(),
            },
        )
        .nth(2),
    );
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--checkpoint-bytes", "512"],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(err.contains(&f.path), "{err}");
    assert_nothing_published(&out, &f.path);
    assert_resumed_with_if_range(&hub, &f.path);
    let reasons = discard_reasons(&out, &f.path);
    assert_eq!(
        reasons,
        ["range_not_honoured", "digest_mismatch", "digest_mismatch"]
    );
    let l = ledger(&out, &f.path);
    assert_eq!(l.transferred, l.committed + l.discarded);
    assert_eq!(
        attempt_outcomes(&out, &f.path),
        ["retry", "failed", "failed"]
    );
}

#[test]
fn range_not_satisfiable_is_retried() {
    let (hub, files, dir) = hub_2mib_and_tempdir(18);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    interrupt_then(&hub, &f.path, Fault::RangeNotSatisfiable);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "retry", "ok"]);
    let statuses = query(
        &out,
        &format!(
            "SELECT status FROM attempts WHERE path = {} ORDER BY id",
            sql_str(&f.path)
        ),
    );
    assert_eq!(statuses, ["200", "416", "206"]);
    let l = ledger(&out, &f.path);
    assert_eq!(l.discarded, 0);
    assert_eq!(l.transferred, content_len(f));
}

fn retry_after(status: u16, seed: u64) {
    let (hub, files, dir) = hub_2mib_and_tempdir(seed);
    let out = dir.path().join("out");
    let f = files.iter().find(|f| f.path == "config.json").unwrap();
    hub.inject(FaultRule::new(
        &f.path,
        Fault::RetryAfter { status, secs: 2 },
    ));
    let t = Instant::now();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    let elapsed = t.elapsed();
    assert_success(&o, &out, &files);
    // Backoff alone (20 ms base) would retry at once: the wait is Retry-After.
    assert!(
        elapsed >= Duration::from_millis(1900),
        "Retry-After: 2 not honoured ({elapsed:?})"
    );
    let gets = body_gets(&hub, &f.path);
    assert_eq!(
        gets.iter().map(|r| r.status).collect::<Vec<_>>(),
        [status, 200]
    );
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "ok"]);
}

#[test]
fn retry_after_429_is_honoured() {
    retry_after(429, 19);
}

#[test]
fn retry_after_503_is_honoured() {
    retry_after(503, 20);
}

#[test]
fn stall_hits_read_timeout_and_resumes() {
    let _time_bounded = time_bounded();
    let (hub, files, dir) = hub_2mib_and_tempdir(21);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(
        &f.path,
        Fault::Stall {
            after: 300_000,
            for_ms: 4_000,
        },
    ));
    let t = Instant::now();
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &args(&["--read-timeout", "0.5"]),
    ));
    assert!(
        t.elapsed() < Duration::from_millis(3_500),
        "the stall was waited out ({:?}) instead of timing out",
        t.elapsed()
    );
    assert_success(&o, &out, &files);
    let n = assert_resumed_with_if_range(&hub, &f.path);
    assert!(n > 0 && n <= 300_000);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "ok"]);
    let l = ledger(&out, &f.path);
    assert_eq!(l.discarded, 0);
}

#[test]
fn redirect_loop_fails_with_too_many_redirects() {
    let (hub, files, dir) = hub_2mib_and_tempdir(22);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::RedirectLoop).times(100));
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &args(&["--retries", "1"]),
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("too many redirects"), "{err}");
    assert!(err.contains(&f.path), "{err}");
    assert_nothing_published(&out, &f.path);
    let l = ledger(&out, &f.path);
    assert_eq!((l.committed, l.transferred), (0, 0));
    assert!(
        hub.requests()
            .iter()
            .all(|r| r.origin == ftpipe_fixtures::Origin::Main || !r.path.contains(&f.path)),
        "the loop never reached the CDN"
    );
}

/// Regression: the attempt that delivered the corrupted bytes was closed as
/// `ok` before the digest was compared, so no failed attempt was kept.
#[test]
fn flipped_byte_is_refetched_once() {
    let (hub, files, dir) = hub_2mib_and_tempdir(23);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::FlipByte { offset: 500_000 }));
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    let size = content_len(f);
    assert_eq!(discards(&out, &f.path), [format!("digest_mismatch:{size}")]);
    let l = ledger(&out, &f.path);
    assert_eq!((l.committed, l.transferred), (size, 2 * size));
    // The corrupted attempt is kept as a failure, never relabelled.
    assert_eq!(attempt_outcomes(&out, &f.path), ["failed", "ok"]);
    let a = audit_json(&out, true);
    assert_eq!(a["failed_attempts"], 1, "{a:#}");
    assert_eq!(a["waste_by_reason"]["digest_mismatch"], size, "{a:#}");
    // The refetch starts from zero (no Range on a prefix we threw away).
    let gets = body_gets(&hub, &f.path);
    assert_eq!(gets.len(), 2);
    assert!(gets.iter().all(|r| r.range.is_none()), "{gets:#?}");
}

/// Regression (same bug): both corrupt attempts must be kept as `failed`.
#[test]
fn flipped_byte_twice_fails_and_publishes_nothing() {
    let (hub, files, dir) = hub_2mib_and_tempdir(24);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::FlipByte { offset: 123 }).times(2));
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(err.contains(&f.path), "{err}");
    assert_nothing_published(&out, &f.path);
    assert_eq!(attempt_outcomes(&out, &f.path), ["failed", "failed"]);
    let size = content_len(f);
    assert_eq!(
        discards(&out, &f.path),
        [
            format!("digest_mismatch:{size}"),
            format!("digest_mismatch:{size}")
        ]
    );
    let l = ledger(&out, &f.path);
    assert_eq!((l.committed, l.transferred), (0, 2 * size));
    let a = audit_json(&out, false);
    assert_eq!(a["ok"], false);
    assert_eq!(a["reconciliation_error"], 0, "{a:#}");

    // A later clean run recovers, from zero.
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
}

#[test]
fn status_500_is_retried() {
    let (hub, files, dir) = hub_2mib_and_tempdir(25);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::Status { code: 500 }).times(2));
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    assert_success(&o, &out, &files);
    assert_eq!(attempt_outcomes(&out, &f.path), ["retry", "retry", "ok"]);
    let l = ledger(&out, &f.path);
    assert_eq!((l.discarded, l.transferred), (0, content_len(f)));
}

/// Regression: for an LFS file the final error only named the CDN URL
/// (`/lfs/<sha>`), not the file; it now says which file it was fetching.
#[test]
fn status_404_fails_fast_naming_the_file() {
    let _time_bounded = time_bounded();
    let (hub, files, dir) = hub_2mib_and_tempdir(26);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::Status { code: 404 }).times(100));
    let t = Instant::now();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args(&[])));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(err.contains("404"), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains(&f.path),
        "the final error line names the file: {last}"
    );
    assert_eq!(body_gets(&hub, &f.path).len(), 1, "no retry of a 404");
    assert_eq!(attempt_outcomes(&out, &f.path), ["failed"]);
    assert_nothing_published(&out, &f.path);
}

/// Regression: the retry budget was per file, so a large file whose
/// connection kept resetting was failed with "giving up after N attempts"
/// even though every attempt advanced the watermark. A budget now restarts
/// whenever an attempt appended bytes.
#[test]
fn resets_that_make_progress_do_not_exhaust_retries() {
    let (hub, files, dir) = hub_2mib_and_tempdir(21);
    let out = dir.path().join("out");
    let f = lfs_file(&files);
    hub.inject(FaultRule::new(&f.path, Fault::ResetMidBody { after: 100_000 }).times(6));
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &args(&["--retries", "2"]),
    ));
    assert_success(&o, &out, &files);
    assert_eq!(attempt_outcomes(&out, &f.path).len(), 7);

    // Without progress the budget of 2 retries is final.
    let (hub, _, dir) = hub_2mib_and_tempdir(22);
    let out = dir.path().join("out");
    hub.inject(FaultRule::new(&f.path, Fault::Status { code: 500 }).times(10));
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &args(&["--retries", "2"]),
    ));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("giving up after 3 attempts"),
        "{}",
        stderr(&o)
    );
}
