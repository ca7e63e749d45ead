//! `ftpipe audit` after a full run: the table and `--json` reconcile to 0
//! (known target total = Σ predicted = Σ actual); `--bundle` writes a zstd
//! tar with the receipts, ledger, attempts, stage events, manifest, plan and
//! audit report, and never the token the run used; a tampered ledger makes
//! the audit fail (exit 4).

use std::io::Read;

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;

const TOKEN: &str = "hf_bundleTestToken0123456789";

#[test]
fn audit_reconciles_bundles_without_the_token_and_catches_a_tampered_ledger() {
    let hub = qwen4_hub(71, QwenShape::default());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(run_cmd(&hub.endpoint(), &out, &[]).env("HF_TOKEN", TOKEN));

    let a = audit_json(&out, true);
    assert_eq!(a["ok"], true, "{a:#}");
    assert_eq!(a["reconciliation_error"], 0);
    let kinds = a["components"].as_object().unwrap();
    let predicted: u64 = kinds
        .values()
        .map(|k| k["predicted_bytes"].as_u64().unwrap())
        .sum();
    let actual: u64 = kinds
        .values()
        .map(|k| k["actual_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(predicted, actual);
    assert_eq!(a["known_target_total"].as_u64().unwrap(), predicted);

    let bundle = tmp.path().join("evidence.tar.zst");
    let o = run_ok(
        ftpipe()
            .args(["audit", "--out"])
            .arg(&out)
            .arg("--bundle")
            .arg(&bundle)
            .env("HF_TOKEN", TOKEN),
    );
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("reconciliation error"), "{table}");
    let raw = std::fs::read(&bundle).unwrap();
    let tar_bytes = zstd::decode_all(&raw[..]).unwrap();
    let mut names = Vec::new();
    let mut archive = tar::Archive::new(&tar_bytes[..]);
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut body = Vec::new();
        e.read_to_end(&mut body).unwrap();
        assert!(
            !String::from_utf8_lossy(&body).contains(TOKEN),
            "{name} holds the token"
        );
        names.push(name);
    }
    for want in [
        "receipts.json",
        "components.json",
        "ledger.json",
        "attempts.json",
        "stage_events.json",
        "manifest.json",
        "plan.json",
        "audit.json",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    assert!(!String::from_utf8_lossy(&tar_bytes).contains(TOKEN));

    // Tamper the ledger: the audit must not reconcile.
    sqlite_exec(
        &out,
        "UPDATE ledger SET committed_bytes = committed_bytes - 1 WHERE committed_bytes > 0",
    );
    let o = run(ftpipe().args(["audit", "--out"]).arg(&out));
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_ne!(audit_json(&out, false)["reconciliation_error"], 0);
}
