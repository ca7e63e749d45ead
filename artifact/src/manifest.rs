//! The artifact's self-description: `manifest.json` (immutable, written
//! last) and `placement.json` (mutable, never part of the fingerprint).
//!
//! The fingerprint is the SHA-256 of the canonical JSON of
//! [`FingerprintInput`]: every field of the manifest but the fingerprint
//! itself (schema, source and converter identities, the components with
//! their layouts, the FTW descriptors, the tensor inventory with its
//! sources, the omitted tensors). Nothing in `manifest.json` can be edited
//! without changing it, provenance included. Canonical means compact
//! `serde_json` output of these typed structs (fields in declaration order,
//! maps sorted), so a reader that parses the manifest recomputes exactly the
//! same bytes. Schema 1 hashed only the identities and the component
//! digests; such a manifest is refused, naming how to rewrite it.
//! Nothing in the manifest depends on time, paths outside the artifact or
//! the machine: two runs over the same inputs write the same bytes.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use ftpipe_formats::TensorDesc;

use crate::ArtifactError;

/// File name of the manifest at the artifact root.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the placement beside it.
pub const PLACEMENT_FILE: &str = "placement.json";
/// Manifest schema this build writes and reads.
pub const MANIFEST_SCHEMA: &str = "ftpipe.manifest/2";
/// The schema before the fingerprint covered the whole manifest.
pub const MANIFEST_SCHEMA_V1: &str = "ftpipe.manifest/1";
/// Placement schema this build writes and reads.
pub const PLACEMENT_SCHEMA: &str = "ftpipe.placement/1";
/// Path of the FTW component (the always-resident stream).
pub const FTW_COMPONENT: &str = "model.ftw";

/// One source file the artifact was converted from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFileId {
    /// Repo-relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// `sha256` (LFS content) or `git-sha1` (git blob id).
    pub digest_kind: String,
    /// Hex digest verified at download.
    pub digest: String,
}

/// Where the artifact's bytes came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceIdentity {
    /// Repository id.
    pub repo: String,
    /// Pinned commit (40 hex).
    pub commit: String,
    /// Every file the conversion read (config, index, shards), by path.
    pub files: Vec<SourceFileId>,
}

/// Options that change the bytes written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvertOptionsId {
    /// Extra globs of tensors kept BF16 and marked protected (`--protect`).
    pub protect: Vec<String>,
    /// SHA-256 of the normalized TOML recipe (`--recipe`), if one was used
    /// (absent otherwise, so manifests without a recipe keep their bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
}

/// What made the artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConverterIdentity {
    /// ftpipe version.
    pub ftpipe: String,
    /// Every format and codec version.
    pub formats: BTreeMap<String, u32>,
    /// Profile name.
    pub profile: String,
    /// Options.
    pub options: ConvertOptionsId,
}

impl ConverterIdentity {
    /// The identity of this build with `profile` and `options`.
    pub fn current(profile: &str, options: ConvertOptionsId) -> ConverterIdentity {
        ConverterIdentity {
            // Every workspace crate has the workspace version.
            ftpipe: env!("CARGO_PKG_VERSION").to_owned(),
            formats: ftpipe_formats::FORMAT_VERSIONS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            profile: profile.to_owned(),
            options,
        }
    }
}

/// Layout details of one component, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ComponentLayout {
    /// The FTW v1 stream; its tensors are in [`Manifest::tensors`].
    Ftw {
        /// Number of tensors.
        tensors: u64,
    },
    /// One FTEXPERT1 sidecar.
    Ftexpert {
        /// MoE layer.
        layer: u64,
        /// Experts (records).
        experts: u64,
        /// Bytes per record.
        record_size: u64,
        /// Record fields in order.
        fields: Vec<TensorDesc>,
    },
    /// One Q3_PLE_32 segment `shard_{index}`.
    Q3Segment {
        /// PLE layer.
        layer: u64,
        /// Segment index.
        index: u64,
        /// Rows.
        rows: u64,
        /// Row width.
        width: u64,
    },
    /// The global scale of one PLE layer's table.
    Q3GlobalScale {
        /// PLE layer.
        layer: u64,
        /// Number of segments the scale covers.
        segments: u64,
    },
}

/// One component as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestComponent {
    /// Path relative to the artifact root.
    pub path: String,
    /// Size written.
    pub size: u64,
    /// Size predicted before writing (always equal to `size`).
    pub predicted_bytes: u64,
    /// SHA-256 of the file.
    pub sha256: String,
    /// Layout details.
    pub layout: ComponentLayout,
}

/// One tensor of the inventory. There is one per output tensor (~150k for
/// the NVFP4 export): the component and source names are shared, not
/// copied per entry; they serialize as plain strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryTensor {
    /// Component holding it.
    pub component: Arc<str>,
    /// Key in the component: the FTW key, `{expert}.{field}` in an
    /// FTEXPERT1 sidecar, `rows` for a Q3 segment, `scale` for a global scale.
    pub key: String,
    /// Source tensors it was made from.
    pub sources: Vec<Arc<str>>,
}

/// The manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`MANIFEST_SCHEMA`].
    pub schema: String,
    /// SHA-256 of the canonical [`FingerprintInput`].
    pub fingerprint: String,
    /// Source identity.
    pub source: SourceIdentity,
    /// Converter identity.
    pub converter: ConverterIdentity,
    /// Components, in plan order.
    pub components: Vec<ManifestComponent>,
    /// FTW tensor descriptors in index order.
    pub ftw_tensors: Vec<TensorDesc>,
    /// Where every output tensor came from.
    pub tensors: Vec<InventoryTensor>,
    /// Source tensors of other partitions (vision, MTP) left out of the
    /// artifact; part of the fingerprint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<OmittedEntry>,
}

/// A partition of a multimodal release: the text model is converted, the
/// others are left out and listed in [`Manifest::omitted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partition {
    /// The text model: converted.
    Text,
    /// `model.visual.*`: omitted.
    Vision,
    /// `mtp.*`: omitted.
    Mtp,
}

impl Partition {
    /// Label used in the manifest (`reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            Partition::Text => "text",
            Partition::Vision => "vision",
            Partition::Mtp => "mtp",
        }
    }
}

/// A source tensor the artifact leaves out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OmittedEntry {
    /// Source tensor name.
    pub tensor: String,
    /// Source file.
    pub file: String,
    /// Its partition: `vision` or `mtp`.
    pub reason: Partition,
    /// False when its file was left out of the fetch (`--exclude`): the
    /// tensor is named by the index but its bytes were never downloaded.
    /// Written only when false, so manifests (and fingerprints) of fully
    /// fetched sources are unchanged and older manifests read as fetched.
    #[serde(default = "fetched_default", skip_serializing_if = "is_fetched")]
    pub fetched: bool,
}

/// The `fetched` of an omitted entry that does not say: fetched.
pub fn fetched_default() -> bool {
    true
}

/// Serde's `skip_serializing_if` for `fetched`: written only when false.
#[allow(clippy::trivially_copy_pass_by_ref)]
pub fn is_fetched(fetched: &bool) -> bool {
    *fetched
}

/// Exactly what the fingerprint hashes: the manifest without its
/// fingerprint, field for field in the manifest's order.
#[derive(Debug, Clone, Serialize)]
pub struct FingerprintInput<'a> {
    /// [`MANIFEST_SCHEMA`].
    pub schema: &'a str,
    /// Source identity.
    pub source: &'a SourceIdentity,
    /// Converter identity.
    pub converter: &'a ConverterIdentity,
    /// The components, whole (path, sizes, digest, layout).
    pub components: &'a [ManifestComponent],
    /// FTW tensor descriptors.
    pub ftw_tensors: &'a [TensorDesc],
    /// The tensor inventory with every tensor's sources.
    pub tensors: &'a [InventoryTensor],
    /// The omitted tensors (absent when none, as in the manifest).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub omitted: &'a [OmittedEntry],
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of the canonical JSON of `value` (`what` names it in the
/// error). A value that does not serialize is an error, never the digest
/// of empty bytes.
pub fn canonical_sha256<T: Serialize>(
    what: &'static str,
    value: &T,
) -> Result<String, ArtifactError> {
    let bytes =
        serde_json::to_vec(value).map_err(|source| ArtifactError::Serialize { what, source })?;
    Ok(sha256_hex(&bytes))
}

impl Manifest {
    /// The fingerprint these contents imply.
    pub fn compute_fingerprint(&self) -> Result<String, ArtifactError> {
        canonical_sha256(
            "the fingerprint input",
            &FingerprintInput {
                schema: &self.schema,
                source: &self.source,
                converter: &self.converter,
                components: &self.components,
                ftw_tensors: &self.ftw_tensors,
                tensors: &self.tensors,
                omitted: &self.omitted,
            },
        )
    }

    /// The bytes written to `manifest.json`: pretty JSON plus a newline.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ArtifactError> {
        let mut v = serde_json::to_vec_pretty(self).map_err(|source| ArtifactError::Serialize {
            what: "the manifest",
            source,
        })?;
        v.push(b'\n');
        Ok(v)
    }

    /// The component at `path`.
    pub fn component(&self, path: &str) -> Option<&ManifestComponent> {
        self.components.iter().find(|c| c.path == path)
    }

    /// Expert layers (from the FTEXPERT1 components), in order.
    pub fn expert_layers(&self) -> Vec<(u64, &ManifestComponent)> {
        self.components
            .iter()
            .filter_map(|c| match c.layout {
                ComponentLayout::Ftexpert { layer, .. } => Some((layer, c)),
                _ => None,
            })
            .collect()
    }
}

/// Which expert layers are resident and how deep the file-tier read queue
/// is. Mutable: regenerated from `--ram-budget` / `--reserve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// [`PLACEMENT_SCHEMA`].
    pub schema: String,
    /// Fingerprint of the manifest it was made for.
    pub fingerprint: String,
    /// RAM budget in bytes.
    pub ram_budget: u64,
    /// Bytes of the budget kept free.
    pub reserve: u64,
    /// Bytes always resident (the FTW stream).
    pub active_bytes: u64,
    /// Bytes of the resident expert layers.
    pub resident_expert_bytes: u64,
    /// Expert layers held in RAM.
    pub resident_layers: Vec<u64>,
    /// Expert layers read from the file tier.
    pub file_tier_layers: Vec<u64>,
    /// Concurrent reads queued against the file tier.
    pub read_queue_depth: u32,
}

/// Deepest read queue placement asks for.
pub const MAX_READ_QUEUE_DEPTH: u32 = 64;

impl Placement {
    /// Places expert layers in layer order while they fit in
    /// `ram_budget − reserve − active stream`; the rest go to the file tier,
    /// read with a queue of `top_k` rounded up to a power of two (at least
    /// 4, at most [`MAX_READ_QUEUE_DEPTH`]), one read per routed expert.
    pub fn generate(manifest: &Manifest, ram_budget: u64, reserve: u64, top_k: u64) -> Placement {
        let active_bytes: u64 = manifest
            .components
            .iter()
            .filter(|c| matches!(c.layout, ComponentLayout::Ftw { .. }))
            .map(|c| c.size)
            .sum();
        let mut room = ram_budget
            .saturating_sub(reserve)
            .saturating_sub(active_bytes);
        let (mut resident, mut file_tier, mut resident_bytes) = (Vec::new(), Vec::new(), 0u64);
        for (layer, c) in manifest.expert_layers() {
            if file_tier.is_empty() && c.size <= room {
                room -= c.size;
                resident_bytes += c.size;
                resident.push(layer);
            } else {
                file_tier.push(layer);
            }
        }
        let depth = u32::try_from(top_k.max(4).next_power_of_two())
            .unwrap_or(MAX_READ_QUEUE_DEPTH)
            .min(MAX_READ_QUEUE_DEPTH);
        Placement {
            schema: PLACEMENT_SCHEMA.to_owned(),
            fingerprint: manifest.fingerprint.clone(),
            ram_budget,
            reserve,
            active_bytes,
            resident_expert_bytes: resident_bytes,
            resident_layers: resident,
            file_tier_layers: file_tier,
            read_queue_depth: if manifest.expert_layers().is_empty() {
                0
            } else {
                depth
            },
        }
    }

    /// Checks this placement against `manifest`: same fingerprint, every
    /// expert layer placed exactly once, byte counts consistent.
    pub fn check(&self, manifest: &Manifest) -> Result<(), String> {
        if self.schema != PLACEMENT_SCHEMA {
            return Err(format!(
                "schema {:?}, expected {PLACEMENT_SCHEMA:?}",
                self.schema
            ));
        }
        if self.fingerprint != manifest.fingerprint {
            return Err(format!(
                "made for fingerprint {}, the manifest has {}",
                self.fingerprint, manifest.fingerprint
            ));
        }
        let layers: Vec<u64> = manifest.expert_layers().iter().map(|(l, _)| *l).collect();
        let mut placed: Vec<u64> = self
            .resident_layers
            .iter()
            .chain(&self.file_tier_layers)
            .copied()
            .collect();
        placed.sort_unstable();
        if placed != layers {
            return Err(format!(
                "places expert layers {placed:?}, the manifest has {layers:?}"
            ));
        }
        let resident: u64 = manifest
            .expert_layers()
            .iter()
            .filter(|(l, _)| self.resident_layers.contains(l))
            .map(|(_, c)| c.size)
            .sum();
        if resident != self.resident_expert_bytes {
            return Err(format!(
                "claims {} resident expert bytes, the resident layers hold {resident}",
                self.resident_expert_bytes
            ));
        }
        if self.read_queue_depth > MAX_READ_QUEUE_DEPTH {
            return Err(format!(
                "read queue depth {} exceeds {MAX_READ_QUEUE_DEPTH}",
                self.read_queue_depth
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_sha256_refuses_a_value_that_does_not_serialize() {
        // JSON object keys must be strings: a tuple key fails to serialize.
        let unserializable: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = canonical_sha256("the test value", &unserializable).unwrap_err();
        assert!(
            matches!(
                err,
                ArtifactError::Serialize {
                    what: "the test value",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("cannot serialize the test value as JSON: "),
            "{err}"
        );
        // What does serialize hashes its canonical (compact) bytes.
        let digest = canonical_sha256("a map", &BTreeMap::from([("k", 1)])).unwrap();
        assert_eq!(digest, sha256_hex(br#"{"k":1}"#));
    }

    /// An omitted entry without `fetched` (manifests before `--exclude` of
    /// omitted partitions) reads as fetched and serializes as it was read,
    /// so its fingerprint input is unchanged; a not-fetched entry says so
    /// and hashes differently.
    #[test]
    fn omitted_entries_say_fetched_only_when_not() {
        let old = r#"{"tensor":"mtp.fc.weight","file":"m.safetensors","reason":"mtp"}"#;
        let e: OmittedEntry = serde_json::from_str(old).unwrap();
        assert!(e.fetched);
        assert_eq!(serde_json::to_string(&e).unwrap(), old);
        let not = OmittedEntry {
            fetched: false,
            ..e.clone()
        };
        let json = serde_json::to_string(&not).unwrap();
        assert!(
            json.ends_with(r#""reason":"mtp","fetched":false}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<OmittedEntry>(&json).unwrap(), not);
        assert_ne!(
            canonical_sha256("e", &[e]).unwrap(),
            canonical_sha256("e", &[not]).unwrap()
        );
    }
}
