//! FTW planning and streaming writer.

use std::io::Write;

use super::{FTW_FIXED_HEADER_LEN, FTW_MAGIC, FTW_VERSION, MAX_FTW_INDEX_LEN, MAX_FTW_TENSORS};
use crate::dtype::{PAGE, round_up};
use crate::entry::{self, Entry, TensorDesc};
use crate::error::{FormatError, Result};
use crate::slots::{Slot, SlotMap, SlotWriter};

/// The complete layout of an FTW file, computed before any data exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FtwLayout {
    entries: Vec<Entry>,
    index_len: u64,
    data_offset: u64,
    total_len: u64,
}

impl FtwLayout {
    /// Lay out `descs` in the given order; checks keys, kinds, dtypes,
    /// shapes and limits exactly as the reader will.
    pub fn plan(descs: Vec<TensorDesc>) -> Result<FtwLayout> {
        if descs.len() as u64 > u64::from(MAX_FTW_TENSORS) {
            return Err(FormatError::TooMany {
                what: "FTW tensor",
                count: descs.len() as u64,
                max: MAX_FTW_TENSORS.into(),
            });
        }
        // Index size depends only on keys and ranks, not on offsets.
        let (probe, _) = entry::plan(descs, 0, 1)?;
        let index_len: u64 = probe.iter().map(Entry::encoded_len).sum();
        if index_len > MAX_FTW_INDEX_LEN {
            return Err(FormatError::TooLong {
                what: "FTW index",
                len: index_len,
                max: MAX_FTW_INDEX_LEN,
            });
        }
        let data_offset = round_up(FTW_FIXED_HEADER_LEN + index_len, PAGE).ok_or_else(|| {
            FormatError::Overflow {
                what: "FTW data offset".into(),
            }
        })?;
        let descs = probe.into_iter().map(|e| e.desc().clone()).collect();
        let (entries, end) = entry::plan(descs, data_offset, PAGE)?;
        let total_len = round_up(end, PAGE).ok_or_else(|| FormatError::Overflow {
            what: "FTW total length".into(),
        })?;
        Ok(FtwLayout {
            entries,
            index_len,
            data_offset,
            total_len,
        })
    }

    /// Exact length of the finished file.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// Offset of the first tensor (= header + index + padding).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The planned index, in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The header bytes: fixed header, index, zero padding to `data_offset`.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.data_offset as usize);
        b.extend_from_slice(&FTW_MAGIC);
        b.extend_from_slice(&FTW_VERSION.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.index_len.to_le_bytes());
        b.extend_from_slice(&self.data_offset.to_le_bytes());
        b.extend_from_slice(&self.total_len.to_le_bytes());
        for e in &self.entries {
            e.write(&mut b);
        }
        b.resize(self.data_offset as usize, 0);
        b
    }

    /// The header and every tensor's place, in index order.
    pub fn slot_map(&self) -> SlotMap {
        SlotMap {
            header: self.header_bytes(),
            slots: self
                .entries
                .iter()
                .map(|e| Slot {
                    name: e.key().to_owned(),
                    offset: e.offset(),
                    len: e.len(),
                })
                .collect(),
            total_len: self.total_len,
        }
    }
}

/// Streams tensor data into an FTW file in index order with bounded memory.
pub struct FtwWriter<W: Write> {
    inner: SlotWriter<W>,
}

impl<W: Write> FtwWriter<W> {
    /// Write the header of `layout` to `w` and get ready for tensor data.
    pub fn new(layout: &FtwLayout, w: W) -> Result<Self> {
        Ok(FtwWriter {
            inner: SlotWriter::new(w, layout.slot_map())?,
        })
    }

    /// Start the next tensor; `key` must be the next one in the index.
    pub fn begin_tensor(&mut self, key: &str) -> Result<()> {
        self.inner.begin(key)
    }

    /// Append a chunk of the open tensor's bytes.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        self.inner.write(chunk)
    }

    /// Close the open tensor; all its bytes must have been written.
    pub fn end_tensor(&mut self) -> Result<()> {
        self.inner.end()
    }

    /// `begin_tensor`, one `write`, `end_tensor`.
    pub fn write_tensor(&mut self, key: &str, data: &[u8]) -> Result<()> {
        self.begin_tensor(key)?;
        self.write(data)?;
        self.end_tensor()
    }

    /// Check every tensor was written, pad to `total_len`, flush, return `w`.
    pub fn finish(self) -> Result<W> {
        self.inner.finish()
    }
}
