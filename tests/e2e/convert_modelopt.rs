//! End-to-end conversion of a ModelOpt-style qwen4_exp checkpoint: an
//! activation `input_scale` beside every NVFP4 triplet and a layer of fused
//! NVFP4 experts (`gate_up_proj` / `down_proj` with their block and tensor
//! scales). `ftpipe run` converts it; the artifact read back with the
//! `formats` readers equals the source bytes exactly (input scales as F32
//! tensors of `model.ftw`, every NVFP4 part passed through), and the fused
//! layer's sidecar is byte-identical to the one converted from the same
//! weights laid out as per-expert triplets.

use std::path::{Path, PathBuf};

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;
use ftpipe_formats::{Dtype, ExpertView, FtwView, TensorKind};

const SEED: u64 = 31;
/// The layer laid out fused (in `fused()`) or per-expert (in `per_expert()`).
const FUSED_LAYER: u64 = 2;

/// NVFP4 experts in layers 0 (per-expert) and 2 (fused), BF16 experts in
/// layer 1, input scales everywhere, distinguishable F32 scales.
fn fused() -> QwenShape {
    QwenShape {
        nvfp4_expert_layers: vec![0],
        fused_expert_layers: Vec::new(),
        fused_nvfp4_expert_layers: vec![FUSED_LAYER],
        input_scales: true,
        varied_tensor_scales: true,
        ..QwenShape::default()
    }
}

/// The same weights with layer 2 as per-expert NVFP4 triplets.
fn per_expert() -> QwenShape {
    QwenShape {
        nvfp4_expert_layers: vec![0, FUSED_LAYER],
        fused_nvfp4_expert_layers: Vec::new(),
        ..fused()
    }
}

fn convert(shape: &QwenShape, dir: &Path) -> PathBuf {
    let hub = qwen4_hub(SEED, shape.clone());
    let out = dir.to_owned();
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--jobs", "2"]));
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Checks `model.ftw` and every sidecar of `out` against its sources, byte
/// for byte; the fused layer by slicing the fused tensors.
fn check_readback(out: &Path, shape: &QwenShape) {
    let src = source_tensors(out);
    let art = out.join("artifact");
    let ftw = std::fs::read(art.join("model.ftw")).unwrap();
    let view = FtwView::new(&ftw).unwrap();

    // Every input scale of the source is in model.ftw, F32 Plain, same bytes.
    let scales: Vec<&String> = src.keys().filter(|k| k.ends_with("input_scale")).collect();
    // One per o_proj, per NVFP4 expert module, per fused NVFP4 tensor pair.
    let per_expert_layers = shape
        .nvfp4_expert_layers
        .iter()
        .filter(|l| !shape.fused_nvfp4_expert_layers.contains(l))
        .count() as u64;
    let want = shape.layers
        + per_expert_layers * shape.experts * 3
        + shape.fused_nvfp4_expert_layers.len() as u64 * 2;
    assert_eq!(scales.len() as u64, want, "input scales");
    for k in &scales {
        let t = view
            .tensor(k)
            .unwrap_or_else(|| panic!("{k} is not in model.ftw"));
        assert_eq!(
            (t.entry.dtype(), t.entry.kind()),
            (Dtype::F32, TensorKind::Plain),
            "{k}"
        );
        assert_eq!(t.data, &src[*k][..], "{k}");
    }
    for l in &shape.fused_nvfp4_expert_layers {
        let fp = format!("model.layers.{l}.mlp.experts");
        let t = view
            .tensor(&format!("{fp}.gate_up_proj_input_scale"))
            .unwrap();
        assert_eq!(t.entry.shape(), [shape.experts, 2]);
        let t = view.tensor(&format!("{fp}.down_proj_input_scale")).unwrap();
        assert_eq!(t.entry.shape(), [shape.experts]);
    }

    // Every other FTW tensor: its source bytes (NVFP4 as the triplet).
    for t in view.tensors() {
        let key = t.entry.key();
        let module = key.strip_suffix(".weight").unwrap_or(key);
        let want = if src.contains_key(&format!("{module}.weight_scale")) {
            assert_eq!(t.entry.dtype(), Dtype::Nvfp4, "{key}");
            cat(&[
                &src[&format!("{module}.weight")],
                &src[&format!("{module}.weight_scale")],
                &src[&format!("{module}.weight_scale_2")],
            ])
        } else {
            src[key].clone()
        };
        assert_eq!(t.data, &want[..], "FTW tensor {key}");
    }

    // Experts: each field of each expert is its source (slice).
    let (i, h) = (shape.moe_intermediate as usize, shape.hidden as usize);
    for l in 0..shape.layers {
        let bytes = std::fs::read(art.join(format!("experts/layer_{l:03}.ftexpert"))).unwrap();
        let v = ExpertView::new(&bytes).unwrap();
        assert_eq!(u64::from(v.layout().expert_count()), shape.experts);
        let p = format!("model.layers.{l}.mlp.experts");
        let fused = shape.fused_nvfp4_expert_layers.contains(&l);
        for e in 0..shape.experts as usize {
            let rec = v.expert(e as u32).unwrap();
            for (fi, f) in ["gate_proj", "up_proj", "down_proj"]
                .into_iter()
                .enumerate()
            {
                let want = if fused {
                    // Row block k of `len` bytes of tensor `n`.
                    let blk = |n: &str, k: usize, len: usize| {
                        src[&format!("{p}.{n}")][k * len..(k + 1) * len].to_vec()
                    };
                    if fi < 2 {
                        let k = 2 * e + fi;
                        cat(&[
                            &blk("gate_up_proj", k, i * h / 2),
                            &blk("gate_up_proj_weight_scale", k, i * h / 16),
                            &blk("gate_up_proj_weight_scale_2", k, 4),
                        ])
                    } else {
                        cat(&[
                            &blk("down_proj", e, h * i / 2),
                            &blk("down_proj_weight_scale", e, h * i / 16),
                            &blk("down_proj_weight_scale_2", e, 4),
                        ])
                    }
                } else {
                    let m = format!("{p}.{e}.{f}");
                    match src.get(&format!("{m}.weight_scale")) {
                        Some(sc) => cat(&[
                            &src[&format!("{m}.weight")],
                            sc,
                            &src[&format!("{m}.weight_scale_2")],
                        ]),
                        None => src[&format!("{m}.weight")].clone(),
                    }
                };
                assert_eq!(rec.field(f).unwrap(), &want[..], "layer {l} expert {e} {f}");
            }
        }
    }
}

#[test]
fn modelopt_input_scales_and_fused_nvfp4_experts_pass_through_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (a_shape, b_shape) = (fused(), per_expert());
    let a = convert(&a_shape, &tmp.path().join("fused"));
    check_readback(&a, &a_shape);
    assert_clean_audit(&a);
    let b = convert(&b_shape, &tmp.path().join("per_expert"));
    check_readback(&b, &b_shape);

    // The two checkpoints differ only in how layer 2's experts are stored.
    let sa = source_tensors(&a);
    let sb = source_tensors(&b);
    assert!(sa.contains_key("model.layers.2.mlp.experts.gate_up_proj"));
    assert!(!sb.contains_key("model.layers.2.mlp.experts.gate_up_proj"));
    assert!(sb.contains_key("model.layers.2.mlp.experts.15.down_proj.weight_scale_2"));

    // Same weights → byte-identical sidecars, the fused layer included.
    for l in 0..a_shape.layers {
        let name = format!("experts/layer_{l:03}.ftexpert");
        let (x, y) = (
            std::fs::read(a.join("artifact").join(&name)).unwrap(),
            std::fs::read(b.join("artifact").join(&name)).unwrap(),
        );
        assert!(
            x == y,
            "{name} differs between fused and per-expert sources"
        );
    }

    // The fused input scales hold the per-expert ones, [e, 0] gate, [e, 1] up.
    let fa = std::fs::read(a.join("artifact/model.ftw")).unwrap();
    let fb = std::fs::read(b.join("artifact/model.ftw")).unwrap();
    let (va, vb) = (FtwView::new(&fa).unwrap(), FtwView::new(&fb).unwrap());
    let p = format!("model.layers.{FUSED_LAYER}.mlp.experts");
    let mut gate_up = Vec::new();
    let mut down = Vec::new();
    for e in 0..a_shape.experts {
        for proj in ["gate_proj", "up_proj"] {
            let k = format!("{p}.{e}.{proj}.input_scale");
            gate_up.extend_from_slice(vb.tensor(&k).unwrap().data);
        }
        let k = format!("{p}.{e}.down_proj.input_scale");
        down.extend_from_slice(vb.tensor(&k).unwrap().data);
    }
    let got = |k: &str| va.tensor(&format!("{p}.{k}")).unwrap().data.to_vec();
    assert_eq!(got("gate_up_proj_input_scale"), gate_up);
    assert_eq!(got("down_proj_input_scale"), down);
    assert_ne!(gate_up[..4], gate_up[4..8], "scales are distinguishable");

    // The manifest's inventory names the fused sources of each field.
    let m = manifest_json(&a);
    let inv = m["tensors"].as_array().unwrap();
    let item = inv
        .iter()
        .find(|t| t["component"] == "experts/layer_002.ftexpert" && t["key"] == "3.up_proj")
        .unwrap();
    assert_eq!(
        item["sources"],
        serde_json::json!([
            format!("{p}.gate_up_proj"),
            format!("{p}.gate_up_proj_weight_scale"),
            format!("{p}.gate_up_proj_weight_scale_2"),
        ])
    );
}
