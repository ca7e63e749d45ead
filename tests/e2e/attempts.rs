//! Attempts add up. An attempt interrupted by SIGKILL was shown as
//! `in_flight, 0 bytes` although its checkpoints had committed bytes: its
//! byte count was written only when it finished. Now each checkpoint adds
//! its bytes to the attempt in the same transaction, the uncheckpointed tail
//! found after the crash is added to the attempt that received it, and the
//! audit checks Σ attempt bytes = transferred for every file.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use ftpipe_fixtures::{Fault, FaultRule};

fn attempt_rows(out: &std::path::Path, path: &str) -> Vec<(String, u64)> {
    query(
        out,
        &format!(
            "SELECT outcome || '|' || body_bytes FROM attempts WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    )
    .into_iter()
    .map(|r| {
        let (o, b) = r.split_once('|').unwrap();
        (o.to_owned(), b.parse().unwrap())
    })
    .collect()
}

#[test]
fn an_interrupted_attempt_shows_its_committed_bytes_and_attempts_sum_to_transferred() {
    let (hub, files) = hub_with_repo(1401, 2 << 20);
    let f = lfs_file(&files).clone();
    // The body pauses after 400 KB: long enough to kill the fetch there.
    hub.inject(FaultRule::new(
        &f.path,
        Fault::Stall {
            after: 400_000,
            for_ms: 60_000,
        },
    ));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--checkpoint-bytes", "65536", "--jobs", "1"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // Wait until the stalled file's checkpoints committed most of the 400 KB.
    let t = Instant::now();
    loop {
        let committed = try_query(
            &out,
            &format!(
                "SELECT committed_bytes FROM ledger WHERE path = {}",
                sql_str(&f.path)
            ),
        )
        .ok()
        .and_then(|v| v.first().and_then(|c| c.parse::<u64>().ok()))
        .unwrap_or(0);
        if committed >= 327_680 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "never reached 320 KiB"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let l = ledger(&out, &f.path);
    let rows = attempt_rows(&out, &f.path);
    let (outcome, bytes) = rows.last().unwrap().clone();
    assert_eq!(outcome, "in_flight", "{rows:?}");
    assert!(bytes >= 327_680, "interrupted attempt shows {bytes} bytes");
    assert_eq!(bytes, l.transferred, "{rows:?} vs {l:?}");
    let total: u64 = rows.iter().map(|r| r.1).sum();
    assert_eq!(total, l.transferred, "{rows:?} vs {l:?}");

    // Resume: the audit (which now checks Σ attempt bytes = transferred)
    // is clean, and the sum holds for every file.
    hub.clear_faults();
    run_ok(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--checkpoint-bytes", "65536"],
    ));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    for file in &files {
        let l = ledger(&out, &file.path);
        let total: u64 = attempt_rows(&out, &file.path).iter().map(|r| r.1).sum();
        assert_eq!(total, l.transferred, "{}: {l:?}", file.path);
    }
    let a = audit_json(&out, false);
    let line = audit_line(&a, &f.path);
    assert_eq!(line["attempt_bytes"], line["transferred_bytes"], "{line}");
}

#[test]
fn audit_names_attempts_that_do_not_add_up() {
    let (hub, files) = hub_with_repo(1402, 1 << 20);
    let f = lfs_file(&files).clone();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_clean_audit(&out);
    sqlite_exec(
        &out,
        &format!(
            "UPDATE attempts SET body_bytes = body_bytes + 7 WHERE path = {}",
            sql_str(&f.path)
        ),
    );
    let a = audit_json(&out, false);
    assert_eq!(a["ok"], false, "{a}");
    assert_eq!(a["reconciliation_error"], 7, "{a}");
    let line = audit_line(&a, &f.path);
    let problem = line["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("attempts received"), "{line}");
}
