//! The HTTP client S3 uploads go through ([`WatchedConnector`], an
//! `object_store` connector): `reqwest` without its read timeout, which
//! ran while a part's body was still being sent and cut a part slower than
//! `--read-timeout` over a slow uplink although its bytes kept moving.
//! Each request's body is handed on in steps and watched instead
//! ([`crate::upload_progress`]); the answer (an upload's is a few headers
//! and at most a small XML document) is read within the read timeout per
//! piece and at most [`MAX_UPLOAD_ANSWER_BYTES`].

use std::time::Duration;

use async_trait::async_trait;
use http_body_util::BodyExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use reqwest::header::{CONTENT_LENGTH, HeaderMap, HeaderValue};

use crate::upload_progress::{self, Progress};

/// Bytes of an upload's answer read, at most.
pub const MAX_UPLOAD_ANSWER_BYTES: u64 = 1 << 20;

/// Why an upload through the watched client failed without an answer.
#[derive(Debug, thiserror::Error)]
enum WatchedError {
    #[error("no progress for {secs} s (--read-timeout): {sent} of {len} body bytes sent")]
    Stalled { secs: u64, sent: u64, len: u64 },
    #[error("the answer stopped for {secs} s (--read-timeout)")]
    AnswerStalled { secs: u64 },
    #[error("the answer is longer than {MAX_UPLOAD_ANSWER_BYTES} bytes")]
    AnswerTooLong,
}

/// Builds the watched client for `object_store` (its own options other
/// than the connect timeout do not apply: uploads need none of them).
#[derive(Debug, Clone)]
pub(crate) struct WatchedConnector {
    pub(crate) read_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// Sent with every request.
    pub(crate) headers: HeaderMap,
}

impl HttpConnector for WatchedConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .default_headers(self.headers.clone())
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e.without_url()),
            })?;
        Ok(HttpClient::new(WatchedService {
            client,
            read_timeout: self.read_timeout,
        }))
    }
}

#[derive(Debug)]
struct WatchedService {
    client: reqwest::Client,
    read_timeout: Duration,
}

/// `object_store`'s kind of a `reqwest` failure (what it retries).
fn kind_of(e: &reqwest::Error) -> HttpErrorKind {
    if e.is_connect() {
        HttpErrorKind::Connect
    } else if e.is_timeout() {
        HttpErrorKind::Timeout
    } else if e.is_request() || e.is_body() {
        HttpErrorKind::Request
    } else {
        HttpErrorKind::Unknown
    }
}

fn failed(e: reqwest::Error) -> HttpError {
    HttpError::new(kind_of(&e), e.without_url())
}

#[async_trait]
impl HttpService for WatchedService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let (parts, body) = req.into_parts();
        let url = reqwest::Url::parse(&parts.uri.to_string())
            .map_err(|e| HttpError::new(HttpErrorKind::Request, e))?;
        let bytes = body.collect().await?.to_bytes();
        let len = bytes.len() as u64;
        let progress = Progress::new();
        let mut request = reqwest::Request::new(parts.method, url);
        *request.headers_mut() = parts.headers;
        request
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(len));
        *request.body_mut() = Some(progress.body(&bytes));
        let secs = self.read_timeout.as_secs();
        let sent = self.client.execute(request);
        let response = upload_progress::watched(self.read_timeout, len, &progress, sent)
            .await
            .map_err(|s| {
                let e = WatchedError::Stalled {
                    secs,
                    sent: s.sent,
                    len,
                };
                HttpError::new(HttpErrorKind::Timeout, e)
            })?
            .map_err(failed)?;
        let (status, headers) = (response.status(), response.headers().clone());
        let answer = self.answer(response).await?;
        let mut out = HttpResponse::new(HttpResponseBody::from(answer));
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

impl WatchedService {
    /// The answer's body, each piece within the read timeout, bounded.
    async fn answer(&self, mut response: reqwest::Response) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        loop {
            let piece = tokio::time::timeout(self.read_timeout, response.chunk())
                .await
                .map_err(|_| {
                    let secs = self.read_timeout.as_secs();
                    HttpError::new(HttpErrorKind::Timeout, WatchedError::AnswerStalled { secs })
                })?
                .map_err(failed)?;
            let Some(piece) = piece else {
                return Ok(body);
            };
            if body.len() as u64 + piece.len() as u64 > MAX_UPLOAD_ANSWER_BYTES {
                return Err(HttpError::new(
                    HttpErrorKind::Decode,
                    WatchedError::AnswerTooLong,
                ));
            }
            body.extend_from_slice(&piece);
        }
    }
}
