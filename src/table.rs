//! The reconciliation table printed after fetch and by `audit`.
//!
//! One fixed-width table, so every total the audit re-derived sits in the
//! same column and a non-zero reconciliation error is impossible to miss;
//! then one titled list per kind of problem, so what to fix is named by
//! path. Label column 28 wide, values right-aligned in the next 24: the
//! `reconciliation error` row keeps exactly that shape (scripts and tests
//! match it).

use ftpipe_pipeline::audit::{AuditReport, CacheOutcome};

/// `1234567` → `1,234,567`.
pub(crate) fn n(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Width of the label column.
const KEY: usize = 28;
/// Width of a value column.
const VAL: usize = 24;
/// Longest problem list printed in full; the rest is counted.
const MAX_LIST: usize = 20;

fn row(out: &mut String, k: &str, v: &str) {
    out.push_str(&format!("{k:<KEY$}{v:>VAL$}\n"));
}

/// A row with two values: the first right-aligned in the value column, the
/// second after a slash (so long byte counts never shift the first).
fn pair(out: &mut String, k: &str, a: &str, b: &str) {
    out.push_str(&format!("{k:<KEY$}{a:>VAL$} / {b}\n"));
}

/// A titled list of problem lines, at most [`MAX_LIST`] shown.
fn list<I: IntoIterator<Item = String>>(out: &mut String, title: &str, items: I) {
    let items: Vec<String> = items.into_iter().collect();
    if items.is_empty() {
        return;
    }
    out.push_str(&format!("{title} ({}):\n", items.len()));
    for item in items.iter().take(MAX_LIST) {
        out.push_str(&format!("  ! {item}\n"));
    }
    if items.len() > MAX_LIST {
        out.push_str(&format!("  ... and {} more\n", items.len() - MAX_LIST));
    }
}

/// Renders the audit as one fixed-width table (sources, ledger, waste,
/// retirement, components by kind, known target total, reconciliation
/// error), then the problem lists and the status line.
pub fn render(a: &AuditReport) -> String {
    let waste: u64 = a.waste_by_reason.values().sum();
    let verified = a.files.iter().filter(|f| f.verified).count();
    let mut out = String::new();
    out.push_str(&format!("{} @ {}\n", a.repo, a.commit));
    pair(
        &mut out,
        "files (verified/selected)",
        &verified.to_string(),
        &a.files.len().to_string(),
    );
    for (k, t) in [
        ("metadata sources (files/B)", a.metadata_sources),
        ("weight sources (files/B)", a.weight_sources),
    ] {
        pair(&mut out, k, &t.files.to_string(), &n(t.bytes));
    }
    pair(
        &mut out,
        "ledger (committed/expected)",
        &n(a.committed_bytes),
        &n(a.expected_bytes),
    );
    if a.adopted_bytes > 0 {
        row(&mut out, "adopted bytes", &n(a.adopted_bytes));
    }
    if a.cache_bytes > 0 || !a.cache_candidates.is_empty() {
        row(&mut out, "adopted from HF cache", &n(a.cache_bytes));
        let rejected = a
            .cache_candidates
            .iter()
            .filter(|c| c.outcome == CacheOutcome::Rejected)
            .count();
        row(&mut out, "  cache files rejected", &rejected.to_string());
    }
    row(&mut out, "transferred bytes", &n(a.transferred_bytes));
    row(&mut out, "waste", &n(waste));
    for (reason, bytes) in &a.waste_by_reason {
        row(&mut out, &format!("  {reason}"), &n(*bytes));
    }
    let r = &a.retirement;
    pair(
        &mut out,
        "retained sources (files/B)",
        &r.retained_files.to_string(),
        &n(r.retained_bytes),
    );
    pair(
        &mut out,
        "retired sources (files/B)",
        &r.retired_files.to_string(),
        &n(r.retired_bytes),
    );
    if let Some(b) = &a.disk_budget {
        pair(
            &mut out,
            "disk budget (budget/peak held)",
            &n(b.budget),
            &n(b.peak_held),
        );
    }
    row(&mut out, "failed attempts", &a.failed_attempts.to_string());
    let u = &a.uploads;
    if u.requests > 0 {
        pair(
            &mut out,
            "uploads (verified/open)",
            &u.verified.to_string(),
            &u.in_progress.to_string(),
        );
        pair(
            &mut out,
            "upload parts (acked/B)",
            &u.parts.to_string(),
            &n(u.part_bytes),
        );
        pair(
            &mut out,
            "upload requests (all/failed)",
            &u.requests.to_string(),
            &u.failed_requests.to_string(),
        );
        row(&mut out, "upload bytes sent", &n(u.sent_bytes));
    }
    for p in &a.publications {
        row(
            &mut out,
            &format!("published ({})", p.outcome),
            &format!("{} @ {}", p.dest, p.fingerprint),
        );
    }
    if a.interrupted_attempts > 0 {
        row(
            &mut out,
            "interrupted attempts",
            &a.interrupted_attempts.to_string(),
        );
    }
    if !a.components.is_empty() {
        out.push_str(&format!(
            "{:<20}{:>8}{:>VAL$}{:>VAL$}\n",
            "component kind", "count", "predicted bytes", "actual bytes"
        ));
        for (kind, k) in &a.components {
            out.push_str(&format!(
                "  {kind:<18}{:>8}{:>VAL$}{:>VAL$}\n",
                k.count,
                n(k.predicted_bytes),
                n(k.actual_bytes)
            ));
        }
    }
    if a.omitted_tensors > 0 {
        pair(
            &mut out,
            "omitted tensors (n/B)",
            &a.omitted_tensors.to_string(),
            &n(a.omitted_bytes),
        );
    }
    if a.not_fetched_tensors > 0 {
        pair(
            &mut out,
            "omitted, not fetched (n/B)",
            &a.not_fetched_tensors.to_string(),
            &n(a.not_fetched_bytes),
        );
    }
    if !a.pending_components.is_empty() {
        let pending: u64 = a.pending_components.iter().map(|p| p.predicted_bytes).sum();
        pair(
            &mut out,
            "pending components (n/B)",
            &a.pending_components.len().to_string(),
            &n(pending),
        );
    }
    row(
        &mut out,
        &format!("known target total ({})", a.known_target_from),
        &n(a.known_target_total),
    );
    row(&mut out, "reconciliation error", &n(a.reconciliation_error));
    list(
        &mut out,
        "receipts without files",
        a.receipts_without_files.iter().cloned(),
    );
    list(
        &mut out,
        "files without receipts",
        a.files_without_receipts.iter().cloned(),
    );
    list(
        &mut out,
        "stale temp files",
        a.stale_temp_files.iter().cloned(),
    );
    list(&mut out, "orphans", a.orphans.iter().cloned());
    list(
        &mut out,
        "failed or interrupted attempts (kept as recorded)",
        a.unsuccessful_attempts.iter().map(|t| {
            let mut s = format!("{}: {}", t.path, t.outcome);
            if let Some(status) = t.status {
                s.push_str(&format!(", HTTP {status}"));
            }
            if let Some(start) = t.range_start {
                s.push_str(&format!(", from byte {}", n(start)));
            }
            s.push_str(&format!(", {} bytes", n(t.body_bytes)));
            if let Some(e) = &t.error {
                s.push_str(&format!(": {e}"));
            }
            s
        }),
    );
    list(
        &mut out,
        "pending components",
        a.pending_components
            .iter()
            .map(|p| format!("{} ({}, {} bytes)", p.path, p.kind, n(p.predicted_bytes))),
    );
    list(
        &mut out,
        "problems",
        a.files
            .iter()
            .filter_map(|f| Some(format!("{}: {}", f.path, f.problem.as_deref()?)))
            .chain(
                a.component_problems
                    .iter()
                    .map(|p| format!("{}: {}", p.path, p.problem)),
            ),
    );
    out.push_str(if a.ok {
        "status                      OK\n"
    } else {
        "status                      NOT OK\n"
    });
    out
}

/// Renders an inspection: format line, then one line per tensor or field.
pub fn render_inspection(i: &ftpipe_convert::inspect::Inspection) -> String {
    let mut out = format!(
        "{}  {} bytes, data at {}\n",
        i.format,
        n(i.file_len),
        n(i.data_offset)
    );
    if let (Some(layer), Some(experts), Some(record)) = (i.layer, i.experts, i.record_size) {
        out.push_str(&format!(
            "layer {layer}, {experts} experts, record {} bytes\n",
            n(record)
        ));
    }
    if let Some(q) = &i.q3 {
        out.push_str(&format!(
            "{} (PLE layer {}{}), size recorded in the manifest: {} bytes\n",
            q.component,
            q.layer,
            // The global scale has no segment index: nothing to add.
            q.index
                .map(|x| format!(", segment shard_{x}"))
                .unwrap_or_default(),
            n(q.manifest_size)
        ));
        if q.index.is_some() {
            out.push_str(&format!(
                "{} rows x {} wide = {} blocks of 32 elements, 14 bytes each (f16 scale + 12 bytes of 3-bit codes)\n",
                n(q.rows),
                n(q.width),
                n(q.blocks)
            ));
        }
        if let Some(g) = q.global_scale {
            out.push_str(&format!("global scale G = {g}\n"));
        }
    }
    for t in &i.tensors {
        out.push_str(&format!(
            "  {:<48} {:<8} {:<10} {:>20} @ {:>16} {:?}\n",
            t.name,
            t.dtype,
            t.kind.as_deref().unwrap_or("-"),
            n(t.len),
            n(t.offset),
            t.shape
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ftpipe_pipeline::audit::{
        AttemptLine, AttemptOutcome, AuditReport, ComponentProblem, DiscardReason, FileAudit,
        KindAudit, Retirement, SourceTotals,
    };

    fn report() -> AuditReport {
        AuditReport {
            ok: true,
            sources_ok: true,
            artifact_ok: true,
            repo: "acme/tiny".into(),
            commit: "a".repeat(40),
            expected_bytes: 10_026,
            committed_bytes: 10_026,
            transferred_bytes: 12_026,
            adopted_bytes: 0,
            cache_bytes: 0,
            waste_by_reason: BTreeMap::from([(DiscardReason::StalePart, 2000)]),
            metadata_sources: SourceTotals {
                files: 1,
                bytes: 26,
            },
            weight_sources: SourceTotals {
                files: 1,
                bytes: 10_000,
            },
            retirement: Retirement {
                retained_files: 1,
                retained_bytes: 26,
                retired_files: 1,
                retired_bytes: 10_000,
            },
            disk_budget: None,
            components: BTreeMap::from([(
                "ftexpert".into(),
                KindAudit {
                    count: 3,
                    predicted_bytes: 1_234_567,
                    actual_bytes: 1_234_567,
                    pending: 0,
                    pending_bytes: 0,
                },
            )]),
            known_target_total: 1_234_567,
            known_target_from: "plan".into(),
            plan_present: true,
            manifest_present: true,
            omitted_tensors: 0,
            omitted_bytes: 0,
            not_fetched_tensors: 0,
            not_fetched_bytes: 0,
            pending_components: vec![],
            component_problems: vec![],
            reconciliation_error: 0,
            failed_attempts: 0,
            interrupted_attempts: 0,
            unsuccessful_attempts: vec![],
            cache_candidates: vec![],
            uploads: Default::default(),
            publications: vec![],
            deep: false,
            files: vec![FileAudit {
                path: "config.json".into(),
                expected_bytes: 26,
                committed_bytes: 26,
                transferred_bytes: 26,
                attempt_bytes: 26,
                discarded_bytes: 0,
                adopted_bytes: 0,
                cache_bytes: 0,
                verified: true,
                retired: false,
                problem: None,
            }],
            orphans: vec![],
            stale_temp_files: vec![],
            receipts_without_files: vec![],
            files_without_receipts: vec![],
        }
    }

    #[test]
    fn clean_table_has_every_row_and_no_lists() {
        let t = super::render(&report());
        for line in [
            "files (verified/selected)                          1 / 1",
            "metadata sources (files/B)                         1 / 26",
            "weight sources (files/B)                           1 / 10,000",
            "ledger (committed/expected)                   10,026 / 10,026",
            "transferred bytes                             12,026",
            "  stale_part                                   2,000",
            "retained sources (files/B)                         1 / 26",
            "retired sources (files/B)                          1 / 10,000",
            "  ftexpert                 3               1,234,567               1,234,567",
            "known target total (plan)                  1,234,567",
            "reconciliation error                               0",
            "status                      OK",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        assert!(!t.contains(" ! "), "{t}");
    }

    #[test]
    fn problems_are_listed_by_kind() {
        let mut a = report();
        a.ok = false;
        a.reconciliation_error = 4096;
        a.receipts_without_files = vec!["artifact/model.ftw".into()];
        a.files_without_receipts = vec!["artifact/notes.txt".into()];
        a.stale_temp_files = (0..25)
            .map(|i| format!("artifact/x{i}.ftpipe-tmp"))
            .collect();
        a.orphans = vec!["stray.bin".into()];
        a.failed_attempts = 1;
        a.unsuccessful_attempts = vec![AttemptLine {
            path: "w.safetensors".into(),
            outcome: AttemptOutcome::Failed,
            status: Some(200),
            range_start: Some(1000),
            body_bytes: 5,
            error: Some("digest mismatch".into()),
            started_at: String::new(),
        }];
        a.component_problems = vec![ComponentProblem {
            path: "model.ftw".into(),
            problem: "receipt without its file".into(),
        }];
        let t = super::render(&a);
        for line in [
            "reconciliation error                           4,096",
            "receipts without files (1):",
            "  ! artifact/model.ftw",
            "files without receipts (1):",
            "stale temp files (25):",
            "  ... and 5 more",
            "orphans (1):",
            "failed or interrupted attempts (kept as recorded) (1):",
            "  ! w.safetensors: failed, HTTP 200, from byte 1,000, 5 bytes: digest mismatch",
            "  ! model.ftw: receipt without its file",
            "status                      NOT OK",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(super::n(135252480565), "135,252,480,565");
        assert_eq!(super::n(0), "0");
        assert_eq!(super::n(100), "100");
    }
}
