//! End-to-end: `ftpipe run --disk-budget SIZE` on released-layout
//! checkpoints (BF16 and NVFP4; PLE shards one per file among other
//! tensors, and in files of their own). At the minimum feasible budget
//! `plan` reports, and at 1.5× it, the run gives the manifest of an
//! unbudgeted run byte for byte, and a sampler polling `source/` (every
//! regular file, `.part` included) never sees more source bytes than the
//! budget; every shard is deleted at the end and the audit shows the
//! budget and the peak held. A budget one byte below the minimum is
//! refused before any shard body is fetched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::common::*;
use crate::disk_budget::{expected_minimum, shards};
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};

/// Polls a directory's regular files (recursively) and keeps the largest
/// total of the bytes they hold on disk seen (each file's length, or its
/// allocated blocks when fewer: a shard punched down to its PLE spans
/// keeps its length), until dropped.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub(crate) fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| held_len(&m)),
            _ => 0,
        })
        .sum()
}

/// What a file holds on disk: its length, or its allocated blocks when
/// fewer (holes punched).
pub(crate) fn held_len(m: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    m.len().min(m.blocks() * 512)
}

impl Sampler {
    pub(crate) fn start(dir: PathBuf) -> Sampler {
        Sampler::start_all(vec![dir])
    }

    /// Samples the sum over `dirs`.
    pub(crate) fn start_all(dirs: Vec<PathBuf>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let (s, m, n) = (stop.clone(), max.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                m.fetch_max(dirs.iter().map(|d| bytes_under(d)).sum(), Ordering::SeqCst);
                n.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
        Sampler {
            stop,
            max,
            samples,
            thread: Some(thread),
        }
    }

    /// `(largest total seen, samples taken)`.
    pub(crate) fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (
            self.max.load(Ordering::SeqCst),
            self.samples.load(Ordering::SeqCst),
        )
    }
}

fn budgeted(ep: &str, out: &Path, budget: u64) -> std::process::Output {
    run(&mut run_cmd(
        ep,
        out,
        &["--disk-budget", &budget.to_string(), "--json"],
    ))
}

fn check_shape(shape: &ReleaseShape) {
    let files = generate_release_repo(7, shape);
    let (minimum, _) = expected_minimum(&files);
    let hub = hub_serving(files.clone());
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();

    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, &[]));
    let want = manifest_sha(&plain);

    for budget in [minimum, minimum * 3 / 2] {
        let out = tmp.path().join(format!("b{budget}"));
        let sampler = Sampler::start(out.join("source"));
        let o = budgeted(&ep, &out, budget);
        let (seen, samples) = sampler.finish();
        assert!(o.status.success(), "budget {budget}: {}", stderr(&o));
        assert_eq!(manifest_sha(&out), want, "budget {budget}");
        assert!(samples > 10, "{samples} samples");
        assert!(
            seen <= budget && seen > 0,
            "budget {budget}: the sampler saw {seen} bytes of sources"
        );
        // Every shard was deleted once consumed; config and index stay.
        for f in shards(&files) {
            assert!(
                !out.join("source").join(&f.path).exists(),
                "{} kept",
                f.path
            );
        }
        let audit = assert_clean_audit(&out);
        let b = &audit["disk_budget"];
        assert_eq!(b["budget"], budget, "{b:#}");
        let peak = b["peak_held"].as_u64().unwrap();
        assert!(peak <= budget && peak >= seen, "{b:#} vs sampled {seen}");
        eprintln!("budget {budget}: peak held {peak}, sampled {seen} in {samples} samples");
    }

    // One byte below the minimum: refused, naming it, before any body.
    let out = tmp.path().join("below");
    crate::disk_budget::refused_below_minimum(&hub, &files, minimum, || {
        budgeted(&ep, &out, minimum - 1)
    });
    assert!(
        !out.join("source").exists(),
        "sources written below the minimum"
    );
}

#[test]
fn bf16_release_with_ple_among_other_tensors() {
    check_shape(&ReleaseShape::tiny());
}

#[test]
fn bf16_release_with_ple_only_files() {
    check_shape(&ReleaseShape {
        ple_own_files: true,
        ..ReleaseShape::tiny()
    });
}

#[test]
fn nvfp4_export_with_ple_among_other_tensors() {
    check_shape(&ReleaseShape::tiny_nvfp4());
}

#[test]
fn nvfp4_export_with_ple_only_files() {
    check_shape(&ReleaseShape {
        ple_own_files: true,
        ..ReleaseShape::tiny_nvfp4()
    });
}

/// A budgeted run's arguments: the chain tests' checkpoints plus the budget.
pub(crate) fn budget_args(budget: u64) -> Vec<String> {
    let mut args: Vec<String> = crate::chain_crash::ARGS
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--disk-budget".to_owned(), budget.to_string()]);
    args
}

/// Source bytes on disk after a kill: never past the budget.
pub(crate) fn check_held(out: &Path, budget: u64, label: &str) {
    // PLE spans copied aside are source bytes too.
    let held = bytes_under(&out.join("source")) + bytes_under(&out.join(".ftpipe/kept"));
    assert!(
        held <= budget,
        "{label}: {held} bytes of sources on disk, budget {budget}"
    );
}

/// A finished budgeted run deleted every shard (a retirement logged
/// before a kill included).
fn assert_no_shard_left(out: &Path, label: &str) {
    let left: Vec<_> = std::fs::read_dir(out.join("source"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors") || n.ends_with(".safetensors.part"))
        .collect();
    assert!(left.is_empty(), "{label}: shards left in source/: {left:?}");
}

/// Every crash point a budgeted run passes (the fetch driving the
/// conversion: span writes and claims, receipts, Q3, retirement), once
/// each at its first and at a later hit; a plain budgeted run then
/// finishes with the unbudgeted manifest.
#[test]
fn every_crash_point_of_a_budgeted_run_resumes_to_the_reference() {
    let files = generate_release_repo(11, &ReleaseShape::tiny());
    let (minimum, _) = expected_minimum(&files);
    let hub = hub_serving(files);
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(
        &hub.endpoint(),
        &plain,
        crate::chain_crash::ARGS,
    ));
    let reference = manifest_sha(&plain);
    let args = budget_args(minimum);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The last components renamed read shards retired before them: a kill
    // before their receipt must not need those shards again.
    let components = manifest_json(&plain)["components"]
        .as_array()
        .unwrap()
        .len() as u32;
    let last_renamed = [components - 1, components];
    // Each point at its first hit and, where a run passes it more than
    // once, at a later one.
    let points: &[(&str, &[u32])] = &[
        ("component-renamed", &last_renamed),
        ("plan-done", &[1]),
        ("skeleton-written", &[1]),
        ("fetch-verified", &[1, 3]),
        ("span-synced", &[1, 3]),
        ("span-claimed", &[1, 3]),
        ("component-renamed", &[1, 3]),
        ("retirement-logged", &[1, 3]),
        ("fetch-done", &[1]),
        ("manifest-written", &[1]),
    ];
    for (point, hits) in points {
        for hit in *hits {
            let at = format!("{point}#{hit}");
            let out = tmp.path().join(format!("out-{point}-{hit}"));
            let o = run(run_cmd(&hub.endpoint(), &out, &args).env("FTPIPE_CRASH_AT", &at));
            assert!(
                !o.status.success() && stderr(&o).contains(&format!("FTPIPE_CRASH_AT={at}")),
                "{at}: the crash point was not reached ({:?}): {}",
                o.status,
                stderr(&o)
            );
            check_after_kill(&out, &at);
            crate::chain_crash::check_components_after_kill(&out, &at);
            check_held(&out, minimum, &at);
            // The resumed run keeps to the budget too, counting what the
            // killed one left (a `.part`, a shard whose unlink was lost).
            let sampler = Sampler::start(out.join("source"));
            let o = run(&mut run_cmd(&hub.endpoint(), &out, &args));
            let (seen, _) = sampler.finish();
            assert!(o.status.success(), "{at}: resumed run: {}", stderr(&o));
            assert!(
                seen <= minimum,
                "{at}: the resumed run held {seen} bytes, budget {minimum}"
            );
            crate::chain_crash::check_finished(&hub, &out, &reference, &at);
            assert_no_shard_left(&out, &at);
        }
    }
}

/// Seeded SIGKILLs (≥ 100, `KILLS=N` for more) over budgeted runs at the
/// minimum budget, alternating BF16, NVFP4 and BF16 with the PLE table in
/// every file (shards punched down to their PLE spans); a completed chain
/// starts afresh. After every kill the ledger and component invariants
/// hold and the sources on disk are within the budget; every chain ends
/// with the unbudgeted run's manifest, a deep verify and a clean audit.
#[test]
fn kill_storm_over_budgeted_runs_ends_with_the_unbudgeted_manifest() {
    use ftpipe_fixtures::checkpoint::SplitMix64;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let _heavy = heavy();
    let kills: usize = std::env::var("KILLS")
        .ok()
        .map(|k| k.parse().expect("KILLS must be a number"))
        .unwrap_or(100);
    let seed = crash_seed();
    eprintln!("budgeted kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let shapes = [
        ReleaseShape::tiny(),
        ReleaseShape::tiny_nvfp4(),
        ReleaseShape::tiny_spread(),
    ];
    let mut setups = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let files = generate_release_repo(13, shape);
        let (minimum, _) = expected_minimum(&files);
        let hub = hub_serving(files);
        let plain = tmp.path().join(format!("plain-{i}"));
        let t = Instant::now();
        run_ok(&mut run_cmd(
            &hub.endpoint(),
            &plain,
            &budget_args(minimum)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        ));
        let ms = (t.elapsed().as_millis() as u64).max(20);
        let plain2 = tmp.path().join(format!("plain-unbudgeted-{i}"));
        run_ok(&mut run_cmd(
            &hub.endpoint(),
            &plain2,
            crate::chain_crash::ARGS,
        ));
        assert_eq!(manifest_sha(&plain), manifest_sha(&plain2));
        setups.push((hub, minimum, manifest_sha(&plain2), ms));
    }
    let (mut kill, mut chains, mut claims_seen, mut retired_seen) =
        (0usize, 0usize, 0usize, 0usize);
    // Kills that left a shard punched down to its PLE spans.
    let mut punched_seen = 0usize;
    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = tmp.path().join("chain-0");
    while kill < kills {
        let (hub, budget, reference, ms) = &setups[chains % setups.len()];
        let args = budget_args(*budget);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let delay = rng.next_u64() % ms;
        let mut child = run_cmd(&hub.endpoint(), &out, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ftpipe");
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let status = child.wait().expect("wait");
        let label = format!("kill {} after {delay} ms in {}", kill + 1, out.display());
        assert!(
            status.success() || status.code().is_none(),
            "{label}: exited {status}"
        );
        if status.success() {
            crate::chain_crash::check_finished(hub, &out, reference, &label);
            assert_no_shard_left(&out, &label);
            chains += 1;
            out = tmp.path().join(format!("chain-{chains}"));
            continue;
        }
        kill += 1;
        check_after_kill(&out, &label);
        crate::chain_crash::check_components_after_kill(&out, &label);
        check_held(&out, *budget, &label);
        claims_seen += usize::from(
            try_query(&out, "SELECT COUNT(*) FROM component_spans")
                .is_ok_and(|r| r.first().is_some_and(|n| n != "0")),
        );
        retired_seen += usize::from(
            try_query(&out, "SELECT COUNT(*) FROM source_retirements")
                .is_ok_and(|r| r.first().is_some_and(|n| n != "0")),
        );
        punched_seen += usize::from(
            try_query(&out, "SELECT COUNT(*) FROM source_punches WHERE ended = 0")
                .is_ok_and(|r| r.first().is_some_and(|n| n != "0")),
        );
        *landed
            .entry(crate::chain_crash::landed_in(&out))
            .or_default() += 1;
    }
    let (hub, budget, reference, _) = &setups[chains % setups.len()];
    let args = budget_args(*budget);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &args));
    crate::chain_crash::check_finished(hub, &out, reference, "last chain");
    assert_no_shard_left(&out, "last chain");
    eprintln!(
        "budgeted kill storm (seed {seed}): {kills} kills over {} chains; {claims_seen} left span claims, \
         {retired_seen} after a retirement, {punched_seen} with a punched shard; by place: {landed:?}",
        chains + 1
    );
    assert!(
        claims_seen > 0
            && retired_seen > 0
            && (punched_seen > 0 || crate::disk_budget::allocation_unit().is_none())
            && landed.get("fetch").is_some_and(|n| *n > 0),
        "the storm missed the streamed conversion: {landed:?}"
    );
}

/// How a killed budgeted run is resumed.
#[derive(Debug, Clone, Copy)]
enum Resume {
    /// Without `--disk-budget`.
    Unbudgeted,
    /// With the budget it was begun with.
    Same,
    /// With twice that budget.
    Larger,
}

/// A budgeted run killed, then resumed without `--disk-budget`, was
/// wedged: the resume took the path of `convert --retire-sources` and
/// failed with "source … was retired by --retire-sources; re-acquire"
/// (the user never passed it), and afterwards even the original budgeted
/// command failed the same way. A budgeted run's retirements are part of
/// its durable plan now: seeded SIGKILLs (≥ 21 landing after a retirement)
/// over budgeted runs at the minimum, each resumed with no budget, the same
/// one or a larger one in turn, all end with the unbudgeted manifest; a
/// resume without a budget says so and fetches no retired shard again, and
/// the original budgeted command then finds the run finished.
#[test]
fn a_killed_budgeted_run_resumes_with_no_budget_the_same_or_a_larger_one() {
    use ftpipe_fixtures::checkpoint::SplitMix64;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let _heavy = heavy();
    let seed = crash_seed();
    eprintln!("budget resume seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let files = generate_release_repo(17, &ReleaseShape::tiny());
    let (minimum, _) = expected_minimum(&files);
    let hub = hub_serving(files);
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(
        &hub.endpoint(),
        &plain,
        crate::chain_crash::ARGS,
    ));
    let reference = manifest_sha(&plain);
    let budgeted = budget_args(minimum);
    let budgeted: Vec<&str> = budgeted.iter().map(String::as_str).collect();
    let t = Instant::now();
    run_ok(&mut run_cmd(
        &hub.endpoint(),
        &tmp.path().join("timed"),
        &budgeted,
    ));
    let ms = (t.elapsed().as_millis() as u64).max(20);
    let modes = [Resume::Unbudgeted, Resume::Same, Resume::Larger];
    let (mut after_retirement, mut attempts) = (0usize, 0usize);
    // The longest delay drawn; it shrinks whenever a run finishes before
    // its kill (a loaded machine runs the rest of a run faster or slower
    // than the timed run suggests).
    let mut longest = (ms / 2).max(1);
    while after_retirement < 21 {
        attempts += 1;
        assert!(
            attempts < 100,
            "only {after_retirement} kills landed after a retirement"
        );
        let out = tmp.path().join(format!("out-{attempts}"));
        // A seeded delay after the run's first retirement (a run that
        // finished first is not counted).
        let delay = rng.next_u64() % longest;
        let mut child = run_cmd(&hub.endpoint(), &out, &budgeted)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ftpipe");
        let began = Instant::now();
        while child.try_wait().expect("try_wait").is_none()
            && began.elapsed() < Duration::from_secs(60)
            && try_query(&out, "SELECT COUNT(*) FROM source_retirements")
                .map_or(true, |r| r.first().is_none_or(|n| n == "0"))
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let status = child.wait().expect("wait");
        let retired: u64 = try_query(&out, "SELECT COUNT(*) FROM source_retirements")
            .ok()
            .and_then(|r| r.first().and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        if status.success() {
            longest = (longest * 3 / 4).max(1);
        }
        if status.success() || retired == 0 {
            continue;
        }
        let mode = modes[after_retirement % modes.len()];
        after_retirement += 1;
        let label = format!("kill after {delay} ms, {retired} retired, resumed {mode:?}");
        check_after_kill(&out, &label);
        let mut args: Vec<String> = crate::chain_crash::ARGS
            .iter()
            .map(|s| s.to_string())
            .collect();
        match mode {
            Resume::Unbudgeted => {}
            Resume::Same => args.extend(["--disk-budget".into(), minimum.to_string()]),
            Resume::Larger => {
                args.extend(["--disk-budget".into(), (2 * minimum).to_string()]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let retired_before = query(&out, "SELECT DISTINCT path FROM source_retirements");
        let transferred = |path: &str| {
            query(
                &out,
                &format!(
                    "SELECT transferred_bytes FROM ledger WHERE path = {}",
                    sql_str(path)
                ),
            )
        };
        let before: Vec<_> = retired_before.iter().map(|p| transferred(p)).collect();
        let o = run(&mut run_cmd(&hub.endpoint(), &out, &args));
        let err = stderr(&o);
        assert!(o.status.success(), "{label}: {err}");
        crate::chain_crash::check_finished(&hub, &out, &reference, &label);
        // A shard retired before the kill is never downloaded again (its
        // header may be read for the plan, its body is not).
        let refetched: Vec<_> = retired_before
            .iter()
            .zip(&before)
            .filter(|(p, b)| transferred(p) != **b)
            .map(|(p, _)| p)
            .collect();
        assert!(refetched.is_empty(), "{label}: fetched again {refetched:?}");
        let finished_before = String::from_utf8_lossy(&o.stdout).contains("nothing to do");
        if matches!(mode, Resume::Unbudgeted) {
            // Killed after the last stage completed: nothing left to say.
            assert!(
                finished_before || err.contains("without one"),
                "{label}: {err}"
            );
            // The original budgeted command is not wedged.
            let o = run(&mut run_cmd(&hub.endpoint(), &out, &budgeted));
            assert!(o.status.success(), "{label}, then budgeted: {}", stderr(&o));
            crate::chain_crash::check_finished(&hub, &out, &reference, &label);
        }
    }
    eprintln!("budget resume: {after_retirement} kills after a retirement in {attempts} runs");
}

/// A budgeted run reads every shard it admits back at once (the digest of
/// the ranges written ahead, then the conversion) and retires it soon
/// after: it writes them through the page cache, where a run without a
/// budget writes their whole blocks past it (`file_published`'s
/// `direct_io_bytes`).
#[test]
fn a_budgeted_run_writes_through_the_page_cache() {
    let hub = hub_serving(generate_release_repo(5, &ReleaseShape::tiny()));
    let dir = tempfile::tempdir().unwrap();
    if !takes_direct_io(dir.path()) {
        skip_unless_ci("the temporary directory's volume refuses O_DIRECT");
        return;
    }
    let past_cache = |extra: &[&str], name: &str| -> Vec<u64> {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let o = run_ok(&mut run_cmd(&hub.endpoint(), &dir.path().join(name), &args));
        json_events(&o, "file_published")
            .iter()
            .filter(|p| p["path"].as_str().unwrap().ends_with(".safetensors"))
            .map(|p| p["direct_io_bytes"].as_u64().unwrap())
            .collect()
    };
    let free = past_cache(&[], "free");
    assert!(
        free.iter().any(|b| *b > 0),
        "no shard past the cache: {free:?}"
    );
    let budgeted = past_cache(&["--disk-budget", "1TB"], "budgeted");
    assert!(
        !budgeted.is_empty() && budgeted.iter().all(|b| *b == 0),
        "{budgeted:?}"
    );
}
