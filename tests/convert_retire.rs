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

mod common;
use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use ftpipe_fixtures::RunningHub;
use ftpipe_fixtures::qwen4::QwenShape;

fn hub(seed: u64) -> RunningHub {
    qwen4_hub(seed, QwenShape::default())
}

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
    let hub = hub(41);
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
    let hub = hub(42);
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
