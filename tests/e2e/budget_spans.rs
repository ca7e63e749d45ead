//! Issue 35, item 7: the minimum disk budget depended on how the
//! checkpoint was sharded. A file holding part of the PLE table was held
//! whole until the Q3 table was written, so with the table spread over
//! every file (each also holding other tensors) the minimum was every file
//! at once. Now a converted PLE file is punched down to its header and PLE
//! spans (`fallocate` PUNCH_HOLE | KEEP_SIZE), logged first with a digest
//! of every kept range; the minimum is computed from spans.
//!
//! On a BF16 release with a PLE shard in every one of its 5 files: the
//! minimum `plan` reports is at most the PLE tensor bytes plus the two
//! largest files (and below the whole-file minimum); a run at it builds
//! the unbudgeted manifest while a sampler of the bytes `source/` holds on
//! disk never sees more than the budget; a kill at each punch crash point
//! resumes (with the budget, or without one: the punched files then stay,
//! the audit explaining their punched bytes) to the same manifest; a kept
//! range changed after the punch is refused by digest before it is read.

use std::path::Path;

use crate::budgeted_run::{Sampler, budget_args, bytes_under, check_held};
use crate::common::*;
use crate::disk_budget::{expected_minimum, ple_ranges, shards};
use ftpipe_fixtures::RepoFile;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};
use serde_json::Value;

/// `(PLE tensor bytes, the two largest files, resident, Σ files)`.
fn sizes(files: &[RepoFile]) -> (u64, u64, u64, u64) {
    let ple: u64 = shards(files)
        .map(|f| ple_ranges(f).0.iter().map(|(_, l)| l).sum::<u64>())
        .sum();
    let mut lens: Vec<u64> = shards(files).map(content_len).collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let resident: u64 = files
        .iter()
        .filter(|f| !f.path.ends_with(".safetensors"))
        .map(content_len)
        .sum();
    (ple, lens[0] + lens[1], resident, lens.iter().sum())
}

fn args_of(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// False (after saying why; a failure in CI) when the volume of the
/// tests' directories cannot punch holes: nothing here can be checked.
fn can_punch() -> bool {
    if crate::disk_budget::allocation_unit().is_some() {
        return true;
    }
    skip_unless_ci("the volume of the temporary directory cannot punch holes");
    false
}

#[test]
fn a_ple_table_in_every_file_needs_its_spans_not_every_file() {
    if !can_punch() {
        return;
    }
    let files = generate_release_repo(7, &ReleaseShape::tiny_spread());
    let (minimum, ple_files) = expected_minimum(&files);
    assert_eq!(ple_files.len(), 5, "every file holds a PLE shard");
    let (ple, two, resident, all) = sizes(&files);
    eprintln!(
        "minimum {minimum}; PLE tensors {ple} + two largest files {two} + resident {resident}; whole files {}",
        resident + all
    );
    assert!(minimum <= resident + ple + two, "{minimum}");
    assert!(minimum < resident + all, "no better than whole files");
    let hub = hub_serving(files.clone());
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();

    // `plan` says the span-based minimum.
    let mut cmd = ftpipe();
    cmd.args(["plan", REPO, "--remote", "--endpoint", &ep, "--out"])
        .arg(tmp.path().join("planned"))
        .args(["--disk-budget", &minimum.to_string(), "--json"]);
    let o = run(&mut cmd);
    assert!(o.status.success(), "plan: {}", stderr(&o));
    let b = serde_json::from_slice::<Value>(&o.stdout).unwrap()["disk_budget"].clone();
    assert_eq!(b["minimum_budget"], minimum, "{b:#}");
    assert_eq!(b["release"], "spans", "{b:#}");
    assert!(b["predicted_peak_sources"].as_u64().unwrap() <= minimum);

    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let want = manifest_sha(&plain);

    let out = tmp.path().join("budgeted");
    let sampler = Sampler::start(out.join("source"));
    let o = run(&mut run_cmd(&ep, &out, &args_of(&budget_args(minimum))));
    let (seen, samples) = sampler.finish();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(manifest_sha(&out), want);
    assert!(samples > 10 && seen > 0, "{samples} samples, {seen}");
    assert!(
        seen <= minimum,
        "the sampler saw {seen} bytes, budget {minimum}"
    );
    // Every PLE file but the last converted was punched, then retired.
    let punches = query(&out, "SELECT COUNT(*) FROM source_punches");
    let ended = query(&out, "SELECT COUNT(*) FROM source_punches WHERE ended = 1");
    assert_eq!(
        (punches, ended),
        (vec!["4".to_owned()], vec!["4".to_owned()])
    );
    let a = assert_clean_audit(&out);
    let peak = a["disk_budget"]["peak_held"].as_u64().unwrap();
    assert!(peak <= minimum && peak >= seen, "{:#}", a["disk_budget"]);
    eprintln!("budget {minimum}: peak held {peak}, sampled {seen} in {samples} samples");

    let below = tmp.path().join("below");
    crate::disk_budget::refused_below_minimum(&hub, &files, minimum, || {
        run(&mut run_cmd(
            &ep,
            &below,
            &args_of(&budget_args(minimum - 1)),
        ))
    });
}

/// The lines of the audit of `out` for punched files.
fn punched_lines(out: &Path) -> Vec<Value> {
    audit_json(out, true)["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["punched_bytes"].as_u64().unwrap_or(0) > 0)
        .cloned()
        .collect()
}

/// A kill right after a punch is logged (holes not punched) and right
/// after the holes are punched, at the first and a later punch: the
/// resumed run keeps to the budget and ends with the unbudgeted manifest.
/// Resumed without a budget it ends there too, keeping the punched files,
/// whose punched bytes the deep audit explains.
#[test]
fn every_punch_crash_point_resumes_to_the_reference() {
    if !can_punch() {
        return;
    }
    let files = generate_release_repo(11, &ReleaseShape::tiny_spread());
    let (minimum, _) = expected_minimum(&files);
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let reference = manifest_sha(&plain);
    let budgeted = budget_args(minimum);
    let budgeted = args_of(&budgeted);
    for point in ["punch-logged", "punch-done"] {
        for hit in [1usize, 3] {
            for unbudgeted in [false, true] {
                let at = format!("{point}#{hit}");
                let label = format!(
                    "{at}, resumed {}",
                    if unbudgeted {
                        "without a budget"
                    } else {
                        "with it"
                    }
                );
                let out = tmp.path().join(format!("out-{point}-{hit}-{unbudgeted}"));
                let o = run(run_cmd(&ep, &out, &budgeted).env("FTPIPE_CRASH_AT", &at));
                assert!(
                    !o.status.success() && stderr(&o).contains(&format!("FTPIPE_CRASH_AT={at}")),
                    "{at}: the crash point was not reached: {}",
                    stderr(&o)
                );
                check_after_kill(&out, &label);
                crate::chain_crash::check_components_after_kill(&out, &label);
                if point == "punch-done" {
                    check_held(&out, minimum, &label);
                }
                let sampler = Sampler::start(out.join("source"));
                let resumed = if unbudgeted {
                    run(&mut run_cmd(&ep, &out, crate::chain_crash::ARGS))
                } else {
                    run(&mut run_cmd(&ep, &out, &budgeted))
                };
                let (seen, _) = sampler.finish();
                assert!(resumed.status.success(), "{label}: {}", stderr(&resumed));
                if !unbudgeted {
                    assert!(seen <= minimum, "{label}: held {seen}, budget {minimum}");
                }
                crate::chain_crash::check_finished(&hub, &out, &reference, &label);
                let lines = punched_lines(&out);
                if unbudgeted {
                    // Punched before the kill, kept since: explained.
                    assert_eq!(lines.len(), hit, "{label}: {lines:?}");
                    for l in &lines {
                        let why = l["punched"].as_str().unwrap_or_default();
                        assert!(why.contains("--disk-budget") && why.contains("PLE"), "{l}");
                    }
                } else {
                    assert!(lines.is_empty(), "{label}: {lines:?}");
                    assert_eq!(bytes_under(&out.join("source")), resident_on_disk(&out));
                }
            }
        }
    }
}

/// Bytes of the files in `DIR/source` that are not shards.
fn resident_on_disk(out: &Path) -> u64 {
    std::fs::read_dir(out.join("source"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// A kept range changed after the punch (a byte of a PLE span flipped on
/// disk) is refused by its digest when the run resumes, naming the file
/// and the range, before the Q3 table reads it.
#[test]
fn a_changed_kept_range_is_refused_on_resume() {
    if !can_punch() {
        return;
    }
    let files = generate_release_repo(19, &ReleaseShape::tiny_spread());
    let (minimum, _) = expected_minimum(&files);
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let budgeted = budget_args(minimum);
    let budgeted = args_of(&budgeted);
    let o = run(run_cmd(&ep, &out, &budgeted).env("FTPIPE_CRASH_AT", "punch-done#2"));
    assert!(!o.status.success(), "{}", stderr(&o));
    let row = query(
        &out,
        "SELECT p.path || ' ' || k.offset || ' ' || k.len FROM source_punches p
         JOIN source_kept_ranges k ON k.punch_id = p.id ORDER BY p.id, k.len DESC LIMIT 1",
    );
    let row: Vec<&str> = row[0].split(' ').collect();
    let (path, offset, len): (&str, u64, u64) =
        (row[0], row[1].parse().unwrap(), row[2].parse().unwrap());
    let file = out.join("source").join(path);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = usize::try_from(offset + len / 2).unwrap();
    bytes[at] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let o = run(&mut run_cmd(&ep, &out, &budgeted));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &[
            path,
            &format!("offset {offset} ({len} bytes)"),
            "--reacquire",
        ],
    );
    assert!(!out.join("artifact/manifest.json").exists());
}

/// Found by the kill storm: a run killed while retiring the PLE shards
/// after the Q3 table was written, with a punched shard still on disk and
/// every other shard gone, resumed without converting anything (a punched
/// shard is handed over, not converted again) and so never retired it:
/// the run finished with the shard left in `source/`. A kill at every
/// retirement of the spread layout now resumes to the reference with no
/// shard left.
#[test]
fn a_kill_while_retiring_punched_shards_resumes_and_retires_them() {
    if !can_punch() {
        return;
    }
    let files = generate_release_repo(23, &ReleaseShape::tiny_spread());
    let (minimum, _) = expected_minimum(&files);
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let reference = manifest_sha(&plain);
    let budgeted = budget_args(minimum);
    let budgeted = args_of(&budgeted);
    for hit in 1..=5 {
        let at = format!("retirement-logged#{hit}");
        let out = tmp.path().join(format!("out-{hit}"));
        let o = run(run_cmd(&ep, &out, &budgeted).env("FTPIPE_CRASH_AT", &at));
        assert!(!o.status.success(), "{at}: {}", stderr(&o));
        let o = run(&mut run_cmd(&ep, &out, &budgeted));
        assert!(o.status.success(), "{at}: {}", stderr(&o));
        crate::chain_crash::check_finished(&hub, &out, &reference, &at);
        assert_eq!(
            bytes_under(&out.join("source")),
            resident_on_disk(&out),
            "{at}: a shard was left in source/"
        );
    }
}

/// Issue 35, item 7: PLE spans were held by punching only under
/// `--disk-budget`; `run --retire-sources` alone kept every converted PLE
/// shard whole until the Q3 table was written. Now it punches too: a kill
/// right after the first punch is reached, the punched shard holds fewer
/// bytes than its length, and the resumed run ends with the reference
/// manifest and no shard left.
#[test]
fn retire_sources_alone_punches_ple_shards() {
    if !can_punch() {
        return;
    }
    let files = generate_release_repo(29, &ReleaseShape::tiny_spread());
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    run_ok(&mut run_cmd(&ep, &plain, crate::chain_crash::ARGS));
    let reference = manifest_sha(&plain);
    let mut args = crate::chain_crash::ARGS.to_vec();
    args.push("--retire-sources");
    let out = tmp.path().join("out");
    let o = run(run_cmd(&ep, &out, &args).env("FTPIPE_CRASH_AT", "punch-done#1"));
    assert!(
        !o.status.success() && stderr(&o).contains("FTPIPE_CRASH_AT=punch-done#1"),
        "--retire-sources did not punch: {}",
        stderr(&o)
    );
    let punched = query(&out, "SELECT path FROM source_punches");
    assert_eq!(punched.len(), 1, "{punched:?}");
    let m = std::fs::metadata(out.join("source").join(&punched[0])).unwrap();
    let held = crate::budgeted_run::held_len(&m);
    assert!(
        held < m.len(),
        "{}: holds {held} of {}",
        punched[0],
        m.len()
    );
    let o = run(&mut run_cmd(&ep, &out, &args));
    assert!(o.status.success(), "{}", stderr(&o));
    crate::chain_crash::check_finished(&hub, &out, &reference, "--retire-sources");
    assert_eq!(bytes_under(&out.join("source")), resident_on_disk(&out));
}

/// Issue 35, item 7: the hole-punching probe writes a scratch file
/// `.ftpipe-punch-probe-PID-N` in `DIR`; a process killed during the probe
/// left it there for good. The next probe removes it (its process is
/// gone), and keeps one whose process still runs.
#[test]
fn a_probe_file_left_by_a_kill_is_removed_by_the_next_probe() {
    let files = generate_release_repo(31, &ReleaseShape::tiny_spread());
    let hub = hub_serving(files);
    let ep = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let probes = |out: &Path| -> Vec<String> {
        std::fs::read_dir(out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".ftpipe-punch-probe-"))
            .collect()
    };
    let plan = || {
        let mut cmd = ftpipe();
        cmd.args(["plan", REPO, "--remote", "--endpoint", &ep, "--out"])
            .arg(&out)
            .args(["--disk-budget", "1TB", "--json"]);
        cmd
    };
    let o = run(plan().env("FTPIPE_CRASH_AT", "punch-probing"));
    assert!(
        !o.status.success() && stderr(&o).contains("FTPIPE_CRASH_AT=punch-probing"),
        "{}",
        stderr(&o)
    );
    let left = probes(&out);
    assert_eq!(left.len(), 1, "the kill left the scratch file: {left:?}");
    // One of a process that still runs (this test) is not touched.
    let live = format!(".ftpipe-punch-probe-{}", std::process::id());
    std::fs::write(out.join(&live), b"x").unwrap();
    let o = run(&mut plan());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(probes(&out), vec![live]);
}
