//! Reading the pinned revision's files in small pieces, without fetching
//! them: what the planner needs from a remote checkpoint (`config.json` and
//! the index whole, each shard's 8 + N header bytes).
//!
//! [`RemoteFiles`] is the seam: the planner (`ftpipe-convert`) reads through
//! it and never sees HTTP; [`PinnedRepo`] implements it over the hub's
//! resolve URLs. Every answer is checked strictly: a whole file must have
//! exactly its listed size, a range must come back as a `206` whose
//! `Content-Range` is exactly what was asked.

use std::future::Future;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue, RANGE};

use crate::client::{HubClient, redact};
use crate::error::{HubError, Result};
use crate::headers::parse_content_range;
use crate::says::HubSays;

/// Byte reads of the files of one pinned revision.
pub trait RemoteFiles: Sync {
    /// The whole of `path`, whose listed size is `size` bytes (the caller
    /// bounds `size`); a body of any other length is an error.
    fn read_whole(&self, path: &str, size: u64) -> impl Future<Output = Result<Vec<u8>>> + Send;

    /// Bytes `first..=last` of the `size`-byte file `path`.
    fn read_range(
        &self,
        path: &str,
        first: u64,
        last: u64,
        size: u64,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send;
}

/// A repository pinned to a commit, read through the hub's resolve URLs.
#[derive(Clone, Copy)]
pub struct PinnedRepo<'a> {
    /// The hub client (endpoint, token, redirect rules).
    pub client: &'a HubClient,
    /// The repository id.
    pub repo: &'a str,
    /// The pinned 40-hex commit.
    pub commit: &'a str,
}

impl RemoteFiles for PinnedRepo<'_> {
    async fn read_whole(&self, path: &str, size: u64) -> Result<Vec<u8>> {
        let url = self.client.resolve_url(self.repo, self.commit, path)?;
        let r = self
            .client
            .get_body(path, url.clone(), HeaderMap::new())
            .await?;
        if r.response.status() != StatusCode::OK {
            return Err(HubError::Status {
                url: redact(&url),
                status: r.response.status().as_u16(),
                detail: String::new(),
                hub: HubSays::from_headers(r.response.headers()),
            });
        }
        read_body(path, r.response, size).await
    }

    async fn read_range(&self, path: &str, first: u64, last: u64, size: u64) -> Result<Vec<u8>> {
        get_range(self, path, first, last, size).await
    }
}

/// GETs bytes `first..=last` of a `size`-byte file, accepting only a 206
/// whose `Content-Range` is exactly `bytes first-last/size`.
async fn get_range(
    pinned: &PinnedRepo<'_>,
    path: &str,
    first: u64,
    last: u64,
    size: u64,
) -> Result<Vec<u8>> {
    let url = pinned
        .client
        .resolve_url(pinned.repo, pinned.commit, path)?;
    let mut h = HeaderMap::new();
    let range = format!("bytes={first}-{last}");
    h.insert(
        RANGE,
        HeaderValue::from_str(&range).map_err(|e| HubError::InvalidInput {
            what: "range",
            message: e.to_string(),
        })?,
    );
    let r = pinned.client.get_body(path, url.clone(), h).await?;
    let resp = r.response;
    if resp.status() != StatusCode::PARTIAL_CONTENT {
        // A 200 would be the whole file: drop it unread.
        return Err(HubError::Status {
            url: redact(&url),
            status: resp.status().as_u16(),
            detail: format!(" to {range} (expected 206 Partial Content)"),
            hub: HubSays::from_headers(resp.headers()),
        });
    }
    // A missing or non-ASCII header is "", which the check below refuses
    // and reports as what was received.
    let raw = resp
        .headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let want = format!("bytes {first}-{last}/{size}");
    match parse_content_range(&raw) {
        Some(cr) if cr.first == first && cr.last == last && cr.total == size => {}
        _ => {
            return Err(HubError::BadHeader {
                path: path.to_owned(),
                header: "Content-Range",
                expected: want,
                actual: raw,
            });
        }
    }
    read_body(path, resp, last - first + 1).await
}

/// Reads a response body of exactly `expected` bytes: a longer one is cut
/// off at `expected + 1`, never buffered whole.
async fn read_body(path: &str, mut resp: reqwest::Response, expected: u64) -> Result<Vec<u8>> {
    let cap = expected;
    let mut body = Vec::with_capacity(usize::try_from(cap.min(1 << 20)).unwrap_or(0));
    while let Some(chunk) = resp.chunk().await.map_err(|e| HubError::BodyFailed {
        path: path.to_owned(),
        received: body.len() as u64,
        message: e.without_url().to_string(),
    })? {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(HubError::LongBody {
                path: path.to_owned(),
                expected,
            });
        }
        body.extend_from_slice(&chunk);
    }
    if body.len() as u64 != expected {
        return Err(HubError::ShortBody {
            path: path.to_owned(),
            received: body.len() as u64,
            expected,
        });
    }
    Ok(body)
}
