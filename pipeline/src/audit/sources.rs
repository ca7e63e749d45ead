//! The source half of the audit: the byte ledger and download receipts of
//! every selected file against `DIR/source/`.
//!
//! Kept apart from the artifact half because its rules are the fetch's
//! (ledger invariants, git-sha1 versus sha256 identities, `.part` files of
//! in-progress downloads), and a retired source — deleted on purpose after
//! conversion, its receipt kept as history — is the one case where a
//! receipt without its file is correct.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;

use tokio::task::block_in_place;

use ftpipe_receipts::{FileRow, KeptMethod, LedgerRow, PunchRecord, Receipt, Store};

use super::{FileAudit, Retirement, SourceTotals, walk};
use crate::error::{PipelineError, Result};
use ftpipe_fs::paths::{CACHE_TEMP_SUFFIX, PART_SUFFIX, safe_join};
use ftpipe_hub::identity::expected_identity;
use ftpipe_hub::identity::hash_file;

/// What the source half found.
pub(super) struct SourcePart {
    pub lines: Vec<FileAudit>,
    pub error: u64,
    pub metadata: SourceTotals,
    pub weight: SourceTotals,
    pub retirement: Retirement,
    pub orphans: Vec<String>,
    pub stale_temp_files: Vec<String>,
    pub receipts_without_files: Vec<String>,
    pub files_without_receipts: Vec<String>,
}

/// Whether a source path holds weights (everything else is metadata).
pub(crate) fn is_weight(path: &str) -> bool {
    path.ends_with(".safetensors")
}

/// What the store claims of the sources, read once.
struct Claims {
    ledger: HashMap<String, LedgerRow>,
    receipts: BTreeMap<String, Receipt>,
    retired: BTreeSet<String>,
    attempt_bytes: HashMap<String, u64>,
    /// Live punches, by path.
    punches: BTreeMap<String, PunchRecord>,
}

/// Audits every selected source file against its ledger row, its receipt
/// and the disk.
pub(super) async fn audit_sources(
    store: &Store,
    source_root: &Path,
    deep: bool,
) -> Result<SourcePart> {
    let files = store.files().await?;
    let claims = Claims {
        ledger: store
            .ledger()
            .await?
            .into_iter()
            .map(|l| (l.path.clone(), l))
            .collect(),
        receipts: store.receipts_by_path().await?,
        retired: store.retired().await?,
        attempt_bytes: store.attempt_bytes().await?,
        punches: store.punches().await?,
    };
    let mut out = SourcePart {
        lines: Vec::new(),
        error: 0,
        metadata: SourceTotals::default(),
        weight: SourceTotals::default(),
        retirement: Retirement::default(),
        orphans: Vec::new(),
        stale_temp_files: Vec::new(),
        receipts_without_files: Vec::new(),
        files_without_receipts: Vec::new(),
    };
    for f in files.iter().filter(|f| f.selected) {
        let totals = if is_weight(&f.path) {
            &mut out.weight
        } else {
            &mut out.metadata
        };
        totals.files += 1;
        totals.bytes += f.size;
        let line = audit_file(&claims, f, source_root, deep, &mut out)?;
        out.lines.push(line);
    }
    sweep_disk(source_root, &files, &claims.receipts, &mut out)?;
    Ok(out)
}

/// One selected file's line: its ledger row reconciled (`transferred =
/// committed + discarded`, `= Σ attempt bytes`, the listing's size), then
/// with a receipt the file on disk ([`check_on_disk`]). Unaccounted bytes
/// go to `out.error`, paths to `out`'s lists.
fn audit_file(
    claims: &Claims,
    f: &FileRow,
    source_root: &Path,
    deep: bool,
    out: &mut SourcePart,
) -> Result<FileAudit> {
    let mut line = FileAudit {
        path: f.path.clone(),
        expected_bytes: f.size,
        committed_bytes: 0,
        transferred_bytes: 0,
        attempt_bytes: claims.attempt_bytes.get(&f.path).copied().unwrap_or(0),
        discarded_bytes: 0,
        adopted_bytes: 0,
        cache_bytes: 0,
        verified: false,
        retired: false,
        punched_bytes: 0,
        punched: None,
        problem: None,
    };
    let Some(l) = claims.ledger.get(&f.path) else {
        line.problem = Some("no ledger row".into());
        out.error += f.size;
        return Ok(line);
    };
    line.committed_bytes = l.committed;
    line.transferred_bytes = l.transferred;
    line.discarded_bytes = l.discarded;
    line.adopted_bytes = l.adopted;
    line.cache_bytes = l.cache;
    // Bytes in come from the network or the cache; each is committed
    // or discarded.
    out.error += (l.transferred + l.cache).abs_diff(l.committed + l.discarded);
    if line.attempt_bytes != l.transferred {
        line.problem = Some(format!(
            "attempts received {} bytes, the ledger says {} transferred",
            line.attempt_bytes, l.transferred
        ));
        out.error += line.attempt_bytes.abs_diff(l.transferred);
    }
    if l.expected != f.size {
        line.problem = Some(format!(
            "ledger expects {} bytes, listing says {}",
            l.expected, f.size
        ));
        out.error += l.expected.abs_diff(f.size);
    }
    let final_path = safe_join(source_root, &f.path)?;
    let on_disk = std::fs::metadata(&final_path);
    let Some(r) = claims.receipts.get(&f.path) else {
        line.problem.get_or_insert_with(|| "not published".into());
        if on_disk.is_ok() {
            out.files_without_receipts
                .push(format!("source/{}", f.path));
        }
        return Ok(line);
    };
    out.error += f.size.abs_diff(l.committed + l.adopted);
    if l.committed + l.adopted != f.size {
        line.problem.get_or_insert_with(|| {
            format!(
                "published, but the ledger holds {} committed + {} adopted of {} bytes",
                l.committed, l.adopted, f.size
            )
        });
    }
    let published = Published {
        file: f,
        receipt: r,
        path: &final_path,
        root: source_root,
        retired: claims.retired.contains(&f.path),
        punch: claims.punches.get(&f.path).filter(|p| p.digest == r.digest),
        layout: &ftpipe_fs::Layout::new(source_root.parent().unwrap_or(source_root)),
    };
    line.verified = check_on_disk(&published, on_disk, deep, &mut line, out)?;
    Ok(line)
}

/// A published source: its listing row, its receipt, where it is.
struct Published<'a> {
    file: &'a FileRow,
    receipt: &'a Receipt,
    path: &'a Path,
    /// `DIR/source`.
    root: &'a Path,
    /// `convert --retire-sources` deleted it on purpose.
    retired: bool,
    /// A budgeted run punched it down to its PLE spans, or copied them
    /// aside and released it (this version).
    punch: Option<&'a PunchRecord>,
    /// The layout of `DIR` (where copies aside live).
    layout: &'a ftpipe_fs::Layout,
}

/// Whether a published source is as its receipt says: retired and absent,
/// or present with the listed size (and digest with `deep`). Problems go
/// to `line`, unaccounted bytes to `out.error`.
fn check_on_disk(
    p: &Published<'_>,
    on_disk: std::io::Result<std::fs::Metadata>,
    deep: bool,
    line: &mut FileAudit,
    out: &mut SourcePart,
) -> Result<bool> {
    let (f, r) = (p.file, p.receipt);
    let m = match on_disk {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && p.retired => {
            line.retired = true;
            out.retirement.retired_files += 1;
            out.retirement.retired_bytes += f.size;
            if r.size != f.size {
                line.problem = Some(format!(
                    "retired; receipt says {} bytes, expected {}",
                    r.size, f.size
                ));
                out.error += r.size.abs_diff(f.size);
            }
            return Ok(line.problem.is_none());
        }
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && let Some(copy) = p.punch.filter(|k| k.method == KeptMethod::CopyAside) =>
        {
            out.retirement.retained_files += 1;
            out.retirement.retained_bytes += copy.kept_bytes;
            return Ok(check_punched(p, copy, deep, line, out));
        }
        Err(_) => {
            line.problem = Some("receipt without its file".into());
            out.receipts_without_files
                .push(format!("source/{}", f.path));
            out.error += f.size;
            return Ok(false);
        }
        Ok(m) => m,
    };
    out.retirement.retained_files += 1;
    out.retirement.retained_bytes += p.punch.map_or(m.len(), |k| k.kept_bytes);
    if m.len() != f.size || r.size != f.size {
        line.problem = Some(format!(
            "size {} on disk, receipt {}, expected {}",
            m.len(),
            r.size,
            f.size
        ));
        out.error += m.len().abs_diff(f.size).max(r.size.abs_diff(f.size));
        return Ok(false);
    }
    if let Some(punch) = p.punch {
        return Ok(check_punched(p, punch, deep, line, out));
    }
    if !deep {
        return Ok(line.problem.is_none());
    }
    let expected = expected_identity(f)?;
    let digest = block_in_place(|| hash_file(p.path, &expected, f.size))
        .map_err(|e| PipelineError::io("hash", p.path, e))?;
    if digest != expected.hex() || digest != r.digest {
        line.problem = Some(format!(
            "{} on disk is {digest}, expected {}",
            expected.kind(),
            expected.hex()
        ));
        out.error += f.size;
        return Ok(false);
    }
    Ok(line.problem.is_none())
}

/// A source punched down to its PLE spans: its punched bytes explained by
/// the punch, and with `deep` each kept range checked by its digest (the
/// whole file's digest no longer applies).
fn check_punched(
    p: &Published<'_>,
    punch: &PunchRecord,
    deep: bool,
    line: &mut FileAudit,
    out: &mut SourcePart,
) -> bool {
    let punched = punch.size.saturating_sub(punch.kept_bytes);
    line.punched_bytes = punched;
    line.punched = Some(match punch.method {
        KeptMethod::Punch => format!(
            "run {} punched {punched} bytes out once every span but the PLE table's was converted (under --disk-budget or --retire-sources); {} bytes kept in {} range(s) until the PLE table is written",
            punch.run_id,
            punch.kept_bytes,
            punch.kept.len()
        ),
        KeptMethod::CopyAside => format!(
            "run {} released the file ({} bytes) once every span but the PLE table's was converted (under --disk-budget or --retire-sources), after copying its {} PLE range(s) ({} bytes) aside to .ftpipe/kept/{} (this volume cannot punch holes), kept until the PLE table is written",
            punch.run_id,
            punch.size,
            punch.kept.len(),
            punch.kept_bytes,
            punch.path
        ),
    });
    out.retirement.punched_files += 1;
    out.retirement.punched_bytes += punched;
    if !deep {
        return line.problem.is_none();
    }
    let checked = match punch.method {
        KeptMethod::Punch => ftpipe_convert::punched::check_kept(p.root, punch),
        KeptMethod::CopyAside => ftpipe_convert::copied::check_copy(p.layout, punch),
    };
    if let Err(e) = checked {
        line.problem = Some(e.to_string());
        out.error += punch.kept_bytes;
        return false;
    }
    line.problem.is_none()
}

/// Every file under `source_root` that is not a listed file: a `.part` of
/// an unpublished listed file is expected; other `.part` and cache temp
/// files are stale; the rest are orphans.
fn sweep_disk(
    source_root: &Path,
    files: &[FileRow],
    receipts: &BTreeMap<String, Receipt>,
    out: &mut SourcePart,
) -> Result<()> {
    let mut on_disk = Vec::new();
    walk(source_root, source_root, &mut on_disk)
        .map_err(|e| PipelineError::io("list", source_root, e))?;
    let known: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    for rel in on_disk {
        if known.contains(rel.as_str()) {
            continue;
        }
        match rel.strip_suffix(PART_SUFFIX) {
            Some(base) if known.contains(base) && !receipts.contains_key(base) => {}
            Some(_) => out.stale_temp_files.push(rel),
            None if rel.ends_with(CACHE_TEMP_SUFFIX) => out.stale_temp_files.push(rel),
            None => out.orphans.push(rel),
        }
    }
    Ok(())
}
