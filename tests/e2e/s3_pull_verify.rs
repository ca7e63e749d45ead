//! A pull whose artifact fails `verify` (exit 6) left the rejected
//! `manifest.json` at its final name: the manifest was written before the
//! artifact was verified, and the README tells runtimes to wait for exactly
//! that file. The pull now verifies under the manifest's bytes first and
//! writes `manifest.json` only once the artifact passed.

use crate::common::s3::*;
use crate::common::*;
use crate::s3::{built, publish, pull};

#[test]
fn a_pulled_artifact_that_fails_verify_gets_no_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 311);
    let m = Moto::start();
    let dest = "s3://models/verify-first";
    let o = publish(&m, home, &src, dest);
    assert!(o.status.success(), "publish: {}", stderr(&o));
    // A file the manifest does not list, already in the pull's artifact
    // directory: the pulled artifact cannot verify.
    let out = tmp.path().join("pulled");
    std::fs::create_dir_all(out.join("artifact")).unwrap();
    std::fs::write(out.join("artifact/planted.bin"), b"not a component").unwrap();
    let o = pull(&m, home, dest, &out, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(err.contains("planted.bin"), "{err}");
    assert!(
        !out.join("artifact/manifest.json").exists(),
        "a rejected artifact got its manifest.json"
    );
    // Without the planted file the same command finishes and publishes
    // the manifest.
    std::fs::remove_file(out.join("artifact/planted.bin")).unwrap();
    let o = pull(&m, home, dest, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(manifest_sha(&out), manifest_sha(&src));
}

/// A pull killed while writing `manifest.json` (or `placement.json`) left
/// `manifest.json.ftpipe-tmp` in the artifact, and every later pull of that
/// DIR failed verification on the stale temp file (exit 6, seen in
/// `s3_crash::kill_storm_over_pull`). The pull now removes the artifact's
/// stale temp files before it verifies (it holds DIR's lock, and every
/// component is durable by then).
#[test]
fn a_pull_killed_while_writing_the_manifest_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 312);
    let m = Moto::start();
    let dest = "s3://models/killed-at-manifest";
    let o = publish(&m, home, &src, dest);
    assert!(o.status.success(), "publish: {}", stderr(&o));
    let out = tmp.path().join("pulled");
    let o = pull(&m, home, dest, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // What a SIGKILL inside the manifest's write leaves: its temp file
    // (half written), not yet renamed; the placement's likewise.
    let artifact = out.join("artifact");
    let manifest = std::fs::read(artifact.join("manifest.json")).unwrap();
    std::fs::remove_file(artifact.join("manifest.json")).unwrap();
    std::fs::write(
        artifact.join("manifest.json.ftpipe-tmp"),
        &manifest[..manifest.len() / 2],
    )
    .unwrap();
    std::fs::write(artifact.join("placement.json.ftpipe-tmp"), b"{").unwrap();
    let o = pull(&m, home, dest, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(manifest_sha(&out), manifest_sha(&src));
    assert!(!artifact.join("manifest.json.ftpipe-tmp").exists());
    assert!(!artifact.join("placement.json.ftpipe-tmp").exists());
    run_ok(ftpipe().arg("verify").arg(&artifact).arg("--deep"));
}
