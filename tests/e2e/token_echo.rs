//! Regression: a hub that echoes the caller's token back put it where
//! ftpipe keeps records. Echoed as an `ETag`, the token was stored in
//! `state.db` (the attempts' ETag and If-Range columns); in the
//! `X-Error-Message` of a `401` from the revision API it was printed on
//! stderr and stored as the failed stage's detail; inside a bad
//! `Content-Range` it reached `--json` events, `audit --json`, `state.db`
//! and the bundle. The bundle guard only knew `HF_TOKEN`'s value, so a
//! token from `$HF_HOME/token`, `HF_TOKEN_PATH` or `--token-file` passed
//! it; and `--endpoint http://user:TOKEN@host` kept the password in the
//! pin. Every string from outside now passes one redaction point that
//! knows the resolved token whatever its source, and credentials in an
//! endpoint are refused.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;
use ftpipe_fixtures::Echo;

const TOKEN: &str = "hf_echoedTokenValue0123456789ab";

/// Where the token comes from in each test.
enum TokenFrom {
    TokenFile,
    TokenPath,
    HfHome,
}

/// Writes the token where `from` says and points `cmd` at it.
fn with_token(cmd: &mut Command, from: &TokenFrom, dir: &Path) {
    let file = dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    match from {
        TokenFrom::TokenFile => {
            cmd.arg("--token-file").arg(&file);
        }
        TokenFrom::TokenPath => {
            cmd.env("HF_TOKEN_PATH", &file);
        }
        TokenFrom::HfHome => {
            cmd.env("HF_HOME", dir);
        }
    }
}

fn assert_clean(what: &str, bytes: &[u8]) {
    let hay = String::from_utf8_lossy(bytes);
    assert!(
        !hay.contains("echoedTokenValue"),
        "the token leaked into {what}"
    );
}

fn assert_output_clean(what: &str, o: &Output) {
    assert_clean(&format!("stdout of {what}"), &o.stdout);
    assert_clean(&format!("stderr of {what}"), &o.stderr);
}

/// Every file under `DIR/.ftpipe` (state.db and its WAL), raw bytes.
fn assert_state_clean(out: &Path) {
    for e in std::fs::read_dir(out.join(".ftpipe")).unwrap().flatten() {
        assert_clean(
            &e.path().display().to_string(),
            &std::fs::read(e.path()).unwrap(),
        );
    }
}

/// `status`, `audit --json` and an evidence bundle (guard given the same
/// token source): none holds the token, and the bundle is written.
fn assert_reports_and_bundle_clean(out: &Path, from: &TokenFrom, dir: &Path) {
    for args in [vec!["status", "--json"], vec!["audit", "--json"]] {
        let mut cmd = ftpipe();
        cmd.args(&args).arg("--out").arg(out);
        let o = run(&mut cmd);
        assert_output_clean(&args.join(" "), &o);
    }
    let bundle = dir.join("evidence.tar.zst");
    let mut cmd = ftpipe();
    cmd.args(["audit", "--out"])
        .arg(out)
        .arg("--bundle")
        .arg(&bundle);
    with_token(&mut cmd, from, dir);
    let o = run(&mut cmd);
    assert_output_clean("audit --bundle", &o);
    assert!(bundle.exists(), "no bundle: {}", stderr(&o));
    let tar = zstd::decode_all(&std::fs::read(&bundle).unwrap()[..]).unwrap();
    let mut archive = tar::Archive::new(&tar[..]);
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let mut body = Vec::new();
        e.read_to_end(&mut body).unwrap();
        assert_clean(&format!("bundle entry {:?}", e.path().unwrap()), &body);
    }
}

/// Fetches with the hub echoing the token as `echo`; returns the fetch's
/// output, the out dir and the temp dir holding both.
fn fetch_with_echo(echo: Echo, from: &TokenFrom, seed: u64) -> (Output, tempfile::TempDir) {
    let (hub, _files) = hub_with_repo(seed, 1 << 20);
    hub.set_echo(Some(echo));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fetch_cmd(&hub.endpoint(), &dir.path().join("out"), &["--json"]);
    cmd.args(["--retries", "1"]);
    with_token(&mut cmd, from, dir.path());
    let o = run(&mut cmd);
    assert!(
        hub.requests().iter().any(|r| r.fault.is_some()),
        "the hub never echoed the token: {:#?}\n{}",
        hub.requests(),
        stderr(&o)
    );
    (o, dir)
}

/// One echo case: the fetch fails or succeeds as `succeeds` says, the
/// echoed value reached `column` of the attempts (redacted), and nothing
/// the run left or prints holds the token.
fn echo_case(echo: Echo, from: &TokenFrom, seed: u64, column: &str, succeeds: bool) {
    let (o, dir) = fetch_with_echo(echo, from, seed);
    let out = dir.path().join("out");
    assert_eq!(o.status.success(), succeeds, "{}", stderr(&o));
    assert_output_clean("fetch --json", &o);
    let values = query(
        &out,
        &format!("SELECT COALESCE({column}, '') FROM attempts"),
    );
    assert!(
        values.iter().any(|v| v.contains("<redacted>")),
        "no attempt's {column} holds the echoed value (redacted): {values:?}"
    );
    assert_state_clean(&out);
    assert_reports_and_bundle_clean(&out, from, dir.path());
}

#[test]
fn token_echoed_as_etag_is_never_stored_or_printed() {
    echo_case(Echo::Etag, &TokenFrom::TokenPath, 81, "etag", true);
}

#[test]
fn token_inside_a_bad_content_range_is_never_stored_or_printed() {
    echo_case(
        Echo::ContentRange,
        &TokenFrom::TokenFile,
        82,
        "content_range",
        false,
    );
}

#[test]
fn token_in_a_401_error_message_is_never_stored_or_printed() {
    let from = TokenFrom::HfHome;
    let (o, dir) = fetch_with_echo(Echo::ErrorMessage, &from, 83);
    let out = dir.path().join("out");
    assert!(!o.status.success(), "a 401 was not an error");
    let err = stderr(&o);
    assert!(err.contains("401") && err.contains("<redacted>"), "{err}");
    assert_output_clean("fetch --json", &o);
    let details = query(&out, "SELECT detail FROM stage_events");
    assert!(
        details.iter().any(|d| d.contains("<redacted>")),
        "the failed stage's detail lost the message: {details:?}"
    );
    assert_state_clean(&out);
}

/// A listing naming a file after the token would have put it in the files
/// table and made it a file name under `DIR/source`: the page is refused.
#[test]
fn token_in_a_listed_path_is_refused_before_anything_is_stored() {
    listing_case(Echo::Listing);
}

/// The same path with every byte of the token as a `\u` escape: a scan of
/// the page's bytes missed it, the parsed path held it.
#[test]
fn token_in_a_listed_path_written_with_json_escapes_is_refused() {
    listing_case(Echo::ListingEscaped);
}

fn listing_case(echo: Echo) {
    let (o, dir) = fetch_with_echo_listing(echo);
    let out = dir.path().join("out");
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "a listing holding the token was accepted"
    );
    assert!(err.contains("holds the token this process sent"), "{err}");
    assert_output_clean("fetch --json", &o);
    assert_state_clean(&out);
    assert!(
        !out.join("source").exists()
            || std::fs::read_dir(out.join("source"))
                .unwrap()
                .next()
                .is_none()
    );
}

/// [`fetch_with_echo`] for a listing echo, whose echo is in a body the
/// request log does not mark.
fn fetch_with_echo_listing(echo: Echo) -> (Output, tempfile::TempDir) {
    let (hub, _files) = hub_with_repo(86, 1 << 20);
    hub.set_echo(Some(echo));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fetch_cmd(&hub.endpoint(), &dir.path().join("out"), &["--json"]);
    with_token(&mut cmd, &TokenFrom::TokenFile, dir.path());
    let o = run(&mut cmd);
    assert!(
        hub.requests().iter().any(|r| r.path.contains("/tree/")),
        "no listing was asked for: {}",
        stderr(&o)
    );
    (o, dir)
}

#[test]
fn bundle_guard_knows_a_token_from_any_source() {
    let (hub, _files) = hub_with_repo(84, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    // A state database written by an older ftpipe, before redaction: the
    // token sits in an attempt's error.
    sqlite_exec(
        &out,
        &format!(
            "UPDATE attempts SET error = 'echo {TOKEN}' WHERE id = (SELECT MIN(id) FROM attempts)"
        ),
    );
    for from in [
        TokenFrom::TokenFile,
        TokenFrom::TokenPath,
        TokenFrom::HfHome,
    ] {
        let bundle = dir.path().join("evidence.tar.zst");
        let mut cmd = ftpipe();
        cmd.args(["audit", "--out"])
            .arg(&out)
            .arg("--bundle")
            .arg(&bundle);
        with_token(&mut cmd, &from, dir.path());
        let o = run(&mut cmd);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("refusing to write the bundle"),
            "{}",
            stderr(&o)
        );
        assert_output_clean("audit --bundle", &o);
        assert!(!bundle.exists(), "a bundle holding the token was written");
    }
}

#[test]
fn endpoint_credentials_are_refused_without_printing_them() {
    let (hub, _files) = hub_with_repo(85, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let endpoint = hub
        .endpoint()
        .replacen("http://", &format!("http://user:{TOKEN}@"), 1);
    let o = run(&mut fetch_cmd(&endpoint, &out, &["--json"]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("credentials in the endpoint URL are refused"),
        "{err}"
    );
    assert!(err.contains("http://<redacted>@127.0.0.1"), "{err}");
    assert_output_clean("fetch", &o);
    assert!(
        hub.requests().is_empty(),
        "a request went out: {:#?}",
        hub.requests()
    );
    if out.join(".ftpipe").exists() {
        assert_state_clean(&out);
    }
}

/// The segmented path stored the range's validator in the ledger without
/// redaction, and progress lines and logs (stderr not a terminal, no
/// `--json`) were not covered: the token echoed as the `ETag` of ranges
/// fetched over four connections reaches neither.
#[test]
fn token_echoed_as_etag_of_segmented_ranges_never_reaches_ledger_progress_or_logs() {
    // Served by the main origin (no CDN redirect), which the token is sent
    // to and which echoes it.
    let (hub, files) = hub_with(
        ftpipe_fixtures::HubBuilder::new().redirect_lfs(false),
        87,
        8 << 20,
    );
    hub.set_echo(Some(Echo::Etag));
    let big = files.iter().max_by_key(|f| content_len(f)).unwrap();
    // About 3 MB/s per connection: the file is still going when the
    // other connections start, so it is split whatever the machine's load.
    hub.inject(
        ftpipe_fixtures::FaultRule::new(
            &big.path,
            ftpipe_fixtures::Fault::Trickle {
                bytes: 16 * 1024,
                every_ms: 5,
            },
        )
        .times(100_000),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut cmd = fetch_cmd(
        &hub.endpoint(),
        &out,
        &[
            "--segment-threshold",
            "1MiB",
            "--min-range",
            "256KiB",
            "--piece-size",
            "512KiB",
            "--connections",
            "4",
            "--split-below-rate",
            "0",
        ],
    );
    cmd.env("FTPIPE_LOG", "debug");
    with_token(&mut cmd, &TokenFrom::TokenFile, dir.path());
    let o = run(&mut cmd);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_output_clean("fetch (progress lines, debug log)", &o);
    let ranged = query(
        &out,
        &format!(
            "SELECT COUNT(*) FROM attempts WHERE path = {} AND range_start > 0 \
             AND etag LIKE '%<redacted>%'",
            sql_str(&big.path)
        ),
    );
    assert_ne!(
        ranged,
        ["0"],
        "{} was not fetched in ranges answered with the token as ETag",
        big.path
    );
    assert_state_clean(&out);
    assert_files_match(&out, &files);
}

/// A token shorter than the redaction's minimum could never be found in
/// output (and would match ordinary words): refused, naming its source.
#[test]
fn a_token_too_short_to_redact_is_refused_naming_its_source() {
    let (hub, _files) = hub_with_repo(88, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fetch_cmd(&hub.endpoint(), &dir.path().join("out"), &[]);
    cmd.env("HF_TOKEN", "abc1234");
    let o = run(&mut cmd);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("HF_TOKEN") && err.contains("shorter than 8"),
        "{err}"
    );
    assert!(!err.contains("abc1234"), "{err}");
    assert!(hub.requests().is_empty(), "a request went out");
}

/// `fetch` never parses the config; a later `convert` did, without knowing
/// the token (only fetch, run, plan and audit resolved it), so a config
/// holding it (here `\u`-escaped, invisible to a byte scan) went through.
/// Every subcommand now knows the ambient token.
#[test]
fn convert_after_fetch_refuses_a_config_holding_the_ambient_token() {
    let mut files = ftpipe_fixtures::qwen4::generate_qwen4_repo(
        89,
        ftpipe_fixtures::qwen4::QwenShape::default(),
    );
    let config = files.iter_mut().find(|f| f.path == "config.json").unwrap();
    let body = String::from_utf8(
        ftpipe_fixtures::checkpoint::content_bytes(config)
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    let escaped: String = TOKEN
        .chars()
        .map(|c| format!("\\u{:04x}", u32::from(c)))
        .collect();
    let body = body.replacen('{', &format!("{{\"note\": \"{escaped}\", "), 1);
    *config = ftpipe_fixtures::RepoFile::bytes("config.json", body);
    let hub = hub_serving(files);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(fetch_cmd(&hub.endpoint(), &out, &[]).env("HF_TOKEN", TOKEN));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(ftpipe()
        .args(["convert", "--out"])
        .arg(&out)
        .env("HF_TOKEN", TOKEN));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("config.json") && err.contains("holds the hub token"),
        "{err}"
    );
    assert_output_clean("convert", &o);
    assert!(!out.join("artifact/manifest.json").exists());
    assert_state_clean(&out);
}

/// `ftpipe pull "s3://AKID:SECRET@bkt/p"` (and publish, mirror,
/// `--endpoint s3://…`, `--s3-endpoint http://AKID:pw@host:99999`) was
/// refused with an error printing the URL, secret included: the location
/// was parsed before any secret was registered, and a password that is not
/// the environment's was never registered at all. Now every form is refused
/// naming why, with the userinfo cut out, whatever the secret is.
#[test]
fn credentials_typed_into_an_s3_url_are_refused_without_printing_them() {
    const KEY_ID: &str = "AKIDTYPEDINTOURL";
    const SECRET: &str = "typed-secret-never-registered";
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let located = format!("s3://{KEY_ID}:{SECRET}@bkt/p");
    let endpoint = format!("http://{KEY_ID}:{SECRET}@127.0.0.1:99999");
    let commands: [Vec<&str>; 6] = [
        vec!["pull", &located, "--out", out],
        vec!["publish", out, &located],
        vec!["mirror", out, &located],
        vec!["fetch", "o/r", "--endpoint", &located, "--out", out],
        vec![
            "pull",
            "s3://bkt/p",
            "--out",
            out,
            "--s3-endpoint",
            &endpoint,
        ],
        vec![
            "fetch",
            "o/r",
            "--endpoint",
            "s3://bkt/p",
            "--out",
            out,
            "--s3-endpoint",
            &endpoint,
        ],
    ];
    for args in commands {
        // The environment holds other keys: the typed ones are registered
        // nowhere.
        let o = run(ftpipe()
            .args(&args)
            .env("AWS_ACCESS_KEY_ID", "AKIDFROMTHEENVIRONMENT")
            .env("AWS_SECRET_ACCESS_KEY", "secret-from-the-environment"));
        let err = stderr(&o);
        let what = args.join(" ");
        assert!(!o.status.success(), "{what}: {err}");
        for leaked in [KEY_ID, SECRET] {
            assert!(!err.contains(leaked), "{what} printed {leaked}: {err}");
            assert!(
                !String::from_utf8_lossy(&o.stdout).contains(leaked),
                "{what}"
            );
        }
        assert!(err.contains("credentials in the"), "{what}: {err}");
        assert!(err.contains("<redacted>@"), "{what}: {err}");
    }
}
