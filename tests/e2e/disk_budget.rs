//! End-to-end: `ftpipe plan --remote --disk-budget SIZE` on released-layout
//! checkpoints (BF16 and NVFP4; PLE shards one per file among other tensors,
//! and in files of their own). From headers alone it prints the schedule's
//! predicted peak against an unbudgeted run and the minimum feasible budget,
//! which equals the floor computed here from the files' headers (resident
//! files + max(max_k Σ_{j<k} kept_j + size_k, largest other file), a PLE
//! file keeping its header and PLE spans in whole allocation units once
//! converted, PLE files ordered most bytes to punch first); a budget one
//! byte below is
//! refused with exit 1 naming the minimum, after no request but the
//! headers' ranges; SIZE takes exact units (GB = 10^9, GiB = 2^30) and
//! refuses an ambiguous `G`.

use std::path::Path;

use crate::common::*;
use ftpipe_convert::schedule::shown;
use ftpipe_fixtures::RepoFile;
use ftpipe_fixtures::checkpoint::content_bytes;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};
use serde_json::Value;

fn plan_budget(ep: &str, out: &Path, budget: &str, json: bool) -> std::process::Output {
    let mut cmd = ftpipe();
    cmd.args(["plan", REPO, "--remote", "--endpoint", ep, "--out"])
        .arg(out)
        .args(["--disk-budget", budget]);
    if json {
        cmd.arg("--json");
    }
    run(&mut cmd)
}

/// Tensor names in the safetensors file `f`.
fn tensor_names(f: &RepoFile) -> Vec<String> {
    let b = content_bytes(f).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    h.into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect()
}

/// The allocation unit of the volume the tests' directories are on (the
/// unit holes are punched in); `None` when it cannot punch holes (PLE
/// spans are then copied aside).
pub(crate) fn allocation_unit() -> Option<u64> {
    ftpipe_fs::punch::probe(&std::env::temp_dir())
}

/// `(offset, len)` of every PLE tensor (`ngram_embedding`: the n-gram
/// shards and their scales) in the safetensors file `f`, and where its
/// header ends.
pub(crate) fn ple_ranges(f: &RepoFile) -> (Vec<(u64, u64)>, u64) {
    let b = content_bytes(f).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap());
    let h: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n as usize]).unwrap();
    let ranges = h
        .iter()
        .filter(|(k, _)| k.contains("ngram_embedding"))
        .map(|(_, v)| {
            let o = &v["data_offsets"];
            let (a, z) = (o[0].as_u64().unwrap(), o[1].as_u64().unwrap());
            (8 + n + a, z - a)
        })
        .collect();
    (ranges, 8 + n)
}

/// Bytes a PLE file is counted as holding once punched: every allocation
/// unit its header, PLE ranges or last partial unit touch, whole, and one
/// unit for the filesystem's extent records, at most its length.
pub(crate) fn kept_bytes(f: &RepoFile, unit: u64) -> u64 {
    let len = content_len(f);
    let (ranges, header_end) = ple_ranges(f);
    let mut units = std::collections::BTreeSet::new();
    let mut cover = |from: u64, to: u64| {
        for u in from / unit..to.div_ceil(unit) {
            units.insert(u);
        }
    };
    cover(0, header_end);
    for (o, l) in ranges {
        cover(o, o + l);
    }
    cover(len - len % unit, len);
    ((units.len() as u64 + 1) * unit).min(len)
}

/// The whole-file floor (a volume that cannot punch holes): resident
/// files + max(Σ PLE files, largest other file).
pub(crate) fn expected_whole_file_minimum(files: &[RepoFile]) -> u64 {
    let (mut resident, mut ple, mut other) = (0u64, 0u64, 0u64);
    for f in files {
        let len = content_len(f);
        if !f.path.ends_with(".safetensors") {
            resident += len;
        } else if tensor_names(f)
            .iter()
            .any(|t| t.contains("ngram_embedding"))
        {
            ple += len;
        } else {
            other = other.max(len);
        }
    }
    resident + ple.max(other)
}

/// The floor of the module doc, from the files themselves: `(minimum,
/// PLE files)`.
pub(crate) fn expected_minimum(files: &[RepoFile]) -> (u64, Vec<String>) {
    let Some(unit) = allocation_unit() else {
        return expected_copy_aside_minimum(files);
    };
    let (mut resident, mut other) = (0u64, 0u64);
    let mut ple = Vec::new();
    for f in files {
        let len = content_len(f);
        if !f.path.ends_with(".safetensors") {
            resident += len;
        } else if tensor_names(f)
            .iter()
            .any(|t| t.contains("ngram_embedding"))
        {
            ple.push((len, kept_bytes(f, unit), f.path.clone()));
        } else {
            other = other.max(len);
        }
    }
    ple.sort_by_key(|(len, kept, _)| std::cmp::Reverse(len - kept));
    let (mut before, mut peak) = (0u64, 0u64);
    for (len, kept, _) in &ple {
        peak = peak.max(before + len);
        before += kept;
    }
    let mut names: Vec<String> = ple.into_iter().map(|(_, _, p)| p).collect();
    names.sort();
    (resident + peak.max(other), names)
}

/// The floor on a volume that cannot punch holes, from the files
/// themselves: a PLE file's PLE spans are copied aside once it is
/// converted and the file released, so PLE file k holds `size_k +
/// copy_k` until then (its copy beside it) while the ones before it keep
/// their copies; PLE files are ordered largest first. `(minimum, PLE
/// files)`.
pub(crate) fn expected_copy_aside_minimum(files: &[RepoFile]) -> (u64, Vec<String>) {
    let (mut resident, mut other) = (0u64, 0u64);
    let mut ple = Vec::new();
    for f in files {
        let len = content_len(f);
        if !f.path.ends_with(".safetensors") {
            resident += len;
        } else if tensor_names(f)
            .iter()
            .any(|t| t.contains("ngram_embedding"))
        {
            let copy: u64 = ple_ranges(f).0.iter().map(|(_, l)| l).sum();
            ple.push((len, copy, f.path.clone()));
        } else {
            other = other.max(len);
        }
    }
    ple.sort_by_key(|(len, _, _)| std::cmp::Reverse(*len));
    let (mut before, mut peak) = (0u64, 0u64);
    for (len, copy, _) in &ple {
        peak = peak.max(before + len + copy);
        before += copy;
    }
    let mut names: Vec<String> = ple.into_iter().map(|(_, _, p)| p).collect();
    names.sort();
    (resident + peak.max(other), names)
}

fn check_shape(shape: &ReleaseShape) {
    let files = generate_release_repo(7, shape);
    let (minimum, ple_files) = expected_minimum(&files);
    let hub = hub_serving(files.clone());
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");

    let o = plan_budget(&ep, &out, &minimum.to_string(), true);
    assert!(o.status.success(), "plan: {}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let b = &v["disk_budget"];
    assert_eq!(b["budget"], minimum, "{b:#}");
    assert_eq!(b["minimum_budget"], minimum, "{b:#}");
    let sources: u64 = files.iter().map(content_len).sum();
    let artifact = v["total_bytes"].as_u64().unwrap();
    assert_eq!(b["unbudgeted_peak"], sources + artifact, "{b:#}");
    let peak = b["predicted_peak"].as_u64().unwrap();
    assert!(peak < sources + artifact && peak >= artifact, "{b:#}");
    assert!(b["predicted_peak_sources"].as_u64().unwrap() <= minimum);
    assert_eq!(b["ple_files"], ple_files.len());
    // The PLE files come first in the fetch order.
    let order: Vec<&str> = b["fetch_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let mut first: Vec<&str> = order[..ple_files.len()].to_vec();
    first.sort_unstable();
    assert_eq!(first, ple_files);
    eprintln!(
        "{} PLE file(s), minimum {minimum}, peak {peak} vs unbudgeted {} ({:.3})",
        ple_files.len(),
        sources + artifact,
        b["peak_ratio"]
    );

    // The text names the figures.
    let o = plan_budget(&ep, &out, &minimum.to_string(), false);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_names(
        &text,
        &[
            "disk budget",
            &format!(
                "minimum feasible {} ({minimum} bytes), from {}",
                shown(minimum),
                if allocation_unit().is_some() {
                    "spans"
                } else {
                    "whole files"
                }
            ),
            &format!("predicted peak   {} ({peak} bytes)", shown(peak)),
            "peak ratio",
        ],
    );

    // One byte less is refused, naming the minimum, before any body.
    refused_below_minimum(&hub, &files, minimum, || {
        plan_budget(&ep, &out, &(minimum - 1).to_string(), true)
    });
    assert!(!out.join("source").exists(), "plan wrote sources");
}

/// Runs `command` (a budget one byte below `minimum`) and checks it is
/// refused with exit 1 naming the minimum, after only the two header
/// ranges of each shard.
pub(crate) fn refused_below_minimum(
    hub: &ftpipe_fixtures::RunningHub,
    files: &[RepoFile],
    minimum: u64,
    command: impl FnOnce() -> std::process::Output,
) {
    let before: Vec<usize> = shards(files)
        .map(|f| body_gets(hub, &f.path).len())
        .collect();
    let o = command();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &[
            "--disk-budget",
            &format!("minimum feasible budget of {minimum} bytes"),
        ],
    );
    for (f, n) in shards(files).zip(before) {
        let new = &body_gets(hub, &f.path)[n..];
        assert_eq!(new.len(), 2, "{new:?}");
        for r in new {
            assert!(r.body_bytes < content_len(f) / 4, "{r:?}");
        }
    }
}

pub(crate) fn shards(files: &[RepoFile]) -> impl Iterator<Item = &RepoFile> {
    files.iter().filter(|f| f.path.ends_with(".safetensors"))
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

#[test]
fn sizes_take_exact_units_and_refuse_an_ambiguous_one() {
    let hub = hub_serving(generate_release_repo(7, &ReleaseShape::tiny()));
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    for (size, bytes) in [
        ("1GB", 1_000_000_000u64),
        ("1GiB", 1 << 30),
        ("1.5MB", 1_500_000),
    ] {
        let o = plan_budget(&ep, &out, size, true);
        assert!(o.status.success(), "{size}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["disk_budget"]["budget"], bytes, "{size}");
    }
    let o = plan_budget(&ep, &out, "2G", true);
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["ambiguous", "2GB", "2GiB"]);
}
