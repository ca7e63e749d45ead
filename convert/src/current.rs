//! Whether the artifact on disk is still exactly what the last conversion
//! recorded, for these options: the check that lets a finished `run` answer
//! "nothing to do" in well under a second without reading a component.

use std::path::Path;

use ftpipe_fs::Layout;
use ftpipe_receipts::{Pin, Store};

use crate::Result;
use crate::options::{ConvertOptions, converter_identity};
use crate::plan::read_config;
use ftpipe_artifact::manifest::{
    MANIFEST_FILE, MANIFEST_SCHEMA, Manifest, PLACEMENT_FILE, Placement, sha256_hex,
};

/// A current artifact, as its manifest describes it.
#[derive(Debug, Clone)]
pub struct CurrentArtifact {
    /// SHA-256 of manifest.json (the one the artifact log recorded last).
    pub manifest_sha256: String,
    /// The artifact fingerprint.
    pub fingerprint: String,
    /// Number of components.
    pub components: usize,
    /// Σ component sizes.
    pub bytes: u64,
}

/// `Some` when nothing is left to convert under `pin`: the manifest on disk
/// is the last one recorded and was made with these options (the whole
/// converter identity), every component has its recorded size, the
/// placement is current and, with `--retire-sources`, every shard is
/// retired. Reads only `config.json` of the sources and makes no request.
pub async fn current_artifact(
    store: &Store,
    layout: &Layout,
    pin: &Pin,
    opts: &ConvertOptions,
) -> Result<Option<CurrentArtifact>> {
    let Some(recorded) = store.last_manifest().await?.and_then(|a| a.manifest_sha256) else {
        return Ok(None);
    };
    let artifact = &layout.artifact();
    let Ok(bytes) = ftpipe_fs::bounded::read_bounded_nofollow(
        &artifact.join(MANIFEST_FILE),
        ftpipe_artifact::verify::MAX_MANIFEST_BYTES,
    ) else {
        return Ok(None);
    };
    if sha256_hex(&bytes) != recorded {
        return Ok(None);
    }
    let Ok(manifest) = serde_json::from_slice::<Manifest>(&bytes) else {
        return Ok(None);
    };
    // The whole converter identity (version, formats, profile, options). A
    // config that cannot be read is not current; the conversion reports it.
    let converter = read_config(layout.source())
        .and_then(|config| converter_identity(&config, opts))
        .ok();
    if converter.as_ref() != Some(&manifest.converter)
        || manifest.schema != MANIFEST_SCHEMA
        || manifest.source.commit != pin.commit
        || !all_sizes_match(artifact, &manifest)
        || !placement_current(artifact, &manifest, opts)
    {
        return Ok(None);
    }
    if opts.retire_sources {
        let retired = store.retired().await?;
        if manifest.source.files.iter().any(|f| {
            // Logged but still on disk (killed before the unlink)
            // is not retired yet: the conversion finishes it.
            f.path.ends_with(".safetensors")
                && (!retired.contains(&f.path) || layout.source().join(&f.path).exists())
        }) {
            return Ok(None);
        }
    }
    Ok(Some(CurrentArtifact {
        manifest_sha256: recorded,
        components: manifest.components.len(),
        bytes: manifest.components.iter().map(|c| c.size).sum(),
        fingerprint: manifest.fingerprint,
    }))
}

/// Sizes only: a no-op rerun must answer in under a second whatever the
/// artifact size; `ftpipe verify --deep` re-hashes every component.
fn all_sizes_match(artifact: &Path, m: &Manifest) -> bool {
    m.components.iter().all(|c| {
        std::fs::symlink_metadata(artifact.join(&c.path))
            .is_ok_and(|md| md.is_file() && md.len() == c.size)
    })
}

/// The placement on disk is for this manifest and these budgets.
fn placement_current(artifact: &Path, manifest: &Manifest, opts: &ConvertOptions) -> bool {
    ftpipe_fs::bounded::read_bounded_nofollow(
        &artifact.join(PLACEMENT_FILE),
        ftpipe_artifact::verify::MAX_PLACEMENT_BYTES,
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<Placement>(&b).ok())
    .is_some_and(|p| {
        p.ram_budget == opts.ram_budget && p.reserve == opts.reserve && p.check(manifest).is_ok()
    })
}
