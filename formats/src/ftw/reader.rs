//! FTW validating reader: header parse (from bytes or any `Read`) and a
//! zero-copy view over a whole file held in memory or mapped.

use std::collections::HashMap;
use std::io::Read;

use super::{FTW_FIXED_HEADER_LEN, FTW_MAGIC, FTW_VERSION, MAX_FTW_INDEX_LEN, MAX_FTW_TENSORS};
use crate::cursor::{Cursor, check_zero};
use crate::dtype::{PAGE, round_up};
use crate::entry::{self, Entry};
use crate::error::{FormatError, Result};

/// The fixed header as stored, before semantic checks.
struct RawFtwHeader {
    version: u32,
    tensor_count: u32,
    index_len: u64,
    data_offset: u64,
    total_len: u64,
}

impl RawFtwHeader {
    fn read(cur: &mut Cursor<'_>) -> Result<Self> {
        let magic = cur.array::<8>("FTW magic")?;
        if magic != FTW_MAGIC {
            return Err(FormatError::BadMagic {
                format: "FTW",
                found: magic.to_vec(),
            });
        }
        Ok(RawFtwHeader {
            version: cur.u32("FTW version")?,
            tensor_count: cur.u32("FTW tensor count")?,
            index_len: cur.u64("FTW index length")?,
            data_offset: cur.u64("FTW data offset")?,
            total_len: cur.u64("FTW total length")?,
        })
    }

    /// Checks that need only the fixed header; returns `data_offset`.
    fn check(&self) -> Result<u64> {
        if self.version != FTW_VERSION {
            return Err(FormatError::UnsupportedVersion {
                format: "FTW",
                version: self.version,
            });
        }
        if self.tensor_count > MAX_FTW_TENSORS {
            return Err(FormatError::TooMany {
                what: "FTW tensor",
                count: self.tensor_count.into(),
                max: MAX_FTW_TENSORS.into(),
            });
        }
        if self.index_len > MAX_FTW_INDEX_LEN {
            return Err(FormatError::TooLong {
                what: "FTW index",
                len: self.index_len,
                max: MAX_FTW_INDEX_LEN,
            });
        }
        // index_len is bounded, so this cannot overflow.
        let expected = round_up(FTW_FIXED_HEADER_LEN + self.index_len, PAGE).unwrap_or(u64::MAX);
        if self.data_offset != expected {
            return Err(FormatError::DataOffsetMismatch {
                expected,
                found: self.data_offset,
            });
        }
        Ok(expected)
    }
}

/// A validated FTW header and tensor index.
#[derive(Debug, Clone)]
pub struct FtwHeader {
    entries: Vec<Entry>,
    by_key: HashMap<String, usize>,
    data_offset: u64,
    total_len: u64,
}

impl TryFrom<&[u8]> for FtwHeader {
    type Error = FormatError;

    /// Parse from the file's first `data_offset` (or more) bytes.
    fn try_from(bytes: &[u8]) -> Result<Self> {
        let mut cur = Cursor::new(bytes, 0);
        let raw = RawFtwHeader::read(&mut cur)?;
        let data_offset = raw.check()?;
        let index = cur.take(raw.index_len, "FTW index")?;
        let mut icur = Cursor::new(index, FTW_FIXED_HEADER_LEN);
        let (entries, end) = entry::parse(&mut icur, raw.tensor_count.into(), data_offset, PAGE)?;
        if icur.remaining() != 0 {
            return Err(FormatError::IndexTrailingBytes {
                extra: icur.remaining() as u64,
            });
        }
        let pad_start = FTW_FIXED_HEADER_LEN + raw.index_len;
        let pad = cur.take(data_offset - pad_start, "FTW header padding")?;
        check_zero(pad, pad_start)?;
        let expected = round_up(end, PAGE).ok_or_else(|| FormatError::Overflow {
            what: "FTW total length".into(),
        })?;
        if raw.total_len != expected {
            return Err(FormatError::TotalLenMismatch {
                expected,
                found: raw.total_len,
            });
        }
        let by_key = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key().to_owned(), i))
            .collect();
        Ok(FtwHeader {
            entries,
            by_key,
            data_offset,
            total_len: expected,
        })
    }
}

impl FtwHeader {
    /// Parse from the file's first `data_offset` (or more) bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::try_from(bytes)
    }

    /// Read and validate only the header from `r` (positioned at offset 0):
    /// reads exactly `data_offset` bytes, never the tensor data. Follow with
    /// [`FtwHeader::check_file_len`].
    pub fn read_from(mut r: impl Read) -> Result<Self> {
        let mut fixed = [0u8; FTW_FIXED_HEADER_LEN as usize];
        read_exact(&mut r, &mut fixed, 0)?;
        let data_offset = RawFtwHeader::read(&mut Cursor::new(&fixed, 0))?.check()?;
        let mut buf = fixed.to_vec();
        buf.resize(data_offset as usize, 0);
        read_exact(&mut r, &mut buf[fixed.len()..], FTW_FIXED_HEADER_LEN)?;
        Self::try_from(buf.as_slice())
    }

    /// Check the actual file length against the header's total length.
    pub fn check_file_len(&self, len: u64) -> Result<()> {
        if len != self.total_len {
            return Err(FormatError::FileLenMismatch {
                expected: self.total_len,
                found: len,
            });
        }
        Ok(())
    }

    /// Tensors in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Look up a tensor by key.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.by_key.get(key).map(|&i| &self.entries[i])
    }

    /// Offset of the first tensor (= header length including padding).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Exact file length.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }
}

/// `read_exact` that reports a short read as `Truncated`.
fn read_exact(r: &mut impl Read, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(FormatError::Truncated {
                    what: "FTW header",
                    offset,
                    needed: buf.len() as u64,
                    available: got as u64,
                });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A validated, zero-copy view of a whole FTW file.
#[derive(Debug, Clone)]
pub struct FtwView<'a> {
    header: FtwHeader,
    bytes: &'a [u8],
}

/// One tensor of an [`FtwView`]: its index entry and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct FtwTensor<'a> {
    /// Index entry.
    pub entry: &'a Entry,
    /// Exactly `entry.len()` bytes, borrowed from the file.
    pub data: &'a [u8],
}

impl<'a> FtwView<'a> {
    /// Validate the header, the file length, and that all padding is zero.
    pub fn new(bytes: &'a [u8]) -> Result<Self> {
        let header = FtwHeader::parse(bytes)?;
        header.check_file_len(bytes.len() as u64)?;
        let mut prev = header.data_offset;
        for e in &header.entries {
            // Offsets are validated and within total_len == bytes.len().
            check_zero(&bytes[prev as usize..e.offset() as usize], prev)?;
            prev = e.end();
        }
        check_zero(&bytes[prev as usize..], prev)?;
        Ok(FtwView { header, bytes })
    }

    /// The validated header.
    pub fn header(&self) -> &FtwHeader {
        &self.header
    }

    /// A tensor by key.
    pub fn tensor(&self, key: &str) -> Option<FtwTensor<'_>> {
        self.header.get(key).map(|e| self.slice(e))
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> impl Iterator<Item = FtwTensor<'_>> {
        self.header.entries.iter().map(|e| self.slice(e))
    }

    fn slice<'s>(&'s self, e: &'s Entry) -> FtwTensor<'s> {
        FtwTensor {
            entry: e,
            data: &self.bytes[e.offset() as usize..e.end() as usize],
        }
    }
}
