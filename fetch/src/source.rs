//! The byte source: where a pinned file's bytes come from, in
//! transport-neutral terms. The transfer machinery (one stream or ranges)
//! asks a source for a span of a file under a validator ([`Ask`]) and gets
//! a typed answer ([`Reply`]): the span it sent with its validator, the
//! whole file from byte 0 instead, or a refusal. It never sees a status
//! or a header: each source maps its own protocol onto these outcomes in
//! one place (`crate::hubsource` for the hub's HTTP; object storage and
//! the other sources live above this crate and implement [`ByteSource`]),
//! and the one response check (`crate::attempt::check`) judges every
//! source's answer by the same rules.
//!
//! What a source must provide:
//!
//! - a read of `[from, end)` (or the whole file) under the validator the
//!   kept bytes were fetched under: either exactly that span
//!   ([`ReadOutcome::Span`], saying which span it sent), or the whole
//!   current file from byte 0 when it cannot honour the span or the file
//!   changed ([`ReadOutcome::Whole`]; the transfer then drops what it kept
//!   and the digest decides), or a refusal ([`ReadOutcome::Refused`]: its
//!   error's [`FetchError::is_transient`] decides whether a retry may help);
//! - the body as `bytes::Bytes` chunks as they arrive ([`Body`]);
//! - what it can say of the exchange for the attempt's row
//!   ([`WireRecord`]: a status, an ETag, a range as the protocol wrote
//!   them, each only where the source has one).
//!
//! Invariant: a source never splices bytes of two versions of a file: a
//! [`ReadOutcome::Span`] is sent under the asked validator (or the check
//! refuses it), and anything else starts at byte 0.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::stream::BoxStream;

use crate::error::{FetchError, Result};
use ftpipe_fs::direct::DirectFile;
use ftpipe_hub::client::LinkedMeta;

/// A future a [`ByteSource`] returns (object-safe: the fetch holds its
/// source as `dyn ByteSource`; one allocation per request, none per chunk).
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Which bytes of a file a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The whole file, without a range.
    Whole,
    /// From this byte to the end.
    From(u64),
    /// `[from, end)`.
    Range {
        /// First byte.
        from: u64,
        /// One past the last byte.
        end: u64,
    },
}

impl Span {
    /// The first byte asked for, when a range is asked at all.
    pub fn start(self) -> Option<u64> {
        match self {
            Span::Whole => None,
            Span::From(start) => Some(start),
            Span::Range { from, .. } => Some(from),
        }
    }

    /// `[from, end)` of a file of `size` bytes, when a range is asked.
    pub fn bounds(self, size: u64) -> Option<(u64, u64)> {
        match self {
            Span::Whole => None,
            Span::From(start) => Some((start, size)),
            Span::Range { from, end } => Some((from, end)),
        }
    }
}

/// One request: a span of a file, under a validator.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The bytes asked for.
    pub span: Span,
    /// The validator the bytes kept so far were fetched under: sent with
    /// any range, never without one.
    pub validator: Option<&'a str>,
}

impl Ask<'_> {
    /// The validator sent with this request (only with a range).
    pub fn sent_validator(&self) -> Option<&str> {
        self.span.start().and(self.validator)
    }
}

/// Where a file's bytes come from.
pub trait ByteSource: Send + Sync {
    /// The host a request for `path` goes to first (recorded with the
    /// attempt before any answer; a redirect may end elsewhere).
    fn host(&self, path: &str) -> Result<String>;

    /// Reads `ask` of `path`; the answer's body unread. `Err` only when no
    /// answer came at all (a connection that failed, a bad request).
    fn read<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, Reply>;

    /// A source's own check of the whole of `path`, once its bytes matched
    /// the pinned digest and before it is published (Xet: the file hash of
    /// the chunks recorded); none by default.
    fn check_whole<'a>(&'a self, _path: &'a str) -> SourceFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    /// How far the bytes of `path` a crash left written in `part` past a
    /// watermark, from `from` up to `to`, are proven to be the bytes this
    /// source handed on, by what it recorded before handing them on (Xet:
    /// each chunk's hash and place, recorded a batch at a time before its
    /// bytes went on). `from` when nothing proves them (the default: a hub
    /// file's bytes past its last checkpoint carry no record). Only reads
    /// `part`; the caller fsyncs what it keeps before claiming it.
    fn proven_tail<'a>(
        &'a self,
        _path: &'a str,
        _part: &'a DirectFile,
        from: u64,
        _to: u64,
    ) -> SourceFuture<'a, u64> {
        Box::pin(async move { Ok(from) })
    }

    /// Whether `path`'s bodies are held to the minimum-rate rule
    /// (`--min-rate` over the stall window). A source that hands bytes on
    /// in bursts far apart on a healthy link says `false`; its own reads
    /// must then end at `--read-timeout` when nothing arrives.
    fn rate_rule_holds(&self, _path: &str) -> bool {
        true
    }

    /// Whether the source decodes `path`'s bodies as they are read, in
    /// the reading task (Xet: chunks decompressed and hashed): a range is
    /// then bound by the one core decoding it rather than by its link, so
    /// another range of the file pays while the file has fewer busy ranges
    /// than this machine has cores, whatever their rate.
    fn decodes_bodies(&self, _path: &str) -> bool {
        false
    }
}

/// The span a source says it sent: `[first, end)` of a `total`-byte file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentSpan {
    /// First byte.
    pub first: u64,
    /// One past the last byte.
    pub end: u64,
    /// The file's size as the source knows it.
    pub total: u64,
}

/// A source's typed answer to one [`Ask`].
pub enum ReadOutcome {
    /// A span of the file (only to a request for a span).
    Span {
        /// Which span the source says it sent (`None`: it did not say in a
        /// form that can be read; the check refuses it).
        sent: Option<SentSpan>,
        /// The validator the bytes were sent under.
        validator: Option<String>,
        /// The body's announced length.
        length: Option<u64>,
        /// The bytes.
        body: Body,
    },
    /// The whole current file from byte 0: the answer to a request for the
    /// whole file, or to a range the source would not honour (it ignores
    /// ranges, or the file changed since the kept bytes were fetched).
    Whole {
        /// The file's validator now.
        validator: Option<String>,
        /// The body's announced length.
        length: Option<u64>,
        /// The bytes.
        body: Body,
    },
    /// No bytes to keep. Whether a retry may help is the error's
    /// ([`FetchError::is_transient`]); `retry_after`: the seconds the
    /// source asked to wait before one.
    Refused {
        /// The wait the source asked for, if any.
        retry_after: Option<u64>,
        /// Why, naming the file.
        error: FetchError,
    },
}

/// What an answer said on the wire, for the attempt's row; each field only
/// where the source has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireRecord {
    /// The protocol's status code.
    pub status: Option<u16>,
    /// The entity tag as sent.
    pub etag: Option<String>,
    /// The range the answer says it holds, as written.
    pub content_range: Option<String>,
}

/// A source's answer to one [`Ask`].
pub struct Reply {
    /// Host of the final answer (recorded in attempts; never the URL).
    pub host: String,
    /// The hub's description of the file, gathered along a redirect chain
    /// (empty for a source without one); checked against the pin.
    pub meta: LinkedMeta,
    /// What the answer said, for the attempt's row.
    pub wire: WireRecord,
    /// The answer.
    pub outcome: ReadOutcome,
}

/// A response body, read chunk by chunk as it arrives.
pub struct Body(BodyInner);

enum BodyInner {
    Http(reqwest::Response),
    Stream(BoxStream<'static, std::result::Result<Bytes, BodyError>>),
}

impl Body {
    /// The body of an HTTP response (the hub's source).
    pub(crate) fn http(response: reqwest::Response) -> Body {
        Body(BodyInner::Http(response))
    }

    /// A body of chunks from any other API.
    pub fn stream(chunks: BoxStream<'static, std::result::Result<Bytes, BodyError>>) -> Body {
        Body(BodyInner::Stream(chunks))
    }

    /// No bytes.
    pub fn empty() -> Body {
        Body::stream(Box::pin(futures_util::stream::empty()))
    }

    /// The next chunk as received (`None` at the end).
    pub async fn chunk(&mut self) -> std::result::Result<Option<Bytes>, BodyError> {
        match &mut self.0 {
            BodyInner::Http(r) => r.chunk().await.map_err(|e| BodyError(error_chain(&e))),
            BodyInner::Stream(s) => {
                use futures_util::StreamExt;
                s.next().await.transpose()
            }
        }
    }
}

/// Why a body stopped before its end (the whole error chain, for the
/// message; the URL is never part of it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(pub String);

/// An error and its sources, joined with `: `.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}
