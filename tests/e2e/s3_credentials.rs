//! Issue 36 (a new user's trial on a real cluster), items 1, 2 and the S3
//! half of 3, against a real moto server:
//!
//! * The credentials stopped at static keys and profiles: a profile with
//!   `credential_process`, and `AWS_WEB_IDENTITY_TOKEN_FILE` +
//!   `AWS_ROLE_ARN` (how EKS pods get credentials) ended in "none found".
//!   Both now pull with no static key in the environment, as do
//!   container credentials (ECS, EKS Pod Identity), from a moto that
//!   enforces IAM authentication where it can (so only the credentials the
//!   chain obtained work); none found lists the sources tried.
//! * An `http://` endpoint that is not loopback (in-cluster object
//!   storage) was refused with no way round it: it is accepted, with one
//!   warning line on stderr (moto bound to this machine's own non-loopback
//!   address).
//! * A wrong key printed the storage library's generic sentence and raw
//!   XML, and a missing bucket was reported as a missing object: each
//!   common S3 failure now gets one sentence with the fix and the server's
//!   code, no XML.

use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::lying_proxy::{Lie, LyingProxy};
use crate::common::s3::*;
use crate::common::*;
use crate::s3::{built, ok, publish, summary, verify_deep};

/// `ftpipe` against `m` with none of the tests' static keys in its
/// environment, no instance metadata (nothing answers it here), and
/// `extra` variables.
fn keyless(m: &Moto, home: &Path, extra: &[(&str, &str)]) -> Command {
    let mut cmd = m.ftpipe(home);
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for var in [
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// `pull SRC --out OUT --json` with `cmd`.
fn pull_with(cmd: &mut Command, src: &str, out: &Path) -> Output {
    run(cmd
        .args(["pull", src, "--out"])
        .arg(out)
        .args(["--retry-base-ms", "20", "--json"]))
}

/// No `secret` in `bytes`, nor in `DIR/.ftpipe/*`.
fn assert_absent(secret: &str, bytes: &[u8], dir: &Path) {
    let holds = |b: &[u8]| b.windows(secret.len()).any(|w| w == secret.as_bytes());
    assert!(!holds(bytes), "the output holds a credential");
    for e in std::fs::read_dir(dir.join(".ftpipe")).unwrap() {
        let p = e.unwrap().path();
        assert!(
            !holds(&std::fs::read(&p).unwrap()),
            "{} holds a credential",
            p.display()
        );
    }
}

/// moto cannot enforce authentication for web identity (its check wants
/// an `Authorization` header on the unsigned `AssumeRoleWithWebIdentity`),
/// so the proof is in what crossed the wire: STS and S3 both behind a
/// recording proxy, the STS call made, and every S3 request signed with
/// the temporary key STS issued (moto's start with `ASIA`), none with a
/// static one.
#[test]
fn web_identity_through_sts_pulls_with_no_static_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let m = Moto::start();
    let src = built(tmp.path(), 361);
    ok(publish(&m, &home, &src, "s3://models/wid"), "publish");
    let role = m.iam_role("puller");
    let proxy = LyingProxy::start(&m.endpoint());
    let token = tmp.path().join("token");
    std::fs::write(
        &token,
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJmdHBpcGUifQ.c2lnbmF0dXJl",
    )
    .unwrap();
    let out = tmp.path().join("node");
    let o = pull_with(
        &mut keyless(
            &m,
            &home,
            &[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().unwrap()),
                ("AWS_ROLE_ARN", &role),
                ("AWS_ROLE_SESSION_NAME", "ftpipe-e2e"),
                ("AWS_ENDPOINT_URL", &proxy.endpoint()),
                ("AWS_ENDPOINT_URL_STS", &proxy.endpoint()),
            ],
        ),
        "s3://models/wid",
        &out,
    );
    let o = ok(o, "pull with web identity");
    let from = summary(&o)["session"]["credentials_from"].clone();
    assert!(from.as_str().unwrap().contains("web identity"), "{from}");
    verify_deep(&out.join("artifact"));
    let seen = proxy.seen();
    let sts = seen
        .iter()
        .filter(|s| s.method == "POST" && s.target == "/")
        .count();
    assert_eq!(sts, 1, "one AssumeRoleWithWebIdentity: {seen:?}");
    let s3: Vec<_> = seen
        .iter()
        .filter(|s| s.target.starts_with("/models"))
        .collect();
    assert!(!s3.is_empty());
    for s in s3 {
        let key = s.key_id.as_deref().unwrap_or_default();
        assert!(key.starts_with("ASIA") && key != ACCESS_KEY_ID, "{s:?}");
    }
}

#[test]
fn a_credential_process_profile_pulls_with_no_static_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    let m = Moto::start();
    let src = built(tmp.path(), 362);
    ok(publish(&m, &home, &src, "s3://models/proc"), "publish");
    let (key_id, secret) = m.iam_user("reader", true);
    m.enforce_auth();
    let script = tmp.path().join("creds.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s' '{{\"Version\":1,\"AccessKeyId\":\"{key_id}\",\"SecretAccessKey\":\"{secret}\"}}'\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        home.join(".aws/config"),
        format!(
            "[profile proc]\nregion = us-east-1\ncredential_process = {}\n",
            script.display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("node");
    let o = pull_with(
        &mut keyless(&m, &home, &[("AWS_PROFILE", "proc")]),
        "s3://models/proc",
        &out,
    );
    let o = ok(o, "pull with credential_process");
    let from = summary(&o)["session"]["credentials_from"].clone();
    assert!(
        from.as_str()
            .unwrap()
            .contains("profile proc (credential_process)"),
        "{from}"
    );
    verify_deep(&out.join("artifact"));
    let mut both = o.stdout.clone();
    both.extend_from_slice(&o.stderr);
    assert_absent(&secret, &both, &out);
}

/// A container credentials endpoint (ECS, EKS Pod Identity) on loopback
/// answering every request with `key_id` and `secret`; its URL.
fn container_endpoint(key_id: &str, secret: &str, token: &str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/credentials", listener.local_addr().unwrap());
    let body = format!(
        r#"{{"AccessKeyId":"{key_id}","SecretAccessKey":"{secret}","Token":"{token}","Expiration":"2099-01-01T00:00:00Z"}}"#
    );
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut head);
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = std::io::Write::write_all(&mut conn, answer.as_bytes());
        }
    });
    url
}

#[test]
fn container_credentials_pull_with_no_static_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let m = Moto::start();
    let src = built(tmp.path(), 364);
    ok(publish(&m, &home, &src, "s3://models/pod"), "publish");
    // What the agent hands out: a role's temporary credentials.
    let role = m.iam_role("pod");
    let sts = m.query(
        "sts",
        &[
            ("Action", "AssumeRole"),
            ("RoleArn", &role),
            ("RoleSessionName", "pod"),
            ("Version", "2011-06-15"),
        ],
    );
    let field = |name| xml_text(&sts, name).unwrap_or_else(|| panic!("AssumeRole: {name}"));
    let (key_id, secret, token) = (
        field("AccessKeyId"),
        field("SecretAccessKey"),
        field("SessionToken"),
    );
    m.enforce_auth();
    let url = container_endpoint(&key_id, &secret, &token);
    let out = tmp.path().join("node");
    let o = pull_with(
        &mut keyless(&m, &home, &[("AWS_CONTAINER_CREDENTIALS_FULL_URI", &url)]),
        "s3://models/pod",
        &out,
    );
    let o = ok(o, "pull with container credentials");
    let from = summary(&o)["session"]["credentials_from"].clone();
    assert!(
        from.as_str().unwrap().contains("container credentials"),
        "{from}"
    );
    verify_deep(&out.join("artifact"));
    let mut both = o.stdout.clone();
    both.extend_from_slice(&o.stderr);
    assert_absent(&secret, &both, &out);
}

/// An address of this machine that is not loopback (the first global IPv4
/// address `ip` lists), `None` when it has none.
fn non_loopback_address() -> Option<IpAddr> {
    let o = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| {
            let cidr = l.split_whitespace().skip_while(|w| *w != "inet").nth(1)?;
            cidr.split('/').next()?.parse::<IpAddr>().ok()
        })
        .filter(|a| !a.is_loopback())
}

/// A non-loopback address (in 198.18.0.0/15, the benchmarking range)
/// added to `lo` for as long as it is held (`ip addr add`, root needed).
struct AddedAddress(String);

impl AddedAddress {
    fn add() -> Option<(IpAddr, AddedAddress)> {
        let pid = std::process::id();
        let cidr = format!("198.18.{}.{}/32", (pid >> 8) % 256, pid % 254 + 1);
        let ok = Command::new("ip")
            .args(["addr", "add", &cidr, "dev", "lo"])
            .status()
            .is_ok_and(|s| s.success());
        let ip = cidr.trim_end_matches("/32").parse().ok()?;
        ok.then(|| (ip, AddedAddress(cidr)))
    }
}

impl Drop for AddedAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["addr", "del", &self.0, "dev", "lo"])
            .status();
    }
}

#[test]
fn a_plain_http_endpoint_on_another_host_is_accepted_with_one_warning() {
    // This machine's own address, else one added for the test.
    let (ip, _added) = match non_loopback_address() {
        Some(ip) => (ip, None),
        None => match AddedAddress::add() {
            Some((ip, added)) => (ip, Some(added)),
            None => {
                skip_unless_ci(
                    "this machine has no non-loopback IPv4 address to bind moto to, and \
                     `ip addr add 198.18.x.y/32 dev lo` failed (not root?)",
                );
                return;
            }
        },
    };
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let m = Moto::start_on(ip);
    let endpoint = m.endpoint();
    let src = built(tmp.path(), 363);
    // Given in the environment (AWS_ENDPOINT_URL, as `Moto::ftpipe` sets).
    let o = ok(publish(&m, &home, &src, "s3://models/lan"), "publish");
    let warning = format!("warning: S3 endpoint {endpoint} is plain http");
    let warnings = |o: &Output| {
        stderr(o)
            .lines()
            .filter(|l| l.contains("plain http"))
            .count()
    };
    assert_names(&stderr(&o), &[&warning, "unencrypted"]);
    assert_eq!(warnings(&o), 1, "{}", stderr(&o));
    // Given as the flag, the environment naming nothing.
    let out = tmp.path().join("node");
    let o = run(m
        .ftpipe(&home)
        .env_remove("AWS_ENDPOINT_URL")
        .args(["pull", "s3://models/lan", "--out"])
        .arg(&out)
        .args(["--s3-endpoint", &endpoint]));
    let o = ok(o, "pull over plain http");
    assert_eq!(warnings(&o), 1, "{}", stderr(&o));
    verify_deep(&out.join("artifact"));
    // Credentials inside the URL stay refused, and unshown.
    let with_keys = endpoint.replacen("http://", "http://user:pass-in-url-0001@", 1);
    let o = run(m
        .ftpipe(&home)
        .args(["pull", "s3://models/lan", "--out"])
        .arg(tmp.path().join("x"))
        .args(["--s3-endpoint", &with_keys]));
    assert_eq!(o.status.code(), Some(1));
    assert_names(
        &stderr(&o),
        &["credentials in the endpoint URL are refused"],
    );
    assert!(!stderr(&o).contains("pass-in-url-0001"), "{}", stderr(&o));
    // Loopback plain http crosses no network: no warning.
    let local = Moto::start();
    let o = ok(publish(&local, &home, &src, "s3://models/lan"), "publish");
    assert_eq!(warnings(&o), 0, "{}", stderr(&o));
}

/// `pull s3://LOCATION` with `key_id` and `secret` against `endpoint`: its
/// output, after checking it failed with exit code 1 and no XML.
fn refused_pull(
    m: &Moto,
    home: &Path,
    endpoint: &str,
    location: &str,
    keys: (&str, &str),
) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let o = run(m
        .ftpipe(home)
        .env_remove("AWS_SESSION_TOKEN")
        .env("AWS_ACCESS_KEY_ID", keys.0)
        .env("AWS_SECRET_ACCESS_KEY", keys.1)
        .env("AWS_ENDPOINT_URL", endpoint)
        .args(["pull", location, "--out"])
        .arg(dir.path().join("node"))
        .args(["--retry-base-ms", "20"]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        !err.contains('<') && !err.contains("xml"),
        "XML on stderr:\n{err}"
    );
    assert!(!err.contains(keys.1), "the secret on stderr:\n{err}");
    o
}

#[test]
fn common_s3_failures_get_one_sentence_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let m = Moto::start();
    let (reader, reader_secret) = m.iam_user("reader", true);
    let (nobody, nobody_secret) = m.iam_user("nobody", false);
    m.enforce_auth();
    let e = m.endpoint();
    let at = "s3://models/none";

    let o = refused_pull(
        &m,
        &home,
        &e,
        "s3://no-such-bucket/x",
        (&reader, &reader_secret),
    );
    assert_names(
        &stderr(&o),
        &[
            "the bucket no-such-bucket does not exist",
            "NoSuchBucket",
            "check the bucket name",
        ],
    );
    // Not the missing object it used to be reported as.
    assert!(
        !stderr(&o).contains("nothing is published"),
        "{}",
        stderr(&o)
    );
    assert!(
        !stderr(&o).contains("manifest.json does not exist"),
        "{}",
        stderr(&o)
    );

    let o = refused_pull(&m, &home, &e, at, (&nobody, &nobody_secret));
    assert_names(
        &stderr(&o),
        &[
            "access denied",
            "grant them access to bucket models",
            "AccessDenied",
        ],
    );

    let o = refused_pull(
        &m,
        &home,
        &e,
        at,
        ("AKIANOSUCHKEY0000001", "no-such-secret-0001"),
    );
    assert_names(
        &stderr(&o),
        &[
            "knows no such access key id (the credentials from environment)",
            "InvalidAccessKeyId",
        ],
    );

    let o = refused_pull(
        &m,
        &home,
        &e,
        at,
        (&reader, "a-wrong-secret-access-key-0001"),
    );
    assert_names(
        &stderr(&o),
        &[
            "signature does not match",
            "AWS_SECRET_ACCESS_KEY",
            "SignatureDoesNotMatch",
        ],
    );

    // S3 shedding load, still after object_store's own retries.
    let proxy = LyingProxy::start(&e);
    proxy.lie("none/manifest.json", Lie::SlowDown, 20);
    let o = refused_pull(&m, &home, &proxy.endpoint(), at, (&reader, &reader_secret));
    assert_names(
        &stderr(&o),
        &[
            "asked to slow down",
            "fewer --connections",
            "HTTP 503 SlowDown",
        ],
    );
}

#[test]
fn no_credentials_anywhere_lists_the_sources_tried() {
    let tmp = tempfile::tempdir().unwrap();
    let m = Moto::start();
    let o = pull_with(
        &mut keyless(&m, tmp.path(), &[]),
        "s3://models/x",
        &tmp.path().join("node"),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let home = tmp.path().display().to_string();
    assert_names(
        &stderr(&o),
        &[
            "S3 credentials: none found; tried, in order:",
            "environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY not set",
            &format!(
                "profile default in {home}/.aws/credentials and {home}/.aws/config: no keys, credential_process, sso or role_arn"
            ),
            "web identity: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN not set",
            "container credentials: neither AWS_CONTAINER_CREDENTIALS_FULL_URI nor AWS_CONTAINER_CREDENTIALS_RELATIVE_URI set",
            "instance profile (IMDSv2): disabled by AWS_EC2_METADATA_DISABLED",
        ],
    );
}

/// The chain's parser reads the shared AWS files whole and with no limit:
/// a config file that is a FIFO nobody writes held a pull forever, and a
/// huge one was read into memory. Both are refused before the chain runs,
/// naming the file; so is a web identity token file that is too large.
#[test]
fn shared_aws_files_that_are_not_regular_or_too_large_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let m = Moto::start();
    let fifo = tmp.path().join("config-fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let started = std::time::Instant::now();
    let o = pull_with(
        &mut keyless(
            &m,
            tmp.path(),
            &[("AWS_CONFIG_FILE", fifo.to_str().unwrap())],
        ),
        "s3://models/x",
        &tmp.path().join("node"),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_names(&stderr(&o), &[fifo.to_str().unwrap(), "not a regular file"]);

    let big = tmp.path().join("credentials-big");
    let f = std::fs::File::options()
        .create_new(true)
        .write(true)
        .open(&big)
        .unwrap();
    f.set_len(2 << 20).unwrap();
    let token = tmp.path().join("token-big");
    let t = std::fs::File::options()
        .create_new(true)
        .write(true)
        .open(&token)
        .unwrap();
    t.set_len(1 << 20).unwrap();
    let o = pull_with(
        &mut keyless(
            &m,
            tmp.path(),
            &[
                ("AWS_SHARED_CREDENTIALS_FILE", big.to_str().unwrap()),
                ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().unwrap()),
                ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/r"),
            ],
        ),
        "s3://models/x",
        &tmp.path().join("node2"),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &[
            &format!("{}: 2097152 bytes, at most 1048576 are read", big.display()),
            &format!("{}: 1048576 bytes, at most 65536 are read", token.display()),
        ],
    );
}

/// Asking the chain had no bound: a `credential_process` that never
/// answers (or an STS, container or metadata endpoint that stalls) held
/// the command forever. Each ask of the chain ends at `--read-timeout`,
/// with an error saying so.
#[test]
fn a_credential_process_that_never_answers_ends_at_the_read_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    let m = Moto::start();
    let script = tmp.path().join("silent.sh");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 120\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        home.join(".aws/config"),
        format!(
            "[profile silent]\nregion = us-east-1\ncredential_process = {}\n",
            script.display()
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let o = run(keyless(&m, &home, &[("AWS_PROFILE", "silent")])
        .args(["pull", "s3://models/x", "--read-timeout", "2", "--out"])
        .arg(tmp.path().join("node")));
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
}

/// Regression: a publish refused at the checksum HEAD (a presigned HEAD:
/// S3 answers a refused HEAD 403 with no error document to read) failed
/// with only "the server answered HTTP 403", while every other refusal
/// says what to fix. The 403 of a HEAD now says what it can be and where
/// the credentials came from. (moto answers a HEAD its IAM policy refuses
/// with a 500, so the lying proxy gives S3's answer.)
#[test]
fn a_publish_refused_at_the_checksum_head_says_what_to_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let src = built(tmp.path(), 361);
    let m = Moto::start();
    let proxy = LyingProxy::start(&m.endpoint());
    proxy.lie("model.ftw", Lie::ForbidHead, 20);
    let o = run(m
        .ftpipe(tmp.path())
        .env("AWS_ENDPOINT_URL", proxy.endpoint())
        .arg("publish")
        .arg(&src)
        .arg("s3://models/forbidden-head"));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        proxy
            .seen()
            .iter()
            .any(|s| s.method == "HEAD" && s.target.contains("model.ftw")),
        "{:#?}",
        proxy.seen()
    );
    assert_names(
        &err,
        &[
            "S3 head of s3://models/forbidden-head/",
            "HTTP 403 with no error document",
            "the credentials from environment are refused for bucket models",
            "s3:GetObject",
        ],
    );
}
