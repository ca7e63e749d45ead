//! Object storage behind the byte-source seam: the objects of a published
//! artifact (`pull`), asked by span under `If-Match`.
//!
//! The translation to the seam's HTTP terms, so the one response check
//! (`crate::attempt::check`) judges an object's answer by the same rules
//! as the hub's:
//!
//! - every request carries `If-Match`: the validator the kept bytes were
//!   fetched under, or, for a first request, the ETag the pull saw when it
//!   listed the object. A range is never read from another object than the
//!   one the kept prefix came from;
//! - a ranged answer becomes a `206` with the `Content-Range` of the bytes
//!   the server says it sent, the object's `ETag` and the `Content-Length`;
//!   a whole answer a `200`;
//! - a `412` (the object was replaced) becomes what an HTTP server answers
//!   to a stale `If-Range`: a `200` with the whole current object. The
//!   transfer then drops what it kept (a recorded discard, as for a hub
//!   file whose validator changed: `range_not_honoured` on one stream,
//!   `validator_changed` on ranges) and takes the new bytes from 0, and the
//!   digest decides: the
//!   manifest's SHA-256 accepts the replacement only if its bytes are the
//!   same. Bytes of two objects are never spliced.

use std::collections::HashMap;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, ETAG, HeaderMap, HeaderValue};

use ftpipe_hub::client::LinkedMeta;
use ftpipe_objstore::{GetRange, RangeGet, S3};

use crate::error::{FetchError, Result};
use crate::source::{
    Ask, Body, BodyError, ByteSource, SourceFuture, SourceResponse, Span, StreamBody,
};

/// One object of a pull: its key and the ETag seen when it was listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Object {
    /// The key in the bucket.
    pub key: String,
    /// Its ETag when the pull started (sent as `If-Match` with a first
    /// request).
    pub etag: String,
}

/// The files of a pull, by artifact-relative path, in one bucket.
pub struct S3Source {
    s3: S3,
    objects: HashMap<String, S3Object>,
}

impl S3Source {
    /// A source of `objects` (artifact path → object) through `s3`.
    pub fn new(s3: S3, objects: HashMap<String, S3Object>) -> S3Source {
        S3Source { s3, objects }
    }

    fn object(&self, path: &str) -> Result<&S3Object> {
        self.objects.get(path).ok_or_else(|| {
            FetchError::internal(format!("pull asked for {path}, which it did not list"))
        })
    }
}

impl ByteSource for S3Source {
    fn host(&self, _path: &str) -> Result<String> {
        Ok(self.s3.host().to_owned())
    }

    fn get<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, SourceResponse> {
        Box::pin(async move {
            let obj = self.object(path)?;
            let range = match ask.span {
                Span::Whole => None,
                Span::From(start) => Some(GetRange::Offset(start)),
                Span::Range { from, end } => Some(GetRange::Bounded(from..end)),
            };
            let if_match = ask.validator.unwrap_or(&obj.etag).to_owned();
            let (got, status) = match self.s3.get_range(&obj.key, range, Some(if_match)).await? {
                Ok(got) if ask.span == Span::Whole => (got, StatusCode::OK),
                Ok(got) => (got, StatusCode::PARTIAL_CONTENT),
                Err(_precondition) => {
                    let got = self
                        .s3
                        .get_range(&obj.key, None, None)
                        .await?
                        .map_err(|_| FetchError::internal("a get without If-Match answered 412"))?;
                    (got, StatusCode::OK)
                }
            };
            let location = self.s3.location().url_of(&obj.key);
            Ok(SourceResponse {
                host: self.s3.host().to_owned(),
                meta: LinkedMeta::default(),
                body: Body::Stream(stream_body(got, status, location)?),
            })
        })
    }
}

/// The answer as the seam's status, headers and chunks.
fn stream_body(got: RangeGet, status: StatusCode, location: String) -> Result<StreamBody> {
    let mut headers = HeaderMap::new();
    let value = |v: String| {
        HeaderValue::from_str(&v).map_err(|_| FetchError::InvalidInput {
            what: "object storage answer",
            message: format!("{location}: header value {v:?}"),
        })
    };
    if let Some(etag) = got.etag {
        // A strong validator is a quoted ETag; some servers leave the
        // quotes off.
        let quoted = if etag.starts_with('"') || etag.starts_with("W/") {
            etag
        } else {
            format!("\"{etag}\"")
        };
        headers.insert(ETAG, value(quoted)?);
    }
    let len = got.range.end.saturating_sub(got.range.start);
    if status == StatusCode::PARTIAL_CONTENT {
        let last = got.range.end.saturating_sub(1);
        headers.insert(
            CONTENT_RANGE,
            value(format!("bytes {}-{last}/{}", got.range.start, got.size))?,
        );
    }
    headers.insert(CONTENT_LENGTH, value(len.to_string())?);
    let where_ = location.clone();
    let chunks = got
        .body
        .map(move |c: object_store::Result<Bytes>| {
            c.map_err(|e| BodyError(ftpipe_secrets::redact(&format!("{where_}: {e}")).into_owned()))
        })
        .boxed();
    Ok(StreamBody {
        status,
        headers,
        content_length: Some(len),
        location,
        chunks,
    })
}
