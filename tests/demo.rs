//! `ftpipe demo` (the README's main-job command) runs end to end: it kills
//! its own fetch with SIGKILL mid-transfer, resumes with a ranged request,
//! and ends with a clean audit of what it left on disk.

mod common;
use common::*;

#[test]
fn demo_crashes_resumes_and_audits_clean() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let o = run(ftpipe().args(["demo", "--out"]).arg(&out));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", stderr(&o));
    assert!(stdout.contains("with SIGKILL"), "{stdout}");
    assert!(
        stdout.contains("Range: bytes="),
        "no ranged resume shown: {stdout}"
    );
    assert!(
        stdout.contains("reconciliation error                               0"),
        "{stdout}"
    );
    assert_clean_audit(&out);
    let interrupted = query(
        &out,
        "SELECT COUNT(*) FROM attempts WHERE outcome = 'in_flight'",
    );
    assert_eq!(
        interrupted,
        ["1"],
        "the killed attempt is kept as interrupted"
    );
}
