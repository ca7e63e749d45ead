//! Bounds-checked little-endian reads over a byte slice.
//!
//! Every read goes through `get(..)` and `checked_add`, so a malformed
//! length can only produce [`FormatError::Truncated`], never a panic.

use crate::error::{FormatError, Result};

/// A read position in a byte slice that starts at absolute offset `base`.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    /// Start reading `buf`, whose first byte sits at absolute offset `base`.
    pub(crate) fn new(buf: &'a [u8], base: u64) -> Self {
        Cursor { buf, pos: 0, base }
    }

    /// Bytes left.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Take the next `n` bytes.
    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let trunc = || FormatError::Truncated {
            what,
            offset: self.base + self.pos as u64,
            needed: n,
            available: self.remaining() as u64,
        };
        let n = usize::try_from(n).map_err(|_| trunc())?;
        let end = self.pos.checked_add(n).ok_or_else(trunc)?;
        let s = self.buf.get(self.pos..end).ok_or_else(trunc)?;
        self.pos = end;
        Ok(s)
    }

    /// Take exactly `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// Read a little-endian `u16`.
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `u32`.
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `u64`.
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
}

/// Offset of the first non-zero byte of `bytes` (at absolute `base`).
pub(crate) fn check_zero(bytes: &[u8], base: u64) -> Result<()> {
    match bytes.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(FormatError::NonZeroPadding {
            offset: base + i as u64,
        }),
    }
}
