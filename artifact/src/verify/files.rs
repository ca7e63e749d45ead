//! Per-component checks: the file on disk against its manifest entry.
//!
//! Only headers are read (through a `BufReader`; the format crate bounds
//! how much a header may claim), so a quick verify of a 100 GB artifact
//! costs a few stats and a few KiB per component. The `deep` hash streams
//! the file with the same overlapped reader the fetch stage uses
//! ([`ftpipe_fs::overlapped::read_prefix`]).

use std::fs::{File, FileType};
use std::io::{BufReader, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use ftpipe_formats::{ExpertLayout, FtwHeader, Q3GlobalScale, TensorDesc};
use ftpipe_fs::paths::safe_join;

use super::{Findings, check};
use crate::manifest::{ComponentLayout, Manifest, ManifestComponent};

/// Bytes read from a global scale record: one more than valid, so a long
/// file is reported as such without reading it all.
const SCALE_READ_LIMIT: u64 = 3;

/// A file type in words, for messages.
pub(crate) fn file_kind(ft: FileType) -> &'static str {
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// Checks component `c` (whose path is valid and canonical) in `dir`.
pub(crate) fn check_component(
    dir: &Path,
    c: &ManifestComponent,
    m: &Manifest,
    deep: bool,
    found: &mut Findings,
) {
    let name = c.path.as_str();
    let p = Some(name);
    let path = match safe_join(dir, name) {
        Ok(path) => path,
        Err(e) => {
            // The path is valid, so this is a symlink on the way to it.
            found.fail(p, check::NOT_REGULAR_FILE, format!("refused: {e}"));
            return;
        }
    };
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            found.fail(
                p,
                check::MISSING,
                format!(
                    "{name} is not on disk; the manifest lists it with {} bytes",
                    c.size
                ),
            );
            return;
        }
        Err(e) => {
            found.fail(p, check::IO, format!("cannot stat {name}: {e}"));
            return;
        }
    };
    if !meta.is_file() {
        found.fail(
            p,
            check::NOT_REGULAR_FILE,
            format!(
                "{name} is a {}, expected a regular file",
                file_kind(meta.file_type())
            ),
        );
        return;
    }
    let len = meta.len();
    if len != c.size {
        found.fail(
            p,
            check::SIZE,
            format!("{name}: expected {} bytes (manifest), found {len}", c.size),
        );
    } else if deep && is_hex64(&c.sha256) {
        // A malformed recorded digest is already a `digest_format` failure;
        // one in upper case is still hashed, and differs from the result.
        match sha256_file(&path, len) {
            Ok(actual) if actual == c.sha256 => {}
            Ok(actual) => found.fail(
                p,
                check::SHA256,
                format!("{name}: expected {}, found {actual}", c.sha256),
            ),
            Err(e) => found.fail(p, check::IO, format!("cannot hash {name}: {e}")),
        }
    }
    match &c.layout {
        ComponentLayout::Ftw { tensors } => check_ftw(&path, name, len, *tensors, m, found),
        ComponentLayout::Ftexpert {
            layer,
            experts,
            record_size,
            fields,
        } => {
            let want = ExpertWant {
                layer: *layer,
                experts: *experts,
                record_size: *record_size,
                fields,
            };
            check_ftexpert(&path, name, len, &want, found);
        }
        ComponentLayout::Q3GlobalScale { .. } => check_scale(&path, name, found),
        // A segment is headerless: its size (above) is all there is to check
        // without decoding; its geometry is checked in `tree`.
        ComponentLayout::Q3Segment { .. } => {}
    }
}

/// 64 hex digits in either case.
fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Lower-case hex SHA-256 of the first `len` bytes of `path`.
fn sha256_file(path: &Path, len: u64) -> std::io::Result<String> {
    let mut file = ftpipe_fs::nofollow::open_read(path)?;
    let mut hasher = Sha256::new();
    ftpipe_fs::overlapped::read_prefix(&mut file, len, |bytes| hasher.update(bytes))?;
    Ok(hex::encode(hasher.finalize()))
}

/// A descriptor in one line: `key dtype kind [shape]`.
fn describe(d: &TensorDesc) -> String {
    format!("{} {} {:?} {:?}", d.key, d.dtype.name(), d.kind, d.shape)
}

/// Compares descriptors in order; `None` if equal, else the first
/// difference and how many positions differ.
fn first_difference<'a>(
    found: impl ExactSizeIterator<Item = &'a TensorDesc>,
    want: &[TensorDesc],
    what: &str,
) -> Option<String> {
    let n = found.len();
    if n != want.len() {
        return Some(format!(
            "header has {n} {what}, the manifest {}",
            want.len()
        ));
    }
    let diffs: Vec<(usize, &TensorDesc, &TensorDesc)> = found
        .zip(want)
        .enumerate()
        .filter(|(_, (f, w))| f != w)
        .map(|(i, (f, w))| (i, f, w))
        .collect();
    let (i, f, w) = diffs.first()?;
    Some(format!(
        "{what} #{i}: header has `{}`, the manifest `{}` ({} of {n} differ)",
        describe(f),
        describe(w),
        diffs.len()
    ))
}

fn open(path: &Path, name: &str, found: &mut Findings) -> Option<BufReader<File>> {
    match ftpipe_fs::nofollow::open_read(path) {
        Ok(f) => Some(BufReader::new(f)),
        Err(e) => {
            found.fail(Some(name), check::IO, format!("cannot open {name}: {e}"));
            None
        }
    }
}

fn check_ftw(path: &Path, name: &str, len: u64, tensors: u64, m: &Manifest, found: &mut Findings) {
    let p = Some(name);
    if m.ftw_tensors.len() as u64 != tensors {
        found.fail(
            p,
            check::FTW_INDEX,
            format!(
                "the manifest's layout says {tensors} tensors but it lists {} ftw_tensors",
                m.ftw_tensors.len()
            ),
        );
    }
    let Some(reader) = open(path, name, found) else {
        return;
    };
    let header = match FtwHeader::read_from(reader) {
        Ok(h) => h,
        Err(e) => {
            found.fail(
                p,
                check::FTW_HEADER,
                format!("{name}: header does not parse: {e}"),
            );
            return;
        }
    };
    if let Err(e) = header.check_file_len(len) {
        found.fail(p, check::FTW_HEADER, format!("{name}: {e}"));
    }
    if header.entries().len() as u64 != tensors {
        found.fail(
            p,
            check::FTW_INDEX,
            format!(
                "{name}: header indexes {} tensors, the manifest's layout says {tensors}",
                header.entries().len()
            ),
        );
    } else if let Some(diff) = first_difference(
        header.entries().iter().map(|e| e.desc()),
        &m.ftw_tensors,
        "tensors",
    ) {
        found.fail(p, check::FTW_INDEX, format!("{name}: {diff}"));
    }
}

/// What the manifest says an FTEXPERT1 header holds.
struct ExpertWant<'a> {
    layer: u64,
    experts: u64,
    record_size: u64,
    fields: &'a [TensorDesc],
}

fn check_ftexpert(path: &Path, name: &str, len: u64, want: &ExpertWant<'_>, found: &mut Findings) {
    let p = Some(name);
    let Some(reader) = open(path, name, found) else {
        return;
    };
    let layout = match ExpertLayout::read_from(reader) {
        Ok(l) => l,
        Err(e) => {
            found.fail(
                p,
                check::FTEXPERT_HEADER,
                format!("{name}: header does not parse: {e}"),
            );
            return;
        }
    };
    if let Err(e) = layout.check_file_len(len) {
        found.fail(p, check::FTEXPERT_HEADER, format!("{name}: {e}"));
    }
    let mut diffs = Vec::new();
    let pairs = [
        ("layer", u64::from(layout.layer()), want.layer),
        ("experts", u64::from(layout.expert_count()), want.experts),
        ("record size", layout.record_size(), want.record_size),
    ];
    for (what, header, manifest) in pairs {
        if header != manifest {
            diffs.push(format!("{what}: header {header}, manifest {manifest}"));
        }
    }
    if let Some(d) = first_difference(
        layout.fields().iter().map(|e| e.desc()),
        want.fields,
        "fields",
    ) {
        diffs.push(d);
    }
    if !diffs.is_empty() {
        found.fail(
            p,
            check::FTEXPERT_LAYOUT,
            format!("{name}: {}", diffs.join("; ")),
        );
    }
}

fn check_scale(path: &Path, name: &str, found: &mut Findings) {
    let mut bytes = Vec::new();
    if let Err(e) = ftpipe_fs::nofollow::open_read(path)
        .and_then(|f| f.take(SCALE_READ_LIMIT).read_to_end(&mut bytes))
    {
        found.fail(Some(name), check::IO, format!("cannot read {name}: {e}"));
        return;
    }
    if let Err(e) = Q3GlobalScale::from_bytes(&bytes) {
        found.fail(
            Some(name),
            check::Q3_GLOBAL_SCALE,
            format!("{name}: expected a finite, non-negative 2-byte bf16 scale: {e}"),
        );
    }
}
