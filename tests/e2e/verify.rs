//! `ftpipe verify` end to end, on an artifact made by `ftpipe run` and
//! copied to a fresh directory (no database, no sources, no network): a
//! clean copy passes; one flipped byte fails `--deep` naming the component;
//! a deleted, added or resized segment fails; an edited manifest fails the
//! fingerprint check; each with exit 6 and the component named.

use std::path::{Path, PathBuf};

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;

/// A converted artifact, copied away from its output directory.
fn artifact_copy(tmp: &Path) -> PathBuf {
    let hub = qwen4_hub(51, QwenShape::default());
    let out = tmp.join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let copy = tmp.join("shipped");
    copy_tree(&out.join("artifact"), &copy);
    std::fs::remove_dir_all(&out).unwrap(); // no DB, no sources left anywhere
    copy
}

fn verify(dir: &Path, deep: bool) -> (Option<i32>, String) {
    let mut cmd = ftpipe();
    cmd.arg("verify").arg(dir);
    if deep {
        cmd.arg("--deep");
    }
    let o = run(&mut cmd);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &stderr(&o),
    )
}

fn fresh(src: &Path, tmp: &Path, name: &str) -> PathBuf {
    let d = tmp.join(name);
    copy_tree(src, &d);
    d
}

#[test]
fn verify_passes_clean_and_names_every_tampered_component() {
    let tmp = tempfile::tempdir().unwrap();
    let art = artifact_copy(tmp.path());
    let (code, text) = verify(&art, true);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("OK"), "{text}");
    let o = run_ok(ftpipe().arg("verify").arg(&art).arg("--json"));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], true);
    assert_eq!(j["expert_layers"], 3);

    // inspect reads a Q3 segment's geometry from the copied manifest.
    let o = run_ok(
        ftpipe()
            .arg("inspect")
            .arg(art.join("ple/layer_001/shard_0.q3"))
            .arg("--json"),
    );
    let q: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let shape = QwenShape::default();
    assert_eq!(q["format"], "Q3_PLE_32 segment");
    assert_eq!(q["q3"]["rows"], shape.ple_rows[0]);
    assert_eq!(q["q3"]["width"], shape.ple_width);
    assert!(q["q3"]["global_scale"].as_f64().unwrap() > 0.0);

    // One flipped byte: only --deep sees it, and names the component.
    let d = fresh(&art, tmp.path(), "flip");
    let f = d.join("experts/layer_002.ftexpert");
    let mut bytes = std::fs::read(&f).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(&f, bytes).unwrap();
    assert_eq!(verify(&d, false).0, Some(0));
    let (code, text) = verify(&d, true);
    assert_eq!(code, Some(6), "{text}");
    assert!(
        text.contains("experts/layer_002.ftexpert") && text.contains("sha256"),
        "{text}"
    );

    // Segment set: delete, add, resize.
    let d = fresh(&art, tmp.path(), "delete");
    std::fs::remove_file(d.join("ple/layer_001/shard_1.q3")).unwrap();
    let (code, text) = verify(&d, false);
    assert_eq!(code, Some(6), "{text}");
    assert!(text.contains("ple/layer_001/shard_1.q3"), "{text}");

    let d = fresh(&art, tmp.path(), "add");
    std::fs::write(d.join("ple/layer_001/shard_3.q3"), vec![0u8; 14]).unwrap();
    let (code, text) = verify(&d, false);
    assert_eq!(code, Some(6), "{text}");
    assert!(text.contains("shard_3.q3"), "{text}");

    let d = fresh(&art, tmp.path(), "resize");
    let f = d.join("ple/layer_001/shard_0.q3");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes.truncate(bytes.len() - 14);
    std::fs::write(&f, bytes).unwrap();
    let (code, text) = verify(&d, false);
    assert_eq!(code, Some(6), "{text}");
    assert!(
        text.contains("ple/layer_001/shard_0.q3") && text.contains("size"),
        "{text}"
    );

    // Manifest edit: a digest changed → the fingerprint no longer recomputes.
    let d = fresh(&art, tmp.path(), "manifest");
    let m = d.join("manifest.json");
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
    j["components"][0]["sha256"] = "0".repeat(64).into();
    std::fs::write(&m, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
    let (code, text) = verify(&d, false);
    assert_eq!(code, Some(6), "{text}");
    assert!(text.contains("fingerprint"), "{text}");

    // Provenance: schema 1 left `tensors[].sources` out of the fingerprint,
    // so a rewritten source passed `verify --deep` under the same
    // fingerprint. It fails now, and only the fingerprint check fails.
    let d = fresh(&art, tmp.path(), "provenance");
    let m = d.join("manifest.json");
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
    j["tensors"][0]["sources"][0] = "model.planted.weight".into();
    std::fs::write(&m, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
    let (code, text) = verify(&d, true);
    assert_eq!(code, Some(6), "{text}");
    assert!(text.contains("fingerprint"), "{text}");
}
