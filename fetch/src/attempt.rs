//! One attempt, whichever path makes it (one stream or a range of a
//! segmented fetch): what it asks for and records before the request, the
//! one check of the answer, the body's minimum-rate rule, and the receipt
//! once the file is published.
//!
//! The check is the strictness of the whole fetch, written once: the hub's
//! description of the file must agree with the pin; a `206` must carry
//! exactly the asked `Content-Range`, the validator the kept bytes were
//! fetched under and a matching `Content-Length`; a `200` is the whole
//! file, accepted only when the whole file was asked; anything else is a
//! refusal, with the wait a `429` or `503` asked for.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use ftpipe_hub::HubError;
use ftpipe_hub::headers::{
    check_linked_meta, check_range, etag, retry_after_secs, strong_validator,
};
use ftpipe_hub::identity::Expected;
use ftpipe_progress::ProgressEvent;
use ftpipe_receipts::{Attempt, FileRow, Receipt};

use crate::ctx::FetchCtx;
use crate::error::{FetchError, Result};
use crate::source::{Ask, SourceResponse, Span};

/// How many times a file whose bytes failed the digest is fetched again.
pub(crate) const DIGEST_REFETCHES: u32 = 1;

/// What the pin says of the file an answer is for.
pub(crate) struct Pinned<'a> {
    pub path: &'a str,
    pub size: u64,
    pub commit: &'a str,
    pub lfs_sha256: Option<&'a str>,
}

/// The check's judgement of an answer.
pub(crate) enum Verdict {
    /// The body is the bytes asked for; `validator` is the answer's strong
    /// validator.
    Accepted { validator: Option<String> },
    /// A `200` to a range request: the whole file from byte 0 (the server
    /// ignores ranges, or the file changed). Its length is not checked yet
    /// ([`whole_length`], if the body is kept).
    RangeIgnored { validator: Option<String> },
    /// Not an answer with bytes to keep; `retry_after`: the seconds a
    /// `429` or `503` asked to wait.
    Refused {
        retry_after: Option<u64>,
        error: FetchError,
    },
}

/// A new attempt row's request side: the range asked (when one is) and
/// the validator sent with it.
pub(crate) fn new_attempt(path: &str, host: String, ask: &Ask<'_>) -> Attempt {
    Attempt {
        path: path.to_owned(),
        range_start: ask.span.start(),
        if_range: ask.sent_validator().map(str::to_owned),
        host,
        ..Attempt::default()
    }
}

/// Records what the answer said (final host, status, ETag, Content-Range).
pub(crate) fn record_response(attempt: &mut Attempt, resp: &SourceResponse) {
    attempt.host = resp.host.clone();
    attempt.status = Some(resp.status().as_u16());
    attempt.etag = etag(resp.headers());
    attempt.content_range = resp
        .headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
}

/// The one response check (see the module doc).
pub(crate) fn check(pin: &Pinned<'_>, ask: &Ask<'_>, resp: &SourceResponse) -> Result<Verdict> {
    let path = pin.path;
    check_linked_meta(&resp.meta, pin.commit, pin.size, pin.lfs_sha256).map_err(|c| {
        FetchError::PinContradicted {
            path: path.to_owned(),
            header: c.header,
            expected: c.expected,
            actual: c.actual,
            what: c.what,
        }
    })?;
    let now = strong_validator(resp.headers());
    let (from, end) = match (resp.status(), ask.span) {
        (StatusCode::OK, Span::Whole) => {
            whole_length(path, resp, pin.size)?;
            return Ok(Verdict::Accepted { validator: now });
        }
        (StatusCode::OK, _) => return Ok(Verdict::RangeIgnored { validator: now }),
        (StatusCode::PARTIAL_CONTENT, Span::From(start)) => (start, pin.size),
        (StatusCode::PARTIAL_CONTENT, Span::Range { from, end }) => (from, end),
        (status, span) => return Ok(refused(path, resp, status, span)),
    };
    check_range(path, resp.headers(), from, end, pin.size)?;
    if let Some(sent) = ask.validator
        && now.as_deref() != Some(sent)
    {
        // Message only: a missing ETag shows as "".
        return Err(FetchError::Hub(HubError::BadHeader {
            path: path.to_owned(),
            header: "ETag",
            expected: sent.to_owned(),
            actual: now.unwrap_or_default(),
        }));
    }
    if let Some(len) = resp.content_length()
        && Some(len) != end.checked_sub(from)
    {
        return Err(FetchError::Hub(HubError::BadHeader {
            path: path.to_owned(),
            header: "Content-Length",
            expected: end.saturating_sub(from).to_string(),
            actual: len.to_string(),
        }));
    }
    Ok(Verdict::Accepted { validator: now })
}

/// A `200` kept as the whole file must announce the file's size (or none).
pub(crate) fn whole_length(path: &str, resp: &SourceResponse, size: u64) -> Result<()> {
    match resp.content_length() {
        Some(len) if len != size => Err(FetchError::Hub(HubError::BadHeader {
            path: path.to_owned(),
            header: "Content-Length",
            expected: size.to_string(),
            actual: len.to_string(),
        })),
        _ => Ok(()),
    }
}

/// Any status but `200` and a `206` to a range request.
fn refused(path: &str, resp: &SourceResponse, status: StatusCode, span: Span) -> Verdict {
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
    Verdict::Refused {
        retry_after,
        error: FetchError::Hub(HubError::Status {
            url: resp.location(),
            status: status.as_u16(),
            detail,
        }),
    }
}

/// The receipt of a file whose verified bytes are published under its
/// final name (and that name's directory fsynced), then the event.
pub(crate) async fn record_published(
    ctx: &FetchCtx,
    file: &FileRow,
    expected: &Expected,
    digest: String,
    digest_catch_up_bytes: Option<u64>,
    direct_io_bytes: u64,
) -> Result<()> {
    ctx.store
        .put_receipt(
            ctx.run,
            &Receipt {
                path: file.path.clone(),
                size: file.size,
                digest_kind: expected.kind().to_owned(),
                digest,
                completed_at: String::new(),
                adopted: false,
            },
        )
        .await?;
    ctx.reporter.report(ProgressEvent::FilePublished {
        path: file.path.clone(),
        size: file.size,
        digest_catch_up_bytes,
        direct_io_bytes,
    });
    Ok(())
}

/// The minimum-rate rule of a body: over each window of `window`, at
/// least `min_rate` bytes per second must arrive (0 disables it).
pub(crate) struct RateWindow {
    min_rate: u64,
    window: Duration,
    start: Instant,
    bytes: u64,
}

impl RateWindow {
    pub(crate) fn new(min_rate: u64, window: Duration) -> Self {
        RateWindow {
            min_rate,
            window,
            start: Instant::now(),
            bytes: 0,
        }
    }

    /// Adds `bytes`; once a window has passed, fails if it was too slow
    /// and starts the next one.
    pub(crate) fn check(&mut self, path: &str, bytes: u64) -> Result<()> {
        self.bytes = self.bytes.saturating_add(bytes);
        let elapsed = self.start.elapsed();
        if self.min_rate == 0 || elapsed < self.window {
            return Ok(());
        }
        // Non-negative and finite (a rate times a duration); `as` saturates.
        #[expect(clippy::cast_sign_loss, reason = "a non-negative byte count")]
        let needed = (self.min_rate as f64 * elapsed.as_secs_f64()) as u64;
        if self.bytes < needed {
            return Err(FetchError::Stalled {
                path: path.to_owned(),
                received: self.bytes,
                window_secs: elapsed.as_secs_f64(),
                min_rate: self.min_rate,
            });
        }
        self.start = Instant::now();
        self.bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Body;
    use ftpipe_hub::client::LinkedMeta;

    const PIN: Pinned<'static> = Pinned {
        path: "f",
        size: 10,
        commit: "c",
        lfs_sha256: None,
    };

    fn answer(status: u16, headers: &[(&str, &str)], body: &'static str) -> SourceResponse {
        let mut b = http::Response::builder().status(status);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        SourceResponse {
            host: "h".into(),
            meta: LinkedMeta::default(),
            body: Body::Http(reqwest::Response::from(b.body(body).unwrap())),
        }
    }

    fn range(validator: Option<&str>) -> Ask<'_> {
        Ask {
            span: Span::Range { from: 4, end: 10 },
            validator,
        }
    }

    fn bad_header(r: Result<Verdict>) -> &'static str {
        match r {
            Err(FetchError::Hub(HubError::BadHeader { header, .. })) => header,
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn a_206_must_answer_exactly_the_asked_range_under_the_sent_validator() {
        let ok = answer(
            206,
            &[("content-range", "bytes 4-9/10"), ("etag", "\"v\"")],
            "456789",
        );
        let v = check(&PIN, &range(Some("\"v\"")), &ok).unwrap();
        assert!(matches!(v, Verdict::Accepted { validator: Some(ref e) } if e == "\"v\""));
        let other = answer(
            206,
            &[("content-range", "bytes 4-9/10"), ("etag", "\"w\"")],
            "456789",
        );
        assert_eq!(
            bad_header(check(&PIN, &range(Some("\"v\"")), &other)),
            "ETag"
        );
        let short = answer(206, &[("content-range", "bytes 4-8/10")], "45678");
        assert_eq!(
            bad_header(check(&PIN, &range(None), &short)),
            "Content-Range"
        );
    }

    #[test]
    fn a_200_is_accepted_only_when_the_whole_file_was_asked() {
        let whole = answer(200, &[("etag", "\"v\"")], "0123456789");
        let v = check(&PIN, &range(Some("\"v\"")), &whole).unwrap();
        assert!(matches!(v, Verdict::RangeIgnored { .. }));
        let ask = Ask {
            span: Span::Whole,
            validator: None,
        };
        assert!(matches!(
            check(&PIN, &ask, &whole).unwrap(),
            Verdict::Accepted { .. }
        ));
        let long = answer(200, &[], "0123456789!");
        assert_eq!(bad_header(check(&PIN, &ask, &long)), "Content-Length");
        // A 206 to a request without a range is refused, not kept.
        let partial = answer(206, &[("content-range", "bytes 0-9/10")], "0123456789");
        let v = check(&PIN, &ask, &partial).unwrap();
        assert!(
            matches!(v, Verdict::Refused { error, .. } if error.to_string().contains("without Range"))
        );
    }

    #[test]
    fn only_a_429_or_503_carries_its_retry_after() {
        for (status, want) in [(429, Some(7)), (503, Some(7)), (500, None)] {
            let r = answer(status, &[("retry-after", "7")], "");
            match check(&PIN, &range(None), &r).unwrap() {
                Verdict::Refused { retry_after, .. } => assert_eq!(retry_after, want, "{status}"),
                _ => panic!("{status} not refused"),
            }
        }
    }
}
