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
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
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

fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

impl Moto {
    /// Starts a server on loopback with bucket [`BUCKET`] and waits until
    /// it answers.
    pub fn start() -> Moto {
        Moto::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Starts a server listening on `ip` (an address of this machine) with
    /// bucket [`BUCKET`] and waits until it answers.
    pub fn start_on(ip: IpAddr) -> Moto {
        for _ in 0..5 {
            let port = free_port(ip);
            let log = tempfile::NamedTempFile::new().unwrap();
            let child = Command::new("python3")
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    &ip.to_string(),
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
                addr: SocketAddr::new(ip, port),
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
            "moto server did not start on {ip} (python3 -m moto.server; install: python3 -m pip install 'moto[server]==5.2.1')"
        );
    }

    /// `http://IP:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A request of moto's query API (IAM, STS) with `params` as its form
    /// body, unsigned (accepted until [`Moto::enforce_auth`]); its answer's
    /// body, which must be a `200`.
    pub fn query(&self, service: &str, params: &[(&str, &str)]) -> String {
        let body: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
            .collect();
        let body = body.join("&");
        let scope = format!(
            "AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=00"
        );
        let (status, _, answer) = self
            .request(
                "POST",
                "/",
                &scope,
                &[("Content-Type", "application/x-www-form-urlencoded")],
                body.as_bytes(),
            )
            .unwrap();
        let text = String::from_utf8_lossy(&answer).into_owned();
        assert_eq!(status, 200, "{service} {params:?}: {text}");
        text
    }

    /// An IAM user with an access key, allowed every S3 action when
    /// `s3_allowed`; its access key id and secret access key.
    pub fn iam_user(&self, name: &str, s3_allowed: bool) -> (String, String) {
        self.iam_user_with_policy(name, s3_allowed.then_some(ALLOW_S3))
    }

    /// An IAM user with an access key and `policy` (a policy document) as
    /// its inline policy, if any; its access key id and secret access key.
    pub fn iam_user_with_policy(&self, name: &str, policy: Option<&str>) -> (String, String) {
        self.query(
            "iam",
            &[
                ("Action", "CreateUser"),
                ("UserName", name),
                ("Version", "2010-05-08"),
            ],
        );
        if let Some(policy) = policy {
            self.query(
                "iam",
                &[
                    ("Action", "PutUserPolicy"),
                    ("UserName", name),
                    ("PolicyName", "s3"),
                    ("PolicyDocument", policy),
                    ("Version", "2010-05-08"),
                ],
            );
        }
        let key = self.query(
            "iam",
            &[
                ("Action", "CreateAccessKey"),
                ("UserName", name),
                ("Version", "2010-05-08"),
            ],
        );
        (
            xml_text(&key, "AccessKeyId").expect("CreateAccessKey: AccessKeyId"),
            xml_text(&key, "SecretAccessKey").expect("CreateAccessKey: SecretAccessKey"),
        )
    }

    /// An IAM role any web identity may assume, allowed every S3 action;
    /// its ARN.
    pub fn iam_role(&self, name: &str) -> String {
        let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"*"},"Action":"sts:AssumeRoleWithWebIdentity"}]}"#;
        let role = self.query(
            "iam",
            &[
                ("Action", "CreateRole"),
                ("RoleName", name),
                ("AssumeRolePolicyDocument", trust),
                ("Version", "2010-05-08"),
            ],
        );
        self.query(
            "iam",
            &[
                ("Action", "PutRolePolicy"),
                ("RoleName", name),
                ("PolicyName", "s3"),
                ("PolicyDocument", ALLOW_S3),
                ("Version", "2010-05-08"),
            ],
        );
        xml_text(&role, "Arn").expect("CreateRole: Arn")
    }

    /// From now on every request must be signed by a key moto's IAM knows
    /// and be allowed by its policies (moto's `reset-auth`); the unsigned
    /// raw helpers stop working.
    pub fn enforce_auth(&self) {
        let (status, _, body) = self
            .request("POST", "/moto-api/reset-auth", "", &[], b"0")
            .unwrap();
        assert_eq!(
            status,
            200,
            "reset-auth: {}",
            String::from_utf8_lossy(&body)
        );
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
        // moto checks no signature, but takes the key id from the
        // Authorization header for its ACLs: the objects ftpipe wrote are
        // this key's, and an anonymous request is refused them.
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"
        );
        self.request(method, path, &auth, headers, body)
    }

    /// One HTTP/1.1 request with `authorization` (none when empty); the
    /// status, the response head and the body.
    fn request(
        &self,
        method: &str,
        path: &str,
        authorization: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<(u16, String, Vec<u8>)> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.addr,
            body.len()
        );
        if !authorization.is_empty() {
            req.push_str(&format!("Authorization: {authorization}\r\n"));
        }
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

/// A policy allowing every S3 action on every resource.
const ALLOW_S3: &str =
    r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}"#;

/// `v` percent-encoded for a form body (every byte but the unreserved).
fn form_encode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The text of the first `<NAME>` element of `xml`.
pub fn xml_text(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{name}>"))?;
    Some(xml[start..start + len].to_owned())
}
