//! Issue 35, item 7: on a volume that cannot punch holes a converted PLE
//! file was held whole until the Q3 table was written, so with the PLE
//! table spread over every file the minimum budget there was every file
//! at once (`release`: `whole_files`). Now its PLE spans are copied aside
//! (`DIR/.ftpipe/kept/<path>`: temp, write, sync, rename, directory sync),
//! the copy is claimed by a row (`source_punches.method` = `copy_aside`,
//! every range's SHA-256 from the verified file), and only then is the
//! file released; the Q3 writer reads the spans from the copy.
//!
//! The volume is the power-cut FUSE filesystem (`ftpipe_fixtures::powercut`),
//! a real filesystem whose `fallocate` refuses `PUNCH_HOLE`: the real probe
//! (`ftpipe_fs::punch::probe`, a scratch file in `DIR`) finds that out, and
//! `plan` says `"release": "copy_aside"` with a minimum below the whole-file
//! one: resident + max(max_k (Σ_{j<k} copy_j + size_k + copy_k), largest
//! other file), computed here from the files' headers. A run at it builds
//! the unbudgeted manifest while a sampler of `source/` plus the copies
//! never sees more than the budget; a kill at each new crash point
//! (`kept-copied`, `copy-logged`, `copy-released`) resumes, with the budget
//! or without one, to that manifest (a copy no row claims is removed; a
//! resumed run without a budget keeps the copies, which the deep audit
//! explains and checks); a changed byte in a copy is refused by digest.

use std::path::{Path, PathBuf};

use ftpipe_fixtures::powercut::Mounted;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};
use serde_json::Value;

use crate::budgeted_run::{Sampler, budget_args, bytes_under};
use crate::common::*;
use crate::disk_budget::{expected_copy_aside_minimum, expected_whole_file_minimum};
use crate::powercut::fresh_model;

fn args_of(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The power-cut filesystem mounted under `tmp` (its `out` directory is
/// where targets go), after checking the real probe finds it cannot punch
/// holes; `None` (after saying why; a failure in CI) when it cannot be
/// mounted.
fn no_punch_volume(tmp: &Path) -> Option<(Mounted, PathBuf)> {
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return None;
    }
    let mnt = tmp.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = match Mounted::mount(&mnt, fresh_model()) {
        Ok(m) => m,
        Err(e) => {
            skip_unless_ci(&format!("cannot mount the power-cut filesystem: {e}"));
            return None;
        }
    };
    let out = mnt.join("out");
    assert_eq!(
        ftpipe_fs::punch::probe(&out),
        None,
        "the power-cut filesystem refuses hole punching"
    );
    Some((mounted, out))
}

/// Source bytes on disk under `out`: `source/` and the copies aside.
fn held_under(out: &Path) -> u64 {
    bytes_under(&out.join("source")) + bytes_under(&out.join(".ftpipe/kept"))
}

fn sampler(out: &Path) -> Sampler {
    Sampler::start_all(vec![out.join("source"), out.join(".ftpipe/kept")])
}

/// Regular files under `dir`, relative.
fn files_in(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(files_in(&e.path()));
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

#[test]
fn on_a_volume_that_cannot_punch_ple_spans_are_copied_aside() {
    let files = generate_release_repo(7, &ReleaseShape::tiny_spread());
    let (minimum, ple_files) = expected_copy_aside_minimum(&files);
    let whole = expected_whole_file_minimum(&files);
    assert_eq!(ple_files.len(), 5, "every file holds a PLE shard");
    eprintln!("copy-aside minimum {minimum}, whole files {whole}");
    assert!(minimum < whole, "{minimum} is no better than whole files");
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let Some((_mounted, root)) = no_punch_volume(tmp.path()) else {
        return;
    };

    let mut cmd = ftpipe();
    cmd.args(["plan", REPO, "--remote", "--endpoint", &ep, "--out"])
        .arg(root.join("planned"))
        .args(["--disk-budget", &minimum.to_string(), "--json"]);
    let o = run(&mut cmd);
    assert!(o.status.success(), "plan: {}", stderr(&o));
    let b = serde_json::from_slice::<Value>(&o.stdout).unwrap()["disk_budget"].clone();
    assert_eq!(b["release"], "copy_aside", "{b:#}");
    assert_eq!(b["minimum_budget"], minimum, "{b:#}");
    assert_eq!(b["allocation_unit"], 0, "{b:#}");

    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let want = manifest_sha(&plain);

    let out = root.join("budgeted");
    let s = sampler(&out);
    let o = run(&mut run_cmd(&ep, &out, &args_of(&budget_args(minimum))));
    let (seen, samples) = s.finish();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(manifest_sha(&out), want);
    assert!(samples > 10 && seen > 0, "{samples} samples, {seen}");
    assert!(
        seen <= minimum,
        "the sampler saw {seen} bytes, budget {minimum}"
    );
    // Every PLE file but the last converted was copied aside, then retired
    // with its copy.
    let rows = query(&out, "SELECT method || ' ' || ended FROM source_punches");
    assert_eq!(rows, vec!["copy_aside 1".to_owned(); 4]);
    assert!(files_in(&out.join(".ftpipe/kept")).is_empty());
    assert_clean_audit(&out);
    eprintln!("budget {minimum}: sampled {seen} in {samples} samples");
}

/// The audit lines of files released after a copy aside.
fn copied_lines(out: &Path) -> Vec<Value> {
    audit_json(out, true)["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["punched_bytes"].as_u64().unwrap_or(0) > 0)
        .cloned()
        .collect()
}

/// A kill right after the copy is durable (no row), right after the row
/// (the file not yet unlinked) and right after the file is released, at
/// the second copy: the resumed run keeps to the budget and ends with the
/// unbudgeted manifest. Resumed without a budget it ends there too,
/// keeping the copies logged before the kill, which the deep audit
/// explains and checks; a copy no row claims is removed.
#[test]
fn every_copy_aside_crash_point_resumes_to_the_reference() {
    let files = generate_release_repo(11, &ReleaseShape::tiny_spread());
    let (minimum, _) = expected_copy_aside_minimum(&files);
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let Some((_mounted, root)) = no_punch_volume(tmp.path()) else {
        return;
    };
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let reference = manifest_sha(&plain);
    let budgeted = budget_args(minimum);
    let budgeted = args_of(&budgeted);
    // Copies logged before the kill at the second hit of each point.
    for (point, logged) in [("kept-copied", 1), ("copy-logged", 2), ("copy-released", 2)] {
        for unbudgeted in [false, true] {
            let at = format!("{point}#2");
            let how = if unbudgeted {
                "without a budget"
            } else {
                "with it"
            };
            let label = format!("{at}, resumed {how}");
            let out = root.join(format!("out-{point}-{unbudgeted}"));
            let o = run(run_cmd(&ep, &out, &budgeted).env("FTPIPE_CRASH_AT", &at));
            assert!(
                !o.status.success() && stderr(&o).contains(&format!("FTPIPE_CRASH_AT={at}")),
                "{at}: the crash point was not reached: {}",
                stderr(&o)
            );
            check_after_kill(&out, &label);
            let held = held_under(&out);
            assert!(
                held <= minimum,
                "{label}: {held} bytes held, budget {minimum}"
            );
            assert_eq!(files_in(&out.join(".ftpipe/kept")).len(), 2, "{label}");
            let s = sampler(&out);
            let resumed = if unbudgeted {
                run(&mut run_cmd(&ep, &out, crate::chain_crash::ARGS))
            } else {
                run(&mut run_cmd(&ep, &out, &budgeted))
            };
            let (seen, _) = s.finish();
            assert!(resumed.status.success(), "{label}: {}", stderr(&resumed));
            crate::chain_crash::check_finished(&hub, &out, &reference, &label);
            let lines = copied_lines(&out);
            if unbudgeted {
                assert_eq!(lines.len(), logged, "{label}: {lines:#?}");
                for l in &lines {
                    let why = l["punched"].as_str().unwrap_or_default();
                    assert!(why.contains("copying") && why.contains("aside"), "{l}");
                    assert_eq!(l["verified"], true, "{l}");
                }
                assert_eq!(files_in(&out.join(".ftpipe/kept")).len(), logged, "{label}");
            } else {
                assert!(seen <= minimum, "{label}: held {seen}, budget {minimum}");
                assert!(lines.is_empty(), "{label}: {lines:?}");
                assert!(files_in(&out.join(".ftpipe/kept")).is_empty(), "{label}");
            }
        }
    }
}

/// A byte of a copy aside changed after the file was released is refused
/// by its digest when the run resumes, naming the file, the range and the
/// copy, before the Q3 table reads it.
#[test]
fn a_changed_copy_aside_is_refused_on_resume() {
    let files = generate_release_repo(19, &ReleaseShape::tiny_spread());
    let (minimum, _) = expected_copy_aside_minimum(&files);
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let Some((_mounted, root)) = no_punch_volume(tmp.path()) else {
        return;
    };
    let out = root.join("out");
    let budgeted = budget_args(minimum);
    let budgeted = args_of(&budgeted);
    let o = run(run_cmd(&ep, &out, &budgeted).env("FTPIPE_CRASH_AT", "copy-released#1"));
    assert!(!o.status.success(), "{}", stderr(&o));
    let row = query(
        &out,
        "SELECT p.path || ' ' || k.offset || ' ' || k.len FROM source_punches p
         JOIN source_kept_ranges k ON k.punch_id = p.id ORDER BY k.offset LIMIT 1",
    );
    let row: Vec<&str> = row[0].split(' ').collect();
    let (path, offset, len) = (row[0], row[1], row[2]);
    assert!(!out.join("source").join(path).exists(), "released");
    let copy = out.join(".ftpipe/kept").join(path);
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[0] ^= 0x40;
    std::fs::write(&copy, &bytes).unwrap();
    let o = run(&mut run_cmd(&ep, &out, &budgeted));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &[
            path,
            &format!("source offset {offset} ({len} bytes, at 0 in the copy)"),
            ".ftpipe/kept",
            "--reacquire",
        ],
    );
    assert!(!out.join("artifact/manifest.json").exists());
}

/// Issue 35, item 7: `run --retire-sources` alone held converted PLE
/// shards whole until the Q3 table was written. On a volume that cannot
/// punch holes it now copies their PLE spans aside and releases them as a
/// budgeted run does: a kill right after the first release is reached
/// (the shard gone, its copy holding exactly its PLE spans), and the
/// resumed run ends with the reference manifest, no shard and no copy
/// left.
#[test]
fn retire_sources_alone_copies_ple_spans_aside() {
    let files = generate_release_repo(29, &ReleaseShape::tiny_spread());
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let Some((_mounted, root)) = no_punch_volume(tmp.path()) else {
        return;
    };
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let reference = manifest_sha(&plain);
    let mut args = crate::chain_crash::ARGS.to_vec();
    args.push("--retire-sources");
    let out = root.join("out");
    let o = run(run_cmd(&ep, &out, &args).env("FTPIPE_CRASH_AT", "copy-released#1"));
    assert!(
        !o.status.success() && stderr(&o).contains("FTPIPE_CRASH_AT=copy-released#1"),
        "--retire-sources did not copy aside: {}",
        stderr(&o)
    );
    let rows = query(&out, "SELECT path || ' ' || kept_bytes FROM source_punches");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (path, kept) = rows[0].split_once(' ').unwrap();
    assert!(!out.join("source").join(path).exists(), "{path} released");
    let copy = std::fs::metadata(out.join(".ftpipe/kept").join(path)).unwrap();
    assert_eq!(copy.len().to_string(), kept);
    let o = run(&mut run_cmd(&ep, &out, &args));
    assert!(o.status.success(), "{}", stderr(&o));
    crate::chain_crash::check_finished(&hub, &out, &reference, "--retire-sources");
    assert!(files_in(&out.join(".ftpipe/kept")).is_empty());
    let shards: Vec<String> = files_in(&out.join("source"))
        .into_iter()
        .filter(|f| f.ends_with(".safetensors"))
        .collect();
    assert!(shards.is_empty(), "{shards:?}");
}
