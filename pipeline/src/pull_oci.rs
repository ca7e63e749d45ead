//! `pull oci://REGISTRY/REPOSITORY:TAG|@sha256:HEX --out DIR`: a ModelPack
//! artifact from a registry onto this machine, through the fetch
//! machinery.
//!
//! The tag is resolved to a manifest digest and pinned (the pin's
//! revision, as a hub revision is pinned to a commit): a re-run reads the
//! manifest by that digest, and a tag that names another manifest since is
//! refused unless `--repin`. The manifest is read within
//! [`ftpipe_objstore::MAX_OCI_MANIFEST_BYTES`] and checked before anything else is asked
//! ([`crate::modelpack::parse_model_manifest`]: safe, distinct layer
//! paths, sha256 digests, a `manifest.json` and a `placement.json`
//! layer). Its `manifest.json` layer is read (bounded,
//! its bytes' SHA-256 must be its digest) and checked as a pull from S3
//! checks it ([`crate::parse_remote_manifest`]); every component must be
//! a layer whose digest is the component's SHA-256 and whose size is its
//! size, and every layer must be a file of the artifact. The components
//! are then fetched by [`ftpipe_fetch::fetch`] from an
//! [`OciSource`](crate::ocisource::OciSource) with every guarantee of a
//! hub fetch (durable watermarks, Range resume, the digest before the
//! final name, the ledger, attempts, discards, receipts); `placement.json`
//! and `manifest.json` are written last, after the artifact verified.

use std::collections::HashMap;
use std::sync::Arc;

use ftpipe_artifact::manifest::{MANIFEST_FILE, Manifest, PLACEMENT_FILE, sha256_hex};
use ftpipe_artifact::verify::{MAX_MANIFEST_BYTES, MAX_PLACEMENT_BYTES};
use ftpipe_fetch::{ByteSource, FetchOptions};
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_objstore::{OciReference, Pointer, Registry, RegistryConfig};
use ftpipe_progress::Reporter;
use ftpipe_receipts::{Pin, Stage};

use crate::Pipeline;
use crate::error::{PipelineError, Result};
use crate::modelpack::{PulledLayer, parse_model_manifest};
use crate::ocisource::OciSource;
use crate::pull::{PullOutcome, component_rows, parse_remote_manifest};

/// What `pull` from a registry needs from the command line.
#[derive(Debug, Clone)]
pub struct OciPullParams {
    /// `oci://REGISTRY/REPOSITORY:TAG` or `@sha256:HEX`.
    pub reference: OciReference,
    /// How to reach the registry.
    pub config: RegistryConfig,
    /// Transfer tunables (as `fetch`).
    pub options: FetchOptions,
    /// Start over from what the tag names now when it moved.
    pub repin: bool,
}

/// The pulled artifact as the registry describes it.
struct Remote {
    manifest: Manifest,
    manifest_bytes: bytes::Bytes,
    layers: HashMap<String, PulledLayer>,
}

impl Pipeline {
    /// Pulls the artifact `p.reference` names into `DIR/artifact` (see the
    /// module doc).
    pub async fn pull_oci(
        &self,
        p: &OciPullParams,
        reporter: Arc<dyn Reporter>,
    ) -> Result<PullOutcome> {
        self.report_phases_to(&reporter);
        let registry = Registry::open(&p.reference, &p.config)?;
        let digest = self.pinned_digest(&registry, p).await?;
        let remote = read_remote(&registry, &digest).await?;
        let manifest = &remote.manifest;
        let fingerprint = manifest.fingerprint.clone();
        let mut outcome = PullOutcome {
            source: p.reference.to_string(),
            fingerprint: fingerprint.clone(),
            manifest_sha256: sha256_hex(&remote.manifest_bytes),
            components: manifest.components.len(),
            bytes: manifest.components.iter().map(|c| c.size).sum(),
            already_pulled: false,
        };
        let pin = Pin {
            repo: p.reference.to_string(),
            revision: digest.clone(),
            commit: digest
                .trim_start_matches("sha256:")
                .chars()
                .take(40)
                .collect(),
            endpoint: format!(
                "{}://{}",
                if p.config.plain_http { "http" } else { "https" },
                p.reference.registry
            ),
        };
        let ours = format!("{} at {digest}", pin.repo);
        // DIR pinned to something else (a hub repo, another location or
        // reference) is not taken over; the same reference at another
        // digest only got here with `--repin`.
        if let Some(old) = self.store.pin().await?
            && old.repo != pin.repo
        {
            return Err(PipelineError::PullConflict {
                dir: self.layout.dir().to_owned(),
                theirs: format!("{} at {}", old.repo, old.revision),
                ours,
            });
        }
        if self.already_pulled(&remote.manifest_bytes, ours).await? {
            outcome.already_pulled = true;
            return Ok(outcome);
        }
        let files = component_rows(manifest);
        self.stage(Stage::Resolve, async {
            Ok(self.store.save_pin(&pin, &files).await?)
        })
        .await?;
        let digests = remote
            .layers
            .iter()
            .map(|(path, l)| (path.clone(), l.digest.clone()))
            .collect();
        let reads = Registry::open(&p.reference, &p.config)?;
        let source: Arc<dyn ByteSource> = Arc::new(OciSource::new(reads, digests));
        self.pull_fetch_stage(source, pin, p.options.clone(), &files, reporter)
            .await?;
        crashpoint::hit(CrashPoint::PullComponentsDone);
        let placement =
            remote
                .layers
                .get(PLACEMENT_FILE)
                .ok_or_else(|| PipelineError::BadRemoteManifest {
                    key: registry.blob_url(&digest),
                    at: "layers".into(),
                    message: format!("no {PLACEMENT_FILE} layer; an ftpipe artifact has one"),
                })?;
        let placement_url = registry.blob_url(&placement.digest);
        let read = read_layer(&registry, placement, MAX_PLACEMENT_BYTES);
        self.verify_pulled(&placement_url, read, &fingerprint, &remote.manifest_bytes)
            .await?;
        Ok(outcome)
    }

    /// The manifest digest this pull reads: the reference's own digest,
    /// the one this directory pinned (a moved tag is refused unless
    /// `--repin`), or what the tag names now.
    async fn pinned_digest(&self, registry: &Registry, p: &OciPullParams) -> Result<String> {
        let tag = match &p.reference.pointer {
            Pointer::Digest(d) => return Ok(d.clone()),
            Pointer::Tag(t) => t,
        };
        let now = registry
            .head_manifest(tag)
            .await?
            .map(|(d, _)| d)
            .ok_or_else(|| PipelineError::NothingPublished {
                dest: p.reference.repository_url(),
                key: p.reference.to_string(),
            })?;
        let pinned = self
            .store
            .pin()
            .await?
            .filter(|old| old.repo == p.reference.to_string())
            .map(|old| old.revision);
        match pinned {
            Some(pinned) if pinned != now && !p.repin => Err(PipelineError::TagMoved {
                tag: p.reference.to_string(),
                dir: self.layout.dir().to_owned(),
                pinned,
                now,
            }),
            _ => Ok(now),
        }
    }
}

/// The manifest `digest` and the ftpipe manifest it carries, checked (see
/// the module doc).
async fn read_remote(registry: &Registry, digest: &str) -> Result<Remote> {
    let url = registry.blob_url(digest);
    let fetched =
        registry
            .get_manifest(digest)
            .await?
            .ok_or_else(|| PipelineError::NothingPublished {
                dest: registry.reference().repository_url(),
                key: url.clone(),
            })?;
    if fetched.digest != digest {
        return Err(PipelineError::ObjectMismatch {
            key: url,
            what: format!("its bytes' digest is {}", fetched.digest),
        });
    }
    let layers: HashMap<String, PulledLayer> = parse_model_manifest(&url, &fetched.bytes)?
        .into_iter()
        .map(|l| (l.path.clone(), l))
        .collect();
    let bad = |at: &str, message: String| PipelineError::BadRemoteManifest {
        key: url.clone(),
        at: at.to_owned(),
        message,
    };
    let layer = layers.get(MANIFEST_FILE).ok_or_else(|| {
        bad(
            "layers",
            format!("no {MANIFEST_FILE} layer; an ftpipe artifact has one"),
        )
    })?;
    // Every file the artifact depends on is named before any blob is
    // read: a pull that could only fail after fetching every component
    // fails now.
    if !layers.contains_key(PLACEMENT_FILE) {
        return Err(bad(
            "layers",
            format!("no {PLACEMENT_FILE} layer; an ftpipe artifact has one"),
        ));
    }
    let manifest_bytes = read_layer(registry, layer, MAX_MANIFEST_BYTES).await?;
    let manifest = parse_remote_manifest(&registry.blob_url(&layer.digest), &manifest_bytes)?;
    for c in &manifest.components {
        let want = format!("sha256:{}", c.sha256);
        match layers.get(&c.path) {
            Some(l) if l.digest == want && l.size == c.size => {}
            Some(l) => {
                return Err(bad(
                    "layers",
                    format!(
                        "{}: layer {} of {} bytes, {MANIFEST_FILE} says {want} of {} bytes",
                        c.path, l.digest, l.size, c.size
                    ),
                ));
            }
            None => return Err(bad("layers", format!("no layer for component {}", c.path))),
        }
    }
    let known = manifest.components.len().saturating_add(2);
    if layers.len() != known {
        let extra: Vec<&str> = layers
            .keys()
            .map(String::as_str)
            .filter(|p| {
                *p != MANIFEST_FILE
                    && *p != PLACEMENT_FILE
                    && !manifest.components.iter().any(|c| c.path == *p)
            })
            .take(5)
            .collect();
        return Err(bad(
            "layers",
            format!("layers that are not files of the artifact: {extra:?} (refusing to drop them)"),
        ));
    }
    Ok(Remote {
        manifest,
        manifest_bytes,
        layers,
    })
}

/// A small layer's bytes, read within `max`; their SHA-256 must be its
/// digest.
async fn read_layer(registry: &Registry, layer: &PulledLayer, max: u64) -> Result<bytes::Bytes> {
    let url = registry.blob_url(&layer.digest);
    let bytes = registry
        .get_blob_bounded(&layer.digest, max)
        .await?
        .ok_or_else(|| PipelineError::ObjectMismatch {
            key: url.clone(),
            what: format!("missing; the manifest lists it as {}", layer.path),
        })?;
    let got = format!("sha256:{}", sha256_hex(&bytes));
    if got != layer.digest {
        return Err(PipelineError::ObjectMismatch {
            key: url,
            what: format!("its bytes' digest is {got} (refusing {})", layer.path),
        });
    }
    Ok(bytes)
}
