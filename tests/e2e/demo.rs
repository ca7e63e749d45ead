//! `ftpipe demo` (the README's main-job command) runs end to end: it kills
//! its own `ftpipe run` with SIGKILL once mid-download and once
//! mid-conversion, resumes (a ranged request; durable components reused),
//! and leaves an artifact that verifies on its own and a clean audit.

use crate::common::*;

/// The number after `key` in `text` (`"... 3 reused"` → 3 with key
/// `"written now, "`).
fn number_after(text: &str, key: &str) -> u64 {
    let rest = &text[text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?}: {text}"))
        + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {key:?}: {text}"))
}

#[test]
fn demo_crashes_twice_resumes_verifies_and_audits_clean() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let o = run(ftpipe().args(["demo", "--out"]).arg(&out));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", stderr(&o));

    assert!(
        stdout.contains("crash 1 (download): killed `ftpipe run`")
            && stdout.contains("with SIGKILL at byte"),
        "no kill during the download: {stdout}"
    );
    assert!(
        stdout.contains("Range: bytes=") && stdout.contains("-> HTTP 206"),
        "no ranged resume shown: {stdout}"
    );
    assert!(
        stdout.contains("crash 2 (conversion): killed `ftpipe run`")
            && stdout.contains("manifest.json did not exist yet"),
        "the kill did not land during the conversion: {stdout}"
    );
    assert!(!stdout.contains("NOT simulated"), "{stdout}");
    let durable = number_after(&stdout, "durable at the kill (receipts): ");
    let reused = number_after(&stdout, "written now, ");
    assert!(reused > 0, "the resume reused no component: {stdout}");
    assert_eq!(
        reused, durable,
        "every component durable at the kill is reused: {stdout}"
    );
    assert!(
        stdout.contains("status              OK (fingerprint"),
        "verify not OK: {stdout}"
    );
    let reconciliation = format!("{:<28}{:>24}\n", "reconciliation error", "0");
    assert!(stdout.contains(&reconciliation), "{stdout}");
    assert!(
        stdout.contains(&format!("manifest sha256  {}", manifest_sha(&out))),
        "printed manifest SHA-256 is not the file's: {stdout}"
    );

    assert_clean_audit(&out);
    let v = run_ok(
        ftpipe()
            .arg("verify")
            .arg(out.join("artifact"))
            .arg("--deep"),
    );
    assert!(String::from_utf8_lossy(&v.stdout).contains("OK"));
    let interrupted = query(
        &out,
        "SELECT COUNT(*) FROM attempts WHERE outcome = 'in_flight'",
    );
    // Two transfers cut by the first kill, the held shard's resume by the
    // second.
    assert_eq!(
        interrupted,
        ["3"],
        "the attempts killed mid-download are kept as interrupted"
    );

    // A second demo into the same directory refuses instead of mixing runs.
    let again = run(ftpipe().args(["demo", "--out"]).arg(&out));
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    assert!(stderr(&again).contains("not empty"), "{}", stderr(&again));
}

/// Issue 36: there was no way to try ftpipe without a hub but the demo's
/// own scripted run. `demo --serve` keeps the generated checkpoint served
/// on loopback until Ctrl-C and prints the commands to try: its fetch
/// command, run as printed, fetches a checkpoint that audits clean, and
/// SIGINT ends the demo (exit 0, it says so).
#[test]
fn demo_serve_serves_until_sigint_and_its_fetch_command_works() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("try");
    let mut demo = ftpipe()
        .args(["demo", "--serve", "--out"])
        .arg(&base)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    let fetch = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("demo --serve ended: {printed:?}"))
            .unwrap();
        printed.push(line.clone());
        if let Some(cmd) = line.trim().strip_prefix("ftpipe fetch ") {
            break cmd.to_owned();
        }
    };
    for command in ["ftpipe run ", "ftpipe publish ", "ftpipe pull "] {
        let line = lines.next().unwrap().unwrap();
        assert!(
            line.trim().starts_with(command),
            "{line:?} after {printed:?}"
        );
    }
    let args: Vec<&str> = fetch.split_whitespace().collect();
    let o = run_ok(ftpipe().arg("fetch").args(&args).arg("--quiet"));
    assert!(o.status.success());
    let out = base.join("fetched");
    assert!(
        args.windows(2)
            .any(|w| w == ["--out", out.to_str().unwrap()]),
        "the fetch does not go under --out: {fetch}"
    );
    assert_clean_audit(&out);

    let st = std::process::Command::new("kill")
        .args(["-INT", &demo.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = demo.wait().unwrap();
    assert!(status.success(), "demo --serve after SIGINT: {status}");
    assert!(
        rest.iter().any(|l| l.contains("stopped serving")),
        "{rest:?}"
    );
}
