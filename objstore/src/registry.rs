//! The OCI distribution protocol over `reqwest`: the few requests
//! `publish` and `pull` make of a registry, each bounded and each naming
//! what it asked in its error.
//!
//! - blobs: `HEAD` (present? its size), a bounded `GET` (a config, a
//!   manifest layer), a ranged `GET` (the fetch machinery's reads,
//!   [`Registry::get_blob`]), and chunked uploads: `POST` opens a session
//!   whose `Location` is its handle, each `PATCH` sends one chunk with its
//!   `Content-Range` and is answered with the next `Location` and the
//!   `Range` the registry acknowledges, `PUT ?digest=` completes it (the
//!   registry checks the digest), `DELETE` cancels it; a small blob goes in
//!   one `POST` + `PUT`; a cross-repository mount is a `POST ?mount=&from=`
//!   answered `201` (linked, nothing sent) or `202` (an upload session
//!   instead, [`Mount`]);
//! - manifests: `HEAD` and a bounded `GET` by tag or digest, `PUT` by
//!   digest then by tag.
//!
//! Uploads (`PATCH`, `PUT` with a body) go through a client without
//! `reqwest`'s read timeout: that timeout runs while the body is still
//! being sent (the connection is read for an early answer), so a body
//! that takes longer than `--read-timeout` over a slow uplink was cut
//! although it moved. Their stall check is the body's progress instead
//! ([`Progress`]): no body bytes taken by the connection for the read
//! timeout ends the request ([`ObjStoreError::RegistryStalled`]). The
//! connection takes bytes into socket buffers before the network carries
//! them, so once it has taken the whole body the answer is awaited for
//! the read timeout plus the time the unseen tail takes at the slowest
//! uplink waited for ([`crate::upload_progress`]).
//!
//! Authentication ([`crate::registry_auth`]): anonymous first; a `401`
//! names a scheme in `WWW-Authenticate`: `Basic` is answered with the
//! credentials of the auth files, `Bearer` by asking its realm for a token
//! (with those credentials when there are any). The realm must be on the
//! registry's host: a token, or the credentials it is asked with, never
//! go anywhere else. A token refused later (expired) is asked for once
//! more. Redirects (a blob served from storage) are followed by `reqwest`,
//! which drops `Authorization` when the host changes. Upload locations on
//! another host are refused.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{
    CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, HeaderMap, LOCATION, RANGE, WWW_AUTHENTICATE,
};
use reqwest::{RequestBuilder, Response, StatusCode};

use crate::error::{ObjStoreError, Result};
use crate::reference::{OciReference, RepositoryName};
use crate::registry_auth::{Challenge, CredentialKind, RegistryCredentials, parse_challenge};
use crate::upload_progress::{self, Progress};

/// Most bytes of a manifest read (the distribution registry's own limit
/// is 4 MiB).
pub const MAX_OCI_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// Most bytes of a token answer read.
pub const MAX_TOKEN_ANSWER_BYTES: u64 = 64 * 1024;
/// Most bytes of an error answer read (for its codes).
const MAX_ERROR_ANSWER_BYTES: u64 = 16 * 1024;
/// The manifest media type every manifest ftpipe pushes has.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Header naming a manifest's or blob's digest in an answer.
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// `http://` instead of `https://` (a loopback or test registry).
    pub plain_http: bool,
    /// Every read waits at most this long.
    pub read_timeout: Duration,
    /// Credentials for the registry, if the auth files hold any.
    pub credentials: Option<RegistryCredentials>,
    /// Auth files that could not be read (`FILE: reason`): named when the
    /// registry asks for credentials none gave.
    pub unreadable_auth: Vec<String>,
}

/// How requests are authorized now.
#[derive(Debug, Clone)]
enum Auth {
    Anonymous,
    Basic,
    Bearer(String),
}

/// A repository of a registry and the client that speaks to it.
#[derive(Debug)]
pub struct Registry {
    reference: OciReference,
    base: url::Url,
    http: reqwest::Client,
    /// Uploads: no read timeout (see the module doc); their stall check
    /// is [`Registry::watched`].
    uploads: reqwest::Client,
    read_timeout: Duration,
    credentials: Option<RegistryCredentials>,
    unreadable_auth: Vec<String>,
    auth: Mutex<Auth>,
}

/// What a cross-repository mount request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// `201`: the repository now has the blob; nothing was sent.
    Mounted,
    /// `202`: the registry did not mount it (the source repository lacks
    /// it, or the caller may not read it) and opened an upload session
    /// instead: its location.
    Started(String),
}

/// A manifest as read from the registry: its bytes, media type, digest.
#[derive(Debug, Clone)]
pub struct FetchedManifest {
    /// Its bytes, as served.
    pub bytes: Bytes,
    /// Its `Content-Type`.
    pub media_type: Option<String>,
    /// `sha256:HEX` of its bytes (computed here; the registry's header
    /// must agree).
    pub digest: String,
}

impl Registry {
    /// A client of `reference`'s repository.
    pub fn open(reference: &OciReference, config: &RegistryConfig) -> Result<Registry> {
        let scheme = if config.plain_http { "http" } else { "https" };
        let base =
            url::Url::parse(&format!("{scheme}://{}/", reference.registry)).map_err(|e| {
                ObjStoreError::BadReference {
                    given: reference.to_string(),
                    reason: if e == url::ParseError::InvalidPort {
                        "the registry's port is not a port"
                    } else {
                        "the registry is not a host"
                    },
                }
            })?;
        let setup = |source| ObjStoreError::RegistryHttp {
            op: "client setup",
            what: reference.repository_url(),
            source,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(config.read_timeout)
            .read_timeout(config.read_timeout)
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(setup)?;
        // An upload location is on the registry's origin: no redirect.
        let uploads = reqwest::Client::builder()
            .connect_timeout(config.read_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(setup)?;
        Ok(Registry {
            reference: reference.clone(),
            base,
            http,
            uploads,
            read_timeout: config.read_timeout,
            credentials: config.credentials.clone(),
            unreadable_auth: config.unreadable_auth.clone(),
            auth: Mutex::new(Auth::Anonymous),
        })
    }

    /// The reference this client was opened with.
    pub fn reference(&self) -> &OciReference {
        &self.reference
    }

    /// `HOST[:PORT]`.
    pub fn host(&self) -> &str {
        &self.reference.registry
    }

    /// `oci://REGISTRY/REPOSITORY@DIGEST`, as messages name a blob.
    pub fn blob_url(&self, digest: &str) -> String {
        format!("{}@{digest}", self.reference.repository_url())
    }

    fn url(&self, path: &str) -> Result<url::Url> {
        self.base.join(path).map_err(|_| ObjStoreError::BadAnswer {
            op: "request",
            key: self.reference.repository_url(),
            what: format!("{path:?} is not a URL path"),
        })
    }

    fn blob_path(&self, digest: &str) -> String {
        format!("v2/{}/blobs/{digest}", self.reference.repository)
    }

    fn manifest_path(&self, pointer: &str) -> String {
        format!("v2/{}/manifests/{pointer}", self.reference.repository)
    }

    /// Sends the request `make` builds, authorized; a `401` answered with a
    /// challenge is met once (a token asked for, or basic credentials) and
    /// the request sent again.
    async fn send(
        &self,
        op: &'static str,
        what: &str,
        make: impl Fn() -> RequestBuilder,
    ) -> Result<Response> {
        let mut met_challenge = false;
        loop {
            let request = self.authorize(make());
            let response = request
                .send()
                .await
                .map_err(|source| ObjStoreError::RegistryHttp {
                    op,
                    what: what.to_owned(),
                    source: source.without_url(),
                })?;
            if response.status() != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            if met_challenge {
                return match self.unreadable_note() {
                    Some(note) if self.credentials.is_none() => {
                        Err(self
                            .auth_error(format!("refused the request without credentials{note}")))
                    }
                    _ => Ok(response),
                };
            }
            met_challenge = true;
            let challenge = parse_challenge(response.headers().get(WWW_AUTHENTICATE))
                .map_err(|reason| self.auth_error(reason))?;
            self.meet(challenge).await?;
        }
    }

    fn authorize(&self, request: RequestBuilder) -> RequestBuilder {
        let auth = self
            .auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match (auth, &self.credentials) {
            (Auth::Bearer(token), _) => request.bearer_auth(token),
            (Auth::Basic, Some(c)) => request.basic_auth(&c.username, Some(&c.password)),
            _ => request,
        }
    }

    fn set_auth(&self, auth: Auth) {
        *self
            .auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = auth;
    }

    /// `; unreadable auth files: ...` when some could not be read.
    fn unreadable_note(&self) -> Option<String> {
        (!self.unreadable_auth.is_empty()).then(|| {
            format!(
                "; auth files that could not be read: {}",
                self.unreadable_auth.join("; ")
            )
        })
    }

    fn auth_error(&self, reason: String) -> ObjStoreError {
        ObjStoreError::RegistryAuth {
            registry: self.reference.registry.clone(),
            reason,
        }
    }

    /// Meets a `401`'s challenge: basic credentials, or a token from the
    /// realm (on the registry's host only).
    async fn meet(&self, challenge: Challenge) -> Result<()> {
        match challenge {
            Challenge::Basic => {
                if let Some(c) = &self.credentials
                    && c.kind == CredentialKind::IdentityToken
                {
                    return Err(self.auth_error(format!(
                        "asks for credentials (Basic) and {} holds an identity token, which \
                         only a Bearer registry takes",
                        c.from
                    )));
                }
                if self.credentials.is_none() {
                    let note = self.unreadable_note().unwrap_or_default();
                    return Err(self.auth_error(format!(
                        "asks for credentials (Basic) and no auth file has any for it \
                         (REGISTRY_AUTH_FILE, containers auth.json, ~/.docker/config.json){note}"
                    )));
                }
                self.set_auth(Auth::Basic);
                Ok(())
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let token = self
                    .ask_token(&realm, service.as_deref(), scope.as_deref())
                    .await?;
                self.set_auth(Auth::Bearer(token));
                Ok(())
            }
        }
    }

    /// A token from `realm` (which must be on the registry's host).
    async fn ask_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: Option<&str>,
    ) -> Result<String> {
        let mut url = url::Url::parse(realm)
            .map_err(|_| self.auth_error(format!("token realm {realm:?} is not a URL")))?;
        if let Some(why) = realm_refusal(&url, &self.base) {
            return Err(self.auth_error(format!(
                "its token realm {realm:?} {why} ({}); no credentials or tokens are sent there",
                self.base.origin().ascii_serialization()
            )));
        }
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            // A challenge names several scopes space-separated (a mount:
            // this repository's push, the source's pull); the token
            // service takes each as its own `scope` parameter.
            for s in scope.into_iter().flat_map(str::split_whitespace) {
                q.append_pair("scope", s);
            }
        }
        let request = match &self.credentials {
            Some(c) if c.kind == CredentialKind::IdentityToken => {
                refresh_request(&self.http, url, &c.password)
            }
            Some(c) => self
                .http
                .get(url)
                .basic_auth(&c.username, Some(&c.password)),
            None => self.http.get(url),
        };
        let what = format!("token realm of {}", self.reference.registry);
        let response = request
            .send()
            .await
            .map_err(|source| ObjStoreError::RegistryHttp {
                op: "token request",
                what: what.clone(),
                source: source.without_url(),
            })?;
        let response = ok_or_refused(response, "token request", &what).await?;
        let body = read_bounded(response, MAX_TOKEN_ANSWER_BYTES, "token request", &what).await?;
        crate::registry_auth::token_from_answer(&body).map_err(|reason| self.auth_error(reason))
    }

    /// The blob's size when the repository has it.
    pub async fn head_blob(&self, digest: &str) -> Result<Option<u64>> {
        let url = self.url(&self.blob_path(digest))?;
        let what = self.blob_url(digest);
        let response = self
            .send("blob head", &what, || self.http.head(url.clone()))
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = ok_or_refused(response, "blob head", &what).await?;
        content_length(response.headers(), "blob head", &what).map(Some)
    }

    /// The whole blob when it has at most `max` bytes; `None` when the
    /// repository does not have it.
    pub async fn get_blob_bounded(&self, digest: &str, max: u64) -> Result<Option<Bytes>> {
        let url = self.url(&self.blob_path(digest))?;
        let what = self.blob_url(digest);
        let response = self
            .send("blob get", &what, || self.http.get(url.clone()))
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = ok_or_refused(response, "blob get", &what).await?;
        read_bounded(response, max, "blob get", &what)
            .await
            .map(Some)
    }

    /// A `GET` of the blob, with `Range: bytes=FROM-[LAST]` when `range`
    /// is given; the answer unread (any status: the caller maps it).
    pub async fn get_blob(
        &self,
        digest: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<Response> {
        let url = self.url(&self.blob_path(digest))?;
        let what = self.blob_url(digest);
        let range = range.map(|(from, last)| match last {
            Some(last) => format!("bytes={from}-{last}"),
            None => format!("bytes={from}-"),
        });
        self.send("blob get", &what, || {
            let r = self.http.get(url.clone());
            match &range {
                Some(v) => r.header(RANGE, v),
                None => r,
            }
        })
        .await
    }

    /// Opens an upload session; its location (the session's handle).
    pub async fn start_upload(&self, digest: &str) -> Result<String> {
        let url = self.url(&format!("v2/{}/blobs/uploads/", self.reference.repository))?;
        let what = self.blob_url(digest);
        let response = self
            .send("upload start", &what, || {
                self.http.post(url.clone()).header(CONTENT_LENGTH, "0")
            })
            .await?;
        let response = ok_or_refused(response, "upload start", &what).await?;
        self.location_of(&response, "upload start", &what)
    }

    /// Asks the registry to link the blob `digest` from the repository
    /// `from` of the same registry (`POST ?mount=DIGEST&from=REPO`). Under
    /// the Bearer flow the registry's challenge names `from`'s pull scope
    /// beside this repository's push scope, and the token is asked for
    /// both.
    pub async fn mount_blob(&self, digest: &str, from: &RepositoryName) -> Result<Mount> {
        let mut url = self.url(&format!("v2/{}/blobs/uploads/", self.reference.repository))?;
        url.query_pairs_mut()
            .append_pair("mount", digest)
            .append_pair("from", from.as_str());
        let what = self.blob_url(digest);
        let response = self
            .send("blob mount", &what, || {
                self.http.post(url.clone()).header(CONTENT_LENGTH, "0")
            })
            .await?;
        match response.status() {
            StatusCode::CREATED => Ok(Mount::Mounted),
            StatusCode::ACCEPTED => self
                .location_of(&response, "blob mount", &what)
                .map(Mount::Started),
            _ => {
                ok_or_refused(response, "blob mount", &what).await?;
                Err(bad(
                    &what,
                    "a mount request answered with a success other than 201 or 202",
                ))
            }
        }
    }

    /// Sends `bytes` as the chunk at `offset` of the session at `location`;
    /// the next location. The registry must acknowledge exactly
    /// `0-(offset+len-1)`. A session the registry does not know (or refuses
    /// to resume) is [`ObjStoreError::UploadGone`].
    pub async fn patch_chunk(
        &self,
        location: &str,
        digest: &str,
        offset: u64,
        bytes: Bytes,
    ) -> Result<String> {
        let what = self.blob_url(digest);
        let url = self.upload_url(location, &what)?;
        let len = bytes.len() as u64;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| bad(&what, "chunk past 2^64"))?;
        let range = format!("{offset}-{}", end.saturating_sub(1));
        let progress = Progress::new();
        let sent = async {
            let response = self
                .send("upload chunk", &what, || {
                    self.uploads
                        .patch(url.clone())
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .header(CONTENT_RANGE, &range)
                        .header(CONTENT_LENGTH, len)
                        .body(progress.body(&bytes))
                })
                .await?;
            session_answer(response, "upload chunk", &what).await
        };
        let response = self
            .watched("upload chunk", &what, len, &progress, sent)
            .await?;
        let acknowledged = range_held(response.headers());
        if acknowledged != Some((0, end.saturating_sub(1))) {
            return Err(bad(
                &what,
                &format!(
                    "the registry acknowledged {acknowledged:?} after the chunk {range}, \
                     expected 0-{}",
                    end.saturating_sub(1)
                ),
            ));
        }
        self.location_of(&response, "upload chunk", &what)
    }

    /// Asks the registry where it stands in the session at `location`
    /// (`GET`, the upload status) before a chunk goes there from `offset`:
    /// the location to send it to. A session the registry no longer knows
    /// or refuses is [`ObjStoreError::UploadGone`] — distribution 2.8
    /// cancels one whose stored size is not the offset signed into the
    /// location's `_state`, as a `PATCH` cut mid-body leaves it — and so is
    /// one holding other than `offset` bytes (`Range: 0-N`; `0-0`, or none,
    /// for an empty one), which is cancelled first. No chunk's body is sent
    /// to a session that will not take it.
    pub async fn confirm_upload(
        &self,
        location: &str,
        digest: &str,
        offset: u64,
    ) -> Result<String> {
        let what = self.blob_url(digest);
        let url = self.upload_url(location, &what)?;
        let response = self
            .send("upload status", &what, || self.http.get(url.clone()))
            .await?;
        let response = session_answer(response, "upload status", &what).await?;
        let holds = range_held(response.headers());
        let expected = (0, offset.saturating_sub(1));
        if holds != Some(expected) && !(offset == 0 && holds.is_none()) {
            self.cancel_upload(location, digest).await?;
            let problem = format!(
                "the registry holds {holds:?} of the upload session, not the {offset} bytes \
                 recorded: the session is cancelled"
            );
            return Err(ObjStoreError::UploadGone {
                key: what.clone(),
                source: Box::new(bad(&what, &problem)),
            });
        }
        self.location_of(&response, "upload status", &what)
    }

    /// Completes the session at `location` as the blob `digest` (the
    /// registry checks the bytes against it), with `tail` as its last
    /// bytes (empty after chunks).
    pub async fn complete_upload(&self, location: &str, digest: &str, tail: Bytes) -> Result<()> {
        let what = self.blob_url(digest);
        let mut url = self.upload_url(location, &what)?;
        url.query_pairs_mut().append_pair("digest", digest);
        let progress = Progress::new();
        let len = tail.len() as u64;
        let sent = async {
            let response = self
                .send("upload complete", &what, || {
                    self.uploads
                        .put(url.clone())
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .header(CONTENT_LENGTH, len)
                        .body(progress.body(&tail))
                })
                .await?;
            session_answer(response, "upload complete", &what).await
        };
        self.watched("upload complete", &what, len, &progress, sent)
            .await?;
        Ok(())
    }

    /// `request` (an upload sending a body of `len` bytes through
    /// `progress`), ended as [`ObjStoreError::RegistryStalled`] when its
    /// body stalls ([`upload_progress::watched`]).
    async fn watched<T>(
        &self,
        op: &'static str,
        what: &str,
        len: u64,
        progress: &Progress,
        request: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        match upload_progress::watched(self.read_timeout, len, progress, request).await {
            Ok(done) => done,
            Err(stall) => Err(ObjStoreError::RegistryStalled {
                op,
                what: what.to_owned(),
                secs: self.read_timeout.as_secs(),
                sent: stall.sent,
                len,
            }),
        }
    }

    /// Cancels the session at `location`; one the registry no longer knows
    /// is no error.
    pub async fn cancel_upload(&self, location: &str, digest: &str) -> Result<()> {
        let what = self.blob_url(digest);
        let url = self.upload_url(location, &what)?;
        let response = self
            .send("upload cancel", &what, || self.http.delete(url.clone()))
            .await?;
        match session_answer(response, "upload cancel", &what).await {
            Ok(_) | Err(ObjStoreError::UploadGone { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The manifest's digest and size under `pointer` (tag or digest), when
    /// there is one.
    pub async fn head_manifest(&self, pointer: &str) -> Result<Option<(String, u64)>> {
        let url = self.url(&self.manifest_path(pointer))?;
        let what = format!("{}/manifests/{pointer}", self.reference.repository_url());
        let response = self
            .send("manifest head", &what, || {
                self.http
                    .head(url.clone())
                    .header("accept", OCI_MANIFEST_MEDIA_TYPE)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = ok_or_refused(response, "manifest head", &what).await?;
        let digest = response
            .headers()
            .get(DOCKER_CONTENT_DIGEST)
            .and_then(|v| v.to_str().ok())
            .filter(|d| crate::reference::is_sha256_digest(d))
            .ok_or_else(|| bad(&what, "no sha256 Docker-Content-Digest in the answer"))?
            .to_owned();
        let size = content_length(response.headers(), "manifest head", &what)?;
        Ok(Some((digest, size)))
    }

    /// The manifest under `pointer`, read within [`MAX_OCI_MANIFEST_BYTES`];
    /// `None` when there is none.
    pub async fn get_manifest(&self, pointer: &str) -> Result<Option<FetchedManifest>> {
        let url = self.url(&self.manifest_path(pointer))?;
        let what = format!("{}/manifests/{pointer}", self.reference.repository_url());
        let response = self
            .send("manifest get", &what, || {
                self.http
                    .get(url.clone())
                    .header("accept", OCI_MANIFEST_MEDIA_TYPE)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = ok_or_refused(response, "manifest get", &what).await?;
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let said = response
            .headers()
            .get(DOCKER_CONTENT_DIGEST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = read_bounded(response, MAX_OCI_MANIFEST_BYTES, "manifest get", &what).await?;
        let digest = format!("sha256:{}", hex_of(&crate::sha256_of(&bytes)));
        if let Some(said) = said
            && said != digest
        {
            return Err(bad(
                &what,
                &format!("the registry says its digest is {said}, its bytes' is {digest}"),
            ));
        }
        Ok(Some(FetchedManifest {
            bytes,
            media_type,
            digest,
        }))
    }

    /// Puts `bytes` as the manifest under `pointer` (a digest, or a tag).
    pub async fn put_manifest(&self, pointer: &str, bytes: Bytes) -> Result<()> {
        let url = self.url(&self.manifest_path(pointer))?;
        let what = format!("{}/manifests/{pointer}", self.reference.repository_url());
        let response = self
            .send("manifest put", &what, || {
                self.http
                    .put(url.clone())
                    .header(CONTENT_TYPE, OCI_MANIFEST_MEDIA_TYPE)
                    .body(bytes.clone())
            })
            .await?;
        ok_or_refused(response, "manifest put", &what).await?;
        Ok(())
    }

    /// The absolute URL of a session `location` (relative or absolute),
    /// which must be on the registry's host.
    fn upload_url(&self, location: &str, what: &str) -> Result<url::Url> {
        let url = self
            .base
            .join(location)
            .map_err(|_| bad(what, "the upload location is not a URL"))?;
        if !same_origin(&url, &self.base) {
            return Err(bad(
                what,
                "the upload location is not on the registry's own scheme, host and port \
                 (refused: the registry's credentials would follow it)",
            ));
        }
        Ok(url)
    }

    fn location_of(&self, response: &Response, op: &'static str, what: &str) -> Result<String> {
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ObjStoreError::BadAnswer {
                op,
                key: what.to_owned(),
                what: "no Location in the answer".into(),
            })?;
        Ok(self.upload_url(location, what)?.to_string())
    }
}

/// The OAuth2 token request of an identity token: `POST` to the realm
/// with `grant_type=refresh_token`, the token, `client_id`, and the
/// `service` and scopes `url`'s query holds (the scopes space-separated,
/// as OAuth2 takes them).
fn refresh_request(http: &reqwest::Client, mut url: url::Url, token: &str) -> RequestBuilder {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("grant_type", "refresh_token")
        .append_pair("refresh_token", token)
        .append_pair("client_id", "ftpipe");
    let mut scopes = Vec::new();
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "scope" => scopes.push(v.into_owned()),
            "service" => {
                form.append_pair("service", &v);
            }
            _ => {}
        }
    }
    if !scopes.is_empty() {
        form.append_pair("scope", &scopes.join(" "));
    }
    url.set_query(None);
    http.post(url)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form.finish())
}

/// An answer that contradicts the protocol.
fn bad(what: &str, problem: &str) -> ObjStoreError {
    ObjStoreError::BadAnswer {
        op: "registry answer",
        key: what.to_owned(),
        what: problem.to_owned(),
    }
}

/// The byte range an upload answer says the registry holds (`Range:
/// 0-N`, with or without `bytes=`).
fn range_held(headers: &HeaderMap) -> Option<(u64, u64)> {
    headers
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes=").or(Some(v)))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
}

/// `response` when it is a success; its status and error codes otherwise.
async fn ok_or_refused(response: Response, op: &'static str, what: &str) -> Result<Response> {
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let body = read_bounded(response, MAX_ERROR_ANSWER_BYTES, op, what)
        .await
        .unwrap_or_default();
    Err(ObjStoreError::RegistryStatus {
        op,
        what: what.to_owned(),
        status,
        said: error_codes(&body),
    })
}

/// An upload session's answer: a `404` (unknown) or a `400` with
/// `BLOB_UPLOAD_INVALID`/`BLOB_UPLOAD_UNKNOWN` (a session the registry
/// cancelled, e.g. resumed at another offset) is [`ObjStoreError::UploadGone`].
async fn session_answer(response: Response, op: &'static str, what: &str) -> Result<Response> {
    match ok_or_refused(response, op, what).await {
        Err(e @ ObjStoreError::RegistryStatus { status, .. })
            if status == 404 || (status == 400 && e.to_string().contains("BLOB_UPLOAD_")) =>
        {
            Err(ObjStoreError::UploadGone {
                key: what.to_owned(),
                source: Box::new(e),
            })
        }
        r => r,
    }
}

/// The error codes and messages of a distribution error answer
/// (`{"errors":[{"code":..,"message":..}]}`), redacted; empty when the
/// body is not one.
fn error_codes(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let said = v
        .get("errors")
        .and_then(|e| e.as_array())
        .map(|errors| {
            errors
                .iter()
                .take(4)
                .map(|e| {
                    let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("?");
                    let message = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
                    format!("{code}: {}", message.chars().take(200).collect::<String>())
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    ftpipe_secrets::redact(&said).into_owned()
}

fn content_length(headers: &HeaderMap, op: &'static str, what: &str) -> Result<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ObjStoreError::BadAnswer {
            op,
            key: what.to_owned(),
            what: "no Content-Length in the answer".into(),
        })
}

/// The body of `response`, at most `max` bytes (the limit holds while
/// reading: a body that never ends stops at it).
pub(crate) async fn read_bounded(
    mut response: Response,
    max: u64,
    op: &'static str,
    what: &str,
) -> Result<Bytes> {
    let too_large = |size: u64| ObjStoreError::TooLarge {
        key: what.to_owned(),
        size,
        max,
    };
    if let Some(len) = response.content_length()
        && len > max
    {
        return Err(too_large(len));
    }
    let mut buf = Vec::new();
    while let Some(chunk) =
        response
            .chunk()
            .await
            .map_err(|source| ObjStoreError::RegistryHttp {
                op,
                what: what.to_owned(),
                source: source.without_url(),
            })?
    {
        let size = (buf.len() as u64).saturating_add(chunk.len() as u64);
        if size > max {
            return Err(too_large(size));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why credentials may not go to the token realm `realm` of the registry
/// at `base`, if they may not: a realm on another host, or plain http for
/// a registry reached over https (another port of the registry's own host
/// is the usual place of its token service).
fn realm_refusal(realm: &url::Url, base: &url::Url) -> Option<&'static str> {
    if realm.host() != base.host() {
        Some("is on another host than the registry")
    } else if base.scheme() == "https" && realm.scheme() != "https" {
        Some("is not https, as the registry is")
    } else {
        None
    }
}

/// Whether `url` is on `base`'s scheme, host and port (the default port
/// of the scheme when none is written): where the registry's credentials
/// may go. A change of scheme alone (https to http) is another origin.
fn same_origin(url: &url::Url, base: &url::Url) -> bool {
    url.scheme() == base.scheme()
        && url.host() == base.host()
        && url.port_or_known_default() == base.port_or_known_default()
}

#[cfg(test)]
mod origin_tests {
    use super::{realm_refusal, same_origin};

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).unwrap()
    }

    /// Regression: a token realm was checked by host only: `http://` on
    /// the host of an https registry passed (the credentials then went out
    /// in cleartext), and the host was compared as typed, so a registry
    /// on IPv6 (`[::1]` against `::1`) never passed.
    #[test]
    fn a_realm_must_be_on_the_registry_s_host_and_never_downgrade() {
        let base = url("https://reg.example/v2/");
        assert_eq!(
            realm_refusal(&url("https://reg.example:5001/token"), &base),
            None
        );
        assert_eq!(
            realm_refusal(&url("https://REG.example/token"), &base),
            None
        );
        assert!(realm_refusal(&url("http://reg.example/token"), &base).is_some());
        assert!(realm_refusal(&url("https://auth.example/token"), &base).is_some());
        let v6 = url("http://[::1]:5000/v2/");
        assert_eq!(realm_refusal(&url("http://[::1]:5001/token"), &v6), None);
    }

    /// Regression: an upload location was checked by host and written
    /// port only, so on an https registry `http://` on the same host
    /// passed: every later chunk carried the credentials in cleartext.
    #[test]
    fn only_the_registry_s_own_scheme_host_and_port_pass() {
        let base = url("https://reg.example/v2/");
        assert!(same_origin(
            &url("https://reg.example:443/v2/x/blobs/uploads/1"),
            &base
        ));
        assert!(same_origin(&url("https://REG.example/token"), &base));
        assert!(!same_origin(
            &url("http://reg.example/v2/x/blobs/uploads/1"),
            &base
        ));
        assert!(!same_origin(&url("https://reg.example:5000/token"), &base));
        assert!(!same_origin(&url("https://auth.example/token"), &base));
        let v6 = url("http://[::1]:5000/v2/");
        assert!(same_origin(&url("http://[::1]:5000/token"), &v6));
        assert!(!same_origin(&url("http://[::1]:5001/token"), &v6));
    }
}
