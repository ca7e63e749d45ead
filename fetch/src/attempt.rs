//! One attempt, whichever path makes it (one stream or a range of a
//! segmented fetch): what it asks for and records before the request, the
//! one check of the answer, the body's minimum-rate rule, and the receipt
//! once the file is published.
//!
//! The check is the strictness of the whole fetch, written once over the
//! seam's typed answers (`crate::source::ReadOutcome`), whatever the
//! source: the source's description of the file must agree with the pin;
//! a span must be exactly the asked one (the `Content-Range` a hub sent),
//! under the validator the kept bytes were fetched under, with a matching
//! length; the whole file is accepted only when the whole file was asked,
//! and is otherwise the range ignored; a refusal carries the wait the
//! source asked for.

use std::time::{Duration, Instant};

use ftpipe_hub::HubError;
use ftpipe_hub::headers::check_linked_meta;
use ftpipe_hub::identity::Expected;
use ftpipe_progress::ProgressEvent;
use ftpipe_receipts::{Attempt, FileRow, Receipt};

use crate::ctx::FetchCtx;
use crate::error::{FetchError, Result};
use crate::source::{Ask, Body, ReadOutcome, Reply, SentSpan, Span};

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
    Accepted {
        validator: Option<String>,
        body: Body,
    },
    /// The whole file from byte 0 to a range request (the source ignores
    /// ranges, or the file changed). Its length is not checked yet
    /// ([`whole_length`], if the body is kept).
    RangeIgnored {
        validator: Option<String>,
        length: Option<u64>,
        body: Body,
    },
    /// Not an answer with bytes to keep; `retry_after`: the seconds the
    /// source asked to wait.
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

/// Records what the answer said (final host, and the status, ETag and
/// range where the source has them).
pub(crate) fn record_reply(attempt: &mut Attempt, reply: &Reply) {
    attempt.host = reply.host.clone();
    attempt.status = reply.wire.status;
    attempt.etag = reply.wire.etag.clone();
    attempt.content_range = reply.wire.content_range.clone();
}

/// The one response check (see the module doc).
pub(crate) fn check(pin: &Pinned<'_>, ask: &Ask<'_>, reply: Reply) -> Result<Verdict> {
    let path = pin.path;
    check_linked_meta(&reply.meta, pin.commit, pin.size, pin.lfs_sha256).map_err(|c| {
        FetchError::PinContradicted {
            path: path.to_owned(),
            header: c.header,
            expected: c.expected,
            actual: c.actual,
            what: c.what,
        }
    })?;
    let (sent, validator, length, body) = match reply.outcome {
        ReadOutcome::Whole {
            validator,
            length,
            body,
        } => {
            if ask.span != Span::Whole {
                return Ok(Verdict::RangeIgnored {
                    validator,
                    length,
                    body,
                });
            }
            whole_length(path, length, pin.size)?;
            return Ok(Verdict::Accepted { validator, body });
        }
        ReadOutcome::Refused { retry_after, error } => {
            return Ok(Verdict::Refused { retry_after, error });
        }
        ReadOutcome::Span {
            sent,
            validator,
            length,
            body,
        } => (sent, validator, length, body),
    };
    let Some((from, end)) = ask.span.bounds(pin.size) else {
        return Err(FetchError::internal(format!(
            "the source answered a span to a request for the whole of {path}"
        )));
    };
    check_span(path, sent, reply.wire.content_range, from, end, pin.size)?;
    if let Some(asked) = ask.validator
        && validator.as_deref() != Some(asked)
    {
        // Message only: a missing validator shows as "".
        return Err(bad_header(
            path,
            "ETag",
            asked.to_owned(),
            validator.unwrap_or_default(),
        ));
    }
    if let Some(len) = length
        && Some(len) != end.checked_sub(from)
    {
        return Err(bad_header(
            path,
            "Content-Length",
            end.saturating_sub(from).to_string(),
            len.to_string(),
        ));
    }
    Ok(Verdict::Accepted { validator, body })
}

/// A span answer must be exactly `[from, end)` of the pinned `size`;
/// `as_sent` is how the source wrote the span (the message's "actual").
fn check_span(
    path: &str,
    sent: Option<SentSpan>,
    as_sent: Option<String>,
    from: u64,
    end: u64,
    size: u64,
) -> Result<()> {
    let want = SentSpan {
        first: from,
        end,
        total: size,
    };
    if sent == Some(want) && from < end {
        return Ok(());
    }
    let actual = as_sent.unwrap_or_else(|| match sent {
        Some(s) => format!("bytes {}-{}/{}", s.first, s.end.saturating_sub(1), s.total),
        None => String::new(),
    });
    Err(bad_header(
        path,
        "Content-Range",
        format!("bytes {from}-{}/{size}", end.saturating_sub(1)),
        actual,
    ))
}

fn bad_header(path: &str, header: &'static str, expected: String, actual: String) -> FetchError {
    FetchError::Hub(HubError::BadHeader {
        path: path.to_owned(),
        header,
        expected,
        actual,
    })
}

/// The whole file kept must announce the file's size (or no length).
pub(crate) fn whole_length(path: &str, length: Option<u64>, size: u64) -> Result<()> {
    match length {
        Some(len) if len != size => Err(bad_header(
            path,
            "Content-Length",
            size.to_string(),
            len.to_string(),
        )),
        _ => Ok(()),
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
    use crate::source::WireRecord;
    use ftpipe_hub::client::LinkedMeta;

    const PIN: Pinned<'static> = Pinned {
        path: "f",
        size: 10,
        commit: "c",
        lfs_sha256: None,
    };

    fn reply(outcome: ReadOutcome, content_range: Option<&str>) -> Reply {
        Reply {
            host: "h".into(),
            meta: LinkedMeta::default(),
            wire: WireRecord {
                content_range: content_range.map(str::to_owned),
                ..WireRecord::default()
            },
            outcome,
        }
    }

    fn span(first: u64, end: u64, validator: Option<&str>, length: u64) -> Reply {
        let outcome = ReadOutcome::Span {
            sent: Some(SentSpan {
                first,
                end,
                total: 10,
            }),
            validator: validator.map(str::to_owned),
            length: Some(length),
            body: Body::empty(),
        };
        reply(outcome, None)
    }

    fn whole(validator: Option<&str>, length: u64) -> Reply {
        let outcome = ReadOutcome::Whole {
            validator: validator.map(str::to_owned),
            length: Some(length),
            body: Body::empty(),
        };
        reply(outcome, None)
    }

    fn range(validator: Option<&str>) -> Ask<'_> {
        Ask {
            span: Span::Range { from: 4, end: 10 },
            validator,
        }
    }

    fn bad_header(r: Result<Verdict>) -> (&'static str, String) {
        match r {
            Err(FetchError::Hub(HubError::BadHeader { header, actual, .. })) => (header, actual),
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn a_span_must_be_exactly_the_asked_one_under_the_sent_validator() {
        let ok = span(4, 10, Some("\"v\""), 6);
        let v = check(&PIN, &range(Some("\"v\"")), ok).unwrap();
        assert!(matches!(v, Verdict::Accepted { validator: Some(ref e), .. } if e == "\"v\""));
        let other = span(4, 10, Some("\"w\""), 6);
        assert_eq!(
            bad_header(check(&PIN, &range(Some("\"v\"")), other)).0,
            "ETag"
        );
        let short = span(4, 9, None, 5);
        let (header, actual) = bad_header(check(&PIN, &range(None), short));
        assert_eq!((header, actual.as_str()), ("Content-Range", "bytes 4-8/10"));
        let long = span(4, 10, None, 7);
        assert_eq!(
            bad_header(check(&PIN, &range(None), long)).0,
            "Content-Length"
        );
        // A span the source could not name is refused with what it wrote.
        let unnamed = ReadOutcome::Span {
            sent: None,
            validator: None,
            length: None,
            body: Body::empty(),
        };
        let (header, actual) = bad_header(check(
            &PIN,
            &range(None),
            reply(unnamed, Some("bytes 4-x/10")),
        ));
        assert_eq!((header, actual.as_str()), ("Content-Range", "bytes 4-x/10"));
    }

    #[test]
    fn the_whole_file_is_accepted_only_when_the_whole_file_was_asked() {
        let v = check(&PIN, &range(Some("\"v\"")), whole(Some("\"v\""), 10)).unwrap();
        assert!(matches!(v, Verdict::RangeIgnored { .. }));
        let ask = Ask {
            span: Span::Whole,
            validator: None,
        };
        assert!(matches!(
            check(&PIN, &ask, whole(None, 10)).unwrap(),
            Verdict::Accepted { .. }
        ));
        assert_eq!(
            bad_header(check(&PIN, &ask, whole(None, 11))).0,
            "Content-Length"
        );
        // A span to a request without one is a source's bug, not kept.
        assert!(matches!(
            check(&PIN, &ask, span(0, 10, None, 10)),
            Err(FetchError::Internal { .. })
        ));
    }

    #[test]
    fn a_refusal_keeps_its_wait_and_its_error() {
        let refused = ReadOutcome::Refused {
            retry_after: Some(7),
            error: FetchError::internal("x"),
        };
        match check(&PIN, &range(None), reply(refused, None)).unwrap() {
            Verdict::Refused { retry_after, error } => {
                assert_eq!(retry_after, Some(7));
                assert!(error.to_string().contains('x'));
            }
            _ => panic!("not refused"),
        }
    }
}
