//! Incremental rebuild after a repin (issue 37, item 4). `run --repin`
//! used to refuse the old artifact ("made from REPO@OLD", pass
//! `--rebuild`) and rebuild every component, although each component's
//! identity names its exact source spans. Now a component whose spans the
//! new revision left unchanged is kept (its file untouched, a
//! `component_kept` event), only components reading a changed tensor are
//! converted again, the manifest is byte-equal to a fresh build of the new
//! revision, `plan --remote --repin` says before anything is fetched which
//! files are fetched and which components are kept, checked or converted
//! again, and a kill anywhere in the partial rebuild resumes to the same
//! manifest.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::RunningHub;
use ftpipe_fixtures::checkpoint;
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};

/// The BF16 expert tensors of a safetensors file: its header length and
/// each tensor's name and header entry.
pub(crate) fn bf16_experts(bytes: &[u8]) -> (usize, Vec<(String, serde_json::Value)>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let experts = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, t)| name.contains(".mlp.experts.") && t["dtype"] == "BF16")
        .map(|(name, t)| (name.clone(), t.clone()))
        .collect();
    (n, experts)
}

/// The first shard of a generated checkpoint holding BF16 expert
/// tensors, and its bytes.
fn expert_shard(seed: u64) -> (String, Vec<u8>) {
    generate_qwen4_repo(seed, QwenShape::default())
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .map(|f| {
            (
                f.path.clone(),
                checkpoint::content_bytes(f).unwrap().to_vec(),
            )
        })
        .find(|(_, bytes)| !bf16_experts(bytes).1.is_empty())
        .expect("a shard with BF16 expert tensors")
}

/// `bytes` (a safetensors file) with the lowest bit of the first byte of
/// `k` BF16 expert tensors of one layer flipped (a finite BF16 stays
/// finite), the header unchanged; returns the new bytes and the tensors.
pub(crate) fn change_expert_tensors(bytes: &[u8], k: usize) -> (Vec<u8>, Vec<String>) {
    let (n, experts) = bf16_experts(bytes);
    let (first, _) = experts.first().expect("a BF16 expert tensor in the shard");
    let layer = first.split(".mlp.experts.").next().unwrap().to_owned();
    let chosen: Vec<(String, serde_json::Value)> = experts
        .into_iter()
        .filter(|(name, _)| name.starts_with(&format!("{layer}.mlp.experts.")))
        .take(k)
        .collect();
    assert_eq!(chosen.len(), k, "{k} expert tensors in {layer}");
    let mut out = bytes.to_vec();
    for (_, t) in &chosen {
        let start = t["data_offsets"][0].as_u64().unwrap() as usize;
        out[8 + n + start] ^= 1;
    }
    (out, chosen.into_iter().map(|(name, _)| name).collect())
}

/// The components whose inventory names any of `tensors`.
fn readers_of(out: &Path, tensors: &[String]) -> BTreeSet<String> {
    manifest_json(out)["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["sources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| tensors.iter().any(|x| s == x.as_str()))
        })
        .map(|t| t["component"].as_str().unwrap().to_owned())
        .collect()
}

/// Every component path of the manifest.
fn components(out: &Path) -> BTreeSet<String> {
    manifest_json(out)["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_owned())
        .collect()
}

/// Inode and mtime of every component file.
fn stamps(out: &Path) -> std::collections::BTreeMap<String, (u64, i64, i64)> {
    components(out)
        .into_iter()
        .map(|c| {
            let m = std::fs::metadata(out.join("artifact").join(&c)).unwrap();
            (c, (m.ino(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

/// The `path`s of the `--json` events named `event`.
fn event_paths(o: &std::process::Output, event: &str) -> BTreeSet<String> {
    json_events(o, event)
        .into_iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect()
}

/// The manifest.json bytes of a fresh build of the hub's current revision.
fn fresh_manifest(hub: &RunningHub, tmp: &Path) -> Vec<u8> {
    let fresh = tmp.join("fresh");
    run_ok(&mut run_cmd(&hub.endpoint(), &fresh, &[]));
    std::fs::read(fresh.join("artifact/manifest.json")).unwrap()
}

fn manifest_bytes(out: &Path) -> Vec<u8> {
    std::fs::read(out.join("artifact/manifest.json")).unwrap()
}

/// A converted artifact of seed `seed` in `tmp/out`; then the hub
/// publishes a commit whose first shard has `k` expert tensors changed.
/// Returns the hub, DIR, the shard and the changed tensors.
fn repinned_shard(
    seed: u64,
    tmp: &Path,
    k: usize,
) -> (RunningHub, std::path::PathBuf, String, Vec<String>) {
    let hub = qwen4_hub(seed, QwenShape::default());
    let out = tmp.join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let (shard, bytes) = expert_shard(seed);
    let (changed, tensors) = change_expert_tensors(&bytes, k);
    hub.update_file(REPO, &shard, changed).unwrap();
    (hub, out, shard, tensors)
}

#[test]
fn a_repin_changing_k_tensors_rebuilds_exactly_their_components() {
    let tmp = tempfile::tempdir().unwrap();
    let (hub, out, shard, tensors) = repinned_shard(71, tmp.path(), 2);
    let readers = readers_of(&out, &tensors);
    assert!(!readers.is_empty(), "no component reads {tensors:?}");
    let before = stamps(&out);

    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--repin", "--json"]));
    let written = event_paths(&o, "component_written");
    let kept = event_paths(&o, "component_kept");
    assert_eq!(written, readers, "converted again: {written:?}");
    assert!(
        !kept.is_empty(),
        "no component reading {shard} was kept by the span check"
    );
    assert!(kept.is_disjoint(&written));
    assert_eq!(event_paths(&o, "file_published"), BTreeSet::from([shard]));
    let after = stamps(&out);
    for (c, stamp) in &before {
        if !readers.contains(c) {
            assert_eq!(after.get(c), Some(stamp), "{c} was rewritten");
        }
    }
    assert_eq!(manifest_bytes(&out), fresh_manifest(&hub, tmp.path()));
    assert_clean_audit(&out);
    // Nothing was set aside.
    let log = query(&out, "SELECT event FROM artifacts ORDER BY id");
    assert_eq!(log, ["manifest", "manifest"], "{log:?}");
    // The repinned DIR is finished: a plain run is a no-op.
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
}

#[test]
fn a_repin_changing_the_config_rebuilds_everything() {
    let hub = qwen4_hub(72, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("source/config.json")).unwrap()).unwrap();
    config["rope_theta"] = serde_json::json!(123456.0);
    hub.update_file(REPO, "config.json", serde_json::to_vec(&config).unwrap())
        .unwrap();

    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--repin", "--json"]));
    assert_eq!(event_paths(&o, "component_written"), components(&out));
    assert!(event_paths(&o, "component_kept").is_empty());
    assert_eq!(
        event_paths(&o, "file_published"),
        BTreeSet::from(["config.json".to_owned()])
    );
    assert_eq!(manifest_bytes(&out), fresh_manifest(&hub, tmp.path()));
    assert_clean_audit(&out);
}

#[test]
fn plan_names_what_a_repin_fetches_and_converts_again_before_fetching() {
    let tmp = tempfile::tempdir().unwrap();
    let (hub, out, shard, tensors) = repinned_shard(73, tmp.path(), 1);
    let readers = readers_of(&out, &tensors);
    let shard_size = std::fs::metadata(out.join("source").join(&shard))
        .unwrap()
        .len();
    let gets_before = body_gets(&hub, &shard).len();

    let o = run_ok(
        ftpipe()
            .args(["plan", REPO, "--endpoint", &hub.endpoint(), "--out"])
            .arg(&out)
            .args(["--remote", "--repin", "--json"]),
    );
    // Only the new shard's header was read (8 + N bytes over Range).
    let header_bytes = {
        let (_, bytes) = expert_shard(73);
        8 + u64::from_le_bytes(bytes[..8].try_into().unwrap())
    };
    let gets = body_gets(&hub, &shard);
    let read: u64 = gets[gets_before..].iter().map(|r| r.body_bytes).sum();
    assert!(
        gets[gets_before..].iter().all(|r| r.range.is_some()) && read <= header_bytes,
        "plan read {read} bytes of {shard} (its header is {header_bytes})"
    );
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let repin = &plan["repin"];
    assert_eq!(repin["fetch_files"], serde_json::json!([shard]));
    assert_eq!(repin["fetch_bytes"], shard_size);
    let fated = |fate: &str| -> BTreeSet<String> {
        repin["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["fate"] == fate)
            .map(|c| c["component"].as_str().unwrap().to_owned())
            .collect()
    };
    let (kept, checked, rebuilt) = (fated("kept"), fated("checked"), fated("rebuilt"));
    assert!(rebuilt.is_empty(), "{rebuilt:?}");
    assert!(
        readers.is_subset(&checked),
        "{readers:?} not in {checked:?}"
    );
    assert!(!kept.is_empty());
    // The human form names the same.
    let human = run_ok(
        ftpipe()
            .args(["plan", REPO, "--endpoint", &hub.endpoint(), "--out"])
            .arg(&out)
            .args(["--remote", "--repin"]),
    );
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains(&format!("fetch {shard}")), "{text}");

    // The run agrees: it fetches those bytes, converts again only checked
    // components, and keeps every other checked one.
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--repin", "--json"]));
    let published = json_events(&o, "file_published");
    let fetched: u64 = published.iter().map(|e| e["size"].as_u64().unwrap()).sum();
    assert_eq!(fetched, shard_size);
    let written = event_paths(&o, "component_written");
    let kept_now = event_paths(&o, "component_kept");
    assert_eq!(written, readers);
    assert_eq!(
        written.union(&kept_now).cloned().collect::<BTreeSet<_>>(),
        checked
    );
    assert!(kept.is_disjoint(&written));
}

/// A kill at every step of the partial rebuild (old spans recorded, the
/// new shard renamed, a component kept, a component converted again)
/// resumes to the fresh build's manifest.
#[test]
fn a_kill_during_the_partial_rebuild_resumes_to_the_fresh_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let (hub, out, _shard, _tensors) = repinned_shard(74, tmp.path(), 2);
    let fresh = fresh_manifest(&hub, tmp.path());
    let points = [
        "rebuild-spans-recorded",
        "fetch-renamed",
        "component-kept",
        "component-renamed",
        "manifest-written",
    ];
    for (i, point) in points.iter().enumerate() {
        let dir = tmp.path().join(format!("kill{i}"));
        copy_tree(&out, &dir);
        let o = run(run_cmd(&hub.endpoint(), &dir, &["--repin"]).env("FTPIPE_CRASH_AT", point));
        assert!(!o.status.success(), "{point}: not reached: {}", stderr(&o));
        let o = run_ok(&mut run_cmd(&hub.endpoint(), &dir, &["--repin", "--json"]));
        assert_eq!(manifest_bytes(&dir), fresh, "after a kill at {point}");
        assert_clean_audit(&dir);
        // Killed once every component was durable: none is converted again.
        if *point == "manifest-written" {
            assert!(event_paths(&o, "component_written").is_empty(), "{point}");
        }
    }
}

/// A kill storm over repins: `run --repin` of the old artifact (a fresh
/// copy for each chain) killed with SIGKILL at seeded moments (`KILLS`,
/// default 100; the seed is printed, `FTPIPE_CRASH_SEED` replays it).
/// After every kill every component receipt names a file with its size
/// and SHA-256 (a component converted again loses its old receipt before
/// its new file is renamed over the old one);
/// every finished chain has the fresh build's manifest and verifies deep.
#[test]
fn kill_storm_over_repins_ends_with_the_fresh_manifest() {
    use ftpipe_fixtures::checkpoint::SplitMix64;
    use std::time::Instant;
    let _heavy = heavy();
    let kills: usize = std::env::var("KILLS")
        .ok()
        .map(|k| k.parse().expect("KILLS must be a number"))
        .unwrap_or(100);
    let seed = crash_seed();
    eprintln!("repin kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let (hub, out, _, _) = repinned_shard(75, tmp.path(), 2);
    let fresh = fresh_manifest(&hub, tmp.path());
    let copy = |n: usize| {
        let dir = tmp.path().join(format!("chain-{n}"));
        copy_tree(&out, &dir);
        dir
    };
    let start = Instant::now();
    run_ok(&mut run_cmd(&hub.endpoint(), &copy(0), &["--repin"]));
    let chain_ms = (start.elapsed().as_millis() as u64).max(20);
    let finished = |dir: &Path, label: &str| {
        assert_eq!(manifest_bytes(dir), fresh, "{label}: manifest differs");
        let v = run(ftpipe()
            .arg("verify")
            .arg(dir.join("artifact"))
            .arg("--deep"));
        assert!(v.status.success(), "{label}: verify --deep: {}", stderr(&v));
        assert_clean_audit(dir);
    };
    let (chains, landed) = repin_kill_storm(
        &hub.endpoint(),
        kills,
        chain_ms,
        &mut rng,
        &copy,
        &finished,
        &|_| Vec::new(),
    );
    eprintln!(
        "repin kill storm (seed {seed}): {kills} kills over {chains} chains in {:?}; by place: {landed:?}",
        start.elapsed()
    );
    assert!(
        landed.get("convert").is_some_and(|n| *n > 0),
        "no kill landed in the partial rebuild: {landed:?}"
    );
}

/// SIGKILLs `kills` runs of `run --repin` from `endpoint` at seeded delays
/// (`rng`) below `chain_ms`, each chain in a fresh copy of the old
/// artifact (`copy(n)`, from 1); a run that finishes on its own is checked
/// by `finished` and the next chain begins. After every kill each
/// component receipt names its file. The last chain is run to its end.
/// Chain n's runs take `args(n)` after `--repin`. Returns the chains run
/// and where the kills landed.
pub(crate) fn repin_kill_storm(
    endpoint: &str,
    kills: usize,
    chain_ms: u64,
    rng: &mut ftpipe_fixtures::checkpoint::SplitMix64,
    copy: &dyn Fn(usize) -> std::path::PathBuf,
    finished: &dyn Fn(&Path, &str),
    args: &dyn Fn(usize) -> Vec<&'static str>,
) -> (usize, std::collections::BTreeMap<String, usize>) {
    use std::process::Stdio;
    use std::time::Duration;
    let (mut chains, mut kill) = (1, 0);
    let mut landed = std::collections::BTreeMap::<String, usize>::new();
    let mut dir = copy(chains);
    while kill < kills {
        let delay = rng.next_u64() % chain_ms;
        let mut child = run_cmd(endpoint, &dir, &[&["--repin"][..], &args(chains)].concat())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ftpipe");
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill(); // SIGKILL
        let status = child.wait().expect("wait");
        let label = format!("kill {} after {delay} ms in {}", kill + 1, dir.display());
        assert!(
            status.success() || status.code().is_none(),
            "{label}: run exited with {status} on its own"
        );
        if status.success() {
            finished(&dir, &label);
            chains += 1;
            dir = copy(chains);
            continue;
        }
        kill += 1;
        crate::chain_crash::check_components_after_kill(&dir, &label);
        *landed
            .entry(crate::chain_crash::landed_in(&dir))
            .or_default() += 1;
    }
    run_ok(&mut run_cmd(
        endpoint,
        &dir,
        &[&["--repin"][..], &args(chains)].concat(),
    ));
    finished(&dir, "last chain");
    (chains, landed)
}
