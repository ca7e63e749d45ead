//! The status block `ftpipe verify` prints (`--json` prints the report).
//!
//! Short by design: one line of verdict, the artifact's shape, then one
//! `!` line per failed check. Every string that came from the artifact
//! (paths, fingerprints, messages quoting file names) is escaped before it
//! reaches the terminal, so a hostile file name cannot emit control codes.

use crate::table::n;
use ftpipe_artifact::verify::{Failure, VerifyReport};

/// Hex digits of the fingerprint shown in the status line.
const FINGERPRINT_SHOWN: usize = 12;

/// `s` with control characters escaped (`\u{1b}`), safe to print.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn short_fingerprint(fp: &str) -> String {
    let shown: String = fp.chars().take(FINGERPRINT_SHOWN).collect();
    if shown.len() < fp.len() {
        format!("{}…", clean(&shown))
    } else {
        clean(&shown)
    }
}

/// One failure line: `  ! path: check: message`, without repeating the
/// path when the message already starts with it.
fn failure_line(f: &Failure) -> String {
    match &f.component {
        Some(c) => {
            let msg = f
                .message
                .strip_prefix(c.as_str())
                .and_then(|rest| rest.strip_prefix(": "))
                .unwrap_or(&f.message);
            format!("  ! {}: {}: {}\n", clean(c), clean(&f.check), clean(msg))
        }
        None => format!("  ! {}: {}\n", clean(&f.check), clean(&f.message)),
    }
}

/// Renders the report as a short status block.
pub fn render(r: &VerifyReport) -> String {
    let mut out = String::new();
    let row = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<20}{v}\n"));
    let problems = r.failures.len();
    let status = match (&r.fingerprint, r.ok) {
        (Some(fp), true) => format!("OK (fingerprint {})", short_fingerprint(fp)),
        (None, true) => "OK".to_owned(),
        (_, false) => format!(
            "FAILED ({problems} problem{})",
            if problems == 1 { "" } else { "s" }
        ),
    };
    row(&mut out, "artifact", clean(&r.dir));
    row(&mut out, "status", status);
    if !r.ok
        && let Some(fp) = &r.fingerprint
    {
        row(&mut out, "fingerprint", short_fingerprint(fp));
    }
    row(
        &mut out,
        "check",
        if r.deep {
            "deep (headers, sizes and SHA-256 of every component)".to_owned()
        } else {
            "quick (headers and sizes; --deep also hashes)".to_owned()
        },
    );
    let experts = match (r.expert_layers, r.experts_per_layer) {
        (0, _) => "none".to_owned(),
        (layers, Some(per)) => format!("{layers} layers × {per} experts"),
        (layers, None) => format!("{layers} layers, {} experts in all", n(r.experts)),
    };
    row(&mut out, "experts", experts);
    if r.ple_layers > 0 {
        row(&mut out, "PLE layers", r.ple_layers.to_string());
    }
    row(&mut out, "file-tier layers", r.file_tier_layers.to_string());
    row(&mut out, "resident layers", r.resident_layers.to_string());
    row(&mut out, "components", r.components.to_string());
    row(&mut out, "bytes", n(r.bytes));
    for f in &r.failures {
        out.push_str(&failure_line(f));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> VerifyReport {
        VerifyReport {
            ok: true,
            dir: "out/artifact".into(),
            fingerprint: Some("3f2a".repeat(16)),
            schema: Some("ftpipe.manifest/1".into()),
            expert_layers: 48,
            experts: 768,
            experts_per_layer: Some(16),
            ple_layers: 0,
            file_tier_layers: 45,
            resident_layers: 3,
            components: 57,
            bytes: 1_234_567,
            deep: false,
            failures: Vec::new(),
        }
    }

    #[test]
    fn ok_block_shows_shape_and_short_fingerprint() {
        let s = render(&report());
        assert!(
            s.contains("status              OK (fingerprint 3f2a3f2a3f2a…)\n"),
            "{s}"
        );
        assert!(
            s.contains("experts             48 layers × 16 experts\n"),
            "{s}"
        );
        assert!(s.contains("file-tier layers    45\n"), "{s}");
        assert!(s.contains("bytes               1,234,567\n"), "{s}");
        assert!(!s.contains('!'), "{s}");
    }

    #[test]
    fn failures_are_listed_once_each_and_escaped() {
        let mut r = report();
        r.ok = false;
        r.experts_per_layer = None;
        r.failures = vec![
            Failure {
                component: Some("experts/layer_001.ftexpert".into()),
                check: "sha256".into(),
                message: "experts/layer_001.ftexpert: expected aa, found bb".into(),
            },
            Failure {
                component: Some("evil\u{1b}[2J".into()),
                check: "unexpected_file".into(),
                message: "unexpected file evil\u{1b}[2J".into(),
            },
        ];
        let s = render(&r);
        assert!(
            s.contains("status              FAILED (2 problems)\n"),
            "{s}"
        );
        assert!(
            s.contains("experts             48 layers, 768 experts in all\n"),
            "{s}"
        );
        assert!(
            s.contains("  ! experts/layer_001.ftexpert: sha256: expected aa, found bb\n"),
            "{s}"
        );
        assert!(!s.contains('\u{1b}'), "{s}");
        assert!(s.contains("evil\\u{1b}[2J"), "{s}");
    }
}
