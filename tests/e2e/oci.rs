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
//! `skopeo copy` keeps the manifest digest. Refusals: a tag naming
//! another artifact (without `--force-tag`), a tag moved between a pull
//! and its resume (without `--repin`), layers whose paths escape the
//! artifact or repeat, a blob whose bytes are not its digest.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::registry::*;
use crate::common::*;
use crate::s3::{built, ok, summary, verify_deep};

/// Blobs above this go as chunked uploads of several chunks.
const CHUNK: &str = "64KiB";

pub fn publish(home: &Path, dir: &Path, dest: &str, extra: &[&str]) -> Output {
    run(ftpipe()
        .env("HOME", home)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("DOCKER_CONFIG")
        .env_remove("XDG_RUNTIME_DIR")
        .arg("publish")
        .arg(dir)
        .arg(dest)
        .args(["--plain-http", "--part-size", CHUNK, "--json"])
        .args(extra))
}

pub fn pull(home: &Path, src: &str, out: &Path, extra: &[&str]) -> Output {
    run(ftpipe()
        .env("HOME", home)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("DOCKER_CONFIG")
        .env_remove("XDG_RUNTIME_DIR")
        .args(["pull", src, "--plain-http", "--out"])
        .arg(out)
        .args(["--retry-base-ms", "20", "--json"])
        .args(extra))
}

/// Every file of `a` has the bytes of the same file in `b`, and both hold
/// the same files.
pub fn assert_same_files(a: &Path, b: &Path) {
    let names = tree_of(a);
    assert_eq!(names, tree_of(b), "file lists of {a:?} and {b:?}");
    for n in names {
        let (pa, pb) = (a.join(&n), b.join(&n));
        if pa.is_file() {
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{n} differs"
            );
        }
    }
}

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

pub fn artifact_of(dir: &Path) -> PathBuf {
    dir.join("artifact")
}

/// Publish, re-publish (no write request), pull (byte-identical,
/// `verify --deep`), re-pull (no blob read), against an anonymous registry.
#[test]
fn publish_then_pull_round_trip() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3801);
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
    let o = ok(pull(tmp.path(), &dest, &out, &[]), "pull");
    assert_eq!(summary(&o)["outcome"]["already_pulled"], false);
    assert_same_files(&artifact_of(&dir), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
    let blob_gets = |reg: &Registry| {
        reg.requests()
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3802);
    let reg = Registry::start_with_auth();
    let dest = reg.reference("models/qwen:v1");
    let o = publish(tmp.path(), &dir, &dest, &[]);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["Basic", "REGISTRY_AUTH_FILE", &reg.host()]);

    let auth = reg.auth_file(tmp.path());
    let with_auth = |cmd: &mut Command| {
        cmd.env("REGISTRY_AUTH_FILE", &auth);
    };
    let mut cmd = ftpipe();
    with_auth(&mut cmd);
    let o = run(cmd
        .env("HOME", tmp.path())
        .arg("publish")
        .arg(&dir)
        .arg(&dest)
        .args(["--plain-http", "--part-size", CHUNK, "--json"]));
    let o = ok(o, "publish with credentials");
    assert!(!String::from_utf8_lossy(&o.stdout).contains(REGISTRY_PASSWORD));
    assert!(!stderr(&o).contains(REGISTRY_PASSWORD));
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
    let o = run(ftpipe()
        .env("HOME", tmp.path())
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .env("DOCKER_CONFIG", &docker)
        .args(["pull", &dest, "--plain-http", "--json", "--out"])
        .arg(&out));
    let o = ok(o, "pull with credentials from DOCKER_CONFIG");
    let s = summary(&o);
    assert_eq!(
        s["session"]["credentials_from"],
        docker.join("config.json").display().to_string()
    );
    assert_same_files(&artifact_of(&dir), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
    for d in [&dir, &out] {
        let db = std::fs::read(d.join(".ftpipe/state.db")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&db).contains(REGISTRY_PASSWORD),
            "password in {d:?}'s state"
        );
    }
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
    assert_same_files(&artifact_of(&b), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3805);
    let reg = Registry::start();
    ok(
        publish(tmp.path(), &dir, &reg.reference("models/qwen:v1"), &[]),
        "publish",
    );
    let by_oras = tmp.path().join("by-oras");
    let target = format!("{}/models/qwen:v1", reg.host());
    python(
        ORAS_PULL,
        &[&reg.host(), &target, by_oras.to_str().unwrap()],
    );
    assert_same_files(&artifact_of(&dir), &by_oras);

    let config = tmp.path().join("modelpack-config.json");
    let doc = serde_json::json!({
        "descriptor": { "name": "qwen" },
        "config": { "format": "ftw" },
        "modelfs": { "type": "layers", "diffIds": ["sha256:00"] },
    });
    std::fs::write(&config, doc.to_string()).unwrap();
    let target = format!("{}/peer/qwen:v1", reg.host());
    let artifact = artifact_of(&dir);
    python(
        ORAS_PUSH,
        &[
            &reg.host(),
            &target,
            artifact.to_str().unwrap(),
            config.to_str().unwrap(),
        ],
    );
    let out = tmp.path().join("from-oras");
    ok(
        pull(tmp.path(), &reg.reference("peer/qwen:v1"), &out, &[]),
        "pull of oras's push",
    );
    assert_same_files(&artifact_of(&dir), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
}

/// `skopeo copy --preserve-digests` copies what ftpipe pushed to another
/// repository with its manifest digest kept, and ftpipe pulls the copy by
/// that digest.
#[test]
fn skopeo_copy_keeps_the_manifest_digest() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), 3806);
    let reg = Registry::start();
    ok(
        publish(tmp.path(), &dir, &reg.reference("models/qwen:v1"), &[]),
        "publish",
    );
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
        .env("HOME", tmp.path())
        .output()
        .expect("skopeo (apt-get install skopeo; .ci/run does)");
    assert!(
        o.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(reg.manifest("copied/qwen", "v1").0, digest);
    let out = tmp.path().join("pulled");
    let src = reg.reference(&format!("copied/qwen@{digest}"));
    ok(pull(tmp.path(), &src, &out, &[]), "pull of the copy");
    assert_same_files(&artifact_of(&dir), &artifact_of(&out));
}

/// The tag, when it is there, names `dir`'s artifact and every blob its
/// manifest names is in the repository with its size: nothing
/// half-published is ever visible. Whether the tag is there.
fn check_tag(reg: &Registry, repo: &str, tag: &str, dir: &Path, label: &str) -> bool {
    let (status, _, bytes) = reg
        .get(
            &format!("/v2/{repo}/manifests/{tag}"),
            Some("application/vnd.oci.image.manifest.v1+json"),
        )
        .unwrap();
    if status == 404 {
        return false;
    }
    assert_eq!(status, 200, "{label}");
    let m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let ours = manifest_json(dir);
    assert_eq!(
        m["annotations"]["dev.ftpipe.artifact.fingerprint"], ours["fingerprint"],
        "{label}"
    );
    let blobs = m["layers"].as_array().unwrap().iter().chain([&m["config"]]);
    for b in blobs {
        let digest = b["digest"].as_str().unwrap();
        let (status, headers, _) = reg
            .request("HEAD", &format!("/v2/{repo}/blobs/{digest}"), None, &[])
            .unwrap();
        assert_eq!(status, 200, "{label}: the tag names {digest}, not there");
        let len = headers.iter().find(|(k, _)| k == "content-length").unwrap();
        assert_eq!(len.1, b["size"].to_string(), "{label}: {digest}");
    }
    true
}

/// At least 20 seeded SIGKILLs (`KILLS`, `FTPIPE_CRASH_SEED`) at moments
/// over a calibrated publish: after each, the state database is intact
/// and a tag, once there, names a complete artifact; every chain of
/// killed runs ends, resumed, with the artifact published, and it pulls
/// byte-identical.
#[test]
fn kill_storm_over_publish() {
    use crate::s3_crash::{check_publish_state, kill_after, kills};
    let _heavy = heavy();
    let seed = crash_seed();
    eprintln!("oci publish kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = ftpipe_fixtures::checkpoint::SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 3807);
    let reg = Registry::start();
    let t = std::time::Instant::now();
    ok(
        publish(home, &src, &reg.reference("calibration/qwen:v1"), &[]),
        "calibration",
    );
    let ms = (t.elapsed().as_millis() as u64).max(20);
    let (mut chain, mut kill) = (0usize, 0usize);
    let repo = |n: usize| format!("storm{n}/qwen");
    while kill < kills() {
        let delay = rng.next_u64() % ms;
        let label = format!(
            "oci publish kill {} after {delay} ms into {}",
            kill + 1,
            repo(chain)
        );
        let mut cmd = ftpipe();
        cmd.env("HOME", home)
            .env_remove("REGISTRY_AUTH_FILE")
            .arg("publish")
            .arg(&src)
            .arg(reg.reference(&format!("{}:v1", repo(chain))))
            .args(["--plain-http", "--part-size", CHUNK]);
        if kill_after(&mut cmd, std::time::Duration::from_millis(delay), &label) {
            assert!(
                check_tag(&reg, &repo(chain), "v1", &src, &label),
                "{label}: no tag"
            );
            chain += 1;
            continue;
        }
        kill += 1;
        check_publish_state(&src, &label);
        check_tag(&reg, &repo(chain), "v1", &src, &label);
    }
    let dest = reg.reference(&format!("{}:v1", repo(chain)));
    ok(publish(home, &src, &dest, &[]), "last chain");
    assert!(check_tag(&reg, &repo(chain), "v1", &src, "last chain"));
    let out = tmp.path().join("node");
    ok(pull(home, &dest, &out, &[]), "pull after the storm");
    assert_same_files(&artifact_of(&src), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
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
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 3808);
    let reg = Registry::start();
    let dest = reg.reference("models/qwen:v1");
    ok(publish(home, &src, &dest, &[]), "publish");
    let args = crate::common::s3::RANGED_PULL;
    let t = std::time::Instant::now();
    ok(
        pull(home, &dest, &tmp.path().join("calibration"), args),
        "calibration",
    );
    let ms = (t.elapsed().as_millis() as u64).max(20);
    let (mut chain, mut kill) = (0usize, 0usize);
    let dir = |n: usize| tmp.path().join(format!("node-{n}"));
    let finished_ok = |out: &Path| {
        assert_same_files(&artifact_of(&src), &artifact_of(out));
        verify_deep(&artifact_of(out));
        assert_clean_audit(out);
    };
    while kill < kills() {
        let delay = rng.next_u64() % ms;
        let label = format!(
            "oci pull kill {} after {delay} ms into {:?}",
            kill + 1,
            dir(chain)
        );
        let mut cmd = ftpipe();
        cmd.env("HOME", home)
            .env_remove("REGISTRY_AUTH_FILE")
            .args(["pull", &dest, "--plain-http", "--out"])
            .arg(dir(chain))
            .args(args)
            .args(["--retry-base-ms", "20"]);
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
    let o = run(ftpipe()
        .env("HOME", home)
        .env_remove("REGISTRY_AUTH_FILE")
        .env("FTPIPE_CRASH_AT", point)
        .arg("publish")
        .arg(src)
        .arg(dest)
        .args(["--plain-http", "--part-size", CHUNK]));
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
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), 3809);
    let reg = Registry::start();
    let patches = |reg: &Registry, repo: &str| {
        reg.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.starts_with(&format!("/v2/{repo}/")))
            .collect::<Vec<_>>()
    };
    ok(
        publish(tmp.path(), &src, &reg.reference("clean/qwen:v1"), &[]),
        "clean publish",
    );
    let clean = patches(&reg, "clean/qwen").len();
    let dest = reg.reference("resumed/qwen:v1");
    crashed_publish(tmp.path(), &src, &dest, "upload-part-recorded#3");
    let killed = patches(&reg, "resumed/qwen");
    assert_eq!(killed.len(), 3);
    let session = upload_id(&killed[2].path).unwrap().to_owned();
    ok(publish(tmp.path(), &src, &dest, &[]), "resumed publish");
    let all = patches(&reg, "resumed/qwen");
    assert_eq!(all.len(), clean, "a chunk was sent twice");
    assert_eq!(
        upload_id(&all[3].path),
        Some(session.as_str()),
        "the resumed run did not continue the killed session"
    );
    assert!(check_tag(&reg, "resumed/qwen", "v1", &src, "resumed"));
}

/// A publish killed after the registry took a chunk but before its
/// location was recorded: the registry refuses the stale location (it
/// cancels the session: distribution 2.8 does for a resume at another
/// offset, as for one it forgot), the session row is abandoned and one
/// new upload sends the blob; the published artifact pulls byte-identical.
#[test]
fn an_upload_session_the_registry_refuses_on_resume_is_started_again() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), 3810);
    let reg = Registry::start();
    let dest = reg.reference("models/qwen:v1");
    crashed_publish(tmp.path(), &src, &dest, "upload-part-sent#3");
    ok(publish(tmp.path(), &src, &dest, &[]), "resumed publish");
    let refused: Vec<_> = reg
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.status >= 400)
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "the stale location was not tried once: {refused:?}"
    );
    let abandoned = query(
        &src,
        "SELECT count(*) FROM uploads WHERE state = 'abandoned'",
    );
    assert_eq!(abandoned, ["1"]);
    assert!(check_tag(&reg, "models/qwen", "v1", &src, "restarted"));
    let out = tmp.path().join("pulled");
    ok(pull(tmp.path(), &dest, &out, &[]), "pull");
    assert_same_files(&artifact_of(&src), &artifact_of(&out));
}

/// An artifact published to a fresh registry, and a lying proxy in front
/// of it: (tmp, DIR, registry, proxy, the largest component's path and
/// blob digest).
struct Lying {
    tmp: tempfile::TempDir,
    src: PathBuf,
    _reg: Registry,
    proxy: crate::common::lying_proxy::LyingProxy,
    path: String,
    digest: String,
}

fn lying(seed: u64) -> Lying {
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), seed);
    let reg = Registry::start();
    ok(
        publish(tmp.path(), &src, &reg.reference("models/qwen:v1"), &[]),
        "publish",
    );
    let proxy = crate::common::lying_proxy::LyingProxy::start(&format!("http://{}", reg.host()));
    let ours = manifest_json(&src);
    let largest = ours["components"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|c| c["size"].as_u64().unwrap())
        .unwrap();
    Lying {
        path: largest["path"].as_str().unwrap().to_owned(),
        digest: format!("sha256:{}", largest["sha256"].as_str().unwrap()),
        tmp,
        src,
        _reg: reg,
        proxy,
    }
}

impl Lying {
    fn source(&self) -> String {
        format!(
            "oci://{}/models/qwen:v1",
            self.proxy.endpoint().trim_start_matches("http://")
        )
    }

    /// A pull through the proxy, which must end byte-identical and
    /// verified, with a recorded discard of the lied-about layer.
    fn pull_survives(&self, extra: &[&str]) {
        let out = self.tmp.path().join("pulled");
        ok(
            pull(self.tmp.path(), &self.source(), &out, extra),
            "pull through the liar",
        );
        assert_same_files(&artifact_of(&self.src), &artifact_of(&out));
        verify_deep(&artifact_of(&out));
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
    l.proxy
        .lie(&format!("blobs/{}", l.digest), Lie::Corrupt { at: 1000 }, 1);
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
    let blob = format!("blobs/{}", l.digest);
    l.proxy.lie(&blob, Lie::ShortBody { after: 70_000 }, 1);
    l.proxy.lie(&blob, Lie::IgnoreRange, 1);
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
    let blob = format!("blobs/{}", l.digest);
    l.proxy.lie(&blob, Lie::ShortBody { after: 70_000 }, 1);
    let out = l.tmp.path().join("pulled");
    ok(pull(l.tmp.path(), &l.source(), &out, &[]), "pull");
    assert_same_files(&artifact_of(&l.src), &artifact_of(&out));
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
    let digest = l._reg.manifest("models/qwen", "v1").0;
    l.proxy.lie(&format!("manifests/{digest}"), Lie::Endless, 1);
    let out = l.tmp.path().join("pulled");
    let o = pull(l.tmp.path(), &l.source(), &out, &[]);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["4194304", "manifests/"]);
    assert!(!artifact_of(&out).join(&l.path).exists());
}

/// Layer paths that escape the artifact (`..`, absolute) or repeat are
/// refused before any blob is read, naming the layer.
#[test]
fn hostile_layer_paths_are_refused() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), 3815);
    let reg = Registry::start();
    ok(
        publish(tmp.path(), &src, &reg.reference("models/qwen:v1"), &[]),
        "publish",
    );
    let (_, bytes) = reg.manifest("models/qwen", "v1");
    let good: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
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
        let (status, _, body) = reg
            .request(
                "PUT",
                &format!("/v2/models/qwen/manifests/{tag}"),
                Some("application/vnd.oci.image.manifest.v1+json"),
                m.to_string().as_bytes(),
            )
            .unwrap();
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        let before = reg.requests().len();
        let out = tmp.path().join(format!("pulled-{tag}"));
        let o = pull(
            tmp.path(),
            &reg.reference(&format!("models/qwen:{tag}")),
            &out,
            &[],
        );
        assert!(!o.status.success(), "{tag}: pulled");
        assert_names(&stderr(&o), &["layers[", "annotations"]);
        let blob_reads = reg.requests()[before..]
            .iter()
            .filter(|r| r.path.contains("/blobs/"))
            .count();
        assert_eq!(
            blob_reads, 0,
            "{tag}: blobs read before the manifest was checked"
        );
    }
    assert!(!tmp.path().join("escape").exists());
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
    let o = run(ftpipe()
        .env("HOME", tmp.path())
        .env("REGISTRY_AUTH_FILE", &auth)
        .args([
            "pull",
            &format!("oci://{host}/models/qwen:v1"),
            "--plain-http",
            "--out",
        ])
        .arg(&out));
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
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), 3816);
    let reg = Registry::start_with_tokens();
    ok(
        publish(tmp.path(), &src, &reg.reference("models/qwen:v1"), &[]),
        "publish",
    );
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
    let manifest = std::fs::read(artifact_of(&src).join("manifest.json")).unwrap();
    let blob = format!("blobs/sha256:{}", sha256_hex(&manifest));
    let hold = std::time::Duration::from_secs(4);
    proxy.lie(&blob, Lie::Stall { after: 10, hold }, 1);
    reg.next_token_short_lived();
    let issued = reg.tokens_issued().len();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    let out = tmp.path().join("pulled");
    let o = pull(
        tmp.path(),
        &format!("oci://{host}/models/qwen:v1"),
        &out,
        &["--jobs", "1", "--connections", "1", "--read-timeout", "30"],
    );
    let o = ok(o, "pull across a token's expiry");
    assert_same_files(&artifact_of(&src), &artifact_of(&out));
    verify_deep(&artifact_of(&out));
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
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(!text.contains("eyJ"), "a token in the output");
    let db = std::fs::read(out.join(".ftpipe/state.db")).unwrap();
    assert!(
        !String::from_utf8_lossy(&db).contains("eyJ"),
        "a token in the state"
    );
}

/// A DIR holding another pull (here an S3-free one: another registry
/// reference) is not taken over by a pull of another reference: refused
/// naming both, nothing of DIR changed.
#[test]
fn a_dir_pinned_to_another_reference_is_refused() {
    let _g = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), 3817);
    let reg = Registry::start();
    ok(
        publish(tmp.path(), &src, &reg.reference("models/qwen:v1"), &[]),
        "publish",
    );
    ok(
        publish(tmp.path(), &src, &reg.reference("other/qwen:v1"), &[]),
        "publish other",
    );
    let out = tmp.path().join("pulled");
    ok(
        pull(tmp.path(), &reg.reference("models/qwen:v1"), &out, &[]),
        "pull",
    );
    let before = std::fs::read(out.join(".ftpipe/state.db")).unwrap().len();
    let o = pull(tmp.path(), &reg.reference("other/qwen:v1"), &out, &[]);
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
