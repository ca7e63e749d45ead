//! `publish` and `pull` against a real S3-compatible server (moto on
//! loopback, `common::s3`): an artifact built by `ftpipe run` is
//! published (components as multipart uploads of several parts, the
//! manifest last), pulled into a second directory, and comes out
//! byte-identical and verified (`verify --deep`); a re-publish and a
//! re-pull are no-ops; four nodes pulling one prefix at once all end
//! verified. The refusals name what they refuse: a hostile or oversize
//! manifest (its key and JSON path), a truncated object (its key), a
//! different artifact at the prefix or a racing publisher (both
//! fingerprints), an artifact that does not verify (nothing uploaded). An
//! object replaced mid-pull is a recorded discard and a refetch from byte
//! 0 under the new ETag, never spliced. The AWS credentials reach no
//! output, no state database and no bundle.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::s3::*;
use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;

/// Components of about 1.5 MB: several 64 KiB parts each.
pub fn shape() -> QwenShape {
    QwenShape {
        hidden: 128,
        moe_intermediate: 128,
        ..QwenShape::default()
    }
}

/// `DIR` after `ftpipe run` of the qwen4 fixture with `seed`.
pub fn built(tmp: &Path, seed: u64) -> PathBuf {
    let hub = qwen4_hub(seed, shape());
    let out = tmp.join(format!("built-{seed}"));
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    out
}

pub fn publish(m: &Moto, home: &Path, dir: &Path, dest: &str) -> Output {
    run(m
        .ftpipe(home)
        .arg("publish")
        .arg(dir)
        .arg(dest)
        .args(["--part-size", PART_SIZE, "--json"]))
}

pub fn pull(m: &Moto, home: &Path, src: &str, out: &Path, extra: &[&str]) -> Output {
    run(m
        .ftpipe(home)
        .args(["pull", src, "--out"])
        .arg(out)
        .args(["--retry-base-ms", "20", "--json"])
        .args(extra))
}

pub fn summary(o: &Output) -> serde_json::Value {
    json_events(o, "summary")
        .pop()
        .unwrap_or_else(|| panic!("no summary:\n{}", stderr(o)))
}

pub fn ok(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    o
}

pub fn verify_deep(artifact: &Path) {
    run_ok(ftpipe().arg("verify").arg(artifact).arg("--deep"));
}

/// No credential in `bytes` (labelled `what`).
pub fn assert_no_secret(bytes: &[u8], what: &str) {
    for s in [SECRET_ACCESS_KEY, SESSION_TOKEN, ACCESS_KEY_ID] {
        assert!(
            !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
            "{what} holds a credential"
        );
    }
}

/// No credential in `DIR/.ftpipe/*` (the database and its WAL).
pub fn assert_no_secret_in_state(dir: &Path) {
    for e in std::fs::read_dir(dir.join(".ftpipe")).unwrap() {
        let p = e.unwrap().path();
        assert_no_secret(&std::fs::read(&p).unwrap(), &p.display().to_string());
    }
}

#[test]
fn publish_then_pull_gives_the_same_verified_artifact_and_reruns_are_no_ops() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 301);
    let m = Moto::start();
    let dest = "s3://models/qwen/exp";

    let o = ok(publish(&m, home, &src, dest), "publish");
    assert_no_secret(&o.stdout, "publish stdout");
    assert_no_secret(&o.stderr, "publish stderr");
    let s = summary(&o);
    let fp = s["outcome"]["fingerprint"].as_str().unwrap().to_owned();
    assert_eq!(s["outcome"]["already_published"], false);
    assert!(s["outcome"]["uploaded"].as_u64().unwrap() > 1, "{s}");
    // Components under the fingerprint, the manifest at the prefix.
    let keys = m.keys("qwen/exp/");
    assert!(
        keys.contains(&"qwen/exp/manifest.json".to_owned()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&format!("qwen/exp/{fp}/placement.json")),
        "{keys:?}"
    );
    let manifest = manifest_json(&src);
    for c in manifest["components"].as_array().unwrap() {
        let key = format!("qwen/exp/{fp}/{}", c["path"].as_str().unwrap());
        assert!(keys.contains(&key), "{key} not published");
    }
    // Several multipart uploads of several parts were used.
    let parts = query(&src, "SELECT COUNT(*) FROM upload_parts");
    assert!(parts[0].parse::<u64>().unwrap() > 4, "{parts:?}");
    assert_eq!(
        query(
            &src,
            "SELECT COUNT(*) FROM uploads WHERE state <> 'verified'"
        ),
        ["0"]
    );
    assert_eq!(m.uploads_in_progress(), 0);

    // Again: a no-op.
    let o = ok(publish(&m, home, &src, dest), "re-publish");
    let s = summary(&o);
    assert_eq!(s["outcome"]["already_published"], true, "{s}");
    assert_eq!(s["outcome"]["uploaded"], 0);

    // Pull on "another machine", ranges in parallel for the larger objects.
    let out = tmp.path().join("node");
    let o = ok(
        pull(
            &m,
            home,
            dest,
            &out,
            &[RANGED_PULL, &["--connections", "6"]].concat(),
        ),
        "pull",
    );
    assert_no_secret(&o.stdout, "pull stdout");
    assert_no_secret(&o.stderr, "pull stderr");
    assert_eq!(summary(&o)["outcome"]["already_pulled"], false);
    verify_deep(&out.join("artifact"));
    assert_eq!(
        std::fs::read(out.join("artifact/manifest.json")).unwrap(),
        std::fs::read(src.join("artifact/manifest.json")).unwrap(),
        "the pulled manifest is the published one, byte for byte"
    );
    assert_eq!(
        tree_of(&out.join("artifact")),
        tree_of(&src.join("artifact"))
    );
    let ranged = query(&out, "SELECT COUNT(*) FROM attempts WHERE range_start > 0");
    assert!(
        ranged[0].parse::<u64>().unwrap() > 0,
        "no object was fetched in ranges"
    );
    let a = assert_clean_audit(&out);
    assert_eq!(a["repo"], dest);

    // Again: a no-op, no object read.
    let before = query(&out, "SELECT COUNT(*) FROM attempts");
    let o = ok(pull(&m, home, dest, &out, &[]), "re-pull");
    assert_eq!(summary(&o)["outcome"]["already_pulled"], true);
    assert_eq!(query(&out, "SELECT COUNT(*) FROM attempts"), before);

    // The secrets reached no database and no bundle.
    assert_no_secret_in_state(&src);
    assert_no_secret_in_state(&out);
    for dir in [&src, &out] {
        let bundle = tmp.path().join("b.tar.zst");
        let o = run(m
            .ftpipe(home)
            .args(["audit", "--out"])
            .arg(dir)
            .arg("--bundle")
            .arg(&bundle));
        assert_no_secret(&o.stdout, "audit stdout");
        assert_no_secret(&o.stderr, "audit stderr");
        let raw = zstd::decode_all(std::fs::File::open(&bundle).unwrap()).unwrap();
        assert_no_secret(&raw, "bundle");
        if dir == &src {
            assert!(
                String::from_utf8_lossy(&raw).contains("upload_attempts.json"),
                "the bundle holds the publish records"
            );
        }
    }
}

/// A manifest edited into `edit` and put at `prefix/manifest.json`.
fn put_manifest(m: &Moto, src: &Path, prefix: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v = manifest_json(src);
    edit(&mut v);
    m.put_object(
        &format!("{prefix}/manifest.json"),
        &serde_json::to_vec(&v).unwrap(),
    );
}

#[test]
fn hostile_or_broken_manifests_and_objects_are_refused_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 302);
    let m = Moto::start();
    let refused = |prefix: &str, needles: &[&str], code: i32| {
        let out = tmp.path().join(format!("out-{}", prefix.replace('/', "-")));
        let o = pull(&m, home, &format!("s3://models/{prefix}"), &out, &[]);
        assert_eq!(o.status.code(), Some(code), "{prefix}: {}", stderr(&o));
        assert_names(&stderr(&o), needles);
        assert!(
            !out.join("artifact/manifest.json").exists(),
            "{prefix}: a refused pull wrote a manifest"
        );
        // Nothing was written outside DIR.
        assert!(!tmp.path().join("evil").exists());
    };
    put_manifest(&m, &src, "dotdot", |v| {
        v["components"][0]["path"] = "../../evil".into();
    });
    refused(
        "dotdot",
        &[
            "s3://models/dotdot/manifest.json",
            "components[0].path",
            "dot component",
        ],
        1,
    );
    put_manifest(&m, &src, "absolute", |v| {
        v["components"][1]["path"] = "/etc/evil".into();
    });
    refused("absolute", &["components[1].path", "absolute path"], 1);
    put_manifest(&m, &src, "typed", |v| {
        v["components"][0]["size"] = "big".into();
    });
    refused(
        "typed",
        &["s3://models/typed/manifest.json", "components[0].size"],
        1,
    );
    put_manifest(&m, &src, "fingerprint", |v| {
        v["components"][0]["sha256"] = "0".repeat(64).into();
    });
    refused("fingerprint", &["fingerprint", "imply"], 1);
    put_manifest(&m, &src, "reserved", |v| {
        v["components"][0]["path"] = "manifest.json".into();
    });
    refused("reserved", &["components[0].path", "reserved"], 1);
    put_manifest(&m, &src, "twice", |v| {
        let first = v["components"][0]["path"].clone();
        v["components"][1]["path"] = first;
    });
    refused("twice", &["components[1].path", "listed twice"], 1);
    put_manifest(&m, &src, "digest", |v| {
        v["components"][0]["sha256"] = "XYZ".into();
    });
    refused("digest", &["components[0].sha256", "64 lowercase hex"], 1);
    m.put_object("notjson/manifest.json", b"<html>not a manifest</html>");
    refused(
        "notjson",
        &[
            "s3://models/notjson/manifest.json",
            "expected an ftpipe manifest",
        ],
        1,
    );
    // Larger than any manifest is read: refused while reading.
    let big = vec![b' '; 64 * 1024 * 1024 + 1];
    m.put_object("oversize/manifest.json", &big);
    refused(
        "oversize",
        &["s3://models/oversize/manifest.json", "at most 67108864"],
        1,
    );
    refused(
        "nothing",
        &["nothing is published at s3://models/nothing"],
        1,
    );

    // A truncated object: refused before any byte is fetched, named.
    ok(publish(&m, home, &src, "s3://models/trunc"), "publish");
    let fp = manifest_json(&src)["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    let comp = manifest_json(&src)["components"][0]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = format!("trunc/{fp}/{comp}");
    let bytes = m.get_object(&key).unwrap();
    m.put_object(&key, &bytes[..bytes.len() / 2]);
    refused("trunc", &[&format!("s3://models/{key}"), "truncated"], 6);
}

#[test]
fn an_object_replaced_mid_pull_is_a_recorded_discard_and_a_refetch() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 303);
    let m = Moto::start();
    let dest = "s3://models/replaced";
    ok(publish(&m, home, &src, dest), "publish");
    let fp = manifest_json(&src)["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    // Killed with 64 KiB of the first (largest) object durable.
    let out = tmp.path().join("node");
    let o = run(m
        .ftpipe(home)
        .args(["pull", dest, "--out"])
        .arg(&out)
        .args([
            "--jobs",
            "1",
            "--connections",
            "1",
            "--checkpoint-bytes",
            "65536",
        ])
        .env("FTPIPE_CRASH_AT", "checkpoint-synced#2"));
    assert_eq!(o.status.code(), None, "not killed: {}", stderr(&o));
    let partial = query(
        &out,
        "SELECT path FROM ledger WHERE committed_bytes > 0 AND path NOT IN (SELECT path FROM receipts)",
    );
    assert_eq!(partial.len(), 1, "{partial:?}");
    let path = &partial[0];
    // The same bytes put again (one put, where publish sent parts): a new
    // ETag, so the kept prefix cannot be trusted to be of this object.
    let key = format!("replaced/{fp}/{path}");
    let bytes = m.get_object(&key).unwrap();
    m.put_object(&key, &bytes);
    ok(pull(&m, home, dest, &out, &[]), "resumed pull");
    verify_deep(&out.join("artifact"));
    // One stream (one connection): the prefix is dropped as a hub file's
    // whose validator changed, and the object taken again from byte 0.
    let reasons = discard_reasons_in(&out, path);
    assert!(
        reasons.contains(&"range_not_honoured".to_owned()),
        "{reasons:?}"
    );
    let asked = query(
        &out,
        &format!(
            "SELECT IFNULL(if_range, '') || ' ' || IFNULL(etag, '') FROM attempts WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    );
    let last = asked.last().unwrap();
    let (sent, got) = last.split_once(' ').unwrap();
    assert!(
        !sent.is_empty() && sent != got,
        "resumed under the old ETag, answered with the new: {asked:?}"
    );
    let statuses = query(
        &out,
        &format!(
            "SELECT status FROM attempts WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    );
    assert!(statuses.iter().any(|s| s == "200"), "{statuses:?}");

    // Replaced by other bytes: refused by the digest, named.
    let out2 = tmp.path().join("node2");
    let o = run(m
        .ftpipe(home)
        .args(["pull", dest, "--out"])
        .arg(&out2)
        .args([
            "--jobs",
            "1",
            "--connections",
            "1",
            "--checkpoint-bytes",
            "65536",
        ])
        .env("FTPIPE_CRASH_AT", "checkpoint-synced#2"));
    assert_eq!(o.status.code(), None, "not killed: {}", stderr(&o));
    let mut other = bytes.clone();
    other[0] ^= 0xff;
    m.put_object(&key, &other);
    let o = pull(&m, home, dest, &out2, &[]);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &[path.as_str()]);
    assert!(!out2.join("artifact/manifest.json").exists());
    m.put_object(&key, &bytes);
}

/// Discard reasons of `path` (any DIR layout).
fn discard_reasons_in(out: &Path, path: &str) -> Vec<String> {
    query(
        out,
        &format!(
            "SELECT reason FROM discards WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    )
}

#[test]
fn racing_publishers_of_two_artifacts_one_wins_the_other_is_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let a = built(tmp.path(), 304);
    let b = built(tmp.path(), 305);
    let fa = manifest_json(&a)["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    let fb = manifest_json(&b)["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(fa, fb);
    let m = Moto::start();
    let dest = "s3://models/race";
    let spawn = |dir: &Path| {
        m.ftpipe(home)
            .arg("publish")
            .arg(dir)
            .arg(dest)
            .args(["--part-size", PART_SIZE])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (ca, cb) = (spawn(&a), spawn(&b));
    let (oa, ob) = (
        ca.wait_with_output().unwrap(),
        cb.wait_with_output().unwrap(),
    );
    assert!(
        oa.status.success() != ob.status.success(),
        "exactly one publisher wins:\n{}\n{}",
        stderr(&oa),
        stderr(&ob)
    );
    let (winner, loser, lost) = if oa.status.success() {
        (&fa, &fb, &ob)
    } else {
        (&fb, &fa, &oa)
    };
    assert_eq!(lost.status.code(), Some(1));
    assert_names(&stderr(lost), &[winner, loser, "s3://models/race"]);
    let published: serde_json::Value =
        serde_json::from_slice(&m.get_object("race/manifest.json").unwrap()).unwrap();
    assert_eq!(published["fingerprint"], winner.as_str());
    // Again, after the race: still refused, naming both.
    let loser_dir = if oa.status.success() { &b } else { &a };
    let o = run(m.ftpipe(home).arg("publish").arg(loser_dir).arg(dest));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(&stderr(&o), &[winner, loser]);
    // The winner's artifact pulls clean.
    let out = tmp.path().join("node");
    ok(pull(&m, home, dest, &out, &[]), "pull");
    verify_deep(&out.join("artifact"));
    assert_eq!(manifest_json(&out)["fingerprint"], winner.as_str());
}

#[test]
fn credentials_from_a_profile_work_and_never_leak() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        format!("[ci]\naws_access_key_id = {ACCESS_KEY_ID}\naws_secret_access_key = {SECRET_ACCESS_KEY}\n"),
    )
    .unwrap();
    let m = Moto::start();
    std::fs::write(
        home.join(".aws/config"),
        format!(
            "[profile ci]\nregion = eu-west-1\nendpoint_url = {}\n",
            m.endpoint()
        ),
    )
    .unwrap();
    let src = built(tmp.path(), 306);
    let env_free = |cmd: &mut std::process::Command| {
        cmd.env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_REGION")
            .env("AWS_PROFILE", "ci");
    };
    let mut cmd = m.ftpipe(&home);
    env_free(&mut cmd);
    let o = ok(
        run(cmd
            .arg("publish")
            .arg(&src)
            .arg("s3://models/profile")
            .arg("--json")),
        "publish with a profile",
    );
    let s = summary(&o);
    assert_eq!(s["session"]["region"], "eu-west-1");
    assert!(
        s["session"]["credentials_from"]
            .as_str()
            .unwrap()
            .contains("profile ci")
    );
    assert_no_secret(&o.stdout, "stdout");
    let out = tmp.path().join("node");
    let mut cmd = m.ftpipe(&home);
    env_free(&mut cmd);
    ok(
        run(cmd.args(["pull", "s3://models/profile", "--out"]).arg(&out)),
        "pull with a profile",
    );
    verify_deep(&out.join("artifact"));
    assert_no_secret_in_state(&out);

    // The bundle guard refuses a credential that reached the records by a
    // path the redaction point did not see (planted here by hand).
    sqlite_exec(
        &out,
        &format!("UPDATE attempts SET error = 'echo {SESSION_TOKEN}' WHERE id = 1"),
    );
    let o = run(m
        .ftpipe(&home)
        .args(["audit", "--out"])
        .arg(&out)
        .arg("--bundle")
        .arg(tmp.path().join("refused.tar.zst")));
    assert!(
        !o.status.success(),
        "a bundle holding the session token was written"
    );
    assert_names(&stderr(&o), &["contains a secret"]);
    assert!(!tmp.path().join("refused.tar.zst").exists());
    assert_no_secret(&o.stderr, "stderr");

    // Wrong keys: the message names the object, never the key.
    let mut cmd = m.ftpipe(&home);
    cmd.env(
        "AWS_SECRET_ACCESS_KEY",
        "wrong-secret-but-still-secret-0002",
    );
    let o = run(cmd.arg("publish").arg(&src).arg("s3://models/other"));
    assert_no_secret(&o.stderr, "stderr");
    // An endpoint holding credentials is refused without echoing them.
    let o = run(m
        .ftpipe(&home)
        .args(["pull", "s3://models/profile", "--out"])
        .arg(tmp.path().join("x"))
        .arg("--s3-endpoint")
        .arg(format!("http://user:{SECRET_ACCESS_KEY}@127.0.0.1:1")));
    assert_eq!(o.status.code(), Some(1));
    assert_no_secret(&o.stderr, "stderr");
    assert_names(
        &stderr(&o),
        &["credentials in the endpoint URL are refused"],
    );
}

/// SHA-256 of the manifest published at `prefix`.
pub fn manifest_sha_of_prefix(m: &Moto, prefix: &str) -> String {
    sha256_hex(
        &m.get_object(&format!("{prefix}/manifest.json"))
            .expect("published manifest"),
    )
}

#[test]
fn many_pullers_at_once_and_an_unverified_artifact_is_not_published() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 307);
    let m = Moto::start();
    let dest = "s3://models/fleet";
    ok(publish(&m, home, &src, dest), "publish");
    // Four nodes pull the prefix at the same time: the store is only read.
    let children: Vec<_> = (0..4)
        .map(|i| {
            m.ftpipe(home)
                .args(["pull", dest, "--out"])
                .arg(tmp.path().join(format!("node-{i}")))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "node {i}: {}", stderr(&o));
        let out = tmp.path().join(format!("node-{i}"));
        verify_deep(&out.join("artifact"));
        assert_eq!(manifest_sha(&out), manifest_sha(&src));
    }

    // A component one byte short: verification refuses before any upload.
    let comp = manifest_json(&src)["components"][0]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = src.join("artifact").join(&comp);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let o = run(m
        .ftpipe(home)
        .arg("publish")
        .arg(&src)
        .arg("s3://models/unverified"));
    assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
    assert_names(&stderr(&o), &[comp.as_str()]);
    assert!(
        m.keys("unverified/").is_empty(),
        "{:?}",
        m.keys("unverified/")
    );
    // No artifact at all: refused, and DIR is not created.
    let none = tmp.path().join("nothing-here");
    let o = run(m
        .ftpipe(home)
        .arg("publish")
        .arg(&none)
        .arg("s3://models/none"));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(&stderr(&o), &["nothing to publish"]);
    assert!(!none.exists());
}

/// The largest file of `artifact`: its name and size.
pub(crate) fn largest_component(artifact: &Path) -> (String, u64) {
    std::fs::read_dir(artifact)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                p.metadata().unwrap().len(),
            )
        })
        .max_by_key(|(_, len)| *len)
        .unwrap()
}

/// Regression: `object_store`'s `with_read_timeout` (the S3 client's
/// `--read-timeout`) runs while a request's body is still being sent, so
/// a part (or a whole-object put) that took longer than the read timeout
/// to send over a slow uplink was cut ("operation timed out") although its
/// bytes kept moving, and the publish failed after its retries. Puts and
/// parts now go through a client whose stall check is the body's progress.
/// Behind a proxy that reads the largest component's upload at 128 KiB/s,
/// every 256 KiB part takes about 2 s against `--read-timeout 1`; the
/// publish succeeds and pulls byte-identical.
#[test]
fn a_part_slower_than_the_read_timeout_is_not_cut() {
    let _g = time_bounded();
    let m = Moto::start();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(home, 3851);
    let (name, largest) = largest_component(&src.join("artifact"));
    assert!(
        largest > 300 * 1024,
        "{name}: {largest} bytes, not several parts"
    );
    let upstream = m.endpoint().trim_start_matches("http://").to_owned();
    let proxy =
        crate::common::registry::ThrottledProxy::start(&upstream, 128 * 1024, &name, largest);
    let t = std::time::Instant::now();
    let o = run(m
        .ftpipe(home)
        .env("AWS_ENDPOINT_URL", format!("http://{}", proxy.host()))
        .arg("publish")
        .arg(&src)
        .arg("s3://models/slow")
        .args(["--part-size", "256KiB", "--json", "--read-timeout", "1"]));
    let o = ok(o, "publish over a slow uplink");
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(2),
        "{name} ({largest} bytes at 128 KiB/s) was not slow to send"
    );
    assert_eq!(summary(&o)["outcome"]["already_published"], false);
    let out = home.join("pulled");
    ok(pull(&m, home, "s3://models/slow", &out, &[]), "pull");
    for f in std::fs::read_dir(src.join("artifact")).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            let pulled = out.join("artifact").join(f.file_name().unwrap());
            assert!(
                std::fs::read(&f).unwrap() == std::fs::read(&pulled).unwrap(),
                "{f:?} differs"
            );
        }
    }
}
