//! The CAS half of [`super::XetSource`]: the reconstruction of a span, the
//! xorb range of each term (held to exactly the range asked), and the body
//! that decodes each range chunk by chunk as it arrives, and hashes and
//! records its chunks batch after batch (each batch recorded before its
//! bytes are handed on).

use std::sync::Arc;

use std::collections::VecDeque;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_RANGE, RANGE};
use tokio::task::block_in_place;
use url::Url;

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_receipts::XetTermRow;

use super::hash::{XetDigest, file_hash};
use super::share::{Claim, Reading, Share};
use super::wire::{MAX_RECONSTRUCTION_BYTES, Reconstruction, Term};
use super::xorb::ChunkStream;
use super::{CasToken, Inner, XetError, XetFile, shown};
use crate::error::{FetchError, Result};
use crate::source::BodyError;

/// Whether `url` has the origin of the CAS the hub named (only then does
/// the token go with a request to it).
fn same_origin(url: &Url, cas: &Url) -> bool {
    url.scheme() == cas.scheme()
        && url.host_str() == cas.host_str()
        && url.port_or_known_default() == cas.port_or_known_default()
}

/// A body read to at most `limit` bytes (`None`: it was longer).
async fn bounded(mut resp: reqwest::Response, limit: u64) -> reqwest::Result<Option<Vec<u8>>> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

impl Inner {
    fn get(&self, url: &Url, token: &CasToken, range: String) -> reqwest::RequestBuilder {
        let mut req = self.cas.get(url.clone()).header(RANGE, range);
        if same_origin(url, &token.cas) {
            req = req.header(AUTHORIZATION, format!("Bearer {}", token.token));
        }
        req
    }

    /// The reconstruction of `[from, end)` of `file`: v2, v1 when v2 is
    /// not served.
    pub(super) async fn reconstruction(
        &self,
        token: &CasToken,
        path: &str,
        file: &XetFile,
        from: u64,
        end: u64,
    ) -> Result<Reconstruction> {
        for version in [2, 1] {
            let raw = format!(
                "{}/v{version}/reconstructions/{}",
                token.cas.as_str().trim_end_matches('/'),
                file.xet_hash
            );
            let url = Url::parse(&raw).map_err(|e| FetchError::internal(format!("{raw}: {e}")))?;
            let http = |source| XetError::Http {
                url: shown(&url),
                source,
            };
            let resp = self
                .get(&url, token, format!("bytes={from}-{}", end - 1))
                .send()
                .await
                .map_err(|e| http(e.without_url()).into_fetch(true))?;
            let status = resp.status();
            if version == 2 && matches!(status.as_u16(), 404 | 501) {
                continue;
            }
            if status != StatusCode::OK {
                if matches!(status.as_u16(), 401 | 403) {
                    // Asked again on the retry.
                    *self.token.lock().await = None;
                }
                // A `416` says nothing of the bytes kept (the file never
                // changes under its Xet hash): the span is asked again, as
                // the hub's and a registry's are.
                let transient =
                    status.is_server_error() || matches!(status.as_u16(), 401 | 403 | 416 | 429);
                return Err(XetError::Status {
                    url: shown(&url),
                    status: status.as_u16(),
                    what: format!("reconstruction of {path}, bytes {from}-{}", end - 1),
                }
                .into_fetch(transient));
            }
            let body = bounded(resp, MAX_RECONSTRUCTION_BYTES)
                .await
                .map_err(|e| http(e.without_url()).into_fetch(true))?
                .ok_or_else(|| {
                    refused(
                        path,
                        "reconstruction",
                        format!("longer than {MAX_RECONSTRUCTION_BYTES} bytes"),
                    )
                })?;
            let parsed = if version == 2 {
                Reconstruction::from_v2(&body)
            } else {
                Reconstruction::from_v1(&body)
            };
            let recon = parsed.map_err(|e| refused(path, "reconstruction", e.to_string()))?;
            check_covers(path, &recon, end - from, end == file.size)?;
            return Ok(recon);
        }
        Err(refused(
            path,
            "reconstruction",
            "neither v2 nor v1 is served".into(),
        ))
    }

    /// The answer to `term`'s xorb range `[first, last]`: a `206` of
    /// exactly that range, its body not yet read.
    async fn xorb_range(
        &self,
        token: &CasToken,
        path: &str,
        term: &Term,
    ) -> Result<XorbBody, String> {
        let f = &term.fetch;
        let url = Url::parse(&f.url).map_err(|e| format!("xorb URL is not a URL: {e}"))?;
        let asked = format!("bytes {}-{}", f.first, f.last);
        let resp = self
            .get(&url, token, format!("bytes={}-{}", f.first, f.last))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "{}: {}",
                    shown(&url),
                    crate::source::error_chain(&e.without_url())
                )
            })?;
        let status = resp.status();
        if status != StatusCode::PARTIAL_CONTENT {
            return Err(format!(
                "{} answered {status} to {asked} of xorb {} (fetching {path}): only a 206 of exactly that range is taken",
                shown(&url),
                term.xorb
            ));
        }
        let sent = resp
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(sent) = &sent
            && !sent.starts_with(&format!("{asked}/"))
        {
            return Err(format!(
                "{} sent Content-Range {sent:?} for {asked} of xorb {} (fetching {path})",
                shown(&url),
                term.xorb
            ));
        }
        Ok(XorbBody {
            resp,
            want: f.last - f.first + 1,
            got: 0,
            what: format!(
                "{asked} of xorb {} from {} (fetching {path})",
                term.xorb,
                shown(&url)
            ),
        })
    }

    /// `term` of `path`, whose first byte is `file_start` in the file:
    /// its xorb range asked, to be read batch by batch.
    pub(super) async fn term(
        &self,
        token: &CasToken,
        path: &str,
        term: &Term,
        file_start: u64,
    ) -> Result<TermStream, String> {
        let f = &term.fetch;
        let count = usize::try_from(f.chunk_end - f.chunk_start).map_err(|e| e.to_string())?;
        let chunks = ChunkStream::new(count).map_err(|e| {
            format!(
                "xorb {} bytes {}-{} (fetching {path}): {e}",
                term.xorb, f.first, f.last
            )
        })?;
        let body = self.xorb_range(token, path, term).await?;
        Ok(TermStream {
            term: term.clone(),
            body,
            chunks,
            batch: Vec::new(),
            batch_start: file_start,
            batch_bytes: 0,
            read: 0,
            recorded: 0,
            decoded: 0,
            ended: false,
            wanted: Vec::new(),
            _reading: None,
        })
    }

    /// The file's Xet hash from the recorded chunk hashes, chunk after
    /// chunk from byte 0 (terms asked for a span start and end at the
    /// chunks that hold it, so two spans' terms may overlap by a chunk; a
    /// chunk is the same wherever it was recorded); not checkable (a
    /// warning) when they do not cover the file (bytes of an earlier fetch
    /// through `resolve`).
    pub(super) async fn check_whole(&self, path: &str, file: &XetFile) -> Result<()> {
        let rows = self.store.xet_terms(path, &file.xet_hash).await?;
        let mut by_offset = std::collections::BTreeMap::new();
        for row in &rows {
            let mut at = row.file_start;
            for (hex, size) in &row.chunks {
                let digest = XetDigest::parse(hex).ok_or_else(|| {
                    FetchError::internal(format!("recorded chunk hash {hex:?} of {path}"))
                })?;
                by_offset.insert(at, (digest, *size));
                at = at.saturating_add(*size);
            }
        }
        let mut chunks = Vec::new();
        let mut at = 0u64;
        while at < file.size {
            let Some(&(digest, size)) = by_offset.get(&at) else {
                tracing::warn!(
                    path,
                    at,
                    "no recorded Xet chunk starts here: the Xet hash is not checked (the SHA-256 was)"
                );
                return Ok(());
            };
            chunks.push((digest, size));
            at = at.saturating_add(size.max(1));
        }
        let actual = file_hash(&chunks).hex();
        if actual != file.xet_hash {
            return Err(XetError::FileHash {
                path: path.to_owned(),
                chunks: chunks.len(),
                expected: file.xet_hash.clone(),
                actual,
            }
            .into_fetch(false));
        }
        Ok(())
    }
}

fn refused(path: &str, what: &'static str, detail: String) -> FetchError {
    XetError::Refused {
        what,
        path: path.to_owned(),
        detail,
    }
    .into_fetch(false)
}

/// The terms of `recon` must hold the `want` bytes asked after their
/// offset, every term needed (the terms before the last hold fewer), and,
/// for a span to the file's end (`to_end`), exactly those bytes: terms
/// that do not add up to the file are refused before a xorb is asked.
fn check_covers(path: &str, recon: &Reconstruction, want: u64, to_end: bool) -> Result<()> {
    let sum = |terms: &[Term]| {
        terms
            .iter()
            .try_fold(0u64, |acc, t| acc.checked_add(t.length))
            .ok_or_else(|| refused(path, "reconstruction", "term lengths overflow".into()))
    };
    let bad = |what: String| {
        refused(
            path,
            "reconstruction",
            format!(
                "its {} terms hold {what} after offset_into_first_range {}, and {want} bytes were asked{}",
                recon.terms.len(),
                recon.offset,
                if to_end { " (to the file's end)" } else { "" }
            ),
        )
    };
    let held = sum(&recon.terms)?.saturating_sub(recon.offset);
    let before_last =
        sum(&recon.terms[..recon.terms.len().saturating_sub(1)])?.saturating_sub(recon.offset);
    if held < want {
        return Err(bad(format!("{held} bytes, fewer")));
    }
    if !recon.terms.is_empty() && before_last >= want {
        return Err(bad(format!(
            "{before_last} bytes before the last term, which is past the span"
        )));
    }
    if to_end && held != want {
        return Err(bad(format!("{held} bytes, more than the file")));
    }
    Ok(())
}

/// A term waits for other bodies' reads of its span at most this many
/// times (each at most the read timeout) before reading it itself.
const MAX_SPAN_WAITS: u32 = 3;

/// A term's decoded chunks are recorded (their hashes, then handed on)
/// in batches of at least this many bytes, or up to the term's end: a
/// cut or a kill inside a term loses at most the batch being read.
pub const BATCH_BYTES: u64 = 1 << 20;

/// The body of a xorb range: at most `want` bytes, and exactly `want`
/// by its end.
pub(super) struct XorbBody {
    resp: reqwest::Response,
    want: u64,
    got: u64,
    /// The range, xorb, URL and file, for messages.
    what: String,
}

impl XorbBody {
    /// The next bytes; `None` at the end of exactly `want` bytes.
    async fn next(&mut self) -> Result<Option<Bytes>, String> {
        let piece = self.resp.chunk().await.map_err(|e| {
            format!(
                "{}: {}",
                self.what,
                crate::source::error_chain(&e.without_url())
            )
        })?;
        let Some(piece) = piece else {
            if self.got != self.want {
                return Err(format!(
                    "{} bytes of the {} of {}",
                    self.got, self.want, self.what
                ));
            }
            return Ok(None);
        };
        self.got += piece.len() as u64;
        if self.got > self.want {
            return Err(format!(
                "more than the {} bytes of {}",
                self.want, self.what
            ));
        }
        Ok(Some(piece))
    }
}

/// Chunks of a term ready to be recorded as one row, then handed on.
pub(super) struct Batch {
    /// Where the batch's first byte lies in the file.
    file_start: u64,
    /// The xorb chunks `[chunk_start, chunk_end)` decoded.
    chunk_start: u64,
    chunk_end: u64,
    chunks: Vec<Bytes>,
    /// Compressed bytes read since the previous batch.
    fetched: u64,
    /// The term's last batch (its range read and checked whole).
    last: bool,
}

/// A term being read: its xorb range's body decoded chunk by chunk, the
/// chunks gathered into [`Batch`]es.
pub(super) struct TermStream {
    term: Term,
    body: XorbBody,
    chunks: ChunkStream,
    /// Chunks of the term decoded and not yet in a batch.
    batch: Vec<Bytes>,
    /// Where the first of them lies in the file.
    batch_start: u64,
    batch_bytes: u64,
    /// Compressed bytes read from the body.
    read: u64,
    /// Of them, those in batches handed out.
    recorded: u64,
    /// The term's bytes decoded so far.
    decoded: u64,
    ended: bool,
    /// Chunk ranges of the xorb that terms not yet handed on read (kept
    /// in the share's held chunks as they are decoded).
    wanted: Vec<std::ops::Range<u64>>,
    /// The span's read, registered with the share while it lasts.
    _reading: Option<Reading>,
}

impl TermStream {
    /// The xorb index of the next chunk the range holds.
    fn next_index(&self) -> u64 {
        self.term.fetch.chunk_start + self.chunks.taken() as u64
    }

    fn where_(&self, path: &str) -> String {
        let t = &self.term;
        format!(
            "term of xorb {} chunks {}..{} (bytes {}-{}, fetching {path})",
            t.xorb, t.chunk_start, t.chunk_end, t.fetch.first, t.fetch.last
        )
    }

    /// The next batch: [`BATCH_BYTES`] of the term's chunks, or the rest
    /// of them once the range was read to its end and checked (exactly
    /// its chunks, nothing after them, the term's length).
    async fn next_batch(&mut self, path: &str, share: &Share) -> Result<Batch, String> {
        loop {
            // Decoding is CPU work: off the runtime's thread, so the
            // transfer's other tasks (its checkpoints) are not held up.
            if let Some(batch) = block_in_place(|| self.decode_arrived(path, share))? {
                return Ok(batch);
            }
            if self.ended {
                self.chunks
                    .finish()
                    .map_err(|e| format!("{}: {e}", self.where_(path)))?;
                if self.decoded != self.term.length || self.batch.is_empty() {
                    return Err(format!(
                        "{} decodes to {} bytes, the reconstruction says {}",
                        self.where_(path),
                        self.decoded,
                        self.term.length
                    ));
                }
                return Ok(self.cut_batch(true));
            }
            match self.body.next().await? {
                Some(bytes) => {
                    self.read += bytes.len() as u64;
                    self.chunks
                        .push(&bytes)
                        .map_err(|e| format!("{}: {e}", self.where_(path)))?;
                }
                None => self.ended = true,
            }
        }
    }

    /// The chunks decodable from the bytes arrived so far, batched; a
    /// batch once it is full (`None`: the bytes ran out first).
    fn decode_arrived(&mut self, path: &str, share: &Share) -> Result<Option<Batch>, String> {
        while let Some(chunk) = self.take_chunk(path)? {
            let index = self.next_index() - 1;
            share.offer(&self.term.xorb, index, &chunk, &self.wanted);
            if index < self.term.chunk_start || index >= self.term.chunk_end {
                continue;
            }
            self.batch_bytes += chunk.len() as u64;
            self.batch.push(chunk);
            let more = index + 1 < self.term.chunk_end;
            if more && self.batch_bytes >= BATCH_BYTES {
                return Ok(Some(self.cut_batch(false)));
            }
        }
        Ok(None)
    }

    /// The next decoded chunk of the range; the term's never more than
    /// its length.
    fn take_chunk(&mut self, path: &str) -> Result<Option<Bytes>, String> {
        let chunk = self
            .chunks
            .next_chunk()
            .map_err(|e| format!("{}: {e}", self.where_(path)))?;
        if let Some(c) = &chunk {
            let index = self.next_index() - 1;
            if (self.term.chunk_start..self.term.chunk_end).contains(&index) {
                self.decoded += c.len() as u64;
                if self.decoded > self.term.length {
                    return Err(format!(
                        "{} decodes to more than the {} bytes the reconstruction says",
                        self.where_(path),
                        self.term.length
                    ));
                }
            }
        }
        Ok(chunk)
    }

    fn cut_batch(&mut self, last: bool) -> Batch {
        let chunks = std::mem::take(&mut self.batch);
        let chunk_end = if last {
            self.term.chunk_end
        } else {
            self.next_index()
        };
        let batch = Batch {
            file_start: self.batch_start,
            chunk_start: chunk_end - chunks.len() as u64,
            chunk_end,
            fetched: self.read - self.recorded,
            chunks,
            last,
        };
        self.recorded = self.read;
        self.batch_start += self.batch_bytes;
        self.batch_bytes = 0;
        batch
    }
}

/// Terms `next..end` of a reconstruction a body reads, the first starting
/// at `start` in the file with `skip` bytes of it before the body's bytes.
pub(super) struct Segment {
    pub(super) share: Arc<Share>,
    pub(super) next: usize,
    pub(super) end: usize,
    pub(super) start: u64,
    pub(super) skip: u64,
    pub(super) entered: bool,
}

impl Segment {
    /// The terms of `share` from the one holding byte `from` up to (not
    /// including) `end`; `None` when no term holds `from`.
    pub(super) fn holding(share: Arc<Share>, from: u64, end: usize) -> Option<Segment> {
        let (next, start) = share.locate(from)?;
        Some(Segment {
            share,
            next,
            end,
            start,
            skip: from - start,
            entered: false,
        })
    }
}

/// Where a Xet body is: the segments of reconstructions it reads (one, or
/// for a split file's range its edges' own and the shared one between),
/// the bytes of the next term to skip and the bytes still to hand on.
pub(super) struct Cursor {
    pub(super) inner: Arc<Inner>,
    pub(super) path: String,
    pub(super) file: XetFile,
    pub(super) token: CasToken,
    /// What is left to read, the segment being read first.
    pub(super) segments: VecDeque<Segment>,
    /// For a split file's range, the reconstruction of the whole file its
    /// ranges share: kept alive while this body lives (even when it holds
    /// no term of it whole), dropped for new bodies when this one fails.
    pub(super) whole_file: Option<Arc<Share>>,
    pub(super) term_start: u64,
    pub(super) skip: u64,
    pub(super) left: u64,
    /// Decoded chunks recorded and not yet handed on (already cut to the
    /// span).
    pub(super) pending: VecDeque<Bytes>,
    /// The term being read (its reconstruction and index), when one is.
    pub(super) reading: Option<(TermStream, Arc<Share>, usize)>,
}

/// `chunks` cut to the span that skips `skip` bytes and hands on `left`:
/// the pieces handed on, the bytes skipped, and the new `skip` and `left`.
pub(super) fn cut(chunks: &[Bytes], mut skip: u64, mut left: u64) -> (Vec<Bytes>, u64, u64, u64) {
    let mut pieces = Vec::with_capacity(chunks.len());
    let mut skipped = 0u64;
    for c in chunks {
        let len = c.len() as u64;
        let head = skip.min(len);
        let take = left.min(len - head);
        skip -= head;
        left -= take;
        skipped += len - take;
        if take > 0 {
            // Both are at most `c.len()`, a usize.
            let (from, to) = (head as usize, (head + take) as usize);
            pieces.push(c.slice(from..to));
        }
    }
    (pieces, skipped, skip, left)
}

impl Cursor {
    /// Whether the next step starts a term: nothing of the last one is
    /// left to hand on and bytes of the span are.
    pub(super) fn starts_a_term(&self) -> bool {
        self.pending.is_empty() && self.reading.is_none() && self.left > 0
    }

    /// The next chunk's bytes of the span (the stream's step): one chunk
    /// at a time, so the transfer checkpoints inside a term, each chunk
    /// handed on only once its batch's hashes are recorded.
    pub(super) async fn step(mut self) -> Option<(std::result::Result<Bytes, BodyError>, Cursor)> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some((Ok(chunk), self));
            }
            if self.reading.is_none() {
                if self.left == 0 {
                    return None;
                }
                if let Err(e) = self.next_term().await {
                    return Some(self.fail(e));
                }
                continue;
            }
            if let Err(e) = self.read_batch().await {
                return Some(self.fail(e));
            }
        }
    }

    /// The next term handed on from held chunks, read back from old
    /// files, or asked from the CAS (its first batch read by the next
    /// step).
    async fn next_term(&mut self) -> Result<(), String> {
        let (share, index) = self.advance()?;
        let term = share.recon.terms[index].clone();
        let file_start = self.term_start;
        self.term_start += term.length;
        if self.hand_on_if_held(&share, index, file_start).await? {
            return Ok(());
        }
        if self.reuse_term(&term, file_start).await? {
            share.handed_on(index);
            return Ok(());
        }
        let mut waits = 0;
        let reading = loop {
            match share.claim_span(&term) {
                Claim::Mine(reading) => break reading,
                Claim::Wait(rx) if waits < MAX_SPAN_WAITS => {
                    waits += 1;
                    Claim::wait(rx, self.inner.read_timeout).await;
                    if self.hand_on_if_held(&share, index, file_start).await? {
                        return Ok(());
                    }
                }
                Claim::Wait(_) => break share.take_span(&term),
            }
        };
        let mut stream = self
            .inner
            .term(&self.token, &self.path, &term, file_start)
            .await?;
        stream.wanted = share.wanted_by_others(index);
        stream._reading = Some(reading);
        self.reading = Some((stream, share, index));
        Ok(())
    }

    /// The next term's reconstruction and index, entering the next
    /// segment where one ends.
    fn advance(&mut self) -> Result<(Arc<Share>, usize), String> {
        while let Some(seg) = self.segments.front_mut() {
            if seg.next < seg.end {
                if !seg.entered {
                    (self.term_start, self.skip) = (seg.start, seg.skip);
                    seg.entered = true;
                }
                let index = seg.next;
                seg.next += 1;
                return Ok((seg.share.clone(), index));
            }
            self.segments.pop_front();
        }
        Err(format!(
            "the reconstruction of {} ended {} bytes early",
            self.path, self.left
        ))
    }

    /// Term `index` of `share` handed on from chunks held for it; `false`
    /// when not all are held.
    async fn hand_on_if_held(
        &mut self,
        share: &Share,
        index: usize,
        file_start: u64,
    ) -> Result<bool, String> {
        let Some(chunks) = share.take_held(index) else {
            return Ok(false);
        };
        let term = &share.recon.terms[index];
        self.hand_on_held(term, file_start, &chunks).await?;
        share.handed_on(index);
        Ok(true)
    }

    /// Ends the body with `e` (redacted).
    fn fail(mut self, e: String) -> (std::result::Result<Bytes, BodyError>, Cursor) {
        let shares = self.segments.iter().map(|seg| &seg.share);
        for share in shares.chain(&self.whole_file) {
            share.mark_stale();
        }
        self.left = 0;
        self.reading = None;
        self.pending.clear();
        (
            Err(BodyError(ftpipe_secrets::redact(&e).into_owned())),
            self,
        )
    }

    /// The current term's next batch read, recorded, and queued to be
    /// handed on.
    async fn read_batch(&mut self) -> Result<(), String> {
        let Some((reading, share, index)) = self.reading.as_mut() else {
            return Ok(());
        };
        let batch = reading.next_batch(&self.path, share).await?;
        let (pieces, skipped, skip, left) = cut(&batch.chunks, self.skip, self.left);
        let xorb = reading.term.xorb.clone();
        let (share, index) = (share.clone(), *index);
        let chunks = (batch.chunk_start..batch.chunk_end, batch.chunks.as_slice());
        self.record(&xorb, batch.file_start, chunks, batch.fetched, skipped)
            .await?;
        if batch.last {
            self.reading = None;
            share.handed_on(index);
        }
        (self.skip, self.left) = (skip, left);
        self.pending.extend(pieces);
        Ok(())
    }

    /// `term`'s chunks, held from a range an earlier term read, cut to
    /// the span, recorded (no compressed bytes of their own) and queued.
    async fn hand_on_held(
        &mut self,
        term: &Term,
        file_start: u64,
        chunks: &[Bytes],
    ) -> Result<(), String> {
        let (pieces, skipped, skip, left) = cut(chunks, self.skip, self.left);
        let range = term.chunk_start..term.chunk_end;
        self.record(&term.xorb, file_start, (range, chunks), 0, skipped)
            .await?;
        (self.skip, self.left) = (skip, left);
        self.pending.extend(pieces);
        Ok(())
    }

    /// Records chunks `range` of `xorb` (their bytes `chunks`), the first
    /// at `file_start` of the file, as fetched: `fetched` compressed bytes
    /// read for them, `skipped` of them outside the span.
    async fn record(
        &self,
        xorb: &str,
        file_start: u64,
        (range, chunks): (std::ops::Range<u64>, &[Bytes]),
        fetched: u64,
        skipped: u64,
    ) -> Result<(), String> {
        let decoded: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let row = XetTermRow {
            path: self.path.clone(),
            xet_hash: self.file.xet_hash.clone(),
            file_start,
            file_end: file_start + decoded,
            xorb: xorb.to_owned(),
            chunk_start: range.start,
            chunk_end: range.end,
            chunks: block_in_place(|| {
                chunks
                    .iter()
                    .map(|c| (XetDigest::of_chunk(c).hex(), c.len() as u64))
                    .collect()
            }),
            fetched,
            decoded,
            skipped,
        };
        self.inner
            .store
            .record_xet_term(&row)
            .await
            .map_err(|e| e.to_string())?;
        crashpoint::hit(CrashPoint::XetTermRecorded);
        Ok(())
    }
}
