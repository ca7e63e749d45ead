//! Profile tests: ModelOpt input scales and fused NVFP4 experts against
//! generated checkpoints.

use std::collections::BTreeMap;

use super::*;
use crate::convert::safetensors::SourceHeader;
use ftpipe_fixtures::RepoFile;
use ftpipe_fixtures::checkpoint::content_bytes;
use ftpipe_fixtures::qwen4::{Mutation, QwenShape, generate_qwen4_repo_mutated};

/// Default shape with input scales, varied F32 scales and layer 2 as
/// fused NVFP4 experts.
fn modelopt_shape() -> QwenShape {
    QwenShape {
        input_scales: true,
        varied_tensor_scales: true,
        fused_nvfp4_expert_layers: vec![2],
        ..QwenShape::default()
    }
}

fn repo(shape: QwenShape, mutations: &[Mutation]) -> Vec<RepoFile> {
    generate_qwen4_repo_mutated(7, shape, mutations)
}

fn components_of(files: &[RepoFile]) -> Result<Vec<Component>, ConvertError> {
    let get = |p: &str| content_bytes(files.iter().find(|f| f.path == p).unwrap()).unwrap();
    let cfg: Value = serde_json::from_slice(&get(CONFIG_FILE)).unwrap();
    let headers: Vec<SourceHeader> = files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .map(|f| {
            let b = content_bytes(f).unwrap();
            let len = b.len() as u64;
            let n = SourceHeader::header_len(&f.path, &b, len).unwrap() as usize;
            SourceHeader::parse(&f.path, &b[8..8 + n], len).unwrap()
        })
        .collect();
    Profile::from_config(&cfg)?.components(&headers)
}

fn err_of(files: &[RepoFile]) -> String {
    match components_of(files) {
        Ok(_) => panic!("the profile accepted a broken checkpoint"),
        Err(e) => e.to_string(),
    }
}

fn ftw_of(cs: &[Component]) -> BTreeMap<String, FtwTensor> {
    let ComponentContent::Ftw { tensors } = &cs[0].content else {
        panic!("FTW first")
    };
    tensors
        .iter()
        .map(|t| (t.desc.key.clone(), t.clone()))
        .collect()
}

/// The bytes `src` reads, from the in-memory files.
fn bytes_of(files: &[RepoFile], src: &TensorSource) -> Vec<u8> {
    let spans: Vec<&SourceSpan> = match src {
        TensorSource::Span(s) => vec![s],
        TensorSource::Native(p) => p.iter().collect(),
    };
    let mut out = Vec::new();
    for s in spans {
        let b = content_bytes(files.iter().find(|f| f.path == s.file).unwrap()).unwrap();
        out.extend_from_slice(&b[s.offset as usize..(s.offset + s.len) as usize]);
    }
    out
}

fn experts_of(cs: &[Component], l: u64) -> (&[TensorDesc], &[Vec<TensorSource>]) {
    cs.iter()
        .find_map(|c| match &c.content {
            ComponentContent::Experts {
                layer,
                fields,
                records,
            } if *layer == l => Some((&fields[..], &records[..])),
            _ => None,
        })
        .unwrap()
}

#[test]
fn input_scales_are_accepted_and_carried_into_the_ftw_stream() {
    let files = repo(modelopt_shape(), &[]);
    let cs = components_of(&files).unwrap();
    let ftw = ftw_of(&cs);
    for (key, shape) in [
        ("model.layers.0.self_attn.o_proj.input_scale", vec![]),
        ("model.layers.1.self_attn.o_proj.input_scale", vec![]),
        ("model.layers.0.mlp.experts.0.gate_proj.input_scale", vec![]),
        (
            "model.layers.0.mlp.experts.15.down_proj.input_scale",
            vec![],
        ),
        (
            "model.layers.2.mlp.experts.gate_up_proj_input_scale",
            vec![16, 2],
        ),
        ("model.layers.2.mlp.experts.down_proj_input_scale", vec![16]),
    ] {
        let t = ftw
            .get(key)
            .unwrap_or_else(|| panic!("{key} not in model.ftw"));
        assert_eq!(
            t.desc,
            TensorDesc::new(key, Dtype::F32, TensorKind::Plain, shape),
            "{key}"
        );
        let TensorSource::Span(s) = &t.source else {
            panic!("{key}: not a plain span")
        };
        assert_eq!(s.tensor, key);
        assert_eq!(s.len, 4 * t.desc.shape.iter().product::<u64>());
    }
    // Every input scale of the source, and nothing else new.
    let n_scales = ftw.keys().filter(|k| k.ends_with("input_scale")).count();
    assert_eq!(
        n_scales,
        3 + 16 * 3 + 2,
        "o_proj ×3, layer-0 experts, fused"
    );
    // The records themselves are unchanged: three NVFP4 fields.
    let (fields, records) = experts_of(&cs, 0);
    assert_eq!(fields.len(), 3);
    assert!(fields.iter().all(|f| f.dtype == Dtype::Nvfp4));
    let TensorSource::Native(parts) = &records[3][1] else {
        panic!("NVFP4 record field")
    };
    assert_eq!(
        parts[2].tensor,
        "model.layers.0.mlp.experts.3.up_proj.weight_scale_2"
    );
    // The FTW size prediction includes them.
    let descs: Vec<TensorDesc> = ftw.values().map(|t| t.desc.clone()).collect();
    assert_eq!(cs[0].predicted_bytes, sizes::ftw_total_len(descs).unwrap());
    assert_eq!(cs[0].items, ftw.len() as u64);
}

#[test]
fn input_scale_of_shape_one_is_accepted() {
    let t = "model.layers.0.mlp.experts.4.down_proj.input_scale";
    let files = repo(modelopt_shape(), &[Mutation::Reshape(t.into(), vec![1])]);
    let ftw = ftw_of(&components_of(&files).unwrap());
    assert_eq!(ftw[t].desc.shape, vec![1]);
}

#[test]
fn input_scale_of_wrong_dtype_or_shape_is_refused_by_name() {
    let o = "model.layers.1.self_attn.o_proj.input_scale";
    let e = err_of(&repo(
        modelopt_shape(),
        &[Mutation::Retype(o.into(), "BF16")],
    ));
    assert!(
        e.contains(o) && e.contains("BF16") && e.contains("F32"),
        "{e}"
    );
    assert!(e.contains("model-0000"), "names the file: {e}");

    let x = "model.layers.0.mlp.experts.7.gate_proj.input_scale";
    let e = err_of(&repo(
        modelopt_shape(),
        &[Mutation::Reshape(x.into(), vec![2])],
    ));
    assert!(
        e.contains(x) && e.contains("[2]") && e.contains("[] or [1]"),
        "{e}"
    );

    let f = "model.layers.2.mlp.experts.gate_up_proj_input_scale";
    let e = err_of(&repo(
        modelopt_shape(),
        &[Mutation::Reshape(f.into(), vec![16])],
    ));
    assert!(e.contains(f) && e.contains("[16, 2]"), "{e}");
}

#[test]
fn orphan_input_scale_is_refused_by_name() {
    // BF16 modules: q_proj, the layer-1 per-expert BF16 experts, the
    // fused BF16 experts of the default shape (layer 2).
    for (t, module) in [
        (
            "model.layers.0.self_attn.q_proj.input_scale",
            "model.layers.0.self_attn.q_proj",
        ),
        (
            "model.layers.1.mlp.experts.3.gate_proj.input_scale",
            "model.layers.1.mlp.experts.3.gate_proj",
        ),
        (
            "model.layers.2.mlp.experts.down_proj_input_scale",
            "model.layers.2.mlp.experts.down_proj",
        ),
        ("lm_head.input_scale", "lm_head"),
    ] {
        let files = repo(QwenShape::default(), &[Mutation::Add(t.into(), vec![])]);
        let err = components_of(&files).unwrap_err();
        assert!(
            matches!(&err, ConvertError::OrphanInputScale { tensor, module: m, .. }
                if tensor == t && m == module),
            "{t}: {err}"
        );
    }
    // A fused NVFP4 layer has no per-expert modules to attach one to.
    let t = "model.layers.2.mlp.experts.5.up_proj.input_scale";
    let files = repo(modelopt_shape(), &[Mutation::Add(t.into(), vec![])]);
    let e = err_of(&files);
    assert!(
        e.contains(t) && e.contains("not stored as ModelOpt NVFP4"),
        "{e}"
    );
}

#[test]
fn fused_nvfp4_of_wrong_shape_or_dtype_is_refused_by_name() {
    let p = "model.layers.2.mlp.experts";
    let cases: Vec<(Mutation, String, &str)> = vec![
        (
            Mutation::Reshape(format!("{p}.gate_up_proj"), vec![16, 64, 64]),
            format!("{p}.gate_up_proj"),
            "[16, 64, 32]",
        ),
        (
            Mutation::Reshape(format!("{p}.gate_up_proj_weight_scale"), vec![16, 64, 8]),
            format!("{p}.gate_up_proj_weight_scale"),
            "[16, 64, 4]",
        ),
        (
            Mutation::Reshape(format!("{p}.gate_up_proj_weight_scale_2"), vec![16]),
            format!("{p}.gate_up_proj_weight_scale_2"),
            "[16, 2]",
        ),
        (
            Mutation::Reshape(format!("{p}.down_proj"), vec![15, 64, 16]),
            format!("{p}.down_proj"),
            "[16, 64, 16]",
        ),
        (
            Mutation::Reshape(format!("{p}.down_proj_weight_scale"), vec![16, 32, 2]),
            format!("{p}.down_proj_weight_scale"),
            "[16, 64, 2]",
        ),
        (
            Mutation::Reshape(format!("{p}.down_proj_weight_scale_2"), vec![16, 1]),
            format!("{p}.down_proj_weight_scale_2"),
            "[16]",
        ),
        (
            Mutation::Retype(format!("{p}.down_proj_weight_scale"), "U8"),
            format!("{p}.down_proj_weight_scale"),
            "F8_E4M3",
        ),
        (
            Mutation::Drop(format!("{p}.gate_up_proj_weight_scale_2")),
            format!("{p}.gate_up_proj_weight_scale_2"),
            "missing",
        ),
    ];
    for (m, tensor, want) in cases {
        let e = err_of(&repo(modelopt_shape(), std::slice::from_ref(&m)));
        assert!(e.contains(&tensor) && e.contains(want), "{m:?}: {e}");
        if !matches!(m, Mutation::Drop(_)) {
            assert!(
                e.contains("moe_intermediate_size 32") || e.contains("F8_E4M3"),
                "{e}"
            );
        }
    }
}

#[test]
fn fused_nvfp4_records_read_the_per_expert_bytes() {
    let fused = repo(modelopt_shape(), &[]);
    let per_expert = repo(
        QwenShape {
            nvfp4_expert_layers: vec![0, 2],
            fused_expert_layers: Vec::new(),
            fused_nvfp4_expert_layers: Vec::new(),
            ..modelopt_shape()
        },
        &[],
    );
    let (a, b) = (
        components_of(&fused).unwrap(),
        components_of(&per_expert).unwrap(),
    );
    let ((fa, ra), (fb, rb)) = (experts_of(&a, 2), experts_of(&b, 2));
    assert_eq!(fa, fb);
    assert_eq!(ra.len(), 16);
    let sidecar =
        |name: &str, cs: &[Component]| cs.iter().find(|c| c.name == name).unwrap().predicted_bytes;
    let name = "experts/layer_002.ftexpert";
    assert_eq!(sidecar(name, &a), sidecar(name, &b));
    for (e, (x, y)) in ra.iter().zip(rb).enumerate() {
        for (f, (sx, sy)) in x.iter().zip(y).enumerate() {
            let TensorSource::Native(parts) = sx else {
                panic!("fused NVFP4 field is Native")
            };
            assert!(
                parts[0]
                    .tensor
                    .ends_with(if f == 2 { "down_proj" } else { "gate_up_proj" })
            );
            assert_eq!(
                bytes_of(&fused, sx),
                bytes_of(&per_expert, sy),
                "expert {e} {}",
                fa[f].key
            );
        }
    }
    // The fused input scales hold the per-expert ones, gate then up.
    let (ta, tb) = (ftw_of(&a), ftw_of(&b));
    let gu = bytes_of(
        &fused,
        &ta["model.layers.2.mlp.experts.gate_up_proj_input_scale"].source,
    );
    let mut want = Vec::new();
    for e in 0..16 {
        for proj in ["gate_proj", "up_proj"] {
            let k = format!("model.layers.2.mlp.experts.{e}.{proj}.input_scale");
            want.extend(bytes_of(&per_expert, &tb[&k].source));
        }
    }
    assert_eq!(gu, want);
    assert_ne!(gu[..4], gu[4..8], "varied scales tell gate from up");
}

/// The text model is read from `text_config` when present, from the top
/// level otherwise; errors name the JSON path.
mod text_config {
    use serde_json::json;

    use super::*;

    fn err(cfg: Value) -> String {
        match Profile::from_config(&cfg) {
            Ok(_) => panic!("accepted {cfg}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_missing_field_is_named_by_its_path_in_text_config() {
        let cfg = json!({"model_type": "qwen3_moe", "text_config": {"num_experts": 4}});
        assert_eq!(
            err(cfg),
            "config.json: text_config.num_hidden_layers is missing"
        );
    }

    #[test]
    fn neither_text_config_nor_num_hidden_layers_says_both() {
        let msg = err(json!({"model_type": "qwen4_exp", "hidden_size": 64}));
        assert!(
            msg.starts_with("config.json: text_config.num_hidden_layers is missing")
                && msg.contains("neither text_config nor a top-level num_hidden_layers"),
            "{msg}"
        );
    }

    #[test]
    fn flat_configs_name_top_level_fields() {
        let cfg = json!({"model_type": "qwen3_moe", "num_hidden_layers": 2, "num_experts": "4"});
        assert_eq!(
            err(cfg),
            "config.json: num_experts is \"4\", expected a non-negative integer"
        );
    }

    #[test]
    fn text_config_must_be_an_object() {
        let msg = err(json!({"model_type": "qwen3_moe", "text_config": [1]}));
        assert_eq!(msg, "config.json: text_config is [1], expected an object");
    }

    #[test]
    fn fields_come_from_text_config_not_the_top_level() {
        let dims = json!({"num_hidden_layers": 2, "num_experts": 4, "hidden_size": 64,
            "vocab_size": 128, "moe_intermediate_size": 32});
        let mut cfg = json!({"model_type": "qwen3_moe", "text_config": dims,
            "num_hidden_layers": 99});
        let Profile::Moe(m) = Profile::from_config(&cfg).unwrap() else {
            panic!("built-in profile")
        };
        assert_eq!((m.layers, m.experts, m.hidden), (2, 4, 64));
        cfg["text_config"]["tie_word_embeddings"] = json!("yes");
        assert_eq!(
            err(cfg),
            "config.json: text_config.tie_word_embeddings is \"yes\", expected true or false"
        );
    }
}
