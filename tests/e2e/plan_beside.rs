//! Issue 39: a `run` without a disk budget spent its plan stage (the
//! headers of every shard over HTTP Range, the plan, the skeleton, the
//! preflight) before its first transfer: 0.19 s of a 5 s fetch of the
//! 96-layer bench export, a round trip per shard on a real hub. Its fetch
//! does not depend on the plan, so the transfers now start first and the
//! plan stage runs inside the fetch stage, beside them.
//!
//! What that must not change: a plan that fails still fails with the
//! error `plan --remote` gives, and what the transfers beside it made
//! durable is kept (published files are not fetched again, the ledger
//! adds up); a budgeted run still plans before its first transfer.

use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};
use ftpipe_fixtures::{Fault, FaultRule, FileContent, RepoFile};

/// The stage log of `out`'s runs, `stage:event` in order.
fn stage_log(out: &Path) -> Vec<String> {
    query(
        out,
        "SELECT stage || ':' || event FROM stage_events ORDER BY id",
    )
}

#[test]
fn a_plan_that_fails_beside_the_transfers_keeps_what_they_fetched() {
    let mut files = generate_qwen4_repo(3901, QwenShape::small_test());
    let mut shards: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].path.ends_with(".safetensors"))
        .collect();
    shards.sort_by_key(|&i| content_len(&files[i]));
    // The smallest shard gets a dtype no profile knows (same length, so
    // every offset stays): the plan refuses it. Fetched largest first by
    // one job, its first request is the plan's header read, held for a
    // second: the transfers of the larger shards run meanwhile.
    let bad = shards[0];
    let bad_path = files[bad].path.clone();
    let mut bytes = read_content(&files[bad]);
    let at = find(&bytes, br#""dtype":"BF16""#).expect("a BF16 tensor in the smallest shard");
    bytes[at + 9..at + 13].copy_from_slice(b"BX16");
    files[bad] = RepoFile::bytes(bad_path.clone(), bytes);
    let hub = hub_serving(files.clone());
    let tmp = tempfile::tempdir().unwrap();

    let planned = run(ftpipe()
        .args([
            "plan",
            REPO,
            "--remote",
            "--endpoint",
            &hub.endpoint(),
            "--out",
        ])
        .arg(tmp.path().join("p")));
    assert!(!planned.status.success(), "plan accepted BX16");
    let plan_error = stderr(&planned);
    assert!(plan_error.contains(&bad_path), "{plan_error}");

    hub.clear_requests();
    hub.inject(FaultRule::new(
        &bad_path,
        Fault::Stall {
            after: 0,
            for_ms: 1000,
        },
    ));
    let out = tmp.path().join("out");
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &["--jobs", "1"]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), planned.status.code(), "{err}");
    assert!(err.contains(&bad_path) && err.contains("BX16"), "{err}");
    let log = stage_log(&out);
    let at = |e: &str| {
        log.iter()
            .position(|l| l == e)
            .unwrap_or_else(|| panic!("no {e} in {log:?}"))
    };
    assert!(at("fetch:started") < at("plan:started"), "{log:?}");
    assert!(at("plan:failed") < at("fetch:failed"), "{log:?}");
    let largest = &files[*shards.last().unwrap()].path;
    assert!(
        !body_gets(&hub, largest).is_empty(),
        "the largest shard was not requested beside the plan: {err}"
    );
    let published = query(&out, "SELECT path FROM receipts");
    assert!(
        !published.is_empty(),
        "nothing was published beside the plan"
    );
    let audit = audit_json(&out, false);
    assert_eq!(audit["ok"], true, "{audit:#}");

    // The same run fails the same way, and fetches no published file again.
    let requests = |p: &String| body_gets(&hub, p).len();
    let before: Vec<usize> = published.iter().map(requests).collect();
    let again = run(&mut run_cmd(&hub.endpoint(), &out, &["--jobs", "1"]));
    assert_eq!(
        again.status.code(),
        planned.status.code(),
        "{}",
        stderr(&again)
    );
    let after: Vec<usize> = published.iter().map(requests).collect();
    assert_eq!(
        before, after,
        "published files requested again: {published:?}"
    );
    assert_eq!(audit_json(&out, false)["ok"], true);
}

#[test]
fn an_unbudgeted_run_plans_inside_its_fetch_stage_and_a_budgeted_one_before_it() {
    let hub = qwen4_hub(3902, QwenShape::small_test());
    let tmp = tempfile::tempdir().unwrap();
    let free = tmp.path().join("free");
    run_ok(&mut run_cmd(&hub.endpoint(), &free, &[]));
    assert_eq!(
        stage_log(&free),
        [
            "resolve:started",
            "resolve:completed",
            "fetch:started",
            "plan:started",
            "plan:completed",
            "fetch:completed",
            "convert:started",
            "convert:completed",
            "verify:started",
            "verify:completed",
        ]
    );
    let budgeted = tmp.path().join("budgeted");
    run_ok(&mut run_cmd(
        &hub.endpoint(),
        &budgeted,
        &["--disk-budget", "1TB"],
    ));
    let log = stage_log(&budgeted);
    let at = |e: &str| log.iter().position(|l| l == e).unwrap();
    assert!(at("plan:completed") < at("fetch:started"), "{log:?}");
    assert_eq!(manifest_sha(&free), manifest_sha(&budgeted));
}

/// The bytes of a generated file.
fn read_content(f: &RepoFile) -> Vec<u8> {
    match &f.content {
        FileContent::Bytes(b) => b.to_vec(),
        FileContent::Disk(p) => std::fs::read(p).unwrap(),
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
