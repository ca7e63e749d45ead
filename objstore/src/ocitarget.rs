//! An OCI registry's blobs as an [`OutputTarget`]: a key is a blob digest
//! (`sha256:HEX`, [`OutputTarget::key`] of a file's SHA-256), a session a
//! chunked upload whose handle is the location `POST` answered, a part's
//! receipt the location the registry answered that chunk with (it holds
//! the acknowledged offset), parts in order, one at a time. A session
//! location this process was not answered (one recorded by a run before
//! it) is confirmed with the registry before a chunk goes there
//! ([`Registry::confirm_upload`]). A blob is
//! content-addressed: the registry checks the digest when an upload
//! completes, so a blob it has is proven to be the bytes of its digest
//! ([`StoreChecksum::Sha256`]); a put is a one-chunk upload. Commit points,
//! listing and the manifest are not blobs: `publish` speaks to the
//! [`Registry`] for them.

use std::collections::HashSet;
use std::sync::Mutex;

use bytes::Bytes;
use futures_util::FutureExt;

use crate::checksum::StoreChecksum;
use crate::client::{Head, ObjectBody, Put};
use crate::error::{ObjStoreError, Result};
use crate::reference::is_sha256_hex;
use crate::registry::Registry;
use crate::target::{Listed, OutputTarget, PartRequest, PartRules, PutMode, TargetFuture};

/// Most chunks of one upload session.
const MAX_CHUNKS: u64 = 100_000;

/// A registry repository's blobs.
#[derive(Debug)]
pub struct OciTarget {
    registry: Registry,
    /// Session locations the registry answered this process (a session
    /// begun, a chunk taken): the next chunk goes there unasked.
    answered: Mutex<HashSet<String>>,
}

impl OciTarget {
    /// The blobs of `registry`'s repository.
    pub fn new(registry: Registry) -> OciTarget {
        OciTarget {
            registry,
            answered: Mutex::new(HashSet::new()),
        }
    }

    fn answered(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.answered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The client.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The 32 bytes of `sha256:HEX`.
fn digest_bytes(key: &str) -> Result<[u8; 32]> {
    let bad = || ObjStoreError::BadAnswer {
        op: "blob key",
        key: key.to_owned(),
        what: "expected sha256: and 64 hex digits".into(),
    };
    let hex = key.strip_prefix("sha256:").ok_or_else(bad)?;
    let mut d = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| bad())?;
        *d.get_mut(i).ok_or_else(bad)? = u8::from_str_radix(s, 16).map_err(|_| bad())?;
    }
    Ok(d)
}

impl OutputTarget for OciTarget {
    fn dest(&self) -> String {
        self.registry.reference().repository_url()
    }

    /// `rel` is the file's SHA-256 (hex): its blob's digest.
    fn key(&self, rel: &str) -> String {
        format!("sha256:{rel}")
    }

    /// A blob as `oci://REGISTRY/REPOSITORY@DIGEST`; any other key (a
    /// manifest's, `manifests/TAG`) under the repository.
    fn url_of(&self, key: &str) -> String {
        if key.starts_with("sha256:") {
            self.registry.blob_url(key)
        } else {
            format!("{}/{key}", self.dest())
        }
    }

    fn host(&self) -> &str {
        self.registry.host()
    }

    fn part_rules(&self) -> PartRules {
        PartRules {
            min_part_size: 1,
            max_parts: MAX_CHUNKS,
            in_order: true,
        }
    }

    fn head<'a>(&'a self, key: &'a str) -> TargetFuture<'a, Option<Head>> {
        async move {
            let digest = digest_bytes(key)?;
            let Some(size) = self.registry.head_blob(key).await? else {
                return Ok(None);
            };
            let hex = key.trim_start_matches("sha256:");
            Ok(Some(Head {
                size,
                etag: None,
                sha256: is_sha256_hex(hex).then(|| hex.to_owned()),
                checksum: Some(StoreChecksum::Sha256(digest)),
            }))
        }
        .boxed()
    }

    fn get_bounded<'a>(&'a self, key: &'a str, max: u64) -> TargetFuture<'a, Option<ObjectBody>> {
        async move {
            let bytes = self.registry.get_blob_bounded(key, max).await?;
            Ok(bytes.map(|bytes| ObjectBody { bytes, etag: None }))
        }
        .boxed()
    }

    fn list<'a>(&'a self, prefix: &'a str, _max: usize) -> TargetFuture<'a, Vec<Listed>> {
        async move {
            Err(ObjStoreError::BadAnswer {
                op: "list",
                key: format!("{}/{prefix}", self.dest()),
                what: "a registry's blobs are not listed".into(),
            })
        }
        .boxed()
    }

    /// One upload of one chunk, completed with the digest (`PUT ?digest=`
    /// with the bytes); a registry holds a blob once, so both modes write.
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        _sha256: &'a str,
        _mode: PutMode,
    ) -> TargetFuture<'a, Put> {
        async move {
            let location = self.registry.start_upload(key).await?;
            self.registry.complete_upload(&location, key, bytes).await?;
            Ok(Put::Written { etag: None })
        }
        .boxed()
    }

    fn begin_upload<'a>(&'a self, key: &'a str, _sha256: &'a str) -> TargetFuture<'a, String> {
        async move {
            let location = self.registry.start_upload(key).await?;
            self.answered().insert(location.clone());
            Ok(location)
        }
        .boxed()
    }

    /// Sends the chunk at the location of the part before it (the
    /// session's for the first), confirmed with the registry first when
    /// a run before this one recorded it; its receipt is the next location.
    fn send_part<'a>(
        &'a self,
        key: &'a str,
        session: &'a str,
        part: PartRequest,
    ) -> TargetFuture<'a, String> {
        async move {
            let recorded = part.previous.as_deref().unwrap_or(session);
            let location = if self.answered().remove(recorded) {
                recorded.to_owned()
            } else {
                self.registry
                    .confirm_upload(recorded, key, part.offset)
                    .await?
            };
            let next = self
                .registry
                .patch_chunk(&location, key, part.offset, part.bytes)
                .await?;
            self.answered().insert(next.clone());
            Ok(next)
        }
        .boxed()
    }

    /// `PUT ?digest=` at the last chunk's location.
    fn complete_upload<'a>(
        &'a self,
        key: &'a str,
        session: &'a str,
        receipts: Vec<String>,
        _sha256: &'a str,
    ) -> TargetFuture<'a, Option<String>> {
        async move {
            let location = receipts.last().map_or(session, String::as_str);
            self.registry
                .complete_upload(location, key, Bytes::new())
                .await?;
            Ok(None)
        }
        .boxed()
    }

    fn abort_upload<'a>(&'a self, key: &'a str, session: &'a str) -> TargetFuture<'a, ()> {
        self.registry.cancel_upload(session, key).boxed()
    }
}
