//! Strict parsing of the headers that decide whether bytes may be appended.

use reqwest::header::HeaderMap;

use crate::client::LinkedMeta;
use crate::error::{HubError, Result};
use crate::limits::MAX_FILE_SIZE;

/// `Content-Range: bytes first-last/total`, parsed with checked arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// First byte position.
    pub first: u64,
    /// Last byte position (inclusive).
    pub last: u64,
    /// Complete length.
    pub total: u64,
}

/// Parses a `Content-Range` value; `None` unless it is a satisfied byte range.
pub fn parse_content_range(value: &str) -> Option<ContentRange> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last: u64 = last.trim().parse().ok()?;
    let total: u64 = total.trim().parse().ok()?;
    (first <= last && last < total && total <= MAX_FILE_SIZE).then_some(ContentRange {
        first,
        last,
        total,
    })
}

/// Checks that a 206 answers exactly `bytes=start-` of a `size`-byte file.
pub fn check_partial(path: &str, headers: &HeaderMap, start: u64, size: u64) -> Result<()> {
    check_range(path, headers, start, size, size)
}

/// Checks that a 206 answers exactly the range `[start, end)` of a
/// `size`-byte file (`Content-Range: bytes start-(end−1)/size`).
pub fn check_range(path: &str, headers: &HeaderMap, start: u64, end: u64, size: u64) -> Result<()> {
    // A missing or non-ASCII header is "", which the check below refuses
    // and reports as what was received.
    let raw = headers
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let expected = format!("bytes {start}-{}/{size}", end.saturating_sub(1));
    match parse_content_range(raw) {
        Some(cr) if cr.first == start && cr.last + 1 == end && cr.total == size => Ok(()),
        _ => Err(HubError::BadHeader {
            path: path.to_owned(),
            header: "Content-Range",
            expected,
            actual: raw.to_owned(),
        }),
    }
}

/// The strong validator of a response: a strong ETag, else `Last-Modified`.
/// Weak ETags cannot be used with `If-Range` (RFC 9110 §13.1.5).
pub fn strong_validator(headers: &HeaderMap) -> Option<String> {
    let etag = headers.get("etag").and_then(|v| v.to_str().ok());
    match etag {
        Some(e) if !e.starts_with("W/") && e.starts_with('"') => Some(e.to_owned()),
        _ => headers
            .get("last-modified")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    }
}

/// The ETag header value, if any.
pub fn etag(headers: &HeaderMap) -> Option<String> {
    headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `Retry-After` in seconds, if present and numeric.
pub fn retry_after_secs(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Strips quotes from an ETag-like value for comparison with a digest.
pub fn unquote(v: &str) -> &str {
    let v = v.strip_prefix("W/").unwrap_or(v);
    v.trim_matches('"')
}

/// A header of the hub's file metadata that contradicts the pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinContradiction {
    /// The header (`X-Repo-Commit`, `X-Linked-Size`, `X-Linked-Etag`).
    pub header: &'static str,
    /// What the pin says.
    pub expected: String,
    /// What the header says.
    pub actual: String,
    /// What the header describes (`commit`, `size`, `sha256 digest`).
    pub what: &'static str,
}

/// Checks the hub's `X-Repo-Commit` / `X-Linked-Size` / `X-Linked-Etag`
/// against the pinned commit, size and LFS digest. An absent header is no
/// contradiction; a present one must name the pinned value exactly (a size
/// that does not parse contradicts any size). Not retried: the hub's own
/// description of a file under the pinned commit does not change.
pub fn check_linked_meta(
    meta: &LinkedMeta,
    commit: &str,
    size: u64,
    lfs_sha256: Option<&str>,
) -> std::result::Result<(), PinContradiction> {
    let contradiction = |header, expected: String, actual: &str, what| PinContradiction {
        header,
        expected,
        actual: actual.to_owned(),
        what,
    };
    if let Some(c) = &meta.repo_commit
        && !c.eq_ignore_ascii_case(commit)
    {
        return Err(contradiction(
            "X-Repo-Commit",
            commit.to_owned(),
            c,
            "commit",
        ));
    }
    if let Some(s) = &meta.linked_size
        && s.trim().parse::<u64>().ok() != Some(size)
    {
        return Err(contradiction("X-Linked-Size", size.to_string(), s, "size"));
    }
    if let (Some(etag), Some(sha)) = (&meta.linked_etag, lfs_sha256)
        && !unquote(etag).eq_ignore_ascii_case(sha)
    {
        return Err(contradiction(
            "X-Linked-Etag",
            format!("\"{sha}\""),
            etag,
            "sha256 digest",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parsing_is_strict() {
        assert_eq!(
            parse_content_range("bytes 10-19/20"),
            Some(ContentRange {
                first: 10,
                last: 19,
                total: 20
            })
        );
        for bad in [
            "bytes 10-9/20",
            "bytes 0-20/20",
            "bytes */20",
            "items 0-1/2",
            "bytes 0-1/x",
            "bytes 18446744073709551615-18446744073709551615/18446744073709551615",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }

    #[test]
    fn partial_must_match_request_exactly() {
        let mut h = HeaderMap::new();
        h.insert("content-range", "bytes 5-9/10".parse().unwrap());
        assert!(check_partial("f", &h, 5, 10).is_ok());
        assert!(check_partial("f", &h, 4, 10).is_err());
        assert!(check_partial("f", &h, 5, 11).is_err());
    }
}
