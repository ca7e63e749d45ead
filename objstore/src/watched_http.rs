//! The HTTP client S3 uploads go through ([`WatchedConnector`], an
//! `object_store` connector): `reqwest` without its read timeout, which
//! ran while a part's body was still being sent and cut a part slower than
//! `--read-timeout` over a slow uplink although its bytes kept moving.
//! Each request's body is handed on in steps and watched instead
//! ([`crate::upload_progress`]); the answer (an upload's is a few headers
//! and at most a small XML document) is read within the read timeout per
//! piece and at most [`MAX_UPLOAD_ANSWER_BYTES`]. [`WatchedClient`] is the
//! same client for requests built here (a part sent to a presigned URL).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::BodyExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use reqwest::header::{CONTENT_LENGTH, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};

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

impl WatchedConnector {
    /// The watched client itself, for requests built here.
    pub(crate) fn client(&self) -> Result<WatchedClient, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .default_headers(self.headers.clone())
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(reqwest::Error::without_url)?;
        Ok(WatchedClient {
            client,
            read_timeout: self.read_timeout,
        })
    }
}

impl HttpConnector for WatchedConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = self.client().map_err(|e| object_store::Error::Generic {
            store: "S3",
            source: Box::new(e),
        })?;
        Ok(HttpClient::new(WatchedService(client)))
    }
}

/// An upload client: no read timeout while the body is sent, its progress
/// watched instead; the answer bounded (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct WatchedClient {
    client: reqwest::Client,
    read_timeout: Duration,
}

/// What a server answered an upload through [`WatchedClient`].
#[derive(Debug)]
pub(crate) struct WatchedAnswer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// At most [`MAX_UPLOAD_ANSWER_BYTES`].
    pub(crate) body: Vec<u8>,
}

#[derive(Debug)]
struct WatchedService(WatchedClient);

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
        let url = Url::parse(&parts.uri.to_string())
            .map_err(|e| HttpError::new(HttpErrorKind::Request, e))?;
        let bytes = body.collect().await?.to_bytes();
        let answer = self.0.send(parts.method, url, parts.headers, bytes).await?;
        let mut out = HttpResponse::new(HttpResponseBody::from(answer.body));
        *out.status_mut() = answer.status;
        *out.headers_mut() = answer.headers;
        Ok(out)
    }
}

impl WatchedClient {
    /// Sends `body` with `headers` to `url`, the body watched for progress;
    /// the answer, read within the read timeout per piece and bounded.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: Url,
        headers: HeaderMap,
        bytes: Bytes,
    ) -> Result<WatchedAnswer, HttpError> {
        let len = bytes.len() as u64;
        let progress = Progress::new();
        let mut request = reqwest::Request::new(method, url);
        *request.headers_mut() = headers;
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
        let body = self.answer(response).await?;
        Ok(WatchedAnswer {
            status,
            headers,
            body,
        })
    }

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
