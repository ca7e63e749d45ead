//! Regression (issue 35, item 5): publish trusted metadata it did not
//! check. An object placed at a component's key beforehand (by anyone with
//! write access to the bucket) whose size and `x-amz-meta-ftpipe-sha256`
//! matched was taken as published, and the prefix was committed with bytes
//! nobody verified: every pull refused them afterwards. Now an object is
//! reused only when the store's own checksum (S3's additional checksum,
//! which the store computes from the bytes it received) proves its bytes:
//! a whole object's SHA-256, or a multipart object's digest over its part
//! digests, recomputed from the local file at the publish's part size.
//! Everything else is uploaded again, and each upload row's `found` says
//! why (`no_checksum`, `not_proven`) or that it was reused (`proven`).
//!
//! moto 5.2.1 (the stand-in for S3 here) computes a multipart object's
//! composite checksum from the parts it received, and a put's checksum
//! from its body when a put names the algorithm without a value; it does
//! not check a checksum value a put sends against the body (S3 refuses the
//! put), so no test plants an object with a false checksum value.

use std::path::Path;

use crate::common::s3::*;
use crate::common::*;
use crate::s3::{built, publish, pull, summary, verify_deep};

const PREFIX: &str = "reuse/exp";
const DEST: &str = "s3://models/reuse/exp";
/// `PART_SIZE` in bytes.
const PART: usize = 64 * 1024;

/// The two largest components (path, SHA-256, bytes), each several parts
/// long.
fn two_multipart_components(src: &Path) -> [(String, String, Vec<u8>); 2] {
    let manifest = manifest_json(src);
    let mut comps: Vec<(String, String, Vec<u8>)> = manifest["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let path = c["path"].as_str().unwrap().to_owned();
            let bytes = std::fs::read(src.join("artifact").join(&path)).unwrap();
            (path, c["sha256"].as_str().unwrap().to_owned(), bytes)
        })
        .collect();
    comps.sort_by_key(|c| std::cmp::Reverse(c.2.len()));
    let [a, b] = [comps.remove(0), comps.remove(0)];
    assert!(b.2.len() > 2 * PART, "{} is not multipart", b.0);
    [a, b]
}

fn fingerprint(src: &Path) -> String {
    manifest_json(src)["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `bytes` with one byte changed in its last part: the same size and part
/// count, other bytes.
fn tampered(bytes: &[u8]) -> Vec<u8> {
    let mut bad = bytes.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x5a;
    bad
}

fn put_raw(m: &Moto, key: &str, headers: &[(&str, &str)], body: &[u8]) {
    let (status, body) = m
        .raw("PUT", &format!("/{BUCKET}/{key}"), headers, body)
        .unwrap();
    assert_eq!(status, 200, "put {key}: {}", String::from_utf8_lossy(&body));
}

/// A multipart object at `key` of `bytes` in `PART`-byte parts, created
/// with a SHA-256 checksum (the store computes its composite from the
/// parts) and the `ftpipe-sha256` metadata claiming `claim`: what another
/// tool with write access can leave there.
fn plant_multipart(m: &Moto, key: &str, bytes: &[u8], claim: &str) {
    let path = format!("/{BUCKET}/{key}");
    let (status, _, body) = m
        .raw_with_head(
            "POST",
            &format!("{path}?uploads"),
            &[
                ("x-amz-checksum-algorithm", "SHA256"),
                ("x-amz-meta-ftpipe-sha256", claim),
            ],
            &[],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "create multipart {key}: {text}");
    let upload = text
        .split("<UploadId>")
        .nth(1)
        .and_then(|s| s.split("</UploadId>").next())
        .expect("an upload id")
        .to_owned();
    let mut complete = String::from("<CompleteMultipartUpload>");
    for (i, part) in bytes.chunks(PART).enumerate() {
        let n = i + 1;
        let (status, head, _) = m
            .raw_with_head(
                "PUT",
                &format!("{path}?partNumber={n}&uploadId={upload}"),
                &[],
                part,
            )
            .unwrap();
        assert_eq!(status, 200, "part {n} of {key}");
        let etag = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("etag")
                    .then(|| value.trim().to_owned())
            })
            .expect("a part ETag");
        complete.push_str(&format!(
            "<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
        ));
    }
    complete.push_str("</CompleteMultipartUpload>");
    let (status, body) = m
        .raw(
            "POST",
            &format!("{path}?uploadId={upload}"),
            &[],
            complete.as_bytes(),
        )
        .unwrap();
    assert_eq!(
        status,
        200,
        "complete {key}: {}",
        String::from_utf8_lossy(&body)
    );
}

/// `found` of the latest upload row of each object under the prefix, as
/// `path=found`, sorted.
fn found_by_path(src: &Path) -> Vec<String> {
    let mut rows = query(
        src,
        "SELECT path || '=' || COALESCE(found, 'NULL') FROM uploads u
         WHERE id = (SELECT MAX(id) FROM uploads WHERE key = u.key)",
    );
    rows.sort();
    rows
}

/// The ops of the upload attempts of the latest run that made any, with
/// their counts, as `op=count`, sorted.
fn last_run_ops(src: &Path) -> Vec<String> {
    let mut rows = query(
        src,
        "SELECT op || '=' || COUNT(*) FROM upload_attempts
         WHERE run_id = (SELECT MAX(run_id) FROM upload_attempts) GROUP BY op",
    );
    rows.sort();
    rows
}

fn publish_ok(m: &Moto, home: &Path, src: &Path, extra: &[&str]) -> serde_json::Value {
    let o = if extra.is_empty() {
        publish(m, home, src, DEST)
    } else {
        run(m
            .ftpipe(home)
            .arg("publish")
            .arg(src)
            .arg(DEST)
            .args(["--json"])
            .args(extra))
    };
    assert!(o.status.success(), "publish failed:\n{}", stderr(&o));
    summary(&o)["outcome"].clone()
}

fn pull_and_verify(m: &Moto, home: &Path, src: &Path, out: &Path) {
    let o = pull(m, home, DEST, out, &[]);
    assert!(o.status.success(), "pull failed:\n{}", stderr(&o));
    verify_deep(&out.join("artifact"));
    assert_eq!(
        tree_of(&out.join("artifact")),
        tree_of(&src.join("artifact"))
    );
}

/// Objects planted at the artifact's keys before its first publish, each
/// claiming the right SHA-256 in its metadata with the right size and
/// wrong bytes: one put without a store checksum, one multipart object
/// whose composite checksum (of the right part count) is over other
/// parts, and `placement.json` with a checksum the store computed from
/// its (wrong) bytes. Publish uploads all three again and records why;
/// pull installs the right bytes and verify passes.
#[test]
fn planted_objects_the_store_checksum_does_not_prove_are_uploaded_again() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 351);
    let m = Moto::start();
    let fp = fingerprint(&src);
    let [
        (plain, plain_sha, plain_bytes),
        (multi, multi_sha, multi_bytes),
    ] = two_multipart_components(&src);

    let key = |path: &str| format!("{PREFIX}/{fp}/{path}");
    put_raw(
        &m,
        &key(&plain),
        &[("x-amz-meta-ftpipe-sha256", &plain_sha)],
        &tampered(&plain_bytes),
    );
    plant_multipart(&m, &key(&multi), &tampered(&multi_bytes), &multi_sha);
    let placement = std::fs::read(src.join("artifact/placement.json")).unwrap();
    let placement_sha = sha256_hex(&placement);
    put_raw(
        &m,
        &key("placement.json"),
        &[
            ("x-amz-meta-ftpipe-sha256", &placement_sha),
            ("x-amz-sdk-checksum-algorithm", "SHA256"),
        ],
        &tampered(&placement),
    );

    let outcome = publish_ok(&m, home, &src, &[]);
    assert_eq!(outcome["reused"], 0, "{outcome}");
    assert_eq!(outcome["uploaded"], outcome["objects"], "{outcome}");
    let found = found_by_path(&src);
    for expected in [
        format!("{plain}=no_checksum"),
        format!("{multi}=not_proven"),
        "placement.json=not_proven".to_owned(),
    ] {
        assert!(found.contains(&expected), "{expected} not in {found:?}");
    }
    // Every other object was not there before.
    assert_eq!(
        found.iter().filter(|f| f.ends_with("=nothing")).count() + 3,
        found.len(),
        "{found:?}"
    );
    for (path, bytes) in [(&plain, &plain_bytes), (&multi, &multi_bytes)] {
        assert_eq!(m.get_object(&key(path)).as_ref(), Some(bytes), "{path}");
    }
    let uploads = &audit_json(&src, false)["uploads"];
    assert_eq!(
        (&uploads["replaced_unproven"], &uploads["reused_proven"]),
        (&3.into(), &0.into()),
        "{uploads}"
    );
    pull_and_verify(&m, home, &src, &tmp.path().join("node"));
}

/// Objects a previous publish wrote carry the store's checksum: with the
/// commit point gone (a publish killed before its manifest, or removed),
/// the next publish reuses every one of them on its checksum (a
/// multipart component's composite recomputed from the local parts)
/// without one write request, and a publish after that is a no-op. The
/// same objects under another part size are reused only where the
/// checksum still matches: the one-put objects (`placement.json`, any
/// component of at most one part); the multipart components (another part
/// count) are uploaded again.
#[test]
fn objects_the_store_checksum_proves_are_reused_without_a_write() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 352);
    let m = Moto::start();
    let objects = publish_ok(&m, home, &src, &[])["objects"].clone();
    let remove_manifest = || {
        let path = format!("/{BUCKET}/{PREFIX}/manifest.json");
        let (status, _) = m.raw("DELETE", &path, &[], &[]).unwrap();
        assert_eq!(status, 204, "delete the manifest");
    };

    remove_manifest();
    let outcome = publish_ok(&m, home, &src, &[]);
    assert_eq!(
        (&outcome["uploaded"], &outcome["reused"]),
        (&serde_json::Value::from(0), &objects),
        "{outcome}"
    );
    assert_eq!(outcome["bytes_sent"], 0, "{outcome}");
    // Heads and the manifest's put, nothing else.
    assert_eq!(
        last_run_ops(&src),
        [format!("head={objects}"), "put_commit=1".to_owned()]
    );
    let found = found_by_path(&src);
    assert!(found.iter().all(|f| f.ends_with("=proven")), "{found:?}");
    let uploads = &audit_json(&src, false)["uploads"];
    assert_eq!(uploads["reused_proven"], objects, "{uploads}");

    let again = publish_ok(&m, home, &src, &[]);
    assert_eq!(again["already_published"], true, "{again}");

    remove_manifest();
    let outcome = publish_ok(&m, home, &src, &["--part-size", "128KiB"]);
    let multipart = manifest_json(&src)["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["size"].as_u64().unwrap() > PART as u64)
        .count();
    assert!(multipart >= 2, "{multipart} multipart components");
    let one_put = objects.as_u64().unwrap() as usize - multipart;
    assert_eq!(outcome["reused"], one_put, "{outcome}");
    assert_eq!(outcome["uploaded"], multipart, "{outcome}");
    let found = found_by_path(&src);
    assert!(
        found.contains(&"placement.json=proven".to_owned()),
        "{found:?}"
    );
    assert_eq!(
        found.iter().filter(|f| f.ends_with("=not_proven")).count(),
        multipart,
        "{found:?}"
    );
    pull_and_verify(&m, home, &src, &tmp.path().join("node"));
}
