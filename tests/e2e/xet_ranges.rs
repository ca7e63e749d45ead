//! The busy ranges of one Xet file are capped at the cores the process may
//! run on (issue 37). A Xet range is bound by the core that decodes and
//! hashes its chunks, so ranges past the cores gain no speed, while each
//! holds its socket buffers' and its unrecorded batches' worth of bytes
//! that a kill throws away (`bench/xet.sh`, docs/performance.md: with every
//! connection taking a range, a kill at 90 % of a 1 GiB file cost 8.89 % of
//! it; with a range per core, under 1 %). The cap was set in the
//! coordinator's `schedule` and in `another_connection_pays`, but no test
//! held it: a change that let a Xet file take every connection again would
//! have passed the suite. Here the xorb requests in flight at once are
//! counted at the recording proxy in front of the CAS.

use crate::common::*;
use crate::xet_source::xet_served_sized;

/// `cmd` run on CPUs `cpus` only (`taskset`, so the process's
/// `available_parallelism` is their count), with its environment.
fn pinned(cmd: &std::process::Command, cpus: &str) -> std::process::Command {
    let mut pinned = std::process::Command::new("taskset");
    pinned.args(["-c", cpus]).arg(cmd.get_program());
    pinned.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => pinned.env(k, v),
            None => pinned.env_remove(k),
        };
    }
    pinned
}

/// Regression: held to two CPUs, with six connections and every range
/// judged worth splitting (`--split-below-rate` far above what loopback
/// delivers, small pieces), a Xet file is fetched with exactly two xorb
/// requests in flight at its busiest (two: the split did happen; not
/// more: the cap held), and published verified with a clean audit.
#[test]
fn a_xet_file_has_at_most_a_busy_range_per_core() {
    let (hub, files, _cas, proxy, _hashes) = xet_served_sized(391, 16 << 20);
    let f = lfs_file(&files);
    assert!(content_len(f) >= 4 << 20, "{}", content_len(f));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let cmd = fetch_cmd(
        &hub.endpoint(),
        &out,
        &[
            "--include",
            &f.path,
            "--jobs",
            "1",
            "--connections",
            "6",
            "--segment-threshold",
            "1MiB",
            "--min-range",
            "256KiB",
            "--piece-size",
            "1MiB",
            "--split-below-rate",
            "1000GiB",
        ],
    );
    let o = run(&mut pinned(&cmd, "0,1"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, std::slice::from_ref(f));
    assert_clean_audit(&out);
    let xorbs = proxy
        .seen()
        .iter()
        .filter(|s| s.target.contains("fetch_term"))
        .count();
    assert!(
        xorbs >= 3,
        "{xorbs} xorb requests: the file was hardly split"
    );
    assert_eq!(
        proxy.peak_in_flight("fetch_term"),
        2,
        "xorb requests in flight at once, on two CPUs"
    );
}
