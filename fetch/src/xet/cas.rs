//! The CAS half of [`super::XetSource`]: the reconstruction of a span, the
//! xorb range of each term (held to exactly the range asked), and the body
//! that decodes, hashes and records term after term.

use std::sync::Arc;

use std::collections::VecDeque;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_RANGE, RANGE};
use url::Url;

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_receipts::XetTermRow;

use super::hash::{XetDigest, file_hash};
use super::wire::{MAX_RECONSTRUCTION_BYTES, Reconstruction, Term};
use super::xorb::decode_chunks;
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
                let transient =
                    status.is_server_error() || matches!(status.as_u16(), 401 | 403 | 429);
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
            check_covers(path, &recon, end - from)?;
            return Ok(recon);
        }
        Err(refused(
            path,
            "reconstruction",
            "neither v2 nor v1 is served".into(),
        ))
    }

    /// The bytes of `term`'s xorb range: exactly `[first, last]`.
    async fn xorb_range(
        &self,
        token: &CasToken,
        path: &str,
        term: &Term,
    ) -> Result<Vec<u8>, String> {
        let f = &term.fetch;
        let url = Url::parse(&f.url).map_err(|e| format!("xorb URL is not a URL: {e}"))?;
        let want = f.last - f.first + 1;
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
        let body = bounded(resp, want)
            .await
            .map_err(|e| {
                format!(
                    "{}: {}",
                    shown(&url),
                    crate::source::error_chain(&e.without_url())
                )
            })?
            .ok_or_else(|| {
                format!(
                    "{} sent more than the {want} bytes of {asked} of xorb {}",
                    shown(&url),
                    term.xorb
                )
            })?;
        if body.len() as u64 != want {
            return Err(format!(
                "{} sent {} of the {want} bytes of {asked} of xorb {} (fetching {path})",
                shown(&url),
                body.len(),
                term.xorb
            ));
        }
        Ok(body)
    }

    /// `term` fetched, decoded and hashed; recorded as the term at
    /// `file_start` of `path`. Returns its decoded chunks.
    async fn term(
        &self,
        token: &CasToken,
        path: &str,
        file: &XetFile,
        term: &Term,
        place: Place,
    ) -> Result<Vec<Bytes>, String> {
        let file_start = place.file_start;
        let raw = self.xorb_range(token, path, term).await?;
        let f = &term.fetch;
        let count = usize::try_from(f.chunk_end - f.chunk_start).map_err(|e| e.to_string())?;
        let chunks = decode_chunks(&raw, count).map_err(|e| {
            format!(
                "xorb {} bytes {}-{} (fetching {path}): {e}",
                term.xorb, f.first, f.last
            )
        })?;
        let from = usize::try_from(term.chunk_start - f.chunk_start).map_err(|e| e.to_string())?;
        let to = usize::try_from(term.chunk_end - f.chunk_start).map_err(|e| e.to_string())?;
        let mut chunks = chunks;
        chunks.truncate(to);
        let mine = chunks.split_off(from);
        let length: u64 = mine.iter().map(|c| c.len() as u64).sum();
        if length != term.length {
            return Err(format!(
                "term of xorb {} chunks {}..{} decodes to {length} bytes, the reconstruction says {} (fetching {path})",
                term.xorb, term.chunk_start, term.chunk_end, term.length
            ));
        }
        let row = XetTermRow {
            path: path.to_owned(),
            xet_hash: file.xet_hash.clone(),
            file_start,
            file_end: file_start + length,
            xorb: term.xorb.clone(),
            chunk_start: term.chunk_start,
            chunk_end: term.chunk_end,
            chunks: mine
                .iter()
                .map(|c| (XetDigest::of_chunk(c).hex(), c.len() as u64))
                .collect(),
            fetched: raw.len() as u64,
            decoded: length,
            skipped: length - length.saturating_sub(place.skip).min(place.left),
        };
        self.store
            .record_xet_term(&row)
            .await
            .map_err(|e| e.to_string())?;
        crashpoint::hit(CrashPoint::XetTermRecorded);
        Ok(mine)
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

/// The terms of `recon` must hold at least the `want` bytes asked after
/// their offset.
fn check_covers(path: &str, recon: &Reconstruction, want: u64) -> Result<()> {
    let total = recon
        .terms
        .iter()
        .try_fold(0u64, |acc, t| acc.checked_add(t.length))
        .ok_or_else(|| refused(path, "reconstruction", "term lengths overflow".into()))?;
    if total.saturating_sub(recon.offset) < want {
        return Err(refused(
            path,
            "reconstruction",
            format!(
                "its terms hold {total} bytes, {} after offset_into_first_range {}, fewer than the {want} asked",
                total.saturating_sub(recon.offset),
                recon.offset
            ),
        ));
    }
    Ok(())
}

/// Where a term lies: its first byte in the file, the bytes of it before
/// the span asked and the bytes of the span still to hand on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    pub(super) file_start: u64,
    pub(super) skip: u64,
    pub(super) left: u64,
}

/// Where a Xet body is: the next term, the bytes of it to skip (the
/// span's offset into the first) and the bytes still to hand on.
pub(super) struct Cursor {
    pub(super) inner: Arc<Inner>,
    pub(super) path: String,
    pub(super) file: XetFile,
    pub(super) token: CasToken,
    pub(super) recon: Reconstruction,
    pub(super) next: usize,
    pub(super) term_start: u64,
    pub(super) skip: u64,
    pub(super) left: u64,
    /// Decoded chunks of the current term not yet handed on (already cut
    /// to the span).
    pub(super) pending: VecDeque<Bytes>,
}

impl Cursor {
    fn place(&self) -> Place {
        Place {
            file_start: self.term_start,
            skip: self.skip,
            left: self.left,
        }
    }

    /// The next chunk's bytes of the span (the stream's step): one chunk
    /// at a time, so the transfer checkpoints inside a term.
    pub(super) async fn step(mut self) -> Option<(std::result::Result<Bytes, BodyError>, Cursor)> {
        if let Some(chunk) = self.pending.pop_front() {
            return Some((Ok(chunk), self));
        }
        if self.left == 0 {
            return None;
        }
        let Some(term) = self.recon.terms.get(self.next).cloned() else {
            let e = format!(
                "the reconstruction of {} ended {} bytes early",
                self.path, self.left
            );
            self.left = 0;
            return Some((Err(BodyError(e)), self));
        };
        self.next += 1;
        let (inner, place) = (&self.inner, self.place());
        let got = match inner
            .reused_term(&self.path, &self.file, &term, place)
            .await
        {
            Ok(None) => {
                inner
                    .term(&self.token, &self.path, &self.file, &term, place)
                    .await
            }
            reused => reused.map(Option::unwrap_or_default),
        };
        match got {
            Err(e) => {
                self.left = 0;
                Some((
                    Err(BodyError(ftpipe_secrets::redact(&e).into_owned())),
                    self,
                ))
            }
            Ok(chunks) => {
                self.term_start += term.length;
                for c in chunks {
                    let skip = usize::try_from(self.skip)
                        .unwrap_or(usize::MAX)
                        .min(c.len());
                    let take = usize::try_from(self.left)
                        .unwrap_or(usize::MAX)
                        .min(c.len() - skip);
                    self.skip -= skip as u64;
                    self.left -= take as u64;
                    if take > 0 {
                        self.pending.push_back(c.slice(skip..skip + take));
                    }
                }
                let first = self.pending.pop_front().unwrap_or_default();
                Some((Ok(first), self))
            }
        }
    }
}
