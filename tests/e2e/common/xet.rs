//! Xet storage for the tests, from Hugging Face's own parts: the CAS is
//! `local_cas_server` (crate `xet-client` 1.8.0, feature `simulation`;
//! `.ci/run` installs it with `cargo install`), started on a free loopback
//! port with a temporary `--data-directory` and stopped when dropped; files
//! are put into it by the reference uploader `hf_xet` (PyPI, 1.8.0) through
//! `fixtures/scripts/xet_upload.py`, which reports each file's Xet hash.
//! [`xet_hub`] wires a fixture hub to it ([`ftpipe_fixtures::xet`]), so
//! `hf download` with huggingface_hub's defaults downloads through Xet.
//!
//! A missing `local_cas_server` fails the test with the command that
//! installs it: CI installs it, so a skip would hide a regression.
//!
//! Known differences of `local_cas_server` from the hub's real storage
//! (for a Xet byte source built on this): a xorb `GET` is answered `206`
//! without `Content-Range`, and no token is checked; the details are in
//! [`ftpipe_fixtures::xet`].

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ftpipe_fixtures::checkpoint::content_bytes;
use ftpipe_fixtures::{RepoFile, RunningHub, XetServing};

/// The install command, named when the binary is missing.
pub const INSTALL_CAS: &str = "cargo install xet-client --version 1.8.0 --features simulation --bin local_cas_server --locked";
/// The token the hub hands out and the uploader sends (the local server
/// checks none).
pub const CAS_TOKEN: &str = "xet-fixture-cas-token";

/// A `local_cas_server` on loopback with its data in a temporary directory.
pub struct LocalCas {
    child: Child,
    addr: SocketAddr,
    data: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// `GET /health` answered 200.
fn healthy(addr: SocketAddr) -> bool {
    use std::io::Write;
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// How long a started server must run without exiting (a failed bind
/// exits within milliseconds) before it is taken as the one on its port.
const SETTLE: Duration = Duration::from_millis(500);

impl LocalCas {
    /// Starts a server and waits until `/health` answers. The port is
    /// chosen free and given on the command line (the server puts it in
    /// the xorb URLs it answers); taken meanwhile, another is tried.
    pub fn start() -> LocalCas {
        Self::start_with(free_port)
    }

    /// Starts a server on `port` (a test of what outlives a server on its
    /// port); retried while the port is still held by the one before.
    pub fn start_on(port: u16) -> LocalCas {
        Self::start_with(|| port)
    }

    fn start_with(port_of_try: impl Fn() -> u16) -> LocalCas {
        let data = tempfile::tempdir().unwrap();
        let log = data.path().join("server.log");
        for _ in 0..5 {
            let port = port_of_try();
            let child = Command::new("local_cas_server")
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .arg("--data-directory")
                .arg(data.path().join("cas"))
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    panic!(
                        "local_cas_server is not installed (not on PATH): {INSTALL_CAS} (.ci/run does)"
                    )
                }
                Err(e) => panic!("spawn local_cas_server: {e}"),
            };
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: try another
                }
                // Another listener may hold the port (the server then fails
                // to bind and exits, while `/health` is answered by the
                // other one): a server is taken only once it has run for
                // `SETTLE` without exiting.
                if t.elapsed() >= SETTLE && healthy(addr) && child.try_wait().unwrap().is_none() {
                    return LocalCas { child, addr, data };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let err = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
        panic!("local_cas_server did not start on loopback:\n{err}");
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// hf_xet's `HF_HOME` for uploads to this server.
    fn uploader_home(&self) -> std::path::PathBuf {
        self.data.path().join("uploader-home")
    }

    /// Uploads `files` with hf_xet (contents written to a temporary
    /// directory first) and returns each content's Xet hash keyed by its
    /// SHA-256, as the uploader computed both.
    ///
    /// hf_xet keeps what it uploaded in a cache keyed by the endpoint's
    /// URL (`HF_HOME/xet/http___127_0_0_1-…`) and skips what that cache
    /// says the endpoint holds: the uploader's cache lives with this
    /// server's data, so a server on a port an earlier one used still
    /// gets every file.
    pub fn upload(&self, files: &[&RepoFile]) -> BTreeMap<String, String> {
        let dir = tempfile::tempdir_in(self.data.path()).unwrap();
        let mut paths = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let p = dir.path().join(format!("{i}.bin"));
            std::fs::write(&p, content_bytes(f).unwrap()).unwrap();
            paths.push(p);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scripts/xet_upload.py");
        let o = Command::new("python3")
            .arg(&script)
            .arg(self.endpoint())
            .arg(CAS_TOKEN)
            .args(&paths)
            .env("HF_HOME", self.uploader_home())
            .output()
            .expect("spawn python3 (needed for hf_xet)");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("No module named 'hf_xet'"),
            "hf_xet is not installed: python3 -m pip install 'hf-xet==1.8.0' (.ci/run does)"
        );
        assert!(o.status.success(), "xet_upload.py failed: {err}");
        let mut hashes = BTreeMap::new();
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let (sha, xet) = (
                v["sha256"].as_str().unwrap(),
                v["xet_hash"].as_str().unwrap(),
            );
            assert!(sha.len() == 64 && xet.len() == 64, "{line}");
            hashes.insert(sha.to_owned(), xet.to_owned());
        }
        assert_eq!(
            hashes.len(),
            files.len(),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        hashes
    }
}

impl Drop for LocalCas {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Downloads the Xet file `xet_hash` of `size` bytes to `out` with hf_xet
/// given only the hub's read-token route for `REPO` at `rev`
/// (`fixtures/scripts/xet_download.py`): hf_xet's refresher takes the CAS
/// URL and token from the route's JSON body.
pub fn hf_xet_download(hub: &RunningHub, rev: &str, xet_hash: &str, size: u64, out: &Path) {
    let route = format!(
        "{}/api/models/{}/xet-read-token/{rev}",
        hub.endpoint(),
        super::REPO
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scripts/xet_download.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&route)
        .arg("hf_fixture_dummy_token")
        .arg(xet_hash)
        .arg(size.to_string())
        .arg(out)
        .output()
        .expect("spawn python3 (needed for hf_xet)");
    assert!(
        o.status.success(),
        "xet_download.py failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Serves every LFS file of `files` from `hub` through `cas` (uploaded
/// there first): the hub then answers the Xet headers and read-token route.
/// Returns the Xet hashes keyed by SHA-256.
pub fn xet_hub(hub: &RunningHub, cas: &LocalCas, files: &[RepoFile]) -> BTreeMap<String, String> {
    let listing = hub.listing(super::REPO, "main").unwrap();
    let lfs: Vec<&RepoFile> = files
        .iter()
        .filter(|f| listing.iter().any(|l| l.path == f.path && l.lfs))
        .collect();
    assert!(!lfs.is_empty(), "no LFS file to serve through Xet");
    let hashes = cas.upload(&lfs);
    hub.serve_xet(XetServing {
        cas_url: cas.endpoint(),
        access_token: CAS_TOKEN.to_owned(),
        hashes: hashes.clone(),
        token_lifetime: ftpipe_fixtures::xet::TOKEN_LIFETIME,
    });
    hashes
}
