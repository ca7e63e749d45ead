//! A model no built-in profile knows is converted with a declarative TOML
//! recipe (glob → component, dtype policy): without it the run stops naming
//! the model_type and suggesting `--recipe`; with it the artifact verifies;
//! an edited recipe is another converter variant and is refused.

use crate::common::*;
use ftpipe_fixtures::qwen4::{Mutation, QwenShape, generate_qwen3_moe_repo_mutated};

const RECIPE: &str = r#"
model_type = "acme_moe"
name = "acme-moe"

[[rules]]
glob = "model.layers.*.mlp.experts.*.*.weight"
component = "experts"

[[rules]]
glob = "lm_head.weight"
component = "ftw"
dtype = "protected"

[[rules]]
glob = "*"
component = "ftw"
"#;

#[test]
fn an_unknown_model_converts_with_a_recipe() {
    let files = generate_qwen3_moe_repo_mutated(
        61,
        QwenShape::default(),
        &[Mutation::ModelType("acme_moe".into())],
    );
    let hub = hub_serving(files);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("acme_moe") && err.contains("--recipe"),
        "{err}"
    );

    let recipe = tmp.path().join("acme.toml");
    std::fs::write(&recipe, RECIPE).unwrap();
    let r = recipe.to_str().unwrap();
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--recipe", r]));
    let m = manifest_json(&out);
    assert_eq!(m["converter"]["profile"], "acme-moe");
    assert_eq!(
        m["converter"]["options"]["recipe"].as_str().unwrap().len(),
        64
    );
    let experts = m["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["layout"]["kind"] == "ftexpert")
        .count();
    assert_eq!(experts as u64, QwenShape::default().layers);
    run_ok(
        ftpipe()
            .arg("verify")
            .arg(out.join("artifact"))
            .arg("--deep"),
    );
    assert_clean_audit(&out);

    // Another recipe is another converter variant: refused, not reused.
    std::fs::write(
        &recipe,
        RECIPE.replace("dtype = \"protected\"", "dtype = \"keep\""),
    )
    .unwrap();
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &["--recipe", r]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--rebuild"), "{}", stderr(&o));
}

/// The recipe's contract (`[[expect]]`), read against config.json.
const CONTRACT: &str = r#"
[[expect]]
tensor = "model.layers.{l}.mlp.experts.{e}.down_proj.weight"
each = { l = "num_hidden_layers", e = "num_experts" }
dtype = ["BF16", "NVFP4"]
shape = ["hidden_size", "moe_intermediate_size"]

[[expect]]
tensor = "model.embed_tokens.weight"
dtype = "BF16"
shape = ["vocab_size", "hidden_size"]
"#;

/// A recipe with `[[expect]]` tables checks presence, dtype and shape like
/// the built-in profiles: every mismatch in one error naming the tensor,
/// what was expected and what was found, exit 1; once the hub serves the
/// fix, the run resumes to a clean audit.
#[test]
fn a_recipe_contract_lists_every_mismatch_and_the_run_resumes_after_the_fix() {
    let repo = |extra: Vec<Mutation>| {
        let mut m = vec![Mutation::ModelType("acme_moe".into())];
        m.extend(extra);
        generate_qwen3_moe_repo_mutated(61, QwenShape::default(), &m)
    };
    let expert = "model.layers.1.mlp.experts.3.down_proj.weight";
    let bad = repo(vec![
        Mutation::Reshape(expert.into(), vec![32, 64]),
        Mutation::Retype("model.embed_tokens.weight".into(), "F16"),
    ]);
    let hub = hub_serving(bad);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let recipe = tmp.path().join("acme.toml");
    std::fs::write(&recipe, format!("{RECIPE}{CONTRACT}")).unwrap();
    let r = recipe.to_str().unwrap();
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &["--recipe", r]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in [
        "2 tensor(s) disagree with the [[expect]] tables of recipe acme-moe",
        &format!("{expert}: expected BF16 or NVFP4 [64, 32] (expect[0]), found BF16 [32, 64]"),
        "model.embed_tokens.weight: expected BF16 [128, 64] (expect[1]), found F16 [128, 64]",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");

    hub.move_branch(REPO, "main", repo(Vec::new())).unwrap();
    run_ok(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--recipe", r, "--repin"],
    ));
    assert_clean_audit(&out);
}
