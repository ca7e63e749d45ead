//! The reconciliation table printed after fetch and by `audit`.
//!
//! One table (comfy-table, no borders), so every total the audit
//! re-derived sits in the same column and a non-zero reconciliation error
//! is impossible to miss; then one titled list per kind of problem, so
//! what to fix is named by path. The label column is at least 28 wide,
//! values right-aligned in the next, at least 24 wide, a pair's second
//! value after a slash: the `reconciliation error` row has exactly that
//! shape (scripts and tests match it) unless a longer label (a disk
//! budget's, a target total known from the receipts or the manifest)
//! widens the label column, for every row alike, so the values stay in
//! one column.

use comfy_table::{CellAlignment, ColumnConstraint, Table, Width};

use ftpipe_pipeline::audit::{AuditReport, CacheOutcome};
use ftpipe_progress::human;

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

/// Least width of the label column.
const KEY: u16 = 28;
/// Least width of a value column.
const VAL: u16 = 24;
/// Longest problem list printed in full; the rest is counted.
const MAX_LIST: usize = 20;

/// How one column of a borderless table is laid out.
#[derive(Clone, Copy)]
struct Col {
    /// Least width of its content (a longer cell widens the column).
    least: u16,
    align: CellAlignment,
    /// Blanks before each cell (the space between it and the column before).
    gap: u16,
}

impl Col {
    const fn left(least: u16) -> Col {
        Col {
            least,
            align: CellAlignment::Left,
            gap: 0,
        }
    }

    const fn right(least: u16) -> Col {
        Col {
            least,
            align: CellAlignment::Right,
            gap: 0,
        }
    }

    const fn after(self, gap: u16) -> Col {
        Col { gap, ..self }
    }
}

/// A borderless table (comfy-table) of `rows` laid out as `columns` say,
/// trailing blanks trimmed, each line ended by a newline.
fn borderless(rows: Vec<Vec<String>>, columns: &[Col]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut table = Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    table.add_rows(rows);
    for (column, layout) in table.column_iter_mut().zip(columns) {
        column.set_padding((layout.gap, 0));
        column.set_cell_alignment(layout.align);
        column.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(
            layout.least.saturating_add(layout.gap),
        )));
    }
    let mut out = table.trim_fmt();
    out.push('\n');
    out
}

/// The rows of the ledger table: a label and one value, or a pair.
#[derive(Default)]
struct Ledger {
    rows: Vec<Vec<String>>,
}

impl Ledger {
    fn row(&mut self, k: &str, v: &str) {
        self.rows.push(vec![k.to_owned(), v.to_owned()]);
    }

    /// A row with two values: the first right-aligned in the value column,
    /// the second after a slash (so long byte counts never shift the first).
    fn pair(&mut self, k: &str, a: &str, b: &str) {
        self.rows
            .push(vec![k.to_owned(), a.to_owned(), format!(" / {b}")]);
    }

    /// The label column's width: wide enough for every label here and in
    /// `other`, so two parts of one table align.
    fn key_width(&self, other: &Ledger) -> u16 {
        let longest = self
            .rows
            .iter()
            .chain(&other.rows)
            .map(|r| r[0].chars().count())
            .max()
            .unwrap_or(0);
        u16::try_from(longest).unwrap_or(u16::MAX).max(KEY)
    }

    fn render(self, key_width: u16) -> String {
        borderless(
            self.rows,
            &[Col::left(key_width), Col::right(VAL), Col::left(0)],
        )
    }
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

/// Renders the audit: the table (sources, ledger, waste, retirement,
/// uploads; components by kind; known target total, reconciliation
/// error), then the publications, the problem lists and the status line.
pub fn render(a: &AuditReport) -> String {
    let mut out = format!("{} @ {}\n", a.repo, a.commit);
    let (sources, totals) = (source_rows(a), total_rows(a));
    let key_width = sources.key_width(&totals);
    out.push_str(&sources.render(key_width));
    out.push_str(&component_rows(a));
    out.push_str(&totals.render(key_width));
    for p in &a.publications {
        out.push_str(&format!(
            "published ({}) {} @ {}\n",
            p.outcome, p.dest, p.fingerprint
        ));
    }
    problem_lists(&mut out, a);
    out.push_str(&status_line(a));
    out
}

/// The verdict: OK, NOT OK, or in progress while a run holds DIR's lock
/// (its unfinished work is no failure).
fn status_line(a: &AuditReport) -> String {
    match (&a.live_run, a.ok) {
        (Some(live), _) => format!(
            "status                      IN PROGRESS (a run, pid {}, holds {}; audit again once \
             it ends)\n",
            live.pid,
            live.lock.display()
        ),
        (None, true) => "status                      OK\n".to_owned(),
        (None, false) => "status                      NOT OK\n".to_owned(),
    }
}

/// The rows about sources, the ledger, waste, retirement and uploads.
fn source_rows(a: &AuditReport) -> Ledger {
    let mut t = Ledger::default();
    let verified = a.files.iter().filter(|f| f.verified).count();
    t.pair(
        "files (verified/selected)",
        &verified.to_string(),
        &a.files.len().to_string(),
    );
    if a.pulled() {
        // A pulled DIR's files are the artifact's components, fetched
        // into DIR/artifact: there are no sources.
        let (files, bytes) = (
            a.metadata_sources.files + a.weight_sources.files,
            a.metadata_sources.bytes + a.weight_sources.bytes,
        );
        t.pair(
            "artifact files (n/size)",
            &files.to_string(),
            &human::bytes(bytes),
        );
    } else {
        for (k, s) in [
            ("metadata sources (n/size)", a.metadata_sources),
            ("weight sources (n/size)", a.weight_sources),
        ] {
            t.pair(k, &s.files.to_string(), &human::bytes(s.bytes));
        }
    }
    t.pair(
        "ledger (committed/expected)",
        &n(a.committed_bytes),
        &n(a.expected_bytes),
    );
    if a.adopted_bytes > 0 {
        t.row("adopted bytes", &n(a.adopted_bytes));
    }
    if a.xet.terms > 0 {
        t.row(
            "Xet storage: compressed fetched",
            &n(a.xet.compressed_bytes),
        );
        t.pair(
            "Xet bytes (decoded/outside the span)",
            &n(a.xet.decoded_bytes),
            &n(a.xet.skipped_bytes),
        );
    }
    if a.xet.reused_terms > 0 {
        // Decoded bytes read back from the files of an earlier fetch
        // (counted in the decoded bytes above, not fetched from the CAS).
        t.rows.push(vec![
            "reused from the previous revision".to_owned(),
            n(a.xet.reused_bytes),
            match a.xet.reused_terms {
                1 => " bytes in 1 term".to_owned(),
                terms => format!(" bytes in {terms} terms"),
            },
        ]);
    }
    if a.cache_bytes > 0 || !a.cache_candidates.is_empty() {
        t.row("adopted from HF cache", &n(a.cache_bytes));
        let rejected = a
            .cache_candidates
            .iter()
            .filter(|c| c.outcome == CacheOutcome::Rejected)
            .count();
        t.row("  cache files rejected", &rejected.to_string());
    }
    t.row("transferred bytes", &n(a.transferred_bytes));
    t.row("waste", &n(a.waste_by_reason.values().sum()));
    for (reason, bytes) in &a.waste_by_reason {
        t.row(&format!("  {reason}"), &n(*bytes));
    }
    retirement_and_upload_rows(&mut t, a);
    if a.interrupted_attempts > 0 {
        t.row("interrupted attempts", &a.interrupted_attempts.to_string());
    }
    t
}

/// The rows about retired sources, the disk budget, failed attempts and
/// uploads.
fn retirement_and_upload_rows(t: &mut Ledger, a: &AuditReport) {
    let r = &a.retirement;
    if !a.pulled() {
        t.pair(
            "retained sources (n/size)",
            &r.retained_files.to_string(),
            &human::bytes(r.retained_bytes),
        );
        t.pair(
            "retired sources (n/size)",
            &r.retired_files.to_string(),
            &human::bytes(r.retired_bytes),
        );
        if r.punched_files > 0 {
            t.pair(
                "punched to PLE spans (n/size out)",
                &r.punched_files.to_string(),
                &human::bytes(r.punched_bytes),
            );
        }
    }
    if let Some(b) = &a.disk_budget {
        t.pair(
            "disk budget (budget/peak held)",
            &human::bytes(b.budget),
            &human::bytes(b.peak_held),
        );
    }
    t.row("failed attempts", &a.failed_attempts.to_string());
    let u = &a.uploads;
    if u.requests > 0 {
        t.pair(
            "uploads (verified/open)",
            &u.verified.to_string(),
            &u.in_progress.to_string(),
        );
        t.pair(
            "found at key (reused proven/sent again)",
            &u.reused_proven.to_string(),
            &u.replaced_unproven.to_string(),
        );
        t.pair(
            "upload parts (acked/size)",
            &u.parts.to_string(),
            &human::bytes(u.part_bytes),
        );
        t.pair(
            "upload requests (all/failed)",
            &u.requests.to_string(),
            &u.failed_requests.to_string(),
        );
        t.row("upload bytes sent", &human::bytes(u.sent_bytes));
    }
}

/// The components by kind: count, predicted and actual bytes.
fn component_rows(a: &AuditReport) -> String {
    if a.components.is_empty() {
        return String::new();
    }
    let header = ["component kind", "count", "predicted bytes", "actual bytes"];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for (kind, k) in &a.components {
        rows.push(vec![
            format!("  {kind}"),
            k.count.to_string(),
            n(k.predicted_bytes),
            n(k.actual_bytes),
        ]);
    }
    let columns = [
        Col::left(20),
        Col::right(8),
        Col::right(VAL),
        Col::right(VAL),
    ];
    borderless(rows, &columns)
}

/// The rows after the components: what the artifact leaves out, what is
/// pending, the known target total and the reconciliation error.
fn total_rows(a: &AuditReport) -> Ledger {
    let mut t = Ledger::default();
    if a.omitted_tensors > 0 {
        t.pair(
            "omitted tensors (n/size)",
            &a.omitted_tensors.to_string(),
            &human::bytes(a.omitted_bytes),
        );
    }
    if a.not_fetched_tensors > 0 {
        t.pair(
            "omitted, not fetched (n/size)",
            &a.not_fetched_tensors.to_string(),
            &human::bytes(a.not_fetched_bytes),
        );
    }
    if !a.pending_components.is_empty() {
        let pending: u64 = a.pending_components.iter().map(|p| p.predicted_bytes).sum();
        t.pair(
            "pending components (n/size)",
            &a.pending_components.len().to_string(),
            &human::bytes(pending),
        );
    }
    t.row(
        &format!("known target total ({})", a.known_target_from),
        &n(a.known_target_total),
    );
    t.row("reconciliation error", &n(a.reconciliation_error));
    t
}

/// One titled list per kind of problem.
fn problem_lists(out: &mut String, a: &AuditReport) {
    list(
        out,
        "receipts without files",
        a.receipts_without_files.iter().cloned(),
    );
    list(
        out,
        "files without receipts",
        a.files_without_receipts.iter().cloned(),
    );
    list(out, "stale temp files", a.stale_temp_files.iter().cloned());
    list(out, "orphans", a.orphans.iter().cloned());
    list(
        out,
        "failed or interrupted attempts (kept as recorded)",
        a.unsuccessful_attempts.iter().map(attempt_line),
    );
    list(
        out,
        "pending components",
        a.pending_components
            .iter()
            .map(|p| format!("{} ({}, {} bytes)", p.path, p.kind, n(p.predicted_bytes))),
    );
    list(
        out,
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
}

/// One failed or interrupted attempt as recorded.
fn attempt_line(t: &ftpipe_pipeline::audit::AttemptLine) -> String {
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
    out.push_str(&tensor_rows(i));
    out
}

/// One line per tensor: name, dtype, kind, length @ offset, shape.
fn tensor_rows(i: &ftpipe_convert::inspect::Inspection) -> String {
    let rows = i
        .tensors
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.dtype.clone(),
                t.kind.clone().unwrap_or_else(|| "-".to_owned()),
                n(t.len),
                "@".to_owned(),
                n(t.offset),
                format!("{:?}", t.shape),
            ]
        })
        .collect();
    let columns = [
        Col::left(48).after(2),
        Col::left(8).after(1),
        Col::left(10).after(1),
        Col::right(20).after(1),
        Col::left(1).after(1),
        Col::right(16).after(1),
        Col::left(0).after(1),
    ];
    borderless(rows, &columns)
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
            live_run: None,
            sources_ok: true,
            artifact_ok: true,
            repo: "acme/tiny".into(),
            commit: "a".repeat(40),
            expected_bytes: 10_026,
            committed_bytes: 10_026,
            transferred_bytes: 12_026,
            adopted_bytes: 0,
            cache_bytes: 0,
            xet: Default::default(),
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
                punched_files: 0,
                punched_bytes: 0,
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
                punched_bytes: 0,
                punched: None,
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
            "metadata sources (n/size)                          1 / 26 B",
            "weight sources (n/size)                            1 / 10.0 kB",
            "ledger (committed/expected)                   10,026 / 10,026",
            "transferred bytes                             12,026",
            "  stale_part                                   2,000",
            "retained sources (n/size)                          1 / 26 B",
            "retired sources (n/size)                           1 / 10.0 kB",
            "  ftexpert                 3               1,234,567               1,234,567",
            "known target total (plan)                  1,234,567",
            "reconciliation error                               0",
            "status                      OK",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        assert!(!t.contains(" ! "), "{t}");
    }

    /// A run holding DIR's lock makes the verdict "in progress", whatever
    /// its unfinished work looks like.
    /// Xet bytes read back from an earlier revision's files are shown on
    /// a line of their own, with the terms they were in (none: no line).
    #[test]
    fn reused_xet_bytes_have_their_own_line() {
        assert!(!super::render(&report()).contains("reused from"));
        let mut a = report();
        a.xet.terms = 5;
        a.xet.decoded_bytes = 10_000;
        a.xet.reused_bytes = 7_000;
        a.xet.reused_terms = 3;
        let t = super::render(&a);
        assert!(
            t.lines()
                .any(|l| l.starts_with("reused from the previous revision")
                    && l.ends_with("7,000 bytes in 3 terms")),
            "{t}"
        );
    }

    #[test]
    fn a_live_run_is_in_progress_not_a_verdict() {
        let mut a = report();
        a.ok = false;
        a.live_run = Some(ftpipe_pipeline::LiveRun {
            pid: "4242".into(),
            lock: "d/.ftpipe/lock".into(),
        });
        let t = super::render(&a);
        let status = t.lines().last().unwrap();
        assert!(
            status.starts_with("status                      IN PROGRESS (a run, pid 4242")
                && status.contains("d/.ftpipe/lock"),
            "{t}"
        );
        assert!(!t.contains("NOT OK"), "{t}");
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

    /// "known target total (receipts)" is 29 wide: the label column takes
    /// 29 for every row, so the values stay in one column.
    #[test]
    fn a_longer_label_widens_the_label_column_of_every_row() {
        let mut a = report();
        a.known_target_from = "receipts".into();
        let t = super::render(&a);
        for line in [
            "files (verified/selected)                           1 / 1",
            "transferred bytes                              12,026",
            "known target total (receipts)               1,234,567",
            "reconciliation error                                0",
            "  ftexpert                 3               1,234,567               1,234,567",
            "status                      OK",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
    }

    /// The tensor lines keep their columns: name 48, dtype 8, kind 10,
    /// length 20 and offset 16 wide.
    #[test]
    fn inspection_lists_one_aligned_line_per_tensor() {
        let tensor = |name: &str, kind: Option<&str>, len: u64, offset: u64| {
            ftpipe_convert::inspect::InspectedTensor {
                name: name.into(),
                dtype: "BF16".into(),
                kind: kind.map(Into::into),
                shape: vec![2, 3],
                offset,
                len,
            }
        };
        let i = ftpipe_convert::inspect::Inspection {
            format: "FTW v1".into(),
            file_len: 4096,
            data_offset: 1024,
            layer: None,
            experts: None,
            record_size: None,
            tensors: vec![
                tensor("embed", Some("protected"), 12, 1024),
                tensor("lm_head", None, 1_234_567, 1036),
            ],
            q3: None,
        };
        let expected = [
            "FTW v1  4,096 bytes, data at 1,024".to_owned(),
            format!(
                "  {:<48} {:<8} {:<10} {:>20} @ {:>16} [2, 3]",
                "embed", "BF16", "protected", "12", "1,024"
            ),
            format!(
                "  {:<48} {:<8} {:<10} {:>20} @ {:>16} [2, 3]",
                "lm_head", "BF16", "-", "1,234,567", "1,036"
            ),
        ];
        let t = super::render_inspection(&i);
        assert_eq!(t.lines().collect::<Vec<_>>(), expected, "\n{t}");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(super::n(135252480565), "135,252,480,565");
        assert_eq!(super::n(0), "0");
        assert_eq!(super::n(100), "100");
    }
}
