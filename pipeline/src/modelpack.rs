//! An ftpipe artifact as a CNCF ModelPack artifact (model-spec v1), and a
//! ModelPack manifest read back, checked before anything is fetched.
//!
//! Written: an OCI image manifest (`mediaType`
//! [`OCI_MANIFEST_MEDIA_TYPE`], `artifactType` [`MODEL_ARTIFACT_TYPE`])
//! whose config is a [`MODEL_CONFIG_MEDIA_TYPE`] blob holding only what the
//! spec's schema allows (`descriptor`, `config`, `modelfs` with `diffIds`
//! = the layers' digests), and one raw layer per file: every component
//! ([`WEIGHT_RAW`]), then `placement.json` and `manifest.json`
//! ([`WEIGHT_CONFIG_RAW`]); each layer's digest is the SHA-256 the verified
//! `manifest.json` gives (nothing is hashed again), its path in
//! [`FILEPATH_ANNOTATION`] and [`TITLE_ANNOTATION`]; the artifact's
//! fingerprint in [`FINGERPRINT_ANNOTATION`]. The bytes are a function of
//! the artifact alone (fixed field order, no timestamps): publishing the
//! same artifact twice gives the same manifest digest.
//!
//! Read: any manifest whose layers carry a path annotation (a peer's push
//! may use either annotation): every path must be a safe relative path,
//! none twice, every digest `sha256:` and 64 hex digits.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use ftpipe_artifact::manifest::{MANIFEST_FILE, Manifest, PLACEMENT_FILE};
use ftpipe_fs::paths::validate_repo_path;
use ftpipe_objstore::{OCI_MANIFEST_MEDIA_TYPE, is_sha256_digest};

use crate::error::{PipelineError, Result};

/// ModelPack's artifact type.
pub const MODEL_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// ModelPack's config media type.
pub const MODEL_CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.model.config.v1+json";
/// A weight file, unarchived.
pub const WEIGHT_RAW: &str = "application/vnd.cncf.model.weight.v1.raw";
/// A weight's configuration file, unarchived.
pub const WEIGHT_CONFIG_RAW: &str = "application/vnd.cncf.model.weight.config.v1.raw";
/// ModelPack's layer path annotation.
pub const FILEPATH_ANNOTATION: &str = "org.cncf.model.filepath";
/// The OCI title annotation (the file name peers such as `oras` write).
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// The artifact's fingerprint, on the manifest.
pub const FINGERPRINT_ANNOTATION: &str = "dev.ftpipe.artifact.fingerprint";
/// Most layers of a manifest read.
pub const MAX_LAYERS: usize = 100_000;

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Its media type.
    pub media_type: String,
    /// `sha256:HEX`.
    pub digest: String,
    /// Its size.
    pub size: u64,
    /// Its annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest (the fields ftpipe writes and reads).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciManifest {
    /// 2.
    pub schema_version: u32,
    /// [`OCI_MANIFEST_MEDIA_TYPE`].
    #[serde(default)]
    pub media_type: Option<String>,
    /// [`MODEL_ARTIFACT_TYPE`] for ModelPack.
    #[serde(default)]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The files.
    pub layers: Vec<Descriptor>,
    /// The manifest's annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// One file of a publish: its path, size and SHA-256 (hex).
#[derive(Debug, Clone)]
pub struct LayerFile {
    /// Path in the artifact.
    pub path: String,
    /// Size.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// The ModelPack config of `manifest` whose layers are `layers`: the
/// bytes of the config blob.
pub fn model_config(manifest: &Manifest, layers: &[Descriptor]) -> Result<Vec<u8>> {
    let config = serde_json::json!({
        "descriptor": {
            "name": manifest.source.repo,
            "revision": manifest.source.commit,
        },
        "config": {
            "format": "ftw",
            "quantization": manifest.converter.profile,
        },
        "modelfs": {
            "type": "layers",
            "diffIds": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>(),
        },
    });
    serde_json::to_vec(&config).map_err(|e| PipelineError::internal_from("ModelPack config", e))
}

/// The layer of `file`: a component is a weight, `manifest.json` and
/// `placement.json` are its configuration.
pub fn layer_of(file: &LayerFile) -> Descriptor {
    let media_type = if file.path == MANIFEST_FILE || file.path == PLACEMENT_FILE {
        WEIGHT_CONFIG_RAW
    } else {
        WEIGHT_RAW
    };
    Descriptor {
        media_type: media_type.to_owned(),
        digest: format!("sha256:{}", file.sha256),
        size: file.size,
        annotations: BTreeMap::from([
            (FILEPATH_ANNOTATION.to_owned(), file.path.clone()),
            (TITLE_ANNOTATION.to_owned(), file.path.clone()),
        ]),
    }
}

/// The manifest's bytes: `config` (its bytes' descriptor) and `layers`.
pub fn model_manifest(
    fingerprint: &str,
    config: Descriptor,
    layers: Vec<Descriptor>,
) -> Result<Vec<u8>> {
    let manifest = OciManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_owned()),
        artifact_type: Some(MODEL_ARTIFACT_TYPE.to_owned()),
        config,
        layers,
        annotations: BTreeMap::from([(FINGERPRINT_ANNOTATION.to_owned(), fingerprint.to_owned())]),
    };
    serde_json::to_vec(&manifest).map_err(|e| PipelineError::internal_from("ModelPack manifest", e))
}

/// A layer's path and blob, as a pull takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledLayer {
    /// Its path in the artifact.
    pub path: String,
    /// `sha256:HEX`.
    pub digest: String,
    /// Its size.
    pub size: u64,
}

/// Parses and checks a manifest read from `url` (see the module doc); its
/// layers by path.
pub fn parse_model_manifest(url: &str, bytes: &[u8]) -> Result<Vec<PulledLayer>> {
    let bad = |at: String, message: String| PipelineError::BadRemoteManifest {
        key: url.to_owned(),
        at,
        message,
    };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let manifest: OciManifest = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        bad(
            at,
            format!("expected an OCI image manifest: {}", e.into_inner()),
        )
    })?;
    if manifest.schema_version != 2 {
        return Err(bad(
            "schemaVersion".into(),
            format!("{}, expected 2", manifest.schema_version),
        ));
    }
    if manifest.layers.len() > MAX_LAYERS {
        return Err(bad(
            "layers".into(),
            format!("{} layers; at most {MAX_LAYERS}", manifest.layers.len()),
        ));
    }
    let mut seen = HashSet::new();
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (i, l) in manifest.layers.iter().enumerate() {
        let at = |field: &str| format!("layers[{i}].{field}");
        let path = l
            .annotations
            .get(FILEPATH_ANNOTATION)
            .or_else(|| l.annotations.get(TITLE_ANNOTATION))
            .ok_or_else(|| {
                bad(
                    at("annotations"),
                    format!("no {FILEPATH_ANNOTATION:?} (or {TITLE_ANNOTATION:?}): the layer's path is not known"),
                )
            })?;
        validate_repo_path(path).map_err(|e| {
            bad(
                at("annotations"),
                format!("path {path:?}: {e}; expected a relative path inside the artifact"),
            )
        })?;
        if !seen.insert(path.clone()) {
            return Err(bad(
                at("annotations"),
                format!("path {path:?} listed twice"),
            ));
        }
        if !is_sha256_digest(&l.digest) {
            return Err(bad(
                at("digest"),
                format!(
                    "{:?}: expected sha256: and 64 lowercase hex digits",
                    l.digest
                ),
            ));
        }
        layers.push(PulledLayer {
            path: path.clone(),
            digest: l.digest.clone(),
            size: l.size,
        });
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_with(paths: &[&str]) -> Vec<u8> {
        let layers: Vec<Descriptor> = paths
            .iter()
            .map(|p| {
                layer_of(&LayerFile {
                    path: (*p).to_owned(),
                    size: 1,
                    sha256: "a".repeat(64),
                })
            })
            .collect();
        let config = Descriptor {
            media_type: MODEL_CONFIG_MEDIA_TYPE.into(),
            digest: format!("sha256:{}", "b".repeat(64)),
            size: 2,
            annotations: BTreeMap::new(),
        };
        model_manifest("fp", config, layers).unwrap()
    }

    #[test]
    fn round_trips_and_refuses_bad_paths() {
        let ok = parse_model_manifest("u", &manifest_with(&["a.ftw", "manifest.json"])).unwrap();
        assert_eq!(ok.len(), 2);
        for bad in [&["../x"][..], &["/etc/passwd"], &["a", "a"]] {
            let e = parse_model_manifest("u", &manifest_with(bad)).unwrap_err();
            assert!(e.to_string().contains("layers["), "{e}");
        }
    }
}
