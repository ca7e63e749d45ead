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
    /// The token server of a registry asking for Bearer tokens.
    token_server: Option<Child>,
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

    /// A registry asking for Bearer tokens from a token server on
    /// loopback (Python, RS256 JWTs signed with a generated certificate
    /// the registry trusts); anonymous tokens for any scope. After
    /// [`Registry::next_token_short_lived`], the next token issued expires
    /// about two seconds later (the registry allows 60 s of leeway).
    pub fn start_with_tokens() -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("token.port");
        let server = Command::new("python3")
            .arg("-c")
            .arg(TOKEN_SERVER)
            .arg(dir.path())
            .arg(&port_file)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 (the token server; needs the cryptography package)");
        let t = Instant::now();
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse::<u16>().ok())
            {
                break p;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the token server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let token = format!(
            "auth:\n  token:\n    realm: http://127.0.0.1:{port}/token\n    service: \
             ftpipe-test-registry\n    issuer: ftpipe-test-issuer\n    rootcertbundle: {}\n",
            dir.path().join("token.crt").display()
        );
        let mut r = Registry::start_in(dir, false, Some(token));
        r.token_server = Some(server);
        r
    }

    /// The next token the server issues expires about two seconds later.
    pub fn next_token_short_lived(&self) {
        std::fs::write(self._dir.path().join("short"), b"").unwrap();
    }

    /// The token server takes `token` as an identity (refresh) token.
    pub fn accept_identity_token(&self, token: &str) {
        std::fs::write(self._dir.path().join("refresh"), token).unwrap();
    }

    /// Scopes of the tokens issued so far, in order.
    pub fn tokens_issued(&self) -> Vec<String> {
        std::fs::read_to_string(self._dir.path().join("tokens.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn start_with(auth: bool) -> Registry {
        Registry::start_in(tempfile::tempdir().unwrap(), auth, None)
    }

    fn start_in(dir: tempfile::TempDir, auth: bool, token: Option<String>) -> Registry {
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
            let mut config = config_yaml(dir.path(), port, auth);
            config.push_str(token.as_deref().unwrap_or_default());
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
                    let asks = auth || token.is_some();
                    assert!(status == 200 || (asks && status == 401), "/v2/: {status}");
                    return Registry {
                        child,
                        addr,
                        log,
                        _dir: dir,
                        auth,
                        token_server: None,
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
        if let Some(t) = &mut self.token_server {
            let _ = t.kill();
            let _ = t.wait();
        }
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

/// A token server: `python3 -c TOKEN_SERVER DIR PORT_FILE`. Writes
/// `DIR/token.crt` (the certificate the registry trusts), listens on a
/// free loopback port (written to PORT_FILE), answers `GET /token?scope=`
/// with an RS256 JWT granting every scope asked (each its own `scope`
/// parameter; the certificate in `x5c`), one line per token in
/// `DIR/tokens.log` (the scopes space-separated); a `POST` with
/// `grant_type=refresh_token` and the refresh token in `DIR/refresh` (an
/// identity token, [`Registry::accept_identity_token`]) gets an
/// `access_token` (logged `refresh SCOPES`), any other `POST` a `401`
/// (logged `refresh refused`); while `DIR/short` exists, the next
/// token expires two seconds past the registry's 60 s leeway, and the file
/// is removed.
const TOKEN_SERVER: &str = r#"
import base64, datetime, http.server, json, os, sys, time
from urllib.parse import urlparse, parse_qs
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa, padding
d, port_file = sys.argv[1], sys.argv[2]
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ftpipe-test-token")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
with open(os.path.join(d, "token.crt"), "wb") as f:
    f.write(cert.public_bytes(serialization.Encoding.PEM))
der = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
issued = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        form = parse_qs(self.rfile.read(n).decode())
        want_path = os.path.join(d, "refresh")
        want = open(want_path).read() if os.path.exists(want_path) else None
        ok = (form.get("grant_type") == ["refresh_token"] and want is not None
              and form.get("refresh_token") == [want])
        if not ok:
            with open(os.path.join(d, "tokens.log"), "a") as f:
                f.write("refresh refused\n")
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.issue(form.get("scope", [""])[0].split(), "refresh ", "access_token")
    def do_GET(self):
        scopes = parse_qs(urlparse(self.path).query).get("scope", [])
        self.issue(scopes, "", "token")
    def issue(self, scopes, label, field):
        global issued
        access = []
        for one in scopes:
            kind, repo, actions = one.split(":")
            access.append({"type": kind, "name": repo, "actions": actions.split(",")})
        scope = " ".join(scopes)
        issued += 1
        t0 = int(time.time())
        short = os.path.join(d, "short")
        exp = t0 + 3600
        if os.path.exists(short):
            os.remove(short)
            exp = t0 - 58
        claims = {"iss": "ftpipe-test-issuer", "sub": "", "aud": "ftpipe-test-registry",
                  "exp": exp, "nbf": t0 - 1, "iat": t0, "jti": str(issued), "access": access}
        header = {"typ": "JWT", "alg": "RS256", "x5c": [der]}
        signing = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
        sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        body = json.dumps({field: signing + "." + b64(sig)}).encode()
        with open(os.path.join(d, "tokens.log"), "a") as f:
            f.write(f"{label}{scope} exp={exp - t0}\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
with open(port_file + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
"#;

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

/// A TCP proxy in front of a registry whose uplink is slow: what a
/// client sends on a connection, from the first read holding `marker` on
/// (a blob's digest: only its upload is slow), `slow` bytes are read at
/// most `rate` bytes per second (4 KiB at a time); answers are passed on
/// at once. A request body larger than `rate` ×
/// the client's read timeout takes longer to send than that timeout
/// while bytes keep moving.
pub struct ThrottledProxy {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ThrottledProxy {
    /// A proxy to `upstream` (`HOST:PORT`) reading `rate` bytes a second
    /// once `marker` went by.
    pub fn start(upstream: &str, rate: u64, marker: &str, slow: u64) -> ThrottledProxy {
        let marker = marker.as_bytes().to_vec();
        let upstream: SocketAddr = upstream.parse().expect("HOST:PORT");
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                relay(client, server, (rate, slow), marker.clone());
            }
        });
        ThrottledProxy { addr, stop }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for ThrottledProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `client` to `server` (at `rate` bytes a second once `marker`
/// went by) and `server` to `client` at once, each on its own thread;
/// either end closing closes both.
fn relay(client: TcpStream, server: TcpStream, (rate, slow): (u64, u64), marker: Vec<u8>) {
    let (mut c_read, mut c_write) = (client.try_clone().unwrap(), client);
    let (mut s_read, mut s_write) = (server.try_clone().unwrap(), server);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let (mut seen, mut throttled) = (false, 0u64);
        while let Ok(n) = c_read.read(&mut buf) {
            if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                break;
            }
            seen = seen || buf[..n].windows(marker.len()).any(|w| w == marker);
            if seen && throttled < slow {
                throttled += n as u64;
                let secs = n as f64 / rate.max(1) as f64;
                std::thread::sleep(Duration::from_secs_f64(secs));
            }
        }
        let _ = s_write.shutdown(std::net::Shutdown::Write);
    });
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut s_read, &mut c_write);
        let _ = c_write.shutdown(std::net::Shutdown::Both);
    });
}
