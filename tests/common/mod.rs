//! Shared support for the end-to-end tests: a fixture hub on loopback, the
//! real `ftpipe` binary run as a subprocess, and readers of its JSON output
//! and SQLite state (a real file, opened read-only).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ftpipe_fixtures::{HubBuilder, RepoFile, RunningHub, checkpoint};

pub const REPO: &str = "acme/tiny";

/// A hub serving a generated repo of about `bytes` bytes.
pub fn hub_with_repo(seed: u64, bytes: u64) -> (RunningHub, Vec<RepoFile>) {
    hub_with(HubBuilder::new().page_size(3), seed, bytes)
}

/// Same, starting from a customised builder.
pub fn hub_with(builder: HubBuilder, seed: u64, bytes: u64) -> (RunningHub, Vec<RepoFile>) {
    let files = checkpoint::generate_small_repo(seed, bytes);
    let hub = RunningHub::start(builder.repo(REPO, files.clone())).expect("start fixture hub");
    (hub, files)
}

/// The `ftpipe` binary under test.
pub fn ftpipe() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftpipe"));
    cmd.env_remove("HF_TOKEN").env_remove("HF_ENDPOINT");
    cmd
}

/// `ftpipe fetch REPO --endpoint E --out OUT --quiet` plus fast retry settings
/// and `extra` arguments.
pub fn fetch_cmd(endpoint: &str, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = ftpipe();
    cmd.args(["fetch", REPO, "--endpoint", endpoint, "--out"])
        .arg(out)
        .args(["--quiet", "--retry-base-ms", "20"])
        .args(extra);
    cmd
}

/// Runs a command and returns its output (stdout, stderr, status).
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn ftpipe")
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `ftpipe audit --out OUT --json [--deep]`, parsed.
pub fn audit_json(out: &Path, deep: bool) -> serde_json::Value {
    let mut cmd = ftpipe();
    cmd.args(["audit", "--json", "--out"]).arg(out);
    if deep {
        cmd.arg("--deep");
    }
    let o = run(&mut cmd);
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("audit output is not JSON ({e}): {}", stderr(&o)))
}

/// Asserts every published file equals the hub's bytes.
pub fn assert_files_match(out: &Path, files: &[RepoFile]) {
    for f in files {
        let want = checkpoint::content_bytes(f).expect("fixture bytes");
        let got = std::fs::read(out.join("source").join(&f.path))
            .unwrap_or_else(|e| panic!("{} missing: {e}", f.path));
        assert!(
            got == want.as_ref(),
            "{} differs from the hub's bytes",
            f.path
        );
    }
}

/// Files under `dir` ending in `.part`.
pub fn part_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".part") {
                out.push(p);
            }
        }
    }
    out
}

/// Runs `sql` against the state database and returns the first column of
/// every row as text (read-only connection to the real file).
pub fn query(out: &Path, sql: &str) -> Vec<String> {
    use sqlx::{Connection, Row};
    let db = out.join(".ftpipe/state.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .read_only(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&opts)
            .await
            .expect("open state db");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(&mut conn)
            .await
            .expect("query");
        rows.iter()
            .map(|r| {
                r.try_get::<String, _>(0)
                    .or_else(|_| r.try_get::<i64, _>(0).map(|v| v.to_string()))
                    .unwrap_or_default()
            })
            .collect()
    })
}

/// The audit is clean and the ledger adds up for every file.
pub fn assert_clean_audit(out: &Path) {
    let a = audit_json(out, true);
    assert_eq!(a["ok"], true, "audit not ok: {a:#}");
    assert_eq!(a["reconciliation_error"], 0, "{a:#}");
    assert_eq!(a["expected_bytes"], a["committed_bytes"], "{a:#}");
    for f in a["files"].as_array().unwrap() {
        assert_eq!(f["verified"], true, "{f}");
        assert_eq!(f["committed_bytes"], f["expected_bytes"], "{f}");
        let t = f["transferred_bytes"].as_u64().unwrap();
        let c = f["committed_bytes"].as_u64().unwrap();
        let d = f["discarded_bytes"].as_u64().unwrap();
        assert_eq!(t, c + d, "transferred != committed + discarded: {f}");
    }
    assert_eq!(query(out, "PRAGMA integrity_check"), ["ok"]);
    assert!(
        part_files(&out.join("source")).is_empty(),
        "temp files left"
    );
}
