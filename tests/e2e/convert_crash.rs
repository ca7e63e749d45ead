//! Crash test for conversion: `ftpipe convert` is killed with SIGKILL at
//! seeded random moments (at least 10 per run), resumed, and the outcome is
//! compared with a reference model and with an uninterrupted conversion.
//!
//! The seed is printed; re-run with `FTPIPE_CRASH_SEED=<seed>` to replay the
//! same kill delays (where in the program a kill lands depends on
//! scheduling). Setup: a generated qwen4_exp checkpoint of ~100 MB (NVFP4,
//! per-expert and fused BF16 expert layers, a PLE table in three shards of
//! ~27 MB each), fetched once; one uninterrupted `convert --jobs 2` into a
//! copy calibrates the conversion time T and gives the reference manifest.
//! Each kill waits a seeded random delay in `0..T`.
//!
//! After every kill (no process running), read-only:
//! * `PRAGMA integrity_check` is `ok`;
//! * every component receipt names a file that exists with the receipt's
//!   size and SHA-256 (a receipt is committed only after its file is
//!   durable and renamed), and no receipt made earlier disappeared or
//!   changed.
//!
//! The second test does the same with `--retire-sources` (6 kills): shards
//! disappear as their last reader's receipt lands, and every restart must
//! still finish from the shards left plus the saved headers.
//!
//! At the end one conversion runs to completion:
//! * the manifest is byte-identical to the uninterrupted run's;
//! * no temp file is left in the artifact; the audit is clean;
//! * every component was reported written-and-durable at most once over
//!   all the runs: a restart redoes only components that were in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use ftpipe_fixtures::checkpoint::SplitMix64;
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};

const KILLS: usize = 12;

fn component_receipts(out: &Path) -> BTreeMap<String, (u64, String)> {
    match try_query(
        out,
        "SELECT path || '|' || size || '|' || sha256 FROM components",
    ) {
        Ok(rows) => rows
            .into_iter()
            .map(|r| {
                let mut it = r.splitn(3, '|');
                let p = it.next().unwrap().to_owned();
                let size = it.next().unwrap().parse().unwrap();
                (p, (size, it.next().unwrap().to_owned()))
            })
            .collect(),
        Err(_) => BTreeMap::new(), // killed before the table existed
    }
}

/// Shards retired so far (logged and gone from `source/`).
fn retired_shards(out: &Path) -> usize {
    try_query(
        out,
        "SELECT DISTINCT path FROM source_retirements WHERE event = 'retired'",
    )
    .unwrap_or_default()
    .iter()
    .filter(|p| !out.join("source").join(p).exists())
    .count()
}

fn sha_file(p: &Path) -> String {
    sha256_hex(&std::fs::read(p).unwrap())
}

fn written_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains("written and durable"))
        .filter_map(|l| l.split(':').next().map(str::to_owned))
        .collect()
}

#[test]
fn sigkill_during_conversion_then_resume_gives_the_same_manifest() {
    let _heavy = heavy();
    crash_and_resume(&["--jobs", "2"], KILLS);
}

/// Regression: a conversion killed after `--retire-sources` had deleted a
/// shard could not resume. The restart loaded its saved skeleton without a
/// plan, so every component still to write failed with "source retired",
/// even those whose shards were still on disk. Now the restart plans from
/// the shards present plus the headers saved for retired ones.
#[test]
fn sigkill_during_conversion_with_retirement_then_resume() {
    let _heavy = heavy();
    crash_and_resume(&["--jobs", "2", "--retire-sources"], KILLS / 2);
}

/// Kills `convert EXTRA` `kills` times at seeded moments, then lets it finish.
fn crash_and_resume(extra: &[&str], kills_wanted: usize) {
    let retire = extra.contains(&"--retire-sources");
    let seed = crash_seed();
    eprintln!("crash seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let files = generate_qwen4_repo(seed % 1000, QwenShape::medium());
    let hub = hub_serving(files);
    let tmp = tempfile::tempdir().unwrap();
    let fetched = tmp.path().join("fetched");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &fetched, &[]));
    let reference = tmp.path().join("reference");
    copy_tree(&fetched, &reference);
    let out = tmp.path().join("out");
    copy_tree(&fetched, &out);

    let t0 = Instant::now();
    run_ok(&mut convert_cmd(&reference, &["--jobs", "2"]));
    let t = t0.elapsed();
    let want = manifest_sha(&reference);
    eprintln!("uninterrupted conversion: {t:?}, manifest {want}");
    let window_ms = (t.as_millis() as u64).max(20);

    let components = manifest_json(&reference)["components"]
        .as_array()
        .unwrap()
        .len();
    let mut kills_after_retirement = 0;
    let mut seen: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut written: Vec<String> = Vec::new();
    let (mut kills, mut completed_early) = (0, 0);
    // With retirement, keep killing (bounded) until a kill lands after a
    // shard was retired with work left: the case this test is about.
    while kills < kills_wanted
        || (retire && kills_after_retirement == 0 && kills < 4 * kills_wanted)
    {
        let delay = Duration::from_millis(rng.next_u64() % window_ms);
        let mut child = convert_cmd(&out, extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let finished = child.try_wait().unwrap().is_some();
        let _ = child.kill(); // SIGKILL on unix
        let o = child.wait_with_output().unwrap();
        written.extend(written_lines(&String::from_utf8_lossy(&o.stderr)));
        if finished {
            // Nothing left to kill: start over from the fetched sources.
            completed_early += 1;
            assert!(o.status.success(), "convert failed: {}", stderr(&o));
            assert_eq!(manifest_sha(&out), want);
            std::fs::remove_dir_all(&out).unwrap();
            copy_tree(&fetched, &out);
            seen.clear();
            written.clear();
            continue;
        }
        kills += 1;
        let integrity = query(&out, "PRAGMA integrity_check");
        assert_eq!(integrity, vec!["ok".to_owned()], "kill {kills}");
        let now = component_receipts(&out);
        for (p, (size, sha)) in &now {
            let f = out.join("artifact").join(p);
            let len = std::fs::metadata(&f)
                .unwrap_or_else(|e| panic!("kill {kills}: receipt without file {p}: {e}"))
                .len();
            assert_eq!(len, *size, "kill {kills}: {p}");
            assert_eq!(&sha_file(&f), sha, "kill {kills}: {p}");
        }
        for (p, r) in &seen {
            assert_eq!(
                now.get(p),
                Some(r),
                "kill {kills}: receipt of {p} lost or changed"
            );
        }
        let gone = retired_shards(&out);
        if gone > 0 && now.len() < components {
            kills_after_retirement += 1;
        }
        eprintln!(
            "kill {kills} after {delay:?}: {} component receipts, {gone} shards retired",
            now.len()
        );
        seen = now;
    }
    assert!(
        !retire || kills_after_retirement > 0,
        "no kill landed after a retirement with work left"
    );
    let o = run_ok(&mut convert_cmd(&out, extra));
    written.extend(written_lines(&stderr(&o)));
    if retire {
        let shards: Vec<String> = tree_of(&out.join("source"))
            .into_iter()
            .filter(|p| p.ends_with(".safetensors"))
            .collect();
        assert!(shards.is_empty(), "shards not retired: {shards:?}");
    }
    assert_eq!(manifest_sha(&out), want, "resumed manifest differs");
    let temps: Vec<String> = tree_of(&out.join("artifact"))
        .into_iter()
        .filter(|p| p.ends_with(".ftpipe-tmp"))
        .collect();
    assert!(temps.is_empty(), "temp files left: {temps:?}");
    assert_clean_audit(&out);
    let mut once = BTreeSet::new();
    for w in &written {
        assert!(once.insert(w.clone()), "{w} was written twice: {written:?}");
    }
    eprintln!(
        "{kills} kills ({completed_early} conversions finished before their kill, \
         {kills_after_retirement} landed after a retirement with work left), \
         {} components written once each",
        once.len()
    );
}
