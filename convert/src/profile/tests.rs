//! Profile tests: ModelOpt input scales and fused NVFP4 experts against
//! generated checkpoints.

use std::collections::BTreeMap;

use super::*;
use crate::safetensors::SourceHeader;
use ftpipe_artifact::manifest::Partition;
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
        TensorSource::Checked(c) => vec![&c.span],
    };
    let mut out = Vec::new();
    for s in spans {
        let b = content_bytes(files.iter().find(|f| *f.path == *s.file).unwrap()).unwrap();
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
        assert_eq!(&*s.tensor, key);
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
        &*parts[2].tensor,
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

/// `--protect` is a converter option beside `quantization_config.ignore`:
/// config.json is not edited, a protected tensor becomes kind Protected, a
/// quantized one is refused naming the glob, and a glob that cannot be used
/// is an invalid `--protect` option naming it (not a config.json error).
#[test]
fn protect_globs_are_a_converter_option_named_in_their_errors() {
    let files = repo(modelopt_shape(), &[]);
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
    let with = |protect: &[&str]| {
        let protect: Vec<String> = protect.iter().map(|s| s.to_string()).collect();
        Profile::with_options(&cfg, None, &protect).and_then(|p| p.components(&headers))
    };
    let plain = ftw_of(&with(&[]).unwrap());
    let (key, _) = plain
        .iter()
        .find(|(k, t)| {
            k.ends_with(".weight")
                && t.desc.dtype == Dtype::BF16
                && t.desc.kind == TensorKind::Plain
        })
        .expect("a plain BF16 weight in the FTW stream");
    let protected = ftw_of(&with(&[key.as_str()]).unwrap());
    assert_eq!(protected[key].desc.kind, TensorKind::Protected, "{key}");
    let untouched = plain.iter().filter(|(k, _)| *k != key);
    for (k, t) in untouched {
        assert_eq!(protected[k].desc.kind, t.desc.kind, "{k}");
    }

    let quantized = "model.layers.0.self_attn.o_proj";
    let e = with(&[quantized]).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "{quantized}.weight is protected by --protect \"{quantized}\" but stored quantized"
        )),
        "{e}"
    );

    let e = with(&["lm_head["]).unwrap_err().to_string();
    assert!(
        e.starts_with("invalid --protect option \"lm_head[\": "),
        "{e}"
    );
    assert!(!e.contains(CONFIG_FILE), "{e}");
    let e = with(&[""]).unwrap_err().to_string();
    assert_eq!(e, "invalid --protect option \"\": is empty");

    let recipe = Recipe::from_toml(
        "r.toml",
        "model_type = \"qwen4_exp\"\n[[rules]]\nglob = \"*\"\ncomponent = \"ftw\"\n",
    )
    .unwrap();
    let e = Profile::with_options(&cfg, Some(&recipe), &["lm_head.weight".into()])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "invalid --protect option \"lm_head.weight\": cannot be combined with --recipe r.toml"
        ),
        "{e}"
    );
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
    fn a_flat_qwen4_config_must_declare_the_text_only_architecture() {
        // Laid out like the release but without its text_config: not read
        // silently as the flat layout.
        let msg = err(json!({"model_type": "qwen4_exp",
            "architectures": ["Qwen4ExpForConditionalGeneration"],
            "num_hidden_layers": 2, "num_experts": 4}));
        assert!(
            msg.starts_with("config.json: text_config is missing")
                && msg.contains("[\"Qwen4ExpForCausalLM\"]")
                && msg.contains("[\"Qwen4ExpForConditionalGeneration\"]"),
            "{msg}"
        );
        let msg = err(json!({"model_type": "qwen4_exp", "num_hidden_layers": 2, "num_experts": 4}));
        assert!(
            msg.ends_with("config.json has architectures missing"),
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

/// The released layout (`text_config`, `model.language_model.*`, vision
/// and MTP partitions) against its contract.
mod release_layout {
    use ftpipe_fixtures::qwen4::release::{
        ReleaseShape, generate_release_repo_mutated, ngram_shard, ngram_table_scale, ple_tensor,
    };
    use serde_json::json;

    use super::*;

    fn map_of(
        shape: &ReleaseShape,
        m: &[Mutation],
    ) -> Result<(Vec<Component>, Vec<OmittedTensor>), ConvertError> {
        let files = generate_release_repo_mutated(3, shape, m);
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
        Profile::from_config(&cfg)?.map(&headers)
    }

    fn err(shape: &ReleaseShape, m: &[Mutation]) -> String {
        match map_of(shape, m) {
            Ok(_) => panic!("accepted {m:?}"),
            Err(e) => e.to_string(),
        }
    }

    const L1: &str = "model.language_model.layers.1";

    #[test]
    fn bf16_release_maps_to_ftw_sidecars_and_q3_with_vision_and_mtp_omitted() {
        let (cs, omitted) = map_of(&ReleaseShape::tiny(), &[]).unwrap();
        let names: Vec<&str> = cs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.ftw",
                "experts/layer_000.ftexpert",
                "experts/layer_001.ftexpert",
                "experts/layer_002.ftexpert",
                "experts/layer_003.ftexpert",
                "ple/layer_001/shard_0.q3",
                "ple/layer_001/shard_1.q3",
                "ple/layer_001/shard_2.q3",
                "ple/layer_001/global_scale.bf16",
            ]
        );
        let ftw = ftw_of(&cs);
        // 5 global + 13 per layer (8 hyper-connection, router, 3 shared
        // expert, shared gate) + 9 per attention layer + 6 PLE graph + 3
        // lookup buffers.
        assert_eq!(ftw.len(), 5 + 13 * 4 + 9 * 4 + 6 + 3);
        let sizes = &ftw[&ple_tensor(1, "ple_embedding.ngram_heads_vocab_sizes")];
        assert_eq!(sizes.desc.dtype, Dtype::I64);
        assert!(matches!(sizes.source, TensorSource::Checked(_)));
        assert_eq!(
            omitted
                .iter()
                .filter(|o| o.reason == Partition::Vision)
                .count(),
            333
        );
        assert_eq!(
            omitted
                .iter()
                .filter(|o| o.reason == Partition::Mtp)
                .count(),
            31
        );
        assert_eq!(cs[5].items, 1355);
        assert_eq!(cs[7].items, 1354);
    }

    #[test]
    fn nvfp4_release_has_native_linears_per_expert_sidecars_and_a_scaled_fp8_table() {
        let (cs, _) = map_of(&ReleaseShape::tiny_nvfp4(), &[]).unwrap();
        let ftw = ftw_of(&cs);
        let o = &ftw["model.language_model.layers.3.self_attn.o_proj.weight"];
        assert_eq!(
            (o.desc.dtype, o.desc.kind),
            (Dtype::Nvfp4, TensorKind::Native)
        );
        assert!(
            ftw.contains_key("model.language_model.layers.0.mlp.experts.5.up_proj.input_scale")
        );
        let g = &ftw["model.language_model.layers.0.mlp.gate.weight"];
        assert_eq!(g.desc.kind, TensorKind::Protected);
        let ComponentContent::Q3Segment { scale, .. } = &cs[5].content else {
            panic!("segment")
        };
        assert_eq!(*scale.as_ref().unwrap().tensor, ngram_table_scale(1));
        let ComponentContent::Q3GlobalScale { scales, .. } = &cs[8].content else {
            panic!("scale")
        };
        assert_eq!(scales.len(), 3);
        assert!(cs[8].source_files.len() >= 2);
    }

    #[test]
    fn every_contract_mismatch_is_listed_in_one_error() {
        let msg = err(
            &ReleaseShape::tiny(),
            &[
                Mutation::Drop(format!("{L1}.linear_attn.A_log")),
                Mutation::Add(format!("{L1}.input_layernorm.weight"), vec![64]),
                Mutation::Reshape(format!("{L1}.linear_attn.in_proj_z.weight"), vec![32, 64]),
                Mutation::Retype(format!("{L1}.mlp.shared_expert_gate.weight"), "F16"),
            ],
        );
        assert!(msg.starts_with("4 text tensor(s) disagree"), "{msg}");
        for want in [
            "linear_attn.A_log: expected BF16 or F32 [4], found nothing (missing)",
            "input_layernorm.weight: expected no such tensor",
            "in_proj_z.weight: expected BF16 [64, 64] or an NVFP4 triplet of logical [64, 64], found BF16 [32, 64]",
            "shared_expert_gate.weight: expected BF16 [1, 64] or an NVFP4 triplet of logical [1, 64], found F16 [1, 64]",
        ] {
            assert!(msg.contains(want), "{want}\n{msg}");
        }
    }

    #[test]
    fn ple_geometry_and_buffers_are_checked_against_the_primes() {
        let msg = err(
            &ReleaseShape::tiny(),
            &[Mutation::Reshape(ngram_shard(1, 1), vec![1000, 32])],
        );
        assert!(
            msg.contains("shard_1.weight: expected [1355, 32]")
                && msg.contains("sizes [1009, 1013, 1019, 1021]")
                && msg.contains("found [1000, 32]"),
            "{msg}"
        );
        let msg = err(
            &ReleaseShape::tiny(),
            &[Mutation::Reshape(
                ple_tensor(1, "ple_embedding.ngram_heads_offsets"),
                vec![5],
            )],
        );
        assert!(
            msg.contains("ngram_heads_offsets: expected I64 [4], found I64 [5]"),
            "{msg}"
        );
    }

    #[test]
    fn zero_based_ple_layer_ids_get_the_one_indexed_hint() {
        let msg = err(
            &ReleaseShape::tiny(),
            &[Mutation::Config(
                "/text_config/ple_layer_ids".into(),
                Some(json!([1])),
            )],
        );
        assert!(
            msg.starts_with("config.json: text_config.ple_layer_ids is [1]")
                && msg.contains("one-indexed")
                && msg.contains("layers.1")
                && msg.contains("names decoder layer 0")
                && msg.contains("[2]"),
            "{msg}"
        );
        let msg = err(
            &ReleaseShape::tiny(),
            &[Mutation::Config(
                "/text_config/ple_layer_ids".into(),
                Some(json!([9])),
            )],
        );
        assert!(
            msg.contains("text_config.ple_layer_ids is [9]") && msg.contains("1..=4"),
            "{msg}"
        );
    }

    #[test]
    fn an_fp8_table_without_a_scale_is_refused() {
        let msg = err(
            &ReleaseShape::tiny_nvfp4(),
            &[Mutation::Drop(ngram_table_scale(1))],
        );
        assert!(msg.contains("F8_E4M3 PLE table without a scale"), "{msg}");
        assert!(msg.contains(&ngram_table_scale(1)), "{msg}");
        let per_shard = ReleaseShape {
            per_shard_ple_scales: true,
            ..ReleaseShape::tiny_nvfp4()
        };
        let (cs, _) = map_of(&per_shard, &[]).unwrap();
        let ComponentContent::Q3Segment { scale, .. } = &cs[6].content else {
            panic!("segment")
        };
        assert!(
            scale
                .as_ref()
                .unwrap()
                .tensor
                .ends_with("shard_1.weight_scale")
        );
    }

    #[test]
    fn a_tensor_in_no_partition_is_an_error() {
        let msg = err(
            &ReleaseShape::tiny(),
            &[Mutation::Add("model.audio.proj.weight".into(), vec![4])],
        );
        assert!(
            msg.starts_with("1 tensor(s) belong to no known partition")
                && msg.contains("model.audio.proj.weight"),
            "{msg}"
        );
    }

    #[test]
    fn layer_types_must_match_the_layers() {
        let msg = err(
            &ReleaseShape::tiny(),
            &[Mutation::Config(
                "/text_config/layer_types/1".into(),
                Some(json!("sliding_attention")),
            )],
        );
        assert!(
            msg.contains("text_config.layer_types[1] is \"sliding_attention\""),
            "{msg}"
        );
    }
}
