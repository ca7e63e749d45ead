//! No silent reuse: an artifact made by another converter variant or from
//! other sources is refused with the reasons, and `--rebuild` rebuilds it
//! while keeping the old one aside as evidence. Placement never changes the
//! fingerprint. `--retire-sources` deletes shards only once everything
//! reading them is durable, and a component lost after that gives a clear
//! "re-acquire" error, fixed by `fetch --reacquire`.

use std::path::Path;

use crate::common::*;
use ftpipe_fixtures::checkpoint;
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};

const PROTECT: &str = "model.layers.1.mlp.experts.*";

fn shards(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out.join("source"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    v.sort();
    v
}

#[test]
fn another_converter_variant_is_refused_then_rebuilt_with_the_old_artifact_kept() {
    let hub = qwen4_hub(31, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let old_sha = manifest_sha(&out);
    let old_fp = manifest_json(&out)["fingerprint"].clone();

    let o = run(&mut run_cmd(&hub.endpoint(), &out, &["--protect", PROTECT]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("different converter variant"), "{err}");
    assert!(err.contains("converter") && err.contains(PROTECT), "{err}");
    assert!(err.contains("--rebuild"), "{err}");
    assert_eq!(
        manifest_sha(&out),
        old_sha,
        "a refused run touched the artifact"
    );

    let o = run_ok(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--protect", PROTECT, "--rebuild"],
    ));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("set aside"), "{text}");
    let aside: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("artifact.stale-run")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(manifest_sha_in(&aside[0]), old_sha);
    let new = manifest_json(&out);
    assert_ne!(new["fingerprint"], old_fp);
    assert_eq!(new["converter"]["options"]["protect"][0], PROTECT);
    let log = query(&out, "SELECT event FROM artifacts ORDER BY id");
    assert_eq!(log, ["manifest", "set_aside", "manifest"], "{log:?}");
    // The rebuilt variant is now the current one: a rerun with it is a no-op.
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--protect", PROTECT]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to do"));
}

/// A repin is not another source to refuse: the artifact of the old
/// commit is rebuilt in place where the new one changed it (see
/// `incremental_rebuild`), with nothing set aside.
#[test]
fn a_repin_converts_the_changed_sources_without_rebuild() {
    let hub = qwen4_hub(32, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let old_commit = manifest_json(&out)["source"]["commit"].clone();
    // The hub gets a new commit whose first shard has other weights.
    let other = generate_qwen4_repo(99, QwenShape::default());
    let shard = other
        .iter()
        .find(|f| f.path.ends_with(".safetensors"))
        .unwrap();
    let bytes = checkpoint::content_bytes(shard).unwrap();
    hub.update_file(REPO, &shard.path, bytes).unwrap();

    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--repin"]));
    assert_ne!(manifest_json(&out)["source"]["commit"], old_commit);
    let log = query(&out, "SELECT event FROM artifacts ORDER BY id");
    assert_eq!(log, ["manifest", "manifest"], "{log:?}");
    assert_clean_audit(&out);
}

#[test]
fn retired_sources_then_a_lost_component_asks_to_reacquire() {
    let hub = qwen4_hub(33, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let before = {
        let o = tmp.path().join("reference");
        run_ok(&mut run_cmd(&hub.endpoint(), &o, &[]));
        manifest_sha(&o)
    };
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    assert_eq!(
        manifest_sha(&out),
        before,
        "retirement changed the artifact"
    );
    assert!(shards(&out).is_empty(), "shards left: {:?}", shards(&out));
    assert!(out.join("source/config.json").is_file());
    let retired = query(
        &out,
        "SELECT path FROM source_retirements WHERE event = 'retired'",
    );
    assert!(retired.len() >= 2, "{retired:?}");
    assert_clean_audit(&out);
    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--retire-sources"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to do"));

    // A retirement logged by a run killed before its unlink (the shard is
    // still there) is finished by the next conversion, without a new row.
    let shard = &retired[0];
    std::fs::copy(
        tmp.path().join("reference/source").join(shard),
        out.join("source").join(shard),
    )
    .unwrap();
    run_ok(&mut convert_cmd(&out, &["--retire-sources"]));
    assert!(
        !out.join("source").join(shard).exists(),
        "{shard} left on disk"
    );
    let rows = query(&out, "SELECT COUNT(*) FROM source_retirements");
    assert_eq!(
        rows,
        [retired.len().to_string()],
        "a retirement was logged twice"
    );

    std::fs::remove_file(out.join("artifact/experts/layer_001.ftexpert")).unwrap();
    let o = run(&mut convert_cmd(&out, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("experts/layer_001.ftexpert") && err.contains("re-acquire"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--reacquire"]));
    assert_eq!(manifest_sha(&out), before);
    assert!(!shards(&out).is_empty());
    assert_clean_audit(&out);
}

/// Regression: `--rebuild` renamed the stale artifact aside and only then
/// logged where it went. A run killed between the two left an unlogged
/// `artifact.stale-run{N}`, and the next run set aside again under another
/// name (logging the wrong directory). Now a marker and the log name the
/// destination before the rename, and the next run finishes that same
/// rename. Crash points (`FTPIPE_CRASH_AT`) abort at the exact steps.
#[test]
fn a_set_aside_killed_at_each_step_finishes_under_the_logged_name() {
    let hub = qwen4_hub(34, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let plain_sha = manifest_sha(&out);
    let aside_dirs = |out: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("artifact.stale"))
            .collect();
        v.sort();
        v
    };
    let logged = |out: &Path| {
        query(
            out,
            "SELECT set_aside_to FROM artifacts WHERE event = 'set_aside' ORDER BY id",
        )
    };

    // Killed after the log, before the rename: the old artifact is still
    // in place; a plain run (no --rebuild) finishes the rename.
    let o = run(convert_cmd(&out, &["--protect", PROTECT, "--rebuild"])
        .env("FTPIPE_CRASH_AT", "set-aside-logged"));
    assert!(!o.status.success());
    assert!(out.join("artifact/manifest.json").exists());
    assert!(aside_dirs(&out).is_empty());
    let first = logged(&out);
    assert_eq!(first.len(), 1, "{first:?}");
    let o = run_ok(&mut convert_cmd(&out, &["--protect", PROTECT]));
    assert!(
        stderr(&o).contains("finished setting the stale artifact aside"),
        "{}",
        stderr(&o)
    );
    assert_eq!(aside_dirs(&out), first);
    assert_eq!(manifest_sha_in(&out.join(&first[0])), plain_sha);
    assert_eq!(logged(&out), first, "set aside twice");
    let protected_sha = manifest_sha(&out);
    assert_ne!(protected_sha, plain_sha);

    // Killed after the rename: nothing to finish; the next run converts
    // afresh, and deleting the evidence later renames nothing.
    let o = run(convert_cmd(&out, &["--rebuild"]).env("FTPIPE_CRASH_AT", "set-aside-renamed"));
    assert!(!o.status.success());
    assert!(!out.join("artifact").exists());
    let second = logged(&out);
    assert_eq!(second.len(), 2, "{second:?}");
    run_ok(&mut convert_cmd(&out, &[]));
    assert_eq!(manifest_sha(&out), plain_sha);
    assert_eq!(manifest_sha_in(&out.join(&second[1])), protected_sha);
    std::fs::remove_dir_all(out.join(&second[1])).unwrap();
    let o = run_ok(&mut convert_cmd(&out, &[]));
    assert!(!stderr(&o).contains("set aside"), "{}", stderr(&o));
    assert_eq!(manifest_sha(&out), plain_sha);
    assert_eq!(logged(&out), second);
    assert!(!out.join(".ftpipe/set-aside.json").exists());
}
