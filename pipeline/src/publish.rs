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
//! Every request goes through the output target
//! ([`ftpipe_objstore::OutputTarget`], held as a [`SharedTarget`]; S3 is
//! the one `publish` opens), so this module knows sessions, parts and
//! receipts, not S3. Each file is sent in one put (up to the part size) or
//! as a multipart session whose handle and acknowledged parts are durable
//! in `state.db` (`upload_store`): a killed publish resumes the session and
//! sends only the parts without a row. Every byte sent is read from
//! `DIR/artifact` and hashed on the way; a file whose SHA-256 is not the
//! manifest's is not completed. After completion a head must show the size
//! and the SHA-256 metadata, and the target's own checksum (when it keeps
//! one) must prove the bytes sent, before the upload receipt is written.
//! Every request is an upload attempt row, before and after. Files that
//! go in one put are sent several at once, beside the multipart files
//! ([`upload_all`]); the manifest waits for all of them. `mirror`
//! uploads its files with the same machinery ([`upload_file`]).
//!
//! Reuse: an object already at a file's key (an earlier run's, another
//! publisher's, or anyone's with write access) is taken as the file only
//! when the target's checksum of its bytes proves it
//! ([`ftpipe_objstore::StoreChecksum`]): a whole object's checksum must be
//! the manifest's SHA-256; one over parts must be the digest of the local
//! file's parts at the part size this publish would send it with, read
//! from `DIR/artifact` (and the file must still be the manifest's).
//! Metadata claiming the SHA-256 proves nothing. Anything else is uploaded
//! again over it; the upload row's `found` says which it was.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinSet, block_in_place};

use ftpipe_artifact::manifest::{MANIFEST_FILE, Manifest, PLACEMENT_FILE, sha256_hex};
use ftpipe_artifact::verify::{MAX_MANIFEST_BYTES, MAX_PLACEMENT_BYTES, verify_artifact};
use ftpipe_fs::bounded::{Links, open_regular, read_bounded_nofollow};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::paths::safe_join;
use ftpipe_hub::identity::{Expected, IdentityHasher, LfsSha256};
use ftpipe_objstore::{
    Head, MANIFEST_KEY, ObjStoreError, PartRequest, Put, PutMode, S3, S3Config, S3Location,
    Sha256Digest, SharedTarget, artifact_file_key, sha256_of,
};
use ftpipe_receipts::{
    FoundObject, Publication, PublicationOutcome, RunId, Store, UploadAttempt, UploadOp,
    UploadOutcome, UploadPart, UploadRow, UploadState,
};

use crate::Pipeline;
use crate::error::{PipelineError, Result};
use crate::part_plan::{self, PartChoice, PartPlan};

/// What `publish` needs from the command line.
#[derive(Debug, Clone)]
pub struct PublishParams {
    /// Where to publish.
    pub location: S3Location,
    /// Credentials, region, endpoint.
    pub config: S3Config,
    /// Part size of multipart uploads (files up to it go in one put);
    /// `None`: chosen per file ([`crate::part_plan`]).
    pub part_size: Option<u64>,
    /// Parts in flight at once; `None`: chosen per file.
    pub concurrency: Option<usize>,
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
    /// Objects found at their key whose store checksum proved their bytes
    /// (an earlier run's, or another publisher's of the same artifact):
    /// nothing sent.
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

/// What the uploads of one publish or mirror added up to.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    /// Files sent by this run.
    pub(crate) uploaded: usize,
    /// Files found at their key, proven by the store's checksum.
    pub(crate) reused: usize,
    /// Body bytes sent.
    pub(crate) bytes_sent: u64,
}

impl Tally {
    /// Both tallies together.
    fn merged(self, other: Tally) -> Tally {
        Tally {
            uploaded: self.uploaded.saturating_add(other.uploaded),
            reused: self.reused.saturating_add(other.reused),
            bytes_sent: self.bytes_sent.saturating_add(other.bytes_sent),
        }
    }

    /// Counts one file's [`upload_file`] answer.
    pub(crate) fn add(&mut self, sent: Option<u64>) {
        match sent {
            Some(bytes) => {
                self.uploaded = self.uploaded.saturating_add(1);
                self.bytes_sent = self.bytes_sent.saturating_add(bytes);
            }
            None => self.reused = self.reused.saturating_add(1),
        }
    }
}

/// What the tasks of one publish (or mirror) share.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) target: SharedTarget,
    pub(crate) store: Arc<Store>,
    pub(crate) run: RunId,
    /// The destination, as the target names it.
    pub(crate) dest: String,
    /// The user's part size and concurrency, where given; the rest is
    /// chosen per file ([`Ctx::plan_for`]).
    pub(crate) choice: PartChoice,
}

impl Ctx {
    /// A context uploading with the given part size and concurrency
    /// (`None`: chosen per file).
    pub(crate) fn new(
        target: SharedTarget,
        pipeline: &Pipeline,
        part_size: impl Into<Option<u64>>,
        concurrency: impl Into<Option<usize>>,
    ) -> Ctx {
        Ctx {
            dest: target.dest(),
            target,
            store: pipeline.store.clone(),
            run: pipeline.run,
            choice: PartChoice {
                part_size: part_size.into(),
                concurrency: concurrency.into(),
            },
        }
    }

    /// How a new upload of `size` bytes is cut and sent.
    pub(crate) fn plan_for(&self, size: u64) -> PartPlan {
        part_plan::plan(size, &self.target.part_rules(), self.choice)
    }

    /// How many parts of a session cut at `part_size` go at once.
    fn concurrency_for(&self, size: u64, part_size: u64) -> usize {
        let choice = PartChoice {
            part_size: Some(part_size),
            ..self.choice
        };
        part_plan::plan(size, &self.target.part_rules(), choice).concurrency
    }

    /// Runs one request between an `in_flight` attempt row and its end.
    pub(crate) async fn attempt<T>(
        &self,
        key: &str,
        op: UploadOp,
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
                    key: self.url(key),
                    op,
                    part_number,
                    host: self.target.host().to_owned(),
                    bytes,
                    outcome: UploadOutcome::InFlight,
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

    /// Puts the commit point (`manifest.json`, `listing.json`) at `key`,
    /// create-only: [`Put::Exists`] when another put won.
    pub(crate) async fn put_commit(&self, key: &str, bytes: Vec<u8>, sha256: &str) -> Result<Put> {
        let len = bytes.len() as u64;
        let put = self
            .target
            .put(key, Bytes::from(bytes), sha256, PutMode::CreateOnly);
        self.attempt(key, UploadOp::PutCommit, None, len, put).await
    }

    pub(crate) fn url(&self, key: &str) -> String {
        self.target.url_of(key)
    }
}

impl Pipeline {
    /// Publishes `DIR/artifact` to the S3 location of `p` (see the module
    /// doc).
    pub async fn publish(&self, p: &PublishParams) -> Result<PublishOutcome> {
        let target: SharedTarget = Arc::new(S3::open(&p.config, p.location.clone())?);
        self.publish_to(target, p.part_size, p.concurrency).await
    }

    /// Publishes `DIR/artifact` to `target`: every component and the
    /// placement, then the manifest create-only.
    pub async fn publish_to(
        &self,
        target: SharedTarget,
        part_size: Option<u64>,
        concurrency: Option<usize>,
    ) -> Result<PublishOutcome> {
        let artifact = self.layout.artifact().to_owned();
        let (manifest, manifest_bytes) = read_verified_manifest(&artifact)?;
        let fingerprint = manifest.fingerprint.clone();
        let manifest_sha256 = sha256_hex(&manifest_bytes);
        let ctx = Ctx::new(target, self, part_size, concurrency);
        let mut outcome = PublishOutcome {
            dest: ctx.dest.clone(),
            fingerprint: fingerprint.clone(),
            manifest_sha256: manifest_sha256.clone(),
            objects: manifest.components.len().saturating_add(1),
            uploaded: 0,
            reused: 0,
            bytes_sent: 0,
            already_published: false,
        };
        if published_here(&ctx, &fingerprint).await? {
            outcome.already_published = true;
            let already = PublicationOutcome::AlreadyPublished;
            record(&ctx, &fingerprint, &manifest_sha256, already).await?;
            return Ok(outcome);
        }
        let files = artifact_items(&artifact, &manifest)?
            .into_iter()
            .map(|item| {
                let key = ctx.target.key(&artifact_file_key(&fingerprint, &item.path));
                (key, item)
            })
            .collect();
        let tally = upload_all(&ctx, &artifact, files).await?;
        crashpoint::hit(CrashPoint::PublishComponentsDone);
        (outcome.uploaded, outcome.reused) = (tally.uploaded, tally.reused);
        outcome.bytes_sent = tally.bytes_sent;
        let key = ctx.target.key(MANIFEST_KEY);
        let recorded = match ctx
            .put_commit(&key, manifest_bytes, &manifest_sha256)
            .await?
        {
            Put::Written { .. } => {
                crashpoint::hit(CrashPoint::PublishManifestPut);
                PublicationOutcome::Published
            }
            // Lost the create to another publisher (or to this one before a
            // kill): the same artifact is a no-op, another a refusal.
            Put::Exists => {
                if !published_here(&ctx, &fingerprint).await? {
                    return Err(unreadable_commit_point(&ctx, &key));
                }
                outcome.already_published = outcome.uploaded == 0;
                PublicationOutcome::AlreadyPublished
            }
        };
        record(&ctx, &fingerprint, &manifest_sha256, recorded).await?;
        Ok(outcome)
    }
}

/// A commit point a create-only put found there, which then could not be
/// read back.
pub(crate) fn unreadable_commit_point(ctx: &Ctx, key: &str) -> PipelineError {
    PipelineError::internal(format!(
        "{} exists but could not be read back",
        ctx.url(key)
    ))
}

/// `DIR/artifact` verified, and its manifest: parsed, and its bytes as
/// they will be published.
pub(crate) fn read_verified_manifest(artifact: &Path) -> Result<(Manifest, Vec<u8>)> {
    let report = block_in_place(|| verify_artifact(artifact, false))?;
    if !report.ok {
        return Err(PipelineError::VerifyFailed {
            artifact: artifact.to_owned(),
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
    Ok((manifest, manifest_bytes))
}

/// The files a publish sends: every component the manifest lists, then
/// `placement.json` (hashed as it is now).
pub(crate) fn artifact_items(artifact: &Path, manifest: &Manifest) -> Result<Vec<Item>> {
    let placement_path = artifact.join(PLACEMENT_FILE);
    let placement = block_in_place(|| read_bounded_nofollow(&placement_path, MAX_PLACEMENT_BYTES))
        .map_err(|e| PipelineError::io("read", &placement_path, std::io::Error::other(e)))?;
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
    Ok(items)
}

/// Whether `PREFIX/manifest.json` already names this artifact; an error
/// naming both fingerprints when it names another (or cannot be read as a
/// manifest).
async fn published_here(ctx: &Ctx, fingerprint: &str) -> Result<bool> {
    let key = ctx.target.key(MANIFEST_KEY);
    let Some(body) = ctx.target.get_bounded(&key, MAX_MANIFEST_BYTES).await? else {
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
    outcome: PublicationOutcome,
) -> Result<()> {
    Ok(ctx
        .store
        .record_publication(&Publication {
            run_id: ctx.run,
            dest: ctx.dest.clone(),
            fingerprint: fingerprint.to_owned(),
            manifest_sha256: manifest_sha256.to_owned(),
            outcome,
            at: String::new(),
        })
        .await?)
}

/// The upload row of `item` at `key` (id filled by the store), after the
/// head before it found `found` there.
pub(crate) fn row(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    found: FoundObject,
    part_size: u64,
    session: Option<String>,
    version: Option<String>,
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
        session,
        state: UploadState::Verified,
        version,
        found: Some(found),
        mounted_from: None,
        started_at: String::new(),
        finished_at: None,
    }
}

/// Most files sent in one put that are in flight at once.
pub const WHOLE_FILES_IN_FLIGHT: usize = 8;

/// Uploads every `(key, item)` of `files`, under `root`, with
/// [`upload_file`]; what they added up to, or the first error (the
/// uploads still in flight are dropped, as at a kill: a re-run resumes
/// them).
///
/// A file that goes in one put costs a request or two of latency for
/// little bytes, so those go several at once ([`whole_files_in_flight`])
/// beside the multipart files, which go one after another: each fills the
/// link with its own parts in flight. Memory: the multipart file's parts
/// in flight ([`part_plan::IN_FLIGHT_BYTES`]) and at most as much again of
/// whole files. Each file passes [`CrashPoint::UploadVerified`] once its
/// receipt is written.
pub(crate) async fn upload_all(
    ctx: &Ctx,
    root: &Path,
    files: Vec<(String, Item)>,
) -> Result<Tally> {
    let (whole, multipart): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|(_, item)| item.size <= session_part_size(ctx, item));
    let sizes = whole.iter().map(|(_, item)| item.size);
    let in_flight = whole_files_in_flight(ctx.choice.concurrency, sizes);
    let puts = futures_util::stream::iter(&whole)
        .map(|(key, item)| upload_file(ctx, root, key, item))
        .buffer_unordered(in_flight)
        .try_fold(Tally::default(), |mut tally, sent| async move {
            tally.add(sent);
            crashpoint::hit(CrashPoint::UploadVerified);
            Ok(tally)
        });
    let sessions = async {
        let mut tally = Tally::default();
        for (key, item) in &multipart {
            tally.add(upload_file(ctx, root, key, item).await?);
            crashpoint::hit(CrashPoint::UploadVerified);
        }
        Ok::<_, PipelineError>(tally)
    };
    let (puts, sessions) = tokio::try_join!(puts, sessions)?;
    Ok(puts.merged(sessions))
}

/// How many whole-file puts go at once: as many as fit in
/// [`part_plan::IN_FLIGHT_BYTES`] at the largest of `sizes` (each put's
/// bytes are held until it is answered), within 1..=[`WHOLE_FILES_IN_FLIGHT`]
/// and never more than the user's `concurrency` (`--concurrency`).
fn whole_files_in_flight(concurrency: Option<usize>, sizes: impl Iterator<Item = u64>) -> usize {
    let largest = sizes.max().unwrap_or(0).max(1);
    let by_memory = usize::try_from(part_plan::IN_FLIGHT_BYTES / largest).unwrap_or(usize::MAX);
    by_memory
        .min(concurrency.unwrap_or(WHOLE_FILES_IN_FLIGHT))
        .clamp(1, WHOLE_FILES_IN_FLIGHT)
}

/// Uploads one file (`item`, under `root`) to `key` unless its object is
/// already there, proven by the target's checksum; the bytes sent (`None`:
/// found proven, nothing sent).
pub(crate) async fn upload_file(
    ctx: &Ctx,
    root: &Path,
    key: &str,
    item: &Item,
) -> Result<Option<u64>> {
    let live = ctx
        .store
        .upload_in_progress(&ctx.dest, &ctx.url(key))
        .await?;
    let path = safe_join(root, &item.path)?;
    let expected = LfsSha256::parse(&item.sha256)
        .map(Expected::Sha256)
        .ok_or_else(|| PipelineError::InvalidInput {
            what: "manifest",
            message: format!(
                "{}: sha256 {:?} is not 64 hex digits",
                item.path, item.sha256
            ),
        })?;
    let file = Local {
        path: &path,
        item,
        expected: &expected,
    };
    let found = examine(ctx, key, &file, live.as_ref()).await?;
    if found == FoundObject::Proven {
        return Ok(None);
    }
    if item.size <= session_part_size(ctx, item) && live.is_none() {
        return put_whole(ctx, key, &file, found).await.map(Some);
    }
    match upload_multipart(ctx, key, &file, live, found).await {
        // The target no longer knows the session (expired, aborted): its
        // row is abandoned; one new session.
        Err(PipelineError::ObjStore(ObjStoreError::UploadGone { .. })) => {
            upload_multipart(ctx, key, &file, None, found)
                .await
                .map(Some)
        }
        r => r.map(Some),
    }
}

/// One file of a publish as it is on disk: where it is, what the manifest
/// says of it, and its expected identity.
struct Local<'a> {
    path: &'a Path,
    item: &'a Item,
    expected: &'a Expected,
}

/// What the head finds at `key` for `file`. An object there whose
/// target checksum proves its bytes are the file's is reused: its receipt
/// is written (ending `live`, the session in progress, if any).
async fn examine(
    ctx: &Ctx,
    key: &str,
    file: &Local<'_>,
    live: Option<&UploadRow>,
) -> Result<FoundObject> {
    let head = ctx
        .attempt(key, UploadOp::Head, None, 0, ctx.target.head(key))
        .await?;
    let Some(h) = head else {
        return Ok(FoundObject::Nothing);
    };
    // A session in progress of this file decides the part size its object
    // would have been completed with.
    let part_size = live
        .filter(|l| l.sha256 == file.item.sha256 && l.part_size > 0)
        .map_or_else(|| session_part_size(ctx, file.item), |l| l.part_size);
    let found = proof(&h, file, part_size)?;
    if found != FoundObject::Proven {
        return Ok(found);
    }
    match live {
        Some(l) => {
            ctx.store
                .finish_upload_reused(l.id, h.etag.as_deref())
                .await?;
        }
        None => {
            let receipt = row(ctx, key, file.item, found, 0, None, h.etag);
            ctx.store.put_verified_upload(ctx.run, &receipt).await?;
        }
    }
    Ok(found)
}

/// Whether the target's checksum in `h` proves the object holds `file`'s
/// bytes: a whole-object checksum against the manifest's SHA-256, one over
/// parts against the file's parts at `part_size` (read from disk; the file
/// must also still be the manifest's).
fn proof(h: &Head, file: &Local<'_>, part_size: u64) -> Result<FoundObject> {
    let Some(checksum) = h.checksum else {
        return Ok(FoundObject::NoChecksum);
    };
    let item = file.item;
    let proven = h.size == item.size
        && match checksum.parts() {
            None => checksum.proves_whole(&manifest_digest(item)?),
            Some(n) if part_plan::parts_of(item.size, part_size) == n => {
                block_in_place(|| part_digests(file, part_size))?
                    .is_some_and(|parts| checksum.proves_parts(&parts))
            }
            Some(_) => false,
        };
    Ok(if proven {
        FoundObject::Proven
    } else {
        FoundObject::NotProven
    })
}

/// The manifest's SHA-256 of `item`, as bytes.
fn manifest_digest(item: &Item) -> Result<Sha256Digest> {
    let mut d = [0u8; 32];
    hex::decode_to_slice(&item.sha256, &mut d).map_err(|e| PipelineError::InvalidInput {
        what: "manifest",
        message: format!("{}: sha256 {:?}: {e}", item.path, item.sha256),
    })?;
    Ok(d)
}

/// The SHA-256s of `file`'s parts at `part_size`, in order; `None` when
/// the file's bytes are no longer the manifest's.
fn part_digests(file: &Local<'_>, part_size: u64) -> Result<Option<Vec<Sha256Digest>>> {
    let size = file.item.size;
    let mut whole = file.expected.hasher(size);
    let mut parts = Vec::new();
    for number in 0..part_plan::parts_of(size, part_size) {
        let offset = number.saturating_mul(part_size);
        let bytes = read_at(
            file.path,
            offset,
            part_size.min(size.saturating_sub(offset)),
        )?;
        whole.update(&bytes);
        parts.push(sha256_of(&bytes));
    }
    Ok((whole.finish_hex() == file.item.sha256).then_some(parts))
}

/// The part size a new session of `item` uses: the user's, or chosen
/// from its size ([`crate::part_plan`]), within the target's part count.
pub(crate) fn session_part_size(ctx: &Ctx, item: &Item) -> u64 {
    ctx.plan_for(item.size).part_size
}

/// One file in one put, hashed before it is sent and checked after; its
/// receipt written (after the head before it found `found`). The bytes
/// sent.
async fn put_whole(ctx: &Ctx, key: &str, file: &Local<'_>, found: FoundObject) -> Result<u64> {
    let (path, item) = (file.path, file.item);
    let mut hasher = file.expected.hasher(item.size);
    // Read and hashed on a blocking thread: the task (and the uploads
    // joined with it in `upload_all`) goes on meanwhile.
    let (owned, size) = (path.to_owned(), item.size);
    let (bytes, digest) = tokio::task::spawn_blocking(move || {
        let bytes = read_at(&owned, 0, size)?;
        hasher.update(&bytes);
        Ok::<_, PipelineError>((bytes, hasher.finish_hex()))
    })
    .await
    .map_err(|e| PipelineError::internal_from("file read task", e))??;
    // The one hash of these bytes: the target sends the manifest's
    // SHA-256, now proven theirs, as the put's checksum.
    check_digest(&item.path, path, &item.sha256, digest)?;
    let put = ctx.target.put(key, bytes, &item.sha256, PutMode::Replace);
    let version = match ctx
        .attempt(key, UploadOp::Put, None, item.size, put)
        .await?
    {
        Put::Written { etag } => etag,
        Put::Exists => None,
    };
    let sent = Sent::Whole(manifest_digest(item)?);
    let version = check_object(ctx, key, item, &sent, version.as_deref()).await?;
    let receipt = row(ctx, key, item, found, 0, None, version);
    ctx.store.put_verified_upload(ctx.run, &receipt).await?;
    Ok(item.size)
}

/// A multipart session as its `uploads` row holds it.
struct Session {
    row_id: i64,
    handle: Arc<str>,
    part_size: u64,
}

impl Session {
    /// The parts of `item` at this session's part size.
    fn parts(&self, item: &Item) -> u64 {
        part_plan::parts_of(item.size, self.part_size)
    }
}

/// One file as a multipart session, resumed from `live` when it is this
/// file's (a new session's row says the head before it found `found`);
/// the bytes sent.
async fn upload_multipart(
    ctx: &Ctx,
    key: &str,
    file: &Local<'_>,
    live: Option<UploadRow>,
    found: FoundObject,
) -> Result<u64> {
    let (path, item) = (file.path, file.item);
    let session = open_session(ctx, key, item, live, found).await?;
    let hasher = file.expected.hasher(item.size);
    let (sent, digests, digest) = match send_parts(ctx, key, path, item, &session, hasher).await {
        Ok(sent) => sent,
        Err(e) => {
            if matches!(e, PipelineError::ObjStore(ObjStoreError::UploadGone { .. })) {
                abandon(ctx, &session).await?;
            }
            return Err(e);
        }
    };
    if let Err(e) = check_digest(&item.path, path, &item.sha256, digest) {
        ctx.target.abort_upload(key, &session.handle).await?;
        abandon(ctx, &session).await?;
        return Err(e);
    }
    let version = complete_session(ctx, key, item, &session).await?;
    crashpoint::hit(CrashPoint::UploadCompleted);
    let sent_parts = Sent::Parts(digests);
    match check_object(ctx, key, item, &sent_parts, version.as_deref()).await {
        Ok(version) => {
            ctx.store
                .finish_upload(session.row_id, UploadState::Verified, version.as_deref())
                .await?;
            Ok(sent)
        }
        Err(e) => {
            abandon(ctx, &session).await?;
            Err(e)
        }
    }
}

async fn abandon(ctx: &Ctx, session: &Session) -> Result<()> {
    Ok(ctx
        .store
        .finish_upload(session.row_id, UploadState::Abandoned, None)
        .await?)
}

/// The session `live` holds when it is this version of the file's; else
/// (after aborting and abandoning another version's) a new one, recorded
/// before any part is sent.
async fn open_session(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    live: Option<UploadRow>,
    found: FoundObject,
) -> Result<Session> {
    if let Some(l) = live {
        if l.sha256 == item.sha256 && l.size == item.size && l.part_size > 0 {
            return Ok(Session {
                row_id: l.id,
                handle: Arc::from(l.session.unwrap_or_default()),
                part_size: l.part_size,
            });
        }
        // Another version of the file was being sent: its parts are not
        // this file's.
        if let Some(handle) = &l.session {
            ctx.target.abort_upload(key, handle).await?;
        }
        ctx.store
            .finish_upload(l.id, UploadState::Abandoned, None)
            .await?;
    }
    let part_size = session_part_size(ctx, item);
    let begin = ctx.target.begin_upload(key, &item.sha256);
    let handle = ctx
        .attempt(key, UploadOp::BeginUpload, None, 0, begin)
        .await?;
    crashpoint::hit(CrashPoint::UploadCreated);
    let uploading = UploadRow {
        state: UploadState::Uploading,
        ..row(ctx, key, item, found, part_size, Some(handle.clone()), None)
    };
    let row_id = ctx.store.begin_upload(ctx.run, &uploading).await?;
    Ok(Session {
        row_id,
        handle: Arc::from(handle),
        part_size,
    })
}

/// Sends every part of `item` without a recorded acknowledgement, at most
/// [`Ctx::concurrency_for`] requests in flight; the bytes sent, every
/// part's SHA-256, and the digest of the whole file as read.
///
/// Every byte is read once, in order, and hashed twice, from the same
/// bytes: into the file's digest (the one checked against the manifest
/// before completing: the bytes sent are the manifest's) and into its
/// part's SHA-256 (the part's checksum, which the target's checksum of the
/// object must be over). No hash holds up the sends: a part is read, and
/// its SHA-256 computed, while the parts before it are in flight (its read
/// on a blocking thread, never on the task that refills the slots), and
/// the file's digest runs behind, one part after another, needed only
/// once every part is sent. A slot is free again as soon as its part's
/// request is answered: the part's receipt is committed beside the next
/// sends, and completing waits for every receipt. In memory: the parts in
/// flight, the one read ahead, and at most one sent part the file's
/// digest is still over (their buffers reused from part to part,
/// [`BufferPool`]).
async fn send_parts(
    ctx: &Ctx,
    key: &str,
    path: &Path,
    item: &Item,
    session: &Session,
    hasher: IdentityHasher,
) -> Result<(u64, Vec<Sha256Digest>, String)> {
    let done: BTreeMap<u64, UploadPart> = ctx
        .store
        .upload_parts(session.row_id)
        .await?
        .into_iter()
        .map(|p| (p.part_number, p))
        .collect();
    let mut sending = Sending {
        ctx: ctx.clone(),
        key: Arc::from(key),
        handle: session.handle.clone(),
        row_id: session.row_id,
        slots: Arc::new(Semaphore::new(
            ctx.concurrency_for(item.size, session.part_size),
        )),
        in_order: ctx.target.part_rules().in_order,
        set: JoinSet::new(),
        tally: PartTally::default(),
    };
    let mut whole = WholeDigest::new(hasher);
    let pool = BufferPool::default();
    for number in 1..=session.parts(item) {
        let offset = (number - 1).saturating_mul(session.part_size);
        let len = session.part_size.min(item.size.saturating_sub(offset));
        let bytes = read_part(path, offset, len, &pool).await?;
        whole.feed(bytes.clone()).await?;
        let sha256 = part_sha256(bytes.clone());
        if let Some(d) = done.get(&number).filter(|d| d.size == len) {
            sending.tally.previous = Some(d.receipt.clone());
            let sha256 = sha256
                .await
                .map_err(|e| PipelineError::internal_from("part digest task", e))?;
            sending.tally.digests.insert(number, sha256);
            continue;
        }
        let part = PartBytes {
            number,
            offset,
            bytes,
            sha256,
        };
        sending.send(part).await?;
    }
    let tally = sending.finish().await?;
    let digest = whole.finish().await?;
    Ok((tally.sent, tally.digests.into_values().collect(), digest))
}

/// `len` bytes of `path` from `offset`, read on a blocking thread into a
/// buffer of `pool`.
async fn read_part(path: &Path, offset: u64, len: u64, pool: &BufferPool) -> Result<Bytes> {
    let (path, pool) = (path.to_owned(), pool.clone());
    tokio::task::spawn_blocking(move || {
        let buf = read_into(&path, offset, len, pool.take())?;
        Ok(Bytes::from_owner(Pooled { buf, pool }))
    })
    .await
    .map_err(|e| PipelineError::internal_from("part read task", e))?
}

/// The part buffers of one file, each back here once no request, hash or
/// retry holds its bytes, and reused for a later part: a fresh buffer of
/// tens of MiB costs a page fault and a zeroed page per 4 KiB (in a
/// profile of a 1.75 GB publish, about a tenth of publish's CPU time).
/// Holds at most as many as were in use at once.
#[derive(Clone, Default)]
struct BufferPool(Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl BufferPool {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    fn give_back(&self, buf: Vec<u8>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(buf);
    }
}

/// A part's bytes in a buffer of a [`BufferPool`], given back when the
/// last [`Bytes`] of it is dropped.
struct Pooled {
    buf: Vec<u8>,
    pool: BufferPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// The SHA-256 of `bytes`, computed on a blocking thread from now on.
fn part_sha256(bytes: Bytes) -> tokio::task::JoinHandle<Sha256Digest> {
    tokio::task::spawn_blocking(move || sha256_of(&bytes))
}

/// A file's digest, fed its parts in order, each hashed on a blocking
/// thread while the next is read and sent.
struct WholeDigest {
    /// The hasher, or the task hashing the latest part into it.
    running: tokio::task::JoinHandle<IdentityHasher>,
}

impl WholeDigest {
    fn new(hasher: IdentityHasher) -> WholeDigest {
        WholeDigest {
            running: tokio::task::spawn_blocking(move || hasher),
        }
    }

    /// Hashes `bytes` after every part fed before (waiting for the one
    /// before it, which ran while `bytes` was read).
    async fn feed(&mut self, bytes: Bytes) -> Result<()> {
        let mut hasher = self.hasher().await?;
        self.running = tokio::task::spawn_blocking(move || {
            hasher.update(&bytes);
            hasher
        });
        Ok(())
    }

    async fn hasher(&mut self) -> Result<IdentityHasher> {
        (&mut self.running)
            .await
            .map_err(|e| PipelineError::internal_from("file digest task", e))
    }

    /// The hex digest of everything fed.
    async fn finish(mut self) -> Result<String> {
        Ok(self.hasher().await?.finish_hex())
    }
}

/// The sends of one session's parts.
struct Sending {
    ctx: Ctx,
    key: Arc<str>,
    handle: Arc<str>,
    row_id: i64,
    /// One permit per request in flight.
    slots: Arc<Semaphore>,
    /// The target takes part `n` only with part `n - 1`'s receipt: one
    /// part at a time, each after the one before is recorded.
    in_order: bool,
    set: JoinSet<Result<SentPart>>,
    tally: PartTally,
}

impl Sending {
    /// Sends `part` once a slot is free (after the part before it is
    /// recorded, for an in-order target); the first error of a part sent
    /// before ends the upload.
    async fn send(&mut self, part: PartBytes) -> Result<()> {
        if self.in_order {
            self.join_all().await?;
        }
        // A part that failed ends the upload as soon as it is known, not
        // when a slot frees.
        let slot = loop {
            tokio::select! {
                biased;
                Some(joined) = self.set.join_next(), if !self.set.is_empty() => {
                    self.tally.add(joined_part(joined)?);
                }
                slot = self.slots.clone().acquire_owned() => {
                    break slot.map_err(|e| PipelineError::internal_from("part slots", e))?;
                }
            }
        };
        let previous = if self.in_order {
            self.tally.previous.take()
        } else {
            None
        };
        spawn_part(self, part, previous, slot);
        Ok(())
    }

    async fn join_all(&mut self) -> Result<()> {
        while let Some(joined) = self.set.join_next().await {
            self.tally.add(joined_part(joined)?);
        }
        Ok(())
    }

    /// Every part sent and recorded: the tally.
    async fn finish(mut self) -> Result<PartTally> {
        self.join_all().await?;
        Ok(self.tally)
    }
}

fn joined_part(
    r: std::result::Result<Result<SentPart>, tokio::task::JoinError>,
) -> Result<SentPart> {
    r.map_err(|e| PipelineError::internal_from("upload task", e))?
}

/// One part read from the file, not yet sent.
struct PartBytes {
    number: u64,
    offset: u64,
    bytes: Bytes,
    /// Its SHA-256, being computed.
    sha256: tokio::task::JoinHandle<Sha256Digest>,
}

/// What one send task answers.
struct SentPart {
    number: u64,
    len: u64,
    receipt: String,
    sha256: Sha256Digest,
}

/// The parts of one session so far.
#[derive(Default)]
struct PartTally {
    /// Body bytes sent.
    sent: u64,
    /// The last receipt (the one an in-order target's next part needs).
    previous: Option<String>,
    /// Every part's SHA-256 by part number.
    digests: BTreeMap<u64, Sha256Digest>,
}

impl PartTally {
    fn add(&mut self, part: SentPart) {
        self.sent = self.sent.saturating_add(part.len);
        self.previous = Some(part.receipt);
        self.digests.insert(part.number, part.sha256);
    }
}

/// Sends `part` in a task of `sending`, holding `slot` until the target
/// answers: the request between its attempt rows, then its receipt
/// recorded (after the target's answer, never before).
fn spawn_part(
    sending: &mut Sending,
    part: PartBytes,
    previous: Option<String>,
    slot: OwnedSemaphorePermit,
) {
    let ctx = sending.ctx.clone();
    let (key, handle, row_id) = (sending.key.clone(), sending.handle.clone(), sending.row_id);
    sending.set.spawn(async move {
        let (number, len) = (part.number, part.bytes.len() as u64);
        let sha256 = part
            .sha256
            .await
            .map_err(|e| PipelineError::internal_from("part digest task", e))?;
        let request = PartRequest {
            number,
            offset: part.offset,
            bytes: part.bytes,
            sha256,
            previous,
        };
        let send = ctx.target.send_part(&key, &handle, request);
        let answered = async move {
            let answer = send.await;
            drop(slot);
            answer
        };
        let receipt = ctx
            .attempt(&key, UploadOp::SendPart, Some(number), len, answered)
            .await?;
        crashpoint::hit(CrashPoint::UploadPartSent);
        let acknowledged = UploadPart {
            part_number: number,
            receipt: receipt.clone(),
            size: len,
        };
        ctx.store
            .record_part(ctx.run, row_id, &acknowledged)
            .await?;
        crashpoint::hit(CrashPoint::UploadPartRecorded);
        Ok(SentPart {
            number,
            len,
            receipt,
            sha256,
        })
    });
}

/// Completes `session` from its recorded receipts (every part must have
/// one); the object's version tag when the target answered one.
async fn complete_session(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    session: &Session,
) -> Result<Option<String>> {
    let parts = session.parts(item);
    let receipts: Vec<String> = ctx
        .store
        .upload_parts(session.row_id)
        .await?
        .into_iter()
        .filter(|p| p.part_number <= parts)
        .map(|p| p.receipt)
        .collect();
    if receipts.len() as u64 != parts {
        return Err(PipelineError::internal(format!(
            "{}: {} of {parts} parts recorded after sending them all",
            ctx.url(key),
            receipts.len()
        )));
    }
    let complete = ctx
        .target
        .complete_upload(key, &session.handle, receipts, &item.sha256);
    match ctx
        .attempt(key, UploadOp::CompleteUpload, None, 0, complete)
        .await
    {
        Ok(version) => Ok(version),
        // Completed before a kill, or expired: the object decides.
        Err(PipelineError::ObjStore(ObjStoreError::UploadGone { .. })) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What an upload sent, as the target's checksum of the object must prove
/// it.
enum Sent {
    /// One put: the file's SHA-256.
    Whole(Sha256Digest),
    /// A session: its parts' SHA-256s, in order.
    Parts(Vec<Sha256Digest>),
}

/// The object at `key` after its upload: its size and SHA-256 metadata
/// must be the file's, the target's checksum (when it keeps one) must
/// prove the bytes `sent`, and its version tag must be the one the upload
/// answered with, when known; its version tag.
async fn check_object(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    sent: &Sent,
    version: Option<&str>,
) -> Result<Option<String>> {
    let url = ctx.url(key);
    let head = ctx
        .attempt(key, UploadOp::Head, None, 0, ctx.target.head(key))
        .await?;
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
    // A target keeping no checksum checked none on arrival; one that keeps
    // one must hold the bytes sent (S3 refuses a put or part whose bytes
    // are not its checksum's, so this catches a lying server).
    if let Some(c) = h.checksum {
        let proven = match sent {
            Sent::Whole(d) => c.proves_whole(d),
            // A content-addressed target (a registry) keeps the digest of
            // the whole blob: the bytes sent were hashed on the way and are
            // the manifest's (checked before completing), so that digest is
            // their proof.
            Sent::Parts(parts) => c.proves_parts(parts) || c.proves_whole(&manifest_digest(item)?),
        };
        if !proven {
            return Err(mismatch(format!(
                "the store's checksum ({c}) after upload does not prove the bytes sent"
            )));
        }
    }
    // Quoted or not, as the answer spelled it.
    if let (Some(sent), Some(now)) = (version, h.etag.as_deref())
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
    read_into(path, off, len, Vec::new()).map(Bytes::from)
}

/// `len` bytes of `path` from `off` in `buf` (its old content dropped; a
/// short file is an error), read into spare capacity never zeroed first
/// (the read fills it).
fn read_into(path: &Path, off: u64, len: u64, mut buf: Vec<u8>) -> Result<Vec<u8>> {
    let io = |e| PipelineError::io("read", path, e);
    let mut file = open_regular(path, Links::Refuse)
        .map_err(|e| PipelineError::io("open", path, std::io::Error::other(e)))?;
    let want = usize::try_from(len).map_err(|_| io(std::io::Error::other("part too large")))?;
    buf.clear();
    buf.reserve_exact(want);
    file.seek(SeekFrom::Start(off)).map_err(io)?;
    file.take(len).read_to_end(&mut buf).map_err(io)?;
    if buf.len() != want {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{} bytes at offset {off}, expected {len}", buf.len()),
        )));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;

    /// A part's bytes come from a pooled buffer that goes back to the pool
    /// only once the last `Bytes` of it is dropped, and is reused (its old
    /// bytes gone) for the next part; a part past the end of the file is
    /// an error naming the offset and what was found, never a short part.
    #[test]
    fn part_buffers_are_reused_and_a_short_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        std::fs::write(&path, &data).unwrap();
        let pool = BufferPool::default();

        let read = |off: u64, len: u64| {
            let buf = read_into(&path, off, len, pool.take()).unwrap();
            Bytes::from_owner(Pooled {
                buf,
                pool: pool.clone(),
            })
        };
        let first = read(0, 4096);
        assert_eq!(&first[..], &data[..4096]);
        let held = first.slice(10..20);
        drop(first);
        assert!(pool.0.lock().unwrap().is_empty(), "given back while held");
        drop(held);
        assert_eq!(pool.0.lock().unwrap().len(), 1);
        let reused_at = pool.0.lock().unwrap()[0].as_ptr();

        let second = read(8192, 1808);
        assert_eq!(&second[..], &data[8192..]);
        assert_eq!(second.as_ptr(), reused_at, "a new buffer, not the pool's");
        assert!(pool.0.lock().unwrap().is_empty());
        drop(second);

        let err = read_into(&path, 8192, 4096, pool.take()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("1808 bytes at offset 8192, expected 4096"),
            "{text}"
        );
    }

    #[test]
    fn whole_files_in_flight_fit_in_memory_and_never_pass_the_users_concurrency() {
        // The chosen 8 MiB part: up to 8 small files at once.
        let small = [1, 4 * MIB, 8 * MIB];
        assert_eq!(whole_files_in_flight(None, small.into_iter()), 8);
        assert_eq!(whole_files_in_flight(None, std::iter::empty()), 8);
        // A given part size of 100 MiB: two such puts fit in 256 MiB.
        assert_eq!(whole_files_in_flight(None, [100 * MIB, 1].into_iter()), 2);
        // Larger than the memory bound alone: one at a time.
        assert_eq!(whole_files_in_flight(None, [GIB].into_iter()), 1);
        // The user's --concurrency wins below the bound, never above it.
        assert_eq!(whole_files_in_flight(Some(1), small.into_iter()), 1);
        assert_eq!(whole_files_in_flight(Some(3), small.into_iter()), 3);
        assert_eq!(whole_files_in_flight(Some(64), small.into_iter()), 8);
        assert_eq!(whole_files_in_flight(Some(64), [GIB].into_iter()), 1);
    }
}
