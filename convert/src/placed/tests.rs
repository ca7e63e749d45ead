//! A component written span by span, its source files arriving in any
//! order, is byte for byte the component the streaming writer gives (same
//! size and SHA-256), for the released layouts (BF16 and NVFP4, PLE shards
//! among other tensors or in files of their own) and seeded arrival orders;
//! finishing before every span is in is refused naming a missing file.

use std::collections::BTreeMap;

use super::*;
use crate::plan::tests::plan_local;
use crate::write::write_component;
use ftpipe_fixtures::checkpoint::write_repo_to_dir;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};

/// A seeded shuffle (xorshift), so a failure names its order.
fn shuffled<T>(mut v: Vec<T>, mut seed: u64) -> Vec<T> {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    v
}

fn check(shape: &ReleaseShape) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("source");
    write_repo_to_dir(&generate_release_repo(3, shape), &src).unwrap();
    let plan = plan_local(&src).unwrap();
    let sources = Sources::new(&src);
    let streamed = tmp.path().join("streamed");
    let mut want = BTreeMap::new();
    for c in &plan.components {
        if placement(c).unwrap().is_some() {
            want.insert(
                c.name.clone(),
                write_component(&sources, &streamed, c, &BTreeMap::new()).unwrap(),
            );
        }
    }
    assert!(want.len() >= 2, "FTW and sidecars: {want:?}");
    let files: Vec<String> = plan.sources.iter().map(|s| s.file.clone()).collect();
    for seed in [1u64, 7, 42, 1234] {
        let out = tmp.path().join(format!("placed-{seed}"));
        let mut writers: Vec<SpanWriter<'_>> = plan
            .components
            .iter()
            .filter(|c| want.contains_key(&c.name))
            .map(|c| SpanWriter::create(&out, c).unwrap())
            .collect();
        for f in shuffled(files.clone(), seed) {
            for w in &mut writers {
                w.write_file(&sources, &f).unwrap();
            }
        }
        for w in writers {
            let name = w.component.name.clone();
            let got = w.finish(&out).unwrap();
            assert_eq!(got, want[&name], "{name}, order seed {seed}");
            assert_eq!(
                std::fs::read(out.join(&name)).unwrap(),
                std::fs::read(streamed.join(&name)).unwrap(),
                "{name}"
            );
        }
    }
}

#[test]
fn bf16_release_in_any_order_is_byte_identical() {
    check(&ReleaseShape::tiny());
}

#[test]
fn nvfp4_export_in_any_order_is_byte_identical() {
    check(&ReleaseShape::tiny_nvfp4());
}

#[test]
fn ple_only_files_in_any_order_are_byte_identical() {
    check(&ReleaseShape {
        ple_own_files: true,
        ..ReleaseShape::tiny_nvfp4()
    });
}

#[test]
fn finishing_early_names_a_missing_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("source");
    write_repo_to_dir(&generate_release_repo(3, &ReleaseShape::tiny()), &src).unwrap();
    let plan = plan_local(&src).unwrap();
    let ftw = plan
        .components
        .iter()
        .find(|c| c.name == "model.ftw")
        .unwrap();
    let out = tmp.path().join("out");
    let mut w = SpanWriter::create(&out, ftw).unwrap();
    let first = plan.sources[0].file.clone();
    assert!(w.write_file(&Sources::new(&src), &first).unwrap() > 0);
    assert!(!w.is_complete());
    let missing: Vec<String> = w.missing_files().iter().map(|s| s.to_string()).collect();
    assert!(!missing.contains(&first));
    let err = w.finish(&out).unwrap_err().to_string();
    assert!(err.contains(&missing[0]), "{err}");
    assert!(!out.join("model.ftw").exists());
}
