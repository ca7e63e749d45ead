//! `publish DIR s3://BUCKET/PREFIX`: a verified artifact into object
//! storage, components first, `manifest.json` last.
//!
//! The layout is [`ftpipe_objstore::ArtifactKeys`]'s: components under
//! `PREFIX/<fingerprint>/`, the manifest at `PREFIX/manifest.json`, put
//! create-only. The manifest is the commit point: until it is there a
//! puller finds nothing, and once it is there every object it names is
//! complete and was checked. Two publishers of different artifacts write
//! disjoint component keys and meet only at the manifest, where exactly one
//! create succeeds; the other is refused naming both fingerprints.
//!
//! Each file is sent in one put (up to the part size) or as a multipart
//! upload whose id and acknowledged parts are durable in `state.db`
//! (`upload_store`): a killed publish resumes the upload and sends only the
//! parts without a row. Every byte sent is read from `DIR/artifact` and
//! hashed on the way; a file whose SHA-256 is not the manifest's is not
//! completed. After completion a `HEAD` must show the size and the
//! `ftpipe-sha256` metadata before the upload receipt is written.
//! Every request is an upload attempt row, before and after.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use tokio::task::{JoinSet, block_in_place};

use ftpipe_artifact::manifest::{MANIFEST_FILE, Manifest, PLACEMENT_FILE, sha256_hex};
use ftpipe_artifact::verify::{MAX_MANIFEST_BYTES, MAX_PLACEMENT_BYTES, verify_artifact};
use ftpipe_fs::bounded::{Links, open_regular, read_bounded_nofollow};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::paths::safe_join;
use ftpipe_hub::identity::{Expected, LfsSha256};
use ftpipe_objstore::{
    ArtifactKeys, MAX_PART_NUMBER, ObjStoreError, Put, S3, S3Config, S3Location,
};
use ftpipe_receipts::{
    Publication, RunId, Store, UploadAttempt, UploadPart, UploadRow, UploadState,
};

use crate::Pipeline;
use crate::error::{PipelineError, Result};

/// Default size of a multipart upload's parts (and the largest file sent
/// in one put).
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;
/// Parts in flight at once by default.
pub const DEFAULT_UPLOAD_CONCURRENCY: usize = 4;

/// What `publish` needs from the command line.
#[derive(Debug, Clone)]
pub struct PublishParams {
    /// Where to publish.
    pub location: S3Location,
    /// Credentials, region, endpoint.
    pub config: S3Config,
    /// Part size of multipart uploads; files up to it go in one put.
    pub part_size: u64,
    /// Parts in flight at once.
    pub concurrency: usize,
}

/// What a publish did.
#[derive(Debug, Clone, Serialize)]
pub struct PublishOutcome {
    /// `s3://BUCKET/PREFIX`.
    pub dest: String,
    /// The artifact's fingerprint.
    pub fingerprint: String,
    /// SHA-256 of `manifest.json`.
    pub manifest_sha256: String,
    /// Objects of the artifact (components, placement).
    pub objects: usize,
    /// Objects uploaded by this run.
    pub uploaded: usize,
    /// Objects found complete and checked (an earlier run's, or another
    /// publisher's of the same artifact).
    pub reused: usize,
    /// Body bytes this run sent (parts re-sent after a kill included).
    pub bytes_sent: u64,
    /// The manifest was already there: nothing was uploaded.
    pub already_published: bool,
}

/// One file to upload.
pub(crate) struct Item {
    pub(crate) path: String,
    pub(crate) size: u64,
    pub(crate) sha256: String,
}

/// What the tasks of one publish share.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) s3: S3,
    pub(crate) store: Arc<Store>,
    pub(crate) run: RunId,
    pub(crate) dest: String,
}

impl Ctx {
    /// Runs one request between an `in_flight` attempt row and its end.
    pub(crate) async fn attempt<T>(
        &self,
        key: &str,
        op: &'static str,
        part_number: Option<u64>,
        bytes: u64,
        fut: impl Future<Output = ftpipe_objstore::Result<T>>,
    ) -> Result<T> {
        let id = self
            .store
            .start_upload_attempt(
                self.run,
                &UploadAttempt {
                    id: 0,
                    key: self.s3.location().url_of(key),
                    op,
                    part_number,
                    host: self.s3.host().to_owned(),
                    bytes,
                    outcome: String::new(),
                    error: None,
                    started_at: String::new(),
                },
            )
            .await?;
        let r = fut.await;
        let err = r.as_ref().err().map(ToString::to_string);
        self.store.finish_upload_attempt(id, err.as_deref()).await?;
        Ok(r?)
    }

    fn url(&self, key: &str) -> String {
        self.s3.location().url_of(key)
    }
}

impl Pipeline {
    /// Publishes `DIR/artifact` (see the module doc).
    pub async fn publish(&self, p: &PublishParams) -> Result<PublishOutcome> {
        let artifact = self.layout.artifact().to_owned();
        let report = block_in_place(|| verify_artifact(&artifact, false))?;
        if !report.ok {
            return Err(PipelineError::VerifyFailed {
                artifact,
                problems: crate::verify_problems(&report),
            });
        }
        let manifest_path = artifact.join(MANIFEST_FILE);
        let manifest_bytes =
            block_in_place(|| read_bounded_nofollow(&manifest_path, MAX_MANIFEST_BYTES))
                .map_err(|e| PipelineError::io("read", &manifest_path, std::io::Error::other(e)))?;
        let manifest: Manifest =
            serde_json::from_slice(&manifest_bytes).map_err(|e| PipelineError::InvalidInput {
                what: "manifest",
                message: format!("{}: {e}", manifest_path.display()),
            })?;
        let fingerprint = manifest.fingerprint.clone();
        let manifest_sha256 = sha256_hex(&manifest_bytes);
        let ctx = Ctx {
            s3: S3::open(&p.config, p.location.clone())?,
            store: self.store.clone(),
            run: self.run,
            dest: p.location.to_string(),
        };
        let keys = p.location.artifact(&fingerprint);
        let mut outcome = PublishOutcome {
            dest: ctx.dest.clone(),
            fingerprint: fingerprint.clone(),
            manifest_sha256: manifest_sha256.clone(),
            objects: manifest.components.len() + 1,
            uploaded: 0,
            reused: 0,
            bytes_sent: 0,
            already_published: false,
        };
        if published_here(&ctx, &keys, &fingerprint).await? {
            outcome.already_published = true;
            record(&ctx, &fingerprint, &manifest_sha256, "already_published").await?;
            return Ok(outcome);
        }

        let placement_path = artifact.join(PLACEMENT_FILE);
        let placement =
            block_in_place(|| read_bounded_nofollow(&placement_path, MAX_PLACEMENT_BYTES))
                .map_err(|e| {
                    PipelineError::io("read", &placement_path, std::io::Error::other(e))
                })?;
        let mut items: Vec<Item> = manifest
            .components
            .iter()
            .map(|c| Item {
                path: c.path.clone(),
                size: c.size,
                sha256: c.sha256.clone(),
            })
            .collect();
        items.push(Item {
            path: PLACEMENT_FILE.to_owned(),
            size: placement.len() as u64,
            sha256: sha256_hex(&placement),
        });
        for item in &items {
            let sent = upload_file(&ctx, &artifact, &keys, item, p).await?;
            match sent {
                Some(bytes) => {
                    outcome.uploaded += 1;
                    outcome.bytes_sent += bytes;
                }
                None => outcome.reused += 1,
            }
            crashpoint::hit(CrashPoint::UploadVerified);
        }
        crashpoint::hit(CrashPoint::PublishComponentsDone);

        let key = keys.manifest();
        let put = ctx
            .attempt(
                &key,
                "manifest_put",
                None,
                manifest_bytes.len() as u64,
                ctx.s3
                    .put(&key, Bytes::from(manifest_bytes), &manifest_sha256, true),
            )
            .await?;
        match put {
            Put::Written { .. } => {
                crashpoint::hit(CrashPoint::PublishManifestPut);
                record(&ctx, &fingerprint, &manifest_sha256, "published").await?;
            }
            // Lost the create to another publisher (or to this one before a
            // kill): the same artifact is a no-op, another a refusal.
            Put::Exists => {
                if !published_here(&ctx, &keys, &fingerprint).await? {
                    return Err(PipelineError::internal(format!(
                        "{} exists but could not be read back",
                        ctx.url(&key)
                    )));
                }
                outcome.already_published = outcome.uploaded == 0;
                record(&ctx, &fingerprint, &manifest_sha256, "already_published").await?;
            }
        }
        Ok(outcome)
    }
}

/// Whether `PREFIX/manifest.json` already names this artifact; an error
/// naming both fingerprints when it names another (or cannot be read as a
/// manifest).
async fn published_here(ctx: &Ctx, keys: &ArtifactKeys, fingerprint: &str) -> Result<bool> {
    let key = keys.manifest();
    let Some(body) = ctx.s3.get_bounded(&key, MAX_MANIFEST_BYTES).await? else {
        return Ok(false);
    };
    let theirs = serde_json::from_slice::<serde_json::Value>(&body.bytes)
        .ok()
        .and_then(|v| {
            v.get("fingerprint")
                .and_then(|f| f.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "(unreadable manifest)".to_owned());
    if theirs == fingerprint {
        return Ok(true);
    }
    Err(PipelineError::PrefixHoldsAnother {
        dest: ctx.dest.clone(),
        theirs,
        ours: fingerprint.to_owned(),
    })
}

pub(crate) async fn record(
    ctx: &Ctx,
    fingerprint: &str,
    manifest_sha256: &str,
    outcome: &str,
) -> Result<()> {
    Ok(ctx
        .store
        .record_publication(&Publication {
            run_id: ctx.run,
            dest: ctx.dest.clone(),
            fingerprint: fingerprint.to_owned(),
            manifest_sha256: manifest_sha256.to_owned(),
            outcome: outcome.to_owned(),
            at: String::new(),
        })
        .await?)
}

/// The upload row of `item` at `key` (id and upload id filled by the caller).
fn row(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    part_size: u64,
    upload_id: Option<String>,
    etag: Option<String>,
) -> UploadRow {
    UploadRow {
        id: 0,
        run_id: ctx.run,
        dest: ctx.dest.clone(),
        key: ctx.url(key),
        path: item.path.clone(),
        size: item.size,
        sha256: item.sha256.clone(),
        part_size,
        upload_id,
        state: UploadState::Verified,
        etag,
        started_at: String::new(),
        finished_at: None,
    }
}

/// Uploads one file unless its object is already complete; the bytes sent
/// (`None`: found complete and checked, nothing sent).
pub(crate) async fn upload_file(
    ctx: &Ctx,
    artifact: &Path,
    keys: &ArtifactKeys,
    item: &Item,
    p: &PublishParams,
) -> Result<Option<u64>> {
    let key = keys.file(&item.path);
    let url = ctx.url(&key);
    let live = ctx.store.upload_in_progress(&ctx.dest, &url).await?;
    let head = ctx
        .attempt(&key, "head", None, 0, ctx.s3.head(&key))
        .await?;
    if let Some(h) = &head
        && h.size == item.size
        && h.sha256.as_deref() == Some(item.sha256.as_str())
    {
        match &live {
            Some(l) => {
                ctx.store
                    .finish_upload(l.id, UploadState::Verified, h.etag.as_deref())
                    .await?;
            }
            None => {
                ctx.store
                    .put_verified_upload(ctx.run, &row(ctx, &key, item, 0, None, h.etag.clone()))
                    .await?;
            }
        }
        return Ok(None);
    }
    let path = safe_join(artifact, &item.path)?;
    let expected = LfsSha256::parse(&item.sha256)
        .map(Expected::Sha256)
        .ok_or_else(|| PipelineError::InvalidInput {
            what: "manifest",
            message: format!(
                "{}: sha256 {:?} is not 64 hex digits",
                item.path, item.sha256
            ),
        })?;
    let part_size = p.part_size.max(1);
    if item.size <= part_size && live.is_none() {
        let bytes = block_in_place(|| read_at(&path, 0, item.size))?;
        let mut hasher = expected.hasher(item.size);
        hasher.update(&bytes);
        check_digest(&item.path, &path, &item.sha256, hasher.finish_hex())?;
        let put = ctx
            .attempt(
                &key,
                "put",
                None,
                item.size,
                ctx.s3.put(&key, bytes, &item.sha256, false),
            )
            .await?;
        let etag = match put {
            Put::Written { etag } => etag,
            Put::Exists => None,
        };
        let etag = check_object(ctx, &key, item, etag.as_deref()).await?;
        ctx.store
            .put_verified_upload(ctx.run, &row(ctx, &key, item, 0, None, etag))
            .await?;
        return Ok(Some(item.size));
    }
    match upload_multipart(ctx, &key, &path, item, &expected, live, p).await {
        // The server no longer knows the upload (expired, aborted): its
        // row is abandoned; one new upload.
        Err(PipelineError::ObjStore(ObjStoreError::UploadGone { .. })) => {
            upload_multipart(ctx, &key, &path, item, &expected, None, p)
                .await
                .map(Some)
        }
        r => r.map(Some),
    }
}

/// One file as a multipart upload, resumed from `live` when it is this
/// file's; the bytes sent.
async fn upload_multipart(
    ctx: &Ctx,
    key: &str,
    path: &Path,
    item: &Item,
    expected: &Expected,
    live: Option<UploadRow>,
    p: &PublishParams,
) -> Result<u64> {
    let url = ctx.url(key);
    let live = match live {
        Some(l) if l.sha256 == item.sha256 && l.size == item.size && l.part_size > 0 => Some(l),
        Some(l) => {
            // Another version of the file was being sent: its parts are
            // not this file's.
            if let Some(id) = &l.upload_id {
                ctx.s3.abort_multipart(key, id).await?;
            }
            ctx.store
                .finish_upload(l.id, UploadState::Abandoned, None)
                .await?;
            None
        }
        None => None,
    };
    let (row_id, upload_id, part_size) = match live {
        Some(l) => (l.id, l.upload_id.unwrap_or_default(), l.part_size),
        None => {
            // At least enough bytes per part to stay within S3's part count.
            let part_size = p.part_size.max(item.size.div_ceil(MAX_PART_NUMBER)).max(1);
            let id = ctx
                .attempt(
                    key,
                    "create_multipart",
                    None,
                    0,
                    ctx.s3.create_multipart(key, &item.sha256),
                )
                .await?;
            crashpoint::hit(CrashPoint::UploadCreated);
            let r = row(ctx, key, item, part_size, Some(id.clone()), None);
            let row_id = ctx
                .store
                .begin_upload(
                    ctx.run,
                    &UploadRow {
                        state: UploadState::Uploading,
                        ..r
                    },
                )
                .await?;
            (row_id, id, part_size)
        }
    };
    let done: BTreeMap<u64, UploadPart> = ctx
        .store
        .upload_parts(row_id)
        .await?
        .into_iter()
        .map(|p| (p.part_number, p))
        .collect();
    let parts = item.size.div_ceil(part_size).max(1);
    let mut hasher = expected.hasher(item.size);
    let upload_id = Arc::<str>::from(upload_id);
    let key_arc = Arc::<str>::from(key);
    let sending = async {
        let mut set: JoinSet<Result<u64>> = JoinSet::new();
        let mut sent = 0u64;
        for n in 1..=parts {
            let off = (n - 1) * part_size;
            let len = part_size.min(item.size - off);
            // Every byte is read and hashed in order, sent or not: the digest
            // of what the completed object holds is the one checked.
            let bytes = block_in_place(|| read_at(path, off, len))?;
            hasher.update(&bytes);
            if done.get(&n).is_some_and(|d| d.size == len) {
                continue;
            }
            while set.len() >= p.concurrency.max(1) {
                sent += joined(set.join_next().await)?;
            }
            let ctx = ctx.clone();
            let (upload_id, key) = (upload_id.clone(), key_arc.clone());
            set.spawn(async move {
                let etag = ctx
                    .attempt(
                        &key,
                        "upload_part",
                        Some(n),
                        len,
                        ctx.s3.put_part(&key, &upload_id, n, bytes),
                    )
                    .await?;
                crashpoint::hit(CrashPoint::UploadPartSent);
                ctx.store
                    .record_part(
                        ctx.run,
                        row_id,
                        &UploadPart {
                            part_number: n,
                            etag,
                            size: len,
                        },
                    )
                    .await?;
                crashpoint::hit(CrashPoint::UploadPartRecorded);
                Ok(len)
            });
        }
        while !set.is_empty() {
            sent += joined(set.join_next().await)?;
        }
        Ok::<u64, PipelineError>(sent)
    };
    let sent = match sending.await {
        Ok(sent) => sent,
        Err(e) => {
            if matches!(e, PipelineError::ObjStore(ObjStoreError::UploadGone { .. })) {
                ctx.store
                    .finish_upload(row_id, UploadState::Abandoned, None)
                    .await?;
            }
            return Err(e);
        }
    };
    if let Err(e) = check_digest(&item.path, path, &item.sha256, hasher.finish_hex()) {
        ctx.s3.abort_multipart(key, &upload_id).await?;
        ctx.store
            .finish_upload(row_id, UploadState::Abandoned, None)
            .await?;
        return Err(e);
    }
    let etags: Vec<String> = ctx
        .store
        .upload_parts(row_id)
        .await?
        .into_iter()
        .filter(|p| p.part_number <= parts)
        .map(|p| p.etag)
        .collect();
    if etags.len() as u64 != parts {
        return Err(PipelineError::internal(format!(
            "{url}: {} of {parts} parts recorded after sending them all",
            etags.len()
        )));
    }
    let completed = ctx
        .attempt(
            key,
            "complete",
            None,
            0,
            ctx.s3.complete_multipart(key, &upload_id, etags),
        )
        .await;
    let etag = match completed {
        Ok(etag) => etag,
        // Completed before a kill, or expired: the object decides.
        Err(PipelineError::ObjStore(ObjStoreError::UploadGone { .. })) => None,
        Err(e) => return Err(e),
    };
    crashpoint::hit(CrashPoint::UploadCompleted);
    match check_object(ctx, key, item, etag.as_deref()).await {
        Ok(etag) => {
            ctx.store
                .finish_upload(row_id, UploadState::Verified, etag.as_deref())
                .await?;
            Ok(sent)
        }
        Err(e) => {
            ctx.store
                .finish_upload(row_id, UploadState::Abandoned, None)
                .await?;
            Err(e)
        }
    }
}

fn joined(r: Option<std::result::Result<Result<u64>, tokio::task::JoinError>>) -> Result<u64> {
    match r {
        None => Ok(0),
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(PipelineError::internal_from("upload task", e)),
    }
}

/// The object at `key` after its upload: its size and SHA-256 metadata
/// must be the file's (and its ETag the one the upload answered with, when
/// known); its ETag.
async fn check_object(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    etag: Option<&str>,
) -> Result<Option<String>> {
    let url = ctx.url(key);
    let head = ctx.attempt(key, "head", None, 0, ctx.s3.head(key)).await?;
    let mismatch = |what: String| PipelineError::ObjectMismatch {
        key: url.clone(),
        what,
    };
    let Some(h) = head else {
        return Err(mismatch("missing after its upload completed".into()));
    };
    if h.size != item.size {
        return Err(mismatch(format!(
            "{} bytes after upload, expected {}",
            h.size, item.size
        )));
    }
    if h.sha256.as_deref() != Some(item.sha256.as_str()) {
        return Err(mismatch(format!(
            "metadata ftpipe-sha256 {:?} after upload, expected {}",
            h.sha256, item.sha256
        )));
    }
    // Quoted or not, as the answer spelled it.
    if let (Some(sent), Some(now)) = (etag, h.etag.as_deref())
        && sent.trim_matches('"') != now.trim_matches('"')
    {
        return Err(mismatch(format!(
            "ETag {now} after upload, the upload answered {sent}"
        )));
    }
    Ok(h.etag)
}

fn check_digest(rel: &str, path: &Path, expected: &str, actual: String) -> Result<()> {
    if actual == expected {
        return Ok(());
    }
    Err(PipelineError::VerifyFailed {
        artifact: path.to_owned(),
        problems: vec![format!(
            "{rel}: SHA-256 {actual} while publishing, the manifest says {expected} (the file changed; not published)"
        )],
    })
}

/// `len` bytes of `path` from `off` (a short file is an error).
fn read_at(path: &Path, off: u64, len: u64) -> Result<Bytes> {
    let io = |e| PipelineError::io("read", path, e);
    let file = open_regular(path, Links::Refuse)
        .map_err(|e| PipelineError::io("open", path, std::io::Error::other(e)))?;
    let len = usize::try_from(len).map_err(|_| io(std::io::Error::other("part too large")))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, off).map_err(io)?;
    Ok(Bytes::from(buf))
}
