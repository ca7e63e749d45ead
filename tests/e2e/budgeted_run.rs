//! End-to-end: `ftpipe run --disk-budget SIZE` on released-layout
//! checkpoints (BF16 and NVFP4; PLE shards one per file among other
//! tensors, and in files of their own). At the minimum feasible budget
//! `plan` reports, and at 1.5× it, the run gives the manifest of an
//! unbudgeted run byte for byte, and a sampler polling `source/` (every
//! regular file, `.part` included) never sees more source bytes than the
//! budget; every shard is deleted at the end and the audit shows the
//! budget and the peak held. A budget one byte below the minimum is
//! refused before any shard body is fetched.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::common::*;
use crate::disk_budget::expected_minimum;
use ftpipe_fixtures::RepoFile;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};

/// Polls a directory's regular files (recursively) and keeps the largest
/// total of their lengths seen, until dropped.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

impl Sampler {
    pub(crate) fn start(dir: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let (s, m, n) = (stop.clone(), max.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                m.fetch_max(bytes_under(&dir), Ordering::SeqCst);
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

fn shards(files: &[RepoFile]) -> impl Iterator<Item = &RepoFile> {
    files.iter().filter(|f| f.path.ends_with(".safetensors"))
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
    let before: Vec<usize> = shards(&files)
        .map(|f| body_gets(&hub, &f.path).len())
        .collect();
    let o = budgeted(&ep, &out, minimum - 1);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &[
            "--disk-budget",
            &format!("minimum feasible budget of {minimum} bytes"),
        ],
    );
    // Only the two header ranges of each shard.
    for (f, n) in shards(&files).zip(before) {
        let new = &body_gets(&hub, &f.path)[n..];
        assert_eq!(new.len(), 2, "{new:?}");
        for r in new {
            assert!(r.body_bytes < content_len(f) / 4, "{r:?}");
        }
    }
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
