//! FTEXPERT1: one sidecar per MoE layer holding one fixed-size, page-aligned
//! record per expert, so a runtime loads expert `e` with one aligned `pread`
//! of `record_size` bytes at `data_offset + e × record_size`.
//!
//! Layout (all integers little-endian):
//! ```text
//! 0   magic        [u8; 9] = "FTEXPERT1"
//! 9   reserved     [u8; 3] = 0
//! 12  version      u32 = 1
//! 16  layer        u32
//! 20  expert_count u32            ≤ MAX_EXPERTS
//! 24  field_count  u32            1..=MAX_RECORD_FIELDS
//! 28  reserved     u32 = 0
//! 32  record_size  u64 = round_up(end of last field, 4096)
//! 40  table_len    u64            ≤ MAX_RECORD_TABLE_LEN
//! 48  data_offset  u64 = round_up(64 + table_len, 4096)
//! 56  total_len    u64 = data_offset + expert_count × record_size
//! 64  layout table: field_count entries (see `entry`), offsets relative to
//!     the record start, field i at round_up(end of field i−1, 64)
//! ..  zero padding to data_offset, then the records, each zero padded
//! ```

use std::collections::HashMap;
use std::io::{Read, Write};

use crate::cursor::{Cursor, check_zero};
use crate::dtype::{PAGE, round_up};
use crate::entry::{self, Entry, TensorDesc};
use crate::error::{FormatError, Result};
use crate::slots::{Slot, SlotMap, SlotWriter};

/// File magic.
pub const FTEXPERT_MAGIC: [u8; 9] = *b"FTEXPERT1";
/// The only version this crate reads and writes.
pub const FTEXPERT_VERSION: u32 = 1;
/// Size of the fixed header before the layout table.
pub const FTEXPERT_FIXED_HEADER_LEN: u64 = 64;
/// Alignment of fields inside a record (a cache line).
pub const FIELD_ALIGN: u64 = 64;
/// Maximum experts per layer.
pub const MAX_EXPERTS: u32 = 1 << 16;
/// Maximum fields per record.
pub const MAX_RECORD_FIELDS: u32 = 256;
/// Maximum layout table size in bytes.
pub const MAX_RECORD_TABLE_LEN: u64 = 1 << 20;

/// The planned (writer) or validated (reader) header of a sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLayout {
    layer: u32,
    expert_count: u32,
    fields: Vec<Entry>,
    by_name: HashMap<String, usize>,
    record_size: u64,
    table_len: u64,
    data_offset: u64,
    total_len: u64,
}

fn overflow(what: &str) -> FormatError {
    FormatError::Overflow {
        what: what.to_owned(),
    }
}

/// Derived sizes: (data_offset, record_size, total_len).
fn sizes(table_len: u64, fields_end: u64, expert_count: u32) -> Result<(u64, u64, u64)> {
    let data_offset = round_up(FTEXPERT_FIXED_HEADER_LEN + table_len, PAGE)
        .ok_or_else(|| overflow("data offset"))?;
    let record_size = round_up(fields_end, PAGE).ok_or_else(|| overflow("record size"))?;
    let total = record_size
        .checked_mul(expert_count.into())
        .and_then(|r| r.checked_add(data_offset))
        .ok_or_else(|| overflow("FTEXPERT1 total length"))?;
    Ok((data_offset, record_size, total))
}

fn check_counts(expert_count: u32, field_count: u64) -> Result<()> {
    if expert_count > MAX_EXPERTS {
        return Err(FormatError::TooMany {
            what: "expert",
            count: expert_count.into(),
            max: MAX_EXPERTS.into(),
        });
    }
    if field_count == 0 {
        return Err(FormatError::EmptyRecord);
    }
    if field_count > u64::from(MAX_RECORD_FIELDS) {
        return Err(FormatError::TooMany {
            what: "record field",
            count: field_count,
            max: MAX_RECORD_FIELDS.into(),
        });
    }
    Ok(())
}

impl ExpertLayout {
    /// Plan a sidecar: `fields` is the record layout, identical for every
    /// expert (e.g. `gate_proj`, `up_proj`, `down_proj` as NVFP4).
    pub fn plan(layer: u32, expert_count: u32, fields: Vec<TensorDesc>) -> Result<Self> {
        check_counts(expert_count, fields.len() as u64)?;
        let (fields, end) = entry::plan(fields, 0, FIELD_ALIGN)?;
        let table_len: u64 = fields.iter().map(Entry::encoded_len).sum();
        if table_len > MAX_RECORD_TABLE_LEN {
            return Err(FormatError::TooLong {
                what: "FTEXPERT1 layout table",
                len: table_len,
                max: MAX_RECORD_TABLE_LEN,
            });
        }
        let (data_offset, record_size, total_len) = sizes(table_len, end, expert_count)?;
        Ok(Self::build(
            layer,
            expert_count,
            fields,
            record_size,
            table_len,
            data_offset,
            total_len,
        ))
    }

    fn build(
        layer: u32,
        expert_count: u32,
        fields: Vec<Entry>,
        record_size: u64,
        table_len: u64,
        data_offset: u64,
        total_len: u64,
    ) -> Self {
        let by_name = fields
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key().to_owned(), i))
            .collect();
        ExpertLayout {
            layer,
            expert_count,
            fields,
            by_name,
            record_size,
            table_len,
            data_offset,
            total_len,
        }
    }

    /// Parse and validate the header from the file's first `data_offset`
    /// (or more) bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mut cur = Cursor::new(bytes, 0);
        let magic = cur.array::<9>("FTEXPERT1 magic")?;
        if magic != FTEXPERT_MAGIC {
            return Err(FormatError::BadMagic {
                format: "FTEXPERT1",
                found: magic.to_vec(),
            });
        }
        let reserved = cur.array::<3>("FTEXPERT1 reserved")?;
        if reserved != [0; 3] {
            return Err(FormatError::ReservedNonZero {
                field: "FTEXPERT1 header bytes 9..12".into(),
                found: u64::from(u32::from_le_bytes([
                    reserved[0],
                    reserved[1],
                    reserved[2],
                    0,
                ])),
            });
        }
        let version = cur.u32("FTEXPERT1 version")?;
        if version != FTEXPERT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                format: "FTEXPERT1",
                version,
            });
        }
        let layer = cur.u32("layer")?;
        let expert_count = cur.u32("expert count")?;
        let field_count = cur.u32("field count")?;
        let reserved2 = cur.u32("FTEXPERT1 reserved")?;
        let record_size = cur.u64("record size")?;
        let table_len = cur.u64("table length")?;
        let data_offset = cur.u64("data offset")?;
        let total_len = cur.u64("total length")?;
        if reserved2 != 0 {
            return Err(FormatError::ReservedNonZero {
                field: "FTEXPERT1 header bytes 28..32".into(),
                found: reserved2.into(),
            });
        }
        check_counts(expert_count, field_count.into())?;
        if table_len > MAX_RECORD_TABLE_LEN {
            return Err(FormatError::TooLong {
                what: "FTEXPERT1 layout table",
                len: table_len,
                max: MAX_RECORD_TABLE_LEN,
            });
        }
        let table = cur.take(table_len, "FTEXPERT1 layout table")?;
        let mut tcur = Cursor::new(table, FTEXPERT_FIXED_HEADER_LEN);
        let (fields, end) = entry::parse(&mut tcur, field_count.into(), 0, FIELD_ALIGN)?;
        if tcur.remaining() != 0 {
            return Err(FormatError::IndexTrailingBytes {
                extra: tcur.remaining() as u64,
            });
        }
        let (want_offset, want_record, want_total) = sizes(table_len, end, expert_count)?;
        if record_size != want_record {
            return Err(FormatError::RecordSizeMismatch {
                expected: want_record,
                found: record_size,
            });
        }
        if data_offset != want_offset {
            return Err(FormatError::DataOffsetMismatch {
                expected: want_offset,
                found: data_offset,
            });
        }
        if total_len != want_total {
            return Err(FormatError::TotalLenMismatch {
                expected: want_total,
                found: total_len,
            });
        }
        let pad_start = FTEXPERT_FIXED_HEADER_LEN + table_len;
        check_zero(
            cur.take(data_offset - pad_start, "FTEXPERT1 header padding")?,
            pad_start,
        )?;
        Ok(Self::build(
            layer,
            expert_count,
            fields,
            record_size,
            table_len,
            data_offset,
            total_len,
        ))
    }

    /// Read and validate only the header from `r` (at offset 0).
    pub fn read_from(mut r: impl Read) -> Result<Self> {
        let mut buf = vec![0u8; FTEXPERT_FIXED_HEADER_LEN as usize];
        r.read_exact(&mut buf)
            .map_err(|e| short(e, 0, FTEXPERT_FIXED_HEADER_LEN))?;
        let table_len = u64::from_le_bytes(buf[40..48].try_into().unwrap_or([0; 8]));
        if table_len > MAX_RECORD_TABLE_LEN {
            return Self::parse(&buf); // reports TooLong (or an earlier error)
        }
        let want = round_up(FTEXPERT_FIXED_HEADER_LEN + table_len, PAGE).unwrap_or(0);
        let mut rest = vec![0u8; (want - FTEXPERT_FIXED_HEADER_LEN) as usize];
        r.read_exact(&mut rest)
            .map_err(|e| short(e, FTEXPERT_FIXED_HEADER_LEN, rest.len() as u64))?;
        buf.extend_from_slice(&rest);
        Self::parse(&buf)
    }

    /// Check the actual file length against the header.
    pub fn check_file_len(&self, len: u64) -> Result<()> {
        if len != self.total_len {
            return Err(FormatError::FileLenMismatch {
                expected: self.total_len,
                found: len,
            });
        }
        Ok(())
    }

    /// The header bytes: fixed header, layout table, zero padding.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.data_offset as usize);
        b.extend_from_slice(&FTEXPERT_MAGIC);
        b.extend_from_slice(&[0; 3]);
        for v in [
            FTEXPERT_VERSION,
            self.layer,
            self.expert_count,
            self.fields.len() as u32,
            0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.record_size,
            self.table_len,
            self.data_offset,
            self.total_len,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for e in &self.fields {
            e.write(&mut b);
        }
        b.resize(self.data_offset as usize, 0);
        b
    }

    /// MoE layer index.
    pub fn layer(&self) -> u32 {
        self.layer
    }
    /// Number of expert records.
    pub fn expert_count(&self) -> u32 {
        self.expert_count
    }
    /// Record layout (offsets relative to the record start).
    pub fn fields(&self) -> &[Entry] {
        &self.fields
    }
    /// A field by name.
    pub fn field(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).map(|&i| &self.fields[i])
    }

    /// The header and every field's place, expert by expert, fields in
    /// layout order (slot `e × fields + f`).
    pub fn slot_map(&self) -> SlotMap {
        let mut slots = Vec::with_capacity(self.expert_count as usize * self.fields.len());
        for e in 0..self.expert_count {
            let base = self.data_offset + u64::from(e) * self.record_size;
            for f in &self.fields {
                slots.push(Slot {
                    name: slot_name(e, f.key()),
                    offset: base + f.offset(),
                    len: f.len(),
                });
            }
        }
        SlotMap {
            header: self.header_bytes(),
            slots,
            total_len: self.total_len,
        }
    }

    /// Bytes per record (a multiple of 4096).
    pub fn record_size(&self) -> u64 {
        self.record_size
    }
    /// Offset of expert 0's record.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    /// Exact file length.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// `(offset, len)` of expert `e`'s record: one aligned `pread`.
    pub fn record_range(&self, e: u32) -> Result<(u64, u64)> {
        if e >= self.expert_count {
            return Err(FormatError::ExpertOutOfRange {
                expert: e.into(),
                count: self.expert_count.into(),
            });
        }
        // Cannot overflow: total_len was computed with checked arithmetic.
        Ok((
            self.data_offset + u64::from(e) * self.record_size,
            self.record_size,
        ))
    }

    /// View a record read with one `pread` of [`ExpertLayout::record_range`].
    pub fn record<'a>(&'a self, bytes: &'a [u8]) -> Result<ExpertRecord<'a>> {
        if bytes.len() as u64 != self.record_size {
            return Err(FormatError::BufferSize {
                what: "FTEXPERT1 record",
                expected: self.record_size,
                found: bytes.len() as u64,
            });
        }
        Ok(ExpertRecord {
            layout: self,
            bytes,
        })
    }
}

fn short(e: std::io::Error, offset: u64, needed: u64) -> FormatError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        FormatError::Truncated {
            what: "FTEXPERT1 header",
            offset,
            needed,
            available: 0,
        }
    } else {
        e.into()
    }
}

/// One expert's record: field bytes borrowed from the record buffer.
#[derive(Debug, Clone, Copy)]
pub struct ExpertRecord<'a> {
    layout: &'a ExpertLayout,
    bytes: &'a [u8],
}

impl<'a> ExpertRecord<'a> {
    /// A field's bytes by name.
    pub fn field(&self, name: &str) -> Option<&'a [u8]> {
        let e = self.layout.field(name)?;
        self.bytes.get(e.offset() as usize..e.end() as usize)
    }

    /// All fields with their bytes, in layout order.
    pub fn fields(&self) -> impl Iterator<Item = (&'a Entry, &'a [u8])> + 'a {
        let bytes = self.bytes;
        self.layout
            .fields
            .iter()
            .map(move |e| (e, &bytes[e.offset() as usize..e.end() as usize]))
    }

    /// The whole record.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A validated, zero-copy view of a whole sidecar.
#[derive(Debug, Clone)]
pub struct ExpertView<'a> {
    layout: ExpertLayout,
    bytes: &'a [u8],
}

impl<'a> ExpertView<'a> {
    /// Validate header, length and that every padding byte is zero.
    pub fn new(bytes: &'a [u8]) -> Result<Self> {
        let layout = ExpertLayout::parse(bytes)?;
        layout.check_file_len(bytes.len() as u64)?;
        for e in 0..layout.expert_count {
            let (off, len) = layout.record_range(e)?;
            let rec = &bytes[off as usize..(off + len) as usize];
            let mut prev = 0u64;
            for f in &layout.fields {
                check_zero(&rec[prev as usize..f.offset() as usize], off + prev)?;
                prev = f.end();
            }
            check_zero(&rec[prev as usize..], off + prev)?;
        }
        Ok(ExpertView { layout, bytes })
    }

    /// The validated header.
    pub fn layout(&self) -> &ExpertLayout {
        &self.layout
    }

    /// Expert `e`'s record.
    pub fn expert(&self, e: u32) -> Result<ExpertRecord<'_>> {
        let (off, len) = self.layout.record_range(e)?;
        self.layout
            .record(&self.bytes[off as usize..(off + len) as usize])
    }
}

/// Streams records expert by expert, field by field, in layout order.
pub struct ExpertWriter<W: Write> {
    inner: SlotWriter<W>,
}

fn slot_name(e: u32, field: &str) -> String {
    format!("expert {e} field {field}")
}

impl<W: Write> ExpertWriter<W> {
    /// Write the header of `layout` to `w`.
    pub fn new(layout: &ExpertLayout, w: W) -> Result<Self> {
        Ok(ExpertWriter {
            inner: SlotWriter::new(w, layout.slot_map())?,
        })
    }

    /// Start field `name` of expert `e` (must be the next in order).
    pub fn begin_field(&mut self, e: u32, name: &str) -> Result<()> {
        self.inner.begin(&slot_name(e, name))
    }

    /// Append bytes to the open field.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        self.inner.write(chunk)
    }

    /// Close the open field.
    pub fn end_field(&mut self) -> Result<()> {
        self.inner.end()
    }

    /// Write one whole field.
    pub fn write_field(&mut self, e: u32, name: &str, data: &[u8]) -> Result<()> {
        self.begin_field(e, name)?;
        self.write(data)?;
        self.end_field()
    }

    /// Check every record was written, pad, flush, return `w`.
    pub fn finish(self) -> Result<W> {
        self.inner.finish()
    }
}
