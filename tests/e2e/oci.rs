//! `publish` to and `pull` from a real OCI registry (issue 38): the CNCF
//! distribution registry 2.8 (Debian's `docker-registry`) started on
//! loopback by each test (`common::registry`), anonymous and with
//! htpasswd basic auth. An artifact built by `ftpipe run` is published as
//! a CNCF ModelPack artifact (manifest media type, artifact type, config
//! media type, raw layers annotated with their paths, the config's
//! `modelfs.diffIds` = the layers' digests, each digest the SHA-256 of
//! `manifest.json`), pulled into a second directory byte-identical and
//! verified (`verify --deep`); a re-publish sends no write request (the
//! registry's access log) and a re-pull reads no blob. Peers: `oras`
//! (the Python SDK) pulls what ftpipe pushed into byte-identical files,
//! ftpipe pulls what `oras` pushed with the ModelPack media types, and
//! `skopeo copy` keeps the manifest digest. Kills: storms over publish
//! and pull; a publish killed between chunks resumes its session, one
//! killed mid-`PATCH` (or after a chunk it did not record) starts that
//! blob again, resending no more than it. Refusals: a tag naming
//! another artifact (without `--force-tag`), a tag moved between a pull
//! and its resume (without `--repin`), layers whose paths escape the
//! artifact or repeat, a blob whose bytes are not its digest.

use std::path::Path;
use std::process::Command;

use crate::common::registry::*;
use crate::common::*;
use crate::s3::{built, ok, summary, verify_deep};

/// `publish` of the registry tests (`conformance` publishes with it).
pub use crate::common::registry::publish;

/// The ModelPack shape of the manifest published as `repo:tag`, checked
/// against `artifact`'s manifest.json: its digest.
fn assert_modelpack(reg: &Registry, repo: &str, tag: &str, artifact: &Path) -> String {
    let (digest, bytes) = reg.manifest(repo, tag);
    assert_eq!(digest, format!("sha256:{}", sha256_hex(&bytes)));
    let m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(m["schemaVersion"], 2);
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(
        m["artifactType"],
        "application/vnd.cncf.model.manifest.v1+json"
    );
    assert_eq!(
        m["config"]["mediaType"],
        "application/vnd.cncf.model.config.v1+json"
    );
    let ours: serde_json::Value =
        serde_json::from_slice(&std::fs::read(artifact.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        m["annotations"]["dev.ftpipe.artifact.fingerprint"],
        ours["fingerprint"]
    );
    let layers = m["layers"].as_array().unwrap();
    let components = ours["components"].as_array().unwrap();
    assert_eq!(layers.len(), components.len() + 2);
    for c in components {
        let path = c["path"].as_str().unwrap();
        let l = layers
            .iter()
            .find(|l| l["annotations"]["org.cncf.model.filepath"] == path)
            .unwrap_or_else(|| panic!("no layer for {path}"));
        assert_eq!(l["mediaType"], "application/vnd.cncf.model.weight.v1.raw");
        assert_eq!(
            l["digest"],
            format!("sha256:{}", c["sha256"].as_str().unwrap())
        );
        assert_eq!(l["size"], c["size"]);
        assert_eq!(l["annotations"]["org.opencontainers.image.title"], path);
    }
    for file in ["manifest.json", "placement.json"] {
        let l = layers
            .iter()
            .find(|l| l["annotations"]["org.cncf.model.filepath"] == file)
            .unwrap();
        assert_eq!(
            l["mediaType"],
            "application/vnd.cncf.model.weight.config.v1.raw"
        );
        let bytes = std::fs::read(artifact.join(file)).unwrap();
        assert_eq!(l["digest"], format!("sha256:{}", sha256_hex(&bytes)));
    }
    let config_digest = m["config"]["digest"].as_str().unwrap();
    let config: serde_json::Value = serde_json::from_slice(&reg.blob(repo, config_digest)).unwrap();
    let keys: Vec<&String> = config.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["config", "descriptor", "modelfs"],
        "only the schema's keys"
    );
    assert_eq!(config["modelfs"]["type"], "layers");
    let diff_ids: Vec<&serde_json::Value> = layers.iter().map(|l| &l["digest"]).collect();
    let got: Vec<&serde_json::Value> = config["modelfs"]["diffIds"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(got, diff_ids);
    digest
}

/// Publish, re-publish (no write request), pull (byte-identical,
/// `verify --deep`), re-pull (no blob read), against an anonymous registry.
#[test]
fn publish_then_pull_round_trip() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3801);
    let reg = Registry::start();
    let dest = reg.reference("models/qwen:v1");
    let o = ok(publish(tmp.path(), &dir, &dest, &[]), "publish");
    let s = summary(&o);
    assert_eq!(s["outcome"]["already_published"], false, "{s}");
    assert!(s["outcome"]["uploaded"].as_u64().unwrap() > 0, "{s}");
    let digest = assert_modelpack(&reg, "models/qwen", "v1", &artifact_of(&dir));
    assert_eq!(s["outcome"]["manifest_digest"], digest.as_str());
    // Some blob went in several chunks (the chunked, resumable path).
    assert!(
        reg.requests().iter().any(|r| r.method == "PATCH"),
        "no chunked upload"
    );

    let writes = reg.writes().len();
    let o = ok(publish(tmp.path(), &dir, &dest, &[]), "re-publish");
    assert_eq!(summary(&o)["outcome"]["already_published"], true);
    let after: Vec<_> = reg.writes().into_iter().skip(writes).collect();
    assert!(after.is_empty(), "a re-publish wrote: {after:?}");

    let out = tmp.path().join("pulled");
    let o = pull_identical(registry_ftpipe(tmp.path()), &dest, &out, &dir, &[]);
    assert_eq!(summary(&o)["outcome"]["already_pulled"], false);
    let blob_gets = |reg: &Registry| {
        reg.requests_settled()
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains("/blobs/"))
            .count()
    };
    let before = blob_gets(&reg);
    let o = ok(pull(tmp.path(), &dest, &out, &[]), "re-pull");
    assert_eq!(summary(&o)["outcome"]["already_pulled"], true);
    assert_eq!(
        blob_gets(&reg),
        before + 1,
        "a re-pull reads only manifest.json's layer"
    );
}

/// With htpasswd basic auth: credentials from REGISTRY_AUTH_FILE (publish)
/// and from DOCKER_CONFIG's config.json (pull); none
/// is a clear refusal naming where credentials are read; the password
/// reaches no output and no state database.
#[test]
fn basic_auth_registry_takes_the_auth_file() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3802);
    let reg = Registry::start_with_auth();
    let dest = reg.reference("models/qwen:v1");
    let o = publish(tmp.path(), &dir, &dest, &[]);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["Basic", "REGISTRY_AUTH_FILE", &reg.host()]);

    let auth = reg.auth_file(tmp.path());
    let mut cmd = registry_ftpipe(tmp.path());
    cmd.env("REGISTRY_AUTH_FILE", &auth);
    let o = ok(
        publish_through(cmd, &dir, &dest, &[]),
        "publish with credentials",
    );
    assert!(!output_text(&o).contains(REGISTRY_PASSWORD));
    assert_modelpack(&reg, "models/qwen", "v1", &artifact_of(&dir));

    // The pull finds them in DOCKER_CONFIG as Kubernetes mounts a
    // docker-config secret there: `config.json` a link into the volume's
    // `..data` (an auth file is the user's own configuration, read through
    // a link; refusing the link refused every pod).
    let docker = tmp.path().join("docker");
    let data = docker.join("..2026_12_05_00_00_00.000000001");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(&auth, data.join("config.json")).unwrap();
    std::os::unix::fs::symlink(data.file_name().unwrap(), docker.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.json", docker.join("config.json")).unwrap();
    let out = tmp.path().join("pulled");
    let mut cmd = registry_ftpipe(tmp.path());
    cmd.env("DOCKER_CONFIG", &docker);
    let o = pull_identical(cmd, &dest, &out, &dir, &[]);
    let s = summary(&o);
    assert_eq!(
        s["session"]["credentials_from"],
        docker.join("config.json").display().to_string()
    );
    assert_not_in_state(&[&dir, &out], REGISTRY_PASSWORD, "the password");
}

/// A tag naming another artifact is refused without `--force-tag` (both
/// digests named) and moved with it; a pull pinned to the old manifest
/// refuses the moved tag without `--repin`.
#[test]
fn a_tag_naming_another_artifact_is_refused_unless_forced() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (built(tmp.path(), 3803), built(tmp.path(), 3804));
    let reg = Registry::start();
    let dest = reg.reference("models/qwen:v1");
    ok(publish(tmp.path(), &a, &dest, &[]), "publish a");
    let first = reg.manifest("models/qwen", "v1").0;
    // A pull pinned to a, killed before its end: simulated by a pull
    // whose directory keeps its pin.
    let out = tmp.path().join("pulled");
    ok(pull(tmp.path(), &dest, &out, &[]), "pull a");

    let o = publish(tmp.path(), &b, &dest, &[]);
    assert!(!o.status.success(), "moved the tag without --force-tag");
    assert_names(&stderr(&o), &["--force-tag", &first]);
    assert_eq!(reg.manifest("models/qwen", "v1").0, first);
    ok(
        publish(tmp.path(), &b, &dest, &["--force-tag"]),
        "publish b --force-tag",
    );
    let second = reg.manifest("models/qwen", "v1").0;
    assert_ne!(first, second);

    let o = pull(tmp.path(), &dest, &out, &[]);
    assert!(!o.status.success(), "followed a moved tag without --repin");
    assert_names(&stderr(&o), &["moved", "--repin", &first, &second]);
    ok(pull(tmp.path(), &dest, &out, &["--repin"]), "pull --repin");
    assert_pulled(&b, &out);
}

/// `python3 -c SCRIPT ARGS...`, which must succeed; its stdout.
fn python(script: &str, args: &[&str]) -> String {
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "python3 failed (the oras SDK: python3 -m pip install 'oras==0.2.38'; .ci/run does):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `oras` pulls `TARGET` into `OUTDIR`.
const ORAS_PULL: &str = r#"
import sys, oras.client
host, target, outdir = sys.argv[1:4]
client = oras.client.OrasClient(hostname=host, insecure=True)
client.pull(target=target, outdir=outdir)
"#;

/// `oras` pushes every file of `ARTIFACT` as a ModelPack raw layer (path
/// in `org.cncf.model.filepath` and the title) with `CONFIG` as the
/// ModelPack config.
const ORAS_PUSH: &str = r#"
import json, os, sys, tempfile, oras.client
host, target, artifact, config = sys.argv[1:5]
files, annotations = [], {}
for root, dirs, names in os.walk(artifact):
    for name in names:
        full = os.path.join(root, name)
        rel = os.path.relpath(full, artifact)
        raw = "application/vnd.cncf.model.weight.v1.raw"
        if rel in ("manifest.json", "placement.json"):
            raw = "application/vnd.cncf.model.weight.config.v1.raw"
        files.append(f"{full}:{raw}")
        annotations[full] = {"org.cncf.model.filepath": rel, "org.opencontainers.image.title": rel}
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(annotations, f)
client = oras.client.OrasClient(hostname=host, insecure=True)
client.push(
    target=target,
    files=files,
    manifest_config=f"{config}:application/vnd.cncf.model.config.v1+json",
    annotation_file=f.name,
    disable_path_validation=True,
)
"#;

/// The peer's way both ways: `oras` pulls what ftpipe pushed into files
/// byte-identical to DIR/artifact; ftpipe pulls what `oras` pushed with
/// the ModelPack media types and annotations (and it verifies).
#[test]
fn oras_pulls_what_ftpipe_pushed_and_ftpipe_pulls_what_oras_pushed() {
    let _g = time_bounded();
    let p = Published::new(3805);
    let (reg, dir) = (&p.reg, &p.dir);
    let by_oras = p.out("by-oras");
    let target = format!("{}/models/qwen:v1", reg.host());
    python(
        ORAS_PULL,
        &[&reg.host(), &target, by_oras.to_str().unwrap()],
    );
    assert_same_files(&artifact_of(dir), &by_oras);

    let config = p.out("modelpack-config.json");
    let doc = serde_json::json!({
        "descriptor": { "name": "qwen" },
        "config": { "format": "ftw" },
        "modelfs": { "type": "layers", "diffIds": ["sha256:00"] },
    });
    std::fs::write(&config, doc.to_string()).unwrap();
    let target = format!("{}/peer/qwen:v1", reg.host());
    let artifact = artifact_of(dir);
    python(
        ORAS_PUSH,
        &[
            &reg.host(),
            &target,
            artifact.to_str().unwrap(),
            config.to_str().unwrap(),
        ],
    );
    p.pull_identical("peer/qwen:v1", "from-oras");
}

/// `skopeo copy --preserve-digests` copies what ftpipe pushed to another
/// repository with its manifest digest kept, and ftpipe pulls the copy by
/// that digest.
#[test]
fn skopeo_copy_keeps_the_manifest_digest() {
    let _g = time_bounded();
    let p = Published::new(3806);
    let reg = &p.reg;
    let digest = reg.manifest("models/qwen", "v1").0;
    let o = Command::new("skopeo")
        .args([
            "copy",
            "--preserve-digests",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
        ])
        .arg(format!("docker://{}/models/qwen:v1", reg.host()))
        .arg(format!("docker://{}/copied/qwen:v1", reg.host()))
        .env("HOME", p.home())
        .output()
        .expect("skopeo (apt-get install skopeo; .ci/run does)");
    assert!(
        o.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(reg.manifest("copied/qwen", "v1").0, digest);
    p.pull_identical(&format!("copied/qwen@{digest}"), "pulled");
}

/// At least 20 seeded SIGKILLs (`KILLS`, `FTPIPE_CRASH_SEED`) at moments
/// over a calibrated publish: after each, the state database is intact
/// and a tag, once there, names a complete artifact; every chain of
/// killed runs ends, resumed, with the artifact published, and it pulls
/// byte-identical.
#[test]
fn kill_storm_over_publish() {
    let _heavy = heavy();
    let (tmp, src) = built_at_home(3807);
    let reg = Registry::start();
    let end = publish_kill_storm(&reg, tmp.path(), &src, &[], "oci publish");
    let dest = reg.reference(&format!("{}:v1", end.repos.last().unwrap()));
    let out = tmp.path().join("node");
    ok(pull(tmp.path(), &dest, &out, &[]), "pull after the storm");
    assert_pulled(&src, &out);
}

/// At least 20 seeded SIGKILLs over pulls with ranges: after each, the
/// ledger claims no byte not on disk and a manifest only for an artifact
/// that verifies; every chain ends byte-identical and audit-clean.
#[test]
fn kill_storm_over_pull() {
    use crate::s3_crash::{check_pull_state, kill_after, kills};
    let _heavy = heavy();
    let seed = crash_seed();
    eprintln!("oci pull kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = ftpipe_fixtures::checkpoint::SplitMix64::new(seed);
    let p = Published::new(3808);
    let (home, src) = (p.home(), &p.dir);
    let dest = p.reg.reference("models/qwen:v1");
    let args = crate::common::s3::RANGED_PULL;
    let t = std::time::Instant::now();
    ok(
        pull(home, &dest, &p.out("calibration"), args),
        "calibration",
    );
    let ms = (t.elapsed().as_millis() as u64).max(20);
    let (mut chain, mut kill) = (0usize, 0usize);
    let dir = |n: usize| p.out(&format!("node-{n}"));
    let finished_ok = |out: &Path| {
        assert_pulled(src, out);
        assert_clean_audit(out);
    };
    while kill < kills() {
        let delay = rng.next_u64() % ms;
        let label = format!(
            "oci pull kill {} after {delay} ms into {:?}",
            kill + 1,
            dir(chain)
        );
        let mut cmd = registry_ftpipe(home);
        pull_args(&mut cmd, &dest, &dir(chain)).args(args);
        if kill_after(&mut cmd, std::time::Duration::from_millis(delay), &label) {
            finished_ok(&dir(chain));
            chain += 1;
            continue;
        }
        kill += 1;
        check_pull_state(&dir(chain), &label);
    }
    ok(pull(home, &dest, &dir(chain), args), "last chain");
    finished_ok(&dir(chain));
}

fn crashed_publish(home: &Path, src: &Path, dest: &str, point: &str) {
    let mut cmd = registry_ftpipe(home);
    cmd.env("FTPIPE_CRASH_AT", point);
    let o = run(publish_args(&mut cmd, src, dest, CHUNK));
    assert!(!o.status.success(), "did not crash at {point}");
}

/// The upload id in a logged upload path (`/v2/R/blobs/uploads/ID?...`).
fn upload_id(path: &str) -> Option<&str> {
    let rest = path.split("/blobs/uploads/").nth(1)?;
    Some(rest.split('?').next().unwrap_or(rest)).filter(|id| !id.is_empty())
}

/// A publish killed after a chunk's location was recorded resumes the same
/// session at that location: no chunk is sent twice (the PATCHes of the
/// killed and the resumed run add up to those of a clean publish).
#[test]
fn a_killed_chunked_upload_resumes_where_the_registry_acknowledged() {
    let _g = time_bounded();
    let p = Published::to(Registry::start(), 3809, "clean/qwen:v1");
    let (tmp, src, reg) = (&p.tmp, &p.dir, &p.reg);
    let patches = |reg: &Registry, repo: &str| {
        reg.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.starts_with(&format!("/v2/{repo}/")))
            .collect::<Vec<_>>()
    };
    let clean = patches(reg, "clean/qwen").len();
    let dest = reg.reference("resumed/qwen:v1");
    crashed_publish(tmp.path(), src, &dest, "upload-part-recorded#3");
    let killed = patches(reg, "resumed/qwen");
    assert_eq!(killed.len(), 3);
    let session = upload_id(&killed[2].path).unwrap().to_owned();
    ok(publish(tmp.path(), src, &dest, &[]), "resumed publish");
    let all = patches(reg, "resumed/qwen");
    assert_eq!(all.len(), clean, "a chunk was sent twice");
    assert_eq!(
        upload_id(&all[3].path),
        Some(session.as_str()),
        "the resumed run did not continue the killed session"
    );
    assert!(check_tag(reg, "resumed/qwen", "v1", src, "resumed"));
}

/// A publish killed after the registry took a chunk but before its
/// location was recorded: asked where it stands at the stale location
/// (the upload status `GET`), the registry refuses it (it cancels the
/// session: distribution 2.8 does for a resume at another offset, as for
/// one it forgot) before any chunk is sent there; the session row is
/// abandoned and one new upload sends the blob; the published artifact
/// pulls byte-identical.
#[test]
fn an_upload_session_the_registry_refuses_on_resume_is_started_again() {
    let _g = time_bounded();
    let (tmp, src) = built_at_home(3810);
    let reg = Registry::start();
    let dest = reg.reference("models/qwen:v1");
    crashed_publish(tmp.path(), &src, &dest, "upload-part-sent#3");
    ok(publish(tmp.path(), &src, &dest, &[]), "resumed publish");
    let refused: Vec<_> = reg
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/blobs/uploads/") && r.status >= 400)
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "the stale location was not tried once: {refused:?}"
    );
    assert_eq!(
        refused[0].method, "GET",
        "a chunk sent to the stale session"
    );
    let abandoned = query(
        &src,
        "SELECT count(*) FROM uploads WHERE state = 'abandoned'",
    );
    assert_eq!(abandoned, ["1"]);
    assert!(check_tag(&reg, "models/qwen", "v1", &src, "restarted"));
    let out = tmp.path().join("pulled");
    pull_identical(registry_ftpipe(tmp.path()), &dest, &out, &src, &[]);
}

/// Distribution 2.8 cancels an upload session whose stored size is not
/// the offset signed into its location's `_state`, and a `PATCH` cut
/// mid-body leaves one (the body bytes the registry read are stored). A
/// publish SIGKILLed in the middle of the `PATCH` of the largest blob's
/// last chunk (a proxy passes part of that body on and holds the rest;
/// the registry's connection is closed after the kill), then run again:
/// the stale session is refused once, its row abandoned, one new upload
/// sends the blob, and the artifact is a clean publish's (same manifest
/// digest) and pulls verified. Counted at the proxy, the body bytes sent
/// beyond a clean publish are exactly the blob's bytes the killed run sent
/// (the chunks the registry acknowledged and the cut part): not more than
/// the blob's size. Bug: the resumed run sent the cut chunk again to the
/// stale location, which 2.8 read and then refused (one chunk past the
/// blob's size when the cut was in its last chunk); a location recorded by
/// an earlier run is now confirmed with the registry (`GET`) before a
/// chunk goes there.
#[test]
fn a_publish_killed_mid_patch_starts_that_blob_again() {
    let _g = time_bounded();
    let (tmp, src) = built_at_home(3818);
    let reg = Registry::start();
    let proxy = UplinkProxy::passing(&reg.host());
    let one_at_a_time = ["--concurrency", "1"];
    let via = |repo: &str| format!("oci://{}/{repo}:v1", proxy.host());
    let clean = ok(
        publish(tmp.path(), &src, &via("clean/qwen"), &one_at_a_time),
        "clean publish",
    );
    let (blob, last_chunk) = blob_with_a_last_chunk(&artifact_of(&src));
    let marker_at = last_chunk + 256;
    proxy.hold_after(&blob[marker_at..marker_at + 64], 512);
    let dest = via("kills/qwen");
    let mut cmd = registry_ftpipe(tmp.path());
    publish_args(&mut cmd, &src, &dest, CHUNK).args(one_at_a_time);
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !proxy.held() {
        assert!(
            t.elapsed().as_secs() < 60,
            "the last chunk's PATCH never came"
        );
        assert!(child.try_wait().unwrap().is_none(), "the publish ended");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "not killed");
    proxy.cut();
    let killed = proxy.requests();
    let cut = killed.last().unwrap();
    assert!(cut.method == "PATCH" && cut.body > 0, "{cut:?}");
    let session = upload_id(&cut.target).unwrap().to_owned();
    let of_session = |r: &Logged| upload_id(&r.path) == Some(session.as_str());
    let patches = killed
        .iter()
        .filter(|r| upload_id(&r.target) == Some(session.as_str()));
    let sent = patches.count();
    // The registry logs a request when it has answered it: the cut one too.
    while reg.requests().iter().filter(|r| of_session(r)).count() < sent {
        assert!(
            t.elapsed().as_secs() < 60,
            "the registry never ended the cut PATCH"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let before = reg.requests().len();

    ok(
        publish(tmp.path(), &src, &dest, &one_at_a_time),
        "resumed publish",
    );
    let refused: Vec<_> = reg.requests()[before..]
        .iter()
        .filter(|r| of_session(r) && r.status >= 400)
        .cloned()
        .collect();
    assert_eq!(refused.len(), 1, "the cut session: {refused:?}");
    let abandoned = query(
        &src,
        "SELECT count(*) FROM uploads WHERE state = 'abandoned'",
    );
    assert_eq!(abandoned, ["1"]);
    let body_bytes = |repo: &str| -> u64 {
        let prefix = format!("/v2/{repo}/");
        let all = proxy.requests();
        all.iter()
            .filter(|r| r.target.starts_with(&prefix))
            .map(|r| r.body)
            .sum()
    };
    let resent = body_bytes("kills/qwen") - body_bytes("clean/qwen");
    let had = last_chunk as u64 + cut.body;
    eprintln!(
        "blob {} bytes, the registry had {had} when killed, resent {resent}",
        blob.len()
    );
    assert_eq!(
        resent, had,
        "resent, against what the killed run sent of it"
    );
    assert!(had <= blob.len() as u64);
    let clean_digest = summary(&clean)["outcome"]["manifest_digest"].clone();
    assert_eq!(
        reg.manifest("kills/qwen", "v1").0,
        clean_digest.as_str().unwrap()
    );
    let out = tmp.path().join("pulled");
    let src_ref = reg.reference("kills/qwen:v1");
    pull_identical(registry_ftpipe(tmp.path()), &src_ref, &out, &src, &[]);
}

/// The largest file of `artifact` whose last chunk of [`CHUNK`] holds at
/// least 1 KiB, of three chunks or more: its bytes and where that chunk
/// begins.
fn blob_with_a_last_chunk(artifact: &Path) -> (Vec<u8>, usize) {
    const CHUNK_BYTES: usize = 64 << 10;
    let mut files: Vec<Vec<u8>> = tree_of(artifact)
        .into_iter()
        .map(|n| artifact.join(n))
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap())
        .filter(|b| b.len() > 2 * CHUNK_BYTES && (b.len() - 1) % CHUNK_BYTES >= 1024)
        .collect();
    files.sort_by_key(Vec::len);
    let blob = files.pop().expect("a file of three chunks or more");
    let last_chunk = (blob.len() - 1) / CHUNK_BYTES * CHUNK_BYTES;
    (blob, last_chunk)
}

/// An artifact published to a fresh registry ([`Published`]), and a
/// lying proxy in front of it: the largest component's path and blob
/// digest.
struct Lying {
    p: Published,
    proxy: crate::common::lying_proxy::LyingProxy,
    path: String,
    digest: String,
}

fn lying(seed: u64) -> Lying {
    let p = Published::new(seed);
    let proxy = crate::common::lying_proxy::LyingProxy::start(&format!("http://{}", p.reg.host()));
    let ours = manifest_json(&p.dir);
    let largest = ours["components"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|c| c["size"].as_u64().unwrap())
        .unwrap();
    Lying {
        path: largest["path"].as_str().unwrap().to_owned(),
        digest: format!("sha256:{}", largest["sha256"].as_str().unwrap()),
        p,
        proxy,
    }
}

impl Lying {
    /// `lie` told to the next GET of the largest component's blob: its
    /// path suffix (`blobs/DIGEST`).
    fn lie_about_the_blob(&self, lie: crate::common::lying_proxy::Lie) -> String {
        let blob = format!("blobs/{}", self.digest);
        self.proxy.lie(&blob, lie, 1);
        blob
    }

    fn source(&self) -> String {
        format!(
            "oci://{}/models/qwen:v1",
            self.proxy.endpoint().trim_start_matches("http://")
        )
    }

    /// A pull through the proxy, which must end byte-identical and
    /// verified: its directory.
    fn pull_identical(&self, extra: &[&str]) -> std::path::PathBuf {
        let out = self.p.out("pulled");
        let cmd = registry_ftpipe(self.p.home());
        pull_identical(cmd, &self.source(), &out, &self.p.dir, extra);
        out
    }

    /// [`Lying::pull_identical`], with a recorded discard of the
    /// lied-about layer.
    fn pull_survives(&self, extra: &[&str]) {
        let out = self.pull_identical(extra);
        assert!(
            !discards(&out, &self.path).is_empty(),
            "no recorded discard of {}",
            self.path
        );
    }
}

/// A blob whose bytes are not its digest is discarded (recorded) and
/// fetched again; never kept.
#[test]
fn a_blob_whose_bytes_are_not_its_digest_is_discarded_and_fetched_again() {
    use crate::common::lying_proxy::Lie;
    let _g = time_bounded();
    let l = lying(3811);
    l.lie_about_the_blob(Lie::Corrupt { at: 1000 });
    l.pull_survives(&[]);
}

/// A `200` (the whole blob) to a ranged blob GET is taken from byte 0: the
/// kept bytes are a recorded discard, nothing is spliced.
#[test]
fn a_200_to_a_ranged_blob_get_restarts_the_blob_from_byte_0() {
    use crate::common::lying_proxy::Lie;
    let _g = time_bounded();
    let l = lying(3812);
    // The first range is taken, a later one is answered whole.
    let blob = l.lie_about_the_blob(Lie::ShortBody { after: 70_000 });
    l.lie_about_the_blob(Lie::IgnoreRange);
    l.pull_survives(crate::common::s3::RANGED_PULL);
    assert!(
        l.proxy
            .seen()
            .iter()
            .any(|s| s.target.contains(&blob) && s.range.is_some()),
        "no ranged blob GET"
    );
}

/// A truncated blob (the connection closes early) is resumed by range,
/// and the file ends byte-identical.
#[test]
fn a_truncated_blob_is_resumed() {
    use crate::common::lying_proxy::Lie;
    let _g = time_bounded();
    let l = lying(3813);
    let blob = l.lie_about_the_blob(Lie::ShortBody { after: 70_000 });
    l.pull_identical(&[]);
    let ranged: Vec<_> = l
        .proxy
        .seen()
        .into_iter()
        .filter(|s| s.target.contains(&blob) && s.range.is_some())
        .collect();
    assert!(!ranged.is_empty(), "the rest was not asked by range");
}

/// A manifest that never ends is cut at MAX_OCI_MANIFEST_BYTES with an
/// error naming the limit and the manifest; nothing is fetched.
#[test]
fn a_manifest_that_never_ends_is_refused_at_its_limit() {
    use crate::common::lying_proxy::Lie;
    let _g = time_bounded();
    let l = lying(3814);
    let digest = l.p.reg.manifest("models/qwen", "v1").0;
    l.proxy.lie(&format!("manifests/{digest}"), Lie::Endless, 1);
    let out = l.p.out("pulled");
    let o = pull(l.p.home(), &l.source(), &out, &[]);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["4194304", "manifests/"]);
    assert!(!artifact_of(&out).join(&l.path).exists());
}

/// Layer paths that escape the artifact (`..`, absolute) or repeat are
/// refused before any blob is read, naming the layer.
#[test]
fn hostile_layer_paths_are_refused() {
    let _g = time_bounded();
    let p = Published::new(3815);
    let good = p.manifest_json();
    let cases: [(&str, &Edit); 3] = [
        ("dotdot", &|m| set_path(m, 0, "../escape")),
        ("absolute", &|m| set_path(m, 0, "/tmp/escape")),
        ("twice", &|m| {
            let first = m["layers"][0]["annotations"]["org.cncf.model.filepath"].clone();
            set_path(m, 1, first.as_str().unwrap());
        }),
    ];
    for (tag, edit) in cases {
        let mut m = good.clone();
        edit(&mut m);
        p.pull_of_edited_manifest_is_refused(tag, &m, &["layers[", "annotations"]);
    }
    assert!(!p.out("escape").exists());
}

/// A change made to a good manifest.
type Edit = dyn Fn(&mut serde_json::Value);

fn set_path(m: &mut serde_json::Value, layer: usize, path: &str) {
    let a = &mut m["layers"][layer]["annotations"];
    a["org.cncf.model.filepath"] = path.into();
    a["org.opencontainers.image.title"] = path.into();
}

/// A registry whose Bearer challenge names a realm on another host gets
/// no token request there: the credentials stay home, and the error says
/// why.
#[test]
fn a_token_realm_on_another_host_is_refused() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = RawServer::start(4, |_| RawResponse::new(200, r#"{"token":"stolen"}"#));
    let port = elsewhere.endpoint.rsplit(':').next().unwrap().to_owned();
    let realm = format!("Bearer realm=\"http://localhost:{port}/token\",service=\"r\"");
    let registry = RawServer::start(8, move |_| {
        RawResponse::new(401, "{}").header("WWW-Authenticate", &realm)
    });
    let host = registry.endpoint.trim_start_matches("http://").to_owned();
    let auth = tmp.path().join("auth.json");
    let doc = serde_json::json!({ "auths": { host.clone(): { "auth": "dXNlcjpwYXNzd29yZC1mb3ItdGhlLXJlZ2lzdHJ5" } } });
    std::fs::write(&auth, doc.to_string()).unwrap();
    let out = tmp.path().join("pulled");
    let mut cmd = registry_ftpipe(tmp.path());
    cmd.env("REGISTRY_AUTH_FILE", &auth);
    let o = pull_through(cmd, &format!("oci://{host}/models/qwen:v1"), &out, &[]);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["realm", "another host", "localhost"]);
    assert!(
        elsewhere.targets().is_empty(),
        "asked the other host: {:?}",
        elsewhere.targets()
    );
}

/// A registry asking for Bearer tokens (the distribution registry's token
/// auth, a token server on the registry's host): `publish` and `pull` get
/// tokens from the realm; a token that expires mid-pull (its next request
/// answered `401`) is asked for again once and the pull goes on to a
/// byte-identical, verified artifact. No token reaches the output or the
/// state database.
#[test]
fn a_bearer_token_that_expires_mid_pull_is_asked_for_again() {
    use crate::common::lying_proxy::{Lie, LyingProxy};
    let _g = time_bounded();
    let p = Published::to(Registry::start_with_tokens(), 3816, "models/qwen:v1");
    let (reg, src) = (&p.reg, &p.dir);
    assert!(
        reg.tokens_issued()
            .iter()
            .any(|t| t.starts_with("repository:models/qwen:") && t.contains("push")),
        "{:?}",
        reg.tokens_issued()
    );
    let proxy = LyingProxy::start(&format!("http://{}", reg.host()));
    // The manifest.json layer is read before any component: held past the
    // short token's life, every component request after it carries an
    // expired token.
    let manifest = std::fs::read(artifact_of(src).join("manifest.json")).unwrap();
    let blob = format!("blobs/sha256:{}", sha256_hex(&manifest));
    let hold = std::time::Duration::from_secs(4);
    proxy.lie(&blob, Lie::Stall { after: 10, hold }, 1);
    reg.next_token_short_lived();
    let issued = reg.tokens_issued().len();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    let out = p.out("pulled");
    let o = pull_identical(
        registry_ftpipe(p.home()),
        &format!("oci://{host}/models/qwen:v1"),
        &out,
        src,
        &["--jobs", "1", "--connections", "1", "--read-timeout", "30"],
    );
    let tokens = reg.tokens_issued()[issued..].to_vec();
    assert!(tokens.len() >= 2, "no second token: {tokens:?}");
    assert!(tokens[0].ends_with("exp=-58"), "{tokens:?}");
    let expired: Vec<_> = reg
        .requests()
        .into_iter()
        .filter(|r| r.status == 401 && r.path.contains("/blobs/"))
        .collect();
    assert!(
        !expired.is_empty(),
        "no blob request was refused for an expired token"
    );
    assert!(!output_text(&o).contains("eyJ"), "a token in the output");
    assert_not_in_state(&[&out], "eyJ", "a token");
}

/// A DIR holding another pull (here an S3-free one: another registry
/// reference) is not taken over by a pull of another reference: refused
/// naming both, nothing of DIR changed.
#[test]
fn a_dir_pinned_to_another_reference_is_refused() {
    let _g = time_bounded();
    let p = Published::new(3817);
    ok(
        publish(p.home(), &p.dir, &p.reg.reference("other/qwen:v1"), &[]),
        "publish other",
    );
    let out = p.pull_identical("models/qwen:v1", "pulled");
    let before = std::fs::read(out.join(".ftpipe/state.db")).unwrap().len();
    let o = pull(p.home(), &p.reg.reference("other/qwen:v1"), &out, &[]);
    assert!(
        !o.status.success(),
        "took over a DIR pinned to another reference"
    );
    assert_names(
        &stderr(&o),
        &["models/qwen:v1", "other/qwen:v1", "another --out"],
    );
    assert!(std::fs::read(out.join(".ftpipe/state.db")).unwrap().len() >= before);
    verify_deep(&artifact_of(&out));
}
