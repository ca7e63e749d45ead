//! Malformed sources end to end: each defect fails `ftpipe run` with exit 1
//! and a message naming the file and the tensor (or header) at fault, never
//! a panic; header defects fail before any output is written; and after the
//! hub publishes a fixed commit, `run --repin` resumes and finishes with a
//! clean audit, re-downloading only the file that changed.

use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::qwen4::{
    Mutation, QwenShape, generate_qwen4_repo, generate_qwen4_repo_mutated,
};
use ftpipe_fixtures::{RepoFile, RunningHub, checkpoint};

const SEED: u64 = 41;

fn shard_name(files: &[RepoFile], i: usize) -> String {
    let mut v: Vec<&str> = files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| p.ends_with(".safetensors"))
        .collect();
    v.sort();
    v[i].to_owned()
}

fn artifact_components(out: &Path) -> usize {
    tree_of(&out.join("artifact"))
        .into_iter()
        .filter(|p| out.join("artifact").join(p).is_file())
        .count()
}

/// Serves `mutations` applied to the checkpoint, expects `run` to fail
/// naming every `needles`, then fixes the hub and resumes.
fn fails_then_resumes(mutations: Vec<Mutation>, needles: &[&str], writes_nothing: bool) {
    let shape = QwenShape::default();
    let good = generate_qwen4_repo(SEED, shape.clone());
    let bad = generate_qwen4_repo_mutated(SEED, shape, &mutations);
    let hub = hub_serving(bad);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{mutations:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(
            err.contains(n),
            "{mutations:?}: error does not name {n:?}: {err}"
        );
    }
    if writes_nothing {
        assert_eq!(
            artifact_components(&out),
            0,
            "{mutations:?}: output written"
        );
    }
    let full = |hub: &RunningHub| -> Vec<String> {
        good.iter()
            .filter(|f| {
                let got: u64 = body_gets(hub, &f.path).iter().map(|r| r.body_bytes).sum();
                got >= content_len(f) && got > 0
            })
            .map(|f| f.path.clone())
            .filter(|p| p.ends_with(".safetensors"))
            .collect()
    };
    let fetched_before = full(&hub);
    if writes_nothing {
        // Header defects are found from the headers alone (HTTP Range),
        // before any weights are downloaded.
        assert!(
            fetched_before.is_empty(),
            "{mutations:?}: downloaded {fetched_before:?}"
        );
    }
    // The hub publishes the fixed checkpoint; the run resumes on it.
    hub.move_branch(REPO, "main", good.clone()).unwrap();
    hub.clear_requests();
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--repin"]));
    assert_clean_audit(&out);
    if !fetched_before.is_empty() {
        let again = full(&hub);
        assert_eq!(again.len(), 1, "{mutations:?}: re-downloaded {again:?}");
    }
}

#[test]
fn header_length_beyond_the_file() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 0);
    fails_then_resumes(
        vec![Mutation::CorruptHeaderLen(0, 50_000_000)],
        &[&shard],
        true,
    );
}

#[test]
fn header_over_the_limit() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 1);
    fails_then_resumes(
        vec![Mutation::CorruptHeaderLen(1, 1 << 40)],
        &[&shard, "header"],
        true,
    );
}

#[test]
fn overlapping_offsets() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 1);
    fails_then_resumes(
        vec![Mutation::OverlapOffsets(1)],
        &[&shard, "overlap"],
        true,
    );
}

#[test]
fn gapped_offsets() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 2);
    fails_then_resumes(vec![Mutation::GapOffsets(2)], &[&shard, "gap"], true);
}

#[test]
fn truncated_file() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 0);
    fails_then_resumes(vec![Mutation::TruncateShard(0, 100)], &[&shard], true);
}

#[test]
fn shape_that_contradicts_the_config() {
    let t = "model.layers.1.mlp.experts.3.up_proj.weight";
    fails_then_resumes(
        vec![Mutation::Reshape(t.into(), vec![64, 32])],
        &[t, "shape", "moe_intermediate_size"],
        true,
    );
}

#[test]
fn nan_in_a_tensor_to_quantize() {
    let t = "model.layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight";
    fails_then_resumes(
        vec![Mutation::Nan(t.into(), 77)],
        &[t, ".safetensors", "element 77 is NaN"],
        false,
    );
}

#[test]
fn dtype_that_the_profile_refuses() {
    let t = "model.layers.1.ple.ple_embedding.ngram_embedding.shard_0.weight";
    fails_then_resumes(
        vec![Mutation::Retype(t.into(), "F32")],
        &[t, "dtype F32", "BF16"],
        true,
    );
}

/// The first BF16 tensor (by data offset) of shard `i`: the one
/// [`Mutation::DuplicateTensorKey`] repeats.
fn first_bf16_tensor(files: &[RepoFile], i: usize) -> String {
    let name = shard_name(files, i);
    let f = files.iter().find(|f| f.path == name).unwrap();
    let b = checkpoint::content_bytes(f).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&b[8..8 + n]).unwrap();
    h.iter()
        .filter(|(_, v)| v["dtype"] == "BF16")
        .min_by_key(|(_, v)| v["data_offsets"][0].as_u64())
        .map(|(k, _)| k.clone())
        .unwrap()
}

// A safetensors header naming a tensor twice was read as if the first entry
// did not exist (a JSON map keeps the last), also when the two disagree on
// the dtype; a verifier must refuse it, naming the file and the key.
#[test]
fn duplicate_tensor_key_with_the_same_entry() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 1);
    let key = first_bf16_tensor(&files, 1);
    fails_then_resumes(
        vec![Mutation::DuplicateTensorKey(1, None)],
        &[&shard, "duplicate key", &format!("{key:?}")],
        true,
    );
}

#[test]
fn duplicate_tensor_key_with_another_dtype() {
    let files = generate_qwen4_repo(SEED, QwenShape::default());
    let shard = shard_name(&files, 0);
    let key = first_bf16_tensor(&files, 0);
    fails_then_resumes(
        vec![Mutation::DuplicateTensorKey(0, Some("F16"))],
        &[&shard, "duplicate key", &format!("{key:?}")],
        true,
    );
}

#[test]
fn duplicate_key_in_the_index_weight_map() {
    let t = "model.norm.weight";
    fails_then_resumes(
        vec![Mutation::DuplicateIndexKey(t.into())],
        &[
            "model.safetensors.index.json",
            "duplicate key",
            &format!("{t:?} in weight_map"),
        ],
        true,
    );
}
