//! The reconciliation table printed after fetch and by `audit`.

use ftpipe_stages::audit::AuditReport;

fn n(v: u64) -> String {
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

/// Renders the audit as a short fixed-width table.
pub fn render(a: &AuditReport) -> String {
    let waste: u64 = a.waste_by_reason.values().sum();
    let verified = a.files.iter().filter(|f| f.verified).count();
    let mut out = String::new();
    let row = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<28}{v:>24}\n"));
    out.push_str(&format!("{} @ {}\n", a.repo, a.commit));
    row(
        &mut out,
        "files (verified/selected)",
        format!("{verified} / {}", a.files.len()),
    );
    row(&mut out, "expected bytes", n(a.expected_bytes));
    row(&mut out, "committed bytes", n(a.committed_bytes));
    if a.adopted_bytes > 0 {
        row(&mut out, "adopted bytes", n(a.adopted_bytes));
    }
    row(&mut out, "transferred bytes", n(a.transferred_bytes));
    row(&mut out, "waste", n(waste));
    for (reason, bytes) in &a.waste_by_reason {
        row(&mut out, &format!("  {reason}"), n(*bytes));
    }
    row(&mut out, "failed attempts", a.failed_attempts.to_string());
    if a.interrupted_attempts > 0 {
        row(
            &mut out,
            "interrupted attempts",
            a.interrupted_attempts.to_string(),
        );
    }
    row(&mut out, "reconciliation error", n(a.reconciliation_error));
    for f in a.files.iter().filter(|f| f.problem.is_some()) {
        out.push_str(&format!(
            "  ! {}: {}\n",
            f.path,
            f.problem.as_deref().unwrap_or_default()
        ));
    }
    for o in &a.orphans {
        out.push_str(&format!("  ! orphan file: {o}\n"));
    }
    for t in &a.stale_temp_files {
        out.push_str(&format!("  ! stale temp file: {t}\n"));
    }
    out.push_str(if a.ok {
        "status                      OK\n"
    } else {
        "status                      NOT OK\n"
    });
    out
}

/// Renders an inspection: format line, then one line per tensor or field.
pub fn render_inspection(i: &ftpipe_stages::inspect::Inspection) -> String {
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
    #[test]
    fn thousands_separators() {
        assert_eq!(super::n(135252480565), "135,252,480,565");
        assert_eq!(super::n(0), "0");
        assert_eq!(super::n(100), "100");
    }
}
