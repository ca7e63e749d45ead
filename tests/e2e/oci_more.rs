//! More of issue 38 against the real distribution registry
//! (`common::registry`): cross-repository mounts (`publish --mount-from`,
//! and a kill storm over a mounting publish), credential helpers (`credHelpers`, `credsStore`), uploads slower than
//! `--read-timeout`, and the smaller refusals of `pull oci://`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::registry::*;
use crate::common::*;
use crate::s3::{ok, summary};

/// Blob uploads (`POST` opening a session, `PATCH`, `PUT ?digest=`) to
/// `repo` in the registry's log from index `from` on.
fn blob_uploads(reg: &Registry, repo: &str, from: usize) -> Vec<Logged> {
    let prefix = format!("/v2/{repo}/blobs/uploads/");
    reg.requests()
        .into_iter()
        .skip(from)
        .filter(|r| r.path.starts_with(&prefix))
        .collect()
}

/// DIR from `seed` published to a fresh registry as `models/a:v1`, the
/// repository blobs are mounted from, and its manifest digest.
fn mount_source(seed: u64) -> (Published, String) {
    let p = Published::to(Registry::start(), seed, "models/a:v1");
    let (digest, _) = p.reg.manifest("models/a", "v1");
    (p, digest)
}

/// Bug: `publish` had no way to name a source repository, so a second
/// repository of the same registry got every blob sent again (issue 38:
/// "cross-repository mount when the source repository is given"). With
/// `--mount-from`, every blob is one `POST ?mount=&from=` answered `201`:
/// no `PATCH`, no `PUT` of a blob, no body byte sent; the outcome says
/// how many blobs and bytes were mounted; the manifest digest of the
/// second repository is the first's and it pulls byte-identical.
#[test]
fn a_publish_mounts_every_blob_from_the_named_repository() {
    let _g = time_bounded();
    let (p, a) = mount_source(3830);
    let reg = &p.reg;
    let before = reg.requests().len();
    let b = publish_mounting(p.home(), &p.dir, reg, "models/b:v1", "models/a");
    let objects = b["outcome"]["objects"].as_u64().unwrap();
    assert_eq!(b["outcome"]["mounted"].as_u64(), Some(objects), "{b}");
    assert_eq!(b["outcome"]["uploaded"], 0, "{b}");
    assert_eq!(b["outcome"]["bytes_sent"], 0, "{b}");
    assert!(b["outcome"]["mounted_bytes"].as_u64().unwrap() > 0, "{b}");
    let uploads = blob_uploads(reg, "models/b", before);
    assert_eq!(uploads.len() as u64, objects, "{uploads:?}");
    for u in &uploads {
        assert!(
            u.method == "POST" && u.path.contains("mount=") && u.status == 201,
            "not a mount: {u:?}"
        );
    }
    assert_eq!(b["outcome"]["manifest_digest"], a.as_str());
    assert_eq!(reg.manifest("models/b", "v1").0, a);
    p.pull_identical("models/b:v1", "pulled");
}

/// Bug: a mount the registry answers `202` (the source repository lacks
/// the blob) must go on as the upload the registry opened, not as a
/// second session: every blob's session is the mount's (each `POST` to
/// the repository carries `mount=`), none is mounted, and the artifact
/// pulls byte-identical.
#[test]
fn a_mount_answered_with_an_upload_session_continues_it() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3831);
    let reg = Registry::start();
    let s = publish_mounting(tmp.path(), &dir, &reg, "models/b:v1", "models/nowhere");
    assert_eq!(s["outcome"]["mounted"], 0, "{s}");
    assert_eq!(s["outcome"]["uploaded"], s["outcome"]["objects"], "{s}");
    let posts: Vec<_> = blob_uploads(&reg, "models/b", 0)
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(
        posts.len() as u64,
        s["outcome"]["objects"].as_u64().unwrap(),
        "{posts:?}"
    );
    assert!(
        posts
            .iter()
            .all(|p| p.path.contains("mount=") && p.status == 202),
        "a session besides the mount's: {posts:?}"
    );
    let out = tmp.path().join("pulled");
    let src = reg.reference("models/b:v1");
    pull_identical(registry_ftpipe(tmp.path()), &src, &out, &dir, &[]);
}

/// Bug: under the Bearer flow a mount's challenge names two scopes
/// space-separated (this repository's push, the source's pull) and the
/// token was asked for with them as one `scope` parameter, which a token
/// service reads as one malformed scope. Each is now its own parameter:
/// a token granting `repository:models/a:pull` is issued and every blob
/// is mounted.
#[test]
fn a_mount_under_bearer_tokens_asks_for_the_source_s_pull_scope() {
    let _g = time_bounded();
    let p = Published::to(Registry::start_with_tokens(), 3832, "models/a:v1");
    let s = publish_mounting(p.home(), &p.dir, &p.reg, "models/b:v1", "models/a");
    assert_eq!(s["outcome"]["mounted"], s["outcome"]["objects"], "{s}");
    assert_eq!(s["outcome"]["bytes_sent"], 0, "{s}");
    let tokens = p.reg.tokens_issued();
    assert!(
        tokens
            .iter()
            .any(|t| t.split(' ').any(|s| s == "repository:models/a:pull")
                && t.contains("repository:models/b:")),
        "no token for the mount's two scopes: {tokens:?}"
    );
}

/// `ftpipe` with `DOCKER_CONFIG=docker` (its `config.json` = `config`),
/// no other auth file, and `bin` first on `PATH` (where the test's
/// credential helpers are).
fn with_docker_config(home: &Path, config: &str, bin: &Path) -> Command {
    let docker = home.join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(docker.join("config.json"), config).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = registry_ftpipe(home);
    cmd.env("DOCKER_CONFIG", &docker).env("PATH", path);
    cmd
}

/// Writes the executable `bin/docker-credential-NAME` running `script`
/// (a POSIX shell script: the helper protocol is a program on `PATH`).
fn helper(bin: &Path, name: &str, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(bin).unwrap();
    let path = bin.join(format!("docker-credential-{name}"));
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Bug: credential helpers (`credHelpers`, `credsStore`) were not run, so
/// a registry whose credentials live in a helper (docker's default on a
/// desktop, `docker-credential-ecr-login`, `-gcloud`) was a `401`. The
/// helper named for the registry is run as `get` with the registry on
/// stdin and its `{"Username","Secret"}` answer authenticates the publish
/// (`credHelpers`) and the pull (`credsStore`); the summary names the
/// helper; the secret reaches no output and no state database.
#[test]
fn credential_helpers_give_the_registry_s_credentials() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3833);
    let reg = Registry::start_with_auth();
    let bin = tmp.path().join("bin");
    let asked = tmp.path().join("asked");
    helper(
        &bin,
        "fttest",
        &format!(
            "[ \"$1\" = get ] || exit 3\ncat > '{}'\nprintf '{{\"ServerURL\":\"x\",\"Username\":\"{REGISTRY_USER}\",\"Secret\":\"{REGISTRY_PASSWORD}\"}}'",
            asked.display()
        ),
    );
    let config = format!(
        r#"{{"auths":{{"{h}":{{}}}},"credHelpers":{{"{h}":"fttest"}}}}"#,
        h = reg.host()
    );
    let dest = reg.reference("models/qwen:v1");
    let o = publish_through(
        with_docker_config(tmp.path(), &config, &bin),
        &dir,
        &dest,
        &[],
    );
    let o = ok(o, "publish with credHelpers");
    let s = summary(&o);
    assert_eq!(std::fs::read_to_string(&asked).unwrap(), reg.host());
    let from = s["session"]["credentials_from"].as_str().unwrap();
    assert!(from.contains("docker-credential-fttest"), "{s}");
    let mut text = output_text(&o);

    let config = r#"{"credsStore":"fttest"}"#;
    let out = tmp.path().join("pulled");
    let cmd = with_docker_config(tmp.path(), config, &bin);
    text.push_str(&output_text(&pull_identical(cmd, &dest, &out, &dir, &[])));
    assert!(
        !text.contains(REGISTRY_PASSWORD),
        "the secret in the output"
    );
    assert_not_in_state(&[&dir, &out], REGISTRY_PASSWORD, "the secret");
}

/// Bug (with helpers run at all): a helper that hangs, fails or answers
/// garbage must end in bounded time in an error naming the helper and
/// never show its output (a failing helper may print the secret). A
/// hanging one (a shell waiting on a child) is killed with its process
/// group at `--read-timeout`.
#[test]
fn a_hanging_failing_or_garbled_credential_helper_is_a_clear_error() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3834);
    let reg = Registry::start_with_auth();
    let bin = tmp.path().join("bin");
    let leaked = "helper-printed-secret-0042";
    helper(&bin, "fthang", "cat > /dev/null\nsleep 120\necho '{}'");
    helper(&bin, "ftfail", &format!("echo '{leaked}'\nexit 1"));
    helper(&bin, "ftgarble", &format!("echo 'Username: {leaked}'"));
    let dest = reg.reference("models/qwen:v1");
    for (name, says) in [
        ("fthang", "no answer within"),
        ("ftfail", "failed"),
        ("ftgarble", "not {\"Username\",\"Secret\"} JSON"),
    ] {
        let config = format!(r#"{{"credHelpers":{{"{}":"{name}"}}}}"#, reg.host());
        let t = std::time::Instant::now();
        let cmd = with_docker_config(tmp.path(), &config, &bin);
        let o = publish_through(cmd, &dir, &dest, &["--read-timeout", "2"]);
        assert!(!o.status.success(), "{name}: published");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{name}: took {:?}",
            t.elapsed()
        );
        let err = stderr(&o);
        assert_names(&err, &[&format!("docker-credential-{name}"), says]);
        let all = output_text(&o);
        assert!(!all.contains(leaked), "{name}: its output shown: {all}");
    }
}

/// Bug: a docker `config.json` that is not JSON aborted every registry
/// command, also against a registry that needs no credentials. Now it is
/// a warning naming the file and the publish goes on anonymously; when
/// the registry does ask for credentials the error names the unreadable
/// file.
#[test]
fn an_auth_file_that_is_not_json_is_a_warning_until_credentials_are_needed() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3835);
    let bin = tmp.path().join("bin");
    let config = "{\"auths\": {not json";
    let file = tmp.path().join("docker/config.json").display().to_string();
    let open = Registry::start();
    let cmd = with_docker_config(tmp.path(), config, &bin);
    let o = publish_through(cmd, &dir, &open.reference("models/qwen:v1"), &[]);
    let o = ok(o, "anonymous publish beside a broken config.json");
    assert_names(&stderr(&o), &["warning", &file, "not JSON"]);

    let locked = Registry::start_with_auth();
    let cmd = with_docker_config(tmp.path(), config, &bin);
    let o = publish_through(cmd, &dir, &locked.reference("models/qwen:v1"), &[]);
    assert!(!o.status.success(), "published without credentials");
    assert_names(&stderr(&o), &["Basic", &file, "not JSON"]);
}

/// Bug: a manifest without a `placement.json` layer was found out only
/// after every component had been downloaded (when its layer had been
/// renamed), or refused as having "layers that are not files of the
/// artifact: []" (when it had been dropped). Both are now refused before
/// any blob is read, naming `placement.json`.
#[test]
fn a_manifest_without_placement_is_refused_before_any_blob_is_read() {
    let _g = time_bounded();
    let p = Published::new(3836);
    let good = p.manifest_json();
    let placement = good["layers"]
        .as_array()
        .unwrap()
        .iter()
        .position(|l| l["annotations"]["org.cncf.model.filepath"] == "placement.json")
        .expect("a placement.json layer");
    for tag in ["dropped", "renamed"] {
        let mut m = good.clone();
        if tag == "dropped" {
            m["layers"].as_array_mut().unwrap().remove(placement);
        } else {
            let a = &mut m["layers"][placement]["annotations"];
            a["org.cncf.model.filepath"] = "notes.json".into();
            a["org.opencontainers.image.title"] = "notes.json".into();
        }
        p.pull_of_edited_manifest_is_refused(tag, &m, &["placement.json", "layer"]);
    }
}

/// A publish of DIR to a fresh registry through a proxy reading the
/// largest blob slowly ([`UplinkProxy::start`]).
struct SlowUplink {
    reg: Registry,
    /// The publish: every blob in one request (`--part-size 64MiB`),
    /// `--read-timeout 1`.
    publish: Output,
    took: Duration,
    /// The largest blob's size and digest.
    largest: u64,
    digest: String,
}

/// [`SlowUplink`] of `dir` with the largest blob read at `rate(its
/// size)` bytes a second.
fn publish_over_a_slow_uplink(home: &Path, dir: &Path, rate: fn(u64) -> u64) -> SlowUplink {
    let reg = Registry::start();
    let path = std::fs::read_dir(artifact_of(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| p.metadata().unwrap().len())
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (largest, digest) = (bytes.len() as u64, sha256_hex(&bytes));
    let proxy = UplinkProxy::start(&reg.host(), rate(largest), &digest, largest);
    let dest = format!("oci://{}/models/qwen:v1", proxy.host());
    let t = Instant::now();
    let mut cmd = registry_ftpipe(home);
    let publish = run(publish_args(&mut cmd, dir, &dest, "64MiB")
        .arg("--json")
        .args(["--read-timeout", "1"]));
    SlowUplink {
        reg,
        publish,
        took: t.elapsed(),
        largest,
        digest,
    }
}

/// Whether reqwest's `read_timeout` cuts an upload whose body takes longer
/// than `--read-timeout` to send over a slow uplink (the answer is not
/// due before the body is sent): it did (the publish failed with
/// "operation timed out"). Every blob goes in one request, the largest
/// through a proxy that reads a third of it a second, with
/// `--read-timeout 1`. The publish must succeed and pull byte-identical.
#[test]
fn an_upload_slower_than_the_read_timeout_is_not_cut() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3837);
    let rate = |largest: u64| (largest / 3).max(4096);
    let slow = publish_over_a_slow_uplink(tmp.path(), &dir, rate);
    let o = ok(slow.publish, "publish over a slow uplink");
    assert!(
        slow.took >= Duration::from_secs(2),
        "the largest blob ({} bytes at {} B/s) was not slow to send",
        slow.largest,
        rate(slow.largest)
    );
    assert_eq!(summary(&o)["outcome"]["already_published"], false);
    let out = tmp.path().join("pulled");
    let src = slow.reg.reference("models/qwen:v1");
    pull_identical(registry_ftpipe(tmp.path()), &src, &out, &dir, &[]);
}

/// Guards the fix above: uploads lost `reqwest`'s read timeout, so a
/// registry that stops reading a blob's body would hang the publish
/// without the body-progress check. Behind a proxy that reads 512 bytes a
/// second (the largest blob would take many minutes), the publish fails
/// within seconds of `--read-timeout 1` plus the unseen tail's allowance,
/// naming the blob, the read timeout and how far the body got.
#[test]
fn a_stalled_upload_ends_at_the_read_timeout() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3839);
    let slow = publish_over_a_slow_uplink(tmp.path(), &dir, |_| 512);
    let o = slow.publish;
    assert!(!o.status.success(), "published through a stalled uplink");
    let limit = 1 + slow.largest.min(8 << 20) / (64 << 10) + 10;
    assert!(
        slow.took < Duration::from_secs(limit),
        "took {:?} (limit {limit} s)",
        slow.took
    );
    assert_names(
        &stderr(&o),
        &[
            &slow.digest,
            "no progress for 1 s",
            "--read-timeout",
            "body bytes sent",
        ],
    );
}

/// Bug: a helper answering an identity token (`Username` `<token>`, what
/// `docker login` stores for registries with OAuth2) could not be used
/// (refused as unsupported; as a Basic password to the realm it would be
/// refused there). It is a refresh token: the realm is
/// asked with `POST grant_type=refresh_token` and answers an
/// `access_token` (every token of the publish came that way, none was
/// refused); a Basic registry is told the credentials are an identity
/// token; the token reaches no output and no state database.
#[test]
fn an_identity_token_from_a_helper_is_a_refresh_token_for_the_realm() {
    let _g = time_bounded();
    let (tmp, dir) = built_at_home(3840);
    let reg = Registry::start_with_tokens();
    let token = "ftpipe-identity-token-0007";
    reg.accept_identity_token(token);
    let bin = tmp.path().join("bin");
    helper(
        &bin,
        "ftid",
        &format!("cat > /dev/null\nprintf '{{\"Username\":\"<token>\",\"Secret\":\"{token}\"}}'"),
    );
    let config = format!(r#"{{"credHelpers":{{"{}":"ftid"}}}}"#, reg.host());
    let cmd = with_docker_config(tmp.path(), &config, &bin);
    let o = publish_through(cmd, &dir, &reg.reference("models/qwen:v1"), &[]);
    let o = ok(o, "publish with an identity token");
    let tokens = reg.tokens_issued();
    assert!(
        !tokens.is_empty() && tokens.iter().all(|t| t.starts_with("refresh repository:")),
        "{tokens:?}"
    );
    assert!(!output_text(&o).contains(token), "the token in the output");
    assert_not_in_state(&[&dir], token, "the token");

    let basic = Registry::start_with_auth();
    let config = format!(r#"{{"credHelpers":{{"{}":"ftid"}}}}"#, basic.host());
    let cmd = with_docker_config(tmp.path(), &config, &bin);
    let o = publish_through(cmd, &dir, &basic.reference("models/qwen:v1"), &[]);
    assert!(!o.status.success(), "an identity token passed as Basic");
    assert_names(
        &stderr(&o),
        &["identity token", "Basic", "docker-credential-ftid"],
    );
    assert!(!stderr(&o).contains(token));
}

/// Issue 38's "kill -9 ≥ 20 times during publish → the same artifact" for
/// a publish that mounts: `publish --mount-from models/a` into fresh
/// repositories, SIGKILLed at seeded moments by the storm of
/// `oci::kill_storm_over_publish` (its checks after every kill). Then:
/// every chain's manifest digest is A's; not one blob went in a body — in
/// the registry's log no `PATCH` and no `PUT` of an upload reached any
/// repository but A, every upload request was a mount (every blob was in
/// A to be mounted); the last chain's repository pulls byte-identical and
/// verified; and a re-run sends no write request.
#[test]
fn kill_storm_over_a_mounting_publish() {
    let _heavy = heavy();
    let (p, a) = mount_source(3841);
    let reg = &p.reg;
    let mount = ["--mount-from", "models/a"];
    let t = Instant::now();
    let end = publish_kill_storm(reg, p.home(), &p.dir, &mount, "oci mount");
    eprintln!("{} chains in {:?}", end.repos.len(), t.elapsed());
    let last = summary(&end.last);
    assert_eq!(last["outcome"]["bytes_sent"], 0, "{last}");
    for repo in &end.repos {
        assert_eq!(reg.manifest(repo, "v1").0, a, "{repo}");
    }
    let uploads: Vec<_> = reg
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/blobs/uploads/") && !r.path.starts_with("/v2/models/a/"))
        .collect();
    assert!(!uploads.is_empty());
    let sent: Vec<_> = uploads
        .iter()
        .filter(|r| r.method != "POST" || !r.path.contains("mount="))
        .collect();
    assert!(sent.is_empty(), "blobs sent, not mounted: {sent:?}");
    let repo = end.repos.last().unwrap();
    p.pull_identical(&format!("{repo}:v1"), "node");
    let writes = reg.writes().len();
    let dest = reg.reference(&format!("{repo}:v1"));
    let o = ok(publish(p.home(), &p.dir, &dest, &mount), "re-run");
    assert_eq!(summary(&o)["outcome"]["already_published"], true);
    let after: Vec<_> = reg.writes().into_iter().skip(writes).collect();
    assert!(after.is_empty(), "a re-run wrote: {after:?}");
}
