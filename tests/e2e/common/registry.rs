//! A real OCI registry for the tests: the CNCF distribution registry 2.8
//! (Debian's `docker-registry`, installed by `.ci/run`), started by each
//! test as its own process on a free loopback port with a temp storage
//! directory and a generated configuration (anonymous, or htpasswd basic
//! auth with a bcrypt line from `htpasswd -B`). The Debian package's own
//! service is never used. Nothing of the distribution API is mocked. A
//! missing binary fails the test with the command that installs it: CI
//! installs it, so a skip would hide a regression.
//!
//! The registry's access log (one line per request: method, path,
//! status) is kept in a file: [`Registry::requests`] reads it back, which
//! is how a test proves a re-publish sent no write request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// User name of the htpasswd registry.
pub const REGISTRY_USER: &str = "ftpipe-user";
/// Password of the htpasswd registry (long enough to be redacted).
pub const REGISTRY_PASSWORD: &str = "ftpipe-registry-password-0001";

/// A distribution registry on loopback.
pub struct Registry {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    /// Storage, configuration and log; removed when the registry is.
    _dir: tempfile::TempDir,
    auth: bool,
}

/// One request of the access log.
#[derive(Debug, Clone)]
pub struct Logged {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path and query.
    pub path: String,
    /// The status answered.
    pub status: u16,
}

fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

impl Registry {
    /// An anonymous registry.
    pub fn start() -> Registry {
        Registry::start_with(false)
    }

    /// A registry asking for basic auth ([`REGISTRY_USER`],
    /// [`REGISTRY_PASSWORD`]).
    pub fn start_with_auth() -> Registry {
        Registry::start_with(true)
    }

    fn start_with(auth: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        if auth {
            let out = Command::new("htpasswd")
                .args(["-Bbn", REGISTRY_USER, REGISTRY_PASSWORD])
                .output()
                .expect("htpasswd (apt-get install apache2-utils; .ci/run does)");
            assert!(out.status.success(), "htpasswd: {out:?}");
            std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
        }
        for _ in 0..5 {
            let port = free_port();
            let config = config_yaml(dir.path(), port, auth);
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config).unwrap();
            let log = dir.path().join("registry.log");
            let file = std::fs::File::create(&log).unwrap();
            let child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .expect(
                    "docker-registry (the CNCF distribution registry): apt-get install \
                     docker-registry (.ci/run does)",
                );
            let mut child = child;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) {
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: try another
                }
                if let Ok((status, _, _)) = raw_request(addr, auth, "GET", "/v2/", None, &[]) {
                    assert!(status == 200 || (auth && status == 401), "/v2/: {status}");
                    return Registry {
                        child,
                        addr,
                        log,
                        _dir: dir,
                        auth,
                    };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("docker-registry did not start on loopback");
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `oci://127.0.0.1:PORT/REPO_AND_TAG`.
    pub fn reference(&self, repo_and_tag: &str) -> String {
        format!("oci://{}/{repo_and_tag}", self.addr)
    }

    /// Every request the access log holds so far.
    pub fn requests(&self) -> Vec<Logged> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter_map(parse_access_line).collect()
    }

    /// Requests that write (anything but `GET` and `HEAD`).
    pub fn writes(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET" && r.method != "HEAD")
            .collect()
    }

    /// An auth file (containers auth.json) with this registry's
    /// credentials, written into `dir`.
    pub fn auth_file(&self, dir: &Path) -> PathBuf {
        use base64_like::encode;
        let path = dir.join("auth.json");
        let auth = encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}").as_bytes());
        let doc = serde_json::json!({ "auths": { self.host(): { "auth": auth } } });
        std::fs::write(&path, doc.to_string()).unwrap();
        path
    }

    /// `GET path` (HTTP/1.0, basic auth when this registry asks for it):
    /// status, headers (lowercase names), body.
    pub fn get(&self, path: &str, accept: Option<&str>) -> std::io::Result<RawAnswer> {
        self.request("GET", path, accept, &[])
    }

    /// `method path` with `body` (HTTP/1.0): status, headers, body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        accept: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<RawAnswer> {
        raw_request(self.addr, self.auth, method, path, accept, body)
    }

    /// The manifest `reference` (tag or digest) of `repo`: its digest
    /// header and bytes.
    pub fn manifest(&self, repo: &str, reference: &str) -> (String, Vec<u8>) {
        let (status, headers, body) = self
            .get(
                &format!("/v2/{repo}/manifests/{reference}"),
                Some("application/vnd.oci.image.manifest.v1+json"),
            )
            .unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let digest = headers
            .iter()
            .find(|(k, _)| k == "docker-content-digest")
            .map(|(_, v)| v.clone())
            .unwrap();
        (digest, body)
    }

    /// A blob's bytes.
    pub fn blob(&self, repo: &str, digest: &str) -> Vec<u8> {
        let (status, _, body) = self
            .get(&format!("/v2/{repo}/blobs/{digest}"), None)
            .unwrap();
        assert_eq!(status, 200, "blob {digest}");
        body
    }
}

/// What a raw request answered: status, headers, body.
pub type RawAnswer = (u16, Vec<(String, String)>, Vec<u8>);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `method path` with `body` to `addr` (HTTP/1.0, basic auth when `auth`):
/// status, headers (lowercase names), body.
fn raw_request(
    addr: SocketAddr,
    auth: bool,
    method: &str,
    path: &str,
    accept: Option<&str>,
    body: &[u8],
) -> std::io::Result<RawAnswer> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Length: {}\r\n",
        addr,
        body.len()
    );
    if let Some(a) = accept {
        head.push_str(&format!("Accept: {a}\r\nContent-Type: {a}\r\n"));
    }
    if auth {
        let token = base64_like::encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}").as_bytes());
        head.push_str(&format!("Authorization: Basic {token}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let text = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok((status, headers, raw[split + 4..].to_vec()))
}

fn config_yaml(dir: &Path, port: u16, auth: bool) -> String {
    let storage = dir.join("storage");
    let mut c = format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\nstorage:\n  \
         filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: \
         127.0.0.1:{port}\n  secret: ftpipe-e2e-registry-secret\n",
        storage.display()
    );
    if auth {
        c.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: basic-realm\n    path: {}\n",
            dir.join("htpasswd").display()
        ));
    }
    c
}

/// `127.0.0.1 - - [date] "PATCH /v2/... HTTP/1.1" 202 0 "" "agent"`.
fn parse_access_line(line: &str) -> Option<Logged> {
    let start = line.find('"')?;
    let rest = &line[start + 1..];
    let end = rest.find('"')?;
    let mut req = rest[..end].split(' ');
    let method = req.next()?.to_owned();
    let path = req.next()?.to_owned();
    if !path.starts_with("/v2/") {
        return None;
    }
    let status = rest[end + 1..].split_whitespace().next()?.parse().ok()?;
    Some(Logged {
        method,
        path,
        status,
    })
}

/// Standard base64 without a dependency.
mod base64_like {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}
