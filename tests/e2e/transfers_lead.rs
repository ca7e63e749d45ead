//! A run without a budget starts its transfers before it saves the
//! skeleton (issue 39 item 2): the plan stage refuses what it must before
//! any shard body, and the fetch stage starts its workers, then saves the
//! skeleton and opens the converter beside them
//! (`pipeline/src/streamed/lead.rs`). A failure there comes after the
//! workers started: their transfers must be cancelled (as an interrupt
//! cancels them), the fetch ended and the error reported at once, with
//! nothing converted and nothing lost, and the next run must finish the
//! same artifact. (Before, the same failure came before
//! any shard body; the test holds either way, and checks the path that
//! stops the workers.)

use crate::common::*;

use ftpipe_fixtures::qwen4::QwenShape;

/// The converter cannot open (a regular file stands where the expert
/// sidecars' directory goes; the start-up checks cover the state files
/// and `artifact/` itself, not what lies inside it): the run fails naming
/// it after the workers started, the stage log shows the fetch failed,
/// no component is written and every file the transfers published is
/// whole; once the file is gone the next run finishes with the manifest
/// of a run never interrupted.
#[test]
fn a_converter_that_cannot_open_beside_the_transfers_stops_them_and_loses_nothing() {
    let hub = qwen4_hub(71, QwenShape::small_test());
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    run_ok(&mut run_cmd(&hub.endpoint(), &reference, &[]));
    let out = tmp.path().join("out");
    let blocker = out.join("artifact").join("experts");
    std::fs::create_dir_all(out.join("artifact")).unwrap();
    std::fs::write(&blocker, b"in the way").unwrap();
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("artifact/experts is not a directory"),
        "the error names the file in the way: {err}"
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
    run_ok(&mut run_cmd(&hub.endpoint(), &out, &[]));
    assert_eq!(manifest_sha(&out), manifest_sha(&reference));
    assert_clean_audit(&out);
}
