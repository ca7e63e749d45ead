//! The requests `publish` and `pull` make, over `object_store`'s S3
//! client. Each takes a key relative to the bucket, names it as
//! `s3://BUCKET/KEY` in every error, and reads at most what its caller
//! allows.
//!
//! Retries: `object_store` retries a failed request a few times itself
//! ([`RETRIES`], within [`RETRY_TIMEOUT`]); what fails after that is the
//! caller's to record and retry (the fetch machinery's attempts and
//! backoff for `pull`, a re-run for `publish`).

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

use crate::credentials::S3Config;
use crate::error::{ObjStoreError, Result};
use crate::location::S3Location;

/// The user metadata key (`x-amz-meta-ftpipe-sha256`) holding an object's
/// SHA-256 as the publisher computed it from the bytes it sent. A
/// publisher-side check only: the receiver verifies against the manifest.
pub const SHA256_METADATA: &str = "ftpipe-sha256";
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

/// What a `head` says of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Its size.
    pub size: u64,
    /// Its ETag, as the server spells it (quoted).
    pub etag: Option<String>,
    /// The `x-amz-meta-ftpipe-sha256` metadata, when set.
    pub sha256: Option<String>,
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
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(location.bucket())
            .with_region(&config.region)
            .with_credentials(config.credentials.clone())
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: retries,
                retry_timeout: RETRY_TIMEOUT,
            })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(config.allow_http())
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    // A stall ends a request at the read timeout, not a
                    // request's whole length: a large object takes as long
                    // as its bytes keep coming.
                    .with_read_timeout(config.read_timeout)
                    .with_timeout_disabled(),
            );
        let host = match &config.endpoint {
            Some(e) => {
                b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
                url::Url::parse(e)
                    .ok()
                    .and_then(|u| {
                        u.host_str().map(|h| {
                            format!(
                                "{h}{}",
                                u.port().map(|p| format!(":{p}")).unwrap_or_default()
                            )
                        })
                    })
                    .unwrap_or_default()
            }
            None => format!("s3.{}.amazonaws.com", config.region),
        };
        let store = b.build().map_err(|source| ObjStoreError::Client {
            bucket: location.bucket().to_owned(),
            source,
        })?;
        Ok(S3 {
            store: Arc::new(store),
            location,
            host,
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
            })),
            Err(source) => self.absent("head", key, source),
        }
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
    pub async fn put(
        &self,
        key: &str,
        bytes: Bytes,
        sha256: &str,
        create_only: bool,
    ) -> Result<Put> {
        let opts = PutOptions {
            mode: if create_only {
                PutMode::Create
            } else {
                PutMode::Overwrite
            },
            attributes: sha256_attributes(sha256),
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&ObjPath::from(key), PutPayload::from_bytes(bytes), opts)
            .await
        {
            Ok(r) => Ok(Put::Written { etag: r.e_tag }),
            Err(object_store::Error::AlreadyExists { .. }) if create_only => Ok(Put::Exists),
            Err(source) => Err(self.failed("put", self.url(key), source)),
        }
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

    /// Uploads part `number` (1-based) of `upload_id`; its ETag.
    pub async fn put_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u64,
        bytes: Bytes,
    ) -> Result<String> {
        let idx = usize::try_from(number.saturating_sub(1)).unwrap_or(usize::MAX);
        let id = upload_id.to_owned();
        match self
            .store
            .put_part(&ObjPath::from(key), &id, idx, PutPayload::from_bytes(bytes))
            .await
        {
            Ok(p) => Ok(p.content_id),
            Err(source @ object_store::Error::NotFound { .. }) => Err(ObjStoreError::UploadGone {
                key: self.url(key),
                source,
            }),
            Err(source) => Err(self.failed("upload part", self.url(key), source)),
        }
    }

    /// Completes `upload_id` from its parts' ETags in part order; the
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
                source,
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
