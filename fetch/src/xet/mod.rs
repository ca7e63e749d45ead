//! Xet storage behind the byte-source seam ([`XetSource`]): a file the
//! listing names with a Xet hash is fetched by reconstruction, as
//! huggingface_hub 2.x and hf_xet do it, instead of through `resolve`:
//!
//! 1. a read token from the hub's refresh route (`X-Xet-Cas-Url`,
//!    `X-Xet-Access-Token`, `X-Xet-Token-Expiration`, or the same in the
//!    JSON body), refreshed a minute before it expires; the token is sent
//!    only to the CAS URL's origin, registered with the redaction point;
//! 2. the span's reconstruction, `/v2/reconstructions/{hash}` (v1 when v2
//!    answers 404 or 501) with the span as `Range` (`wire`); a split
//!    file's ranges read the terms they hold whole from one
//!    reconstruction of the whole file they share (`share`), so a xorb
//!    span is fetched once for all of them;
//! 3. per term, its xorb byte range (`GET` with exactly that `Range`: a
//!    `206` whose `Content-Range` names it, or, from a server that leaves
//!    `Content-Range` off, a `206` of exactly its length; a `200`, another
//!    range, a short or long body are refused), decoded chunk by chunk as
//!    its bytes arrive (`xorb`), each chunk hashed (`hash`), and the
//!    chunks recorded with their hashes in the store a batch (1 MiB, or
//!    the term's rest) at a time, each batch before its bytes are handed
//!    on: a cut or a kill inside a term loses at most one batch, and what
//!    the body read ahead of its reader within the term
//!    (`read_ahead`, at most 1 MiB);
//! 4. after the file's SHA-256 matched, [`ByteSource::check_whole`]
//!    recomputes the file's Xet hash from the recorded chunk hashes.
//!
//! Before a term is fetched (step 3), `reuse` looks its chunks up among
//! those earlier fetches recorded (a previous revision in this directory,
//! another directory's with `--reuse-from`): a term whose every chunk an
//! old file still holds, each checked against its recorded hash, is read
//! from there and recorded as reused, not fetched.
//!
//! A failure of a xorb fetch (an expired URL's `403` included) ends the
//! body: the transfer retries from its watermark and that asks for the
//! reconstruction again. Files without a Xet hash go to the fallback source
//! (the hub's `resolve`).
//!
//! Modules: `hash` (chunk and file hashes), `xorb` (chunk decoding,
//! `lz4frame` the LZ4 frames inside),
//! `wire` (the JSON answers), `cas` (reconstruction, xorb ranges, the
//! body), `held` (chunks of a range kept for the terms not yet handed on
//! that read it again, so a range shared by terms is fetched once),
//! `share` (the reconstruction a split file's ranges share), `reuse`
//! (terms read back from the files of earlier fetches, [`ChunkReuse`]),
//! `tail` (bytes a crash left past a watermark, kept where their recorded
//! chunk hashes match).

mod cas;
mod hash;
mod held;
mod lz4frame;
mod reuse;
mod share;
mod tail;
mod wire;
mod xorb;

pub use reuse::ChunkReuse;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use reqwest::header::HeaderMap;
use url::Url;

use ftpipe_fs::ErrorClass;
use ftpipe_fs::direct::DirectFile;
use ftpipe_hub::client::{HubClient, LinkedMeta};
use ftpipe_receipts::Store;

use crate::error::{FetchError, Result, SourceFailure};
use crate::source::{
    Ask, Body, ByteSource, ReadOutcome, Reply, SentSpan, SourceFuture, Span, WireRecord,
};
use cas::{Cursor, Segment};
use share::Share;
use std::collections::VecDeque;
use wire::{MAX_TOKEN_BYTES, TokenBody};

/// Decoded bytes a body holds read ahead of its reader, at most (one
/// batch, [`cas::BATCH_BYTES`]).
const READ_AHEAD_BYTES: u32 = 1 << 20;
/// The unit [`READ_AHEAD_BYTES`] is counted in.
const READ_AHEAD_UNIT: u32 = 4096;

/// A token is refreshed this long before it expires.
const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// What goes wrong fetching through Xet storage.
#[derive(Debug, thiserror::Error)]
pub enum XetError {
    /// The read-token answer cannot be used.
    #[error("Xet read token from {route}: {what}")]
    Token {
        /// The refresh route (no credentials).
        route: String,
        /// What is wrong.
        what: String,
    },
    /// The hub refused the read-token request or did not answer.
    #[error("Xet read token from {route}")]
    TokenRequest {
        /// The refresh route.
        route: String,
        /// Why.
        #[source]
        source: ftpipe_hub::HubError,
    },
    /// A CAS request failed before an answer.
    #[error("Xet CAS request {url}")]
    Http {
        /// The URL (no query: presigned URLs carry signatures).
        url: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The CAS answered a status this client cannot use.
    #[error("Xet CAS answered {status} to {url} ({what})")]
    Status {
        /// The URL (no query).
        url: String,
        /// The status.
        status: u16,
        /// For which file and range.
        what: String,
    },
    /// An answer refused by its content.
    #[error("Xet {what} for {path}: {detail}")]
    Refused {
        /// Which answer.
        what: &'static str,
        /// The file.
        path: String,
        /// What was expected and what came.
        detail: String,
    },
    /// The chunks recorded for a file do not hash to its Xet hash.
    #[error(
        "Xet hash of {path}: its {chunks} chunks hash to {actual}, the listing says {expected}"
    )]
    FileHash {
        /// The file.
        path: String,
        /// Chunks hashed.
        chunks: usize,
        /// The listing's Xet hash.
        expected: String,
        /// The hash of the chunks.
        actual: String,
    },
}

impl XetError {
    fn into_fetch(self, transient: bool) -> FetchError {
        let class = match self {
            XetError::FileHash { .. } => ErrorClass::Verification,
            _ => ErrorClass::Failure,
        };
        FetchError::Source(SourceFailure {
            transient,
            class,
            error: Box::new(self),
        })
    }
}

/// A URL without its query (presigned URLs carry their signature there).
fn shown(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    ftpipe_secrets::redact(u.as_str()).into_owned()
}

/// A file fetched through Xet: its Xet hash and size from the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XetFile {
    /// The Xet hash (64 hex).
    pub xet_hash: String,
    /// The size.
    pub size: u64,
}

/// A read token and where it may go.
#[derive(Clone)]
struct CasToken {
    cas: Url,
    token: String,
    expires: u64,
}

/// The files of one pinned commit through Xet storage, the others through
/// `fallback`.
pub struct XetSource {
    inner: Arc<Inner>,
    fallback: Arc<dyn ByteSource>,
}

struct Inner {
    hub: HubClient,
    route: Url,
    files: HashMap<String, XetFile>,
    cas: reqwest::Client,
    token: tokio::sync::Mutex<Option<CasToken>>,
    store: Arc<Store>,
    reuse: ChunkReuse,
    /// A CAS read stalls out after this long; a term waits at most this
    /// long for another body's read of its span.
    read_timeout: Duration,
    /// Per path, the whole-file reconstruction its ranges share, while a
    /// body reads it.
    shares: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Weak<Share>>>>>,
}

impl XetSource {
    /// A source of `files` (path → Xet file) of `repo` at `commit`, asking
    /// the hub of `hub` for read tokens (the default route,
    /// `/api/models/{repo}/xet-read-token/{commit}`); CAS reads stall out
    /// after `read_timeout`; reconstructions recorded in `store`; terms
    /// whose chunks earlier fetches hold taken from them (`reuse`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hub: HubClient,
        repo: &str,
        commit: &str,
        files: HashMap<String, XetFile>,
        read_timeout: Duration,
        store: Arc<Store>,
        reuse: ChunkReuse,
        fallback: Arc<dyn ByteSource>,
    ) -> Result<XetSource> {
        let raw = format!(
            "{}/api/models/{repo}/xet-read-token/{commit}",
            hub.endpoint()
        );
        let route = Url::parse(&raw).map_err(|e| FetchError::InvalidInput {
            what: "Xet refresh route",
            message: format!("{raw}: {e}"),
        })?;
        let cas = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .read_timeout(read_timeout)
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("ftpipe/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::internal(format!("Xet HTTP client: {e}")))?;
        let inner = Inner {
            hub,
            route,
            files,
            cas,
            token: tokio::sync::Mutex::new(None),
            store,
            reuse,
            read_timeout,
            shares: std::sync::Mutex::default(),
        };
        Ok(XetSource {
            inner: Arc::new(inner),
            fallback,
        })
    }
}

impl ByteSource for XetSource {
    fn host(&self, path: &str) -> Result<String> {
        if !self.inner.files.contains_key(path) {
            return self.fallback.host(path);
        }
        Ok(self.inner.route.host_str().unwrap_or_default().to_owned())
    }

    fn read<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, Reply> {
        let Some(file) = self.inner.files.get(path).cloned() else {
            return self.fallback.read(path, ask);
        };
        Box::pin(async move { self.inner.clone().read(path, &file, ask).await })
    }

    fn check_whole<'a>(&'a self, path: &'a str) -> SourceFuture<'a, ()> {
        Box::pin(async move {
            match self.inner.files.get(path) {
                Some(file) => self.inner.check_whole(path, file).await,
                None => self.fallback.check_whole(path).await,
            }
        })
    }

    fn proven_tail<'a>(
        &'a self,
        path: &'a str,
        part: &'a DirectFile,
        from: u64,
        to: u64,
    ) -> SourceFuture<'a, u64> {
        Box::pin(async move {
            match self.inner.files.get(path) {
                Some(file) => self.inner.proven_tail(path, file, part, from, to).await,
                None => self.fallback.proven_tail(path, part, from, to).await,
            }
        })
    }

    /// Not for a Xet file: a term's chunks are handed on a batch
    /// ([`cas::BATCH_BYTES`] decoded) at a time, once the batch is decoded
    /// and recorded, so a healthy link hands on nothing for as long as a
    /// batch takes; every CAS read ends at `--read-timeout` when nothing
    /// arrives.
    fn rate_rule_holds(&self, path: &str) -> bool {
        if self.inner.files.contains_key(path) {
            false
        } else {
            self.fallback.rate_rule_holds(path)
        }
    }

    /// A Xet file's chunks are decoded and hashed as its ranges are read.
    fn decodes_bodies(&self, path: &str) -> bool {
        self.inner.files.contains_key(path) || self.fallback.decodes_bodies(path)
    }
}

impl Inner {
    async fn read(self: Arc<Self>, path: &str, file: &XetFile, ask: Ask<'_>) -> Result<Reply> {
        let (from, end) = ask.span.bounds(file.size).unwrap_or((0, file.size));
        if from >= end || end > file.size {
            return Err(FetchError::internal(format!(
                "asked {from}..{end} of {path} ({} bytes)",
                file.size
            )));
        }
        let token = self.token(false).await?;
        let (segments, whole_file) = match ask.span {
            Span::Range { .. } => {
                let shared = self.whole_file_share(&token, path, file).await?;
                let segments = self
                    .range_segments(&token, path, file, (from, end), &shared)
                    .await?;
                (segments, Some(shared))
            }
            Span::Whole | Span::From(_) => {
                let own = self.own_segment(&token, path, file, from, end).await?;
                (VecDeque::from([own]), None)
            }
        };
        let cas_host = token.cas.host_str().unwrap_or_default().to_owned();
        let validator = Some(format!("\"xet:{}\"", file.xet_hash));
        let cursor = Cursor {
            segments,
            whole_file,
            term_start: from,
            skip: 0,
            left: end - from,
            pending: VecDeque::new(),
            reading: None,
            inner: self.clone(),
            path: path.to_owned(),
            file: file.clone(),
            token,
        };
        let body = read_ahead(cursor);
        let length = Some(end - from);
        let outcome = match ask.span {
            Span::Whole => ReadOutcome::Whole {
                validator,
                length,
                body,
            },
            Span::From(_) | Span::Range { .. } => ReadOutcome::Span {
                sent: Some(SentSpan {
                    first: from,
                    end,
                    total: file.size,
                }),
                validator,
                length,
                body,
            },
        };
        Ok(Reply {
            host: cas_host,
            meta: LinkedMeta::default(),
            wire: WireRecord::default(),
            outcome,
        })
    }

    /// The segments a range `[from, end)` of a split file reads: the terms
    /// it holds whole from `shared`, the reconstruction of the whole file
    /// its ranges share, those on its edges from reconstructions of the
    /// edges alone; all from one reconstruction of the range when it holds
    /// no term whole, or when an edge's reconstruction does not end where
    /// the shared terms start.
    async fn range_segments(
        &self,
        token: &CasToken,
        path: &str,
        file: &XetFile,
        (from, end): (u64, u64),
        shared: &Arc<Share>,
    ) -> Result<VecDeque<Segment>> {
        let inside = shared.inside(from, end);
        let alone = || self.own_segment(token, path, file, from, end);
        if inside.is_empty() {
            return Ok(VecDeque::from([alone().await?]));
        }
        let (first, last) = (shared.start(inside.start), shared.end(inside.end - 1));
        let mut segments = VecDeque::new();
        if from < first {
            let head = self.own_segment(token, path, file, from, first).await?;
            if head.share.end(head.end - 1) != first {
                return Ok(VecDeque::from([alone().await?]));
            }
            segments.push_back(head);
        }
        segments.push_back(Segment {
            share: shared.clone(),
            next: inside.start,
            end: inside.end,
            start: first,
            skip: 0,
            entered: false,
        });
        if last < end {
            segments.push_back(self.own_segment(token, path, file, last, end).await?);
        }
        Ok(segments)
    }

    /// The terms of a reconstruction of `[from, end)` alone.
    async fn own_segment(
        &self,
        token: &CasToken,
        path: &str,
        file: &XetFile,
        from: u64,
        end: u64,
    ) -> Result<Segment> {
        let recon = self.reconstruction(token, path, file, from, end).await?;
        let count = recon.terms.len();
        let share = Arc::new(Share::private(recon, from).map_err(FetchError::internal)?);
        Segment::holding(share, from, count).ok_or_else(|| {
            FetchError::internal(format!(
                "no term of {path}'s reconstruction holds byte {from}"
            ))
        })
    }

    /// The reconstruction of the whole of `file` its ranges share: the one
    /// a live body reads while it is [usable](Share::usable), else asked
    /// (one ask at a time per path, so ranges starting together ask once).
    async fn whole_file_share(
        &self,
        token: &CasToken,
        path: &str,
        file: &XetFile,
    ) -> Result<Arc<Share>> {
        let slot = {
            let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
            shares.entry(path.to_owned()).or_default().clone()
        };
        let mut current = slot.lock().await;
        if let Some(share) = current.upgrade()
            && share.usable()
        {
            return Ok(share);
        }
        let recon = self.reconstruction(token, path, file, 0, file.size).await?;
        let share = Arc::new(Share::whole_file(recon).map_err(FetchError::internal)?);
        *current = Arc::downgrade(&share);
        Ok(share)
    }

    /// The read token, asked for again when `renew` or within
    /// [`REFRESH_MARGIN`] of its expiry.
    async fn token(&self, renew: bool) -> Result<CasToken> {
        let mut slot = self.token.lock().await;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Some(t) = slot.as_ref()
            && !renew
            && t.expires > now.saturating_add(REFRESH_MARGIN.as_secs())
        {
            return Ok(t.clone());
        }
        let t = self.ask_token().await?;
        *slot = Some(t.clone());
        Ok(t)
    }

    async fn ask_token(&self) -> Result<CasToken> {
        let route = ftpipe_secrets::redact(self.route.as_str()).into_owned();
        let (body, headers) = self
            .hub
            .get_bytes_limited(&self.route, MAX_TOKEN_BYTES)
            .await
            .map_err(|source| {
                let transient = source.is_transient();
                XetError::TokenRequest {
                    route: route.clone(),
                    source,
                }
                .into_fetch(transient)
            })?;
        let bad = |what: String| {
            XetError::Token {
                route: route.clone(),
                what,
            }
            .into_fetch(false)
        };
        let (cas, token, exp) = token_fields(&headers, &body).map_err(bad)?;
        let cas = Url::parse(&cas).map_err(|e| bad(format!("CAS URL is not a URL: {e}")))?;
        if !matches!(cas.scheme(), "http" | "https") || cas.host_str().is_none() {
            return Err(bad(format!("CAS URL {} is not http(s)", shown(&cas))));
        }
        if !cas.username().is_empty() || cas.password().is_some() {
            return Err(bad("CAS URL carries credentials".into()));
        }
        ftpipe_secrets::register(&token);
        Ok(CasToken {
            cas,
            token,
            expires: exp,
        })
    }
}

/// The CAS URL, token and expiry of a read-token answer: the `X-Xet-*`
/// headers (huggingface_hub reads these), else the JSON body (hf_xet's).
fn token_fields(
    headers: &HeaderMap,
    body: &[u8],
) -> std::result::Result<(String, String, u64), String> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let (Some(cas), Some(token), Some(exp)) = (
        get("x-xet-cas-url"),
        get("x-xet-access-token"),
        get("x-xet-token-expiration"),
    ) {
        let exp = exp.trim().parse().map_err(|_| {
            format!("X-Xet-Token-Expiration {exp:?} is not seconds since the epoch")
        })?;
        return Ok((cas.to_owned(), token.to_owned(), exp));
    }
    let b: TokenBody = serde_json::from_slice(body).map_err(|e| {
        format!("neither X-Xet-Cas-Url, X-Xet-Access-Token, X-Xet-Token-Expiration nor a JSON body {{accessToken, exp, casUrl}}: {e}")
    })?;
    Ok((b.cas_url, b.access_token, b.exp))
}

/// The body of `cursor`, read on a task of its own up to
/// [`READ_AHEAD_BYTES`] ahead of the reader within a term: the term's next
/// batch is decoded and recorded (an fsync) while the reader writes the
/// last one, instead of each waiting for the other. A new term (a new xorb
/// request, or chunks taken from elsewhere) is started only once the
/// reader has taken every byte before it and asked for more: a range cut
/// short by a split never asks for a term past its new end. The task ends
/// at the body's end or error, or as soon as the reader has dropped the
/// body (the step under way with it).
fn read_ahead(cursor: Cursor) -> Body {
    let units = READ_AHEAD_BYTES / READ_AHEAD_UNIT;
    let room = Arc::new(tokio::sync::Semaphore::new(units as usize));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut cursor = cursor;
        loop {
            if cursor.starts_a_term() {
                // Every byte read ahead taken (or the reader gone).
                let Ok(all) = room.acquire_many(units).await else {
                    return;
                };
                drop(all);
            }
            // A reader gone ends the step under way, as dropping a body
            // read in step with its reader did (a term it was waiting for
            // or asking is never fetched for nobody).
            let stepped = tokio::select! {
                stepped = cursor.step() => stepped,
                () = tx.closed() => return,
            };
            let Some((item, next)) = stepped else {
                return;
            };
            let len = item.as_ref().map_or(0, bytes::Bytes::len);
            let need = u32::try_from(len.div_ceil(READ_AHEAD_UNIT as usize))
                .unwrap_or(units)
                .min(units);
            let Ok(held) = room.clone().acquire_many_owned(need).await else {
                return;
            };
            let failed = item.is_err();
            if tx.send((item, held)).is_err() || failed {
                return;
            }
            cursor = next;
        }
    });
    let state = (rx, None, Some(task));
    Body::stream(
        futures_util::stream::unfold(state, |(mut rx, taken, mut task)| async move {
            // The reader asks for more: it is done with the bytes before,
            // and their room is given back. A reader that reached its end
            // never asks, so no term past it is started.
            drop::<Option<tokio::sync::OwnedSemaphorePermit>>(taken);
            if let Some((item, room)) = rx.recv().await {
                return Some((item, (rx, Some(room), task)));
            }
            // The task's panic is the reader's, as when it read in step.
            if let Some(task) = task.take()
                && let Err(e) = task.await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
            None
        })
        .boxed(),
    )
}
