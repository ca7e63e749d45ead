//! Writing an FTW or FTEXPERT1 component in any order of its source files
//! (issue 28: a shard's tensors are written as soon as its digest is
//! verified, not once every shard is on disk).
//!
//! Both formats are planned in full from the headers ([`SlotMap`]): the
//! header bytes, every tensor's (or expert field's) offset and length,
//! zeros elsewhere. Their writers copy source bytes verbatim (an NVFP4
//! triplet is its three spans back to back), so each source span has a
//! fixed place in the finished file, and writing every span at its place
//! into a temp file of the planned length (sparse: holes read as the
//! zeros the streaming writer pads with) gives the bytes
//! [`crate::write::write_component`] gives, in whatever order the spans
//! arrive. The cost: the digest cannot be taken in write order. It is
//! taken from the start of the file as far as the bytes there are final
//! ([`SpanWriter::digest_ahead`], after each source file's spans are
//! written: the header, the spans written, the zeros between them), and
//! `finish` reads back only the rest. Q3 components are not placed: their bytes
//! depend on the whole table's scale, and they are written as before.
//!
//! Progress is durable per source file ([`write_file_into_all`]): its spans
//! are written, the temp file is fsynced, and only then is a
//! `component_spans` row committed claiming them (migration 0010). A
//! crash loses at most the spans of files in flight; [`open_durable`]
//! reopens the temp file with the claimed files done, so a resumed run
//! never needs a file whose spans were claimed (it may have been retired).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use ftpipe_formats::{ExpertLayout, FtwLayout, SlotMap};

use crate::component::{CheckedSpan, Component, ComponentContent, SourceSpan, TensorSource};
use crate::error::{ConvertError, Result};
use crate::write::{Sources, SpanReader, Written, check_lookup_in};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::{create_dirs_durably, rename_durably_up_to, sync_dir, temp_name};
use ftpipe_fs::paths::safe_join;
use ftpipe_receipts::{RunId, SpanClaim, Store};
use tokio::task::block_in_place;

/// One source span and where its bytes go in the component's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedSpan<'a> {
    /// The source bytes.
    pub span: &'a SourceSpan,
    /// Their offset in the finished component.
    pub at: u64,
    /// The bytes the config fixes for a lookup buffer, checked on the way.
    pub checked: Option<&'a CheckedSpan>,
}

/// The plan of `c` and every span at its place; `None` for a Q3 component.
pub fn placement(c: &Component) -> Result<Option<(SlotMap, Vec<PlacedSpan<'_>>)>> {
    let fmt = |source| ConvertError::Format {
        component: c.name.clone(),
        source,
    };
    let (map, sources): (SlotMap, Vec<&TensorSource>) = match &c.content {
        ComponentContent::Ftw { tensors } => {
            let layout =
                FtwLayout::plan(tensors.iter().map(|t| t.desc.clone()).collect()).map_err(fmt)?;
            (
                layout.slot_map(),
                tensors.iter().map(|t| &t.source).collect(),
            )
        }
        ComponentContent::Experts {
            layer,
            fields,
            records,
        } => {
            let layout = ExpertLayout::plan(
                u32::try_from(*layer).unwrap_or(u32::MAX),
                u32::try_from(records.len()).unwrap_or(u32::MAX),
                fields.clone(),
            )
            .map_err(fmt)?;
            (layout.slot_map(), records.iter().flatten().collect())
        }
        ComponentContent::Q3Segment { .. } | ComponentContent::Q3GlobalScale { .. } => {
            return Ok(None);
        }
    };
    let mut placed = Vec::new();
    for (i, src) in sources.into_iter().enumerate() {
        let (offset, len) = map
            .slot(i)
            .ok_or_else(|| ConvertError::internal(format!("{}: no slot {i}", c.name)))?;
        let mut at = offset;
        let checked = match src {
            TensorSource::Checked(chk) => Some(&**chk),
            _ => None,
        };
        for span in src.spans() {
            placed.push(PlacedSpan { span, at, checked });
            at += span.len;
        }
        if at - offset != len {
            return Err(ConvertError::internal(format!(
                "{}: slot {i} holds {len} bytes, its spans {}",
                c.name,
                at - offset
            )));
        }
    }
    Ok(Some((map, placed)))
}

/// A component's temp file being filled span by span, in any order.
pub struct SpanWriter<'a> {
    component: &'a Component,
    spans: Vec<PlacedSpan<'a>>,
    done: Vec<bool>,
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    /// The temp file's directory entry (and the unlink of an unreceipted
    /// final file) is durable: fsynced by the first [`Self::sync`], before
    /// any span of it can be claimed.
    entry_durable: bool,
    /// The digest of the file's first bytes, as far as they are final.
    ahead: Ahead,
}

/// SHA-256 of a temp file's bytes `0..to`, none of which a later span
/// write changes.
#[derive(Default)]
struct Ahead {
    hasher: Sha256,
    to: u64,
}

impl<'a> SpanWriter<'a> {
    /// Creates `c`'s temp file under `artifact` (truncated): its header
    /// written, its planned length set, no span in it yet. Nothing of it
    /// needs to survive a crash until a span is claimed, so its data and
    /// directory entry are made durable by the first [`Self::sync`] (a
    /// writer per component is created before the first byte is fetched:
    /// their fsyncs are off that path).
    pub fn create(artifact: &Path, c: &'a Component) -> Result<Self> {
        create_component_dir(artifact, c)?;
        Self::create_in_dir(artifact, c)
    }

    /// [`Self::create`] once [`create_component_dir`] made `c`'s directory
    /// durable.
    pub fn create_in_dir(artifact: &Path, c: &'a Component) -> Result<Self> {
        let (map, spans) = placement(c)?.ok_or_else(|| {
            ConvertError::internal(format!("{}: a Q3 component has no span placement", c.name))
        })?;
        let path = safe_join(artifact, &c.name)?;
        let tmp = safe_join(artifact, &temp_name(&c.name))?;
        ftpipe_fs::nofollow::check_absent_or_regular(&path)
            .map_err(|e| ConvertError::io("open", &path, e))?;
        // A final file without a receipt (an earlier run's, any identity)
        // is never trusted; it goes before any span of this one is
        // claimed, so a renamed file is always this writer's
        // ([`recover_renamed`]). The first sync's directory fsync makes it last.
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ConvertError::io("remove", &path, e)),
        }
        let file = ftpipe_fs::nofollow::create_truncated(&tmp)
            .map_err(|e| ConvertError::io("create", &tmp, e))?;
        file.write_all_at(map.header(), 0)
            .and_then(|()| file.set_len(map.total_len()))
            .map_err(|e| ConvertError::io("write", &tmp, e))?;
        Ok(SpanWriter {
            component: c,
            done: vec![false; spans.len()],
            spans,
            file,
            tmp,
            path,
            entry_durable: false,
            ahead: Ahead::default(),
        })
    }

    /// Reopens `c`'s temp file under `artifact` after a crash, the spans of
    /// `durable` files taken as written (their claims were committed after
    /// an fsync). `None` when the temp file is missing or is not `c`'s
    /// planned length and header: the caller recreates it.
    pub fn resume(
        artifact: &Path,
        c: &'a Component,
        durable: &BTreeSet<String>,
    ) -> Result<Option<Self>> {
        let (map, spans) = placement(c)?.ok_or_else(|| {
            ConvertError::internal(format!("{}: a Q3 component has no span placement", c.name))
        })?;
        let path = safe_join(artifact, &c.name)?;
        let tmp = safe_join(artifact, &temp_name(&c.name))?;
        let file = match ftpipe_fs::nofollow::open_write(&tmp) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ConvertError::io("open", &tmp, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| ConvertError::io("stat", &tmp, e))?
            .len();
        let mut header = vec![0u8; map.header().len()];
        let read = file.read_exact_at(&mut header, 0);
        if len != map.total_len() || read.is_err() || header != map.header() {
            return Ok(None);
        }
        let done = spans
            .iter()
            .map(|p| durable.contains(&*p.span.file))
            .collect();
        Ok(Some(SpanWriter {
            component: c,
            done,
            spans,
            file,
            tmp,
            path,
            entry_durable: true,
            ahead: Ahead::default(),
        }))
    }

    /// Makes every span written so far durable, with the temp file's
    /// directory entry the first time (before any span is claimed).
    pub fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| ConvertError::io("fsync", &self.tmp, e))?;
        if !self.entry_durable {
            let dir = self.tmp.parent().unwrap_or(&self.tmp);
            sync_dir(dir).map_err(|e| ConvertError::io("fsync", dir, e))?;
            self.entry_durable = true;
        }
        Ok(())
    }

    /// Writes every span of source `file` not yet written, at its place;
    /// returns the source bytes written. Spans that follow each other in
    /// the placement are gathered into one write, with the padding between
    /// their slots written as the zeros it holds (placed spans are in slot
    /// order and slots do not overlap, so nothing but padding lies between
    /// two neighbours).
    pub fn write_file(&mut self, sources: &Sources, file: &str) -> Result<u64> {
        let mut buf = Vec::new();
        let mut gather = Gather::default();
        let mut wrote = Vec::new();
        let mut reader = SpanReader::new(sources);
        let io = |e| ConvertError::io("write", &self.tmp, e);
        for (i, p) in self.spans.iter().enumerate() {
            if self.done[i] || &*p.span.file != file {
                continue;
            }
            // Only padding lies between span i - 1 and span i; what is
            // gathered must end where span i - 1 does.
            let follows = i > 0
                && wrote.last() == Some(&(i - 1))
                && gather.end() == self.spans[i - 1].at + self.spans[i - 1].span.len;
            match p.checked {
                Some(chk) => {
                    let found = check_lookup_in(&mut reader, chk)?;
                    gather.put(&self.file, p.at, &found, follows).map_err(io)?;
                }
                None => reader.stream(p.span, COPY_BYTES, &mut buf, |off, b| {
                    gather.put(&self.file, p.at + off, b, follows).map_err(io)
                })?,
            }
            wrote.push(i);
        }
        gather.flush(&self.file).map_err(io)?;
        let mut bytes = 0;
        for i in wrote {
            self.done[i] = true;
            bytes += self.spans[i].span.len;
        }
        Ok(bytes)
    }

    /// Reads the file from where the digest stopped up to its first span
    /// not yet written, into the digest: every byte before that span is
    /// final (the spans are placed in slot order, a span is written once,
    /// and padding is written only between two spans written together).
    /// A read that fails leaves the whole digest to [`Self::finish`],
    /// which reports it.
    pub fn digest_ahead(&mut self) {
        let Some(k) = self.done.iter().position(|d| !*d) else {
            return;
        };
        let end = self.spans[k].at;
        if self.ahead.to >= end {
            return;
        }
        let mut buf = vec![0u8; COPY_BYTES];
        while self.ahead.to < end {
            let n = usize::try_from(end - self.ahead.to).map_or(COPY_BYTES, |n| n.min(COPY_BYTES));
            let Some(chunk) = buf.get_mut(..n) else {
                return;
            };
            if self.file.read_exact_at(chunk, self.ahead.to).is_err() {
                self.ahead = Ahead::default();
                return;
            }
            self.ahead.hasher.update(&*chunk);
            self.ahead.to += n as u64;
        }
    }

    /// The component's name (its path under the artifact directory).
    pub fn name(&self) -> &str {
        &self.component.name
    }

    /// A span of source `file` is still to be written.
    pub fn needs(&self, file: &str) -> bool {
        self.spans
            .iter()
            .zip(&self.done)
            .any(|(p, d)| !*d && &*p.span.file == file)
    }

    /// The source files whose spans are not all written yet.
    pub fn missing_files(&self) -> BTreeSet<&str> {
        self.spans
            .iter()
            .zip(&self.done)
            .filter(|(_, d)| !**d)
            .map(|(p, _)| &*p.span.file)
            .collect()
    }

    /// Every span is written.
    pub fn is_complete(&self) -> bool {
        self.done.iter().all(|d| *d)
    }

    /// Once complete: `sync_all`, the digest read back, the size checked
    /// against the prediction, then the rename and the directories' fsync
    /// (the caller commits the receipt after).
    pub fn finish(self, artifact: &Path) -> Result<Written> {
        let c = self.component;
        if let Some(file) = self.missing_files().first() {
            return Err(ConvertError::internal(format!(
                "{}: finished before every span of {file} was written",
                c.name
            )));
        }
        self.file
            .sync_all()
            .map_err(|e| ConvertError::io("fsync", &self.tmp, e))?;
        let (size, sha256) = digest_from(&self.tmp, &self.file, self.ahead, c.predicted_bytes)?;
        if size != c.predicted_bytes {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(ConvertError::SizeMismatch {
                component: c.name.clone(),
                predicted: c.predicted_bytes,
                actual: size,
            });
        }
        rename_durably_up_to(artifact, &self.tmp, &self.path)?;
        Ok(Written { size, sha256 })
    }
}

/// Bytes per read of a span writer's source and of a component's digest:
/// each read is followed at once by a write (or a hash) of the same bytes,
/// which then come from the CPU's cache, and a buffer this small is reused
/// by the allocator instead of faulted in anew for every component.
const COPY_BYTES: usize = 256 << 10;

/// Bytes of neighbouring spans are gathered up to this many before one
/// write: an NVFP4 export's scalars and block scales are spans of 4 bytes
/// to a few KiB, each a write of its own otherwise.
const GATHER_BYTES: usize = 1 << 20;

/// At most this much padding between two neighbouring spans is written
/// as zeros to gather them. FTW aligns tensors to 4096 bytes and FTEXPERT1
/// fields to 64, so neighbours are never further apart, and as both
/// divide the page size the zeros only fill the rest of the page the last
/// span's write dirties anyway: no block that was a hole is written.
const MAX_GATHERED_PADDING: u64 = 4095;

/// Bytes for `[at, at + bytes.len())` of a file, not yet written.
#[derive(Default)]
struct Gather {
    at: u64,
    bytes: Vec<u8>,
}

impl Gather {
    /// `b` for `[at, at + b.len())`: added when it continues what is
    /// gathered (after zeros for the padding before it when `padded`, the
    /// caller's word that only padding lies between) and fits; else what
    /// is gathered is written first. A piece of at least [`GATHER_BYTES`]
    /// is written at once.
    fn put(&mut self, file: &File, at: u64, b: &[u8], padded: bool) -> std::io::Result<()> {
        // The zeros to add before `b` when it continues what is gathered.
        let pad = match at.checked_sub(self.end()) {
            Some(0) => Some(0),
            Some(gap) if padded && gap <= MAX_GATHERED_PADDING && !self.bytes.is_empty() => {
                usize::try_from(gap).ok()
            }
            _ => None,
        }
        .filter(|pad| self.bytes.len() + pad + b.len() <= GATHER_BYTES);
        match pad {
            Some(pad) => self.bytes.resize(self.bytes.len() + pad, 0),
            None => {
                self.flush(file)?;
                self.at = at;
            }
        }
        if b.len() >= GATHER_BYTES {
            file.write_all_at(b, at)?;
            self.at = at + b.len() as u64;
            return Ok(());
        }
        self.bytes.extend_from_slice(b);
        Ok(())
    }

    /// Where what is gathered ends (after the last byte put).
    fn end(&self) -> u64 {
        self.at + self.bytes.len() as u64
    }

    /// Writes what is gathered.
    fn flush(&mut self, file: &File) -> std::io::Result<()> {
        if !self.bytes.is_empty() {
            file.write_all_at(&self.bytes, self.at)?;
            self.at += self.bytes.len() as u64;
            self.bytes.clear();
        }
        Ok(())
    }
}

/// Creates the directory of `c`'s file under `artifact` and fsyncs it and
/// every directory up to `artifact`.
pub fn create_component_dir(artifact: &Path, c: &Component) -> Result<()> {
    let path = safe_join(artifact, &c.name)?;
    let dir = path.parent().unwrap_or(artifact);
    create_dirs_durably(artifact, dir).map_err(|e| ConvertError::io("create", dir, e))
}

/// `c`'s writer for a run: its temp file resumed when the claims in
/// `store` are all for `identity` and the file is intact, else recreated
/// (its claims forgotten first, so no claim outlives the bytes it names).
pub async fn open_durable<'a>(
    store: &Store,
    artifact: &Path,
    c: &'a Component,
    identity: &str,
) -> Result<SpanWriter<'a>> {
    let claims = store.span_claims(&c.name).await?;
    if !claims.is_empty() {
        if claims.iter().all(|k| k.identity == identity) {
            let durable = claims.into_iter().map(|k| k.file).collect();
            if let Some(w) = block_in_place(|| SpanWriter::resume(artifact, c, &durable))? {
                return Ok(w);
            }
        }
        store.forget_spans(&c.name).await?;
    }
    block_in_place(|| SpanWriter::create(artifact, c))
}

/// `c`'s final file, renamed by a run killed before its receipt: `Some`
/// with its size and digest when no temp file is left, every source file
/// of `c` has its spans claimed under `identity` and the file has the
/// planned length and header. Its bytes were fsynced before the rename
/// ([`SpanWriter::finish`]), and a source whose spans are claimed may
/// have been retired since, so it is finished from the file, not rebuilt.
pub async fn recover_renamed(
    store: &Store,
    artifact: &Path,
    c: &Component,
    identity: &str,
) -> Result<Option<Written>> {
    let Some((map, spans)) = placement(c)? else {
        return Ok(None);
    };
    let claims = store.span_claims(&c.name).await?;
    let claimed: BTreeSet<&str> = claims
        .iter()
        .filter(|k| k.identity == identity)
        .map(|k| k.file.as_str())
        .collect();
    let all_claimed =
        claims.len() == claimed.len() && spans.iter().all(|p| claimed.contains(&*p.span.file));
    let tmp = safe_join(artifact, &temp_name(&c.name))?;
    if claims.is_empty() || !all_claimed || std::fs::symlink_metadata(&tmp).is_ok() {
        return Ok(None);
    }
    let path = safe_join(artifact, &c.name)?;
    block_in_place(|| {
        let file = match ftpipe_fs::nofollow::open_read_unshared(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ConvertError::io("open", &path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| ConvertError::io("stat", &path, e))?
            .len();
        let mut header = vec![0u8; map.header().len()];
        if len != map.total_len()
            || len != c.predicted_bytes
            || file.read_exact_at(&mut header, 0).is_err()
            || header != map.header()
        {
            return Ok(None);
        }
        // The file checked is the file hashed, never past its planned end.
        let (size, sha256) = digest_open(file, &path, Ahead::default(), len)?;
        if size != len {
            return Ok(None);
        }
        Ok(Some(Written { size, sha256 }))
    })
}

/// Writes the spans source `file` feeds into every writer in `writers`
/// (with its identity) still missing them, fsyncs each temp file (in
/// parallel), then claims them all in one transaction under their
/// identities: a crash loses at most the spans of the file in flight.
/// Returns the writers it wrote.
pub async fn write_file_into_all(
    store: &Store,
    run: RunId,
    writers: &mut [(SpanWriter<'_>, String)],
    sources: &Sources,
    file: &str,
) -> Result<usize> {
    let mut todo: Vec<&mut (SpanWriter<'_>, String)> =
        writers.iter_mut().filter(|(w, _)| w.needs(file)).collect();
    let written = block_in_place(|| {
        in_threads(
            todo.iter_mut().collect(),
            WRITE_THREADS,
            "span write",
            |entry| {
                let w = &mut entry.0;
                let bytes = w.write_file(sources, file)?;
                w.sync()?;
                w.digest_ahead();
                Ok(bytes)
            },
        )
    });
    let mut claims = Vec::with_capacity(todo.len());
    for ((w, identity), bytes) in todo.iter().map(|e| (&e.0, &e.1)).zip(written) {
        claims.push(SpanClaim {
            component: w.component.name.clone(),
            identity: identity.clone(),
            file: file.to_owned(),
            bytes: bytes?,
        });
    }
    crashpoint::hit(CrashPoint::SpanSynced);
    store.claim_spans_all(run, &claims).await?;
    crashpoint::hit(CrashPoint::SpanClaimed);
    Ok(claims.len())
}

/// Span writers written and fsynced at once.
const WRITE_THREADS: usize = 8;

/// `work` on each of `items`, `threads` at a time on scoped threads;
/// the results in item order, a panic as an internal error naming `what`.
pub(crate) fn in_threads<I: Send, T: Send>(
    items: Vec<I>,
    threads: usize,
    what: &str,
    work: impl Fn(I) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let mut out = Vec::with_capacity(items.len());
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let batch: Vec<I> = items.by_ref().take(threads.max(1)).collect();
        std::thread::scope(|scope| {
            let work = &work;
            let handles: Vec<_> = batch
                .into_iter()
                .map(|item| scope.spawn(move || work(item)))
                .collect();
            out.extend(handles.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ConvertError::internal(format!("a {what} panicked"))))
            }));
        });
    }
    out
}

/// Length and hex SHA-256 of the file at `path`, read in chunks, its first
/// `ahead.to` bytes taken from `ahead`'s digest when `path` is still the
/// file `written` (the writer's own) and holds them within `limit` + 1
/// bytes; else read whole, as if nothing had been digested ahead.
fn digest_from(path: &Path, written: &File, ahead: Ahead, limit: u64) -> Result<(u64, String)> {
    use std::os::unix::fs::MetadataExt;
    let io = |e| ConvertError::io("read back", path, e);
    let mut f = ftpipe_fs::nofollow::open_read_unshared(path).map_err(io)?;
    let (now, own) = (f.metadata().map_err(io)?, written.metadata().map_err(io)?);
    let same = now.dev() == own.dev() && now.ino() == own.ino();
    let ahead = if same && now.len() >= ahead.to && ahead.to <= limit.saturating_add(1) {
        ahead
    } else {
        Ahead::default()
    };
    f.seek(SeekFrom::Start(ahead.to)).map_err(io)?;
    digest_open(f, path, ahead, limit)
}

/// Length and hex SHA-256 of the open file `f` (at `path`), read in chunks
/// from `ahead.to` on (the bytes before it in `ahead`'s digest) up to
/// `limit` + 1 bytes in all: a longer file shows as longer than `limit`
/// without being read to its end.
fn digest_open(f: File, path: &Path, ahead: Ahead, limit: u64) -> Result<(u64, String)> {
    let io = |e| ConvertError::io("read back", path, e);
    let mut f = f.take(limit.saturating_add(1).saturating_sub(ahead.to));
    let (mut hasher, mut size) = (ahead.hasher, ahead.to);
    let mut buf = vec![0u8; COPY_BYTES];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Ok((size, hex::encode(hasher.finalize())));
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
}

#[cfg(test)]
mod tests;
