//! The requests `publish` and `pull` make, over `object_store`'s S3
//! client. Each takes a key relative to the bucket, names it as
//! `s3://BUCKET/KEY` in every error, and reads at most what its caller
//! allows.
//!
//! Retries: `object_store` retries a failed request a few times itself
//! ([`RETRIES`], within [`RETRY_TIMEOUT`]); what fails after that is the
//! caller's to record and retry (the fetch machinery's attempts and
//! backoff for `pull`, a re-run for `publish`).
//!
//! Store checksums: every put and part is sent with its SHA-256 as an S3
//! additional checksum (`x-amz-checksum-sha256`; a multipart upload is
//! created with `x-amz-checksum-algorithm: SHA256`), which the store checks
//! against the bytes it receives and keeps. `object_store`'s head does not
//! expose the checksum headers, so [`S3::head_checked`] asks for them
//! (`x-amz-checksum-mode: ENABLED`) in a HEAD to a URL `object_store`
//! presigns (the header signed with it), sent with its own client: no
//! redirect followed, the read timeout as every request's, the URL (which
//! holds a signature and any session token) in no error.
//!
//! Parts and puts: each part's SHA-256 is computed once, by the caller as
//! it reads the part, and that digest is the part's
//! `x-amz-checksum-sha256`; a whole-object put that may replace carries the
//! file's SHA-256, which the caller computed as it read the file and
//! checked against the manifest. Either is sent to a URL `object_store`
//! presigns (`UploadPart`, `PutObject`) with that header signed into it
//! (the body itself unsigned, as presigned requests are: S3 checks the
//! body against the signed checksum instead), over the watched upload
//! client ([`WatchedClient`]); `object_store`'s own put and part upload
//! would hash every byte again, for its signature and its checksum. A
//! part's receipt is the one `object_store` gives and completes from
//! ([`PartMetadata`]).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjPath;
use object_store::{
    Attribute, Attributes, BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, RetryConfig,
};

use backon::{ExponentialBuilder, Retryable};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use object_store::aws::Checksum;
use object_store::signer::{SignedUrlOptions, Signer};
use reqwest::header::{CONTENT_LENGTH, ETAG, HeaderMap, HeaderName, HeaderValue};

use crate::checksum::{Sha256Digest, StoreChecksum};
use crate::credentials::S3Config;
use crate::error::{ObjStoreError, Result};
use crate::location::S3Location;
use crate::watched_http::{WatchedClient, WatchedConnector};

/// The user metadata key (`x-amz-meta-ftpipe-sha256`) holding an object's
/// SHA-256 as the publisher computed it from the bytes it sent. A
/// publisher-side check only: the receiver verifies against the manifest.
pub const SHA256_METADATA: &str = "ftpipe-sha256";
/// [`SHA256_METADATA`] as the header a put sends it in.
const SHA256_METADATA_HEADER: &str = "x-amz-meta-ftpipe-sha256";
/// Smallest part S3 accepts (all parts but the last).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// Most parts of one multipart upload S3 accepts.
pub const MAX_PART_NUMBER: u64 = 10_000;
/// Retries `object_store` makes itself for one request.
const RETRIES: usize = 3;
/// Time limit of one request and its retries.
const RETRY_TIMEOUT: Duration = Duration::from_secs(120);
/// Connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a presigned checksum HEAD's URL is valid (it is sent at once).
const PRESIGNED_FOR: Duration = Duration::from_secs(300);
/// The header asking a HEAD for the object's store checksum.
const CHECKSUM_MODE: &str = "x-amz-checksum-mode";
/// The store's SHA-256 checksum of an object (or of its parts).
const CHECKSUM_SHA256: &str = "x-amz-checksum-sha256";
/// Whether the checksum is of the whole object (`FULL_OBJECT`) or of its
/// parts (`COMPOSITE`).
const CHECKSUM_TYPE: &str = "x-amz-checksum-type";
/// Names the algorithm of the checksum header a put carries, as the AWS
/// SDKs send it; S3 needs only the checksum header, S3-compatible servers
/// (moto) keep the checksum only when it is there.
const SDK_CHECKSUM_ALGORITHM: &str = "x-amz-sdk-checksum-algorithm";

/// What a `head` says of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Its size.
    pub size: u64,
    /// Its ETag, as the server spells it (quoted).
    pub etag: Option<String>,
    /// The `x-amz-meta-ftpipe-sha256` metadata, when set (a claim).
    pub sha256: Option<String>,
    /// The store's own checksum of the object's bytes, when it keeps one
    /// and was asked ([`S3::head_checked`]; `None` from [`S3::head`]).
    pub checksum: Option<StoreChecksum>,
}

/// A whole small object, read within a limit.
#[derive(Debug, Clone)]
pub struct ObjectBody {
    /// Its bytes.
    pub bytes: Bytes,
    /// Its ETag.
    pub etag: Option<String>,
}

/// What a put did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// The object was written; its ETag.
    Written {
        /// The ETag the server gave it.
        etag: Option<String>,
    },
    /// A create-only put found an object already there; nothing written.
    Exists,
}

/// An answer to a ranged get: what it covers and its body, unread.
pub struct RangeGet {
    /// The bytes of the object the body holds.
    pub range: Range<u64>,
    /// The object's size.
    pub size: u64,
    /// The object's ETag.
    pub etag: Option<String>,
    /// The body, chunk by chunk as it arrives.
    pub body: BoxStream<'static, object_store::Result<Bytes>>,
}

/// A bucket on one S3-compatible server, with the location it was opened for.
#[derive(Debug, Clone)]
pub struct S3 {
    store: Arc<AmazonS3>,
    /// The client whole-object puts go through: `store` naming the
    /// checksum's algorithm on every request ([`SDK_CHECKSUM_ALGORITHM`]),
    /// which S3 refuses on a request without a checksum header; through
    /// the watched client ([`WatchedConnector`]: no read timeout while a
    /// body is sent, its progress checked instead).
    putter: Arc<AmazonS3>,
    /// Sends parts to the URLs `store` presigns.
    part_client: WatchedClient,
    /// Retries of a part or a checksum HEAD after a failure that may pass.
    retries: usize,
    /// Sends the presigned checksum HEAD.
    http: reqwest::Client,
    location: S3Location,
    host: String,
    /// [`S3Config::credentials_from`], for the refusals' sentences.
    credentials_from: String,
}

impl S3 {
    /// A client for `location` with `config` (no request is made yet).
    pub fn open(config: &S3Config, location: S3Location) -> Result<S3> {
        S3::open_with_retries(config, location, RETRIES)
    }

    /// A client whose requests are never retried by `object_store` itself:
    /// the one a byte source reads file bodies through, so that every
    /// retry of a stalled, cut or refused read is the fetch's own, under
    /// its policy and recorded as an attempt.
    pub fn open_for_transfers(config: &S3Config, location: S3Location) -> Result<S3> {
        S3::open_with_retries(config, location, 0)
    }

    fn open_with_retries(config: &S3Config, location: S3Location, retries: usize) -> Result<S3> {
        let client_error = |source| ObjStoreError::Client {
            bucket: location.bucket().to_owned(),
            source,
        };
        let store = builder(config, &location, retries, ClientOptions::new())
            .build()
            .map_err(client_error)?;
        let mut sdk = HeaderMap::new();
        sdk.insert(SDK_CHECKSUM_ALGORITHM, HeaderValue::from_static("SHA256"));
        let watched = |headers: HeaderMap| WatchedConnector {
            read_timeout: config.read_timeout,
            connect_timeout: CONNECT_TIMEOUT,
            headers,
        };
        let putter = builder(config, &location, retries, ClientOptions::new())
            .with_http_connector(watched(sdk))
            .build()
            .map_err(client_error)?;
        let part_client = watched(HeaderMap::new())
            .client()
            .map_err(|e| ObjStoreError::Http {
                op: "client setup",
                key: location.to_string(),
                source: e,
            })?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(|e| ObjStoreError::Http {
                op: "client setup",
                key: location.to_string(),
                source: e.without_url(),
            })?;
        Ok(S3 {
            store: Arc::new(store),
            putter: Arc::new(putter),
            part_client,
            retries,
            http,
            host: endpoint_host(config),
            location,
            credentials_from: config.credentials_from.clone(),
        })
    }

    /// The location this client was opened for.
    pub fn location(&self) -> &S3Location {
        &self.location
    }

    /// The server's host (and port), as recorded with attempts.
    pub fn host(&self) -> &str {
        &self.host
    }

    fn url(&self, key: &str) -> String {
        self.location.url_of(key)
    }

    /// A request's error ([`ObjStoreError::request`]), naming where the
    /// credentials it was signed with came from.
    fn failed(&self, op: &'static str, key: String, source: object_store::Error) -> ObjStoreError {
        ObjStoreError::request(op, key, source).signed_with(&self.credentials_from)
    }

    /// `Ok(None)` when `source` says the object is missing; a missing
    /// bucket (`NoSuchBucket`, also a 404) and every other failure is the
    /// request's error.
    fn absent<T>(
        &self,
        op: &'static str,
        key: &str,
        source: object_store::Error,
    ) -> Result<Option<T>> {
        match self.failed(op, self.url(key), source) {
            ObjStoreError::NotFound { .. } => Ok(None),
            e => Err(e),
        }
    }

    /// The object's size, ETag and SHA-256 metadata; `None` when it does
    /// not exist.
    pub async fn head(&self, key: &str) -> Result<Option<Head>> {
        let opts = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match self.store.get_opts(&ObjPath::from(key), opts).await {
            Ok(r) => Ok(Some(Head {
                size: r.meta.size,
                etag: r.meta.e_tag.clone(),
                sha256: r
                    .attributes
                    .get(&Attribute::Metadata(SHA256_METADATA.into()))
                    .map(|v| v.as_ref().to_owned()),
                checksum: None,
            })),
            Err(source) => self.absent("head", key, source),
        }
    }

    /// The object's size, ETag, SHA-256 metadata and store checksum (see
    /// the module doc); `None` when it does not exist. Retried as
    /// `object_store` retries a request: [`RETRIES`] more times after a
    /// failure that may pass.
    pub async fn head_checked(&self, key: &str) -> Result<Option<Head>> {
        (|| self.head_checked_once(key))
            .retry(self.backoff())
            .when(ObjStoreError::is_transient)
            .await
    }

    async fn head_checked_once(&self, key: &str) -> Result<Option<Head>> {
        const OP: &str = "head";
        let options = SignedUrlOptions::default().with_signed_header(
            HeaderName::from_static(CHECKSUM_MODE),
            HeaderValue::from_static("ENABLED"),
        );
        let url = self
            .store
            .signed_url_opts(
                reqwest::Method::HEAD,
                &ObjPath::from(key),
                PRESIGNED_FOR,
                &options,
            )
            .await
            .map_err(|source| ObjStoreError::request(OP, self.url(key), source))?;
        let answer = self
            .http
            .head(url)
            .header(CHECKSUM_MODE, "ENABLED")
            .send()
            .await
            .map_err(|e| ObjStoreError::Http {
                op: OP,
                key: self.url(key),
                source: e.without_url(),
            })?;
        let status = answer.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(ObjStoreError::Status {
                op: OP,
                key: self.url(key),
                bucket: self.location.bucket().to_owned(),
                credentials_from: self.credentials_from.clone(),
                status: status.as_u16(),
            });
        }
        let bad = |what: String| ObjStoreError::BadAnswer {
            op: OP,
            key: self.url(key),
            what,
        };
        head_from_headers(answer.headers()).map(Some).map_err(bad)
    }

    /// The whole object when it has at most `max` bytes (the limit holds
    /// while reading, whatever the server announced); `None` when it does
    /// not exist.
    pub async fn get_bounded(&self, key: &str, max: u64) -> Result<Option<ObjectBody>> {
        let r = match self
            .store
            .get_opts(&ObjPath::from(key), GetOptions::default())
            .await
        {
            Ok(r) => r,
            Err(source) => return self.absent("get", key, source),
        };
        let too_large = |size| ObjStoreError::TooLarge {
            key: self.url(key),
            size,
            max,
        };
        if r.meta.size > max {
            return Err(too_large(r.meta.size));
        }
        let etag = r.meta.e_tag.clone();
        let mut body = r.into_stream();
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|source| self.failed("get", self.url(key), source))?;
            let len = (buf.len() as u64).saturating_add(chunk.len() as u64);
            if len > max {
                return Err(too_large(len));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Some(ObjectBody {
            bytes: buf.freeze(),
            etag,
        }))
    }

    /// Puts `bytes` at `key` with `sha256` as metadata; with `create_only`,
    /// only when nothing is there yet (`If-None-Match: *`).
    ///
    /// A put that may replace goes to a presigned URL with `sha256` (the
    /// caller's digest of `bytes`, checked by it against the manifest) as
    /// its signed `x-amz-checksum-sha256`, as a part does (see the module
    /// doc): the bytes are not hashed again here. A create-only put (a
    /// commit point, a few KiB) goes through `object_store`, whose
    /// conditional put maps the refusal.
    pub async fn put(
        &self,
        key: &str,
        bytes: Bytes,
        sha256: &str,
        create_only: bool,
    ) -> Result<Put> {
        if !create_only {
            return self.put_presigned(key, bytes, sha256).await;
        }
        let opts = PutOptions {
            mode: PutMode::Create,
            attributes: sha256_attributes(sha256),
            ..PutOptions::default()
        };
        match self
            .putter
            .put_opts(&ObjPath::from(key), PutPayload::from_bytes(bytes), opts)
            .await
        {
            Ok(r) => Ok(Put::Written { etag: r.e_tag }),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::Exists),
            Err(source) => Err(self.failed("put", self.url(key), source)),
        }
    }

    /// Puts `bytes`, whose SHA-256 is `sha256` (hex), at `key` through a
    /// presigned URL: the checksum, its algorithm and the metadata signed
    /// into it. Retried as a part is.
    async fn put_presigned(&self, key: &str, bytes: Bytes, sha256: &str) -> Result<Put> {
        const OP: &str = "put";
        let mut digest: Sha256Digest = [0; 32];
        hex::decode_to_slice(sha256, &mut digest).map_err(|e| ObjStoreError::BadAnswer {
            op: OP,
            key: self.url(key),
            what: format!("the SHA-256 to send, {sha256:?}, is not 64 hex digits: {e}"),
        })?;
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static(CHECKSUM_SHA256),
            header_value(OP, &self.url(key), &BASE64.encode(digest))?,
        );
        headers.insert(SDK_CHECKSUM_ALGORITHM, HeaderValue::from_static("SHA256"));
        headers.insert(
            HeaderName::from_static(SHA256_METADATA_HEADER),
            header_value(OP, &self.url(key), sha256)?,
        );
        let answer = (|| self.presigned_put_once(OP, key, Vec::new(), &headers, bytes.clone()))
            .retry(self.backoff())
            .when(ObjStoreError::is_transient)
            .await?;
        if !answer.status.is_success() {
            return Err(self.refused_answer(OP, key, &answer));
        }
        Ok(Put::Written {
            etag: answer_header(&answer.headers, ETAG.as_str()),
        })
    }

    /// Starts a multipart upload of `key` whose object will carry `sha256`
    /// as metadata; its upload id.
    pub async fn create_multipart(&self, key: &str, sha256: &str) -> Result<String> {
        let opts = PutMultipartOptions {
            attributes: sha256_attributes(sha256),
            ..PutMultipartOptions::default()
        };
        self.store
            .create_multipart_opts(&ObjPath::from(key), opts)
            .await
            .map_err(|source| self.failed("create multipart upload", self.url(key), source))
    }

    /// Uploads part `number` (1-based) of `upload_id`, whose bytes'
    /// SHA-256 is `sha256`, as its checksum (see the module doc); its
    /// receipt. Retried as `object_store` retries a request: [`RETRIES`]
    /// more times after a failure that may pass.
    pub async fn put_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u64,
        bytes: Bytes,
        sha256: &Sha256Digest,
    ) -> Result<String> {
        let checksum = BASE64.encode(sha256);
        (|| self.put_part_once(key, upload_id, number, bytes.clone(), &checksum))
            .retry(self.backoff())
            .when(ObjStoreError::is_transient)
            .await
    }

    /// The delays between retries of a request that failed in a way that
    /// may pass: 100 ms, doubling, [`RETRIES`] of them.
    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(60))
            .with_max_times(self.retries)
    }

    async fn put_part_once(
        &self,
        key: &str,
        upload_id: &str,
        number: u64,
        bytes: Bytes,
        checksum: &str,
    ) -> Result<String> {
        const OP: &str = "upload part";
        let bad = |what: String| ObjStoreError::BadAnswer {
            op: OP,
            key: self.url(key),
            what,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static(CHECKSUM_SHA256),
            header_value(OP, &self.url(key), checksum)?,
        );
        let query = vec![
            ("partNumber", number.to_string()),
            ("uploadId", upload_id.to_owned()),
        ];
        let answer = self
            .presigned_put_once(OP, key, query, &headers, bytes)
            .await?;
        if !answer.status.is_success() {
            return Err(self.part_refused(key, &answer));
        }
        let e_tag =
            answer_header(&answer.headers, ETAG.as_str()).ok_or_else(|| bad("no ETag".into()))?;
        let receipt = PartMetadata {
            e_tag,
            checksum_sha256: answer_header(&answer.headers, CHECKSUM_SHA256),
        };
        quick_xml::se::to_string(&receipt).map_err(|e| bad(format!("receipt: {e}")))
    }

    /// One PUT of `bytes` to a URL `object_store` presigns for `key` with
    /// `query` and every one of `headers` signed into it, sent with those
    /// headers over the watched client; the answer, whatever its status.
    async fn presigned_put_once(
        &self,
        op: &'static str,
        key: &str,
        query: Vec<(&'static str, String)>,
        headers: &HeaderMap,
        bytes: Bytes,
    ) -> Result<crate::watched_http::WatchedAnswer> {
        let options = headers.iter().fold(
            SignedUrlOptions::default().with_query(query),
            |o, (name, value)| o.with_signed_header(name.clone(), value.clone()),
        );
        let url = self
            .store
            .signed_url_opts(
                reqwest::Method::PUT,
                &ObjPath::from(key),
                PRESIGNED_FOR,
                &options,
            )
            .await
            .map_err(|source| ObjStoreError::request(op, self.url(key), source))?;
        self.part_client
            .send(reqwest::Method::PUT, url, headers.clone(), bytes)
            .await
            .map_err(|e| {
                let source = object_store::Error::Generic {
                    store: "S3",
                    source: Box::new(e),
                };
                ObjStoreError::request(op, self.url(key), source)
            })
    }

    /// A part upload's refusal: the session gone (`404`: `NoSuchUpload`),
    /// or what the error document (or the status alone) says.
    fn part_refused(
        &self,
        key: &str,
        answer: &crate::watched_http::WatchedAnswer,
    ) -> ObjStoreError {
        const OP: &str = "upload part";
        let status = answer.status.as_u16();
        if status == 404 {
            return ObjStoreError::UploadGone {
                key: self.url(key),
                source: Box::new(self.status_error(OP, key, status)),
            };
        }
        self.refused_answer(OP, key, answer)
    }

    /// A presigned request's refusal: what the error document (or the
    /// status alone) says.
    fn refused_answer(
        &self,
        op: &'static str,
        key: &str,
        answer: &crate::watched_http::WatchedAnswer,
    ) -> ObjStoreError {
        let status = answer.status.as_u16();
        let document = String::from_utf8_lossy(&answer.body);
        // The text `ServerAnswer` reads: the status and the document's
        // elements (redacted and bounded there); never shown raw.
        let text = format!("status code: {status}\n{document}");
        let source = object_store::Error::Generic {
            store: "S3",
            source: text.into(),
        };
        match ObjStoreError::refused(op, &self.url(key), &source) {
            Some(e) => e.signed_with(&self.credentials_from),
            None => self.status_error(op, key, status),
        }
    }

    fn status_error(&self, op: &'static str, key: &str, status: u16) -> ObjStoreError {
        ObjStoreError::Status {
            op,
            key: self.url(key),
            bucket: self.location.bucket().to_owned(),
            credentials_from: self.credentials_from.clone(),
            status,
        }
    }

    /// Completes `upload_id` from its parts' receipts (each an ETag with
    /// the part's checksum, or a plain ETag) in part order; the
    /// object's ETag.
    pub async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        etags: Vec<String>,
    ) -> Result<Option<String>> {
        let parts = etags
            .into_iter()
            .map(|content_id| PartId { content_id })
            .collect();
        let id = upload_id.to_owned();
        match self
            .store
            .complete_multipart(&ObjPath::from(key), &id, parts)
            .await
        {
            Ok(r) => Ok(r.e_tag),
            Err(source @ object_store::Error::NotFound { .. }) => Err(ObjStoreError::UploadGone {
                key: self.url(key),
                source: Box::new(source),
            }),
            Err(source) => Err(self.failed("complete multipart upload", self.url(key), source)),
        }
    }

    /// Aborts `upload_id` (its parts are freed); an unknown id is no error.
    pub async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<()> {
        let id = upload_id.to_owned();
        match self.store.abort_multipart(&ObjPath::from(key), &id).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(self.failed("abort multipart upload", self.url(key), source)),
        }
    }

    /// The objects under `prefix` (a key prefix, compared by path segment),
    /// with their sizes, in the server's order; at most `max` of them (more
    /// is an error naming the prefix, not a silent cut).
    pub async fn list(&self, prefix: &str, max: usize) -> Result<Vec<(String, u64)>> {
        let path = ObjPath::from(prefix);
        let mut listing = self.store.list(Some(&path));
        let mut out = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|source| self.failed("list", self.url(prefix), source))?;
            if out.len() >= max {
                return Err(ObjStoreError::TooManyObjects {
                    prefix: self.url(prefix),
                    max,
                });
            }
            out.push((meta.location.to_string(), meta.size));
        }
        Ok(out)
    }

    /// A ranged get of `key` under `if_match` (`range` `None`: the whole
    /// object). `Ok(Err(..))` is the server's refusal of the precondition
    /// (`412`: the object is no longer the one `if_match` names).
    pub async fn get_range(
        &self,
        key: &str,
        range: Option<GetRange>,
        if_match: Option<String>,
    ) -> Result<std::result::Result<RangeGet, Precondition>> {
        let opts = GetOptions {
            range,
            if_match,
            ..GetOptions::default()
        };
        match self.store.get_opts(&ObjPath::from(key), opts).await {
            Ok(r) => {
                let range = r.range.clone();
                let size = r.meta.size;
                let etag = r.meta.e_tag.clone();
                Ok(Ok(RangeGet {
                    range,
                    size,
                    etag,
                    body: r.into_stream(),
                }))
            }
            Err(object_store::Error::Precondition { .. }) => Ok(Err(Precondition)),
            Err(source) => Err(self.failed("get", self.url(key), source)),
        }
    }
}

/// An `object_store` S3 builder for `location` with `config`, retrying
/// `retries` times, its client options `options` with the timeouts added.
/// Every put and part carries its SHA-256 as an S3 additional checksum.
fn builder(
    config: &S3Config,
    location: &S3Location,
    retries: usize,
    options: ClientOptions,
) -> AmazonS3Builder {
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(location.bucket())
        .with_region(&config.region)
        .with_credentials(config.credentials.clone())
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_checksum_algorithm(Checksum::SHA256)
        .with_retry(RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: retries,
            retry_timeout: RETRY_TIMEOUT,
        })
        .with_client_options(
            options
                .with_allow_http(config.allow_http())
                .with_connect_timeout(CONNECT_TIMEOUT)
                // A stall ends a request at the read timeout, not a
                // request's whole length: a large object takes as long
                // as its bytes keep coming.
                .with_read_timeout(config.read_timeout)
                .with_timeout_disabled(),
        );
    if let Some(e) = &config.endpoint {
        b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
    }
    b
}

/// The server's host (and port) as attempts record it.
fn endpoint_host(config: &S3Config) -> String {
    match &config.endpoint {
        Some(e) => url::Url::parse(e)
            .ok()
            .and_then(|u| {
                u.host_str().map(|h| {
                    format!(
                        "{h}{}",
                        u.port().map(|p| format!(":{p}")).unwrap_or_default()
                    )
                })
            })
            .unwrap_or_default(),
        None => format!("s3.{}.amazonaws.com", config.region),
    }
}

/// What a HEAD's headers say of the object; what is wrong with them.
fn head_from_headers(h: &HeaderMap) -> std::result::Result<Head, String> {
    let text = |name: &str| -> std::result::Result<Option<String>, String> {
        h.get(name)
            .map(|v| {
                v.to_str()
                    .map(str::to_owned)
                    .map_err(|_| format!("header {name} is not visible ASCII"))
            })
            .transpose()
    };
    let size = text(CONTENT_LENGTH.as_str())?
        .ok_or("no Content-Length")?
        .parse::<u64>()
        .map_err(|e| format!("Content-Length: {e}"))?;
    let etag = text(ETAG.as_str())?;
    let sha256 = text(&format!("x-amz-meta-{SHA256_METADATA}"))?;
    let checksum = match text(CHECKSUM_SHA256)? {
        Some(v) => Some(store_checksum(
            &v,
            text(CHECKSUM_TYPE)?.as_deref(),
            etag.as_deref(),
        )?),
        None => None,
    };
    Ok(Head {
        size,
        etag,
        sha256,
        checksum,
    })
}

/// The store checksum `x-amz-checksum-sha256: value` describes.
///
/// `BASE64-N` is over the `N` parts of a multipart object (S3's
/// `COMPOSITE`). A value without the suffix is over the whole object,
/// unless the object is a multipart one (`x-amz-checksum-type: COMPOSITE`,
/// or its ETag ending in `-N`, S3's mark of an object assembled from `N`
/// parts) and not said to be `FULL_OBJECT`: moto's HEAD leaves out the
/// suffix and the type. Which reading is taken only decides what the
/// digest is compared with; it proves bytes only when it is the digest of
/// the local file read that way.
fn store_checksum(
    value: &str,
    kind: Option<&str>,
    etag: Option<&str>,
) -> std::result::Result<StoreChecksum, String> {
    let (b64, suffix) = match value.rsplit_once('-') {
        Some((b64, n)) => (b64, Some(n)),
        None => (value, None),
    };
    let digest: [u8; 32] = BASE64
        .decode(b64)
        .ok()
        .and_then(|d| d.try_into().ok())
        .ok_or_else(|| format!("{CHECKSUM_SHA256} {value:?} is not the base64 of 32 bytes"))?;
    let count = |n: &str| {
        n.parse::<u64>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("{CHECKSUM_SHA256} {value:?}: part count {n:?}"))
    };
    let etag_parts = etag
        .and_then(|e| e.trim_matches('"').rsplit_once('-'))
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .filter(|n| *n >= 1);
    Ok(match (suffix, kind, etag_parts) {
        (Some(n), _, _) => StoreChecksum::OfParts {
            digest,
            parts: count(n)?,
        },
        (None, Some("FULL_OBJECT"), _) | (None, _, None) => StoreChecksum::Sha256(digest),
        (None, _, Some(parts)) => StoreChecksum::OfParts { digest, parts },
    })
}

/// `value` as a header value of a request `op` to `url` makes.
fn header_value(op: &'static str, url: &str, value: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(value).map_err(|_| ObjStoreError::BadAnswer {
        op,
        key: url.to_owned(),
        what: format!("{value:?} is no header value"),
    })
}

/// Header `name` of an answer, when it is there and visible ASCII.
fn answer_header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A part's receipt, as `object_store` writes it (its `PartId`'s content)
/// and reads it back when completing an upload: the ETag and the checksum
/// the server answered, as XML.
#[derive(serde::Serialize)]
struct PartMetadata {
    e_tag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    checksum_sha256: Option<String>,
}

/// A `412 Precondition Failed`: the object's ETag is not the one asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precondition;

fn sha256_attributes(sha256: &str) -> Attributes {
    let mut a = Attributes::new();
    a.insert(
        Attribute::Metadata(SHA256_METADATA.into()),
        sha256.to_owned().into(),
    );
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_header_reads_as_whole_or_over_parts() {
        let d = [7u8; 32];
        let b64 = BASE64.encode(d);
        let whole = StoreChecksum::Sha256(d);
        let parts = |n| StoreChecksum::OfParts {
            digest: d,
            parts: n,
        };
        // S3's composite: the suffix is the part count.
        assert_eq!(
            store_checksum(&format!("{b64}-3"), None, None),
            Ok(parts(3))
        );
        // A single put's object.
        assert_eq!(store_checksum(&b64, None, Some("\"abc\"")), Ok(whole));
        // moto's HEAD leaves out the suffix; the multipart ETag counts.
        assert_eq!(store_checksum(&b64, None, Some("\"abc-2\"")), Ok(parts(2)));
        assert_eq!(
            store_checksum(&b64, Some("FULL_OBJECT"), Some("\"abc-2\"")),
            Ok(whole)
        );
        assert!(store_checksum("bm90IDMyIGJ5dGVz", None, None).is_err());
        assert!(store_checksum(&format!("{b64}-0"), None, None).is_err());
        assert!(store_checksum(&format!("{b64}-x"), None, None).is_err());
    }
}
