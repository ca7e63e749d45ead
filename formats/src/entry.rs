//! The index entry shared by FTW's tensor index and FTEXPERT1's record
//! layout table, and the one layout rule both use.
//!
//! Entry bytes: `key_len: u16, key: [u8; key_len], dtype: u8, kind: u8,
//! rank: u8, reserved: u8 = 0, dims: [u64; rank], offset: u64, length: u64`.
//!
//! Layout rule: entry `i` starts at `round_up(end of entry i−1, align)`
//! (the first at `start`), so offsets strictly increase with no gaps beyond
//! alignment padding and no reordering. Readers recompute it exactly.

use std::collections::HashSet;

use crate::cursor::Cursor;
use crate::dtype::{Dtype, MAX_RANK, PAGE, TensorKind, check_name, round_up};
use crate::error::{FormatError, Result};

/// Maximum key (tensor or field name) length in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// A tensor to lay out: what a writer is given before any data exists.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorDesc {
    /// Unique UTF-8 key, 1..=[`MAX_KEY_LEN`] bytes.
    pub key: String,
    /// Element layout.
    pub dtype: Dtype,
    /// Why it is stored this way.
    pub kind: TensorKind,
    /// Logical shape (`[]` is a scalar).
    pub shape: Vec<u64>,
}

impl TensorDesc {
    /// Convenience constructor.
    pub fn new(
        key: impl Into<String>,
        dtype: Dtype,
        kind: TensorKind,
        shape: impl Into<Vec<u64>>,
    ) -> Self {
        TensorDesc {
            key: key.into(),
            dtype,
            kind,
            shape: shape.into(),
        }
    }

    /// Byte length: dtype × shape.
    pub fn byte_len(&self) -> Result<u64> {
        self.dtype.byte_len(&self.key, &self.shape)
    }
}

/// A validated index entry: a descriptor plus its place in the file
/// (FTW: absolute offset; FTEXPERT1: offset within the record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    desc: TensorDesc,
    offset: u64,
    len: u64,
}

impl Entry {
    /// Key.
    pub fn key(&self) -> &str {
        &self.desc.key
    }
    /// Dtype.
    pub fn dtype(&self) -> Dtype {
        self.desc.dtype
    }
    /// Kind.
    pub fn kind(&self) -> TensorKind {
        self.desc.kind
    }
    /// Shape.
    pub fn shape(&self) -> &[u64] {
        &self.desc.shape
    }
    /// Offset of the first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Length in bytes (= dtype × shape).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Always false: zero-length entries are rejected.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
    /// The descriptor.
    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    /// Serialized size of this entry.
    pub(crate) fn encoded_len(&self) -> u64 {
        (2 + self.desc.key.len() + 4 + 8 * self.desc.shape.len() + 16) as u64
    }

    /// Append the serialized entry.
    pub(crate) fn write(&self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&(self.desc.key.len() as u16).to_le_bytes());
        buf.extend_from_slice(self.desc.key.as_bytes());
        buf.extend_from_slice(&[
            self.dtype().code(),
            self.kind().code(),
            self.desc.shape.len() as u8,
            0,
        ]);
        for d in &self.desc.shape {
            buf.extend_from_slice(&d.to_le_bytes());
        }
        buf.extend_from_slice(&self.offset.to_le_bytes());
        buf.extend_from_slice(&self.len.to_le_bytes());
    }
}

/// An entry as stored, before any semantic check.
struct RawEntry<'a> {
    key: &'a [u8],
    dtype: u8,
    kind: u8,
    reserved: u8,
    dims: Vec<u64>,
    offset: u64,
    len: u64,
}

impl<'a> RawEntry<'a> {
    fn read(cur: &mut Cursor<'a>, index: u64) -> Result<Self> {
        let key_len = cur.u16("entry key length")?;
        if usize::from(key_len) > MAX_KEY_LEN {
            return Err(FormatError::NameTooLong {
                index,
                len: key_len.into(),
                max: MAX_KEY_LEN as u64,
            });
        }
        let key = cur.take(key_len.into(), "entry key")?;
        let [dtype, kind, rank, reserved] = cur.array::<4>("entry dtype/kind/rank")?;
        if usize::from(rank) > MAX_RANK {
            return Err(FormatError::RankTooLarge {
                key: String::from_utf8_lossy(key).into_owned(),
                rank: rank.into(),
                max: MAX_RANK as u64,
            });
        }
        let dims = (0..rank)
            .map(|_| cur.u64("entry dims"))
            .collect::<Result<Vec<_>>>()?;
        let offset = cur.u64("entry offset")?;
        let len = cur.u64("entry length")?;
        Ok(RawEntry {
            key,
            dtype,
            kind,
            reserved,
            dims,
            offset,
            len,
        })
    }
}

/// Check a descriptor and return its byte length.
fn check_desc(desc: &TensorDesc, index: u64, seen: &mut HashSet<String>) -> Result<u64> {
    check_name(index, desc.key.as_bytes(), MAX_KEY_LEN)?;
    if !desc.kind.allows(desc.dtype) {
        return Err(FormatError::KindDtypeMismatch {
            key: desc.key.clone(),
            kind: desc.kind,
            dtype: desc.dtype,
        });
    }
    let len = desc.byte_len()?;
    if len == 0 {
        return Err(FormatError::EmptyTensor {
            key: desc.key.clone(),
        });
    }
    if !seen.insert(desc.key.clone()) {
        return Err(FormatError::DuplicateName {
            key: desc.key.clone(),
        });
    }
    Ok(len)
}

fn overflow(key: &str) -> FormatError {
    FormatError::Overflow {
        what: format!("end of {key:?}"),
    }
}

/// Writer side: lay out `descs` from `start` with alignment `align`.
/// Returns the entries and the end of the last one (`start` if none).
pub(crate) fn plan(descs: Vec<TensorDesc>, start: u64, align: u64) -> Result<(Vec<Entry>, u64)> {
    let mut seen = HashSet::with_capacity(descs.len());
    let mut end = start;
    let mut out = Vec::with_capacity(descs.len());
    for (i, desc) in descs.into_iter().enumerate() {
        let len = check_desc(&desc, i as u64, &mut seen)?;
        let offset = round_up(end, align).ok_or_else(|| overflow(&desc.key))?;
        end = offset.checked_add(len).ok_or_else(|| overflow(&desc.key))?;
        out.push(Entry { desc, offset, len });
    }
    Ok((out, end))
}

/// Reader side: parse `count` entries and check each against the layout
/// rule. Returns the entries and the end of the last one.
pub(crate) fn parse(
    cur: &mut Cursor<'_>,
    count: u64,
    start: u64,
    align: u64,
) -> Result<(Vec<Entry>, u64)> {
    let mut seen = HashSet::new();
    let mut end = start;
    let mut out = Vec::new();
    for i in 0..count {
        let raw = RawEntry::read(cur, i)?;
        let key = check_name(i, raw.key, MAX_KEY_LEN)?;
        let dtype = Dtype::from_code(raw.dtype).ok_or_else(|| FormatError::UnknownDtype {
            key: key.clone(),
            code: raw.dtype,
        })?;
        let kind = TensorKind::from_code(raw.kind).ok_or_else(|| FormatError::UnknownKind {
            key: key.clone(),
            code: raw.kind,
        })?;
        if raw.reserved != 0 {
            return Err(FormatError::ReservedNonZero {
                field: format!("entry {key:?} reserved byte"),
                found: raw.reserved.into(),
            });
        }
        let desc = TensorDesc {
            key,
            dtype,
            kind,
            shape: raw.dims,
        };
        let len = check_desc(&desc, i, &mut seen)?;
        if raw.len != len {
            return Err(FormatError::LengthMismatch {
                key: desc.key,
                expected: len,
                found: raw.len,
            });
        }
        if align == PAGE && raw.offset % PAGE != 0 {
            return Err(FormatError::OffsetNotPageAligned {
                key: desc.key,
                offset: raw.offset,
            });
        }
        let expected = round_up(end, align).ok_or_else(|| overflow(&desc.key))?;
        if raw.offset != expected {
            return Err(FormatError::OffsetMismatch {
                key: desc.key,
                expected,
                found: raw.offset,
            });
        }
        end = expected
            .checked_add(len)
            .ok_or_else(|| overflow(&desc.key))?;
        out.push(Entry {
            desc,
            offset: expected,
            len,
        });
    }
    Ok((out, end))
}
