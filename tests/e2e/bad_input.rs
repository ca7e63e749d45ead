//! End-to-end: hostile or inconsistent input (listings, JSON, sizes, files
//! already on disk) ends in a clear error naming the culprit, with nothing
//! written outside the output directory and nothing wrong published; and
//! what is on disk is reconciled with the database before any byte moves.
//!
//! Listings the fixture hub refuses to produce are served by a tiny raw
//! HTTP/1.1 server on loopback ([`RawServer`]).

use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::{RepoFile, checkpoint};
use serde_json::json;

/// A raw hub serving `tree` (the JSON of the one tree page) at [`RAW_COMMIT`],
/// and `body(path)` for resolve requests.
fn raw_hub<F>(max_conns: usize, tree: String, body: F) -> RawServer
where
    F: Fn(&str) -> RawResponse + Send + 'static,
{
    RawServer::start(max_conns, move |target| {
        if target.starts_with(&format!("/api/models/{REPO}/revision/")) {
            RawResponse::new(200, json!({ "sha": RAW_COMMIT }).to_string())
                .header("Content-Type", "application/json")
        } else if target.starts_with(&format!("/api/models/{REPO}/tree/{RAW_COMMIT}")) {
            RawResponse::new(200, tree.clone()).header("Content-Type", "application/json")
        } else if let Some(p) = target.strip_prefix(&format!("/{REPO}/resolve/{RAW_COMMIT}/")) {
            body(p)
        } else {
            RawResponse::new(404, "nope")
        }
    })
}

/// The tree JSON of one LFS file `path` whose listing claims `size` bytes
/// with SHA-256 of `content`.
fn lfs_tree(path: &str, size: u64, content: &[u8]) -> String {
    json!([{
        "type": "file", "path": path, "oid": RAW_OID, "size": size,
        "lfs": { "oid": sha256_hex(content), "size": size, "pointerSize": 130 }
    }])
    .to_string()
}

fn fetch_raw(srv: &RawServer, out: &Path, extra: &[&str]) -> std::process::Output {
    run(&mut fetch_cmd(&srv.endpoint, out, extra))
}

fn assert_fails_naming(o: &std::process::Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn hostile_listing_paths_are_refused_before_any_write() {
    for (i, bad) in [
        "../x",
        "/etc/passwd",
        "a\\b",
        "a\0b",
        ".ftpipe/state.db",
        "sub/../../x",
        "x.part",
    ]
    .into_iter()
    .enumerate()
    {
        let tree = json!([
            { "type": "file", "path": "ok.json", "oid": RAW_OID, "size": 5 },
            { "type": "file", "path": bad, "oid": RAW_OID, "size": 5 },
        ])
        .to_string();
        let srv = raw_hub(4, tree, |_| RawResponse::new(200, "hello"));
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("deep/out");
        let o = fetch_raw(&srv, &out, &[]);
        let shown = format!("{bad:?}");
        assert_fails_naming(&o, &["unsafe path", &shown]);
        // Nothing but the state directory was created, and no body was asked for.
        let tree = tree_of(dir.path());
        assert!(
            tree.iter()
                .all(|p| p == "deep" || p == "deep/out" || p.starts_with("deep/out/.ftpipe")),
            "case {i} {bad:?} wrote {tree:?}"
        );
        assert!(
            srv.targets().iter().all(|t| !t.contains("/resolve/")),
            "{:?}",
            srv.targets()
        );
        // The listing was not stored: the database is intact and unpinned.
        assert_eq!(query(&out, "PRAGMA integrity_check"), ["ok"]);
        assert_eq!(query(&out, "SELECT COUNT(*) FROM files"), ["0"]);
    }
}

#[test]
fn symlink_already_in_source_pointing_outside_is_refused() {
    let files = vec![
        RepoFile::bytes("config.json", b"{\"a\": 1}\n".to_vec()),
        RepoFile::bytes("sub/weights.json", b"[1, 2, 3]\n".to_vec()),
    ];
    let hub = hub_serving(files);

    // A directory symlink on the path of a listed file.
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("source")).unwrap();
    std::os::unix::fs::symlink(outside.path(), out.join("source/sub")).unwrap();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_fails_naming(&o, &["\"sub/weights.json\"", "symlink"]);
    assert!(tree_of(outside.path()).is_empty(), "wrote outside");

    // A file symlink in place of a listed file.
    let dir = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("source")).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("source/config.json")).unwrap();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_fails_naming(&o, &["\"config.json\"", "symlink"]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(tree_of(outside.path()), ["victim"]);
    assert!(
        body_gets(&hub, "config.json").is_empty(),
        "no body may be fetched"
    );
}

#[test]
fn oversized_json_is_refused() {
    // Revision info that claims 100 MB (over MAX_JSON_BYTES = 64 MiB).
    let srv = RawServer::start(2, |_| {
        RawResponse::new(200, "{").header("Content-Length", "100000000")
    });
    let dir = tempfile::tempdir().unwrap();
    let o = fetch_raw(&srv, &dir.path().join("out"), &[]);
    assert_fails_naming(
        &o,
        &["exceeds the limit of 67108864 bytes", "/revision/main"],
    );

    // A tree page that streams past the limit without a Content-Length.
    let srv = RawServer::start(4, |t| {
        if t.contains("/revision/") {
            RawResponse::new(200, json!({ "sha": RAW_COMMIT }).to_string())
        } else {
            // HTTP/1.0-style close-delimited body of 65 MiB.
            let mut body = b"[".to_vec();
            body.resize(65 << 20, b' ');
            let mut r = RawResponse::new(200, body);
            r.headers.push(("Content-Length".into(), String::new()));
            r
        }
    });
    let o = fetch_raw(&srv, &dir.path().join("out2"), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("exceeds the limit"), "{err}");
    assert!(err.contains("/tree/"), "{err}");
}

#[test]
fn malformed_json_is_refused_clearly() {
    let cases: Vec<(&str, String, String, &str)> = vec![
        (
            "truncated revision",
            "{\"sha\": ".into(),
            "[]".into(),
            "malformed JSON",
        ),
        (
            "sha not a commit",
            json!({ "sha": "main" }).to_string(),
            "[]".into(),
            "not a 40-hex commit",
        ),
        (
            "truncated tree",
            json!({ "sha": RAW_COMMIT }).to_string(),
            "[{\"type\":\"file\",\"path\":\"a.json\"".into(),
            "malformed JSON",
        ),
        (
            "tree not an array",
            json!({ "sha": RAW_COMMIT }).to_string(),
            json!({ "files": [] }).to_string(),
            "malformed JSON",
        ),
        (
            "bad git oid",
            json!({ "sha": RAW_COMMIT }).to_string(),
            json!([{ "type": "file", "path": "a.json", "oid": "xyz", "size": 1 }]).to_string(),
            "\"a.json\": oid \"xyz\" is not a 40-hex git blob id",
        ),
        (
            "lfs size disagrees",
            json!({ "sha": RAW_COMMIT }).to_string(),
            json!([{ "type": "file", "path": "w.safetensors", "oid": RAW_OID, "size": 10,
                     "lfs": { "oid": "a".repeat(64), "size": 11 } }])
            .to_string(),
            "\"w.safetensors\": lfs.size 11 differs from size 10",
        ),
        (
            "negative size",
            json!({ "sha": RAW_COMMIT }).to_string(),
            json!([{ "type": "file", "path": "a.json", "oid": RAW_OID, "size": -1 }]).to_string(),
            "listing entry \"a.json\": size -1 is not an unsigned 64-bit integer",
        ),
    ];
    for (name, rev, tree, want) in cases {
        let srv = RawServer::start(3, move |t| {
            if t.contains("/revision/") {
                RawResponse::new(200, rev.clone())
            } else {
                RawResponse::new(200, tree.clone())
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let o = fetch_raw(&srv, &out, &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(want), "{name}: want {want:?} in {err}");
        assert!(!out.join("source").exists(), "{name}: source created");
    }
}

/// The listing says 100 bytes; the server sends 90 (and says so in
/// `Content-Length`): a size error naming the file, nothing published.
#[test]
fn served_size_disagreeing_with_listing_is_a_size_error() {
    let content = vec![7u8; 100];
    let tree = lfs_tree("w.safetensors", 100, &content);
    let srv = raw_hub(8, tree, |_| RawResponse::new(200, vec![7u8; 90]));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fetch_raw(&srv, &out, &["--retries", "1"]);
    assert_fails_naming(&o, &["w.safetensors", "Content-Length", "\"90\"", "100"]);
    assert!(!out.join("source/w.safetensors").exists());
    assert!(!has_receipt(&out, "w.safetensors"));
    let l = ledger(&out, "w.safetensors");
    assert_eq!((l.committed, l.transferred), (0, 0));
}

/// Right length, wrong bytes: a digest error naming the file, after one refetch.
#[test]
fn served_bytes_disagreeing_with_listing_digest_fail() {
    let content = vec![7u8; 100];
    let tree = lfs_tree("w.safetensors", 100, &content);
    let srv = raw_hub(8, tree, |_| RawResponse::new(200, vec![8u8; 100]));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fetch_raw(&srv, &out, &[]);
    assert_fails_naming(&o, &["w.safetensors", "sha256 digest mismatch"]);
    assert!(!out.join("source/w.safetensors").exists());
    assert_eq!(
        discards(&out, "w.safetensors"),
        ["digest_mismatch:100", "digest_mismatch:100"]
    );
    assert_eq!(
        attempt_outcomes(&out, "w.safetensors"),
        ["failed", "failed"]
    );
    let l = ledger(&out, "w.safetensors");
    assert_eq!(l.transferred, l.committed + l.discarded);
}

/// `X-Linked-Size` disagreeing with the pinned listing: refused at once
/// (the hub's own metadata will not change on a retry; this used to be
/// retried with backoff as a transient `BadHeader`).
#[test]
fn x_linked_size_disagreeing_is_refused_without_retries() {
    let content = vec![7u8; 100];
    let tree = lfs_tree("w.safetensors", 100, &content);
    let body = content.clone();
    let srv = raw_hub(8, tree, move |_| {
        RawResponse::new(200, body.clone()).header("X-Linked-Size", "4096")
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fetch_raw(&srv, &out, &[]);
    assert_fails_naming(
        &o,
        &[
            "w.safetensors",
            "X-Linked-Size",
            "\"4096\"",
            "size mismatch",
        ],
    );
    assert!(!out.join("source/w.safetensors").exists());
    let resolves = srv
        .targets()
        .iter()
        .filter(|t| t.contains("/resolve/"))
        .count();
    assert_eq!(resolves, 1, "{:?}", srv.targets());
    assert_eq!(attempt_outcomes(&out, "w.safetensors"), ["failed"]);
}

#[test]
fn conflicting_file_on_disk_stops_before_any_cleanup() {
    let (hub, files) = hub_with_repo(31, 1 << 20);
    let dir = tempfile::tempdir().unwrap();

    // Fresh directory: a foreign config.json of the right size, wrong bytes.
    let out = dir.path().join("fresh");
    let cfg =
        checkpoint::content_bytes(files.iter().find(|f| f.path == "config.json").unwrap()).unwrap();
    let foreign = vec![b' '; cfg.len()];
    std::fs::create_dir_all(out.join("source")).unwrap();
    std::fs::write(out.join("source/config.json"), &foreign).unwrap();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_fails_naming(&o, &["config.json", "conflicts with the pinned identity"]);
    assert_eq!(
        std::fs::read(out.join("source/config.json")).unwrap(),
        foreign
    );
    assert!(
        hub.requests().iter().all(|r| !r.path.contains("/resolve/")),
        "no byte may move before the conflict is resolved"
    );

    // After a clean fetch: a published file grows on disk, and a stale
    // `.part` of another published file lies around.
    let out = dir.path().join("done");
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let mut grown = cfg.to_vec();
    grown.push(b'\n');
    std::fs::write(out.join("source/config.json"), &grown).unwrap();
    std::fs::write(out.join("source/README.md.part"), b"stale").unwrap();
    hub.clear_requests();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_fails_naming(&o, &["config.json", "conflicts with the pinned identity"]);
    assert_eq!(
        std::fs::read(out.join("source/config.json")).unwrap(),
        grown
    );
    assert!(
        out.join("source/README.md.part").exists(),
        "cleanup ran before the conflict check"
    );
    assert!(hub.requests().iter().all(|r| !r.path.contains("/resolve/")));
}

#[test]
fn correct_file_without_receipt_is_adopted() {
    let (hub, files) = hub_with_repo(32, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let lfs = lfs_file(&files).clone();
    std::fs::create_dir_all(out.join("source")).unwrap();
    for f in files
        .iter()
        .filter(|f| f.path == "config.json" || f.path == lfs.path)
    {
        std::fs::write(
            out.join("source").join(&f.path),
            checkpoint::content_bytes(f).unwrap(),
        )
        .unwrap();
    }
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("adopted"), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_audit_ok_with_adoption(&out);
    for p in ["config.json", lfs.path.as_str()] {
        assert!(body_gets(&hub, p).is_empty(), "{p} was downloaded again");
        let l = ledger(&out, p);
        assert_eq!((l.committed, l.transferred), (0, 0), "{p}");
        assert_eq!(l.adopted, l.expected, "{p}");
        assert_eq!(
            query(
                &out,
                &format!("SELECT adopted FROM receipts WHERE path = {}", sql_str(p))
            ),
            ["1"]
        );
    }
}

#[test]
fn receipt_without_its_file_is_refetched() {
    let (hub, files) = hub_with_repo(33, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let lfs = lfs_file(&files).clone();
    let sizes: Vec<(String, u64)> = ["config.json", lfs.path.as_str()]
        .iter()
        .map(|p| {
            let len = std::fs::metadata(out.join("source").join(p)).unwrap().len();
            std::fs::remove_file(out.join("source").join(p)).unwrap();
            (p.to_string(), len)
        })
        .collect();
    hub.clear_requests();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    for (p, size) in sizes {
        assert_eq!(
            discards(&out, &p),
            [format!("published_file_missing:{size}")]
        );
        let l = ledger(&out, &p);
        assert_eq!((l.committed, l.transferred), (size, 2 * size));
        assert_eq!(body_gets(&hub, &p).len(), 1, "{p}");
    }
    // Untouched files were not downloaded again.
    assert!(body_gets(&hub, "README.md").is_empty());
}

// A repo id like `../../../etc` was sent as a path (it stayed on the
// endpoint's origin, but was never validated), and `--read-timeout 0` failed
// only later with "error sending request". Both are refused when the command
// line is parsed: exit 2, the rule or the allowed range named, no request
// made and nothing created.
#[test]
fn invalid_names_and_impossible_values_are_refused_at_parse_time() {
    let srv = RawServer::start(100, |_| RawResponse::new(500, "no request expected"));
    let cases: &[(&[&str], &str)] = &[
        (&["fetch", "../../../etc"], "'--' and '..' are forbidden"),
        (&["fetch", "a/b/c"], "at most one '/'"),
        (&["fetch", "x/y-"], "must start and end"),
        (&["fetch", "acme/t?x"], "only letters, digits"),
        (&["run", &"a".repeat(97)], "longer than 96 bytes"),
        (
            &["plan", "acme/tiny", "--remote", "--revision", "../main"],
            "invalid revision",
        ),
        (
            &["fetch", "acme/tiny", "--revision", "a b"],
            "invalid revision",
        ),
        (
            &["fetch", "acme/tiny", "--read-timeout", "0"],
            "between 0.1 and 3600 seconds",
        ),
        (
            &["fetch", "acme/tiny", "--read-timeout", "nan"],
            "between 0.1 and 3600 seconds",
        ),
        (&["fetch", "acme/tiny", "--jobs", "0"], "1..=64"),
        (&["fetch", "acme/tiny", "--retries", "1000"], "0..=100"),
        (
            &["fetch", "acme/tiny", "--checkpoint-secs=-1"],
            "between 0.01 and 3600",
        ),
        (
            &["fetch", "acme/tiny", "--stall-secs", "0"],
            "between 0.1 and 3600",
        ),
        (&["fetch", "acme/tiny", "--retry-base-ms", "0"], "1..=60000"),
        (&["fetch", "acme/tiny", "--checkpoint-bytes", "0"], "1.."),
        (&["convert", "--jobs", "0"], "1..=64"),
    ];
    for (args, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut cmd = ftpipe();
        cmd.args(*args);
        if args[0] != "convert" {
            cmd.args(["--endpoint", &srv.endpoint]);
        }
        let o = run(cmd.arg("--out").arg(&out));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
        assert!(!out.exists(), "{args:?}: {} created", out.display());
    }
    assert!(
        srv.targets().is_empty(),
        "requests made: {:?}",
        srv.targets()
    );
}
