//! Regression (issue 36, item 3): common failures spoke the libraries'
//! language. A hub's 401/403/404 came without a word on the repo name, the
//! token or `hf auth login`; a refused connection said "error sending
//! request"; `--out` naming a file said `create …/.ftpipe: Not a
//! directory`. Each now opens with one sentence saying what is wrong and
//! what to do (naming where the token came from, or that none was found;
//! the repo or the revision the hub says is missing; the endpoint that
//! does not answer), and keeps the exact error (URL, status, the hub's
//! `X-Error-Code` / `X-Error-Message`, bounded and redacted) below it and,
//! with `--json`, in an `error` event.

use std::process::Output;

use crate::common::*;
use ftpipe_fixtures::{HubBuilder, RunningHub, checkpoint};

/// The token the gated hub lets through.
const GOOD_TOKEN: &str = "hf_goodTokenForTheGate0123";
/// A token the gated hub refuses (and echoes in its message).
const WRONG_TOKEN: &str = "hf_wrongTokenNotAllowed4567";

/// A hub whose repo is gated, refusing with `message`.
fn gated_hub(message: &str) -> RunningHub {
    let files = checkpoint::generate_small_repo(36, 64 << 10);
    let builder = HubBuilder::new()
        .gated(GOOD_TOKEN, message)
        .repo(REPO, files);
    RunningHub::start(builder).expect("start fixture hub")
}

/// The first line of stderr: the sentence with the fix.
fn first_line(o: &Output) -> String {
    stderr(o).lines().next().unwrap_or_default().to_owned()
}

fn assert_fails_with(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
    let line = first_line(o);
    for needle in needles {
        assert!(
            line.contains(needle),
            "no {needle:?} in the first line: {line}\n{}",
            stderr(o)
        );
    }
}

/// A gated repo fetched without a token: the sentence says so, says no
/// token was found where ftpipe looks, and how to log in; the hub's status
/// and code stay in the details.
#[test]
fn gated_repo_without_a_token_says_none_was_found_and_how_to_log_in() {
    let _g = time_bounded();
    let hub = gated_hub("Access to model acme/tiny is restricted. Please log in.");
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mut fetch_cmd(
        &hub.handle().endpoint(),
        &dir.path().join("out"),
        &[],
    ));
    assert_fails_with(
        &o,
        &[
            "acme/tiny is gated",
            "no token was found in --token-file, HF_TOKEN",
            "hf auth login",
        ],
    );
    let err = stderr(&o);
    assert!(
        err.contains("details: ") && err.contains("HTTP 401"),
        "{err}"
    );
    assert!(err.contains("Please log in. (GatedRepo)"), "{err}");
}

/// A token without access: the sentence names where it came from
/// (HF_TOKEN, --token-file); the hub's message, which echoes the token
/// after 5,000 characters, is cut to its bound and the token redacted.
#[test]
fn gated_repo_with_a_token_without_access_names_the_tokens_source() {
    let _g = time_bounded();
    let message = format!("{} {WRONG_TOKEN}", "restricted ".repeat(500));
    let hub = gated_hub(&message);
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fetch_cmd(&hub.handle().endpoint(), &dir.path().join("env"), &[]);
    let o = run(cmd.env("HF_TOKEN", WRONG_TOKEN));
    assert_fails_with(
        &o,
        &[
            "acme/tiny is gated",
            "the token from HF_TOKEN",
            "hf auth login",
        ],
    );
    let err = stderr(&o);
    assert!(err.contains("HTTP 403"), "{err}");
    assert!(
        !err.contains(WRONG_TOKEN) && !err.contains(&message[..1000]),
        "{err}"
    );
    let details = err.lines().nth(1).unwrap_or_default();
    assert!(
        details.len() < 600,
        "the hub's message is not bounded: {details}"
    );

    let file = dir.path().join("token");
    std::fs::write(&file, WRONG_TOKEN).unwrap();
    let mut cmd = fetch_cmd(&hub.handle().endpoint(), &dir.path().join("file"), &[]);
    let o = run(cmd.arg("--token-file").arg(&file));
    assert_fails_with(&o, &["the token from --token-file"]);

    // The gate opens to its token: the refusals above were the gate's.
    let mut cmd = fetch_cmd(&hub.handle().endpoint(), &dir.path().join("good"), &[]);
    let o = run(cmd.env("HF_TOKEN", GOOD_TOKEN));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A 404 with the hub's `X-Error-Code` says which is missing: the repo
/// (check its id) or the revision (check --revision).
#[test]
fn missing_repo_and_missing_revision_are_told_apart() {
    let _g = time_bounded();
    let (hub, _files) = hub_with_repo(37, 64 << 10);
    let endpoint = hub.handle().endpoint();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ftpipe();
    cmd.args(["fetch", "acme/nope", "--endpoint", &endpoint, "--out"])
        .arg(dir.path().join("repo"));
    let o = run(&mut cmd);
    assert_fails_with(
        &o,
        &[
            "no repository acme/nope",
            "check the repo id",
            "no token was found",
        ],
    );
    assert!(stderr(&o).contains("HTTP 404: Repository not found: acme/nope (RepoNotFound)"));

    let o = run(&mut fetch_cmd(
        &endpoint,
        &dir.path().join("rev"),
        &["--revision", "v9"],
    ));
    assert_fails_with(&o, &["acme/tiny has no revision v9", "check --revision"]);
    assert!(stderr(&o).contains("(RevisionNotFound)"), "{}", stderr(&o));

    // --json: one error event with the advice, the exact error and the code.
    let rev = dir.path().join("json");
    let o = run(&mut fetch_cmd(
        &endpoint,
        &rev,
        &["--revision", "v9", "--json"],
    ));
    let events = json_events(&o, "error");
    assert_eq!(events.len(), 1, "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(events[0]["exit_code"], 1);
    let advice = events[0]["advice"].as_str().unwrap();
    assert!(
        advice.starts_with("acme/tiny has no revision v9"),
        "{advice}"
    );
    let error = events[0]["error"].as_str().unwrap();
    assert!(
        error.contains("answered HTTP 404: Invalid rev id: v9 (RevisionNotFound)"),
        "{error}"
    );
}

/// A closed loopback port: the sentence names the endpoint, HF_ENDPOINT
/// and --offline instead of "error sending request".
#[test]
fn refused_connection_names_the_endpoint_and_offline() {
    let _g = time_bounded();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mut fetch_cmd(&endpoint, &dir.path().join("out"), &[]));
    assert_fails_with(
        &o,
        &[
            &format!("nothing answers at {endpoint} (connection refused)"),
            "HF_ENDPOINT",
            "--offline",
        ],
    );
    assert!(stderr(&o).contains("details: request to"), "{}", stderr(&o));
}

/// A host name that cannot resolve (`.invalid` never does).
#[test]
fn unresolvable_endpoint_says_the_name_does_not_resolve() {
    let _g = time_bounded();
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mut fetch_cmd(
        "http://nonexistent.invalid",
        &dir.path().join("out"),
        &[],
    ));
    assert_fails_with(
        &o,
        &[
            "the host name of http://nonexistent.invalid does not resolve",
            "HF_ENDPOINT",
        ],
    );
}

/// `--out` naming a file, or a path through one: refused before anything
/// is created, naming the file and what is expected.
#[test]
fn out_naming_a_file_is_refused_naming_it() {
    let _g = time_bounded();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"keep me").unwrap();
    for out in [file.clone(), file.join("below")] {
        let o = run(&mut fetch_cmd("http://127.0.0.1:9", &out, &[]));
        let expected = format!(
            "--out {}: {} is not a directory",
            out.display(),
            file.display()
        );
        assert_fails_with(&o, &[&expected, "give a directory"]);
        assert!(!stderr(&o).contains("os error"), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}
