//! How `publish` sends an artifact (issue 39, item 3: publish no slower
//! than the faster of awscli and s5cmd), against moto behind the lying
//! proxy (`common::lying_proxy`), which holds every PUT a while as a store
//! slow to take each object would.
//!
//! Regression: the files small enough for one put were sent one after
//! another, each waiting out its request's round trip before the next was
//! read, where s5cmd and awscli send many objects at once; an artifact of
//! many small files paid one latency per file. Now they go several at once
//! (at most the user's `--concurrency`), and the manifest still only after
//! every one of them.
//!
//! Regression: a single put was hashed twice, once by publish against the
//! manifest and again by `object_store` for its signature and its
//! checksum. Now it goes to a presigned URL with the SHA-256 publish
//! computed (and checked against the manifest) signed in as its
//! `x-amz-checksum-sha256`; the store's checksum of the object must still
//! prove the bytes, which a re-publish reusing every object shows.

use std::path::Path;
use std::time::Duration;

use crate::common::lying_proxy::LyingProxy;
use crate::common::s3::*;
use crate::common::*;
use crate::s3::{built, ok, summary};

/// How long the proxy holds each PUT: far longer than a loopback put
/// takes, so puts overlap only when they were sent at once.
const HOLD: Duration = Duration::from_millis(400);

/// `publish SRC s3://models/PREFIX` through `proxy`, part size and
/// concurrency chosen by ftpipe unless `extra` gives them; its outcome.
fn publish_via(
    m: &Moto,
    proxy: &LyingProxy,
    home: &Path,
    src: &Path,
    prefix: &str,
    extra: &[&str],
) -> serde_json::Value {
    let o = run(m
        .ftpipe(home)
        .env("AWS_ENDPOINT_URL", proxy.endpoint())
        .arg("publish")
        .arg(src)
        .arg(format!("s3://{BUCKET}/{prefix}"))
        .arg("--json")
        .args(extra));
    summary(&ok(o, "publish"))["outcome"].clone()
}

/// The `(op, started_at, finished_at)` of the puts (`put`, `put_commit`)
/// of the latest run in `src`'s state, in the order they started.
fn puts_of_last_run(src: &Path) -> Vec<(String, String, String)> {
    query(
        src,
        "SELECT op || '|' || started_at || '|' || finished_at FROM upload_attempts \
         WHERE op IN ('put', 'put_commit') \
         AND run_id = (SELECT MAX(run_id) FROM upload_attempts) ORDER BY started_at, id",
    )
    .into_iter()
    .map(|row| {
        let mut f = row.split('|').map(str::to_owned);
        let (op, started, finished) = (f.next(), f.next(), f.next());
        (op.unwrap(), started.unwrap(), finished.unwrap())
    })
    .collect()
}

/// Whether any two of `puts` (file puts only) were in flight at once.
fn any_overlap(puts: &[(String, String, String)]) -> bool {
    let files: Vec<_> = puts.iter().filter(|p| p.0 == "put").collect();
    files
        .iter()
        .enumerate()
        .any(|(i, a)| files.iter().skip(i + 1).any(|b| a.1 < b.2 && b.1 < a.2))
}

#[test]
fn small_files_go_at_once_the_manifest_after_them_and_concurrency_one_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 391);
    let m = Moto::start();
    let proxy = LyingProxy::start(&m.endpoint());
    proxy.hold_puts(HOLD);

    // The fixture's components are about 1.5 MB: each one put at the
    // chosen 8 MiB part size.
    let outcome = publish_via(&m, &proxy, home, &src, "shape/at-once", &[]);
    let puts = puts_of_last_run(&src);
    let files = puts.iter().filter(|p| p.0 == "put").count();
    assert_eq!(
        files as u64,
        outcome["objects"].as_u64().unwrap(),
        "{puts:?}"
    );
    assert!(files >= 3, "{puts:?}");
    assert!(
        any_overlap(&puts),
        "no two puts were in flight at once: {puts:?}"
    );
    let commit = puts
        .iter()
        .find(|p| p.0 == "put_commit")
        .expect("the manifest put");
    let last_file = puts
        .iter()
        .filter(|p| p.0 == "put")
        .map(|p| &p.2)
        .max()
        .unwrap();
    assert!(
        &commit.1 > last_file,
        "the manifest was put before every file was: {puts:?}"
    );

    // The user's --concurrency 1: one request at a time, files included.
    publish_via(&m, &proxy, home, &src, "shape/one", &["--concurrency", "1"]);
    let puts = puts_of_last_run(&src);
    assert!(
        !any_overlap(&puts),
        "--concurrency 1 overlapped puts: {puts:?}"
    );
}

#[test]
fn a_single_put_carries_its_checksum_signed_and_the_store_checksum_proves_it() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 392);
    let m = Moto::start();
    let proxy = LyingProxy::start(&m.endpoint());
    let prefix = "shape/signed";

    let first = publish_via(&m, &proxy, home, &src, prefix, &[]);
    let fingerprint = first["fingerprint"].as_str().unwrap();
    let file_puts: Vec<_> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.method == "PUT" && s.target.contains(fingerprint))
        .collect();
    assert_eq!(
        file_puts.len() as u64,
        first["objects"].as_u64().unwrap(),
        "{file_puts:?}"
    );
    for put in &file_puts {
        let signed = put
            .target
            .split(['?', '&'])
            .find_map(|q| q.strip_prefix("X-Amz-SignedHeaders="))
            .unwrap_or_else(|| panic!("{} is not presigned", put.target));
        for header in ["x-amz-checksum-sha256", "x-amz-meta-ftpipe-sha256"] {
            assert!(
                signed.contains(header),
                "{header} not signed: {}",
                put.target
            );
        }
        assert_eq!(put.authorization, None, "{}", put.target);
    }

    // Without the manifest, a re-publish finds every object and reuses it
    // only because the store's checksum is the manifest's SHA-256.
    let (status, _) = m
        .raw(
            "DELETE",
            &format!("/{BUCKET}/{prefix}/manifest.json"),
            &[],
            &[],
        )
        .unwrap();
    assert_eq!(status, 204, "delete the manifest");
    let again = publish_via(&m, &proxy, home, &src, prefix, &[]);
    assert_eq!(
        (&again["uploaded"], &again["reused"]),
        (&serde_json::Value::from(0), &first["objects"]),
        "{again}"
    );
}
