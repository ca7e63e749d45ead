//! `pull s3://BUCKET/PREFIX --out DIR`: a published artifact onto this
//! machine, through the fetch machinery.
//!
//! The manifest is read first (bounded by [`MAX_MANIFEST_BYTES`]) and
//! checked before anything else is asked: it parses (an error names its
//! JSON path), its fingerprint is the one its contents imply, every
//! component path is a safe relative path, every SHA-256 is 64 hex
//! digits. The components then become the pin's listing (path, size,
//! SHA-256) and [`ftpipe_fetch::fetch`] downloads them into `DIR/artifact`
//! from an `S3Source` with every guarantee of a hub fetch: durable
//! watermarks, Range resume under `If-Match` on the ETag, parallel ranges
//! for large objects, the digest before the publish, the ledger, attempts,
//! discards and receipts. `placement.json` and then `manifest.json` (the
//! bytes read from the store, unchanged) are written last, and the
//! artifact is verified as `ftpipe verify` would.
//!
//! Read-only on the store: any number of machines may pull one prefix at
//! once.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use serde::Serialize;
use tokio::task::block_in_place;

use ftpipe_artifact::manifest::{
    MANIFEST_FILE, MANIFEST_SCHEMA, Manifest, PLACEMENT_FILE, Placement, sha256_hex,
};
use ftpipe_artifact::verify::{
    MAX_ARTIFACT_ENTRIES, MAX_MANIFEST_BYTES, MAX_PLACEMENT_BYTES, verify_artifact,
    verify_artifact_with_manifest,
};
use ftpipe_fetch::{ByteSource, FetchCtx, FetchOptions, fetch, reconcile};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::{remove_temp_files, write_atomic};
use ftpipe_fs::paths::validate_repo_path;
use ftpipe_objstore::{S3, S3Config, S3Location};
use ftpipe_progress::Reporter;
use ftpipe_receipts::{FileRow, Pin, Stage};

use crate::Pipeline;
use crate::error::{PipelineError, Result};
use crate::s3source::{S3Object, S3Source};

/// `HEAD` requests in flight at once while listing the objects.
const HEADS_IN_FLIGHT: usize = 16;

/// What `pull` needs from the command line.
#[derive(Debug, Clone)]
pub struct PullParams {
    /// Where the artifact is published.
    pub location: S3Location,
    /// Credentials, region, endpoint.
    pub config: S3Config,
    /// Transfer tunables (as `fetch`).
    pub options: FetchOptions,
}

/// What a pull did.
#[derive(Debug, Clone, Serialize)]
pub struct PullOutcome {
    /// `s3://BUCKET/PREFIX`.
    pub source: String,
    /// The artifact's fingerprint.
    pub fingerprint: String,
    /// SHA-256 of `manifest.json`.
    pub manifest_sha256: String,
    /// Components.
    pub components: usize,
    /// Bytes of all components.
    pub bytes: u64,
    /// Everything was already here and verified: no object was read.
    pub already_pulled: bool,
}

/// Whether a pin is a pull's (its repo is an `s3://` location).
pub fn is_pull_pin(pin: &Pin) -> bool {
    is_pull_repo(&pin.repo)
}

/// Whether a pinned repo is a pull's: an `s3://` location or an `oci://`
/// reference.
pub fn is_pull_repo(repo: &str) -> bool {
    repo.starts_with("s3://") || repo.starts_with(ftpipe_objstore::OCI_SCHEME)
}

/// Parses and checks a manifest read from `key` (see the module doc).
pub fn parse_remote_manifest(key: &str, bytes: &[u8]) -> Result<Manifest> {
    let bad = |at: String, message: String| PipelineError::BadRemoteManifest {
        key: key.to_owned(),
        at,
        message,
    };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let manifest: Manifest = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        bad(
            at,
            format!("expected an ftpipe manifest: {}", e.into_inner()),
        )
    })?;
    if manifest.schema != MANIFEST_SCHEMA {
        return Err(bad(
            "schema".into(),
            format!(
                "{:?}, expected {MANIFEST_SCHEMA:?} (a manifest whose fingerprint covers all of \
                 it; publish the artifact again with this ftpipe after `ftpipe convert` rewrote \
                 its manifest)",
                manifest.schema
            ),
        ));
    }
    if manifest.components.len() > MAX_ARTIFACT_ENTRIES {
        return Err(bad(
            "components".into(),
            format!(
                "{} components; at most {MAX_ARTIFACT_ENTRIES}",
                manifest.components.len()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for (i, c) in manifest.components.iter().enumerate() {
        let at = |field: &str| format!("components[{i}].{field}");
        validate_repo_path(&c.path).map_err(|e| {
            bad(
                at("path"),
                format!("{e}; expected a relative path inside the artifact"),
            )
        })?;
        if c.path == MANIFEST_FILE || c.path == PLACEMENT_FILE {
            return Err(bad(at("path"), format!("{:?} is reserved", c.path)));
        }
        if !seen.insert(c.path.as_str()) {
            return Err(bad(at("path"), format!("{:?} listed twice", c.path)));
        }
        if c.sha256.len() != 64
            || !c
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad(
                at("sha256"),
                format!("{:?}: expected 64 lowercase hex digits", c.sha256),
            ));
        }
        total = total
            .checked_add(c.size)
            .ok_or_else(|| bad(at("size"), "the sizes add up past 2^64".into()))?;
    }
    let implied = manifest.compute_fingerprint()?;
    if implied != manifest.fingerprint {
        return Err(bad(
            "fingerprint".into(),
            format!(
                "{} is not the fingerprint its contents imply ({implied})",
                manifest.fingerprint
            ),
        ));
    }
    Ok(manifest)
}

/// The manifest as read from the store: parsed and checked, its bytes
/// (written unchanged at the end) and where it was read from.
struct RemoteManifest {
    manifest: Manifest,
    bytes: bytes::Bytes,
}

/// Reads and checks `PREFIX/manifest.json` (see the module doc).
async fn read_manifest(s3: &S3, location: &S3Location) -> Result<RemoteManifest> {
    let key = location.key(MANIFEST_FILE);
    let url = location.url_of(&key);
    let body = s3
        .get_bounded(&key, MAX_MANIFEST_BYTES)
        .await?
        .ok_or_else(|| PipelineError::NothingPublished {
            dest: location.to_string(),
            key: url.clone(),
        })?;
    let manifest = parse_remote_manifest(&url, &body.bytes)?;
    Ok(RemoteManifest {
        manifest,
        bytes: body.bytes,
    })
}

/// A pull's pin: the table holds a 40-hex commit, so a pull's is the start
/// of the fingerprint, whole in `revision`.
fn pull_pin(p: &PullParams, s3: &S3, fingerprint: &str) -> Pin {
    Pin {
        repo: p.location.to_string(),
        revision: fingerprint.to_owned(),
        commit: fingerprint.get(..40).unwrap_or(fingerprint).to_owned(),
        endpoint: p
            .config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://{}", s3.host())),
    }
}

/// The manifest's components as the pin's listing (SHA-256 as the LFS
/// identity).
pub(crate) fn component_rows(manifest: &Manifest) -> Vec<FileRow> {
    manifest
        .components
        .iter()
        .map(|c| FileRow {
            path: c.path.clone(),
            size: c.size,
            git_oid: String::new(),
            lfs_sha256: Some(c.sha256.clone()),
            xet_hash: None,
            selected: true,
        })
        .collect()
}

impl Pipeline {
    /// Pulls the artifact published at `p.location` into `DIR/artifact`
    /// (see the module doc).
    pub async fn pull(&self, p: &PullParams, reporter: Arc<dyn Reporter>) -> Result<PullOutcome> {
        self.report_phases_to(&reporter);
        let s3 = S3::open(&p.config, p.location.clone())?;
        let remote = read_manifest(&s3, &p.location).await?;
        let manifest = &remote.manifest;
        let fingerprint = manifest.fingerprint.clone();
        let mut outcome = PullOutcome {
            source: p.location.to_string(),
            fingerprint: fingerprint.clone(),
            manifest_sha256: sha256_hex(&remote.bytes),
            components: manifest.components.len(),
            bytes: manifest.components.iter().map(|c| c.size).sum(),
            already_pulled: false,
        };
        let pin = pull_pin(p, &s3, &fingerprint);
        let ours = format!("{} at {fingerprint}", pin.repo);
        if let Some(old) = self.store.pin().await?
            && (old.repo != pin.repo || old.revision != pin.revision)
        {
            return Err(PipelineError::PullConflict {
                dir: self.layout.dir().to_owned(),
                theirs: format!("{} at {}", old.repo, old.revision),
                ours,
            });
        }
        if self.already_pulled(&remote.bytes, ours).await? {
            outcome.already_pulled = true;
            return Ok(outcome);
        }
        let keys = p.location.artifact(&fingerprint);
        let (files, objects) = self
            .stage(Stage::Resolve, async {
                let objects = list_objects(&s3, &keys, manifest).await?;
                let files = component_rows(manifest);
                self.store.save_pin(&pin, &files).await?;
                Ok((files, objects))
            })
            .await?;
        let reads = S3::open_for_transfers(&p.config, p.location.clone())?;
        let source: Arc<dyn ByteSource> = Arc::new(S3Source::new(reads, objects));
        self.pull_fetch_stage(source, pin, p.options.clone(), &files, reporter)
            .await?;
        crashpoint::hit(CrashPoint::PullComponentsDone);
        self.pull_verify_stage(&s3, p, &keys, &fingerprint, &remote.bytes)
            .await?;
        Ok(outcome)
    }

    /// Whether the artifact is here already: the same manifest bytes and
    /// an artifact that verifies. Another artifact's manifest in a
    /// directory without a pin is a conflict with `ours`.
    pub(crate) async fn already_pulled(&self, manifest: &[u8], ours: String) -> Result<bool> {
        let artifact = self.layout.artifact().to_owned();
        let local_manifest = artifact.join(MANIFEST_FILE);
        let Ok(local) = block_in_place(|| {
            ftpipe_fs::bounded::read_bounded_nofollow(&local_manifest, MAX_MANIFEST_BYTES)
        }) else {
            return Ok(false);
        };
        if local == manifest {
            let report = block_in_place(|| verify_artifact(&artifact, false))?;
            return Ok(report.ok);
        }
        if self.store.pin().await?.is_none() {
            let theirs = serde_json::from_slice::<serde_json::Value>(&local)
                .ok()
                .and_then(|v| {
                    v.get("fingerprint")
                        .and_then(|f| f.as_str())
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "an unreadable manifest".into());
            return Err(PipelineError::PullConflict {
                dir: self.layout.dir().to_owned(),
                theirs: format!("artifact {theirs}"),
                ours,
            });
        }
        Ok(false)
    }

    /// The fetch stage of a pull: the components into `DIR/artifact`
    /// through the fetch machinery, from `source`.
    pub(crate) async fn pull_fetch_stage(
        &self,
        source: Arc<dyn ByteSource>,
        pin: Pin,
        options: FetchOptions,
        files: &[FileRow],
        reporter: Arc<dyn Reporter>,
    ) -> Result<()> {
        let artifact = self.layout.artifact().to_owned();
        self.stage(Stage::Fetch, async {
            ftpipe_fs::durable::create_dirs_durably(self.layout.dir(), &artifact)
                .map_err(|e| PipelineError::io("create", &artifact, e))?;
            reconcile(&self.store, self.run, &artifact, files, reporter.as_ref()).await?;
            let ctx = Arc::new(FetchCtx::with_source(
                source,
                self.store.clone(),
                self.run,
                pin,
                reporter.clone(),
                options,
                self.layout.clone(),
                artifact.clone(),
            ));
            fetch(ctx, files).await?;
            Ok(())
        })
        .await
    }

    /// The verify stage of a pull: the placement read, checked and written,
    /// the artifact verified as `ftpipe verify` would under the manifest's
    /// bytes (read from the store, unchanged), and only then the manifest
    /// written: a rejected artifact never gets a `manifest.json`.
    async fn pull_verify_stage(
        &self,
        s3: &S3,
        p: &PullParams,
        keys: &ftpipe_objstore::ArtifactKeys,
        fingerprint: &str,
        manifest: &[u8],
    ) -> Result<()> {
        let placement_key = keys.file(PLACEMENT_FILE);
        let placement_url = p.location.url_of(&placement_key);
        let placement = async {
            s3.get_bounded(&placement_key, MAX_PLACEMENT_BYTES)
                .await?
                .map(|b| b.bytes)
                .ok_or_else(|| PipelineError::ObjectMismatch {
                    key: placement_url.clone(),
                    what: "missing; the manifest's artifact has a placement".into(),
                })
        };
        self.verify_pulled(&placement_url, placement, fingerprint, manifest)
            .await
    }

    /// The verify stage of a pull: `placement` (read from `placement_url`
    /// within the stage) checked and written, the artifact verified as
    /// `ftpipe verify` would under the manifest's bytes (read from the
    /// source, unchanged), and only then the manifest written: a rejected
    /// artifact never gets a `manifest.json`.
    pub(crate) async fn verify_pulled(
        &self,
        placement_url: &str,
        placement: impl Future<Output = Result<bytes::Bytes>>,
        fingerprint: &str,
        manifest: &[u8],
    ) -> Result<()> {
        let artifact = self.layout.artifact().to_owned();
        self.stage(Stage::Verify, async {
            let placement = placement.await?;
            check_placement(placement_url, &placement, fingerprint)?;
            // A pull killed while writing `placement.json` or
            // `manifest.json` left its temp file; every component is
            // durable by now and this pull holds DIR's lock, so any temp
            // file in the artifact is stale (verify would refuse it).
            block_in_place(|| remove_temp_files(&artifact))?;
            block_in_place(|| write_atomic(&artifact, PLACEMENT_FILE, &placement))?;
            // `manifest.json` is what a runtime waits for: it reaches its
            // final name only once the artifact it describes has passed.
            let report =
                block_in_place(|| verify_artifact_with_manifest(&artifact, manifest, false))?;
            if !report.ok {
                return Err(PipelineError::VerifyFailed {
                    artifact: artifact.clone(),
                    problems: crate::verify_problems(&report),
                });
            }
            block_in_place(|| write_atomic(&artifact, MANIFEST_FILE, manifest))?;
            crashpoint::hit(CrashPoint::PullManifestWritten);
            Ok(())
        })
        .await
    }
}

/// `placement.json` as read from `url` must parse and be the placement of
/// the artifact `fingerprint`.
fn check_placement(url: &str, bytes: &[u8], fingerprint: &str) -> Result<()> {
    let parsed: Placement =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes))
            .map_err(|e| PipelineError::BadRemoteManifest {
                key: url.to_owned(),
                at: e.path().to_string(),
                message: format!("expected an ftpipe placement: {}", e.into_inner()),
            })?;
    if parsed.fingerprint != fingerprint {
        return Err(PipelineError::ObjectMismatch {
            key: url.to_owned(),
            what: format!(
                "placement of artifact {}, the manifest's is {fingerprint}",
                parsed.fingerprint
            ),
        });
    }
    Ok(())
}

/// Every component's object: it must exist with the manifest's size (a
/// truncated or grown object is refused naming its key), and have an ETag
/// (every later request is made under it).
async fn list_objects(
    s3: &S3,
    keys: &ftpipe_objstore::ArtifactKeys,
    manifest: &Manifest,
) -> Result<HashMap<String, S3Object>> {
    let wanted = manifest
        .components
        .iter()
        .map(|c| (c.path.clone(), c.size, keys.file(&c.path)))
        .collect();
    head_objects(s3, wanted, "the manifest").await
}

/// The objects of `wanted` (path, size, key), HEADS_IN_FLIGHT at a time:
/// each must exist with its size as `listed_in` gives it (a truncated or
/// replaced object is refused naming its key) and have an ETag (every
/// later request is made under it).
pub(crate) async fn head_objects(
    s3: &S3,
    wanted: Vec<(String, u64, String)>,
    listed_in: &str,
) -> Result<HashMap<String, S3Object>> {
    // Owned items: the futures are `Send` for any borrow of `s3`.
    let heads =
        futures_util::stream::iter(wanted.into_iter().map(|(path, size, key)| async move {
            let head = s3.head(&key).await;
            (path, size, key, head)
        }))
        .buffer_unordered(HEADS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let mut objects = HashMap::new();
    for (path, size, key, head) in heads {
        let url = s3.location().url_of(&key);
        let mismatch = |what: String| PipelineError::ObjectMismatch {
            key: url.clone(),
            what,
        };
        let head = head?
            .ok_or_else(|| mismatch(format!("missing; {listed_in} lists {path} ({size} bytes)")))?;
        if head.size != size {
            return Err(mismatch(format!(
                "{} bytes, {listed_in} says {size} for {path} (truncated or replaced; refusing it)",
                head.size
            )));
        }
        let etag = head
            .etag
            .ok_or_else(|| mismatch("no ETag: every read is made under If-Match on it".into()))?;
        objects.insert(path, S3Object { key, etag });
    }
    Ok(objects)
}
