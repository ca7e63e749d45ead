//! Shared support for the end-to-end tests: a fixture hub on loopback, the
//! real `ftpipe` binary run as a subprocess, and readers of its JSON output
//! and SQLite state (a real file, opened read-only).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ftpipe_fixtures::{HubBuilder, RepoFile, RunningHub, checkpoint};

pub mod lying_proxy;
pub mod registry;
pub mod s3;
pub mod xet;

pub const REPO: &str = "acme/tiny";

/// A hub serving `files` as `REPO`.
pub fn hub_serving(files: Vec<RepoFile>) -> RunningHub {
    RunningHub::start(HubBuilder::new().repo(REPO, files)).expect("start fixture hub")
}

/// A hub serving a generated qwen4_exp checkpoint of this shape as `REPO`.
pub fn qwen4_hub(seed: u64, shape: ftpipe_fixtures::qwen4::QwenShape) -> RunningHub {
    hub_serving(ftpipe_fixtures::qwen4::generate_qwen4_repo(seed, shape))
}

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

/// A 2 MiB repo (two ~1 MiB LFS shards plus small JSON files) on a hub, and
/// a fresh directory for the output.
pub fn hub_2mib_and_tempdir(seed: u64) -> (RunningHub, Vec<RepoFile>, tempfile::TempDir) {
    let (hub, files) = hub_with_repo(seed, 2 << 20);
    (hub, files, tempfile::tempdir().unwrap())
}

/// Length of a repo file's content.
pub fn content_len(f: &RepoFile) -> u64 {
    checkpoint::content_bytes(f).expect("fixture bytes").len() as u64
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Asserts `err` contains every one of `needles`.
pub fn assert_names(err: &str, needles: &[&str]) {
    for n in needles {
        assert!(err.contains(n), "{n:?} not in:\n{err}");
    }
}

/// Heavy tests hold it for writing, time-bounded tests for reading (see
/// [`heavy`], [`time_bounded`] and the rule in main.rs).
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held for the whole of a heavy test (a kill or power-cut storm timed
/// against its own calibration, an external server or client): no other
/// heavy test and no [`time_bounded`] test runs meanwhile, as when each
/// had a test binary of its own. A test that failed holding it does not
/// block the rest (poisoning is ignored: the lock guards no data).
pub fn heavy() -> std::sync::RwLockWriteGuard<'static, ()> {
    MACHINE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Held for the whole of a test with a tight wall-clock bound: it runs
/// beside light and other time-bounded tests, never beside a [`heavy`] one.
pub fn time_bounded() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A home for huggingface_hub settings that never exists: the tests do
/// not see the developer's cache, token or offline switch.
pub const NO_HF_HOME: &str = "/nonexistent/ftpipe-tests/hf-home";

/// The `ftpipe` binary under test, with no Hugging Face token, cache or
/// offline setting inherited from the environment.
pub fn ftpipe() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftpipe"));
    for var in [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_CACHE",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "XDG_CACHE_HOME",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HF_HOME", NO_HF_HOME);
    cmd
}

/// `ftpipe SUBCOMMAND REPO --endpoint E --out OUT` plus fast retry
/// settings and `extra` arguments.
fn repo_cmd(subcommand: &str, endpoint: &str, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = ftpipe();
    cmd.args([subcommand, REPO, "--endpoint", endpoint, "--out"])
        .arg(out)
        .args(["--retry-base-ms", "20"])
        .args(extra);
    cmd
}

/// `ftpipe fetch REPO --endpoint E --out OUT` (see [`repo_cmd`]).
pub fn fetch_cmd(endpoint: &str, out: &Path, extra: &[&str]) -> Command {
    repo_cmd("fetch", endpoint, out, extra)
}

/// `ftpipe run REPO --endpoint E --out OUT` (see [`repo_cmd`]).
pub fn run_cmd(endpoint: &str, out: &Path, extra: &[&str]) -> Command {
    repo_cmd("run", endpoint, out, extra)
}

/// Runs a command and returns its output (stdout, stderr, status).
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn ftpipe")
}

/// The `--json` events named `event` on a command's stdout.
pub fn json_events(o: &Output, event: &str) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("not a JSON event ({e}): {l}"))
        })
        .filter(|v| v["event"] == event)
        .collect()
}

/// Whether the filesystem of `dir` (created) takes `O_DIRECT` writes,
/// asked the way ftpipe asks it.
pub fn takes_direct_io(dir: &Path) -> bool {
    use ftpipe_fs::direct::{Bounce, DirectFile, IoMode};
    std::fs::create_dir_all(dir).unwrap();
    let probe = dir.join(".direct-io-probe");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .unwrap();
    let file = DirectFile::new(file, IoMode::Direct);
    let mut bounce = Bounce::new(1 << 16);
    // A refusal shows at the first aligned write (EINVAL), not always at open.
    file.write_all_at(&mut bounce, [&[7u8; 1 << 16][..]], 1 << 16, 0)
        .unwrap();
    let direct = file.mode() == IoMode::Direct;
    drop(file);
    std::fs::remove_file(&probe).unwrap();
    direct
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

/// The line of repo file `path` in an audit's `files`.
pub fn audit_line<'a>(audit: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    audit["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no audit line for {path}"))
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
    tree_of(dir)
        .into_iter()
        .filter(|p| p.ends_with(".part"))
        .map(|p| dir.join(p))
        .collect()
}

/// Runs `sql` against the state database and returns the first column of
/// every row as text (read-only connection to the real file).
pub fn query(out: &Path, sql: &str) -> Vec<String> {
    try_query(out, sql).unwrap_or_else(|e| panic!("query {sql:?}: {e}"))
}

/// Like [`query`], but returns the error (e.g. `SQLITE_READONLY_ROLLBACK`
/// when a process was killed mid-transaction in rollback-journal mode, which
/// a read-only connection cannot recover).
pub fn try_query(out: &Path, sql: &str) -> Result<Vec<String>, String> {
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
            .map_err(|e| format!("open state db: {e}"))?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows
            .iter()
            .map(|r| {
                r.try_get::<String, _>(0)
                    .or_else(|_| r.try_get::<i64, _>(0).map(|v| v.to_string()))
                    .unwrap_or_default()
            })
            .collect())
    })
}

/// The deep audit is clean and the ledger adds up for every file
/// (`transferred + cache = committed + discarded`); returns the audit.
pub fn assert_clean_audit(out: &Path) -> serde_json::Value {
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
        let cache = f["cache_bytes"].as_u64().unwrap();
        assert_eq!(
            t + cache,
            c + d,
            "transferred + cache != committed + discarded: {f}"
        );
    }
    assert_eq!(query(out, "PRAGMA integrity_check"), ["ok"]);
    assert!(
        part_files(&out.join("source")).is_empty(),
        "temp files left"
    );
    a
}

/// One ledger row with its discard total and whether a receipt exists, read
/// from the state database (read-only). Empty when the database or its
/// tables do not exist yet (a process killed before migrating).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSnap {
    pub path: String,
    pub expected: u64,
    pub committed: u64,
    pub transferred: u64,
    pub adopted: u64,
    pub discarded: u64,
    pub receipt: bool,
}

/// Every ledger row (see [`LedgerSnap`]).
pub fn ledger_snapshot(out: &Path) -> Vec<LedgerSnap> {
    try_ledger_snapshot(out).unwrap_or_else(|e| panic!("ledger snapshot: {e}"))
}

/// The committed (durable) bytes of `path` in `out`'s ledger; 0 while
/// the ledger cannot be read (not yet created, or mid-creation).
pub fn committed_bytes(out: &Path, path: &str) -> u64 {
    try_ledger_snapshot(out)
        .ok()
        .and_then(|rows| rows.into_iter().find(|r| r.path == path))
        .map_or(0, |r| r.committed)
}

/// Like [`ledger_snapshot`], but returns the error of the read-only query.
pub fn try_ledger_snapshot(out: &Path) -> Result<Vec<LedgerSnap>, String> {
    if !out.join(".ftpipe/state.db").is_file()
        || try_query(
            out,
            "SELECT count(*) FROM sqlite_master WHERE name IN ('ledger', 'receipts', 'discards')",
        )? != ["3"]
    {
        return Ok(Vec::new());
    }
    let rows = try_query(
        out,
        "SELECT l.path || '|' || l.expected_bytes || '|' || l.committed_bytes || '|' ||
                l.transferred_bytes || '|' || l.adopted_bytes || '|' ||
                (SELECT COALESCE(SUM(bytes), 0) FROM discards d WHERE d.path = l.path) || '|' ||
                EXISTS (SELECT 1 FROM receipts r WHERE r.path = l.path)
         FROM ledger l ORDER BY l.path",
    )?;
    Ok(rows
        .iter()
        .map(|row| {
            let v: Vec<&str> = row.rsplitn(7, '|').collect();
            let n = |i: usize| v[i].parse::<u64>().expect("ledger number");
            LedgerSnap {
                path: v[6].to_owned(),
                expected: n(5),
                committed: n(4),
                transferred: n(3),
                adopted: n(2),
                discarded: n(1),
                receipt: v[0] == "1",
            }
        })
        .collect())
}

/// `DIR/source/<path>.part`, where repo file `path` is downloaded.
pub fn part_path(out: &Path, path: &str) -> PathBuf {
    let mut part = out.join("source").join(path).into_os_string();
    part.push(".part");
    part.into()
}

/// Length of the file's bytes on disk for the durability invariant: the
/// `.part` if present, else the final file, else 0.
pub fn on_disk_len(out: &Path, path: &str) -> u64 {
    std::fs::metadata(part_path(out, path))
        .or_else(|_| std::fs::metadata(out.join("source").join(path)))
        .map(|m| m.len())
        .unwrap_or(0)
}

/// Body GETs of repo file `path` in the hub's request log (served by the
/// resolve endpoint or the CDN; redirects excluded).
pub fn body_requests(hub: &RunningHub, path: &str) -> Vec<ftpipe_fixtures::RequestRecord> {
    body_gets(hub, path)
        .into_iter()
        .filter(|r| r.status == 200 || r.status == 206)
        .collect()
}

/// What one post-kill inspection saw.
#[derive(Default)]
pub struct KillState {
    /// Some file had `0 < committed < expected` or bytes past its watermark.
    pub mid_file: bool,
    pub committed: u64,
    pub published: usize,
}

/// The ledger invariants that must hold whenever no ftpipe process is
/// running (see the `crash` module for why each holds); `kill` labels failures.
pub fn check_after_kill(out: &Path, kill: &str) -> KillState {
    let rows = match try_ledger_snapshot(out) {
        Ok(rows) => rows,
        // Killed while SQLite was creating the database, before WAL was on:
        // a hot rollback journal only the next writer can roll back.
        Err(e) if out.join(".ftpipe/state.db-journal").exists() => {
            eprintln!("{kill}: database bootstrap interrupted ({e})");
            return KillState::default();
        }
        Err(e) => panic!("{kill}: cannot read the state database: {e}"),
    };
    if rows.is_empty() {
        return KillState::default(); // killed before the listing was stored
    }
    check_ledger_rows(out, &rows, kill)
}

/// The invariants of [`check_after_kill`] on `rows`, the ledger of `out`
/// read by the caller: integrity ok; per file committed ≤ bytes on disk,
/// `transferred = committed + discarded`, `committed + adopted ≤ expected`,
/// nothing adopted, and a receipt only with the whole final file. `kill`
/// labels failures.
pub fn check_ledger_rows(out: &Path, rows: &[LedgerSnap], kill: &str) -> KillState {
    let mut st = KillState::default();
    assert_eq!(
        query(out, "PRAGMA integrity_check"),
        ["ok"],
        "{kill}: integrity"
    );
    // A retired shard (last retirement row `retired`) was deleted on
    // purpose: its receipt and ledger row stay, its file does not.
    let retired = try_query(
        out,
        "SELECT path FROM source_retirements r WHERE event = 'retired'
         AND id = (SELECT MAX(id) FROM source_retirements WHERE path = r.path)",
    )
    .unwrap_or_default();
    // A shard whose PLE spans were copied aside (a live `copy_aside` row)
    // was released on purpose: its receipt stays, its copy holds the spans.
    let copied = try_query(
        out,
        "SELECT path FROM source_punches WHERE method = 'copy_aside' AND ended = 0",
    )
    .unwrap_or_default();
    for r in rows {
        let disk = on_disk_len(out, &r.path);
        if (retired.contains(&r.path) || copied.contains(&r.path)) && disk == 0 {
            assert!(r.receipt, "{kill}: {} retired without a receipt", r.path);
            st.published += 1;
            st.committed += r.committed;
            continue;
        }
        assert!(
            r.committed <= disk,
            "{kill}: ledger claims {} bytes of {} but only {disk} are on disk",
            r.committed,
            r.path
        );
        assert_eq!(
            r.transferred,
            r.committed + r.discarded,
            "{kill}: transferred != committed + discarded for {r:?}"
        );
        assert!(r.committed + r.adopted <= r.expected, "{kill}: {r:?}");
        assert_eq!(r.adopted, 0, "{kill}: our own bytes adopted: {r:?}");
        if r.receipt {
            let fin = out.join("source").join(&r.path);
            let len = std::fs::metadata(&fin)
                .unwrap_or_else(|e| panic!("{kill}: receipt without file {}: {e}", r.path))
                .len();
            assert_eq!(len, r.expected, "{kill}: {}", r.path);
        } else if (r.committed > 0 && r.committed < r.expected) || disk > r.committed {
            st.mid_file = true;
        }
        st.committed += r.committed;
        st.published += usize::from(r.receipt);
    }
    st
}

// ---------------------------------------------------------------------------
// Helpers for the fault, bad-input and security tests.

/// The first LFS shard (`*.safetensors`, served through the CDN redirect).
pub fn lfs_file(files: &[RepoFile]) -> &RepoFile {
    files
        .iter()
        .find(|f| f.path.ends_with(".safetensors"))
        .expect("repo has a safetensors shard")
}

/// Escapes `'` for an SQL string literal.
pub fn sql_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Ledger numbers of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    pub expected: u64,
    pub committed: u64,
    pub transferred: u64,
    pub adopted: u64,
    pub discarded: u64,
}

/// The ledger row of `path`, with the sum of its discards.
pub fn ledger(out: &Path, path: &str) -> Ledger {
    let p = sql_str(path);
    let row = query(
        out,
        &format!(
            "SELECT expected_bytes || ',' || committed_bytes || ',' || transferred_bytes || ',' \
             || adopted_bytes || ',' || (SELECT COALESCE(SUM(bytes), 0) FROM discards WHERE path = {p}) \
             FROM ledger WHERE path = {p}"
        ),
    );
    let v: Vec<u64> = row
        .first()
        .unwrap_or_else(|| panic!("no ledger row for {path}"))
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    Ledger {
        expected: v[0],
        committed: v[1],
        transferred: v[2],
        adopted: v[3],
        discarded: v[4],
    }
}

/// `reason:bytes` of every discard of `path`, in order.
pub fn discards(out: &Path, path: &str) -> Vec<String> {
    query(
        out,
        &format!(
            "SELECT reason || ':' || bytes FROM discards WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    )
}

/// Discard reasons of `path`, in order.
pub fn discard_reasons(out: &Path, path: &str) -> Vec<String> {
    query(
        out,
        &format!(
            "SELECT reason FROM discards WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    )
}

/// Outcomes of the attempts of `path`, in order.
pub fn attempt_outcomes(out: &Path, path: &str) -> Vec<String> {
    query(
        out,
        &format!(
            "SELECT outcome FROM attempts WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    )
}

/// Whether `path` has a receipt.
pub fn has_receipt(out: &Path, path: &str) -> bool {
    query(
        out,
        &format!(
            "SELECT COUNT(*) FROM receipts WHERE path = {}",
            sql_str(path)
        ),
    ) == ["1"]
}

/// Body GETs of repo file `path` as seen by the hub (CDN for redirected LFS
/// files, the main origin's resolve endpoint otherwise).
pub fn body_gets(hub: &RunningHub, path: &str) -> Vec<ftpipe_fixtures::RequestRecord> {
    let resolve_suffix = format!("/{path}");
    hub.requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .filter(|r| match r.origin {
            ftpipe_fixtures::Origin::Cdn => r
                .query
                .as_deref()
                .is_some_and(|q| q.split('&').any(|kv| kv == format!("path={path}"))),
            ftpipe_fixtures::Origin::Main => {
                r.path.contains("/resolve/") && r.path.ends_with(&resolve_suffix) && r.status != 302
            }
        })
        .collect()
}

/// Like [`assert_clean_audit`], but files may be adopted from disk
/// (`committed + adopted = expected`).
pub fn assert_audit_ok_with_adoption(out: &Path) {
    let a = audit_json(out, true);
    assert_eq!(a["ok"], true, "audit not ok: {a:#}");
    assert_eq!(a["reconciliation_error"], 0, "{a:#}");
    for f in a["files"].as_array().unwrap() {
        assert_eq!(f["verified"], true, "{f}");
        let e = f["expected_bytes"].as_u64().unwrap();
        let c = f["committed_bytes"].as_u64().unwrap();
        let ad = f["adopted_bytes"].as_u64().unwrap();
        let t = f["transferred_bytes"].as_u64().unwrap();
        let d = f["discarded_bytes"].as_u64().unwrap();
        assert_eq!(e, c + ad, "{f}");
        assert_eq!(t, c + d, "transferred != committed + discarded: {f}");
    }
    assert_eq!(query(out, "PRAGMA integrity_check"), ["ok"]);
    assert!(
        part_files(&out.join("source")).is_empty(),
        "temp files left"
    );
}

/// Every regular file under `dir` (relative paths), for "nothing written
/// outside" checks.
pub fn tree_of(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let ty = e.file_type().unwrap();
            if ty.is_dir() {
                stack.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

/// The commit a hand-written listing served by a [`RawServer`] is pinned to.
pub const RAW_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// The git oid of the entries of a hand-written listing.
pub const RAW_OID: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// A canned HTTP response of [`RawServer`].
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        RawResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// A tiny HTTP/1.1 server on 127.0.0.1 for listings the fixture hub refuses
/// to produce: one request per connection (`Connection: close`), at most
/// `max_conns` connections, then the thread ends. `handler` maps the
/// request target (path and query) to a canned response; a `Content-Length`
/// header is added unless the handler set one (set it to "" for a
/// close-delimited body: headers with empty values are not sent).
pub struct RawServer {
    pub endpoint: String,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl RawServer {
    pub fn start<F>(max_conns: usize, handler: F) -> RawServer
    where
        F: Fn(&str) -> RawResponse + Send + 'static,
    {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for _ in 0..max_conns {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                loop {
                    let mut h = String::new();
                    match reader.read_line(&mut h) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if h == "\r\n" || h == "\n" => break,
                        Ok(_) => log2.lock().unwrap().push(format!("{target} {}", h.trim())),
                    }
                }
                log2.lock().unwrap().push(target.clone());
                let resp = handler(&target);
                let mut head = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", resp.status);
                if !resp
                    .headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                {
                    head.push_str(&format!("Content-Length: {}\r\n", resp.body.len()));
                }
                for (k, v) in resp.headers.iter().filter(|(_, v)| !v.is_empty()) {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let mut stream = stream;
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&resp.body);
                let _ = stream.flush();
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        });
        RawServer { endpoint, log }
    }

    /// Request targets received so far.
    pub fn targets(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| !l.contains(' '))
            .cloned()
            .collect()
    }
}

/// A test whose prerequisite (root for mounts, nginx, ...) is missing skips
/// with a note locally, but fails under CI, which installs everything.
pub fn skip_unless_ci(why: &str) {
    assert!(std::env::var_os("CI").is_none(), "required in CI: {why}");
    eprintln!("SKIP: {why}");
}

/// `ftpipe convert --out OUT` plus `extra` arguments (stderr is not a
/// terminal: the line log).
pub fn convert_cmd(out: &Path, extra: &[&str]) -> Command {
    let mut cmd = ftpipe();
    cmd.args(["convert", "--out"]).arg(out).args(extra);
    cmd
}

/// Runs `cmd` with its output piped, calling `each_poll(pid)` and then
/// checking for its exit every `poll`. Kills it and fails the test if it
/// outlives `bound`; otherwise returns its output and run time.
pub fn run_watched(
    cmd: &mut Command,
    bound: std::time::Duration,
    poll: std::time::Duration,
    mut each_poll: impl FnMut(u32),
) -> (Output, std::time::Duration) {
    use std::process::Stdio;
    let t = std::time::Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ftpipe");
    loop {
        each_poll(child.id());
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), t.elapsed());
        }
        if t.elapsed() > bound {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "ftpipe still running after {bound:?}:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(poll);
    }
}

/// Runs `cmd` and asserts it exits 0, returning its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{cmd:?} failed ({:?}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    o
}

/// Hex SHA-256 of `DIR/artifact/manifest.json`.
pub fn manifest_sha(out: &Path) -> String {
    manifest_sha_in(&out.join("artifact"))
}

/// Hex SHA-256 of `manifest.json` in an artifact directory.
pub fn manifest_sha_in(artifact: &Path) -> String {
    sha256_hex(&std::fs::read(artifact.join("manifest.json")).expect("manifest.json"))
}

/// `DIR/artifact/manifest.json`, parsed.
pub fn manifest_json(out: &Path) -> serde_json::Value {
    let bytes = std::fs::read(out.join("artifact/manifest.json")).expect("manifest.json");
    serde_json::from_slice(&bytes).expect("manifest.json parses")
}

/// The crash-test seed: `FTPIPE_CRASH_SEED`, else the clock.
pub fn crash_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    match std::env::var("FTPIPE_CRASH_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .expect("FTPIPE_CRASH_SEED must be an unsigned integer"),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// Runs one write statement on the state database (to tamper with it).
pub fn sqlite_exec(out: &Path, sql: &str) {
    use sqlx::Connection;
    let db = out.join(".ftpipe/state.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let mut conn = sqlx::SqliteConnection::connect_with(&opts)
            .await
            .expect("open state db");
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .expect("execute");
    });
}

/// Copies a directory tree (regular files and directories).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Every tensor of the shards in `out/source`'s raw bytes, by name.
pub fn source_tensors(out: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut all = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(out.join("source")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let bytes = std::fs::read(&p).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for (name, view) in st.tensors() {
                all.insert(name, view.data().to_vec());
            }
        }
    }
    all
}

/// Where a resume of `path` whose watermark was `watermark` asks from: the
/// end of the tail past the watermark it kept (its line "PATH: kept …
/// (bytes WATERMARK..TO)", a source that proves such tails: Xet), else the
/// watermark.
pub fn resume_point(stderr: &str, path: &str, watermark: u64) -> u64 {
    let from = format!("(bytes {watermark}..");
    stderr
        .lines()
        .filter(|l| l.starts_with(&format!("{path}: kept ")))
        .filter_map(|l| l.split_once(&from)?.1.split(')').next()?.parse().ok())
        .next()
        .unwrap_or(watermark)
}

/// Each file's path and bytes.
pub fn contents_by_path(files: &[RepoFile]) -> std::collections::BTreeMap<String, Vec<u8>> {
    files
        .iter()
        .map(|f| {
            (
                f.path.clone(),
                checkpoint::content_bytes(f)
                    .expect("fixture bytes")
                    .to_vec(),
            )
        })
        .collect()
}
