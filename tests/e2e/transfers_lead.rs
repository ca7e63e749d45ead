//! A run without a budget starts its transfers before it saves the
//! skeleton (issue 39 item 2): the plan stage refuses a bad checkpoint,
//! options or volume before any shard body, and the fetch stage starts
//! its workers, then saves the skeleton and opens the converter beside
//! them (`pipeline/src/streamed/lead.rs`). A failure there (an I/O error,
//! a file in the way under `artifact/`) comes after the workers started:
//! their transfers must be cancelled (as an interrupt cancels them), the
//! fetch ended and the error reported at once, with nothing converted and
//! nothing lost, and the next run must finish the same artifact.

use crate::common::*;

use std::time::{Duration, Instant};

use ftpipe_fixtures::checkpoint::content_bytes;
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};
use ftpipe_fixtures::{Fault, FaultRule};

/// How long each shard's transfer stalls once past its header.
const STALL: Duration = Duration::from_secs(120);

/// The converter cannot open (a regular file stands where the expert
/// sidecars' directory goes; the start-up checks cover the state files
/// and `artifact/` itself, not what lies inside it) while every shard's
/// transfer stalls for [`STALL`] once past its header (the plan's header
/// reads end before that byte). The run fails naming the file well
/// before the stall ends: the transfers are cancelled, not waited for.
/// (Whether a worker's request reaches the hub before the converter fails
/// depends on scheduling; a cancelled worker that had not sent it never
/// does. That the skeleton is saved in the fetch stage is
/// `chain_crash`'s `skeleton-written` row.) The stage log shows the fetch
/// failed, no component is written, every file published is whole, and
/// once the file is gone the next run finishes with the manifest of a run
/// never interrupted.
#[test]
fn a_converter_that_cannot_open_beside_the_transfers_stops_them_and_loses_nothing() {
    let files = generate_qwen4_repo(71, QwenShape::small_test());
    let hub = hub_serving(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    run_ok(&mut run_cmd(&hub.endpoint(), &reference, &[]));
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        let bytes = content_bytes(f).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let past_header = 8 + header + 1;
        assert!((bytes.len() as u64) > past_header, "{}", f.path);
        hub.inject(
            FaultRule::new(
                f.path.clone(),
                Fault::Stall {
                    after: past_header,
                    for_ms: STALL.as_millis() as u64,
                },
            )
            .times(1000),
        );
    }
    let out = tmp.path().join("out");
    let blocker = out.join("artifact").join("experts");
    std::fs::create_dir_all(out.join("artifact")).unwrap();
    std::fs::write(&blocker, b"in the way").unwrap();
    let started = Instant::now();
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let took = started.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("artifact/experts is not a directory"),
        "the error names the file in the way: {err}"
    );
    assert!(
        took < STALL / 8,
        "the failure waited for the stalled transfers: {took:?}"
    );
    let last = query(
        &out,
        "SELECT stage || ':' || event FROM stage_events ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(last, ["fetch:failed"], "{err}");
    assert!(
        out.join(".ftpipe").join("convert.json").is_file(),
        "the skeleton was saved before the converter opened"
    );
    let components = query(&out, "SELECT count(*) FROM components");
    assert_eq!(components, ["0"], "a component was written: {err}");
    // What the transfers published is kept: each receipt's file is whole.
    for row in query(&out, "SELECT path || '|' || size FROM receipts") {
        let (path, size) = row.split_once('|').unwrap();
        let len = std::fs::metadata(out.join("source").join(path))
            .unwrap()
            .len();
        assert_eq!(len.to_string(), size, "{path}");
    }
    std::fs::remove_file(&blocker).unwrap();
    hub.clear_faults();
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert_eq!(manifest_sha(&out), manifest_sha(&reference));
    assert_clean_audit(&out);
}
