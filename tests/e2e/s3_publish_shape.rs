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
//!
//! A multipart file's parts are now read and hashed off the task that
//! refills the send slots, and the file's own SHA-256 runs behind the
//! sends (needed only before completing); a file whose bytes are not the
//! manifest's must still never be completed, which the last test shows
//! (a byte changed after `verify`, which checks sizes and headers only).

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

/// One byte flipped in the middle of the largest component of `src` (its
/// size and headers unchanged: `verify` without `--deep` passes); its
/// path and the original byte.
fn flip_middle_byte(src: &Path) -> (String, usize, u8) {
    let (path, size) = crate::s3::largest_component(&src.join("artifact"));
    let file = src.join("artifact").join(&path);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = usize::try_from(size).unwrap() / 2;
    let was = bytes[at];
    bytes[at] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();
    (path, at, was)
}

/// The multipart file's SHA-256 is still checked against the manifest
/// before its upload completes, now that it is computed behind the sends:
/// a file changed after `verify` is sent, found not to be the manifest's,
/// aborted (no session left, nothing at its key, no manifest), and its
/// upload row abandoned; put back, the same publish goes through.
#[test]
fn a_multipart_file_changed_after_verify_is_never_completed() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 393);
    let m = Moto::start();
    let (path, at, was) = flip_middle_byte(&src);
    run_ok(ftpipe().arg("verify").arg(src.join("artifact")));

    let o = run(m
        .ftpipe(home)
        .arg("publish")
        .arg(&src)
        .arg(format!("s3://{BUCKET}/shape/changed"))
        .args(["--part-size", "64KiB", "--concurrency", "3"]));
    assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&path) && err.contains("the manifest says"),
        "the refusal does not name {path}:\n{err}"
    );
    let parts = query(
        &src,
        &format!(
            "SELECT COUNT(*) FROM upload_attempts WHERE op = 'send_part' AND key LIKE '%/{path}'"
        ),
    );
    assert!(
        parts[0].parse::<u64>().unwrap() >= 2,
        "{path} was not sent in parts: {parts:?}"
    );
    assert_eq!(
        query(
            &src,
            &format!("SELECT state FROM uploads WHERE path = '{path}'")
        ),
        ["abandoned"]
    );
    assert_eq!(m.uploads_in_progress(), 0, "the session was not aborted");
    let keys = m.keys("shape/changed");
    assert!(
        !keys
            .iter()
            .any(|k| k.ends_with(&path) || k.ends_with("manifest.json")),
        "{keys:?}"
    );

    let file = src.join("artifact").join(&path);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at] = was;
    std::fs::write(&file, &bytes).unwrap();
    let again = run(m
        .ftpipe(home)
        .arg("publish")
        .arg(&src)
        .arg(format!("s3://{BUCKET}/shape/changed"))
        .args(["--part-size", "64KiB", "--json"]));
    let outcome = summary(&ok(again, "publish after the file was put back"))["outcome"].clone();
    assert_eq!(outcome["already_published"], false, "{outcome}");
    assert!(m.keys("shape/changed").iter().any(|k| k.ends_with(&path)));
}
