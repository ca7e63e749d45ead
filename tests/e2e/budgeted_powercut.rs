//! Power cuts during `ftpipe run --disk-budget` (the fetch driving the
//! conversion), on the filesystem that keeps only what was fsynced
//! (`ftpipe_fixtures::powercut`, see the `powercut` module).
//!
//! A budgeted run adds durable steps the unbudgeted one does not take: a
//! source file's spans written into a component's temp file, fsynced, then
//! claimed in `component_spans`; a component finished from its temp file;
//! a shard's retirement logged, then the shard unlinked. Seeded cycles in
//! chains: mount what the previous cut left, run, SIGKILL after a random
//! delay within a calibrated run, cut the power, unmount. After every cut,
//! on the recovered tree:
//! * the state database is intact; every component receipt names a file
//!   with its size and SHA-256; every download receipt names a file with
//!   the hub's bytes, unless the shard was retired (then it may be gone);
//!   every watermark without a receipt is backed by the hub's bytes;
//! * every component with span claims and no receipt has its temp file at
//!   the planned length, each byte either a hole (0) or the reference
//!   artifact's byte at that offset;
//! * the source bytes on disk are within the budget.
//!
//! A chain's first cycle aborts right after a seeded span claim
//! (`FTPIPE_CRASH_AT=span-claimed#N`) and cuts there. It found a bug: a
//! component's temp file was created without fsyncing it or its
//! directory, so after a cut the claim named spans of a file that was
//! gone.
//!
//! The power-cut filesystem refuses `fallocate` hole punching, so a run
//! on it holds converted PLE shards whole (`release`: `whole_files`) and
//! the budget is the whole-file minimum; punched shards are not covered
//! by these cuts (their crash points are, in `budget_spans.rs`).
//!
//! Each chain ends, resumed with the same budget on the normal disk, with
//! the unbudgeted run's manifest, a deep verify and a clean audit; a span
//! claim that outlived its bytes would change a component and so the
//! manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ftpipe_fixtures::checkpoint::{SplitMix64, content_bytes};
use ftpipe_fixtures::powercut::{Model, Mounted};
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};

use crate::budgeted_run::{budget_args, check_held};
use crate::common::*;
use crate::disk_budget::expected_whole_file_minimum;
use crate::powercut::{check_watermarks, fresh_model, rows, state_db_ok};
use crate::s3_powercut::cycle;

/// Cycles at least (whole chains: a multiple of `CHAIN`).
const CUTS: u64 = 16;

/// Cycles per chain of resumptions.
const CHAIN: u64 = 4;

/// What a recovered tree claims, counted over the cuts.
#[derive(Default)]
struct Seen {
    span_claims: usize,
    retired: usize,
    watermarks: usize,
}

/// The latest retirement row of each shard is `retired`.
fn retired(out: &Path) -> Vec<String> {
    rows(
        out,
        "SELECT path FROM source_retirements r WHERE event = 'retired'
         AND id = (SELECT MAX(id) FROM source_retirements WHERE path = r.path)",
        "source_retirements",
    )
    .into_iter()
    .map(|r| r[0].clone())
    .collect()
}

fn check_recovered(
    out: &Path,
    hub_files: &BTreeMap<String, Vec<u8>>,
    reference: &Path,
    budget: u64,
    cut: &str,
    seen: &mut Seen,
) {
    if !state_db_ok(out, cut) {
        return;
    }
    crate::chain_crash::check_components_after_kill(out, cut);
    let gone = retired(out);
    seen.retired += usize::from(!gone.is_empty());
    for r in rows(out, "SELECT path FROM receipts", "receipts") {
        let p = &r[0];
        match std::fs::read(out.join("source").join(p)) {
            Ok(bytes) => assert!(
                bytes == hub_files[p.as_str()],
                "{cut}: {p} differs from the hub's"
            ),
            Err(e) => assert!(
                gone.contains(p),
                "{cut}: download receipt for {p} but its file did not survive ({e})"
            ),
        }
    }
    let receipted = rows(out, "SELECT path FROM receipts", "receipts")
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    seen.watermarks += check_watermarks(out, &out.join("source"), &receipted, hub_files, cut);
    let done: Vec<String> = rows(out, "SELECT path FROM components", "components")
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    for r in rows(
        out,
        "SELECT DISTINCT component FROM component_spans",
        "component_spans",
    ) {
        let c = &r[0];
        if done.contains(c) {
            continue;
        }
        seen.span_claims += 1;
        let want = std::fs::read(reference.join(c)).unwrap();
        let tmp = out.join("artifact").join(format!("{c}.ftpipe-tmp"));
        let Ok(got) = std::fs::read(&tmp) else {
            // Renamed into place, its receipt not committed: the whole
            // component, which the next run finishes from.
            let renamed = std::fs::read(out.join("artifact").join(c)).unwrap_or_else(|e| {
                panic!("{cut}: spans of {c} claimed, neither its temp nor its final file ({e})")
            });
            assert!(
                renamed == want,
                "{cut}: renamed {c} differs from the reference"
            );
            continue;
        };
        assert_eq!(got.len(), want.len(), "{cut}: temp file of {c}");
        let wrong = got.iter().zip(&want).position(|(g, w)| *g != 0 && g != w);
        assert!(
            wrong.is_none(),
            "{cut}: {c} temp file differs from the reference at {wrong:?}"
        );
    }
    check_held(out, budget, cut);
}

/// Mounts `model`, runs `cmd` to its abort at a named crash point, cuts
/// the power into `dump`. `None`: the filesystem cannot be mounted here.
fn abort_and_cut(
    mnt: &Path,
    model: Model,
    dump: &Path,
    make: impl FnOnce(&Path) -> std::process::Command,
    at: &str,
) -> Option<()> {
    std::fs::create_dir_all(mnt).unwrap();
    let mut mounted = match Mounted::mount(mnt, model) {
        Ok(m) => m,
        Err(e) => {
            skip_unless_ci(&format!("cannot mount the power-cut filesystem: {e}"));
            return None;
        }
    };
    let o = run(make(mnt).env("FTPIPE_CRASH_AT", at));
    assert!(
        !o.status.success() && stderr(&o).contains(&format!("FTPIPE_CRASH_AT={at}")),
        "{at} was not reached: {}",
        stderr(&o)
    );
    mounted.cut(dump).expect("dump the durable view");
    drop(mounted);
    Some(())
}

#[test]
fn power_cuts_during_budgeted_runs_lose_nothing_claimed() {
    let _heavy = heavy();
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return;
    }
    let seed = crash_seed();
    eprintln!("budgeted power-cut seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let files = generate_release_repo(17, &ReleaseShape::tiny());
    // The power-cut filesystem refuses to punch holes: PLE shards are
    // held whole there, at the whole-file minimum.
    let budget = expected_whole_file_minimum(&files);
    let hub_files: BTreeMap<String, Vec<u8>> = files
        .iter()
        .map(|f| (f.path.clone(), content_bytes(f).unwrap().to_vec()))
        .collect();
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let reference = manifest_sha(&plain);
    let args = budget_args(budget);
    let run_on = |mnt: &Path| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cmd(&ep, &mnt.join("out"), &args)
    };
    let Some((done, took)) = cycle(
        &tmp.path().join("mnt-calibration"),
        fresh_model(),
        &tmp.path().join("cut-calibration"),
        Duration::from_secs(60),
        run_on,
    ) else {
        return;
    };
    assert!(done, "the calibration run did not finish in 60 s");
    let out = tmp.path().join("cut-calibration/out");
    assert_eq!(
        manifest_sha(&out),
        reference,
        "a finished budgeted run lost its manifest"
    );
    let ms = (took.as_millis() as u64).max(50);
    eprintln!("calibration: a budgeted run on the power-cut filesystem takes {ms} ms");
    let mut seen = Seen::default();
    let mut current: Option<PathBuf> = None;
    let mut mid = 0;
    // CUTS cycles, then (bounded) more whole chains until a seeded cut
    // has landed in the streamed conversion.
    let mut cut = 0;
    while cut < CUTS || (cut < 3 * CUTS && seen.span_claims + seen.retired == 0) || cut % CHAIN != 0
    {
        cut += 1;
        let model = match (&current, cut % CHAIN) {
            (Some(dir), c) if c != 1 => Model::load_dir(dir).unwrap(),
            _ => fresh_model(),
        };
        let delay = Duration::from_millis(rng.next_u64() % ms);
        let dump = tmp.path().join(format!("cut-{cut}"));
        let mnt = tmp.path().join(format!("mnt-{cut}"));
        // A chain's first cycle stops right after a span claim (a seeded
        // one of the first four) and cuts there: the claim must survive
        // with its bytes. The others are killed at a seeded moment.
        let (name, finished) = if cut % CHAIN == 1 {
            let at = format!("span-claimed#{}", 1 + rng.next_u64() % 4);
            abort_and_cut(&mnt, model, &dump, run_on, &at)
                .map(|()| (format!("cut {cut} at {at}"), false))
        } else {
            cycle(&mnt, model, &dump, delay, run_on)
                .map(|(f, _)| (format!("budgeted cut {cut} after {delay:?}"), f))
        }
        .map_or((String::new(), None), |(n, f)| (n, Some(f)));
        let Some(finished) = finished else {
            return;
        };
        let out = dump.join("out");
        let aborted = cut % CHAIN == 1;
        let mut this = Seen::default();
        check_recovered(
            &out,
            &hub_files,
            &plain.join("artifact"),
            budget,
            &name,
            &mut this,
        );
        if finished {
            assert_eq!(manifest_sha(&out), reference, "{name}");
        } else if !aborted {
            mid += 1;
            seen.span_claims += this.span_claims;
            seen.retired += this.retired;
            seen.watermarks += this.watermarks;
        }
        if cut % CHAIN == 0 {
            // The chain resumes on the normal disk, with the same budget.
            let resumed = tmp.path().join(format!("resumed-{cut}"));
            copy_tree(&out, &resumed);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_ok(&mut run_cmd(&ep, &resumed, &args));
            assert_eq!(manifest_sha(&resumed), reference, "{name}: resumed");
            let v = run(ftpipe()
                .arg("verify")
                .arg(resumed.join("artifact"))
                .arg("--deep"));
            assert!(v.status.success(), "{name}: verify --deep: {}", stderr(&v));
            assert_clean_audit(&resumed);
        }
        current = Some(dump);
    }
    eprintln!(
        "{mid} seeded cuts mid-run (besides the aborts after a span claim): {} span claims \
         of unfinished components, {} after a retirement, {} watermarks checked",
        seen.span_claims, seen.retired, seen.watermarks
    );
    assert!(
        mid >= 1 && seen.span_claims + seen.retired >= 1,
        "no seeded cut landed in the streamed conversion"
    );
}
