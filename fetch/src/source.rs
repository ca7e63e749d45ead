//! The byte source: where a pinned file's bytes come from. The transfer
//! machinery (one stream or ranges) asks it for a span of a file under a
//! validator and reads the answer; it never builds an HTTP request itself.
//! [`HubSource`] is the hub's HTTP (resolve URLs, bounded redirects, the
//! token never sent across hosts).
//!
//! The seam is at the request/response boundary: one [`Ask`] goes out, one
//! [`SourceResponse`] (status, headers, body) comes back, and the one
//! response check (`crate::attempt::check`) judges it with the same rules
//! whatever the source. A source for object storage (S3 through
//! `object_store`, `GetOptions { range, if_match }`) must provide:
//!
//! - the file's size and a strong validator: the object's ETag (a listing
//!   or a `head` gives both; the hub's listing gives them today);
//! - a ranged get under that validator: `If-Match` instead of `If-Range`,
//!   so a changed object is a refusal (412) rather than a `200` of the new
//!   bytes; the ranged answer as a `206` whose `Content-Range` is exactly
//!   the span asked, with the ETag, so the check needs no second path;
//! - the body as `bytes::Bytes` chunks as they arrive, without copies (a
//!   further [`Body`] variant over a `BoxStream<Bytes>`).
//!
//! `crate::s3source::S3Source` is that source (`pull`).

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue, IF_RANGE, RANGE};

use crate::error::{FetchError, Result};
use ftpipe_hub::HubClient;
use ftpipe_hub::client::{LinkedMeta, redact};

/// A future a [`ByteSource`] returns (object-safe: the fetch holds its
/// source as `dyn ByteSource`; one allocation per request, none per chunk).
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Which bytes of a file a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The whole file, without a range.
    Whole,
    /// From this byte to the end (`bytes=start-`).
    From(u64),
    /// `[from, end)` (`bytes=from-(end−1)`).
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
}

/// One request: a span of a file, under a validator.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The bytes asked for.
    pub span: Span,
    /// The validator the bytes kept so far were fetched under: sent with
    /// any range (`If-Range` over HTTP), never without one.
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

    /// Sends `ask` for `path` and returns the answer, body unread.
    fn get<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, SourceResponse>;
}

/// A response body, read chunk by chunk as it arrives.
pub enum Body {
    /// An HTTP response.
    Http(reqwest::Response),
    /// An answer a source put together from another API (object storage):
    /// the status and headers it implies, and the body's chunks.
    Stream(StreamBody),
}

/// The parts of a [`Body::Stream`].
pub struct StreamBody {
    /// The status the answer amounts to (`200` whole, `206` a range).
    pub status: StatusCode,
    /// `ETag`, `Content-Range`, `Content-Length` as the answer implies.
    pub headers: HeaderMap,
    /// The body's length.
    pub content_length: Option<u64>,
    /// Where it came from, without credentials (for messages).
    pub location: String,
    /// The chunks, as they arrive.
    pub chunks: futures_util::stream::BoxStream<'static, std::result::Result<Bytes, BodyError>>,
}

/// Why a body stopped before its end (the whole error chain, for the
/// message; the URL is never part of it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(pub String);

/// A source's answer to one [`Ask`].
pub struct SourceResponse {
    /// Host of the final response (recorded in attempts; never the URL).
    pub host: String,
    /// The hub's description of the file, gathered along a redirect chain
    /// (empty for a source without one).
    pub meta: LinkedMeta,
    /// The status, headers and body.
    pub body: Body,
}

impl SourceResponse {
    /// The status of the answer.
    pub fn status(&self) -> StatusCode {
        match &self.body {
            Body::Http(r) => r.status(),
            Body::Stream(s) => s.status,
        }
    }

    /// Its headers (`Content-Range`, `ETag`, `Retry-After`, ...).
    pub fn headers(&self) -> &HeaderMap {
        match &self.body {
            Body::Http(r) => r.headers(),
            Body::Stream(s) => &s.headers,
        }
    }

    /// The body's announced length.
    pub fn content_length(&self) -> Option<u64> {
        match &self.body {
            Body::Http(r) => r.content_length(),
            Body::Stream(s) => s.content_length,
        }
    }

    /// Where the answer came from, without credentials (for messages).
    pub fn location(&self) -> String {
        match &self.body {
            Body::Http(r) => redact(r.url()),
            Body::Stream(s) => s.location.clone(),
        }
    }

    /// The next chunk of the body as received (`None` at its end).
    pub async fn chunk(&mut self) -> std::result::Result<Option<Bytes>, BodyError> {
        match &mut self.body {
            Body::Http(r) => r.chunk().await.map_err(|e| BodyError(error_chain(&e))),
            Body::Stream(s) => {
                use futures_util::StreamExt;
                s.chunks.next().await.transpose()
            }
        }
    }
}

/// The files of one pinned commit, over the hub's HTTP.
pub struct HubSource {
    /// The hub client (endpoint, token, redirect rules, offline mode).
    pub client: HubClient,
    /// The repository id.
    pub repo: String,
    /// The pinned 40-hex commit.
    pub commit: String,
}

impl ByteSource for HubSource {
    fn host(&self, path: &str) -> Result<String> {
        let url = self.client.resolve_url(&self.repo, &self.commit, path)?;
        let host = url.host_str().ok_or_else(|| {
            FetchError::internal(format!("file URL {} has no host", redact(&url)))
        })?;
        Ok(host.to_owned())
    }

    fn get<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, SourceResponse> {
        Box::pin(async move {
            let url = self.client.resolve_url(&self.repo, &self.commit, path)?;
            let headers = request_headers(ask)?;
            let r = self.client.get_body(path, url, headers).await?;
            Ok(SourceResponse {
                host: r.host,
                meta: r.meta,
                body: Body::Http(r.response),
            })
        })
    }
}

/// `Range` for any span but the whole file, with `If-Range` when a
/// validator is known.
fn request_headers(ask: Ask<'_>) -> Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    let range = match ask.span {
        Span::Whole => return Ok(headers),
        Span::From(start) => format!("bytes={start}-"),
        Span::Range { from, end } => format!("bytes={from}-{}", end.saturating_sub(1)),
    };
    headers.insert(RANGE, header_value(&range)?);
    if let Some(v) = ask.validator {
        headers.insert(IF_RANGE, header_value(v)?);
    }
    Ok(headers)
}

fn header_value(v: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(v).map_err(|_| FetchError::InvalidInput {
        what: "header value",
        message: format!("{v:?}"),
    })
}

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
