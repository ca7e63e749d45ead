//! End-to-end against a real, unmodified web server: the kill -9 / resume test
//! with nginx serving the repo's files and a static listing.
//!
//! The fixture hub is our own code, so a resume test against it only shows that
//! ftpipe agrees with our reading of RFC 9110. Here nginx produces the ETags,
//! `206` responses, `Content-Range` and `If-Range` handling, and its access log
//! is the witness: after the kill, the big file is fetched again with
//! `Range: bytes=N-` (N > 0) and `If-Range: <nginx's ETag>`, answered `206`,
//! and never restarted from byte 0.
//!
//! Skips (prints `SKIP: nginx not installed`) when no nginx binary is found.

use crate::common::*;

use std::fmt::Write as _;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

use ftpipe_fixtures::{RepoFile, checkpoint};
use sha1::Digest as _;

/// Files at least this large (and every `*.safetensors`) are listed as LFS.
const LFS_THRESHOLD: u64 = 64 * 1024;

fn find_nginx() -> Option<PathBuf> {
    let fixed = [
        "/usr/sbin/nginx",
        "/usr/local/sbin/nginx",
        "/usr/local/nginx/sbin/nginx",
    ];
    if let Some(p) = fixed.iter().map(PathBuf::from).find(|p| p.is_file()) {
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// nginx as a child process (single process, no daemon), killed on drop.
struct Nginx {
    child: Child,
    port: u16,
    access_log: PathBuf,
    error_log: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Parsed access log lines.
    fn log(&self) -> Vec<LogLine> {
        std::fs::read_to_string(&self.access_log)
            .unwrap_or_default()
            .lines()
            .filter_map(LogLine::parse)
            .collect()
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(&self.error_log).unwrap_or_default()
    }

    /// Starts nginx on a free loopback port; retries if the port was taken
    /// between probing and binding.
    fn start(bin: &Path, prefix: &Path, www: &Path, repo_dir: &Path, commit: &str) -> Nginx {
        let mut last_err = String::new();
        for _ in 0..5 {
            let port = free_port();
            let conf = prefix.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(prefix, www, repo_dir, commit, port)).unwrap();
            let error_log = prefix.join("error.log");
            let stderr = std::fs::File::create(prefix.join("nginx.stderr")).unwrap();
            let child = Command::new(bin)
                .arg("-c")
                .arg(&conf)
                .arg("-p")
                .arg(prefix)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("spawn nginx");
            let mut ng = Nginx {
                child,
                port,
                access_log: prefix.join("access.log"),
                error_log,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(status)) = ng.child.try_wait() {
                    last_err = format!(
                        "nginx exited with {status}: {}{}",
                        std::fs::read_to_string(prefix.join("nginx.stderr")).unwrap_or_default(),
                        ng.error_log()
                    );
                    break;
                }
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                    return ng;
                }
                if Instant::now() > deadline {
                    panic!(
                        "nginx did not listen on {port} within 10 s: {}",
                        ng.error_log()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("could not start nginx: {last_err}");
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("probe a free port")
}

/// A minimal nginx.conf: everything under `prefix`, no gzip, 2 MB/s per
/// connection, JSON for the static API files, and the resolve path aliased to
/// the repo directory. The access log records Range, If-Range and the status.
fn nginx_conf(prefix: &Path, www: &Path, repo_dir: &Path, commit: &str, port: u16) -> String {
    let p = prefix.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/error.log info;
events {{ worker_connections 64; }}
http {{
    types {{ application/json json; }}
    default_type application/octet-stream;
    gzip off;
    sendfile on;
    etag on;
    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    log_format ranges escape=none '$status\t$request_method\t$uri\trange=$http_range\tif_range=$http_if_range\tsent=$body_bytes_sent\tconn=$connection';
    access_log {p}/access.log ranges;
    server {{
        listen 127.0.0.1:{port};
        root {www};
        limit_rate 2m;
        location /api/ {{
            default_type application/json;
        }}
        location /{REPO}/resolve/{commit}/ {{
            alias {repo}/;
        }}
    }}
}}
"#,
        www = www.display(),
        repo = repo_dir.display(),
    )
}

/// One access log line.
#[derive(Debug, Clone)]
struct LogLine {
    status: u16,
    method: String,
    uri: String,
    range: String,
    if_range: String,
    sent: u64,
    /// nginx's serial number of the TCP connection.
    conn: u64,
}

impl LogLine {
    fn parse(line: &str) -> Option<LogLine> {
        let mut it = line.split('\t');
        let status = it.next()?.parse().ok()?;
        let method = it.next()?.to_owned();
        let uri = it.next()?.to_owned();
        let range = it.next()?.strip_prefix("range=")?.to_owned();
        let if_range = it.next()?.strip_prefix("if_range=")?.to_owned();
        let sent = it.next()?.strip_prefix("sent=")?.parse().ok()?;
        let conn = it.next()?.strip_prefix("conn=")?.parse().ok()?;
        // nginx logs an empty variable as "-".
        let dash = |s: String| if s == "-" { String::new() } else { s };
        Some(LogLine {
            status,
            method,
            uri,
            range: dash(range),
            if_range: dash(if_range),
            sent,
            conn,
        })
    }

    /// Bytes asked for by `Range: bytes=A-B`.
    fn range_len(&self) -> Option<u64> {
        let (a, b) = self.range.strip_prefix("bytes=")?.split_once('-')?;
        Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?)
    }

    /// N of `Range: bytes=N-`.
    fn range_start(&self) -> Option<u64> {
        self.range
            .strip_prefix("bytes=")?
            .strip_suffix('-')?
            .parse()
            .ok()
    }
}

fn sha1_hex(parts: &[&[u8]]) -> String {
    let mut h = sha1::Sha1::new();
    for p in parts {
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// The git blob id of `content`: sha1("blob <len>\0" + content).
fn git_blob_oid(content: &[u8]) -> String {
    sha1_hex(&[format!("blob {}\0", content.len()).as_bytes(), content])
}

/// The hub's tree listing for `files` (LFS entries carry the pointer's git
/// oid and the content's SHA-256, as on the real hub), and a commit id
/// derived from it.
fn static_listing(files: &[RepoFile]) -> (serde_json::Value, String) {
    let mut entries = Vec::new();
    let mut fingerprint = String::new();
    for f in files {
        let content = checkpoint::content_bytes(f).expect("fixture bytes");
        let size = content.len() as u64;
        let mut entry = serde_json::json!({ "type": "file", "path": f.path, "size": size });
        if size >= LFS_THRESHOLD || f.path.ends_with(".safetensors") {
            let sha = sha256_hex(&content);
            let pointer = format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n"
            );
            entry["oid"] = git_blob_oid(pointer.as_bytes()).into();
            entry["lfs"] = serde_json::json!({
                "oid": sha, "size": size, "pointerSize": pointer.len()
            });
        } else {
            entry["oid"] = git_blob_oid(&content).into();
        }
        let _ = writeln!(fingerprint, "{} {}", f.path, entry["oid"]);
        entries.push(entry);
    }
    let commit = sha1_hex(&[fingerprint.as_bytes()]);
    (serde_json::Value::Array(entries), commit)
}

/// Writes the revision and tree API responses as static files under `www`.
fn write_api(www: &Path, listing: &serde_json::Value, commit: &str) {
    let api = www.join("api/models").join(REPO);
    std::fs::create_dir_all(api.join("revision")).unwrap();
    std::fs::create_dir_all(api.join("tree")).unwrap();
    let revision = serde_json::json!({ "id": REPO, "sha": commit, "siblings": [] });
    std::fs::write(api.join("revision/main"), revision.to_string()).unwrap();
    // `GET .../tree/{commit}?recursive=true`: nginx maps the path, not the query.
    std::fs::write(api.join("tree").join(commit), listing.to_string()).unwrap();
}

/// nginx's strong ETag for a static file: `"<mtime hex>-<size hex>"`.
fn nginx_etag(path: &Path) -> String {
    let md = std::fs::metadata(path).unwrap();
    let mtime = md
        .modified()
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!("\"{mtime:x}-{:x}\"", md.len())
}

fn committed_bytes(out: &Path, path: &str) -> u64 {
    let sql = format!(
        "SELECT committed_bytes FROM ledger WHERE path = '{}'",
        path.replace('\'', "''")
    );
    query(out, &sql)
        .first()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A generated repo (`seed`, 6 MiB) under `root`, served by nginx with its
/// static listing.
struct Served {
    files: Vec<RepoFile>,
    commit: String,
    repo_dir: PathBuf,
    nginx: Nginx,
}

fn serve_repo(nginx_bin: &Path, root: &Path, seed: u64) -> Served {
    let repo_dir = root.join("repo");
    let www = root.join("www");
    let files = checkpoint::generate_repo_to_dir(seed, 6 << 20, &repo_dir).expect("generate repo");
    let (listing, commit) = static_listing(&files);
    write_api(&www, &listing, &commit);
    let nginx = Nginx::start(nginx_bin, root, &www, &repo_dir, &commit);
    Served {
        files,
        commit,
        repo_dir,
        nginx,
    }
}

#[test]
fn kill_and_resume_against_nginx() {
    let _heavy = heavy();
    let Some(nginx_bin) = find_nginx() else {
        skip_unless_ci("nginx not installed");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let out = root.join("out");
    let Served {
        files,
        commit,
        repo_dir,
        nginx,
    } = serve_repo(&nginx_bin, root, 11);
    let big = files
        .iter()
        .max_by_key(|f| std::fs::metadata(repo_dir.join(&f.path)).unwrap().len())
        .unwrap();
    let big_size = std::fs::metadata(repo_dir.join(&big.path)).unwrap().len();
    assert!(big_size >= 2 << 20, "big file is only {big_size} bytes");
    let big_uri = format!("/{REPO}/resolve/{commit}/{}", big.path);
    let endpoint = nginx.endpoint();
    let ckpt = ["--checkpoint-bytes", "65536", "--checkpoint-secs", "0.01"];

    // First run: SIGKILL once part of the big file is durably committed.
    let log1 = std::fs::File::create(root.join("fetch1.stderr")).unwrap();
    let mut child = fetch_cmd(&endpoint, &out, &ckpt)
        .stdout(Stdio::null())
        .stderr(log1)
        .spawn()
        .expect("spawn ftpipe");
    let part = part_path(&out, &big.path);
    let deadline = Instant::now() + Duration::from_secs(60);
    let killed_at = loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = std::fs::File::open(root.join("fetch1.stderr"))
                .and_then(|mut f| f.read_to_string(&mut err));
            panic!(
                "ftpipe finished ({status}) before it could be interrupted; \
                 is limit_rate in effect? stderr: {err}\nnginx: {}",
                nginx.error_log()
            );
        }
        let on_disk = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        if on_disk >= 256 * 1024 {
            let committed = committed_bytes(&out, &big.path);
            if committed >= 128 * 1024 && committed < big_size {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                break committed;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no committed bytes of {} within 60 s",
            big.path
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        part.exists(),
        "the killed run left no .part for {}",
        big.path
    );
    // What is durable now is what the resume must start from.
    let resume_from = committed_bytes(&out, &big.path);
    assert!(
        resume_from >= killed_at && resume_from < big_size,
        "watermark {resume_from} (was {killed_at} at the kill, size {big_size})"
    );

    // Second run: must resume, finish and verify.
    let o = run(&mut fetch_cmd(&endpoint, &out, &ckpt));
    assert!(o.status.success(), "resume failed: {}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);

    // The access log proves a strict resume of the big file.
    let etag = nginx_etag(&repo_dir.join(&big.path));
    let lines: Vec<LogLine> = nginx
        .log()
        .into_iter()
        .filter(|l| l.method == "GET" && l.uri == big_uri)
        .collect();
    let resumed: Vec<&LogLine> = lines
        .iter()
        .filter(|l| l.status == 206 && l.range_start().is_some_and(|n| n > 0))
        .collect();
    assert!(
        !resumed.is_empty(),
        "no 206 to `Range: bytes=N-` (N > 0) for {big_uri} in nginx's log: {lines:#?}"
    );
    let r = resumed[0];
    assert_eq!(
        r.range_start(),
        Some(resume_from),
        "the resume must start at the durable watermark"
    );
    assert_eq!(r.if_range, etag, "If-Range must carry nginx's strong ETag");
    assert_eq!(r.sent, big_size - resume_from, "206 body length");
    eprintln!(
        "nginx answered `Range: bytes={resume_from}-` + `If-Range: {}` for {} ({big_size} bytes) with 206",
        r.if_range, big.path
    );
    let full = lines.iter().filter(|l| l.status == 200).count();
    assert_eq!(
        full, 1,
        "the big file was restarted from byte 0: {lines:#?}"
    );
    for l in &lines {
        assert!(
            l.status == 200 || l.status == 206,
            "unexpected status from nginx: {l:?}"
        );
    }

    // ftpipe's own attempt log agrees with nginx's.
    let db_206 = query(
        &out,
        &format!(
            "SELECT range_start FROM attempts WHERE path = '{}' AND status = 206",
            big.path
        ),
    );
    assert_eq!(db_206, [resume_from.to_string()], "attempts rows");
    let bad = query(
        &out,
        "SELECT COUNT(*) FROM discards WHERE reason = 'range_not_honoured'",
    );
    assert_eq!(bad, ["0"]);
}

/// Pieces of a split file reuse kept-alive connections: the file bodies
/// open no more TCP connections than the budget, plus one for each response
/// ftpipe stopped reading early (a range shortened by a split while in
/// flight, whose connection is closed); connections the listing requests
/// opened may be reused. nginx's `$connection` is the witness. A client
/// that keeps no idle connection fails it (13 body requests over 13
/// connections, tried with `pool_max_idle_per_host(0)`).
#[test]
fn pieces_reuse_their_connections_against_nginx() {
    let Some(nginx_bin) = find_nginx() else {
        skip_unless_ci("nginx not installed");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let Served { files, nginx, .. } = serve_repo(&nginx_bin, root, 12);
    let budget = 4;
    let args = [
        "--segment-threshold",
        "1MiB",
        "--piece-size",
        "512KiB",
        "--min-range",
        "256KiB",
        "--connections",
        "4",
        "--split-below-rate",
        "0",
    ];
    let out = root.join("out");
    let o = run(&mut fetch_cmd(&nginx.endpoint(), &out, &args));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    let log = nginx.log();
    let bodies: Vec<&LogLine> = log
        .iter()
        .filter(|l| l.method == "GET" && l.uri.contains("/resolve/"))
        .collect();
    let listing_conns: std::collections::BTreeSet<u64> = log
        .iter()
        .filter(|l| !l.uri.contains("/resolve/"))
        .map(|l| l.conn)
        .collect();
    let opened: std::collections::BTreeSet<u64> = bodies
        .iter()
        .map(|l| l.conn)
        .filter(|c| !listing_conns.contains(c))
        .collect();
    let cut = bodies
        .iter()
        .filter(|l| l.range_len().is_some_and(|n| l.sent < n))
        .count();
    let ranged = bodies.iter().filter(|l| l.range_len().is_some()).count();
    assert!(
        ranged >= 8,
        "only {ranged} range requests: nothing was split"
    );
    eprintln!(
        "{} body requests ({ranged} ranges, {cut} cut short) opened {} TCP connections",
        bodies.len(),
        opened.len()
    );
    assert!(
        opened.len() <= budget + cut,
        "{} body requests ({ranged} ranges) opened {} TCP connections: budget {budget}, \
         {cut} responses cut short",
        bodies.len(),
        opened.len()
    );
}
