//! A model no built-in profile knows is converted with a declarative TOML
//! recipe (glob → component, dtype policy): without it the run stops naming
//! the model_type and suggesting `--recipe`; with it the artifact verifies;
//! an edited recipe is another converter variant and is refused.

mod common;
use common::*;
use ftpipe_fixtures::qwen4::{Mutation, QwenShape, generate_qwen3_moe_repo_mutated};
use ftpipe_fixtures::{HubBuilder, RunningHub};

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
    let hub = RunningHub::start(HubBuilder::new().repo(REPO, files)).unwrap();
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
