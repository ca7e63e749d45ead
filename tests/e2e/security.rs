//! End-to-end security properties: the hub token goes to the hub's own
//! origin only (never across the redirect to the CDN), never reaches the
//! state database or any output; and the pin is sticky (a moved branch is
//! reported, followed only with `--repin`).

use std::path::Path;
use std::process::Output;

use crate::common::*;
use ftpipe_fixtures::{Fault, FaultRule, Origin, RunningHub, checkpoint};

const TOKEN: &str = "hf_secret_test_token";

fn assert_no_token_in(what: &str, bytes: &[u8]) {
    let hay = String::from_utf8_lossy(bytes);
    assert!(!hay.contains(TOKEN), "the token leaked into {what}");
    // Also not split by a redaction that kept most of it.
    assert!(
        !hay.contains("secret_test_token"),
        "the token leaked into {what}"
    );
}

fn assert_no_token_in_output(what: &str, o: &Output) {
    assert_no_token_in(&format!("stdout of {what}"), &o.stdout);
    assert_no_token_in(&format!("stderr of {what}"), &o.stderr);
}

/// Every file under `.ftpipe/` (state.db, -wal, -shm, lock), raw bytes.
fn assert_no_token_in_state(out: &Path) {
    let dir = out.join(".ftpipe");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        assert_no_token_in(&e.path().display().to_string(), &bytes);
        seen += 1;
    }
    assert!(seen >= 2, "state files missing in {}", dir.display());
}

/// Main-origin requests carry `Authorization`, CDN requests never do.
fn assert_token_only_on_main(hub: &RunningHub) {
    let reqs = hub.requests();
    let cdn: Vec<_> = reqs.iter().filter(|r| r.origin == Origin::Cdn).collect();
    let main: Vec<_> = reqs.iter().filter(|r| r.origin == Origin::Main).collect();
    assert!(!cdn.is_empty() && !main.is_empty(), "{reqs:#?}");
    assert!(
        main.iter().all(|r| r.authorization),
        "a main-origin request went without the token: {main:#?}"
    );
    assert!(
        cdn.iter().all(|r| !r.authorization),
        "the token followed the redirect to the CDN: {cdn:#?}"
    );
}

/// Runs status/audit (text and JSON) and checks none prints the token.
fn assert_reports_clean(out: &Path) {
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["audit"],
        vec!["audit", "--json", "--deep"],
    ] {
        let o = run(ftpipe()
            .args(&args)
            .arg("--out")
            .arg(out)
            .env("HF_TOKEN", TOKEN));
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert_no_token_in_output(&args.join(" "), &o);
    }
}

/// Faults that put error text (URLs, headers) into attempts and stderr.
fn inject_faults(hub: &RunningHub, lfs: &str) {
    hub.inject(FaultRule::new(lfs, Fault::ResetMidBody { after: 200_000 }));
    hub.inject(FaultRule::new(lfs, Fault::Status { code: 500 }).nth(2));
    hub.inject(FaultRule::new("config.json", Fault::Status { code: 503 }));
}

#[test]
fn hf_token_goes_to_main_origin_only_and_is_never_stored_or_printed() {
    let (hub, files) = hub_with_repo(41, 2 << 20);
    let lfs = lfs_file(&files).path.clone();
    inject_faults(&hub, &lfs);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(
        fetch_cmd(&hub.endpoint(), &out, &["--checkpoint-bytes", "65536"]).env("HF_TOKEN", TOKEN),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    assert_token_only_on_main(&hub);
    assert_no_token_in_output("fetch", &o);
    // A re-run with --json (and without --quiet's log lines).
    let o = run(ftpipe()
        .args([
            "fetch",
            REPO,
            "--json",
            "--endpoint",
            &hub.endpoint(),
            "--out",
        ])
        .arg(&out)
        .env("HF_TOKEN", TOKEN));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_no_token_in_output("fetch --json", &o);
    assert_reports_clean(&out);
    assert_no_token_in_state(&out);
}

#[test]
fn token_file_works_the_same() {
    let (hub, files) = hub_with_repo(42, 2 << 20);
    let lfs = lfs_file(&files).path.clone();
    inject_faults(&hub, &lfs);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let out = dir.path().join("out");
    let tf = token_file.to_str().unwrap();
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--checkpoint-bytes", "65536", "--token-file", tf, "--json"],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    assert_token_only_on_main(&hub);
    assert_no_token_in_output("fetch --token-file", &o);
    assert_reports_clean(&out);
    assert_no_token_in_state(&out);
}

/// `--token-file <(pass show hf)` was refused ("is a FIFO"): process
/// substitution hands over `/dev/fd/N`, a pipe. It is read now, and the
/// token goes to the hub's own origin only, as from a file.
#[test]
fn token_file_from_process_substitution_is_read() {
    let (hub, files) = hub_with_repo(43, 2 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let fetch = fetch_cmd(&hub.endpoint(), &out, &["--json"]);
    // The same command under bash, with the token file a process substitution.
    let mut argv = vec![fetch.get_program().to_owned()];
    argv.extend(fetch.get_args().map(std::ffi::OsStr::to_owned));
    let mut cmd = std::process::Command::new("bash");
    cmd.args([
        "-c",
        r#"exec "$@" --token-file <(printf '%s\n' "$PIPED_TOKEN")"#,
        "bash",
    ])
    .args(&argv)
    .env("PIPED_TOKEN", TOKEN);
    for (k, v) in fetch.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let o = run(&mut cmd);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_token_only_on_main(&hub);
    assert_no_token_in_output("fetch --token-file <(...)", &o);
    assert_no_token_in_state(&out);
}

/// `--revision <40-hex>` answered by the hub with another commit was pinned
/// to the other commit, converted, and exited 0. A full commit asked for is
/// now the commit pinned, or the command fails naming both, before any
/// file is requested. (The hub here has a branch named like the commit,
/// pointing elsewhere: branches are looked up first.)
#[test]
fn a_requested_commit_answered_with_another_is_refused() {
    let (hub, files) = hub_with_repo(45, 1 << 20);
    let asked = hub.commit(REPO, "main").unwrap();
    let mut other = files.clone();
    other.retain(|f| f.path != "README.md");
    let answered = hub.move_branch(REPO, &asked, other).unwrap();
    assert_ne!(asked, answered);
    let dir = tempfile::tempdir().unwrap();
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &dir.path().join("out"),
        &["--revision", &asked],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&asked) && err.contains(&answered), "{err}");
    assert!(err.contains("refusing to pin another commit"), "{err}");
    assert!(
        hub.requests().iter().all(|r| !r.path.contains("/resolve/")),
        "a file was requested"
    );
    // The commit itself, in capitals, answered with that commit: pinned.
    let (hub, files) = hub_with_repo(46, 1 << 20);
    let commit = hub.commit(REPO, "main").unwrap();
    let out = dir.path().join("out2");
    let upper = commit.to_ascii_uppercase();
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--revision", &upper],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(pinned_commit(&out), commit);
    assert_files_match(&out, &files);
}

fn pinned_commit(out: &Path) -> String {
    query(out, "SELECT commit_sha FROM pin").remove(0)
}

/// Regression: `--repin` after the branch moved used to fail with "exists
/// on disk but conflicts with the pinned identity" on every changed file
/// (the old receipt was dropped, so our own superseded file looked foreign),
/// and dropping the ledger row of a changed file while its discards stayed
/// broke `transferred = committed + discarded` (the first fetch here
/// discards a prefix of the shard that later changes).
#[test]
fn moved_branch_keeps_the_pin_until_repin() {
    let (hub, files) = hub_with_repo(43, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let shard = lfs_file(&files).path.clone();
    hub.inject(FaultRule::new(
        &shard,
        Fault::ResetMidBody { after: 200_000 },
    ));
    hub.inject(FaultRule::new(&shard, Fault::IgnoreRange).nth(2));
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--checkpoint-bytes", "65536"],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let first = hub.commit(REPO, "main").unwrap();
    assert_eq!(pinned_commit(&out), first);

    // The branch moves: config.json changes, and a shard too.
    let lfs = lfs_file(&files).clone();
    let new_cfg = b"{\"changed\": true}\n".to_vec();
    let mut new_shard = checkpoint::content_bytes(&lfs).unwrap().to_vec();
    new_shard[100] ^= 1;
    hub.update_file(REPO, "config.json", new_cfg.clone())
        .unwrap();
    let second = hub.update_file(REPO, &lfs.path, new_shard.clone()).unwrap();
    assert_ne!(first, second);

    // A re-run keeps the pin, says so, and downloads nothing.
    hub.clear_requests();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("has moved"), "{err}");
    assert!(err.contains(&first) && err.contains(&second), "{err}");
    assert!(err.contains("keeping the pin"), "{err}");
    assert_eq!(pinned_commit(&out), first);
    assert_files_match(&out, &files);
    assert!(hub.requests().iter().all(|r| !r.path.contains("/resolve/")));

    // --repin follows it and fetches the new content (only what changed).
    hub.clear_requests();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &["--repin"]));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("repinning"), "{err}");
    assert_eq!(pinned_commit(&out), second);
    assert_eq!(
        std::fs::read(out.join("source/config.json")).unwrap(),
        new_cfg
    );
    assert_eq!(
        std::fs::read(out.join("source").join(&lfs.path)).unwrap(),
        new_shard
    );
    assert_clean_audit(&out);
    let reasons = discard_reasons(&out, &lfs.path);
    assert_eq!(
        reasons,
        ["range_not_honoured", "superseded_by_repin"],
        "{:?}",
        discards(&out, &lfs.path)
    );
    assert!(
        body_gets(&hub, "README.md").is_empty(),
        "unchanged file refetched"
    );
    assert_eq!(body_gets(&hub, "config.json").len(), 1);
}

#[test]
fn other_revision_without_repin_is_refused() {
    let (hub, files) = hub_with_repo(44, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let pinned = pinned_commit(&out);
    let mut other = files.clone();
    other.retain(|f| f.path != "README.md");
    hub.move_branch(REPO, "other", other).unwrap();
    hub.clear_requests();
    let o = run(&mut fetch_cmd(
        &hub.endpoint(),
        &out,
        &["--revision", "other"],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--revision other differs from the pinned revision main"),
        "{err}"
    );
    assert!(err.contains("--repin"), "{err}");
    assert_eq!(pinned_commit(&out), pinned);
    assert!(hub.requests().iter().all(|r| !r.path.contains("/resolve/")));
    assert_clean_audit(&out);
}
