//! Object storage behind the byte-source seam
//! ([`ftpipe_fetch::ByteSource`]): the objects of a published artifact
//! (`pull`) or of a mirror, asked by span under `If-Match`, answered with
//! the seam's typed outcomes so the one response check judges them by the
//! same rules as the hub's answers.
//!
//! - every request carries `If-Match`: the validator the kept bytes were
//!   fetched under, or, for a first request, the ETag seen when the object
//!   was listed. A range is never read from another object than the one
//!   the kept prefix came from;
//! - a ranged answer is a [`ReadOutcome::Span`] of the bytes the server
//!   says it sent, under the object's ETag; a whole answer a
//!   [`ReadOutcome::Whole`];
//! - a `412` (the object was replaced) and a `200` to a ranged get (a
//!   server or proxy that ignores ranges; `object_store` refuses that
//!   answer itself) become what a hub's server answers to a stale
//!   `If-Range` or an ignored `Range`: the whole current object, from byte
//!   0. The transfer then drops what it kept (a recorded discard, as for a
//!   hub file) and takes the object from 0, and the digest decides. Bytes
//!   of two objects are never spliced;
//! - any other failure is a [`FetchError::Source`], transient as
//!   [`ObjStoreError::is_transient`] says.
//!
//! The attempt's row gets the status `object_store` accepted (it refuses a
//! ranged answer that is not a `206`), the ETag and the range received.

use std::collections::HashMap;

use futures_util::StreamExt;

use ftpipe_fetch::{
    Ask, Body, BodyError, ByteSource, FetchError, ReadOutcome, Reply, SentSpan, SourceFailure,
    SourceFuture, Span, WireRecord,
};
use ftpipe_hub::client::LinkedMeta;
use ftpipe_objstore::{GetRange, ObjStoreError, RangeGet, S3};

/// One object of a pull or a mirror: its key and the ETag seen when it
/// was listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Object {
    /// The key in the bucket.
    pub key: String,
    /// Its ETag when listed (sent as `If-Match` with a first request).
    pub etag: String,
}

/// The files of a pull or a mirror, by relative path, in one bucket.
pub struct S3Source {
    s3: S3,
    objects: HashMap<String, S3Object>,
}

impl S3Source {
    /// A source of `objects` (path → object) through `s3`.
    pub fn new(s3: S3, objects: HashMap<String, S3Object>) -> S3Source {
        S3Source { s3, objects }
    }

    fn object(&self, path: &str) -> Result<&S3Object, FetchError> {
        self.objects
            .get(path)
            .ok_or_else(|| FetchError::internal(format!("asked for {path}, which was not listed")))
    }

    /// The whole current object, under `if_match` when given; replaced
    /// meanwhile: the whole object as it is now.
    async fn whole(&self, key: &str, if_match: Option<String>) -> Result<RangeGet, FetchError> {
        let conditional = if_match.is_some();
        match self
            .s3
            .get_range(key, None, if_match)
            .await
            .map_err(failure)?
        {
            Ok(got) => Ok(got),
            Err(_precondition) if conditional => self
                .s3
                .get_range(key, None, None)
                .await
                .map_err(failure)?
                .map_err(|_| FetchError::internal("a get without If-Match answered 412")),
            Err(_precondition) => Err(FetchError::internal("a get without If-Match answered 412")),
        }
    }
}

impl ByteSource for S3Source {
    fn host(&self, _path: &str) -> Result<String, FetchError> {
        Ok(self.s3.host().to_owned())
    }

    fn read<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, Reply> {
        Box::pin(async move {
            let obj = self.object(path)?;
            let range = match ask.span {
                Span::Whole => None,
                Span::From(start) => Some(GetRange::Offset(start)),
                Span::Range { from, end } => Some(GetRange::Bounded(from..end)),
            };
            let ranged = range.is_some();
            let if_match = ask.validator.unwrap_or(&obj.etag).to_owned();
            let got = match self
                .s3
                .get_range(&obj.key, range, Some(if_match.clone()))
                .await
            {
                Ok(Ok(got)) if ranged => Ranged::Span(got),
                Ok(Ok(got)) => Ranged::Whole(got),
                // Replaced since: the whole object as it is now.
                Ok(Err(_precondition)) => Ranged::Whole(self.whole(&obj.key, None).await?),
                // A 200 to the range: the whole object, as a hub's server
                // that ignores ranges sends it.
                Err(e) if ranged && e.is_range_ignored() => {
                    Ranged::Whole(self.whole(&obj.key, Some(if_match)).await?)
                }
                Err(e) => return Err(failure(e)),
            };
            let location = self.s3.location().url_of(&obj.key);
            Ok(Reply {
                host: self.s3.host().to_owned(),
                meta: LinkedMeta::default(),
                wire: got.wire(),
                outcome: got.outcome(location),
            })
        })
    }
}

/// What a get brought: the span asked, or the whole object.
enum Ranged {
    Span(RangeGet),
    Whole(RangeGet),
}

impl Ranged {
    fn got(&self) -> &RangeGet {
        match self {
            Ranged::Span(g) | Ranged::Whole(g) => g,
        }
    }

    /// The attempt's row: a ranged get `object_store` accepted was a
    /// `206`, a whole one a `200`.
    fn wire(&self) -> WireRecord {
        let got = self.got();
        let (status, content_range) = match self {
            Ranged::Span(g) => (206, Some(content_range(g))),
            Ranged::Whole(_) => (200, None),
        };
        WireRecord {
            status: Some(status),
            etag: got.etag.as_deref().map(quoted),
            content_range,
        }
    }

    fn outcome(self, location: String) -> ReadOutcome {
        let whole = matches!(self, Ranged::Whole(_));
        let got = match self {
            Ranged::Span(g) | Ranged::Whole(g) => g,
        };
        let validator = got.etag.as_deref().map(quoted);
        let length = got.range.end.checked_sub(got.range.start);
        let sent = SentSpan {
            first: got.range.start,
            end: got.range.end,
            total: got.size,
        };
        let body = Body::stream(
            got.body
                .map(move |c| {
                    c.map_err(|e| {
                        let text = format!("{location}: {e}");
                        BodyError(ftpipe_secrets::redact(&text).into_owned())
                    })
                })
                .boxed(),
        );
        if whole {
            ReadOutcome::Whole {
                validator,
                length,
                body,
            }
        } else {
            ReadOutcome::Span {
                sent: Some(sent),
                validator,
                length,
                body,
            }
        }
    }
}

/// `bytes first-last/size` of a ranged answer, as HTTP writes it.
fn content_range(got: &RangeGet) -> String {
    let last = got.range.end.saturating_sub(1);
    format!("bytes {}-{last}/{}", got.range.start, got.size)
}

/// A strong validator is a quoted ETag; some servers leave the quotes off.
fn quoted(etag: &str) -> String {
    if etag.starts_with('"') || etag.starts_with("W/") {
        etag.to_owned()
    } else {
        format!("\"{etag}\"")
    }
}

/// An object-storage failure as the seam's, transient as the store says.
fn failure(e: ObjStoreError) -> FetchError {
    FetchError::Source(SourceFailure {
        transient: e.is_transient(),
        class: e.class(),
        error: Box::new(e),
    })
}
