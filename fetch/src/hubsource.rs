//! The hub's HTTP behind the byte-source seam: the one place where HTTP
//! meets the fetch. A span goes out as `Range` (with `If-Range` under the
//! kept bytes' validator, never without a range); the answer comes back
//! as a typed [`ReadOutcome`]:
//!
//! - `206` to a range: [`ReadOutcome::Span`], the span read strictly from
//!   `Content-Range` (unparseable: no span, which the check refuses), the
//!   validator a strong `ETag` (else `Last-Modified`), `Content-Length`;
//! - `200`: [`ReadOutcome::Whole`] (to a range: the server ignores ranges,
//!   or `If-Range` no longer matched);
//! - anything else (a `206` to a request without a range included):
//!   [`ReadOutcome::Refused`] with the status, and the wait a `429` or
//!   `503` asked for in `Retry-After`.
//!
//! The status, `ETag` and `Content-Range` go to the attempt's row as sent.

use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, HeaderMap, HeaderValue, IF_RANGE, RANGE};

use ftpipe_hub::HubError;
use ftpipe_hub::client::{BodyResponse, HubClient, redact};
use ftpipe_hub::headers::{etag, parse_content_range, retry_after_secs, strong_validator};

use crate::error::{FetchError, Result};
use crate::source::{
    Ask, Body, ByteSource, ReadOutcome, Reply, SentSpan, SourceFuture, Span, WireRecord,
};

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

    fn read<'a>(&'a self, path: &'a str, ask: Ask<'a>) -> SourceFuture<'a, Reply> {
        Box::pin(async move {
            let url = self.client.resolve_url(&self.repo, &self.commit, path)?;
            let headers = request_headers(ask)?;
            let r = self.client.get_body(path, url, headers).await?;
            Ok(typed_reply(path, ask, r))
        })
    }
}

/// An HTTP answer as the seam's typed reply (see the module doc).
fn typed_reply(path: &str, ask: Ask<'_>, r: BodyResponse) -> Reply {
    let resp = r.response;
    let status = resp.status();
    let headers = resp.headers();
    let content_range = headers
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let wire = WireRecord {
        status: Some(status.as_u16()),
        etag: etag(headers),
        content_range: content_range.clone(),
    };
    let validator = strong_validator(headers);
    let length = resp.content_length();
    let outcome = match (status, ask.span) {
        (StatusCode::OK, _) => ReadOutcome::Whole {
            validator,
            length,
            body: Body::http(resp),
        },
        (StatusCode::PARTIAL_CONTENT, Span::From(_) | Span::Range { .. }) => ReadOutcome::Span {
            sent: content_range.as_deref().and_then(sent_span),
            validator,
            length,
            body: Body::http(resp),
        },
        (status, span) => refused(path, &resp, status, span),
    };
    Reply {
        host: r.host,
        meta: r.meta,
        wire,
        outcome,
    }
}

/// A `Content-Range` as the span it names.
fn sent_span(value: &str) -> Option<SentSpan> {
    let cr = parse_content_range(value)?;
    Some(SentSpan {
        first: cr.first,
        end: cr.last.checked_add(1)?,
        total: cr.total,
    })
}

/// Any status but `200` and a `206` to a range request.
fn refused(path: &str, resp: &reqwest::Response, status: StatusCode, span: Span) -> ReadOutcome {
    let retry_after = if matches!(status.as_u16(), 429 | 503) {
        retry_after_secs(resp.headers())
    } else {
        None
    };
    // The URL may be the CDN's (`/lfs/<sha>`), which does not name the
    // file: say which file this was for.
    let detail = match span {
        Span::Whole if status == StatusCode::PARTIAL_CONTENT => {
            format!(" to a request without Range (fetching {path})")
        }
        Span::Range { from, end } => {
            format!(" (fetching {path}, range {from}-{})", end.saturating_sub(1))
        }
        _ => format!(" (fetching {path})"),
    };
    ReadOutcome::Refused {
        retry_after,
        error: FetchError::Hub(HubError::Status {
            url: redact(resp.url()),
            status: status.as_u16(),
            detail,
            hub: ftpipe_hub::says::HubSays::from_headers(resp.headers()),
        }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use ftpipe_hub::client::LinkedMeta;

    fn answer(status: u16, headers: &[(&str, &str)], body: &'static str) -> BodyResponse {
        let mut b = http::Response::builder().status(status);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        BodyResponse {
            response: reqwest::Response::from(b.body(body).unwrap()),
            meta: LinkedMeta::default(),
            host: "h".into(),
        }
    }

    fn range() -> Ask<'static> {
        Ask {
            span: Span::Range { from: 4, end: 10 },
            validator: Some("\"v\""),
        }
    }

    #[test]
    fn a_206_becomes_the_span_its_content_range_names_and_is_recorded_as_sent() {
        let r = answer(
            206,
            &[("content-range", "bytes 4-9/10"), ("etag", "\"v\"")],
            "456789",
        );
        let reply = typed_reply("f", range(), r);
        assert_eq!(
            reply.wire,
            WireRecord {
                status: Some(206),
                etag: Some("\"v\"".into()),
                content_range: Some("bytes 4-9/10".into()),
            }
        );
        match reply.outcome {
            ReadOutcome::Span {
                sent, validator, ..
            } => {
                let want = SentSpan {
                    first: 4,
                    end: 10,
                    total: 10,
                };
                assert_eq!(sent, Some(want));
                assert_eq!(validator.as_deref(), Some("\"v\""));
            }
            _ => panic!("not a span"),
        }
        let garbled = answer(206, &[("content-range", "bytes 4-x/10")], "456789");
        assert!(matches!(
            typed_reply("f", range(), garbled).outcome,
            ReadOutcome::Span { sent: None, .. }
        ));
    }

    #[test]
    fn a_200_to_a_range_is_the_whole_file_and_a_206_without_one_is_refused() {
        let whole = answer(200, &[("etag", "W/\"weak\"")], "0123456789");
        assert!(matches!(
            typed_reply("f", range(), whole).outcome,
            ReadOutcome::Whole {
                validator: None,
                length: Some(10),
                ..
            }
        ));
        let ask = Ask {
            span: Span::Whole,
            validator: None,
        };
        let partial = answer(206, &[("content-range", "bytes 0-9/10")], "0123456789");
        match typed_reply("f", ask, partial).outcome {
            ReadOutcome::Refused { error, .. } => {
                assert!(error.to_string().contains("without Range"), "{error}");
            }
            _ => panic!("a 206 without a range was not refused"),
        }
    }

    #[test]
    fn only_a_429_or_503_carries_its_retry_after() {
        for (status, want) in [(429, Some(7)), (503, Some(7)), (500, None), (416, None)] {
            let r = answer(status, &[("retry-after", "7")], "");
            match typed_reply("f", range(), r).outcome {
                ReadOutcome::Refused { retry_after, .. } => {
                    assert_eq!(retry_after, want, "{status}");
                }
                _ => panic!("{status} not refused"),
            }
        }
    }
}
