//! Regressions of `--retire-sources` (review of issue 4):
//!
//! * After some shards were retired, a conversion that had components left
//!   to write refused all of them with "source retired" (and could name a
//!   shard the component does not read), though most of their shards were
//!   still on disk. Now it converts every component whose shards are
//!   present and names, for the first one it cannot, the retired shard it
//!   reads.
//! * A shard was retired once its readers had receipts whose files had the
//!   right size, without hashing them: a component corrupted in place (same
//!   size) would have lost its last source. Now reused components reading a
//!   shard still on disk are hashed first, and rewritten if they differ.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;

/// Component → the shards it reads, from the saved skeleton.
fn readers(out: &Path) -> BTreeMap<String, Vec<String>> {
    let skel: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(".ftpipe/convert.json")).unwrap()).unwrap();
    serde_json::from_value(skel["readers"].clone()).unwrap()
}

fn receipt_count(out: &Path, component: &str) -> usize {
    query(
        out,
        &format!(
            "SELECT COUNT(*) FROM components WHERE path = {}",
            sql_str(component)
        ),
    )[0]
    .parse()
    .unwrap()
}

#[test]
fn after_partial_retirement_readable_components_are_rebuilt_and_the_rest_named() {
    let hub = qwen4_hub(41, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    run_ok(&mut run_cmd(&hub.endpoint(), &reference, &[]));
    let want = manifest_sha(&reference);
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    let readers = readers(&out);

    // Shard A comes back (a logged retirement whose unlink did not happen
    // looks the same); shard B stays retired.
    let (x, a) = readers
        .iter()
        .find(|(_, files)| files.len() == 1)
        .map(|(c, files)| (c.clone(), files[0].clone()))
        .expect("a component reading one shard");
    let (y, b) = readers
        .iter()
        .find(|(_, files)| !files.contains(&a))
        .map(|(c, files)| (c.clone(), files[0].clone()))
        .expect("a component not reading shard A");
    std::fs::copy(
        reference.join("source").join(&a),
        out.join("source").join(&a),
    )
    .unwrap();
    std::fs::remove_file(out.join("artifact").join(&x)).unwrap();
    std::fs::remove_file(out.join("artifact").join(&y)).unwrap();

    let o = run(&mut convert_cmd(&out, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("component {y} ")) && err.contains(&b) && err.contains("re-acquire"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // X, whose shard is present, was rebuilt with the reference's bytes.
    assert_eq!(
        std::fs::read(out.join("artifact").join(&x)).unwrap(),
        std::fs::read(reference.join("artifact").join(&x)).unwrap(),
        "{x} not rebuilt"
    );
    assert_eq!(receipt_count(&out, &x), 1);

    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--reacquire"]));
    assert_eq!(manifest_sha(&out), want);
    assert_clean_audit(&out);
}

#[test]
fn a_component_corrupted_in_place_is_rewritten_before_its_shard_is_retired() {
    let hub = qwen4_hub(42, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let want = manifest_sha(&out);
    let victim = out.join("artifact/experts/layer_001.ftexpert");
    let good = std::fs::read(&victim).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    std::fs::write(&victim, &bad).unwrap();

    let o = run_ok(&mut convert_cmd(&out, &["--retire-sources"]));
    let err = stderr(&o);
    assert!(
        err.contains("experts/layer_001.ftexpert does not match its receipt"),
        "{err}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), good, "not rewritten");
    assert_eq!(manifest_sha(&out), want);
    let left: Vec<String> = tree_of(&out.join("source"))
        .into_iter()
        .filter(|p| p.ends_with(".safetensors"))
        .collect();
    assert!(left.is_empty(), "shards not retired: {left:?}");
    let v = run(ftpipe()
        .arg("verify")
        .arg(out.join("artifact"))
        .arg("--deep"));
    assert_eq!(v.status.code(), Some(0), "{}", stderr(&v));
}

/// After retirement, a rebuild (another converter variant) would need the
/// retired shards for every component. It used to set the good artifact
/// aside, drop every receipt and then fail: nothing could be converted
/// any more, not even with the old options. Now it refuses first and
/// leaves the artifact as it is.
#[test]
fn a_rebuild_that_needs_retired_shards_is_refused_and_changes_nothing() {
    let hub = qwen4_hub(43, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    let want = manifest_sha(&out);
    let before = tree_of(&out.join("artifact"));
    for extra in [
        &["--protect", "lm_head.weight"][..],
        &["--protect", "lm_head.weight", "--rebuild"],
    ] {
        let o = run(&mut convert_cmd(&out, extra));
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("cannot be rebuilt here") && err.contains("re-acquire"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(tree_of(&out.join("artifact")), before);
    assert!(!out.join("artifact.stale-run2").exists());
    // The old options still work: nothing to write, same manifest.
    let o = run_ok(&mut convert_cmd(&out, &[]));
    assert!(
        stderr(&o).contains("0 written")
            || String::from_utf8_lossy(&o.stdout).contains("0 written")
    );
    assert_eq!(manifest_sha(&out), want);
}

/// A Q3 segment is encoded under its table's global scale, which reads
/// every PLE shard. With the scale lost after its shards were retired, a
/// segment whose own shard is present used to be attempted and fail on the
/// missing scale, stopping the other components and naming no shard. Now
/// it waits with the scale, and the error names the scale and a retired
/// shard it reads.
#[test]
fn a_segment_whose_scale_needs_a_retired_shard_waits_with_it() {
    let hub = qwen4_hub(44, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    run_ok(&mut run_cmd(&hub.endpoint(), &reference, &[]));
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    let readers = readers(&out);
    // A segment of a table whose scale reads several shards.
    let (segment, shard, scale) = readers
        .iter()
        .filter(|(c, _)| c.starts_with("ple/") && c.ends_with(".q3"))
        .map(|(c, files)| {
            let dir = &c[..c.rfind('/').unwrap()];
            (
                c.clone(),
                files[0].clone(),
                format!("{dir}/global_scale.bf16"),
            )
        })
        .find(|(_, _, scale)| readers[scale].len() > 1)
        .expect("a segment whose scale reads several shards");
    std::fs::copy(
        reference.join("source").join(&shard),
        out.join("source").join(&shard),
    )
    .unwrap();
    std::fs::remove_file(out.join("artifact").join(&scale)).unwrap();
    std::fs::remove_file(out.join("artifact").join(&segment)).unwrap();

    let o = run(&mut convert_cmd(&out, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("component {scale} ")) && err.contains("re-acquire"),
        "{err}"
    );
    assert!(!err.contains("global scale"), "{err}");
    assert!(!out.join("artifact").join(&segment).exists());
}

/// A run killed between logging a retirement and unlinking the shard is
/// finished by the next run, without a second row. And a logged shard
/// found on disk after a finished run (put back by hand) made `run
/// --retire-sources` say "nothing to do" (it went by the log), leaving the
/// shard for good; now it keeps `run` from being a no-op and is unlinked.
#[test]
fn a_retirement_killed_before_its_unlink_is_finished_by_run() {
    let hub = qwen4_hub(45, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(run_cmd(&hub.endpoint(), &out, &["--retire-sources"])
        .env("FTPIPE_CRASH_AT", "retirement-logged"));
    assert!(!o.status.success());
    let logged = query(
        &out,
        "SELECT path FROM source_retirements WHERE event = 'retired'",
    );
    assert_eq!(logged.len(), 1, "{logged:?}");
    let shard = out.join("source").join(&logged[0]);
    assert!(shard.exists());
    // The skeleton, with the retired shard's header, was durable before
    // the retirement was logged (a run without a budget saves it beside
    // its first transfers, before the converter opens).
    let skeleton: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(".ftpipe").join("convert.json")).unwrap())
            .unwrap();
    assert!(
        skeleton["headers"].get(&logged[0]).is_some(),
        "the skeleton does not hold {}'s header",
        logged[0]
    );
    let kept = tmp.path().join("kept.safetensors");
    std::fs::copy(&shard, &kept).unwrap();

    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
    let left: Vec<String> = tree_of(&out.join("source"))
        .into_iter()
        .filter(|p| p.ends_with(".safetensors"))
        .collect();
    assert!(left.is_empty(), "shards left: {left:?}");
    let rows = query(
        &out,
        &format!(
            "SELECT COUNT(*) FROM source_retirements WHERE path = {}",
            sql_str(&logged[0])
        ),
    );
    assert_eq!(rows, ["1"], "retirement logged twice");
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
    assert_clean_audit(&out);

    std::fs::copy(&kept, &shard).unwrap();
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
    assert!(!shard.exists(), "put-back shard not retired");
    let (rows, shards) = (
        query(&out, "SELECT COUNT(*) FROM source_retirements"),
        query(&out, "SELECT COUNT(DISTINCT path) FROM source_retirements"),
    );
    assert_eq!(rows, shards, "a retirement logged twice");
}
