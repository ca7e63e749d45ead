//! A real S3-compatible server for the tests: moto's server mode
//! (`python3 -m moto.server`, installed by `.ci/run` from PyPI), started on
//! a free loopback port per test and stopped when dropped. Nothing of the
//! S3 API is mocked here. A missing moto fails the test with the command
//! that installs it: CI installs it, so a skip would hide a regression.
//!
//! The raw helpers (`put_object`, `get_object`, `delete_object`) speak
//! plain unsigned HTTP/1.1 to the server, as a tampering third party
//! would: moto accepts unsigned requests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Access key id the tests give ftpipe (long enough to be redacted).
pub const ACCESS_KEY_ID: &str = "AKIAFTPIPETESTKEY001";
/// Secret access key the tests give ftpipe.
pub const SECRET_ACCESS_KEY: &str = "ftpipe-test-secret-access-key-0001";
/// Session token the tests give ftpipe.
pub const SESSION_TOKEN: &str = "ftpipe-test-session-token-0001";
/// The bucket every test creates.
pub const BUCKET: &str = "models";
/// Pull options scaled to the fixtures: objects of 128 KiB and more in
/// ranges of 64 KiB, split whatever their rate, a checkpoint every 64 KiB.
pub const RANGED_PULL: &[&str] = &[
    "--segment-threshold",
    "128KiB",
    "--min-range",
    "64KiB",
    "--piece-size",
    "64KiB",
    "--split-below-rate",
    "0",
    "--checkpoint-bytes",
    "65536",
];
/// Parts the tests' servers accept: small, so a small artifact has
/// multipart uploads of several parts.
pub const PART_SIZE: &str = "64KiB";

/// A moto server on loopback.
pub struct Moto {
    child: Child,
    addr: SocketAddr,
    _log: tempfile::NamedTempFile,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

impl Moto {
    /// Starts a server with bucket [`BUCKET`] and waits until it answers.
    pub fn start() -> Moto {
        for _ in 0..5 {
            let port = free_port();
            let log = tempfile::NamedTempFile::new().unwrap();
            let child = Command::new("python3")
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                // Parts of 64 KiB (S3 itself wants 5 MiB).
                .env("S3_UPLOAD_PART_MIN_SIZE", "65536")
                .env("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", "1048576")
                .stdin(Stdio::null())
                .stdout(log.reopen().unwrap())
                .stderr(log.reopen().unwrap())
                .spawn()
                .expect("spawn python3 (needed for moto)");
            let mut m = Moto {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                _log: log,
            };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                if let Some(status) = m.child.try_wait().unwrap() {
                    let mut text = String::new();
                    let _ = std::fs::File::open(m._log.path())
                        .and_then(|mut f| f.read_to_string(&mut text));
                    if text.contains("No module named") {
                        panic!(
                            "moto is not installed ({status}): python3 -m pip install 'moto[server]==5.2.1' (.ci/run does)\n{text}"
                        );
                    }
                    break; // the port was taken meanwhile: try another
                }
                if let Ok((200, _)) = m.raw("GET", "/", &[], &[]) {
                    let (status, body) = m.raw("PUT", &format!("/{BUCKET}"), &[], &[]).unwrap();
                    assert_eq!(
                        status,
                        200,
                        "create bucket: {}",
                        String::from_utf8_lossy(&body)
                    );
                    return m;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = m.child.kill();
        }
        panic!(
            "moto server did not start on loopback (python3 -m moto.server; install: python3 -m pip install 'moto[server]==5.2.1')"
        );
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One unsigned HTTP/1.1 request; the status and body.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        self.raw_with_head(method, path, headers, body)
            .map(|(status, _, body)| (status, body))
    }

    /// One unsigned HTTP/1.1 request; the status, the response head (status
    /// line and headers, as text) and the body.
    pub fn raw_with_head(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<(u16, String, Vec<u8>)> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        // moto checks no signature, but takes the key id from the
        // Authorization header for its ACLs: the objects ftpipe wrote are
        // this key's, and an anonymous request is refused them.
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes())?;
        s.write_all(body)?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)?;
        let head_end = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no HTTP head"))?;
        let head = String::from_utf8_lossy(&resp[..head_end]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other("no status"))?;
        let mut body = resp[head_end + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        Ok((status, head, body))
    }

    /// Puts `bytes` at `key` of [`BUCKET`] (as a third party would).
    pub fn put_object(&self, key: &str, bytes: &[u8]) {
        let (status, body) = self
            .raw("PUT", &format!("/{BUCKET}/{key}"), &[], bytes)
            .unwrap();
        assert_eq!(status, 200, "put {key}: {}", String::from_utf8_lossy(&body));
    }

    /// The object at `key` of [`BUCKET`], `None` when missing.
    pub fn get_object(&self, key: &str) -> Option<Vec<u8>> {
        let (status, body) = self
            .raw("GET", &format!("/{BUCKET}/{key}"), &[], &[])
            .unwrap();
        match status {
            200 => Some(body),
            404 => None,
            s => panic!("get {key}: {s} {}", String::from_utf8_lossy(&body)),
        }
    }

    /// Every key of [`BUCKET`] under `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let (status, body) = self
            .raw(
                "GET",
                &format!("/{BUCKET}?list-type=2&prefix={prefix}&max-keys=1000"),
                &[],
                &[],
            )
            .unwrap();
        assert_eq!(status, 200);
        let text = String::from_utf8_lossy(&body);
        let mut keys: Vec<String> = text
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next().map(str::to_owned))
            .collect();
        keys.sort();
        keys
    }

    /// Multipart uploads in progress in [`BUCKET`].
    pub fn uploads_in_progress(&self) -> usize {
        let (_, body) = self
            .raw("GET", &format!("/{BUCKET}?uploads"), &[], &[])
            .unwrap();
        String::from_utf8_lossy(&body).matches("<UploadId>").count()
    }

    /// `ftpipe` with credentials, the endpoint and nothing of the
    /// developer's AWS configuration.
    pub fn ftpipe(&self, home: &Path) -> Command {
        let mut cmd = super::ftpipe();
        for var in [
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
            "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_CONFIG_FILE",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("HOME", home)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
            .env("AWS_SESSION_TOKEN", SESSION_TOKEN)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", self.endpoint());
        cmd
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
}
