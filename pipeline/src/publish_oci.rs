//! `publish DIR oci://REGISTRY/REPOSITORY[:TAG]`: a verified artifact into
//! an OCI registry as a ModelPack artifact ([`crate::modelpack`]).
//!
//! Order, and what each step proves:
//!
//! 1. `DIR/artifact` is verified and its `manifest.json` read: every
//!    layer's digest is the manifest's SHA-256 (the file is hashed once
//!    more only as its bytes are sent, which the upload already does).
//! 2. The tag is asked for (`HEAD`): naming this artifact's manifest
//!    digest already, the publish is a no-op that sends no write request;
//!    naming another, it is refused unless `--force-tag`.
//! 3. Every blob not in the repository (`HEAD`) is uploaded through the
//!    output-target seam ([`ftpipe_objstore::OciTarget`]) with the
//!    machinery `s3://` uses ([`crate::publish::upload_file`]): a blob
//!    larger than the part size is a chunked upload whose location and
//!    acknowledged chunks are durable in `state.db` before the next chunk,
//!    so a killed publish resumes the session where the registry's last
//!    acknowledged location says (a session the registry forgot or
//!    cancelled is abandoned and one new upload sends the blob). The
//!    registry checks each blob's digest when it completes. With
//!    `--mount-from REPO` a blob the repository lacks (and has no upload
//!    in progress of) is first asked of the registry as a
//!    cross-repository mount: `201` links it without a byte sent (its
//!    receipt names the source repository, after a `HEAD` shows it here
//!    with its size); `202` is a session the registry opened instead,
//!    recorded as the blob's upload in progress and continued as any
//!    other.
//! 4. The config blob, then the manifest by digest, then the tag: until
//!    the tag is put, a puller of the tag finds the previous artifact or
//!    nothing; once it is, every blob it names is complete.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use ftpipe_artifact::manifest::{MANIFEST_FILE, sha256_hex};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_objstore::{
    Mount, OciReference, OciTarget, Pointer, PutMode, Registry, RegistryConfig, RepositoryName,
    SharedTarget,
};
use ftpipe_receipts::{FoundObject, PublicationOutcome, UploadOp, UploadRow, UploadState};

use crate::Pipeline;
use crate::error::{PipelineError, Result};
use crate::modelpack::{
    Descriptor, LayerFile, MODEL_CONFIG_MEDIA_TYPE, layer_of, model_config, model_manifest,
};
use crate::publish::{
    Ctx, Item, Tally, artifact_items, read_verified_manifest, record, row, session_part_size,
    upload_file,
};

/// What `publish` to a registry needs from the command line.
#[derive(Debug, Clone)]
pub struct OciPublishParams {
    /// `oci://REGISTRY/REPOSITORY:TAG`.
    pub reference: OciReference,
    /// How to reach the registry.
    pub config: RegistryConfig,
    /// Chunk size of uploads (`--part-size`; `None`: chosen per blob from
    /// its size, as for S3 parts, [`crate::part_plan`]); blobs up to it go
    /// in one request.
    pub part_size: Option<u64>,
    /// Move the tag when it names another artifact.
    pub force_tag: bool,
    /// A repository of the same registry to mount blobs from.
    pub mount_from: Option<RepositoryName>,
}

/// What a publish to a registry did.
#[derive(Debug, Clone, Serialize)]
pub struct OciPublishOutcome {
    /// `oci://REGISTRY/REPOSITORY:TAG`.
    pub dest: String,
    /// The artifact's fingerprint.
    pub fingerprint: String,
    /// The ModelPack manifest's digest (`sha256:HEX`).
    pub manifest_digest: String,
    /// SHA-256 of `manifest.json`.
    pub manifest_sha256: String,
    /// Blobs of the artifact (layers and config).
    pub objects: usize,
    /// Blobs uploaded by this run.
    pub uploaded: usize,
    /// Blobs the repository had: nothing sent.
    pub reused: usize,
    /// Blobs the registry mounted from `--mount-from`: nothing sent.
    pub mounted: usize,
    /// Bytes of the mounted blobs.
    pub mounted_bytes: u64,
    /// Body bytes this run sent.
    pub bytes_sent: u64,
    /// The tag already named this manifest: nothing was written.
    pub already_published: bool,
}

/// The ModelPack artifact of `DIR/artifact`, as it will be pushed.
struct Pack {
    fingerprint: String,
    manifest_sha256: String,
    files: Vec<LayerFile>,
    config: Vec<u8>,
    config_digest: String,
    manifest: Vec<u8>,
    manifest_digest: String,
}

impl Pipeline {
    /// Publishes `DIR/artifact` to the registry (see the module doc).
    pub async fn publish_oci(&self, p: &OciPublishParams) -> Result<OciPublishOutcome> {
        let Pointer::Tag(tag) = &p.reference.pointer else {
            return Err(PipelineError::InvalidInput {
                what: "destination",
                message: format!(
                    "{}: publish takes a tag (oci://REGISTRY/REPOSITORY:TAG); the digest is the manifest's",
                    p.reference
                ),
            });
        };
        let pack = self.pack()?;
        let oci = Arc::new(OciTarget::new(Registry::open(&p.reference, &p.config)?));
        let mut outcome = OciPublishOutcome {
            dest: p.reference.to_string(),
            fingerprint: pack.fingerprint.clone(),
            manifest_digest: pack.manifest_digest.clone(),
            manifest_sha256: pack.manifest_sha256.clone(),
            objects: unique_blobs(&pack.files).saturating_add(1),
            uploaded: 0,
            reused: 0,
            mounted: 0,
            mounted_bytes: 0,
            bytes_sent: 0,
            already_published: false,
        };
        let target: SharedTarget = oci.clone();
        let ctx = Ctx::new(target, self, p.part_size, 1);
        let registry = oci.registry();
        let key = format!("manifests/{tag}");
        let head = ctx
            .attempt(&key, UploadOp::Head, None, 0, registry.head_manifest(tag))
            .await?;
        match head {
            Some((theirs, _)) if theirs == pack.manifest_digest => {
                outcome.already_published = true;
                let done = PublicationOutcome::AlreadyPublished;
                record(&ctx, &pack.fingerprint, &pack.manifest_sha256, done).await?;
                return Ok(outcome);
            }
            Some((theirs, _)) if !p.force_tag => {
                return Err(PipelineError::TagHoldsAnother {
                    tag: p.reference.to_string(),
                    theirs,
                    ours: pack.manifest_digest,
                });
            }
            _ => {}
        }
        let from = p.mount_from.as_ref().map(|repository| Source {
            registry,
            repository,
        });
        let from = from.as_ref();
        let pushed = push_blobs(&ctx, self.layout.artifact(), &pack, from).await?;
        (outcome.uploaded, outcome.reused) = (pushed.tally.uploaded, pushed.tally.reused);
        outcome.bytes_sent = pushed.tally.bytes_sent;
        (outcome.mounted, outcome.mounted_bytes) = (pushed.mounted, pushed.mounted_bytes);
        crashpoint::hit(CrashPoint::PublishComponentsDone);
        push_manifest(&ctx, registry, &pack, tag).await?;
        let published = PublicationOutcome::Published;
        record(&ctx, &pack.fingerprint, &pack.manifest_sha256, published).await?;
        Ok(outcome)
    }

    /// The ModelPack artifact of the verified `DIR/artifact`.
    fn pack(&self) -> Result<Pack> {
        let artifact = self.layout.artifact();
        let (manifest, manifest_bytes) = read_verified_manifest(artifact)?;
        let manifest_sha256 = sha256_hex(&manifest_bytes);
        let mut files: Vec<LayerFile> = artifact_items(artifact, &manifest)?
            .into_iter()
            .map(|i| LayerFile {
                path: i.path,
                size: i.size,
                sha256: i.sha256,
            })
            .collect();
        files.push(LayerFile {
            path: MANIFEST_FILE.to_owned(),
            size: manifest_bytes.len() as u64,
            sha256: manifest_sha256.clone(),
        });
        let layers: Vec<Descriptor> = files.iter().map(layer_of).collect();
        let config = model_config(&manifest, &layers)?;
        let config_digest = format!("sha256:{}", sha256_hex(&config));
        let config_descriptor = Descriptor {
            media_type: MODEL_CONFIG_MEDIA_TYPE.to_owned(),
            digest: config_digest.clone(),
            size: config.len() as u64,
            annotations: Default::default(),
        };
        let oci = model_manifest(&manifest.fingerprint, config_descriptor, layers)?;
        Ok(Pack {
            fingerprint: manifest.fingerprint,
            manifest_sha256,
            files,
            manifest_digest: format!("sha256:{}", sha256_hex(&oci)),
            config,
            config_digest,
            manifest: oci,
        })
    }
}

/// Blobs among `files` (two files of the same bytes are one blob).
fn unique_blobs(files: &[LayerFile]) -> usize {
    files
        .iter()
        .map(|f| &f.sha256)
        .collect::<HashSet<_>>()
        .len()
}

/// Where blobs are mounted from: a repository of `registry`, the
/// registry published to.
struct Source<'a> {
    registry: &'a Registry,
    repository: &'a RepositoryName,
}

/// What pushing the blobs did: sent or reused, and mounted.
#[derive(Default)]
struct Pushed {
    tally: Tally,
    mounted: usize,
    mounted_bytes: u64,
}

impl Pushed {
    fn add_mounted(&mut self, size: u64) {
        self.mounted = self.mounted.saturating_add(1);
        self.mounted_bytes = self.mounted_bytes.saturating_add(size);
    }
}

/// Every layer's blob and the config blob, each skipped when the
/// repository has it, mounted from `from` when it can be.
async fn push_blobs(
    ctx: &Ctx,
    artifact: &std::path::Path,
    pack: &Pack,
    from: Option<&Source<'_>>,
) -> Result<Pushed> {
    let mut pushed = Pushed::default();
    let mut seen = HashSet::new();
    for file in &pack.files {
        if !seen.insert(file.sha256.as_str()) {
            continue;
        }
        let item = Item {
            path: file.path.clone(),
            size: file.size,
            sha256: file.sha256.clone(),
        };
        let key = ctx.target.key(&file.sha256);
        match mount(ctx, &key, &item, from).await? {
            Mounting::Mounted => {
                pushed.add_mounted(item.size);
                continue;
            }
            Mounting::Session { location, .. } => {
                record_session(ctx, &key, &item, location).await?;
            }
            Mounting::NotAsked => {}
        }
        pushed
            .tally
            .add(upload_file(ctx, artifact, &key, &item).await?);
        crashpoint::hit(CrashPoint::UploadVerified);
    }
    push_config(ctx, pack, from, &mut pushed).await?;
    Ok(pushed)
}

/// The config blob: reused, mounted, or put in one request.
async fn push_config(
    ctx: &Ctx,
    pack: &Pack,
    from: Option<&Source<'_>>,
    pushed: &mut Pushed,
) -> Result<()> {
    let key = pack.config_digest.clone();
    let size = pack.config.len() as u64;
    let sha256 = key.trim_start_matches("sha256:");
    let item = Item {
        path: "(ModelPack config)".to_owned(),
        size,
        sha256: sha256.to_owned(),
    };
    let bytes = Bytes::from(pack.config.clone());
    match mount(ctx, &key, &item, from).await? {
        Mounting::Mounted => {
            pushed.add_mounted(size);
            return Ok(());
        }
        // The config goes in the session the mount opened, in one `PUT`.
        Mounting::Session { registry, location } => {
            let put = registry.complete_upload(&location, &key, bytes);
            ctx.attempt(&key, UploadOp::Put, None, size, put).await?;
            pushed.tally.add(Some(size));
            return Ok(());
        }
        Mounting::NotAsked => {}
    }
    let there = ctx
        .attempt(&key, UploadOp::Head, None, 0, ctx.target.head(&key))
        .await?;
    if there.is_some() {
        pushed.tally.add(None);
    } else {
        let put = ctx.target.put(&key, bytes, sha256, PutMode::Replace);
        ctx.attempt(&key, UploadOp::Put, None, size, put).await?;
        pushed.tally.add(Some(size));
    }
    Ok(())
}

/// What asking for a mount came to.
enum Mounting<'a> {
    /// The registry linked the blob: nothing to send.
    Mounted,
    /// The registry answered `202`: the session it opened instead (its
    /// location), where the blob is to be sent.
    Session {
        registry: &'a Registry,
        location: String,
    },
    /// No mount asked: none requested, the repository has the blob, or an
    /// upload of it is in progress.
    NotAsked,
}

/// Asks the registry to mount `item`'s blob from `from` when the
/// repository lacks it and no upload of it is in progress. A mounted blob
/// is shown by a `HEAD` with `item`'s size, then its receipt (naming the
/// source repository) is written.
async fn mount<'a>(
    ctx: &Ctx,
    key: &str,
    item: &Item,
    from: Option<&Source<'a>>,
) -> Result<Mounting<'a>> {
    let Some(Source {
        registry,
        repository: from,
    }) = from
    else {
        return Ok(Mounting::NotAsked);
    };
    let url = ctx.url(key);
    if ctx
        .store
        .upload_in_progress(&ctx.dest, &url)
        .await?
        .is_some()
    {
        return Ok(Mounting::NotAsked);
    }
    let head = ctx.target.head(key);
    if ctx
        .attempt(key, UploadOp::Head, None, 0, head)
        .await?
        .is_some()
    {
        return Ok(Mounting::NotAsked);
    }
    let asked = registry.mount_blob(key, from);
    let location = match ctx
        .attempt(key, UploadOp::BeginUpload, None, 0, asked)
        .await?
    {
        Mount::Started(location) => return Ok(Mounting::Session { registry, location }),
        Mount::Mounted => ctx.url(key),
    };
    let head = ctx.target.head(key);
    let size = ctx.attempt(key, UploadOp::Head, None, 0, head).await?;
    let size = size.map(|h| h.size);
    if size != Some(item.size) {
        return Err(PipelineError::internal(format!(
            "{location}: the registry answered 201 to mounting it from {from}, then a HEAD \
             showed {size:?} bytes, expected {} ({})",
            item.size, item.path
        )));
    }
    let receipt = UploadRow {
        mounted_from: Some(from.to_string()),
        ..row(ctx, key, item, FoundObject::Nothing, 0, None, None)
    };
    ctx.store.put_verified_upload(ctx.run, &receipt).await?;
    Ok(Mounting::Mounted)
}

/// Records the session a mount opened instead as `item`'s upload in
/// progress (before any chunk), which [`upload_file`] then continues.
async fn record_session(ctx: &Ctx, key: &str, item: &Item, location: String) -> Result<()> {
    let part_size = session_part_size(ctx, item);
    let uploading = UploadRow {
        state: UploadState::Uploading,
        ..row(
            ctx,
            key,
            item,
            FoundObject::Nothing,
            part_size,
            Some(location),
            None,
        )
    };
    ctx.store.begin_upload(ctx.run, &uploading).await?;
    Ok(())
}

/// The manifest by digest, then the tag.
async fn push_manifest(ctx: &Ctx, registry: &Registry, pack: &Pack, tag: &str) -> Result<()> {
    let bytes = Bytes::from(pack.manifest.clone());
    let size = bytes.len() as u64;
    let by_digest = registry.put_manifest(&pack.manifest_digest, bytes.clone());
    let key = format!("manifests/{}", pack.manifest_digest);
    ctx.attempt(&key, UploadOp::PutCommit, None, size, by_digest)
        .await?;
    crashpoint::hit(CrashPoint::PublishManifestPut);
    let key = format!("manifests/{tag}");
    let by_tag = registry.put_manifest(tag, bytes);
    ctx.attempt(&key, UploadOp::PutCommit, None, size, by_tag)
        .await?;
    Ok(())
}
