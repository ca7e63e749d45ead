//! A file fetched as ranges is hashed in one sequential digest: the front
//! range's bytes from memory, the rest read back from the part file once
//! the written prefix reaches them. That read-back ran inside the
//! checkpoint, on the coordinator that commits every range's watermark, so
//! no watermark became durable while it ran, and the ranges wrote on. With
//! four busy ranges a read-back took up to 0.6 s (262 MB), and a kill at
//! 90 % of a 1 GiB Xet file found a quarter of it not durable: 13.6 % of
//! the file was fetched again (`bench/xet.sh`, docs/performance.md). The
//! read-back now runs on a thread of its own beside the checkpoints.
//!
//! The check holds the read-back for good (`FTPIPE_HOLD_AT`): the first
//! one starts when the front range ends while later ranges are still being
//! written. The ranges must go on becoming durable until every byte of the
//! file is (before: the watermarks froze where the read-back began); killed
//! there, the fetch resumes without a byte fetched twice and verifies.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use ftpipe_fixtures::{Fault, FaultRule};

const MIB: u64 = 1024 * 1024;

#[test]
fn watermarks_become_durable_while_the_digest_reads_back() {
    let _time_bounded = time_bounded();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let log = tmp.path().join("held.log");
    let (hub, files) = hub_with_repo(53, 32 * MIB);
    let mut sizes: Vec<(u64, &str)> = files
        .iter()
        .map(|f| (content_len(f), f.path.as_str()))
        .collect();
    sizes.sort_unstable();
    let (size, path) = sizes[sizes.len() - 1];
    let second = sizes.get(sizes.len().wrapping_sub(2)).map_or(0, |s| s.0);
    assert!(size >= 8 * MIB, "{size} bytes");
    // Only the big file is split (its digest is the one held); 1 MiB
    // pieces over 4 connections of about 1.6 MB/s each: the front range
    // ends while the second wave of pieces is being written.
    let threshold = (second + 1).max(2 * MIB).to_string();
    hub.inject(
        FaultRule::new(
            path,
            Fault::Trickle {
                bytes: 16 * 1024,
                every_ms: 10,
            },
        )
        .times(100_000),
    );
    let args = [
        "--segment-threshold",
        &threshold,
        "--min-range",
        "256KiB",
        "--piece-size",
        "1MiB",
        "--connections",
        "4",
        "--checkpoint-bytes",
        "131072",
        "--checkpoint-secs",
        "0.05",
        "--split-below-rate",
        "0",
    ];
    let mut child = fetch_cmd(&hub.endpoint(), &out, &args)
        .env("FTPIPE_HOLD_AT", "digest-read-back")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn ftpipe");
    let held = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("FTPIPE_HOLD_AT=digest-read-back#1: holding here")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut durable_when_held = None;
    let mut durable = 0;
    while durable < size && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        if let Some(status) = child.try_wait().unwrap() {
            panic!("ftpipe ended ({status}) with the read-back held");
        }
        // The log first: a hold seen is one that began before `durable`
        // was read, so `durable` bounds what was durable at the hold.
        let seen_held = durable_when_held.is_none() && held();
        durable = committed_bytes(&out, path);
        if seen_held {
            durable_when_held = Some(durable);
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let at_hold = durable_when_held.unwrap_or_else(|| panic!("the read-back was never held"));
    assert!(
        at_hold < size,
        "the first read-back began with the whole file durable: nothing to check"
    );
    assert_eq!(
        durable, size,
        "with the digest's read-back held from {at_hold} durable bytes on, only {durable} of \
         {size} became durable in 60 s"
    );
    check_after_kill(&out, "read-back held");

    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    let audit = assert_clean_audit(&out);
    let big = audit["files"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["path"] == path))
        .unwrap_or_else(|| panic!("{path} not in the audit: {audit:#}"))
        .clone();
    assert_eq!(big["discarded_bytes"], 0, "{big:#}");
}
