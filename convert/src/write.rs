//! Writing one component: source bytes are read in bounded chunks (pread at
//! absolute offsets, never a whole tensor), pushed through the format writer
//! into a temp file beside the component, hashed on the way, then
//! `sync_all` → size check → rename → fsync of the directory. The caller
//! commits the receipt only after this returns.
//!
//! Memory per component in flight is bounded by [`CHUNK_BYTES`] (read
//! buffer, its bf16 view and the encoded output) plus the write buffer,
//! whatever the tensor size: the PLE table is ~100 GB in the real model.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::bf16;
use sha2::{Digest, Sha256};

use ftpipe_formats::{
    ExpertLayout, ExpertWriter, FormatError, FtwLayout, FtwWriter, Q3GlobalScale, TensorDesc, q3,
};

use crate::component::{
    CheckedSpan, Component, ComponentContent, FtwTensor, SourceSpan, TensorSource,
};
use crate::error::{ConvertError, Result};
use ftpipe_fs::durable::{rename_durably_up_to, temp_name};
use ftpipe_fs::paths::safe_join;

/// Source bytes read per pread.
pub const CHUNK_BYTES: usize = 8 << 20;
/// Write buffer in front of each component file.
const WRITE_BUFFER: usize = 1 << 20;

/// A component as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Bytes in the file.
    pub size: u64,
    /// Hex SHA-256 of those bytes.
    pub sha256: String,
}

/// Counts and hashes everything on its way to the file.
struct HashingWriter {
    file: File,
    hasher: Sha256,
    written: u64,
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A source read from its copy aside: the copy, and where each kept
/// range sits in it (`(source offset, len, copy offset)`, in source order).
type CopiedSource = (PathBuf, Vec<(u64, u64, u64)>);

/// Read access to the source files under `DIR/source` (and the copies
/// aside of released ones).
#[derive(Clone)]
pub struct Sources {
    root: PathBuf,
    /// Sources released after their kept ranges were copied aside: the
    /// copy, and where each range sits in it (`(source offset, len, copy
    /// offset)`, in source order).
    copies: BTreeMap<String, CopiedSource>,
}

impl Sources {
    /// Sources under `root`.
    pub fn new(root: &Path) -> Sources {
        Sources {
            root: root.to_owned(),
            copies: BTreeMap::new(),
        }
    }

    /// Source `file` is read from `copy` from now on: its ranges
    /// `(source offset, len, copy offset)` ([`crate::copied`]).
    pub fn copied(&mut self, file: &str, copy: PathBuf, ranges: Vec<(u64, u64, u64)>) {
        self.copies.insert(file.to_owned(), (copy, ranges));
    }

    /// Whether `file` is read from a copy aside.
    pub fn is_copied(&self, file: &str) -> bool {
        self.copies.contains_key(file)
    }

    fn open(&self, file: &str) -> Result<File> {
        let path = match self.copies.get(file) {
            Some((copy, _)) => copy.clone(),
            None => safe_join(&self.root, file)?,
        };
        ftpipe_fs::nofollow::open_read_unshared(&path)
            .map_err(|e| ConvertError::io("open source", path, e))
    }

    /// Where `span`'s bytes start in what [`Self::open`] opens: its offset,
    /// or, copied aside, its place in the copy (an error when no range
    /// copied holds it whole).
    fn located(&self, span: &SourceSpan) -> Result<u64> {
        let Some((_, ranges)) = self.copies.get(&*span.file) else {
            return Ok(span.offset);
        };
        let end = span.offset.saturating_add(span.len);
        ranges
            .iter()
            .find(|(o, n, _)| *o <= span.offset && end <= o.saturating_add(*n))
            .map(|(o, _, at)| at + (span.offset - o))
            .ok_or_else(|| ConvertError::SourceRead {
                file: span.file.to_string(),
                tensor: span.tensor.to_string(),
                offset: span.offset,
                source: std::io::Error::other(
                    "the file was released after its PLE spans were copied aside, and no range copied holds this span",
                ),
            })
    }

    /// Calls `each` with consecutive chunks of `span` (and their offset in
    /// it), each at most `chunk` bytes.
    pub(crate) fn stream(
        &self,
        span: &SourceSpan,
        chunk: usize,
        buf: &mut Vec<u8>,
        each: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        SpanReader::new(self).stream(span, chunk, buf, each)
    }
}

/// Reads of spans from [`Sources`], the last source file kept open for the
/// next span of it: a component's spans come file after file, mostly, and
/// an NVFP4 export has thousands of spans of a few bytes.
pub(crate) struct SpanReader<'s> {
    sources: &'s Sources,
    open: Option<(Arc<str>, File)>,
}

impl<'s> SpanReader<'s> {
    /// Reads from `sources`, nothing open yet.
    pub(crate) fn new(sources: &'s Sources) -> SpanReader<'s> {
        SpanReader {
            sources,
            open: None,
        }
    }

    /// [`Sources::stream`], through the open file when `span` is of it.
    pub(crate) fn stream(
        &mut self,
        span: &SourceSpan,
        chunk: usize,
        buf: &mut Vec<u8>,
        mut each: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let base = self.sources.located(span)?;
        let f = self.file_of(&span.file)?;
        let mut done = 0u64;
        while done < span.len {
            let n = usize::try_from((span.len - done).min(chunk as u64)).unwrap_or(chunk);
            buf.resize(n, 0);
            let at = span.offset + done;
            f.read_exact_at(buf, base + done)
                .map_err(|source| ConvertError::SourceRead {
                    file: span.file.to_string(),
                    tensor: span.tensor.to_string(),
                    offset: at,
                    source,
                })?;
            each(done, buf)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Source `file`, opened unless it is the one open.
    fn file_of(&mut self, file: &Arc<str>) -> Result<&File> {
        let open = match self.open.take() {
            Some((name, f)) if name == *file => (name, f),
            _ => (file.clone(), self.sources.open(file)?),
        };
        Ok(&self.open.insert(open).1)
    }
}

/// Reads lookup buffer `chk` and checks it holds the bytes the config fixes.
pub fn check_lookup(sources: &Sources, chk: &CheckedSpan) -> Result<Vec<u8>> {
    check_lookup_in(&mut SpanReader::new(sources), chk)
}

/// [`check_lookup`] through `reader`.
pub(crate) fn check_lookup_in(reader: &mut SpanReader<'_>, chk: &CheckedSpan) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut found = Vec::new();
    reader.stream(&chk.span, CHUNK_BYTES, &mut buf, |_, b| {
        found.extend_from_slice(b);
        Ok(())
    })?;
    chk.check(&found)?;
    Ok(found)
}

fn bf16_view(bytes: &[u8], out: &mut Vec<bf16>) {
    out.clear();
    out.extend(
        bytes
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))),
    );
}

/// Maps a codec error on `span` to one naming the file and tensor.
fn codec_err(component: &str, span: &SourceSpan, e: FormatError) -> ConvertError {
    match e {
        FormatError::NonFinite { index, value, .. } => ConvertError::NonFinite {
            file: span.file.to_string(),
            tensor: span.tensor.to_string(),
            index,
            value,
        },
        other => ConvertError::Format {
            component: component.to_owned(),
            source: other,
        },
    }
}

fn format_err(component: &str) -> impl Fn(FormatError) -> ConvertError + '_ {
    move |source| ConvertError::Format {
        component: component.to_owned(),
        source,
    }
}

fn spans(src: &TensorSource) -> Vec<&SourceSpan> {
    match src {
        TensorSource::Span(s) => vec![s],
        TensorSource::Native(parts) => parts.iter().collect(),
        TensorSource::Checked(c) => vec![&c.span],
    }
}

/// Reads the F32 scale of an FP8 table (shape `[]` or `[1]`: 4 bytes).
fn read_scale(sources: &Sources, span: &SourceSpan) -> Result<f32> {
    let bad = |problem: String| -> ConvertError {
        ConvertError::BadSourceValue {
            file: span.file.to_string(),
            tensor: span.tensor.to_string(),
            offset: span.offset,
            problem,
        }
    };
    if span.len != 4 {
        return Err(bad(format!(
            "the FP8 table scale is {} bytes, expected one F32 (4 bytes)",
            span.len
        )));
    }
    let mut buf = Vec::new();
    let mut bytes = Vec::with_capacity(4);
    sources.stream(span, 4, &mut buf, |_, b| {
        bytes.extend_from_slice(b);
        Ok(())
    })?;
    let b: [u8; 4] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| bad(format!("read {} bytes of the FP8 table scale", b.len())))?;
    Ok(f32::from_le_bytes(b))
}

/// F8_E4M3 codes decoded exactly and multiplied by `scale`, in f32
/// (through a table of the 256 products: the same f32 operations per
/// code, without decoding each element).
fn fp8_view(bytes: &[u8], scale: f32, out: &mut Vec<f32>) {
    let mut table = [0f32; 256];
    for c in 0..=u8::MAX {
        table[usize::from(c)] = ftpipe_formats::e4m3::decode(c) * scale;
    }
    out.clear();
    out.extend(bytes.iter().map(|&c| table[usize::from(c)]));
}

/// The absolute max of a PLE table (all its BF16 segments, or its F8_E4M3
/// segments decoded with their `scales`), checking every element is finite.
pub fn table_absmax(
    sources: &Sources,
    component: &str,
    segments: &[SourceSpan],
    scales: &[SourceSpan],
) -> Result<f32> {
    let (mut buf, mut x, mut amax) = (Vec::new(), Vec::new(), 0f32);
    let mut reader = SpanReader::new(sources);
    if !scales.is_empty() {
        let mut y = Vec::new();
        for (s, sc) in segments.iter().zip(scales) {
            let scale = read_scale(sources, sc)?;
            reader.stream(s, CHUNK_BYTES, &mut buf, |done, bytes| {
                fp8_view(bytes, scale, &mut y);
                let m = q3::table_absmax_f32(&s.tensor, &y, done)
                    .map_err(|e| codec_err(component, s, e))?;
                amax = amax.max(m);
                Ok(())
            })?;
        }
        return Ok(amax);
    }
    for s in segments {
        reader.stream(s, CHUNK_BYTES, &mut buf, |done, bytes| {
            bf16_view(bytes, &mut x);
            let m = q3::table_absmax(&s.tensor, &x, done / 2)
                .map_err(|e| codec_err(component, s, e))?;
            amax = amax.max(m);
            Ok(())
        })?;
    }
    Ok(amax)
}

/// Writes component `c` under `artifact`. `scales` holds the global scale
/// of every PLE layer whose segments may be written.
pub fn write_component(
    sources: &Sources,
    artifact: &Path,
    c: &Component,
    scales: &BTreeMap<u64, Q3GlobalScale>,
) -> Result<Written> {
    write_component_with(sources, artifact, c, scales, None)
}

/// [`write_component`]; for a global scale, `table_absmax` (when known:
/// every segment read and checked already) instead of reading the table.
pub fn write_component_with(
    sources: &Sources,
    artifact: &Path,
    c: &Component,
    scales: &BTreeMap<u64, Q3GlobalScale>,
    table_absmax_known: Option<f32>,
) -> Result<Written> {
    let path = safe_join(artifact, &c.name)?;
    let tmp = safe_join(artifact, &temp_name(&c.name))?;
    let mut file = ComponentFile::create(sources, artifact, &c.name, &path, tmp)?;
    match &c.content {
        ComponentContent::Ftw { tensors } => file.write_ftw(tensors)?,
        ComponentContent::Experts {
            layer,
            fields,
            records,
        } => file.write_experts(*layer, fields, records)?,
        ComponentContent::Q3Segment {
            layer,
            width,
            source,
            scale,
            ..
        } => {
            let g = *scales
                .get(layer)
                .ok_or_else(|| ConvertError::MissingGlobalScale {
                    component: c.name.clone(),
                    layer: *layer,
                })?;
            let width_us = usize::try_from(*width).unwrap_or(usize::MAX);
            match scale {
                Some(scale) => file.write_q3_fp8(g, width_us, source, scale)?,
                None => file.write_q3_bf16(g, width_us, source)?,
            }
        }
        ComponentContent::Q3GlobalScale {
            segments, scales, ..
        } => {
            let amax = match table_absmax_known {
                Some(amax) => amax,
                None => table_absmax(sources, &c.name, segments, scales)?,
            };
            file.write_global_scale(amax)?;
        }
    }
    let (written, tmp) = file.finish_synced(c.predicted_bytes)?;
    // Every directory from the component's up to artifact/ is fsynced,
    // whoever created it, before the receipt can claim the file.
    rename_durably_up_to(artifact, &tmp, &path)?;
    Ok(written)
}

/// A component being written: its temp file behind a hashing write
/// buffer, and the buffer its source bytes are read into.
struct ComponentFile<'a> {
    sources: &'a Sources,
    /// Reads the spans, the last source file kept open.
    reader: SpanReader<'a>,
    /// The component's name.
    name: &'a str,
    /// The temp file beside the component.
    tmp: PathBuf,
    out: BufWriter<HashingWriter>,
    buf: Vec<u8>,
}

impl<'a> ComponentFile<'a> {
    /// Creates temp file `tmp` for component `name` (at `path`, under
    /// `artifact`), its directories first; refuses when `path` is there and
    /// not a regular file.
    fn create(
        sources: &'a Sources,
        artifact: &Path,
        name: &'a str,
        path: &Path,
        tmp: PathBuf,
    ) -> Result<Self> {
        let dir = path.parent().unwrap_or(artifact).to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| ConvertError::io("create", &dir, e))?;
        ftpipe_fs::nofollow::check_absent_or_regular(path)
            .map_err(|e| ConvertError::io("open", path, e))?;
        let file = ftpipe_fs::nofollow::create_truncated(&tmp)
            .map_err(|e| ConvertError::io("create", &tmp, e))?;
        let sink = HashingWriter {
            file,
            hasher: Sha256::new(),
            written: 0,
        };
        Ok(ComponentFile {
            sources,
            reader: SpanReader::new(sources),
            name,
            tmp,
            out: BufWriter::with_capacity(WRITE_BUFFER, sink),
            buf: Vec::new(),
        })
    }

    /// The error for a failed write to the temp file.
    fn io_err(tmp: &Path) -> impl Fn(std::io::Error) -> ConvertError + '_ {
        move |e| ConvertError::io("write", tmp, e)
    }

    /// Writes an FTW v1 stream of `tensors`; a lookup buffer is read once,
    /// checked, then written from the same bytes.
    fn write_ftw(&mut self, tensors: &[FtwTensor]) -> Result<()> {
        let name = self.name;
        let layout = FtwLayout::plan(tensors.iter().map(|t| t.desc.clone()).collect())
            .map_err(format_err(name))?;
        let mut w = FtwWriter::new(&layout, &mut self.out).map_err(format_err(name))?;
        for t in tensors {
            w.begin_tensor(&t.desc.key).map_err(format_err(name))?;
            if let TensorSource::Checked(chk) = &t.source {
                let found = check_lookup_in(&mut self.reader, chk)?;
                w.write(&found).map_err(format_err(name))?;
                w.end_tensor().map_err(format_err(name))?;
                continue;
            }
            for s in spans(&t.source) {
                self.reader.stream(s, CHUNK_BYTES, &mut self.buf, |_, b| {
                    w.write(b).map_err(format_err(name))
                })?;
            }
            w.end_tensor().map_err(format_err(name))?;
        }
        w.finish().map_err(format_err(name))?;
        Ok(())
    }

    /// Writes the FTEXPERT1 sidecar of `layer`: `records` in `fields`'
    /// layout.
    fn write_experts(
        &mut self,
        layer: u64,
        fields: &[TensorDesc],
        records: &[Vec<TensorSource>],
    ) -> Result<()> {
        let name = self.name;
        let layer32 = u32::try_from(layer).unwrap_or(u32::MAX);
        let count = u32::try_from(records.len()).unwrap_or(u32::MAX);
        let layout =
            ExpertLayout::plan(layer32, count, fields.to_vec()).map_err(format_err(name))?;
        let mut w = ExpertWriter::new(&layout, &mut self.out).map_err(format_err(name))?;
        for (e, rec) in (0u32..).zip(records) {
            for (f, src) in fields.iter().zip(rec) {
                w.begin_field(e, &f.key).map_err(format_err(name))?;
                for s in spans(src) {
                    self.reader.stream(s, CHUNK_BYTES, &mut self.buf, |_, b| {
                        w.write(b).map_err(format_err(name))
                    })?;
                }
                w.end_field().map_err(format_err(name))?;
            }
        }
        w.finish().map_err(format_err(name))?;
        Ok(())
    }

    /// Writes a Q3 segment of F8_E4M3 codes × the table scale `scale`,
    /// encoded from exact f32 under global scale `g`.
    fn write_q3_fp8(
        &mut self,
        g: Q3GlobalScale,
        width: usize,
        source: &SourceSpan,
        scale: &SourceSpan,
    ) -> Result<()> {
        let (name, out) = (self.name, &mut self.out);
        let io_err = Self::io_err(&self.tmp);
        let (mut x, mut enc) = (Vec::new(), Vec::new());
        let s = read_scale(self.sources, scale)?;
        let row_bytes = width.max(1);
        let chunk = (CHUNK_BYTES / 4 / row_bytes).max(1) * row_bytes;
        self.reader.stream(source, chunk, &mut self.buf, |done, b| {
            fp8_view(b, s, &mut x);
            enc.resize(x.len() / q3::Q3_BLOCK * q3::Q3_BLOCK_BYTES, 0);
            q3::encode_f32(&source.tensor, &x, width, g, done, &mut enc)
                .map_err(|e| codec_err(name, source, e))?;
            out.write_all(&enc).map_err(&io_err)
        })
    }

    /// Writes a Q3 segment of BF16 `source` under global scale `g`.
    fn write_q3_bf16(&mut self, g: Q3GlobalScale, width: usize, source: &SourceSpan) -> Result<()> {
        let (name, out) = (self.name, &mut self.out);
        let io_err = Self::io_err(&self.tmp);
        let (mut y, mut enc) = (Vec::new(), Vec::new());
        let row_bytes = width.saturating_mul(2).max(1);
        let chunk = (CHUNK_BYTES / row_bytes).max(1) * row_bytes;
        self.reader.stream(source, chunk, &mut self.buf, |done, b| {
            bf16_view(b, &mut y);
            enc.resize(y.len() / q3::Q3_BLOCK * q3::Q3_BLOCK_BYTES, 0);
            q3::encode(&source.tensor, &y, width, g, done / 2, &mut enc)
                .map_err(|e| codec_err(name, source, e))?;
            out.write_all(&enc).map_err(&io_err)
        })
    }

    /// Writes the global scale of a table whose absolute max is `amax`.
    fn write_global_scale(&mut self, amax: f32) -> Result<()> {
        let g = Q3GlobalScale::from_absmax(amax).map_err(format_err(self.name))?;
        self.out
            .write_all(&g.to_bytes())
            .map_err(Self::io_err(&self.tmp))
    }

    /// Flushes and fsyncs the temp file and checks it holds `predicted`
    /// bytes (else removes it); returns its size and digest, and its path.
    fn finish_synced(self, predicted: u64) -> Result<(Written, PathBuf)> {
        let tmp = self.tmp;
        let sink = self
            .out
            .into_inner()
            .map_err(|e| Self::io_err(&tmp)(e.into_error()))?;
        sink.file
            .sync_all()
            .map_err(|e| ConvertError::io("fsync", &tmp, e))?;
        if sink.written != predicted {
            let _ = std::fs::remove_file(&tmp);
            return Err(ConvertError::SizeMismatch {
                component: self.name.to_owned(),
                predicted,
                actual: sink.written,
            });
        }
        let written = Written {
            size: sink.written,
            sha256: hex::encode(sink.hasher.finalize()),
        };
        Ok((written, tmp))
    }
}

/// Largest global-scale file read back (one BF16 value is 2 bytes).
pub const MAX_GLOBAL_SCALE_BYTES: u64 = 16;

/// Reads a written global scale back, checking its digest against the
/// receipt so a segment is never encoded under a scale nobody vouched for.
pub fn read_global_scale(artifact: &Path, name: &str, sha256: &str) -> Result<Q3GlobalScale> {
    let path = safe_join(artifact, name)?;
    let bytes = ftpipe_fs::bounded::read_bounded_nofollow(&path, MAX_GLOBAL_SCALE_BYTES)?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != sha256 {
        return Err(ConvertError::ComponentDigest {
            component: name.to_owned(),
            expected: sha256.to_owned(),
            actual,
        });
    }
    Q3GlobalScale::from_bytes(&bytes).map_err(format_err(name))
}
