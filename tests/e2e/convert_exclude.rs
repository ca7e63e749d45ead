//! `--exclude` of the files holding only vision / MTP tensors of the
//! released Qwen4-Exp layout. Before, the index still named the excluded
//! shards, so the plan read their headers over HTTP Range and the
//! conversion refused with "missing file": a user could not narrow the
//! fetch to the text model although vision and MTP are never converted.
//!
//! Now, through the fixture hub (both flavours): `run --exclude` of the
//! MTP and vision files succeeds and never requests those files (no header
//! range, no body); manifest.json lists their tensors as omitted with
//! `"fetched": false`; `run`, `plan` and `audit` print them apart from the
//! fetched omissions; `verify --deep` and a deep audit are clean; a re-run
//! with the same selection is a no-op, one with another selection is not.
//! Excluding a text shard is an error naming the file, the glob, the count
//! and the first tensors, and nothing is written; dropping the glob resumes.

use crate::common::*;
use ftpipe_fixtures::RequestRecord;
use ftpipe_fixtures::qwen4::release::{
    ReleaseShape, generate_release_repo, release_partition_files,
};

const SEED: u64 = 43;

/// Every request of the hub's log that names repo file `file` (resolve
/// path, CDN query, any method).
fn requests_naming(hub: &ftpipe_fixtures::RunningHub, file: &str) -> Vec<RequestRecord> {
    hub.requests()
        .into_iter()
        .filter(|r| {
            r.path.ends_with(&format!("/{file}"))
                || r.query
                    .as_deref()
                    .is_some_and(|q| q.split('&').any(|kv| kv == format!("path={file}")))
        })
        .collect()
}

fn excluded_run(shape: &ReleaseShape) {
    let (mtp_file, vision_file) = release_partition_files(shape);
    let hub = hub_serving(generate_release_repo(SEED, shape));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let exclude = ["--exclude", &mtp_file, "--exclude", &vision_file];

    let o = run_ok(&mut run_cmd(&hub.endpoint(), &out, &exclude));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("not fetched      364 omitted source tensors")
            && !text.contains("omitted          "),
        "{text}"
    );
    for f in [&mtp_file, &vision_file] {
        assert_eq!(requests_naming(&hub, f), [], "{f} was requested");
        assert!(!out.join("source").join(f).exists(), "{f}");
    }
    assert!(!requests_naming(&hub, "config.json").is_empty());

    // Listed as omitted and not fetched, with their files and partitions.
    let m = manifest_json(&out);
    let omitted = m["omitted"].as_array().expect("omitted listed");
    let of = |file: &str, reason: &str| {
        omitted
            .iter()
            .filter(|o| o["file"] == file && o["reason"] == reason && o["fetched"] == false)
            .count()
    };
    assert_eq!(
        (of(&mtp_file, "mtp"), of(&vision_file, "vision")),
        (31, 333)
    );
    assert_eq!(omitted.len(), 364);
    assert!(
        m["source"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["path"] != mtp_file.as_str() && f["path"] != vision_file.as_str()),
        "{:#}",
        m["source"]
    );

    let v = run(ftpipe()
        .arg("verify")
        .arg(out.join("artifact"))
        .arg("--deep"));
    assert_eq!(v.status.code(), Some(0), "{}", stderr(&v));
    let a = assert_clean_audit(&out);
    assert_eq!(
        (
            a["omitted_tensors"].as_u64(),
            a["not_fetched_tensors"].as_u64()
        ),
        (Some(0), Some(364))
    );
    let excluded_bytes: u64 = [&mtp_file, &vision_file]
        .iter()
        .map(|f| {
            query(
                &out,
                &format!("SELECT size FROM files WHERE path = {}", sql_str(f)),
            )[0]
            .parse::<u64>()
            .unwrap()
        })
        .sum();
    assert_eq!(a["not_fetched_bytes"], excluded_bytes, "{a:#}");
    let table =
        String::from_utf8_lossy(&run_ok(ftpipe().args(["audit", "--out"]).arg(&out)).stdout)
            .into_owned();
    assert!(table.contains("omitted, not fetched (n/size)"), "{table}");

    // The plan of the pinned DIR keeps the stored selection.
    let p = run_ok(ftpipe().args(["plan", REPO, "--out"]).arg(&out).args([
        "--remote",
        "--endpoint",
        &hub.endpoint(),
    ]));
    let ptext = String::from_utf8_lossy(&p.stdout);
    assert!(
        ptext.contains("not fetched: 364 omitted source tensors (vision 333, mtp 31) in 2 files")
            && ptext.contains(&format!("--exclude {vision_file:?}")),
        "{ptext}"
    );

    // Same selection: nothing to do, and still nothing requested.
    let want = manifest_sha(&out);
    let again = run_ok(&mut run_cmd(&hub.endpoint(), &out, &exclude));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("nothing to do"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    assert_eq!(manifest_sha(&out), want);
    for f in [&mtp_file, &vision_file] {
        assert_eq!(requests_naming(&hub, f), [], "{f} was requested");
    }

    // Another selection is another run with other sources (the manifest's
    // source files): refused without --rebuild, never silently reused, and
    // before their bodies are fetched (from their headers); rebuilt, the
    // components are the same and the manifest says fetched.
    let components = m["components"].clone();
    let full = run(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert_eq!(full.status.code(), Some(1), "{}", stderr(&full));
    assert_names(&stderr(&full), &["other file digests", "--rebuild"]);
    for f in [&mtp_file, &vision_file] {
        assert!(!out.join("source").join(f).exists(), "{f} fetched");
    }
    let full = run_ok(&mut run_cmd(&hub.endpoint(), &out, &["--rebuild"]));
    let ftext = String::from_utf8_lossy(&full.stdout);
    assert!(
        ftext.contains("omitted          364 source tensors") && !ftext.contains("not fetched"),
        "{ftext}"
    );
    let m2 = manifest_json(&out);
    assert_eq!(m2["components"], components);
    assert!(
        m2["omitted"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o.get("fetched").is_none())
    );
    assert_ne!(m2["fingerprint"], m["fingerprint"]);
    assert_clean_audit(&out);
}

#[test]
fn bf16_release_without_vision_and_mtp_files() {
    excluded_run(&ReleaseShape::tiny());
}

#[test]
fn nvfp4_release_without_vision_and_mtp_files() {
    excluded_run(&ReleaseShape::tiny_nvfp4());
}

/// A text shard left out is refused before anything is fetched or written,
/// naming the file, the glob, the count and the first tensors; without the
/// glob the run resumes to a clean audit.
#[test]
fn excluding_a_text_shard_names_it_and_resumes_without_the_glob() {
    let shape = ReleaseShape::tiny();
    let hub = hub_serving(generate_release_repo(SEED, &shape));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let (_, vision_file) = release_partition_files(&shape);
    let text_shard = "model-00003-of-00005.safetensors";
    let o = run(&mut run_cmd(
        &hub.endpoint(),
        &out,
        &["--exclude", "model-00003-*", "--exclude", &vision_file],
    ));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let files = query(
        &out,
        &format!(
            "SELECT count(*) FROM files WHERE path = {}",
            sql_str(text_shard)
        ),
    );
    assert_eq!(files, ["1"]);
    assert_names(
        &err,
        &[
            "1 file(s) left out of the fetch hold tensors the qwen4_exp artifact needs",
            &format!("{text_shard}, left out by --exclude \"model-00003-*\""),
            "lm_head.weight (text)",
            "and ",
        ],
    );
    // The count of needed tensors is that of the shard's header.
    let needed = err
        .split(": ")
        .find_map(|s| s.strip_suffix(" tensor(s) the artifact needs"))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no count in {err}"));
    assert!(needed > 3, "{err}");
    assert!(
        !err.contains(&vision_file),
        "the vision file is fine: {err}"
    );
    assert!(!out.join("artifact/manifest.json").exists());
    assert!(
        body_requests(&hub, text_shard).is_empty(),
        "nothing fetched"
    );
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert_clean_audit(&out);
}
