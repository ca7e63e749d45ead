//! `inspect`: what an FTW v1, FTEXPERT1 or safetensors file holds, read
//! from its header only (a multi-GB file is never loaded). The format is
//! recognised by its magic bytes; anything else is a clear error.

use std::io::Read;
use std::path::Path;

use serde::Serialize;

use crate::convert::SourceHeader;
use crate::error::{Result, StageError};

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
}

fn from_format(path: &Path, e: ftpipe_formats::error::FormatError) -> StageError {
    StageError::InvalidInput {
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
    let io = |e| StageError::io("read", path, e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut magic = [0u8; 9];
    let got = file.read(&mut magic).map_err(io)?;
    let reopen = || std::fs::File::open(path).map_err(io);
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
        });
    }
    let name = path.display().to_string();
    let header =
        SourceHeader::read(path, &name)
            .map_err(io)?
            .map_err(|e| StageError::InvalidInput {
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
    })
}
