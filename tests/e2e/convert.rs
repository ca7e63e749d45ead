//! End-to-end conversion: `ftpipe run` on a generated qwen4_exp checkpoint
//! (NVFP4, per-expert BF16 and fused BF16 expert layers, a PLE table in
//! several shards, several safetensors files plus the index), then the
//! artifact read back with the `formats` readers and compared tensor by
//! tensor with the source: exact for pass-through, within the documented
//! bound for Q3. Re-running is a no-op, and two independent runs write the
//! same manifest.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;
use ftpipe_formats::{ExpertView, FtwView, Q3GlobalScale, q3};
use half::bf16;

/// Source bytes of a linear `module`: BF16 weight, or NVFP4 triplet.
fn linear_bytes(src: &BTreeMap<String, Vec<u8>>, module: &str) -> Option<Vec<u8>> {
    if src.contains_key(&format!("{module}.weight_scale")) {
        let mut v = Vec::new();
        for p in ["weight", "weight_scale", "weight_scale_2"] {
            v.extend_from_slice(&src[&format!("{module}.{p}")]);
        }
        return Some(v);
    }
    src.get(&format!("{module}.weight")).cloned()
}

fn check_readback(out: &Path, shape: &QwenShape) {
    let src = source_tensors(out);
    let art = out.join("artifact");

    // FTW: every tensor equals its source bytes (NVFP4 as the triplet).
    let ftw = std::fs::read(art.join("model.ftw")).unwrap();
    let view = FtwView::new(&ftw).unwrap();
    let mut n = 0;
    for t in view.tensors() {
        let key = t.entry.key();
        let module = key.strip_suffix(".weight").unwrap_or(key);
        let want = src
            .get(key)
            .cloned()
            .filter(|_| !src.contains_key(&format!("{module}.weight_scale")))
            .or_else(|| linear_bytes(&src, module))
            .unwrap_or_else(|| panic!("FTW tensor {key} has no source"));
        assert_eq!(
            t.data,
            &want[..],
            "FTW tensor {key} differs from its source"
        );
        n += 1;
    }
    assert!(n > 10, "only {n} FTW tensors");

    // Experts: each field of each expert equals its source slice.
    let (e_n, i, h) = (shape.experts, shape.moe_intermediate, shape.hidden);
    for l in 0..shape.layers {
        let bytes = std::fs::read(art.join(format!("experts/layer_{l:03}.ftexpert"))).unwrap();
        let v = ExpertView::new(&bytes).unwrap();
        assert_eq!(u64::from(v.layout().expert_count()), e_n);
        let p = format!("model.layers.{l}.mlp.experts");
        let fused = src.get(&format!("{p}.gate_up_proj"));
        for e in 0..e_n {
            let rec = v.expert(e as u32).unwrap();
            for f in ["gate_proj", "up_proj", "down_proj"] {
                let want = match fused {
                    Some(gu) => {
                        let half = (i * h * 2) as usize;
                        let e = e as usize;
                        match f {
                            "gate_proj" => gu[e * 2 * half..e * 2 * half + half].to_vec(),
                            "up_proj" => gu[e * 2 * half + half..(e + 1) * 2 * half].to_vec(),
                            _ => src[&format!("{p}.down_proj")][e * half..(e + 1) * half].to_vec(),
                        }
                    }
                    None => linear_bytes(&src, &format!("{p}.{e}.{f}")).unwrap(),
                };
                assert_eq!(rec.field(f).unwrap(), &want[..], "layer {l} expert {e} {f}");
            }
        }
    }

    // PLE: every segment decodes within the documented bound.
    for &l in &shape.ple_layers {
        let dir = art.join(format!("ple/layer_{l:03}"));
        let g = Q3GlobalScale::from_bytes(&std::fs::read(dir.join("global_scale.bf16")).unwrap())
            .unwrap();
        let mut amax = 0f32;
        for (s, _) in shape.ple_rows.iter().enumerate() {
            let name =
                format!("model.layers.{l}.ple.ple_embedding.ngram_embedding.shard_{s}.weight");
            let x: Vec<f32> = src[&name]
                .chunks_exact(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect();
            amax = x.iter().fold(amax, |m, v| m.max(v.abs()));
            let blocks = std::fs::read(dir.join(format!("shard_{s}.q3"))).unwrap();
            let mut dec = vec![0f32; x.len()];
            q3::decode(&blocks, g, &mut dec).unwrap();
            for (b, (xs, ds)) in x.chunks(32).zip(dec.chunks(32)).enumerate() {
                let sb = u16::from_le_bytes([blocks[b * 14], blocks[b * 14 + 1]]);
                let bound = q3::error_bound(sb, g);
                for (a, d) in xs.iter().zip(ds) {
                    assert!(
                        (a - d).abs() <= bound,
                        "layer {l} shard {s} block {b}: {a} vs {d} > {bound}"
                    );
                }
            }
        }
        assert_eq!(
            g,
            Q3GlobalScale::from_absmax(amax).unwrap(),
            "global scale of layer {l}"
        );
    }
}

#[test]
fn run_converts_and_the_artifact_reads_back_equal_to_the_source() {
    let shape = QwenShape::default();
    let hub = qwen4_hub(21, shape.clone());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--jobs", "2"]));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("manifest sha256  {}", manifest_sha(&out))),
        "{text}"
    );
    check_readback(&out, &shape);

    // Predicted == actual for every component; the manifest's sizes are the files'.
    let m = manifest_json(&out);
    for c in m["components"].as_array().unwrap() {
        let p = c["path"].as_str().unwrap();
        let len = std::fs::metadata(out.join("artifact").join(p))
            .unwrap()
            .len();
        assert_eq!(c["size"], len, "{p}");
        assert_eq!(c["predicted_bytes"], len, "{p}");
    }
    // Only components, manifest and placement in the artifact dir.
    let listed: Vec<String> = tree_of(&out.join("artifact"))
        .into_iter()
        .filter(|p| out.join("artifact").join(p).is_file())
        .collect();
    assert_eq!(
        listed.len(),
        m["components"].as_array().unwrap().len() + 2,
        "{listed:?}"
    );
    assert_clean_audit(&out);
}

#[test]
fn rerun_is_a_noop_that_says_so_and_makes_no_request() {
    let shape = QwenShape::default();
    let hub = qwen4_hub(22, shape.clone());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let sha = manifest_sha(&out);
    let mtime = std::fs::metadata(out.join("artifact/model.ftw"))
        .unwrap()
        .modified()
        .unwrap();
    hub.clear_requests();
    let t0 = std::time::Instant::now();
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("nothing to do"), "{text}");
    eprintln!("no-op rerun took {took:?}");
    assert!(
        hub.requests().is_empty(),
        "a no-op rerun made requests: {:?}",
        hub.requests()
    );
    assert_eq!(manifest_sha(&out), sha);
    assert_eq!(
        std::fs::metadata(out.join("artifact/model.ftw"))
            .unwrap()
            .modified()
            .unwrap(),
        mtime
    );
    // Different placement options are not a no-op, and do not change the fingerprint.
    let fp = manifest_json(&out)["fingerprint"].clone();
    let o = run_ok(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--ram-budget", "1GiB", "--reserve", "1MiB"],
    ));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
    let placement: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("artifact/placement.json")).unwrap())
            .unwrap();
    assert_eq!(placement["ram_budget"], 1u64 << 30);
    assert_eq!(
        placement["resident_layers"].as_array().unwrap().len() as u64,
        shape.layers
    );
    assert_eq!(manifest_json(&out)["fingerprint"], fp);
    assert_eq!(manifest_sha(&out), sha);
    // A placement made for another fingerprint is not current: no no-op,
    // and the placement is written again for this manifest.
    let mut stale = placement.clone();
    stale["fingerprint"] = serde_json::json!("0".repeat(64));
    std::fs::write(
        out.join("artifact/placement.json"),
        serde_json::to_vec_pretty(&stale).unwrap(),
    )
    .unwrap();
    let budget = ["--ram-budget", "1GiB", "--reserve", "1MiB"];
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &budget));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
    let again: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("artifact/placement.json")).unwrap())
            .unwrap();
    assert_eq!(again, placement);
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &budget));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
}

#[test]
fn two_independent_runs_write_byte_identical_manifests() {
    let shape = QwenShape::default();
    let hub = qwen4_hub(23, shape.clone());
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run_ok(&mut run_cmd(&hub.endpoint(), &a, &["--jobs", "1"]));
    run_ok(&mut run_cmd(&hub.endpoint(), &b, &["--jobs", "3"]));
    assert_eq!(manifest_sha(&a), manifest_sha(&b));
    for c in manifest_json(&a)["components"].as_array().unwrap() {
        let p = c["path"].as_str().unwrap();
        assert_eq!(
            std::fs::read(a.join("artifact").join(p)).unwrap(),
            std::fs::read(b.join("artifact").join(p)).unwrap(),
            "{p}"
        );
    }
}

/// `run` drives fetch and conversion with the defaults of `fetch` and
/// `convert` (it used to convert with the fetch default of `--jobs`, 4,
/// where `convert` uses 2); `--jobs` sets both unless `--fetch-jobs` /
/// `--convert-jobs` say otherwise. The JSON summary reports the values
/// handed to the stages.
#[test]
fn run_converts_with_the_jobs_default_of_convert() {
    let shape = QwenShape::default();
    let hub = qwen4_hub(24, shape.clone());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let jobs = |o: &std::process::Output| -> serde_json::Value {
        let text = String::from_utf8_lossy(&o.stdout);
        let last = text.lines().last().unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(v["event"], "summary", "{last}");
        v["jobs"].clone()
    };
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--json"]));
    let convert = run_ok(&mut convert_cmd(&out, &["--json"]));
    assert_eq!(jobs(&convert), serde_json::json!({"convert": 2}));
    assert_eq!(
        jobs(&o),
        serde_json::json!({"fetch": 4, "convert": jobs(&convert)["convert"]})
    );
    let o = run_ok(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--json", "--jobs", "3"],
    ));
    assert_eq!(jobs(&o), serde_json::json!({"fetch": 3, "convert": 3}));
    let o = run_ok(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--json", "--jobs", "3", "--convert-jobs", "1"],
    ));
    assert_eq!(jobs(&o), serde_json::json!({"fetch": 3, "convert": 1}));
    let o = run_ok(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--json", "--fetch-jobs", "5"],
    ));
    assert_eq!(jobs(&o), serde_json::json!({"fetch": 5, "convert": 2}));
    assert_clean_audit(&out);
}
