//! A registry's blobs behind the byte-source seam
//! ([`ftpipe_fetch::ByteSource`]): the layers of a pulled ModelPack
//! artifact, asked by span, answered with the seam's typed outcomes so the
//! one response check judges them by the hub's rules.
//!
//! - a blob is content-addressed: its validator is its digest (quoted), the
//!   same for every answer, so kept bytes are never from another blob;
//! - a `206` is a [`ReadOutcome::Span`] of the range its `Content-Range`
//!   names; a `200` (to a whole ask, or a registry or proxy that ignores
//!   `Range`) a [`ReadOutcome::Whole`] from byte 0 (the transfer drops
//!   what it kept, a recorded discard, and the digest decides);
//! - any other status is a [`ReadOutcome::Refused`], transient for a
//!   `5xx`, `408`, `429` (with `Retry-After`) and a `416` (the blob cannot
//!   have changed, so the range is asked again from the watermark);
//! - a redirect to storage is followed by the client, which drops the
//!   registry's `Authorization` when the host changes.

use std::collections::HashMap;

use futures_util::StreamExt;
use reqwest::header::{CONTENT_RANGE, RETRY_AFTER};

use ftpipe_fetch::{
    Ask, Body, BodyError, ByteSource, FetchError, ReadOutcome, Reply, SentSpan, SourceFailure,
    SourceFuture, Span, WireRecord,
};
use ftpipe_hub::client::LinkedMeta;
use ftpipe_objstore::{ObjStoreError, Registry};

/// The layers of a pull, by path, in one repository.
pub struct OciSource {
    registry: Registry,
    digests: HashMap<String, String>,
}

impl OciSource {
    /// A source of `digests` (path → `sha256:HEX`) through `registry`.
    pub fn new(registry: Registry, digests: HashMap<String, String>) -> OciSource {
        OciSource { registry, digests }
    }

    fn digest(&self, path: &str) -> Result<&str, FetchError> {
        self.digests
            .get(path)
            .map(String::as_str)
            .ok_or_else(|| FetchError::internal(format!("asked for {path}, which is not a layer")))
    }
}

impl ByteSource for OciSource {
    fn host(&self, _path: &str) -> Result<String, FetchError> {
        Ok(self.registry.host().to_owned())
    }

    fn read<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, Reply> {
        Box::pin(async move {
            let digest = self.digest(path)?;
            let range = match ask.span {
                Span::Whole => None,
                Span::From(start) => Some((start, None)),
                Span::Range { from, end } => Some((from, Some(end.saturating_sub(1)))),
            };
            let response = self
                .registry
                .get_blob(digest, range)
                .await
                .map_err(failure)?;
            let status = response.status().as_u16();
            let header = |name| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
                    .map(str::to_owned)
            };
            let content_range = header(CONTENT_RANGE);
            let retry_after = header(RETRY_AFTER).and_then(|v| v.parse().ok());
            let host = response
                .url()
                .host_str()
                .unwrap_or(self.registry.host())
                .to_owned();
            let validator = format!("\"{digest}\"");
            let wire = WireRecord {
                status: Some(status),
                etag: Some(validator.clone()),
                content_range: content_range.clone(),
            };
            let length = response.content_length();
            let blob_url = self.registry.blob_url(digest);
            let outcome = match status {
                206 if range.is_some() => ReadOutcome::Span {
                    sent: content_range.as_deref().and_then(parse_content_range),
                    validator: Some(validator),
                    length,
                    body: body_of(response, blob_url),
                },
                200 => ReadOutcome::Whole {
                    validator: Some(validator),
                    length,
                    body: body_of(response, blob_url),
                },
                _ => {
                    let refused = ObjStoreError::RegistryStatus {
                        op: "blob get",
                        what: blob_url,
                        status,
                        said: String::new(),
                    };
                    // A `416` says nothing of the kept bytes (a blob never
                    // changes under its digest): the range is asked again.
                    let transient = refused.is_transient() || status == 416;
                    ReadOutcome::Refused {
                        retry_after,
                        error: FetchError::Source(SourceFailure {
                            transient,
                            class: refused.class(),
                            error: Box::new(refused),
                        }),
                    }
                }
            };
            Ok(Reply {
                host,
                meta: LinkedMeta::default(),
                wire,
                outcome,
            })
        })
    }
}

/// `bytes FIRST-LAST/TOTAL` as a [`SentSpan`].
fn parse_content_range(v: &str) -> Option<SentSpan> {
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last: u64 = last.trim().parse().ok()?;
    Some(SentSpan {
        first,
        end: last.checked_add(1)?,
        total: total.trim().parse().ok()?,
    })
}

fn body_of(response: reqwest::Response, blob_url: String) -> Body {
    Body::stream(
        response
            .bytes_stream()
            .map(move |c| c.map_err(|e| BodyError(format!("{blob_url}: {}", e.without_url()))))
            .boxed(),
    )
}

/// A registry failure as the seam's, transient as the error says.
fn failure(e: ObjStoreError) -> FetchError {
    FetchError::Source(SourceFailure {
        transient: e.is_transient(),
        class: e.class(),
        error: Box::new(e),
    })
}
