//! A hub checkpoint mirrored into object storage, read back as the hub
//! would serve it: `ftpipe mirror DIR s3://BUCKET/PREFIX` writes the
//! mirror from a fetched `DIR`; `fetch`, `run` and `plan --remote` with
//! `--endpoint s3://BUCKET/PREFIX` read it.
//!
//! ```text
//! PREFIX/listing.json      the pin (repo, revision, commit) and every file with
//!                          its size, git blob id and LFS SHA-256: written last,
//!                          create-only (the commit point of the mirror)
//! PREFIX/<commit>/<path>   each file's bytes
//! ```
//!
//! The same pin and identity checks apply as with the hub: the listing
//! carries the identities the hub listed at the pinned commit, and the
//! fetch machinery verifies every byte against them before a file is
//! published, so a mirror whose bytes do not match its listing is refused
//! file by file (a digest mismatch naming the file). A run from a mirror
//! pins the same repo and commit with the same file identities as a run
//! from the hub, so it builds the same manifest.

use std::sync::Arc;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::task::block_in_place;

use ftpipe_artifact::manifest::sha256_hex;
use ftpipe_fetch::ByteSource;
use ftpipe_fs::paths::{safe_join, validate_repo_path};
use ftpipe_hub::HubError;
use ftpipe_hub::identity::{Expected, GitOid, LfsSha256, expected_identity, git_blob_and_sha256};
use ftpipe_hub::remote::RemoteFiles;
use ftpipe_hub::resolve::{ResolveRequest, Resolved};
use ftpipe_objstore::{GetRange, Put, S3, S3Config, S3Location, SharedTarget, artifact_file_key};
use ftpipe_progress::Reporter;
use ftpipe_receipts::{FileRow, Pin, PublicationOutcome, Store};

use crate::Pipeline;
use crate::error::{PipelineError, Result};
use crate::origin::{Origin, OriginFuture};
use crate::publish::{Ctx, Item, Tally, record, unreadable_commit_point, upload_all};
use crate::s3source::S3Source;

/// The listing's `schema`.
pub const MIRROR_SCHEMA: &str = "ftpipe-mirror/1";
/// Largest `listing.json` read (the hub's tree of a 1,000-file repo is a
/// few hundred KB).
pub const MAX_LISTING_BYTES: u64 = 64 * 1024 * 1024;
/// The listing's name under the prefix.
const LISTING_FILE: &str = "listing.json";

/// `PREFIX/listing.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Listing {
    schema: String,
    repo: String,
    revision: String,
    commit: String,
    files: Vec<ListedFile>,
}

/// One file of the listing, with the hub's identities.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedFile {
    path: String,
    size: u64,
    git_oid: String,
    lfs_sha256: Option<String>,
    #[serde(default)]
    xet_hash: Option<String>,
}

/// Where a mirror is and how to reach it.
#[derive(Debug, Clone)]
pub struct MirrorParams {
    /// `s3://BUCKET/PREFIX`.
    pub location: S3Location,
    /// Credentials, region, endpoint.
    pub config: S3Config,
}

/// What `mirror` did.
#[derive(Debug, Clone, Serialize)]
pub struct MirrorOutcome {
    /// `s3://BUCKET/PREFIX`.
    pub dest: String,
    /// Repository and pinned commit mirrored.
    pub repo: String,
    /// The pinned commit.
    pub commit: String,
    /// Files of the listing.
    pub files: usize,
    /// Files uploaded by this run.
    pub uploaded: usize,
    /// Files found at their key whose store checksum proved their bytes.
    pub reused: usize,
    /// Body bytes sent.
    pub bytes_sent: u64,
    /// The listing was already there: nothing was uploaded.
    pub already_mirrored: bool,
}

/// An open mirror.
pub struct Mirror {
    s3: S3,
    /// The client file bodies are read through (no retry of its own).
    reads: S3,
    location: S3Location,
}

fn bad_listing(key: &str, at: String, message: String) -> PipelineError {
    PipelineError::BadRemoteManifest {
        key: key.to_owned(),
        at,
        message,
    }
}

/// A listing's bytes (read from `url`), checked: schema, a 40-hex commit,
/// safe paths, well-formed identities (an error names the key and the JSON
/// path); with the files as listing rows.
fn parse_listing(url: &str, bytes: &[u8]) -> Result<(Listing, Vec<FileRow>)> {
    // Paths and hashes are stored and paths become file names: a listing
    // holding a credential this process sent is refused, never recorded.
    if ftpipe_hub::json_keys::holds_secret(bytes) {
        return Err(bad_listing(
            url,
            String::new(),
            "the listing holds a credential this process sent".into(),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let listing: Listing = serde_path_to_error::deserialize(de).map_err(|e| {
        bad_listing(
            url,
            e.path().to_string(),
            format!("expected an ftpipe mirror listing: {}", e.into_inner()),
        )
    })?;
    if listing.schema != MIRROR_SCHEMA {
        return Err(bad_listing(
            url,
            "schema".into(),
            format!("{:?}, expected {MIRROR_SCHEMA:?}", listing.schema),
        ));
    }
    if ftpipe_hub::identity::CommitId::parse(&listing.commit).is_none() {
        return Err(bad_listing(
            url,
            "commit".into(),
            format!("{:?}: expected 40 hex digits", listing.commit),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut rows = Vec::with_capacity(listing.files.len());
    for (i, f) in listing.files.iter().enumerate() {
        let at_path = || format!("files[{i}].path");
        validate_repo_path(&f.path).map_err(|e| bad_listing(url, at_path(), e.to_string()))?;
        if !seen.insert(f.path.as_str()) {
            return Err(bad_listing(
                url,
                at_path(),
                format!("{:?} listed twice", f.path),
            ));
        }
        rows.push(listed_row(url, i, f)?);
    }
    Ok((listing, rows))
}

/// File `i` of a listing read from `url`, its path already checked, as a
/// listing row: well-formed identities, else an error naming the field.
fn listed_row(url: &str, i: usize, f: &ListedFile) -> Result<FileRow> {
    let at = |field: &str| format!("files[{i}].{field}");
    if GitOid::parse(&f.git_oid).is_none() {
        return Err(bad_listing(
            url,
            at("git_oid"),
            "expected 40 hex digits".into(),
        ));
    }
    if let Some(sha) = &f.lfs_sha256
        && LfsSha256::parse(sha).is_none()
    {
        return Err(bad_listing(
            url,
            at("lfs_sha256"),
            "expected 64 hex digits".into(),
        ));
    }
    if let Some(x) = &f.xet_hash
        && ftpipe_hub::identity::XetHash::parse(x).is_none()
    {
        return Err(bad_listing(
            url,
            at("xet_hash"),
            "expected 64 hex digits".into(),
        ));
    }
    Ok(FileRow {
        path: f.path.clone(),
        size: f.size,
        git_oid: f.git_oid.to_ascii_lowercase(),
        lfs_sha256: f.lfs_sha256.as_ref().map(|s| s.to_ascii_lowercase()),
        xet_hash: f.xet_hash.clone(),
        selected: true,
    })
}

impl Mirror {
    /// A client for the mirror at `p.location` (no request yet).
    pub fn open(p: &MirrorParams) -> Result<Mirror> {
        Ok(Mirror {
            s3: S3::open(&p.config, p.location.clone())?,
            reads: S3::open_for_transfers(&p.config, p.location.clone())?,
            location: p.location.clone(),
        })
    }

    fn file_key(&self, commit: &str, path: &str) -> String {
        self.location.artifact(commit).file(path)
    }

    /// The listing, read bounded and checked ([`parse_listing`]).
    async fn read_listing(&self) -> Result<(Listing, Vec<FileRow>)> {
        let key = self.location.key(LISTING_FILE);
        let url = self.location.url_of(&key);
        let body = self
            .s3
            .get_bounded(&key, MAX_LISTING_BYTES)
            .await?
            .ok_or_else(|| PipelineError::NothingPublished {
                dest: self.location.to_string(),
                key: url.clone(),
            })?;
        parse_listing(&url, &body.bytes)
    }

    /// The listing of the mirror when it holds `repo` at `revision` (its
    /// revision name or its commit); an error naming both otherwise.
    pub(crate) async fn listing_for(
        &self,
        repo: &str,
        revision: &str,
    ) -> Result<(String, Vec<FileRow>)> {
        let (listing, rows) = self.read_listing().await?;
        if listing.repo != repo || (listing.revision != revision && listing.commit != revision) {
            return Err(PipelineError::PullConflict {
                dir: std::path::PathBuf::from(self.location.to_string()),
                theirs: format!("{}@{} = {}", listing.repo, listing.revision, listing.commit),
                ours: format!("{repo}@{revision}"),
            });
        }
        Ok((listing.commit, rows))
    }

    /// `resolve` from the mirror: the hub's pin rules
    /// ([`ftpipe_hub::resolve::pin_rules`]), the listing from
    /// `listing.json`, the selection applied and stored.
    async fn resolve_from_listing(
        &self,
        store: &Store,
        req: &ResolveRequest,
        reporter: &dyn Reporter,
    ) -> Result<Resolved> {
        let existing = ftpipe_hub::resolve::existing_pin(store, req).await?;
        let (commit, listed) = self.listing_for(&req.repo, &req.revision).await?;
        let (keep, branch_moved_to) =
            ftpipe_hub::resolve::pin_rules(existing.as_ref(), req, &commit, reporter)?;
        let (pin, files) = match existing {
            Some(pin) if keep => {
                let files = store.files().await?;
                (pin, files)
            }
            _ => (
                Pin {
                    repo: req.repo.clone(),
                    revision: req.revision.clone(),
                    commit,
                    endpoint: self.location.to_string(),
                },
                listed,
            ),
        };
        Ok(ftpipe_hub::resolve::save_resolved(store, req, pin, files, branch_moved_to).await?)
    }

    /// The byte source of `files` at `commit`: each object must exist with
    /// the listed size (else refused naming its key) and an ETag.
    async fn objects(&self, commit: &str, files: &[FileRow]) -> Result<S3Source> {
        let wanted = files
            .iter()
            .map(|f| (f.path.clone(), f.size, self.file_key(commit, &f.path)))
            .collect();
        let objects = crate::pull::head_objects(&self.s3, wanted, "the mirror's listing").await?;
        Ok(S3Source::new(self.reads.clone(), objects))
    }

    /// The planner's view of the mirror's files at `commit`.
    fn files<'a>(&'a self, commit: &'a str) -> MirrorFiles<'a> {
        MirrorFiles {
            mirror: self,
            commit,
        }
    }
}

impl Origin for Mirror {
    fn resolve<'a>(
        &'a self,
        store: &'a Store,
        req: &'a ResolveRequest,
        reporter: &'a dyn Reporter,
    ) -> OriginFuture<'a, Result<Resolved>> {
        Box::pin(self.resolve_from_listing(store, req, reporter))
    }

    fn listing<'a>(
        &'a self,
        repo: &'a str,
        revision: &'a str,
    ) -> OriginFuture<'a, Result<(String, Vec<FileRow>)>> {
        Box::pin(self.listing_for(repo, revision))
    }

    /// A mirror's listing is read afresh: it must still hold the repo.
    fn plan_reuses_stored_pin(&self) -> bool {
        false
    }

    fn byte_source<'a>(
        &'a self,
        pin: &'a Pin,
        todo: &'a [FileRow],
        _store: &'a Arc<Store>,
        _reuse: ftpipe_fetch::ChunkReuse,
    ) -> OriginFuture<'a, Result<Arc<dyn ByteSource>>> {
        Box::pin(async move {
            let source: Arc<dyn ByteSource> = Arc::new(self.objects(&pin.commit, todo).await?);
            Ok(source)
        })
    }

    fn read_whole<'a>(
        &'a self,
        pin: &'a Pin,
        path: &'a str,
        size: u64,
    ) -> OriginFuture<'a, Result<Vec<u8>, HubError>> {
        Box::pin(async move { self.files(&pin.commit).read_whole(path, size).await })
    }

    fn read_range<'a>(
        &'a self,
        pin: &'a Pin,
        path: &'a str,
        (first, last): (u64, u64),
        size: u64,
    ) -> OriginFuture<'a, Result<Vec<u8>, HubError>> {
        Box::pin(async move {
            self.files(&pin.commit)
                .read_range(path, first, last, size)
                .await
        })
    }
}

/// Reads of a mirror's files for the planner (headers only).
struct MirrorFiles<'a> {
    mirror: &'a Mirror,
    commit: &'a str,
}

impl MirrorFiles<'_> {
    fn err(&self, path: &str, e: impl std::fmt::Display) -> HubError {
        HubError::BadListing {
            path: path.to_owned(),
            problem: format!(
                "mirror object {}: {e}",
                self.mirror
                    .location
                    .url_of(&self.mirror.file_key(self.commit, path))
            ),
        }
    }

    async fn read(
        &self,
        path: &str,
        range: Option<GetRange>,
        want: u64,
        size: u64,
    ) -> Result<Vec<u8>, HubError> {
        let key = self.mirror.file_key(self.commit, path);
        let got = self
            .mirror
            .s3
            .get_range(&key, range, None)
            .await
            .map_err(|e| self.err(path, e))?
            .map_err(|_| self.err(path, "412 without If-Match"))?;
        if got.size != size {
            return Err(self.err(path, format!("{} bytes, the listing says {size}", got.size)));
        }
        let mut out = Vec::new();
        let mut body = got.body;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.err(path, e))?;
            if (out.len() + chunk.len()) as u64 > want {
                return Err(self.err(path, format!("more than the {want} bytes asked for")));
            }
            out.extend_from_slice(&chunk);
        }
        if out.len() as u64 != want {
            return Err(self.err(path, format!("{} bytes, {want} asked for", out.len())));
        }
        Ok(out)
    }
}

impl RemoteFiles for MirrorFiles<'_> {
    async fn read_whole(&self, path: &str, size: u64) -> Result<Vec<u8>, HubError> {
        self.read(path, None, size, size).await
    }

    async fn read_range(
        &self,
        path: &str,
        first: u64,
        last: u64,
        size: u64,
    ) -> Result<Vec<u8>, HubError> {
        let end = last.saturating_add(1);
        self.read(
            path,
            Some(GetRange::Bounded(first..end)),
            end.saturating_sub(first),
            size,
        )
        .await
    }
}

impl Pipeline {
    /// Mirrors the pinned, fully fetched `DIR/source` to the S3 location of
    /// `p` (see the module doc and [`Pipeline::mirror_to`]).
    pub async fn mirror(
        &self,
        p: &MirrorParams,
        part_size: Option<u64>,
        concurrency: Option<usize>,
    ) -> Result<MirrorOutcome> {
        let target: SharedTarget = Arc::new(S3::open(&p.config, p.location.clone())?);
        self.mirror_to(target, part_size, concurrency).await
    }

    /// Mirrors the pinned, fully fetched `DIR/source` to `target`: every
    /// file of the listing, re-hashed against its identity as it is read,
    /// then `listing.json` create-only. The same commit already there is a
    /// no-op; another is refused naming both.
    pub async fn mirror_to(
        &self,
        target: SharedTarget,
        part_size: Option<u64>,
        concurrency: Option<usize>,
    ) -> Result<MirrorOutcome> {
        let (pin, files) = self.fetched_listing().await?;
        let listing_bytes = listing_bytes(&pin, &files)?;
        let listing_sha = sha256_hex(&listing_bytes);
        let ctx = Ctx::new(target, self, part_size, concurrency);
        let mut outcome = MirrorOutcome {
            dest: ctx.dest.clone(),
            repo: pin.repo.clone(),
            commit: pin.commit.clone(),
            files: files.len(),
            uploaded: 0,
            reused: 0,
            bytes_sent: 0,
            already_mirrored: false,
        };
        if mirrored_here(&ctx, &pin).await? {
            outcome.already_mirrored = true;
            let already = PublicationOutcome::AlreadyPublished;
            record(&ctx, &pin.commit, &listing_sha, already).await?;
            return Ok(outcome);
        }
        let tally = self.mirror_files(&ctx, &pin.commit, &files).await?;
        (outcome.uploaded, outcome.reused) = (tally.uploaded, tally.reused);
        outcome.bytes_sent = tally.bytes_sent;
        let key = ctx.target.key(LISTING_FILE);
        let put = ctx.put_commit(&key, listing_bytes, &listing_sha).await?;
        if put == Put::Exists && !mirrored_here(&ctx, &pin).await? {
            return Err(unreadable_commit_point(&ctx, &key));
        }
        let published = PublicationOutcome::Published;
        record(&ctx, &pin.commit, &listing_sha, published).await?;
        Ok(outcome)
    }

    /// The pin and its whole listing, every file of which has a download
    /// receipt (a mirror holds the whole listing).
    async fn fetched_listing(&self) -> Result<(Pin, Vec<FileRow>)> {
        let pin = self
            .store
            .pin()
            .await?
            .ok_or_else(|| PipelineError::NotPinned {
                dir: self.layout.dir().to_owned(),
            })?;
        let files = self.store.files().await?;
        let receipts = self.store.receipts_by_path().await?;
        let missing: Vec<&str> = files
            .iter()
            .filter(|f| !receipts.contains_key(&f.path))
            .map(|f| f.path.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(PipelineError::InvalidInput {
                what: "mirror source",
                message: format!(
                    "{} holds {} of the {} files of {}@{}; not fetched: {} (a mirror holds the whole listing: fetch without --include/--exclude first)",
                    self.layout.dir().display(),
                    files.len().saturating_sub(missing.len()),
                    files.len(),
                    pin.repo,
                    pin.commit,
                    missing.join(", ")
                ),
            });
        }
        Ok((pin, files))
    }

    /// Uploads every file of `files` from `DIR/source` under `commit`, as
    /// publish does its files ([`upload_all`]).
    async fn mirror_files(&self, ctx: &Ctx, commit: &str, files: &[FileRow]) -> Result<Tally> {
        let source = self.layout.source().to_owned();
        let items = files
            .iter()
            .map(|f| {
                let key = ctx.target.key(&artifact_file_key(commit, &f.path));
                Ok((key, pinned_item(&source, f)?))
            })
            .collect::<Result<Vec<_>>>()?;
        upload_all(ctx, &source, items).await
    }
}

/// `listing.json` of `pin` and `files`, as it is written.
fn listing_bytes(pin: &Pin, files: &[FileRow]) -> Result<Vec<u8>> {
    let listing = Listing {
        schema: MIRROR_SCHEMA.to_owned(),
        repo: pin.repo.clone(),
        revision: pin.revision.clone(),
        commit: pin.commit.clone(),
        files: files
            .iter()
            .map(|f| ListedFile {
                path: f.path.clone(),
                size: f.size,
                git_oid: f.git_oid.clone(),
                lfs_sha256: f.lfs_sha256.clone(),
                xet_hash: f.xet_hash.clone(),
            })
            .collect(),
    };
    let mut bytes = serde_json::to_vec_pretty(&listing)
        .map_err(|e| PipelineError::internal_from("serializing the mirror listing", e))?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The upload of pinned file `f` under `source`, with its SHA-256: the
/// LFS one, or for a git-stored file the one read with its blob id, which
/// must be the pinned one (the bytes are the pinned ones, re-hashed).
fn pinned_item(source: &std::path::Path, f: &FileRow) -> Result<Item> {
    let path = safe_join(source, &f.path)?;
    let sha256 = match expected_identity(f)? {
        Expected::Sha256(s) => s.as_str().to_owned(),
        Expected::GitBlob(oid) => {
            let io = |e| PipelineError::io("hash", &path, e);
            let (got, sha256) =
                block_in_place(|| git_blob_and_sha256(&path, f.size)).map_err(io)?;
            if got != oid.as_str() {
                return Err(PipelineError::ObjectMismatch {
                    key: path.display().to_string(),
                    what: format!(
                        "git blob id {got}, the pin lists {} (changed since it was fetched)",
                        oid.as_str()
                    ),
                });
            }
            sha256
        }
    };
    Ok(Item {
        path: f.path.clone(),
        size: f.size,
        sha256,
    })
}

/// Whether the mirror at `ctx`'s target already holds this pin; an error
/// naming both when it holds another.
async fn mirrored_here(ctx: &Ctx, pin: &Pin) -> Result<bool> {
    let key = ctx.target.key(LISTING_FILE);
    let Some(body) = ctx.target.get_bounded(&key, MAX_LISTING_BYTES).await? else {
        return Ok(false);
    };
    let (listing, _) = parse_listing(&ctx.url(&key), &body.bytes)?;
    if listing.repo == pin.repo && listing.commit == pin.commit {
        return Ok(true);
    }
    Err(PipelineError::PrefixHoldsAnother {
        dest: ctx.dest.clone(),
        theirs: format!("{}@{}", listing.repo, listing.commit),
        ours: format!("{}@{}", pin.repo, pin.commit),
    })
}
