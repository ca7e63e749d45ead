//! A Hugging Face hub cache filled by the real client (`hf download`,
//! huggingface_hub 2.4.0) as the first source of pinned files, the hub's
//! token conventions, and offline mode.
//!
//! Every test starts the fixture hub on loopback, lets `hf download` fill a
//! temporary `HF_HOME`, then runs `ftpipe` with that `HF_HOME` and checks
//! the hub's request log: what the cache holds (and verifies) must not be
//! requested again. Skipped locally without `hf`; a failure under `CI`.
//!
//! The Xet tests let `hf download` run with huggingface_hub's defaults (Xet
//! on, `hf_xet` installed) against a fixture hub serving the LFS files
//! through Hugging Face's `local_cas_server` (`common::xet`): the cache then
//! has the layout huggingface_hub 2.4 writes, every repo `blobs/<sha256>` a
//! relative link `../../blobs/<2 hex>/<xet hash>` into the cache-wide shared
//! store.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::xet::{LocalCas, hf_xet_download, xet_hub};
use crate::common::*;
use ftpipe_fixtures::checkpoint::content_bytes;
use ftpipe_fixtures::{Fault, FaultRule, Origin, RepoFile, RunningHub};

fn hf_available() -> bool {
    Command::new("hf")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `false` (after a note) when `hf` is missing; CI requires it.
fn require_hf() -> bool {
    if hf_available() {
        return true;
    }
    skip_unless_ci("`hf` (huggingface_hub) not installed");
    false
}

/// `hf download REPO [--revision REV]` into the cache of `hf_home`, Xet
/// disabled (`HF_HUB_DISABLE_XET=1`: plain HTTP, regular blob files).
fn hf_download(endpoint: &str, hf_home: &Path, revision: Option<&str>) -> Command {
    let mut cmd = hf_download_with_defaults(endpoint, hf_home, revision);
    cmd.env("HF_HUB_DISABLE_XET", "1");
    cmd
}

/// `hf download REPO [--revision REV]` with huggingface_hub's defaults (Xet
/// on when the hub serves it).
fn hf_download_with_defaults(endpoint: &str, hf_home: &Path, revision: Option<&str>) -> Command {
    let mut cmd = Command::new("hf");
    cmd.args(["download", REPO]);
    if let Some(rev) = revision {
        cmd.args(["--revision", rev]);
    }
    cmd.env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", hf_home)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_TOKEN", "hf_fixture_dummy_token")
        .env_remove("HF_HUB_DISABLE_XET")
        .env_remove("HF_HUB_DISABLE_SHARED_BLOBS")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// [`hf_download_with_defaults`] with one download thread, so that every
/// Xet file lands in the shared store. huggingface_hub 2.4 marks its shared
/// store on first use without a lock: a thread that finds the store
/// unmarked while another thread marks it refuses the store and keeps its
/// blob repo-local, so with the default 8 threads which blobs are links
/// depends on timing (it failed CI on a loaded 2-core machine; 8 threads
/// calling `_ensure_prefix_dir` on a fresh cache refuse in most trials).
fn hf_download_into_shared_store(endpoint: &str, hf_home: &Path) -> Command {
    let mut cmd = hf_download_with_defaults(endpoint, hf_home, None);
    cmd.args(["--max-workers", "1"]);
    cmd
}

fn hf_download_ok(endpoint: &str, hf_home: &Path, revision: Option<&str>) {
    let o = hf_download(endpoint, hf_home, revision).output().unwrap();
    assert!(o.status.success(), "hf download failed: {}", stderr(&o));
}

/// Body bytes the hub served for file bodies (resolve or CDN, 200/206).
fn body_bytes_served(hub: &RunningHub) -> u64 {
    hub.requests()
        .iter()
        .filter(|r| r.method == "GET" && (r.status == 200 || r.status == 206))
        .filter(|r| r.origin == Origin::Cdn || r.path.contains("/resolve/"))
        .map(|r| r.body_bytes)
        .sum()
}

fn blobs_dir(hf_home: &Path) -> PathBuf {
    hf_home.join("hub/models--acme--tiny/blobs")
}

/// `ftpipe fetch --json` with `HF_HOME` set, parsed as JSON lines.
fn fetch_json(
    hub: &RunningHub,
    out: &Path,
    hf_home: &Path,
    extra: &[&str],
) -> (Output, Vec<serde_json::Value>) {
    let mut cmd = fetch_cmd(&hub.endpoint(), out, &["--json"]);
    cmd.args(extra).env("HF_HOME", hf_home);
    let o = run(&mut cmd);
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (o, lines)
}

fn events<'a>(lines: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|v| v["event"] == name).collect()
}

fn sha256_of(f: &RepoFile) -> String {
    sha256_hex(&content_bytes(f).unwrap())
}

#[test]
fn a_full_cache_is_adopted_without_a_body_byte_from_the_hub() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let (hub, files) = hub_with_repo(31, 6 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    hf_download_ok(&hub.endpoint(), &hf_home, None);
    hub.clear_requests();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(body_bytes_served(&hub), 0, "{:#?}", hub.requests());
    assert_files_match(&out, &files);
    let adopted = events(&lines, "file_adopted");
    assert_eq!(adopted.len(), files.len(), "{lines:#?}");
    let summary = lines.last().unwrap();
    assert_eq!(
        summary["session"]["hf_cache"],
        hf_home.join("hub").to_str().unwrap()
    );
    assert_eq!(summary["session"]["hf_cache_from"], "HF_HOME");
    let a = assert_clean_audit(&out);
    let total: u64 = files.iter().map(content_len).sum();
    assert_eq!(a["cache_bytes"], total, "{a:#}");
    assert_eq!(a["transferred_bytes"], 0, "{a:#}");
    let candidates = a["cache_candidates"].as_array().unwrap();
    assert!(
        candidates.iter().all(|c| c["outcome"] == "adopted"),
        "{candidates:#?}"
    );
    // The audit table has a line for them.
    let table = run_ok(ftpipe().args(["audit", "--out"]).arg(&out));
    let text = String::from_utf8_lossy(&table.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("adopted from HF cache"))
        .unwrap_or_else(|| panic!("no cache line in:\n{text}"));
    assert!(!line.trim_end().ends_with(" 0"), "{line}");
    // The cache is intact: every blob still there.
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        assert!(
            blobs_dir(&hf_home).join(sha256_of(f)).is_file(),
            "{}",
            f.path
        );
    }
    // --no-hf-cache skips it.
    let out2 = tmp.path().join("out2");
    hub.clear_requests();
    let (o, lines) = fetch_json(&hub, &out2, &hf_home, &["--no-hf-cache"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(events(&lines, "file_adopted").is_empty());
    assert_eq!(body_bytes_served(&hub), total);
}

#[test]
fn only_blobs_matching_the_pin_are_adopted_from_another_revision() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let (hub, files) = hub_with_repo(32, 6 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    let old = hub.commit(REPO, "main").unwrap();
    hf_download_ok(&hub.endpoint(), &hf_home, Some(&old));
    // A new commit changes one shard; the cache holds the old revision.
    let changed = lfs_file(&files).clone();
    let mut new_bytes = content_bytes(&changed).unwrap().to_vec();
    let last = new_bytes.len() - 1;
    new_bytes[last] ^= 0x5a;
    hub.update_file(REPO, &changed.path, new_bytes.clone())
        .unwrap();
    hub.clear_requests();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(out.join("source").join(&changed.path)).unwrap(),
        new_bytes
    );
    let adopted: Vec<&str> = events(&lines, "file_adopted")
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    // Unchanged LFS shards are found by their sha256; small files only
    // through a snapshot of the pinned commit, which the cache lacks.
    for f in &files {
        let lfs = f.path.ends_with(".safetensors");
        let expect = lfs && f.path != changed.path;
        assert_eq!(
            adopted.contains(&f.path.as_str()),
            expect,
            "{}: {adopted:?}",
            f.path
        );
    }
    assert!(!body_gets(&hub, &changed.path).is_empty());
    let a = assert_clean_audit(&out);
    assert_eq!(audit_line(&a, &changed.path)["cache_bytes"], 0);
}

#[test]
fn a_corrupted_cached_blob_is_ignored_recorded_and_refetched() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let (hub, files) = hub_with_repo(33, 6 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    hf_download_ok(&hub.endpoint(), &hf_home, None);
    let victim = lfs_file(&files).clone();
    let blob = blobs_dir(&hf_home).join(sha256_of(&victim));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    hub.clear_requests();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    let rejected = events(&lines, "cache_rejected");
    assert_eq!(rejected.len(), 1, "{lines:#?}");
    assert_eq!(rejected[0]["path"], victim.path.as_str());
    assert!(
        rejected[0]["reason"]
            .as_str()
            .unwrap()
            .contains("sha256 is"),
        "{}",
        rejected[0]
    );
    assert_eq!(
        body_bytes_served(&hub),
        content_len(&victim),
        "only the victim is fetched"
    );
    let a = assert_clean_audit(&out);
    let rows: Vec<_> = a["cache_candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"] == "rejected")
        .collect();
    assert_eq!(rows.len(), 1, "{a:#}");
    assert_eq!(rows[0]["path"], victim.path.as_str());
    assert_eq!(audit_line(&a, &victim.path)["cache_bytes"], 0);
    // The cache was not touched.
    assert_eq!(std::fs::read(&blob).unwrap(), bytes);
}

#[test]
fn an_interrupted_hf_download_is_resumed_from_its_incomplete_blob() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    // Shards of ~13 MB: hf writes 10 MiB chunks, so 12 MiB then a stall
    // leaves a 10 MiB `.incomplete`.
    let (hub, files) = hub_with_repo(34, 40 << 20);
    let victim = files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .max_by_key(|f| content_len(f))
        .unwrap()
        .clone();
    assert!(content_len(&victim) > 12 << 20, "{}", content_len(&victim));
    hub.inject(FaultRule::new(
        victim.path.clone(),
        Fault::Stall {
            after: 12 << 20,
            for_ms: 120_000,
        },
    ));
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    let mut child = hf_download(&hub.endpoint(), &hf_home, None)
        .spawn()
        .unwrap();
    let sha = sha256_of(&victim);
    let others = files.len() - 1;
    let deadline = Instant::now() + Duration::from_secs(90);
    let incomplete = loop {
        assert!(Instant::now() < deadline, "hf never left a 10 MiB prefix");
        std::thread::sleep(Duration::from_millis(100));
        let Ok(rd) = std::fs::read_dir(blobs_dir(&hf_home)) else {
            continue;
        };
        // hf renames a blob once it is complete: an entry listed may be
        // gone by the time it is looked at (ENOENT in one full run here).
        let names: Vec<(String, u64)> = rd
            .flatten()
            .filter_map(|e| {
                let len = e.metadata().ok()?.len();
                Some((e.file_name().to_string_lossy().into_owned(), len))
            })
            .collect();
        let complete = names
            .iter()
            .filter(|(n, _)| !n.ends_with(".incomplete"))
            .count();
        let prefix = names
            .iter()
            .find(|(n, len)| n.starts_with(&sha) && n.ends_with(".incomplete") && *len >= 10 << 20);
        if let (Some((name, _)), true) = (prefix, complete >= others) {
            break blobs_dir(&hf_home).join(name);
        }
    };
    // kill -9: the client gets no chance to clean up its temp file.
    child.kill().unwrap();
    child.wait().unwrap();
    hub.clear_faults();
    let prefix_len = std::fs::metadata(&incomplete).unwrap().len();
    let prefix_bytes = std::fs::read(&incomplete).unwrap();
    hub.clear_requests();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    let resumed = events(&lines, "file_resumed_from_cache");
    assert_eq!(resumed.len(), 1, "{lines:#?}");
    assert_eq!(resumed[0]["bytes"], prefix_len);
    // The rest only, with a strict Range from the prefix.
    let gets = body_requests(&hub, &victim.path);
    assert_eq!(gets.len(), 1, "{gets:#?}");
    assert_eq!(
        gets[0].range.as_deref(),
        Some(format!("bytes={prefix_len}-").as_str())
    );
    assert_eq!(body_bytes_served(&hub), content_len(&victim) - prefix_len);
    let a = assert_clean_audit(&out);
    let line = audit_line(&a, &victim.path);
    assert_eq!(line["cache_bytes"], prefix_len, "{line}");
    assert_eq!(
        line["transferred_bytes"],
        content_len(&victim) - prefix_len,
        "{line}"
    );
    // Copied, never moved: the cache still holds the prefix as it was.
    assert_eq!(std::fs::read(&incomplete).unwrap(), prefix_bytes);
}

#[test]
fn the_token_file_is_used_when_hf_token_is_unset_and_written_nowhere() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let (hub, files) = hub_with_repo(35, 2 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    std::fs::create_dir_all(&hf_home).unwrap();
    const SECRET: &str = "hf_tokenfile_Secret_7f3a9c";
    std::fs::write(hf_home.join("token"), format!("{SECRET}\n")).unwrap();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_eq!(lines.last().unwrap()["session"]["token_source"], "hf_home");
    let api = hub
        .requests()
        .into_iter()
        .filter(|r| r.origin == Origin::Main)
        .collect::<Vec<_>>();
    assert!(
        !api.is_empty() && api.iter().all(|r| r.authorization),
        "{api:#?}"
    );
    // HF_TOKEN_PATH names another file.
    let elsewhere = tmp.path().join("elsewhere-token");
    std::fs::write(&elsewhere, SECRET).unwrap();
    let out2 = tmp.path().join("out2");
    let mut cmd = fetch_cmd(&hub.endpoint(), &out2, &["--json"]);
    cmd.env("HF_HOME", tmp.path().join("empty-home"))
        .env("HF_TOKEN_PATH", &elsewhere);
    let o2 = run_ok(&mut cmd);
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o2.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(summary["session"]["token_source"], "token_path");
    // Never written anywhere: outputs, every file under DIR, the bundle.
    let bundle = tmp.path().join("evidence.tar.zst");
    let b = run_ok(
        ftpipe()
            .args(["audit", "--out"])
            .arg(&out)
            .arg("--bundle")
            .arg(&bundle),
    );
    for o in [&o, &o2, &b] {
        assert!(!String::from_utf8_lossy(&o.stdout).contains(SECRET));
        assert!(!stderr(o).contains(SECRET));
    }
    let unpacked = zstd::decode_all(std::fs::File::open(&bundle).unwrap()).unwrap();
    assert!(
        !contains(&unpacked, SECRET.as_bytes()),
        "token in the bundle"
    );
    for dir in [&out, &out2] {
        for rel in tree_of(dir) {
            let p = dir.join(&rel);
            if p.is_file() {
                assert!(
                    !contains(&std::fs::read(&p).unwrap(), SECRET.as_bytes()),
                    "token in {rel}"
                );
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn offline_works_from_durable_state_and_the_cache_and_names_what_is_missing() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let (hub, files) = hub_with_repo(36, 3 << 20);
    let tmp = tempfile::tempdir().unwrap();
    let empty_home = tmp.path().join("no-cache");
    let out = tmp.path().join("out");
    // No state at all: nothing to pin without the network.
    hub.clear_requests();
    let mut cmd = fetch_cmd(&hub.endpoint(), &out, &[]);
    cmd.env("HF_HOME", &empty_home).env("HF_HUB_OFFLINE", "1");
    let o = run(&mut cmd);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("offline") && stderr(&o).contains("no pin"),
        "{}",
        stderr(&o)
    );
    assert!(hub.requests().is_empty(), "{:#?}", hub.requests());
    // A complete state: offline fetch is a verified no-op without a request.
    run_ok(fetch_cmd(&hub.endpoint(), &out, &[]).env("HF_HOME", &empty_home));
    hub.clear_requests();
    run_ok(fetch_cmd(&hub.endpoint(), &out, &["--offline"]).env("HF_HOME", &empty_home));
    assert!(hub.requests().is_empty(), "{:#?}", hub.requests());
    // Two files gone: offline names both, and the bytes still needed.
    let gone: Vec<&RepoFile> = files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .collect();
    for f in &gone {
        std::fs::remove_file(out.join("source").join(&f.path)).unwrap();
    }
    let o = run(fetch_cmd(&hub.endpoint(), &out, &["--offline"]).env("HF_HOME", &empty_home));
    assert!(!o.status.success());
    let err = stderr(&o);
    for f in &gone {
        assert!(err.contains(&f.path), "{err}");
    }
    let needed: u64 = gone.iter().map(|f| content_len(f)).sum();
    assert!(
        err.contains(&format!("{needed} bytes still needed")),
        "{err}"
    );
    assert!(hub.requests().is_empty(), "{:#?}", hub.requests());
    // With a cache holding them, offline succeeds from the cache alone.
    let hf_home = tmp.path().join("hf-home");
    hf_download_ok(&hub.endpoint(), &hf_home, None);
    hub.clear_requests();
    run_ok(
        fetch_cmd(&hub.endpoint(), &out, &[])
            .env("HF_HOME", &hf_home)
            .env("HF_HUB_OFFLINE", "1"),
    );
    assert!(hub.requests().is_empty(), "{:#?}", hub.requests());
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
}

/// Regression: a cached blob adopted as a hard link (ext4, no reflink) was
/// the same inode as `DIR/source/…`, so rewriting the blob in place after
/// adoption changed the source, and `run` built and verified an artifact
/// from bytes that were not the pin's (exit 0; only `audit --deep`
/// noticed). Adoption now reflinks or copies, never links: the rewrite
/// cannot reach the source, and the artifact is the one a run without the
/// cache builds.
#[test]
fn a_blob_rewritten_in_place_after_adoption_never_reaches_the_artifact() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let hub = qwen4_hub(33, ftpipe_fixtures::qwen4::QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    hf_download_ok(&hub.endpoint(), &hf_home, None);
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let adopted = events(&lines, "file_adopted");
    assert!(!adopted.is_empty(), "{lines:#?}");
    for e in &adopted {
        assert_ne!(e["placement"], "hardlink", "{e}");
    }
    // Another program rewrites every cached shard in place (same inode).
    let mut rewritten = 0;
    for blob in std::fs::read_dir(blobs_dir(&hf_home)).unwrap().flatten() {
        let len = blob.metadata().unwrap().len();
        if len < 1 << 16 {
            continue;
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(blob.path())
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 4096], len / 2).unwrap();
        f.sync_all().unwrap();
        rewritten += 1;
    }
    assert!(rewritten > 0, "no shard blob in the cache");
    let mut cmd = run_cmd(&hub.endpoint(), &out, &[]);
    run_ok(cmd.env("HF_HOME", &hf_home));
    run_ok(
        ftpipe()
            .args(["verify", "--deep"])
            .arg(out.join("artifact")),
    );
    assert_clean_audit(&out);
    // The same artifact as a run that never saw the cache.
    let fresh = tmp.path().join("fresh");
    run_ok(&mut run_cmd(&hub.endpoint(), &fresh, &["--no-hf-cache"]));
    assert_eq!(manifest_sha(&out), manifest_sha(&fresh));
}

/// The LFS files of `hub`'s `REPO` at `main`, with their SHA-256.
fn lfs_files(hub: &RunningHub) -> Vec<(String, String)> {
    hub.listing(REPO, "main")
        .unwrap()
        .into_iter()
        .filter_map(|l| Some((l.path, l.sha256?)))
        .collect()
}

/// `<cache>/blobs/<2 hex>/<xet hash>`: huggingface_hub's shared store entry.
fn shared_blob(hf_home: &Path, xet: &str) -> PathBuf {
    hf_home.join("hub/blobs").join(&xet[..2]).join(xet)
}

/// Regression (issue 35, item 9): huggingface_hub 2.x with Xet (its
/// default) keeps a Xet file in the cache-wide shared store
/// `<cache>/blobs/<2 hex>/<xet hash>` and makes the repo's `blobs/<sha256>`
/// a relative link into it. ftpipe refused every such link as "not a
/// regular file" and downloaded everything again (the other cache tests
/// passed only because they set `HF_HUB_DISABLE_XET=1`). A repo blob link
/// into the same cache's shared store is now followed (one relative link,
/// to a regular file) and its bytes adopted after the usual verification.
/// The same Xet-serving hub still serves the bytes to a client without Xet,
/// whose cache (regular blobs) is adopted too.
#[test]
fn a_default_xet_cache_is_adopted_from_the_shared_store() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let cas = LocalCas::start();
    let files = ftpipe_fixtures::qwen4::generate_qwen4_repo(37, Default::default());
    let hub = hub_serving(files.clone());
    let hashes = xet_hub(&hub, &cas, &files);
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    let o = hf_download_into_shared_store(&hub.endpoint(), &hf_home)
        .output()
        .unwrap();
    assert!(o.status.success(), "hf download failed: {}", stderr(&o));
    // hf went through Xet: a read token asked for, no LFS body from the hub.
    let reqs = hub.requests();
    assert!(
        reqs.iter().any(|r| r.path.contains("/xet-read-token/")),
        "{reqs:#?}"
    );
    let lfs = lfs_files(&hub);
    for (path, sha) in &lfs {
        assert!(body_requests(&hub, path).is_empty(), "{path}: {reqs:#?}");
        // The layout huggingface_hub 2.4 writes, checked on disk.
        let xet = &hashes[sha];
        let link = blobs_dir(&hf_home).join(sha);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../blobs").join(&xet[..2]).join(xet),
            "{path}"
        );
        let entry = std::fs::symlink_metadata(shared_blob(&hf_home, xet)).unwrap();
        assert!(entry.is_file(), "{path}: {entry:?}");
    }
    // hf_xet's own refresher, given only the read-token route, reads the
    // CAS URL and token from its JSON body.
    let (path, sha) = &lfs[0];
    let want = files.iter().find(|f| &f.path == path).unwrap();
    let got = tmp.path().join("refresher.bin");
    hf_xet_download(&hub, "main", &hashes[sha], content_len(want), &got);
    assert!(std::fs::read(&got).unwrap() == content_bytes(want).unwrap().as_ref());
    hub.clear_requests();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(body_bytes_served(&hub), 0, "{:#?}", hub.requests());
    assert!(events(&lines, "cache_rejected").is_empty(), "{lines:#?}");
    assert_eq!(
        events(&lines, "file_adopted").len(),
        files.len(),
        "{lines:#?}"
    );
    let a = assert_clean_audit(&out);
    assert_eq!(a["transferred_bytes"], 0, "{a:#}");
    let candidates = a["cache_candidates"].as_array().unwrap();
    for (path, sha) in &lfs {
        let c = candidates
            .iter()
            .find(|c| c["path"] == path.as_str())
            .unwrap_or_else(|| panic!("no candidate row for {path}: {a:#}"));
        assert_eq!(c["outcome"], "adopted", "{c}");
        let store = std::fs::canonicalize(shared_blob(&hf_home, &hashes[sha])).unwrap();
        assert_eq!(c["cache_path"], store.to_str().unwrap(), "{c}");
    }
    // The artifact is the one a run that never saw the cache builds.
    run_ok(run_cmd(&hub.endpoint(), &out, &[]).env("HF_HOME", &hf_home));
    let fresh = tmp.path().join("fresh");
    run_ok(&mut run_cmd(&hub.endpoint(), &fresh, &["--no-hf-cache"]));
    assert_eq!(manifest_sha(&out), manifest_sha(&fresh));
    // Xet disabled against the same hub: resolve serves the bytes, the
    // blobs are regular files, and they are adopted as before.
    let plain_home = tmp.path().join("plain-home");
    hub.clear_requests();
    hf_download_ok(&hub.endpoint(), &plain_home, None);
    assert!(
        hub.requests()
            .iter()
            .all(|r| !r.path.contains("/xet-read-token/")),
        "{:#?}",
        hub.requests()
    );
    for (path, sha) in &lfs {
        let meta = std::fs::symlink_metadata(blobs_dir(&plain_home).join(sha)).unwrap();
        assert!(meta.is_file(), "{path}: {meta:?}");
    }
    hub.clear_requests();
    let out2 = tmp.path().join("out2");
    let (o, lines) = fetch_json(&hub, &out2, &plain_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(body_bytes_served(&hub), 0, "{:#?}", hub.requests());
    assert_eq!(
        events(&lines, "file_adopted").len(),
        files.len(),
        "{lines:#?}"
    );
    assert_files_match(&out2, &files);
}

/// A repo blob link is followed only into the same cache's shared store,
/// one relative link to a regular file. A link escaping the cache (to a
/// file holding the right bytes), a store entry that is itself a link (to
/// the right bytes) and one that is a FIFO are each refused with a reason
/// naming what is wrong, recorded, and the file is fetched instead (from
/// the Xet storage the hub serves it from, issue 37); the
/// untouched files are still adopted.
#[test]
fn shared_store_links_leading_elsewhere_are_refused_and_fetched() {
    let _heavy = heavy();
    if !require_hf() {
        return;
    }
    let cas = LocalCas::start();
    let (hub, files) = hub_with_repo(38, 9 << 20);
    let hashes = xet_hub(&hub, &cas, &files);
    let tmp = tempfile::tempdir().unwrap();
    let hf_home = tmp.path().join("hf-home");
    let o = hf_download_into_shared_store(&hub.endpoint(), &hf_home)
        .output()
        .unwrap();
    assert!(o.status.success(), "hf download failed: {}", stderr(&o));
    let lfs = lfs_files(&hub);
    assert!(lfs.len() >= 3, "{lfs:?}");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let copy_outside = |xet: &str| {
        let p = outside.join(xet);
        std::fs::copy(shared_blob(&hf_home, xet), &p).unwrap();
        p
    };
    // 1: the repo link leaves the cache (relative, `..` past its root).
    let (escape_path, escape_sha) = &lfs[0];
    let xet = &hashes[escape_sha];
    copy_outside(xet);
    let link = blobs_dir(&hf_home).join(escape_sha);
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(format!("../../../../outside/{xet}"), &link).unwrap();
    assert!(
        link.is_file(),
        "the planted link must reach the right bytes"
    );
    // 2: the store entry is a link (a second level).
    let (second_path, second_sha) = &lfs[1];
    let xet = &hashes[second_sha];
    let target = copy_outside(xet);
    let entry = shared_blob(&hf_home, xet);
    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(&target, &entry).unwrap();
    // 3: the store entry is a FIFO.
    let (fifo_path, fifo_sha) = &lfs[2];
    let entry = shared_blob(&hf_home, &hashes[fifo_sha]);
    std::fs::remove_file(&entry).unwrap();
    let mk = Command::new("mkfifo").arg(&entry).status().unwrap();
    assert!(mk.success());
    hub.clear_requests();
    let out = tmp.path().join("out");
    let (o, lines) = fetch_json(&hub, &out, &hf_home, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    let rejected = events(&lines, "cache_rejected");
    let reason = |path: &str| {
        let found: Vec<_> = rejected.iter().filter(|e| e["path"] == path).collect();
        assert_eq!(found.len(), 1, "{path}: {lines:#?}");
        found[0]["reason"].as_str().unwrap().to_owned()
    };
    let why = reason(escape_path);
    assert!(why.contains("outside the cache's shared store"), "{why}");
    let why = reason(second_path);
    assert!(why.contains("second level"), "{why}");
    let why = reason(fifo_path);
    assert!(why.contains("not a regular file"), "{why}");
    assert_eq!(rejected.len(), 3, "{lines:#?}");
    let victims = [escape_path, second_path, fifo_path];
    // The hub serves them through Xet storage (issue 37): fetched from the
    // CAS by reconstruction, no body from the hub.
    assert_eq!(body_bytes_served(&hub), 0, "{:#?}", hub.requests());
    for v in victims {
        let terms = query(
            &out,
            &format!("SELECT COUNT(*) FROM xet_terms WHERE path = {}", sql_str(v)),
        );
        assert_ne!(terms, ["0"], "{v} not fetched through Xet storage");
    }
    let adopted = events(&lines, "file_adopted");
    assert_eq!(adopted.len(), files.len() - 3, "{lines:#?}");
    let a = assert_clean_audit(&out);
    let rows: Vec<_> = a["cache_candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"] == "rejected")
        .collect();
    assert_eq!(rows.len(), 3, "{a:#}");
}
