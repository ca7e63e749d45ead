//! `inspect`: what an FTW v1, FTEXPERT1, Q3_PLE_32 or safetensors file
//! holds, read from its header only (a multi-GB file is never loaded). The
//! format is recognised by its magic bytes; Q3 segments have none (raw
//! blocks), so their geometry is taken from the artifact's manifest.
//! Anything else is a clear error.

use std::io::Read;
use std::path::Path;

use serde::Serialize;

use crate::SourceHeader;
use crate::error::{ConvertError, Result};
use ftpipe_artifact::manifest::{ComponentLayout, MANIFEST_FILE, Manifest};

/// One tensor or record field as listed by a header.
#[derive(Debug, Clone, Serialize)]
pub struct InspectedTensor {
    /// Tensor key or field name.
    pub name: String,
    /// Element type.
    pub dtype: String,
    /// Kind (FTW/FTEXPERT1 only: plain, protected, quantized, native).
    pub kind: Option<String>,
    /// Shape.
    pub shape: Vec<u64>,
    /// Absolute offset (FTW, safetensors) or offset inside the record (FTEXPERT1).
    pub offset: u64,
    /// Byte length.
    pub len: u64,
}

/// What a file holds.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// `FTW v1`, `FTEXPERT1` or `safetensors`.
    pub format: String,
    /// File length on disk.
    pub file_len: u64,
    /// Where tensor data starts.
    pub data_offset: u64,
    /// FTEXPERT1: layer, expert count and record size.
    pub layer: Option<u32>,
    /// FTEXPERT1 expert count.
    pub experts: Option<u32>,
    /// FTEXPERT1 record size.
    pub record_size: Option<u64>,
    /// Tensors or record fields.
    pub tensors: Vec<InspectedTensor>,
    /// Q3_PLE_32 segment or global scale: geometry from the artifact's manifest.
    pub q3: Option<Q3Inspection>,
}

/// A Q3_PLE_32 file. Segments are raw blocks with no header, so their
/// geometry comes from the `manifest.json` of the artifact holding them.
#[derive(Debug, Clone, Serialize)]
pub struct Q3Inspection {
    /// Path inside the artifact.
    pub component: String,
    /// PLE layer.
    pub layer: u64,
    /// Segment index (`None` for the global scale).
    pub index: Option<u64>,
    /// Rows (segment).
    pub rows: u64,
    /// Row width (segment).
    pub width: u64,
    /// 14-byte blocks of 32 elements (segment).
    pub blocks: u64,
    /// Size the manifest records.
    pub manifest_size: u64,
    /// The table's global scale G, read from `global_scale.bf16` beside it.
    pub global_scale: Option<f32>,
}

/// Finds the artifact root (a directory holding `manifest.json`) above
/// `path`, and `path` relative to it.
fn artifact_of(path: &Path) -> Option<(std::path::PathBuf, String)> {
    let abs = std::fs::canonicalize(path).ok()?;
    let mut dir = abs.parent();
    for _ in 0..4 {
        let d = dir?;
        if d.join(MANIFEST_FILE).is_file() {
            let rel = abs.strip_prefix(d).ok()?.to_str()?.to_owned();
            return Some((d.to_owned(), rel));
        }
        dir = d.parent();
    }
    None
}

/// Inspects a Q3 segment or global scale through its artifact's manifest.
fn inspect_q3(path: &Path, file_len: u64) -> Result<Inspection> {
    let bad = |message: String| ConvertError::InvalidInput {
        what: "file",
        message: format!("{}: {message}", path.display()),
    };
    let (root, rel) = artifact_of(path).ok_or_else(|| {
        bad(
            "a Q3_PLE_32 file has no header; its geometry comes from the manifest.json of \
             its artifact, and none was found above it"
                .into(),
        )
    })?;
    let bytes = ftpipe_fs::bounded::read_bounded_nofollow(
        &root.join(MANIFEST_FILE),
        ftpipe_artifact::verify::MAX_MANIFEST_BYTES,
    )
    .map_err(ConvertError::Read)?;
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        bad(format!(
            "cannot parse {}: {e}",
            root.join(MANIFEST_FILE).display()
        ))
    })?;
    let c = m
        .component(&rel)
        .ok_or_else(|| bad(format!("{rel} is not a component of {}", root.display())))?;
    let scale_of = |layer: u64| {
        let p = root.join(format!("ple/layer_{layer:03}/global_scale.bf16"));
        ftpipe_fs::bounded::read_bounded_nofollow(&p, crate::write::MAX_GLOBAL_SCALE_BYTES)
            .ok()
            .and_then(|b| ftpipe_formats::Q3GlobalScale::from_bytes(&b).ok())
            .map(|g| g.value().to_f32())
    };
    let q3 = match c.layout {
        ComponentLayout::Q3Segment {
            layer,
            index,
            rows,
            width,
        } => Q3Inspection {
            component: rel.clone(),
            layer,
            index: Some(index),
            rows,
            width,
            blocks: rows.saturating_mul(width) / 32,
            manifest_size: c.size,
            global_scale: scale_of(layer),
        },
        ComponentLayout::Q3GlobalScale { layer, .. } => Q3Inspection {
            component: rel.clone(),
            layer,
            index: None,
            rows: 0,
            width: 0,
            blocks: 0,
            manifest_size: c.size,
            global_scale: scale_of(layer),
        },
        _ => return Err(bad(format!("{rel} is not a Q3_PLE_32 component"))),
    };
    if file_len != c.size {
        return Err(bad(format!(
            "{file_len} bytes, the manifest records {} for {rel}",
            c.size
        )));
    }
    let format = if q3.index.is_some() {
        "Q3_PLE_32 segment"
    } else {
        "Q3_PLE_32 global scale"
    };
    Ok(Inspection {
        format: format.into(),
        file_len,
        data_offset: 0,
        layer: None,
        experts: None,
        record_size: None,
        tensors: Vec::new(),
        q3: Some(q3),
    })
}

fn from_format(path: &Path, e: ftpipe_formats::error::FormatError) -> ConvertError {
    ConvertError::InvalidInput {
        what: "file",
        message: format!("{}: {e}", path.display()),
    }
}

fn entries(list: &[ftpipe_formats::entry::Entry]) -> Vec<InspectedTensor> {
    list.iter()
        .map(|e| InspectedTensor {
            name: e.key().to_owned(),
            dtype: e.dtype().name().to_owned(),
            kind: Some(format!("{:?}", e.kind()).to_lowercase()),
            shape: e.shape().to_vec(),
            offset: e.offset(),
            len: e.len(),
        })
        .collect()
}

/// Inspects `path` by its magic bytes.
pub fn inspect(path: &Path) -> Result<Inspection> {
    let io = |e| ConvertError::io("read", path, e);
    // A FIFO or device given by mistake is refused, never waited on; a
    // link is followed (an HF cache snapshot entry is one).
    let open = || ftpipe_fs::bounded::open_regular(path, ftpipe_fs::bounded::Links::Follow);
    let mut file = open()?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut magic = [0u8; 9];
    let got = file.read(&mut magic).map_err(io)?;
    let reopen = || open().map_err(ConvertError::from);
    if magic[..got].starts_with(&ftpipe_formats::ftw::FTW_MAGIC) {
        let h = ftpipe_formats::ftw::FtwHeader::read_from(reopen()?)
            .map_err(|e| from_format(path, e))?;
        h.check_file_len(file_len)
            .map_err(|e| from_format(path, e))?;
        return Ok(Inspection {
            format: "FTW v1".into(),
            file_len,
            data_offset: h.data_offset(),
            layer: None,
            experts: None,
            record_size: None,
            tensors: entries(h.entries()),
            q3: None,
        });
    }
    if got == magic.len() && magic == ftpipe_formats::ftexpert::FTEXPERT_MAGIC {
        let l = ftpipe_formats::ftexpert::ExpertLayout::read_from(reopen()?)
            .map_err(|e| from_format(path, e))?;
        l.check_file_len(file_len)
            .map_err(|e| from_format(path, e))?;
        return Ok(Inspection {
            format: "FTEXPERT1".into(),
            file_len,
            data_offset: l.data_offset(),
            layer: Some(l.layer()),
            experts: Some(l.expert_count()),
            record_size: Some(l.record_size()),
            tensors: entries(l.fields()),
            q3: None,
        });
    }
    // Chooses the reader only: a name that is not UTF-8 is no Q3 file name.
    let fname = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if fname.ends_with(".q3") || fname == "global_scale.bf16" {
        return inspect_q3(path, file_len);
    }
    let name = path.display().to_string();
    let header =
        SourceHeader::read(path, &name)
            .map_err(io)?
            .map_err(|e| ConvertError::InvalidInput {
                what: "file",
                message: format!(
                    "not FTW v1 or FTEXPERT1 (no magic), and not valid safetensors: {e}"
                ),
            })?;
    Ok(Inspection {
        format: "safetensors".into(),
        file_len,
        data_offset: 8 + header.json_len(),
        layer: None,
        experts: None,
        record_size: None,
        tensors: header
            .tensors()
            .iter()
            .map(|t| InspectedTensor {
                name: t.name().to_owned(),
                dtype: format!("{:?}", t.dtype()),
                kind: None,
                shape: t.shape().to_vec(),
                offset: t.offset(),
                len: t.len(),
            })
            .collect(),
        q3: None,
    })
}
