//! More of issue 38 against the real distribution registry
//! (`common::registry`): cross-repository mounts (`publish --mount-from`),
//! credential helpers (`credHelpers`, `credsStore`), uploads slower than
//! `--read-timeout`, and the smaller refusals of `pull oci://`.

use crate::common::registry::*;
use crate::common::*;
use crate::oci::{artifact_of, assert_same_files, publish, pull};
use crate::s3::{built, ok, summary, verify_deep};

/// Blob uploads (`POST` opening a session, `PATCH`, `PUT ?digest=`) to
/// `repo` in the registry's log from index `from` on.
fn blob_uploads(reg: &Registry, repo: &str, from: usize) -> Vec<Logged> {
    let prefix = format!("/v2/{repo}/blobs/uploads/");
    reg.requests()
        .into_iter()
        .skip(from)
        .filter(|r| r.path.starts_with(&prefix))
        .collect()
}

/// Bug: `publish` had no way to name a source repository, so a second
/// repository of the same registry got every blob sent again (issue 38:
/// "cross-repository mount when the source repository is given"). With
/// `--mount-from`, every blob is one `POST ?mount=&from=` answered `201`:
/// no `PATCH`, no `PUT` of a blob, no body byte sent; the outcome says
/// how many blobs and bytes were mounted; the manifest digest of the
/// second repository is the first's and it pulls byte-identical.
#[test]
fn a_publish_mounts_every_blob_from_the_named_repository() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3830);
    let reg = Registry::start();
    let o = ok(
        publish(tmp.path(), &dir, &reg.reference("models/a:v1"), &[]),
        "publish a",
    );
    let a = summary(&o);
    let before = reg.requests().len();
    let o = publish(
        tmp.path(),
        &dir,
        &reg.reference("models/b:v1"),
        &["--mount-from", "models/a"],
    );
    let b = summary(&ok(o, "publish b --mount-from a"));
    let objects = b["outcome"]["objects"].as_u64().unwrap();
    assert_eq!(b["outcome"]["mounted"].as_u64(), Some(objects), "{b}");
    assert_eq!(b["outcome"]["uploaded"], 0, "{b}");
    assert_eq!(b["outcome"]["bytes_sent"], 0, "{b}");
    assert!(b["outcome"]["mounted_bytes"].as_u64().unwrap() > 0, "{b}");
    let uploads = blob_uploads(&reg, "models/b", before);
    assert_eq!(uploads.len() as u64, objects, "{uploads:?}");
    for u in &uploads {
        assert!(
            u.method == "POST" && u.path.contains("mount=") && u.status == 201,
            "not a mount: {u:?}"
        );
    }
    assert_eq!(
        b["outcome"]["manifest_digest"],
        a["outcome"]["manifest_digest"]
    );
    let (digest, _) = reg.manifest("models/b", "v1");
    assert_eq!(a["outcome"]["manifest_digest"], digest.as_str());
    let out = tmp.path().join("pulled");
    ok(
        pull(tmp.path(), &reg.reference("models/b:v1"), &out, &[]),
        "pull b",
    );
    assert_same_files(&artifact_of(&dir), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
}

/// Bug: a mount the registry answers `202` (the source repository lacks
/// the blob) must go on as the upload the registry opened, not as a
/// second session: every blob's session is the mount's (each `POST` to
/// the repository carries `mount=`), none is mounted, and the artifact
/// pulls byte-identical.
#[test]
fn a_mount_answered_with_an_upload_session_continues_it() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3831);
    let reg = Registry::start();
    let o = publish(
        tmp.path(),
        &dir,
        &reg.reference("models/b:v1"),
        &["--mount-from", "models/nowhere"],
    );
    let s = summary(&ok(o, "publish --mount-from an empty repository"));
    assert_eq!(s["outcome"]["mounted"], 0, "{s}");
    assert_eq!(s["outcome"]["uploaded"], s["outcome"]["objects"], "{s}");
    let posts: Vec<_> = blob_uploads(&reg, "models/b", 0)
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(
        posts.len() as u64,
        s["outcome"]["objects"].as_u64().unwrap(),
        "{posts:?}"
    );
    assert!(
        posts
            .iter()
            .all(|p| p.path.contains("mount=") && p.status == 202),
        "a session besides the mount's: {posts:?}"
    );
    let out = tmp.path().join("pulled");
    ok(
        pull(tmp.path(), &reg.reference("models/b:v1"), &out, &[]),
        "pull b",
    );
    assert_same_files(&artifact_of(&dir), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
}

/// Bug: under the Bearer flow a mount's challenge names two scopes
/// space-separated (this repository's push, the source's pull) and the
/// token was asked for with them as one `scope` parameter, which a token
/// service reads as one malformed scope. Each is now its own parameter:
/// a token granting `repository:models/a:pull` is issued and every blob
/// is mounted.
#[test]
fn a_mount_under_bearer_tokens_asks_for_the_source_s_pull_scope() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3832);
    let reg = Registry::start_with_tokens();
    ok(
        publish(tmp.path(), &dir, &reg.reference("models/a:v1"), &[]),
        "publish a",
    );
    let o = publish(
        tmp.path(),
        &dir,
        &reg.reference("models/b:v1"),
        &["--mount-from", "models/a"],
    );
    let s = summary(&ok(o, "publish b --mount-from a"));
    assert_eq!(s["outcome"]["mounted"], s["outcome"]["objects"], "{s}");
    assert_eq!(s["outcome"]["bytes_sent"], 0, "{s}");
    let tokens = reg.tokens_issued();
    assert!(
        tokens
            .iter()
            .any(|t| t.split(' ').any(|s| s == "repository:models/a:pull")
                && t.contains("repository:models/b:")),
        "no token for the mount's two scopes: {tokens:?}"
    );
}
