//! Streaming writer shared by FTW and FTEXPERT1: a planned list of slots
//! (name, offset, length) filled strictly in order, chunk by chunk; and
//! [`SlotMap`], the same plan for a writer that fills the slots in any
//! order at their offsets (the pipelined conversion writes a tensor when
//! its source shard arrives). Both give the same bytes: the header, each
//! slot's bytes at its offset, zeros everywhere else up to the total.
//!
//! Memory is bounded by the caller's chunk size: padding comes from a static
//! zero page. Every misuse (wrong order, too many or too few bytes, writing
//! with nothing open, finishing early) is an error, so a file that
//! `finish` accepted matches its planned layout byte for byte.

use std::io::Write;

use crate::error::{FormatError, Result};

static ZEROS: [u8; 4096] = [0; 4096];

/// One planned region of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) name: String,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// A whole file's plan: its header bytes, where each slot lies (in the
/// order the streaming writer fills them) and its total length. Every
/// byte not in the header or a slot is zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    pub(crate) header: Vec<u8>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) total_len: u64,
}

impl SlotMap {
    /// The header, written at offset 0.
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// `(offset, len)` of slot `i` (FTW: tensor `i` in index order;
    /// FTEXPERT1: expert `i / fields`, field `i % fields`).
    pub fn slot(&self, i: usize) -> Option<(u64, u64)> {
        self.slots.get(i).map(|s| (s.offset, s.len))
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when there is no slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Exact length of the finished file.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }
}

/// Fills planned slots in order, padding gaps with zeros.
pub(crate) struct SlotWriter<W: Write> {
    w: W,
    slots: Vec<Slot>,
    total_len: u64,
    next: usize,
    pos: u64,
    open: Option<(usize, u64)>,
}

impl<W: Write> SlotWriter<W> {
    /// The header of `map` is written immediately.
    pub(crate) fn new(mut w: W, map: SlotMap) -> Result<Self> {
        w.write_all(&map.header)?;
        Ok(SlotWriter {
            w,
            pos: map.header.len() as u64,
            slots: map.slots,
            total_len: map.total_len,
            next: 0,
            open: None,
        })
    }

    fn pad_to(&mut self, target: u64) -> Result<()> {
        while self.pos < target {
            let n = (target - self.pos).min(ZEROS.len() as u64) as usize;
            self.w.write_all(&ZEROS[..n])?;
            self.pos += n as u64;
        }
        Ok(())
    }

    fn next_name(&self) -> String {
        self.slots
            .get(self.next)
            .map_or_else(|| "<end>".to_owned(), |s| s.name.clone())
    }

    /// Open the next slot, which must be called `name`.
    pub(crate) fn begin(&mut self, name: &str) -> Result<()> {
        if let Some((i, _)) = self.open {
            return Err(FormatError::WrongOrder {
                expected: format!("end of {}", self.slots[i].name),
                found: name.to_owned(),
            });
        }
        match self.slots.get(self.next) {
            Some(s) if s.name == name => {
                let off = s.offset;
                self.pad_to(off)?;
                self.open = Some((self.next, 0));
                self.next += 1;
                Ok(())
            }
            _ => Err(FormatError::WrongOrder {
                expected: self.next_name(),
                found: name.to_owned(),
            }),
        }
    }

    /// Append bytes to the open slot.
    pub(crate) fn write(&mut self, chunk: &[u8]) -> Result<()> {
        let (i, written) = self.open.ok_or(FormatError::NoOpenTensor)?;
        let slot = &self.slots[i];
        let attempted = written.saturating_add(chunk.len() as u64);
        if attempted > slot.len {
            return Err(FormatError::TooManyBytes {
                key: slot.name.clone(),
                len: slot.len,
                attempted,
            });
        }
        self.w.write_all(chunk)?;
        self.pos += chunk.len() as u64;
        self.open = Some((i, attempted));
        Ok(())
    }

    /// Close the open slot; it must be complete.
    pub(crate) fn end(&mut self) -> Result<()> {
        let (i, written) = self.open.ok_or(FormatError::NoOpenTensor)?;
        let slot = &self.slots[i];
        if written != slot.len {
            return Err(FormatError::TooFewBytes {
                key: slot.name.clone(),
                len: slot.len,
                written,
            });
        }
        self.open = None;
        Ok(())
    }

    /// Pad to the planned total length and return the inner writer.
    pub(crate) fn finish(mut self) -> Result<W> {
        if let Some((i, written)) = self.open {
            return Err(FormatError::TooFewBytes {
                key: self.slots[i].name.clone(),
                len: self.slots[i].len,
                written,
            });
        }
        if self.next < self.slots.len() {
            return Err(FormatError::Unfinished {
                remaining: (self.slots.len() - self.next) as u64,
                next: self.next_name(),
            });
        }
        let total = self.total_len;
        self.pad_to(total)?;
        self.w.flush()?;
        Ok(self.w)
    }
}
