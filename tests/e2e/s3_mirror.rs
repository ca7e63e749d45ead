//! A checkpoint mirrored into object storage (moto on loopback) and read
//! back as from the hub: `ftpipe mirror` of a fetched DIR writes the files
//! and `listing.json`; `run --endpoint s3://…` from the mirror builds the
//! same manifest (SHA-256) as `run` from the hub, and `plan --remote`
//! plans from it; a mirror with one wrong file is refused naming that file,
//! and a hostile listing naming its key and JSON path.

use crate::common::s3::*;
use crate::common::*;
use crate::s3::built;

#[test]
fn a_run_from_a_mirror_builds_the_hubs_manifest_and_a_wrong_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 321);
    let m = Moto::start();
    let mirror = "s3://models/mirrors/tiny";
    let o = run(m.ftpipe(home).arg("mirror").arg(&src).arg(mirror).args([
        "--part-size",
        PART_SIZE,
        "--json",
    ]));
    assert!(o.status.success(), "mirror: {}", stderr(&o));
    assert_eq!(
        query(
            &src,
            "SELECT COUNT(*) FROM uploads WHERE state <> 'verified'"
        ),
        ["0"]
    );
    // Again: a no-op.
    let o = run(m
        .ftpipe(home)
        .arg("mirror")
        .arg(&src)
        .arg(mirror)
        .arg("--json"));
    assert!(o.status.success(), "{}", stderr(&o));
    let s = json_events(&o, "summary").pop().unwrap();
    assert_eq!(s["outcome"]["already_mirrored"], true, "{s}");

    // `run` from the mirror (no hub anywhere): the hub's manifest.
    let out = tmp.path().join("from-mirror");
    let o = run(m
        .ftpipe(home)
        .args(["run", REPO, "--endpoint", mirror, "--out"])
        .arg(&out)
        .args(["--retry-base-ms", "20"]));
    assert!(o.status.success(), "run from the mirror: {}", stderr(&o));
    assert_eq!(manifest_sha(&out), manifest_sha(&src));
    assert_eq!(
        query(&out, "SELECT commit_sha FROM pin"),
        query(&src, "SELECT commit_sha FROM pin")
    );
    // `plan --remote` from the mirror: headers only.
    let o = run(m
        .ftpipe(home)
        .args([
            "plan",
            REPO,
            "--remote",
            "--json",
            "--endpoint",
            mirror,
            "--out",
        ])
        .arg(tmp.path().join("plan-only")));
    assert!(o.status.success(), "plan from the mirror: {}", stderr(&o));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(plan["total_bytes"].as_u64().unwrap() > 0, "{plan}");

    // One wrong file, same size: refused by its identity, named.
    let commit = query(&src, "SELECT commit_sha FROM pin").remove(0);
    let lfs = query(
        &src,
        "SELECT path FROM files WHERE lfs_sha256 IS NOT NULL ORDER BY size DESC LIMIT 1",
    )
    .remove(0);
    let key = format!("mirrors/tiny/{commit}/{lfs}");
    let mut bytes = m.get_object(&key).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    m.put_object(&key, &bytes);
    let out2 = tmp.path().join("wrong-file");
    let o = run(m
        .ftpipe(home)
        .args(["fetch", REPO, "--endpoint", mirror, "--out"])
        .arg(&out2)
        .args(["--retry-base-ms", "20"]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(&stderr(&o), &[lfs.as_str(), "digest mismatch"]);
    assert!(
        !out2.join("source").join(&lfs).exists(),
        "a wrong file was published"
    );
    // Every other file was fetched and verified.
    let published = query(&out2, "SELECT COUNT(*) FROM receipts").remove(0);
    let listed = query(&src, "SELECT COUNT(*) FROM files").remove(0);
    assert_eq!(
        published.parse::<u64>().unwrap() + 1,
        listed.parse::<u64>().unwrap()
    );

    // --s3-endpoint without a mirror is refused, not ignored.
    let o = run(m
        .ftpipe(home)
        .args([
            "fetch",
            REPO,
            "--endpoint",
            "http://127.0.0.1:9",
            "--s3-endpoint",
        ])
        .arg(m.endpoint())
        .arg("--out")
        .arg(tmp.path().join("not-a-mirror")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(&stderr(&o), &["--s3-endpoint applies only to a mirror"]);

    // A hostile listing: refused naming its key and JSON path.
    let mut listing: serde_json::Value =
        serde_json::from_slice(&m.get_object("mirrors/tiny/listing.json").unwrap()).unwrap();
    listing["files"][0]["path"] = "../../etc/passwd".into();
    m.put_object(
        "mirrors/evil/listing.json",
        &serde_json::to_vec(&listing).unwrap(),
    );
    let o = run(m
        .ftpipe(home)
        .args([
            "fetch",
            REPO,
            "--endpoint",
            "s3://models/mirrors/evil",
            "--out",
        ])
        .arg(tmp.path().join("evil")));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &["s3://models/mirrors/evil/listing.json", "files[0].path"],
    );

    // A listing holding the session token ftpipe sent, `\u`-escaped in a
    // path (it would be stored and become a file name): refused, never
    // stored or printed.
    listing["files"][0]["path"] = format!("x/{SESSION_TOKEN}.safetensors").into();
    let text = serde_json::to_string(&listing).unwrap().replacen(
        SESSION_TOKEN,
        &format!(
            "\\u{:04x}{}",
            SESSION_TOKEN.as_bytes()[0],
            &SESSION_TOKEN[1..]
        ),
        1,
    );
    assert!(!text.contains(SESSION_TOKEN));
    m.put_object("mirrors/echo/listing.json", text.as_bytes());
    let out = tmp.path().join("echo");
    let o = run(m
        .ftpipe(home)
        .args([
            "fetch",
            REPO,
            "--endpoint",
            "s3://models/mirrors/echo",
            "--out",
        ])
        .arg(&out));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &["s3://models/mirrors/echo/listing.json", "credential"],
    );
    assert!(!stderr(&o).contains(SESSION_TOKEN), "{}", stderr(&o));
    assert!(
        try_query(&out, "SELECT path FROM files")
            .unwrap_or_default()
            .is_empty()
    );
}

/// `ftpipe mirror REPO s3://… --out DIR` fetches the pinned repo into DIR
/// (as `fetch` does) and mirrors it in one command; `run` from that mirror
/// builds the hub run's manifest. A REPO without --out, and --out with a
/// DIR, are refused naming the fix.
#[test]
fn mirror_straight_from_a_hub_repo_fetches_then_mirrors() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let hub = qwen4_hub(323, crate::s3::shape());
    let reference = tmp.path().join("reference");
    run_ok(&mut run_cmd(&hub.endpoint(), &reference, &[]));
    let m = Moto::start();
    let mirror = "s3://models/mirrors/direct";
    let fetched = tmp.path().join("fetched");
    let o = run(m
        .ftpipe(home)
        .args(["mirror", REPO, mirror, "--endpoint"])
        .arg(hub.endpoint())
        .arg("--out")
        .arg(&fetched)
        .args(["--part-size", PART_SIZE, "--json"]));
    assert!(o.status.success(), "mirror REPO: {}", stderr(&o));
    assert!(has_receipt(&fetched, "config.json"));
    let out = tmp.path().join("from-mirror");
    let o = run(m
        .ftpipe(home)
        .args(["run", REPO, "--endpoint", mirror, "--out"])
        .arg(&out)
        .args(["--retry-base-ms", "20"]));
    assert!(o.status.success(), "run from the mirror: {}", stderr(&o));
    assert_eq!(manifest_sha(&out), manifest_sha(&reference));

    let o = run(m.ftpipe(home).args(["mirror", REPO, mirror]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--out DIR"), "{}", stderr(&o));
    let o = run(m
        .ftpipe(home)
        .arg("mirror")
        .arg(&fetched)
        .arg(mirror)
        .arg("--out")
        .arg(&out));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--out applies only to a hub REPO"),
        "{}",
        stderr(&o)
    );

    // A git-stored file changed since it was fetched is refused by its
    // blob id (hashed in the same read as its SHA-256), nothing mirrored.
    let config = fetched.join("source").join("config.json");
    let mut bytes = std::fs::read(&config).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x20;
    std::fs::write(&config, bytes).unwrap();
    let o = run(m
        .ftpipe(home)
        .arg("mirror")
        .arg(&fetched)
        .arg("s3://models/mirrors/changed"));
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &["config.json", "git blob id", "changed since it was fetched"],
    );
}
