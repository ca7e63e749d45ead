//! End-to-end: `ftpipe plan` on a generated qwen4_exp checkpoint. The remote
//! plan (safetensors headers over HTTP Range, before any fetch) equals the
//! local plan after fetch, reads only small ranges, and predicts exactly
//! the sizes `ftpipe_formats::sizes` gives for the expected layouts. Broken
//! sources fail with exit 1 and a message naming the file or tensor.

use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::qwen4::{
    Mutation, QwenShape, generate_qwen4_repo, generate_qwen4_repo_mutated,
};
use ftpipe_fixtures::{RepoFile, checkpoint};
use ftpipe_formats::{Dtype, TensorDesc, TensorKind, sizes};
use serde_json::Value;

fn plan_cmd(out: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = ftpipe();
    cmd.args(["plan", REPO, "--out"]).arg(out).args(extra);
    cmd
}

fn plan_json(out: &Path, extra: &[&str]) -> Value {
    let o = run(&mut plan_cmd(out, &[extra, &["--json"]].concat()));
    assert!(o.status.success(), "plan failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("plan --json prints one JSON object")
}

fn component<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no component {name} in {plan:#}"))
}

#[test]
fn remote_plan_reads_only_headers_and_equals_local_plan_after_fetch() {
    let files = generate_qwen4_repo(11, QwenShape::default());
    let hub = hub_serving(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let ep = hub.endpoint();

    let remote = plan_json(&out, &["--remote", "--endpoint", &ep]);
    assert!(!out.join("source").exists(), "plan --remote wrote sources");

    // Only ranged 206s on the shards, each far smaller than the shard.
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        let size = content_len(f);
        let gets = body_gets(&hub, &f.path);
        assert_eq!(gets.len(), 2, "{}: {gets:?}", f.path);
        for r in &gets {
            assert_eq!(r.status, 206, "{r:?}");
            assert!(r.range.is_some(), "{r:?}");
            assert!(r.body_bytes < size / 4, "{r:?} of {size}");
        }
        assert_eq!(gets[0].range.as_deref(), Some("bytes=0-7"));
        assert_eq!(gets[0].body_bytes, 8);
    }

    let o = run(&mut fetch_cmd(&ep, &out, &[]));
    assert!(o.status.success(), "fetch: {}", stderr(&o));
    let local = plan_json(&out, &[]);
    assert_eq!(remote, local);
    // After fetch, --remote reuses the pin and still agrees.
    assert_eq!(plan_json(&out, &["--remote", "--endpoint", &ep]), local);

    // Sizes equal formats::sizes of the expected layouts.
    let (w, rows) = (64u64, [40u64, 40, 24]);
    for (i, r) in rows.iter().enumerate() {
        let c = component(&local, &format!("ple/layer_001/shard_{i}.q3"));
        assert_eq!(c["predicted_bytes"], r * (w / 32) * 14);
        assert_eq!(c["predicted_bytes"], sizes::q3_len(*r, w).unwrap());
    }
    assert_eq!(
        component(&local, "ple/layer_001/global_scale.bf16")["predicted_bytes"],
        sizes::Q3_GLOBAL_SCALE_LEN
    );
    let fields = |dtype, kind| {
        vec![
            TensorDesc::new("gate_proj", dtype, kind, [32, 64]),
            TensorDesc::new("up_proj", dtype, kind, [32, 64]),
            TensorDesc::new("down_proj", dtype, kind, [64, 32]),
        ]
    };
    let nv = sizes::ftexpert_total_len(0, 16, fields(Dtype::Nvfp4, TensorKind::Native)).unwrap();
    let bf = |l| sizes::ftexpert_total_len(l, 16, fields(Dtype::BF16, TensorKind::Plain)).unwrap();
    assert_eq!(
        component(&local, "experts/layer_000.ftexpert")["predicted_bytes"],
        nv
    );
    assert_eq!(
        component(&local, "experts/layer_001.ftexpert")["predicted_bytes"],
        bf(1)
    );
    assert_eq!(
        component(&local, "experts/layer_002.ftexpert")["predicted_bytes"],
        bf(2)
    );
    let sum: u64 = local["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["predicted_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(local["total_bytes"], sum);
    assert_eq!(local["profile"], "qwen4_exp");
    assert_eq!(local["components"].as_array().unwrap().len(), 1 + 3 + 4);

    // The table names every component and the total.
    let o = run(&mut plan_cmd(&out, &[]));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("model.ftw") && table.contains(&format!("{sum}")),
        "{table}"
    );
}

/// Writes `files` as `out/source` and returns the failed local plan's stderr.
fn local_plan_fails(files: &[RepoFile], out: &Path) -> String {
    checkpoint::write_repo_to_dir(files, &out.join("source")).unwrap();
    let o = run(&mut plan_cmd(out, &[]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    err
}

fn mutated(m: Mutation) -> Vec<RepoFile> {
    generate_qwen4_repo_mutated(3, QwenShape::default(), &[m])
}

#[test]
fn bad_sources_fail_naming_the_culprit() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(Mutation, Vec<&str>)> = vec![
        (
            Mutation::ModelType("llama".into()),
            vec!["config.json", "unknown model_type \"llama\""],
        ),
        (
            Mutation::Drop("model.layers.1.mlp.experts.3.up_proj.weight".into()),
            vec![
                "missing tensor model.layers.1.mlp.experts.3.up_proj.weight",
                "expert 3 of layer 1",
            ],
        ),
        (
            Mutation::Add(
                "model.layers.1.mlp.experts.16.up_proj.weight".into(),
                vec![32, 64],
            ),
            vec![
                "unexpected tensor model.layers.1.mlp.experts.16.up_proj.weight",
                "expert 16 is beyond num_experts 16",
                "model-00003-of-00003.safetensors",
            ],
        ),
        (
            Mutation::Add("model.layers.7.input_layernorm.weight".into(), vec![64]),
            vec![
                "model.layers.7.input_layernorm.weight",
                "num_hidden_layers 3",
            ],
        ),
        (
            Mutation::Reshape("model.layers.0.mlp.gate.weight".into(), vec![8, 64]),
            vec![
                "model.layers.0.mlp.gate.weight",
                "[8, 64]",
                "[16, 64]",
                "num_experts 16",
            ],
        ),
        (
            Mutation::Reshape(
                "model.layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight".into(),
                vec![40, 96],
            ),
            vec!["shard_1.weight", "ple_embedding_dim 64"],
        ),
    ];
    for (i, (m, needles)) in cases.into_iter().enumerate() {
        let err = local_plan_fails(&mutated(m.clone()), &tmp.path().join(format!("c{i}")));
        assert_names(&err, &needles);
    }
}

/// The first shard with its header length pointing past the end of the file.
fn with_header_beyond_file(mut files: Vec<RepoFile>) -> (Vec<RepoFile>, String) {
    let f = files
        .iter_mut()
        .find(|f| f.path.ends_with(".safetensors"))
        .unwrap();
    let mut b = checkpoint::content_bytes(f).unwrap().to_vec();
    let len = b.len() as u64;
    b[..8].copy_from_slice(&(len * 2).to_le_bytes());
    let path = f.path.clone();
    *f = RepoFile::bytes(path.clone(), b);
    (files, path)
}

#[test]
fn malformed_header_fails_locally_and_remotely_without_reading_weights() {
    let (files, shard) = with_header_beyond_file(generate_qwen4_repo(4, QwenShape::default()));
    let tmp = tempfile::tempdir().unwrap();
    let err = local_plan_fails(&files, &tmp.path().join("local"));
    assert_names(&err, &[&shard, "runs past the end"]);

    let hub = hub_serving(files);
    let out = tmp.path().join("remote");
    let o = run(&mut plan_cmd(
        &out,
        &["--remote", "--endpoint", &hub.endpoint()],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_names(&err, &[&shard, "runs past the end"]);
    let gets = body_gets(&hub, &shard);
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0].range.as_deref(), Some("bytes=0-7"));
}

#[test]
fn unknown_model_type_remote_fails_before_any_shard_request() {
    let files = mutated(Mutation::ModelType("mystery".into()));
    let hub = hub_serving(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&mut plan_cmd(
        tmp.path(),
        &["--remote", "--endpoint", &hub.endpoint()],
    ));
    assert_eq!(o.status.code(), Some(1));
    assert_names(
        &stderr(&o),
        &["unknown model_type \"mystery\"", "qwen4_exp"],
    );
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        assert!(body_gets(&hub, &f.path).is_empty());
    }
}

/// The plan's reads before the first shard body: an index of 1 MiB or more
/// comes in 4 ranges at once (a capped link caps each connection), and the
/// headers of the listing's shard-named files are read beside it; one the
/// index does not name is dropped, even unreadable. The plan is the
/// one of the plain repo.
#[test]
fn large_index_is_read_in_ranges_and_unnamed_shards_are_dropped() {
    let files = generate_qwen4_repo(11, QwenShape::default());
    let plain = hub_serving(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    let want = plan_json(
        &tmp.path().join("plain"),
        &["--remote", "--endpoint", &plain.endpoint()],
    );

    let mut padded: Vec<RepoFile> = files
        .iter()
        .map(|f| {
            if f.path != "model.safetensors.index.json" {
                return f.clone();
            }
            let mut index: Value =
                serde_json::from_slice(&checkpoint::content_bytes(f).unwrap()).unwrap();
            index["metadata"]["padding"] = Value::String("x".repeat(3 << 19));
            RepoFile::bytes(f.path.clone(), serde_json::to_vec(&index).unwrap())
        })
        .collect();
    padded.push(RepoFile::bytes(
        "stray-00001-of-00001.safetensors",
        vec![0xFFu8; 64],
    ));
    let hub = hub_serving(padded);
    let got = plan_json(
        &tmp.path().join("padded"),
        &["--remote", "--endpoint", &hub.endpoint()],
    );
    assert_eq!(got["components"], want["components"]);
    assert_eq!(got["total_bytes"], want["total_bytes"]);

    let gets = body_gets(&hub, "model.safetensors.index.json");
    assert_eq!(gets.len(), 4, "{gets:?}");
    assert!(gets.iter().all(|r| r.status == 206), "{gets:?}");
    let bytes: u64 = gets.iter().map(|r| r.body_bytes).sum();
    assert!(bytes > 3 << 19, "{bytes}");
    assert!(!body_gets(&hub, "stray-00001-of-00001.safetensors").is_empty());

    // A server answering those ranges with the whole file (200): the
    // index is read whole instead, and the plan is the same.
    let index = "model.safetensors.index.json";
    hub.inject(
        ftpipe_fixtures::FaultRule::new(index, ftpipe_fixtures::Fault::IgnoreRange).times(4),
    );
    let again = plan_json(
        &tmp.path().join("no-ranges"),
        &["--remote", "--endpoint", &hub.endpoint()],
    );
    assert_eq!(again["components"], want["components"]);
    let whole: Vec<_> = body_gets(&hub, index)
        .into_iter()
        .skip(4)
        .filter(|r| r.range.is_none())
        .collect();
    assert_eq!(whole.len(), 1, "{whole:?}");
}
