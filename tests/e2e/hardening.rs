//! Regressions of the hostile-input sweep (issue 27, "Hardening"): reads
//! that never start or never end, tokens that are not tokens, fetch
//! selections that leave conversion without its inputs, and a silent
//! default in the placement. Each test runs the real binary against the
//! fixture hub over loopback and says which bug it guards.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use ftpipe_fixtures::RunningHub;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};
use ftpipe_fixtures::qwen4::{Mutation, QwenShape, generate_qwen4_repo};

const SEED: u64 = 57;
/// How long a refused input may take: it must fail at once, not hang.
const BOUND: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// Runs `cmd` under [`BOUND`] (a hang fails the test instead of blocking
/// it) and expects exit 1; returns stderr.
fn fails_fast(cmd: &mut std::process::Command) -> String {
    let (o, _) = run_watched(cmd, BOUND, POLL, |_| {});
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Requests for shard bodies or headers (any request naming a
/// `.safetensors` file).
fn shard_requests(hub: &RunningHub) -> usize {
    hub.requests()
        .iter()
        .filter(|r| {
            r.path.ends_with(".safetensors")
                || r.query
                    .as_deref()
                    .is_some_and(|q| q.contains(".safetensors"))
        })
        .count()
}

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A FIFO at `HF_TOKEN_PATH` or `$HF_HOME/token` made `fetch` block in
/// `open(2)` before any request, forever. A pipe is now read (process
/// substitution is how tokens are kept out of files), but one nobody writes
/// ends after the token pipe's deadline (5 s) with an error naming the
/// variable, the path and what happened, and nothing is requested.
#[test]
fn fifo_token_nobody_writes_ends_at_its_deadline() {
    let hub = qwen4_hub(SEED, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("token");
    mkfifo(&fifo);
    let mut cmd = fetch_cmd(&hub.endpoint(), &tmp.path().join("o1"), &[]);
    cmd.env("HF_TOKEN_PATH", &fifo);
    let started = std::time::Instant::now();
    let err = fails_fast(&mut cmd);
    assert!(started.elapsed() >= Duration::from_secs(5), "{err}");
    assert_names(
        &err,
        &[
            "HF_TOKEN_PATH",
            &fifo.display().to_string(),
            "is a pipe, and nothing arrived within 5 s",
        ],
    );
    // $HF_HOME/token (`hf auth login`'s place).
    let mut cmd = fetch_cmd(&hub.endpoint(), &tmp.path().join("o2"), &[]);
    cmd.env("HF_HOME", tmp.path());
    let err = fails_fast(&mut cmd);
    assert_names(
        &err,
        &[
            "$HF_HOME/token",
            &fifo.display().to_string(),
            "nothing arrived",
        ],
    );
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
}

/// `HF_TOKEN_PATH=/dev/zero` (and `--token-file /dev/zero`) passed the
/// size check (`st_size` 0) and was read until memory ran out. Now a device
/// is refused, naming it.
#[test]
fn dev_zero_token_is_refused() {
    let hub = qwen4_hub(SEED, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = fetch_cmd(&hub.endpoint(), &tmp.path().join("o1"), &[]);
    cmd.env("HF_TOKEN_PATH", "/dev/zero");
    let err = fails_fast(&mut cmd);
    assert_names(&err, &["HF_TOKEN_PATH", "/dev/zero", "character device"]);
    let err = fails_fast(&mut fetch_cmd(
        &hub.endpoint(),
        &tmp.path().join("o2"),
        &["--token-file", "/dev/zero"],
    ));
    assert_names(&err, &["--token-file", "/dev/zero", "character device"]);
    assert!(hub.requests().is_empty());
}

/// `--recipe /dev/zero` passed the 1 MiB check (`st_size` 0) and was read
/// until memory ran out. Now it is refused before any request.
#[test]
fn dev_zero_recipe_is_refused() {
    let hub = qwen4_hub(SEED, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let err = fails_fast(&mut run_cmd(
        &hub.endpoint(),
        &tmp.path().join("out"),
        &["--recipe", "/dev/zero"],
    ));
    assert_names(&err, &["/dev/zero", "character device"]);
    assert!(hub.requests().is_empty());
}

/// A 64 MiB token file was sent as a 64 MiB header, and the error did not
/// name the file. Now the file is refused past `MAX_TOKEN_BYTES`, naming
/// it and the limit, before any request.
#[test]
fn oversize_token_file_is_refused_naming_it() {
    let hub = qwen4_hub(SEED, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("big-token");
    std::fs::write(&tok, vec![b'a'; 64 << 20]).unwrap();
    let mut cmd = fetch_cmd(&hub.endpoint(), &tmp.path().join("out"), &[]);
    cmd.env("HF_TOKEN_PATH", &tok);
    let err = fails_fast(&mut cmd);
    assert_names(&err, &[&tok.display().to_string(), "4096 bytes"]);
    assert!(
        err.len() < 4096,
        "the error holds the token: {} bytes",
        err.len()
    );
    assert!(hub.requests().is_empty());
}

/// A token holding CR/LF gave "builder error: failed to parse header
/// value", naming neither the token's source nor the problem. Now it is
/// refused naming the source (file or variable) and the byte, never the
/// token's value.
#[test]
fn token_with_line_break_names_its_source_not_its_value() {
    let hub = qwen4_hub(SEED, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("token");
    std::fs::write(&tok, b"hf_first\r\nhf_second\n").unwrap();
    let err = fails_fast(&mut fetch_cmd(
        &hub.endpoint(),
        &tmp.path().join("o1"),
        &["--token-file", tok.to_str().unwrap()],
    ));
    assert_names(
        &err,
        &[
            "--token-file",
            &tok.display().to_string(),
            "carriage return",
        ],
    );
    assert!(
        !err.contains("hf_first") && !err.contains("hf_second"),
        "{err}"
    );
    let mut cmd = fetch_cmd(&hub.endpoint(), &tmp.path().join("o2"), &[]);
    cmd.env("HF_TOKEN", "hf_first\nhf_second");
    let err = fails_fast(&mut cmd);
    assert_names(&err, &["HF_TOKEN", "line feed"]);
    assert!(
        !err.contains("hf_first") && !err.contains("hf_second"),
        "{err}"
    );
    assert!(!err.contains("failed to parse header value"), "{err}");
    assert!(hub.requests().is_empty());
}

/// `--include ''` fetched nothing and exited 0. Now an empty glob is
/// refused naming its option, for `fetch` and `run`, before any shard
/// request.
#[test]
fn empty_globs_are_refused() {
    let hub = qwen4_hub(SEED, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    for (i, (cmd, opt)) in [
        ("fetch", "--include"),
        ("run", "--include"),
        ("fetch", "--exclude"),
        ("run", "--exclude"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = tmp.path().join(format!("o{i}"));
        let mut c = if cmd == "fetch" {
            fetch_cmd(&hub.endpoint(), &out, &[opt, ""])
        } else {
            run_cmd(&hub.endpoint(), &out, &[opt, ""])
        };
        let err = fails_fast(&mut c);
        assert_names(&err, &[opt, "empty"]);
    }
    assert_eq!(shard_requests(&hub), 0);
}

/// `run --exclude config.json` (or the index) fetched every shard and
/// failed only in conversion. Now it is refused before any shard request,
/// naming the file and the glob; `fetch` alone may still leave them out.
#[test]
fn run_refuses_to_exclude_what_conversion_reads() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let hub = hub_serving(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    for (i, file) in ["config.json", "model.safetensors.index.json"]
        .into_iter()
        .enumerate()
    {
        let err = fails_fast(&mut run_cmd(
            &hub.endpoint(),
            &tmp.path().join(format!("o{i}")),
            &["--exclude", file],
        ));
        assert_names(&err, &[file, &format!("--exclude {file:?}")]);
        assert_eq!(shard_requests(&hub), 0, "{file}: shards requested");
    }
    // `--include` that does not match config.json.
    let err = fails_fast(&mut run_cmd(
        &hub.endpoint(),
        &tmp.path().join("o3"),
        &["--include", "*.safetensors*"],
    ));
    assert_names(&err, &["config.json", "--include"]);
    assert_eq!(shard_requests(&hub), 0);
    // `fetch` does not convert: it may leave config.json out.
    run_ok(&mut fetch_cmd(
        &hub.endpoint(),
        &tmp.path().join("o4"),
        &["--exclude", "config.json"],
    ));
    assert!(!tmp.path().join("o4/source/config.json").exists());
}

/// `placement.json` said `read_queue_depth: 8` for the released layout
/// with `num_experts_per_tok = 10`, where docs/formats.md gives 16: the
/// engine read the key from the top level of config.json (the released
/// layout keeps it under `text_config`) and fell back to 8.
#[test]
fn released_layout_placement_reads_top_k_from_text_config() {
    let mut shape = ReleaseShape::tiny();
    shape.top_k = 10;
    let hub = hub_serving(generate_release_repo(SEED, &shape));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--jobs", "2"]));
    let placement: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("artifact/placement.json")).unwrap())
            .unwrap();
    assert_eq!(placement["read_queue_depth"], 16, "{placement}");
}

/// A config without `num_experts_per_tok` converted with the silent default
/// of 8. Now it is an error naming the key's JSON path.
#[test]
fn missing_experts_per_token_is_an_error_naming_its_path() {
    let shape = ReleaseShape::tiny();
    let files = ftpipe_fixtures::qwen4::release::generate_release_repo_mutated(
        SEED,
        &shape,
        &[Mutation::Config(
            "/text_config/num_experts_per_tok".into(),
            None,
        )],
    );
    let hub = hub_serving(files);
    let tmp = tempfile::tempdir().unwrap();
    let err = fails_fast(&mut run_cmd(&hub.endpoint(), &tmp.path().join("out"), &[]));
    assert_names(
        &err,
        &["config.json", "text_config.num_experts_per_tok", "missing"],
    );
}

/// A source sharing its inode with another name (a hard link, as older
/// versions made into the Hugging Face cache) can change after it was
/// verified. Conversion refuses to read it, naming the file, why, and the
/// remedy, and no artifact is published; the config is read the same way.
/// Deleting the file as the error says makes the next run fetch it anew
/// and finish.
#[test]
fn a_hard_linked_source_is_refused_by_conversion() {
    let hub = hub_serving(generate_qwen4_repo(SEED, QwenShape::default()));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    let shard = std::fs::read_dir(out.join("source"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("a shard");
    std::fs::hard_link(&shard, tmp.path().join("elsewhere")).unwrap();
    let o = run(ftpipe().args(["convert", "--out"]).arg(&out));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let name = shard.file_name().unwrap().to_str().unwrap();
    assert_names(&err, &[name, "2 links"]);
    assert!(!out.join("artifact/manifest.json").exists());

    std::fs::remove_file(tmp.path().join("elsewhere")).unwrap();
    let config = out.join("source/config.json");
    std::fs::hard_link(&config, tmp.path().join("config-elsewhere")).unwrap();
    let o = run(ftpipe().args(["convert", "--out"]).arg(&out));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_names(&err, &["config.json", "2 links", "delete it"]);

    std::fs::remove_file(&config).unwrap();
    let before = body_gets(&hub, "config.json").len();
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert!(out.join("artifact/manifest.json").exists());
    assert!(
        body_gets(&hub, "config.json").len() > before,
        "config.json was not fetched anew after its deletion"
    );
    assert!(has_receipt(&out, "config.json"));
}
