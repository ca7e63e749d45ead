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
//!
//! Beside it: the commands the registry tests run (`publish`, `pull`
//! with HOME and no auth file of the developer's), a test's start
//! ([`Published`]: DIR built and published), the checks they share
//! ([`assert_pulled`], [`check_tag`]), the publish kill storm
//! ([`publish_kill_storm`]), and a proxy whose uplink is throttled or cut
//! mid-request ([`UplinkProxy`]).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{assert_names, crash_seed, ftpipe, manifest_json, run, stderr, tree_of};
use crate::s3::{built, ok, summary, verify_deep};

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

    /// Every request the access log holds once it has not grown for
    /// 200 ms (at most 10 s): the registry writes a request's line after
    /// its answer, so the last requests of a client that has just exited
    /// may not be in the log yet.
    pub fn requests_settled(&self) -> Vec<Logged> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = self.requests();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = self.requests();
            if now.len() == seen.len() || Instant::now() > deadline {
                return now;
            }
            seen = now;
        }
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

    /// Puts `manifest` as `repo:tag`; the registry must take it (`201`).
    pub fn put_manifest(&self, repo: &str, tag: &str, manifest: &serde_json::Value) {
        let (status, _, body) = self
            .request(
                "PUT",
                &format!("/v2/{repo}/manifests/{tag}"),
                Some("application/vnd.oci.image.manifest.v1+json"),
                manifest.to_string().as_bytes(),
            )
            .unwrap();
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
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

/// Blobs above this go as chunked uploads of several chunks (the
/// components of `crate::s3::built` are about 1.5 MB).
pub const CHUNK: &str = "64KiB";

/// `ftpipe` with HOME = `home` and no auth file from the test's own
/// environment (`REGISTRY_AUTH_FILE`, `DOCKER_CONFIG`, `XDG_RUNTIME_DIR`
/// removed; a test sets the one it means after this).
pub fn registry_ftpipe(home: &Path) -> Command {
    let mut cmd = ftpipe();
    cmd.env("HOME", home)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("DOCKER_CONFIG")
        .env_remove("XDG_RUNTIME_DIR");
    cmd
}

/// `cmd publish DIR DEST --plain-http --part-size PART_SIZE`.
pub fn publish_args<'a>(
    cmd: &'a mut Command,
    dir: &Path,
    dest: &str,
    part_size: &str,
) -> &'a mut Command {
    cmd.arg("publish")
        .arg(dir)
        .arg(dest)
        .args(["--plain-http", "--part-size", part_size])
}

/// `cmd pull SRC --plain-http --out OUT --retry-base-ms 20`.
pub fn pull_args<'a>(cmd: &'a mut Command, src: &str, out: &Path) -> &'a mut Command {
    cmd.args(["pull", src, "--plain-http", "--out"])
        .arg(out)
        .args(["--retry-base-ms", "20"])
}

/// `publish DIR DEST EXTRA` through `cmd` in chunks of [`CHUNK`], with
/// a JSON summary.
pub fn publish_through(mut cmd: Command, dir: &Path, dest: &str, extra: &[&str]) -> Output {
    run(publish_args(&mut cmd, dir, dest, CHUNK)
        .arg("--json")
        .args(extra))
}

/// `publish DIR DEST EXTRA` with HOME = `home` ([`registry_ftpipe`]).
pub fn publish(home: &Path, dir: &Path, dest: &str, extra: &[&str]) -> Output {
    publish_through(registry_ftpipe(home), dir, dest, extra)
}

/// `pull SRC --out OUT EXTRA` through `cmd`, with a JSON summary.
pub fn pull_through(mut cmd: Command, src: &str, out: &Path, extra: &[&str]) -> Output {
    run(pull_args(&mut cmd, src, out).arg("--json").args(extra))
}

/// `pull SRC --out OUT EXTRA` with HOME = `home` ([`registry_ftpipe`]).
pub fn pull(home: &Path, src: &str, out: &Path, extra: &[&str]) -> Output {
    pull_through(registry_ftpipe(home), src, out, extra)
}

/// `DIR/artifact`.
pub fn artifact_of(dir: &Path) -> PathBuf {
    dir.join("artifact")
}

/// Every file of `a` has the bytes of the same file in `b`, and both hold
/// the same files.
pub fn assert_same_files(a: &Path, b: &Path) {
    let names = tree_of(a);
    assert_eq!(names, tree_of(b), "file lists of {a:?} and {b:?}");
    for n in names {
        let (pa, pb) = (a.join(&n), b.join(&n));
        if pa.is_file() {
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{n} differs"
            );
        }
    }
}

/// `out`'s artifact holds `dir`'s files byte for byte and passes
/// `verify --deep`.
pub fn assert_pulled(dir: &Path, out: &Path) {
    assert_same_files(&artifact_of(dir), &artifact_of(out));
    verify_deep(&artifact_of(out));
}

/// `pull SRC --out OUT EXTRA` through `cmd`, which must succeed and end
/// as [`assert_pulled`] says of `dir`; its output.
pub fn pull_identical(cmd: Command, src: &str, out: &Path, dir: &Path, extra: &[&str]) -> Output {
    let o = ok(pull_through(cmd, src, out, extra), &format!("pull {src}"));
    assert_pulled(dir, out);
    o
}

/// `o`'s stdout and stderr, as text.
pub fn output_text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(o))
}

/// `secret` in no state database of `dirs` (`what` names it).
pub fn assert_not_in_state(dirs: &[&Path], secret: &str, what: &str) {
    for d in dirs {
        let db = std::fs::read(d.join(".ftpipe/state.db")).unwrap();
        assert!(
            !String::from_utf8_lossy(&db).contains(secret),
            "{what} in {d:?}'s state"
        );
    }
}

/// A temp HOME and DIR built from `seed` in it (`crate::s3::built`).
pub fn built_at_home(seed: u64) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = built(tmp.path(), seed);
    (tmp, dir)
}

/// `publish DIR REGISTRY/TO --mount-from FROM` (HOME = `home`), which
/// must succeed: its JSON summary.
pub fn publish_mounting(
    home: &Path,
    dir: &Path,
    reg: &Registry,
    to: &str,
    from: &str,
) -> serde_json::Value {
    let o = publish(home, dir, &reg.reference(to), &["--mount-from", from]);
    summary(&ok(o, &format!("publish {to} --mount-from {from}")))
}

/// A test's start: a temp HOME, DIR built from a seed
/// (`crate::s3::built`), and a registry holding DIR's artifact.
pub struct Published {
    /// HOME of every command, and where DIR and pulls go.
    pub tmp: tempfile::TempDir,
    /// DIR, as `ftpipe run` left it.
    pub dir: PathBuf,
    /// The registry.
    pub reg: Registry,
}

impl Published {
    /// DIR from `seed` published to a fresh anonymous registry as
    /// `models/qwen:v1`.
    pub fn new(seed: u64) -> Published {
        Published::to(Registry::start(), seed, "models/qwen:v1")
    }

    /// DIR from `seed` published to `reg` as `repo_tag`.
    pub fn to(reg: Registry, seed: u64, repo_tag: &str) -> Published {
        let (tmp, dir) = built_at_home(seed);
        let o = publish(tmp.path(), &dir, &reg.reference(repo_tag), &[]);
        ok(o, &format!("publish {repo_tag}"));
        Published { tmp, dir, reg }
    }

    /// HOME.
    pub fn home(&self) -> &Path {
        self.tmp.path()
    }

    /// `HOME/name`.
    pub fn out(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// [`pull_identical`] of `repo_tag` into `HOME/name`: the directory.
    pub fn pull_identical(&self, repo_tag: &str, name: &str) -> PathBuf {
        let out = self.out(name);
        let cmd = registry_ftpipe(self.home());
        pull_identical(cmd, &self.reg.reference(repo_tag), &out, &self.dir, &[]);
        out
    }

    /// The manifest of `models/qwen:v1`, as JSON.
    pub fn manifest_json(&self) -> serde_json::Value {
        let (_, bytes) = self.reg.manifest("models/qwen", "v1");
        serde_json::from_slice(&bytes).unwrap()
    }

    /// `manifest` put as `models/qwen:TAG` (the registry takes it), then
    /// pulled: the pull fails naming `needles`, and reads no blob.
    pub fn pull_of_edited_manifest_is_refused(
        &self,
        tag: &str,
        manifest: &serde_json::Value,
        needles: &[&str],
    ) {
        self.reg.put_manifest("models/qwen", tag, manifest);
        let before = self.reg.requests().len();
        let out = self.out(&format!("pulled-{tag}"));
        let src = self.reg.reference(&format!("models/qwen:{tag}"));
        let o = pull(self.home(), &src, &out, &[]);
        assert!(!o.status.success(), "{tag}: pulled");
        assert_names(&stderr(&o), needles);
        let blob_reads: Vec<_> = self.reg.requests()[before..]
            .iter()
            .filter(|r| r.path.contains("/blobs/"))
            .cloned()
            .collect();
        assert!(
            blob_reads.is_empty(),
            "{tag}: blobs read before the manifest was checked: {blob_reads:?}"
        );
    }
}

/// The tag, when it is there, names `dir`'s artifact and every blob its
/// manifest names is in the repository with its size: nothing
/// half-published is ever visible. Whether the tag is there.
pub fn check_tag(reg: &Registry, repo: &str, tag: &str, dir: &Path, label: &str) -> bool {
    let (status, _, bytes) = reg
        .get(
            &format!("/v2/{repo}/manifests/{tag}"),
            Some("application/vnd.oci.image.manifest.v1+json"),
        )
        .unwrap();
    if status == 404 {
        return false;
    }
    assert_eq!(status, 200, "{label}");
    let m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let ours = manifest_json(dir);
    assert_eq!(
        m["annotations"]["dev.ftpipe.artifact.fingerprint"], ours["fingerprint"],
        "{label}"
    );
    let blobs = m["layers"].as_array().unwrap().iter().chain([&m["config"]]);
    for b in blobs {
        let digest = b["digest"].as_str().unwrap();
        let (status, headers, _) = reg
            .request("HEAD", &format!("/v2/{repo}/blobs/{digest}"), None, &[])
            .unwrap();
        assert_eq!(status, 200, "{label}: the tag names {digest}, not there");
        let len = headers.iter().find(|(k, _)| k == "content-length").unwrap();
        assert_eq!(len.1, b["size"].to_string(), "{label}: {digest}");
    }
    true
}

/// How a publish kill storm ended.
pub struct StormEnd {
    /// The repository of each chain (`storm{N}/qwen`), the last one run to
    /// its end.
    pub repos: Vec<String>,
    /// The last chain's run to its end (with a JSON summary).
    pub last: Output,
}

/// A kill storm over `publish SRC REGISTRY/storm{N}/qwen:v1 EXTRA`: the
/// moments are calibrated on a publish to `calibration/qwen`; at least
/// `kills()` SIGKILLs (`KILLS`, `FTPIPE_CRASH_SEED`) at seeded moments
/// below its time; after each the state database is intact and the tag,
/// once there, names a complete artifact ([`check_tag`]); a run that ends
/// by itself must have set the tag, and the next chain begins in a fresh
/// repository. The last chain is run to its end. At least one kill must
/// land mid-publish: the killed run had sent a write request to its
/// repository, and the tag was not there.
pub fn publish_kill_storm(
    reg: &Registry,
    home: &Path,
    src: &Path,
    extra: &[&str],
    what: &str,
) -> StormEnd {
    use crate::s3_crash::{check_publish_state, kill_after, kills};
    let seed = crash_seed();
    eprintln!("{what} kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = ftpipe_fixtures::checkpoint::SplitMix64::new(seed);
    let t = Instant::now();
    let o = publish(home, src, &reg.reference("calibration/qwen:v1"), extra);
    ok(o, "calibration");
    let ms = (t.elapsed().as_millis() as u64).max(20);
    let mut repos = vec!["storm0/qwen".to_owned()];
    let (mut kill, mut mid_publish) = (0, 0);
    while kill < kills() {
        let repo = repos.last().unwrap().clone();
        let before = reg.requests().len();
        let delay = rng.next_u64() % ms;
        let label = format!("{what} kill {} after {delay} ms into {repo}", kill + 1);
        let mut cmd = registry_ftpipe(home);
        publish_args(&mut cmd, src, &reg.reference(&format!("{repo}:v1")), CHUNK).args(extra);
        if kill_after(&mut cmd, Duration::from_millis(delay), &label) {
            assert!(check_tag(reg, &repo, "v1", src, &label), "{label}: no tag");
            repos.push(format!("storm{}/qwen", repos.len()));
            continue;
        }
        kill += 1;
        check_publish_state(src, &label);
        let tagged = check_tag(reg, &repo, "v1", src, &label);
        let prefix = format!("/v2/{repo}/");
        let wrote = reg.requests()[before..]
            .iter()
            .any(|r| r.path.starts_with(&prefix) && r.method != "GET" && r.method != "HEAD");
        mid_publish += usize::from(wrote && !tagged);
    }
    eprintln!("{what}: {mid_publish} of {kill} kills landed mid-publish");
    assert!(mid_publish > 0, "no kill landed mid-publish");
    let repo = repos.last().unwrap();
    let last = publish(home, src, &reg.reference(&format!("{repo}:v1")), extra);
    let last = ok(last, "last chain");
    assert!(check_tag(reg, repo, "v1", src, "last chain"));
    StormEnd { repos, last }
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

/// A TCP proxy in front of a registry whose uplink misbehaves on cue.
/// Throttled ([`UplinkProxy::start`]): what a client sends on a
/// connection, from the first read holding `marker` on (a blob's digest:
/// only its upload is slow), `slow` bytes are read at most `rate` bytes
/// per second (4 KiB at a time); a request body larger than `rate` × the
/// client's read timeout takes longer to send than that timeout while
/// bytes keep moving. Held ([`UplinkProxy::hold_after`]): the first
/// connection carrying a marker (bytes of a blob: a request body) passes
/// a set number of bytes after it on and then reads nothing more until
/// [`UplinkProxy::cut`] closes its registry side — a request cut
/// mid-body. Answers are passed on at once. Every request the client
/// sends is counted: its request line and the body bytes passed on
/// ([`UplinkProxy::requests`]).
pub struct UplinkProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// The proxy of the tests that throttle an uplink.
pub type ThrottledProxy = UplinkProxy;

/// A request the proxy passed on.
#[derive(Debug, Clone)]
pub struct Relayed {
    /// `PATCH`, `PUT`, ...
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// Body bytes passed on to the registry.
    pub body: u64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// (marker, rate, slow) of a throttled proxy.
    throttle: Option<(Vec<u8>, u64, u64)>,
    /// (marker, bytes passed on after it): taken by the first connection
    /// carrying the marker.
    hold: Mutex<Option<(Vec<u8>, u64)>>,
    held: AtomicBool,
    cut: AtomicBool,
    requests: Mutex<Vec<Relayed>>,
}

impl UplinkProxy {
    /// A proxy to `upstream` (`HOST:PORT`) reading `rate` bytes a second
    /// once `marker` went by, for `slow` bytes.
    pub fn start(upstream: &str, rate: u64, marker: &str, slow: u64) -> UplinkProxy {
        let throttle = Some((marker.as_bytes().to_vec(), rate, slow));
        UplinkProxy::with(
            upstream,
            Shared {
                throttle,
                ..Shared::default()
            },
        )
    }

    /// A proxy to `upstream` passing everything on at once (until
    /// [`UplinkProxy::hold_after`]).
    pub fn passing(upstream: &str) -> UplinkProxy {
        UplinkProxy::with(upstream, Shared::default())
    }

    fn with(upstream: &str, shared: Shared) -> UplinkProxy {
        let upstream: SocketAddr = upstream.parse().expect("HOST:PORT");
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(shared);
        let serving = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if serving.stop.load(SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                relay(client, server, serving.clone());
            }
        });
        UplinkProxy { addr, shared }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The next connection whose client bytes hold `marker` passes
    /// `after` more bytes on, then holds (see the type).
    pub fn hold_after(&self, marker: &[u8], after: u64) {
        *self.shared.hold.lock().unwrap() = Some((marker.to_vec(), after));
    }

    /// Whether a connection holds.
    pub fn held(&self) -> bool {
        self.shared.held.load(SeqCst)
    }

    /// Closes the registry side of the held connection.
    pub fn cut(&self) {
        self.shared.cut.store(true, SeqCst);
    }

    /// Every request passed on so far, in the order they began.
    pub fn requests(&self) -> Vec<Relayed> {
        self.shared.requests.lock().unwrap().clone()
    }
}

impl Drop for UplinkProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.cut.store(true, SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `client` to `server` (as `shared` says) and `server` to
/// `client` at once, each on its own thread; either end closing closes
/// both.
fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (c_read, mut c_write) = (client.try_clone().unwrap(), client);
    let (mut s_read, s_write) = (server.try_clone().unwrap(), server);
    std::thread::spawn(move || Uplink::new(shared).pump(c_read, s_write));
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut s_read, &mut c_write);
        let _ = c_write.shutdown(Shutdown::Both);
    });
}

/// The client-to-registry half of one connection.
struct Uplink {
    shared: Arc<Shared>,
    /// The last bytes passed on (fewer than a marker): a marker split
    /// between two reads is found.
    tail: Vec<u8>,
    /// Bytes throttled so far, once the throttle's marker went by.
    throttled: Option<u64>,
    /// Bytes still passed on before the hold, once its marker went by.
    hold_left: Option<u64>,
    requests: RequestSplitter,
}

impl Uplink {
    fn new(shared: Arc<Shared>) -> Uplink {
        Uplink {
            shared,
            tail: Vec::new(),
            throttled: None,
            hold_left: None,
            requests: RequestSplitter::default(),
        }
    }

    fn pump(mut self, mut from: TcpStream, mut to: TcpStream) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            let chunk = &buf[..n];
            if n == 0 {
                break;
            }
            self.arm_hold(chunk);
            let pass = self.hold_left.map_or(n, |left| n.min(left as usize));
            self.requests.feed(&chunk[..pass], &self.shared.requests);
            if to.write_all(&chunk[..pass]).is_err() {
                break;
            }
            if let Some(left) = &mut self.hold_left {
                *left -= pass as u64;
                if *left == 0 {
                    self.hold(&from, &to);
                    return;
                }
            }
            self.throttle(chunk);
            self.keep_tail(chunk);
        }
        let _ = to.shutdown(Shutdown::Write);
    }

    /// Takes the proxy's hold when `chunk` completes its marker.
    fn arm_hold(&mut self, chunk: &[u8]) {
        if self.hold_left.is_some() {
            return;
        }
        let mut hold = self.shared.hold.lock().unwrap();
        let Some((marker, after)) = hold.as_ref() else {
            return;
        };
        if let Some(end) = marker_end(&self.tail, chunk, marker) {
            self.hold_left = Some(end as u64 + after);
            *hold = None;
        }
    }

    /// Reads nothing more until the proxy is told to cut; then closes
    /// both sides.
    fn hold(&self, from: &TcpStream, to: &TcpStream) {
        self.shared.held.store(true, SeqCst);
        while !self.shared.cut.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    }

    fn throttle(&mut self, chunk: &[u8]) {
        let Some((marker, rate, slow)) = &self.shared.throttle else {
            return;
        };
        if self.throttled.is_none() && marker_end(&self.tail, chunk, marker).is_some() {
            self.throttled = Some(0);
        }
        if let Some(done) = &mut self.throttled
            && *done < *slow
        {
            *done += chunk.len() as u64;
            let secs = chunk.len() as f64 / (*rate).max(1) as f64;
            std::thread::sleep(Duration::from_secs_f64(secs));
        }
    }

    fn keep_tail(&mut self, chunk: &[u8]) {
        const KEPT: usize = 256;
        self.tail.extend_from_slice(chunk);
        let cut = self.tail.len().saturating_sub(KEPT);
        self.tail.drain(..cut);
    }
}

/// Where `marker` (at most 256 bytes) ends in `chunk` when it ends there;
/// `tail` is the bytes passed on before `chunk`.
fn marker_end(tail: &[u8], chunk: &[u8], marker: &[u8]) -> Option<usize> {
    if marker.is_empty() {
        return None;
    }
    let joined = [tail, chunk].concat();
    joined
        .windows(marker.len())
        .position(|w| w == marker)
        .map(|at| at + marker.len())
        .filter(|end| *end > tail.len())
        .map(|end| end - tail.len())
}

/// Splits a client's bytes into HTTP/1.1 requests (a head to the blank
/// line, then `Content-Length` body bytes), counting each body.
#[derive(Default)]
struct RequestSplitter {
    head: Vec<u8>,
    body_left: u64,
    /// This connection's current request in the proxy's list.
    current: Option<usize>,
}

impl RequestSplitter {
    fn feed(&mut self, mut bytes: &[u8], log: &Mutex<Vec<Relayed>>) {
        while let Some((&first, rest)) = bytes.split_first() {
            if self.body_left > 0 {
                let n = bytes.len().min(self.body_left as usize);
                if let Some(i) = self.current {
                    log.lock().unwrap()[i].body += n as u64;
                }
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            self.head.push(first);
            bytes = rest;
            if self.head.ends_with(b"\r\n\r\n") {
                self.begin_request(log);
            }
        }
    }

    fn begin_request(&mut self, log: &Mutex<Vec<Relayed>>) {
        let head = String::from_utf8_lossy(&self.head).into_owned();
        self.head.clear();
        let mut line = head.lines().next().unwrap_or_default().split(' ');
        let (method, target) = (line.next(), line.next());
        self.body_left = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        let mut log = log.lock().unwrap();
        log.push(Relayed {
            method: method.unwrap_or_default().to_owned(),
            target: target.unwrap_or_default().to_owned(),
            body: 0,
        });
        self.current = Some(log.len() - 1);
    }
}
