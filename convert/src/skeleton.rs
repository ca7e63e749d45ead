//! The conversion skeleton: everything the manifest will say except the
//! component digests, plus each component's identity and the sources it
//! reads. Built from a plan while the sources are present and saved to
//! `DIR/.ftpipe/convert.json` before the first component is written, so a
//! run after `--retire-sources` can finish (or prove nothing is left to do)
//! without the shards it deleted.
//!
//! A component's identity is the SHA-256 of the canonical JSON of the
//! converter identity, the component (name, kind, size, layout and the
//! exact source spans), the digests of the source files it reads and of
//! `config.json` (every component's plan is made from it) and, for
//! a Q3 segment, the identity of the global scale it is encoded under. A
//! receipt is reused only under the identity it was made with.
//!
//! The skeleton also keeps every shard's header JSON and length: a run
//! after `--retire-sources` plans again from the shards still present and
//! these saved headers, so it converts whatever is left that it can read
//! and names the shard to re-acquire for what it cannot.

use std::collections::BTreeMap;
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use ftpipe_formats::ExpertLayout;
use ftpipe_hub::identity::expected_identity;
use ftpipe_receipts::{FileRow, Receipt};

use crate::component::{CONFIG_FILE, Component, ComponentContent, TensorSource};
use crate::error::ConvertError;
use crate::plan::{INDEX_FILE, KeptHeader, Plan};
use ftpipe_artifact::manifest::{
    ComponentLayout, ConverterIdentity, InventoryTensor, MANIFEST_SCHEMA, Manifest,
    ManifestComponent, OmittedEntry, SourceFileId, SourceIdentity, canonical_sha256,
};

/// Skeleton file under the state directory.
pub const SKELETON_FILE: &str = "convert.json";
/// Largest [`SKELETON_FILE`] read back (~85 MB of compact JSON at 300k
/// tensors; [`crate::safetensors::MAX_TENSORS`] is a million).
pub const MAX_SKELETON_BYTES: u64 = 1 << 30;

/// What `DIR/.ftpipe/convert.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skeleton {
    /// The manifest with empty digests and fingerprint.
    pub manifest: Manifest,
    /// Component path → identity.
    pub identities: BTreeMap<String, String>,
    /// Component path → source files it reads.
    pub readers: BTreeMap<String, Vec<String>>,
    /// `num_experts_per_tok`, for placement.
    pub top_k: u64,
    /// Shard path → its header as read while present (the JSON of a
    /// present shard is read from it again when the skeleton is written).
    #[serde(default)]
    pub headers: BTreeMap<String, KeptHeader>,
}

#[derive(Serialize)]
struct IdentityInput<'a> {
    converter: &'a ConverterIdentity,
    component: &'a Component,
    content: &'a ComponentContent,
    sources: Vec<&'a SourceFileId>,
    /// The identity of the global scale a Q3 segment is encoded under.
    #[serde(skip_serializing_if = "Option::is_none")]
    scale: Option<&'a str>,
}

/// The receipts the selected files will have once verified: the listing's
/// size and identity (a file is published only when it hashes to them).
pub(crate) fn listed_receipts(
    listing: &[FileRow],
) -> Result<BTreeMap<String, Receipt>, ConvertError> {
    let mut out = BTreeMap::new();
    for f in listing.iter().filter(|f| f.selected) {
        let expected = expected_identity(f)?;
        out.insert(
            f.path.clone(),
            Receipt {
                path: f.path.clone(),
                size: f.size,
                digest_kind: expected.kind().to_owned(),
                digest: expected.hex().to_owned(),
                completed_at: String::new(),
                adopted: false,
            },
        );
    }
    Ok(out)
}

/// The source identity of the files a plan reads, from their receipts.
pub fn source_identity(
    repo: &str,
    commit: &str,
    files: &[String],
    receipts: &BTreeMap<String, Receipt>,
) -> Result<SourceIdentity, ConvertError> {
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let r = receipts
            .get(f)
            .ok_or_else(|| ConvertError::NotFetched { file: f.clone() })?;
        out.push(SourceFileId {
            path: f.clone(),
            size: r.size,
            digest_kind: r.digest_kind.clone(),
            digest: r.digest.clone(),
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(SourceIdentity {
        repo: repo.to_owned(),
        commit: commit.to_owned(),
        files: out,
    })
}

/// Files a conversion reads: config, index and every shard of the plan.
pub fn files_read(plan: &Plan) -> Vec<String> {
    let mut v = vec![CONFIG_FILE.to_owned(), INDEX_FILE.to_owned()];
    v.extend(plan.sources.iter().map(|s| s.file.clone()));
    v
}

fn source_names(src: &TensorSource) -> Vec<Arc<str>> {
    src.spans().iter().map(|s| s.tensor.clone()).collect()
}

fn layout_of(c: &Component) -> Result<ComponentLayout, ConvertError> {
    Ok(match &c.content {
        ComponentContent::Ftw { tensors } => ComponentLayout::Ftw {
            tensors: tensors.len() as u64,
        },
        ComponentContent::Experts {
            layer,
            fields,
            records,
        } => {
            let l = ExpertLayout::plan(
                u32::try_from(*layer).unwrap_or(u32::MAX),
                u32::try_from(records.len()).unwrap_or(u32::MAX),
                fields.clone(),
            )
            .map_err(|source| ConvertError::Format {
                component: c.name.clone(),
                source,
            })?;
            ComponentLayout::Ftexpert {
                layer: *layer,
                experts: records.len() as u64,
                record_size: l.record_size(),
                fields: fields.clone(),
            }
        }
        ComponentContent::Q3Segment {
            layer,
            index,
            rows,
            width,
            ..
        } => ComponentLayout::Q3Segment {
            layer: *layer,
            index: *index,
            rows: *rows,
            width: *width,
        },
        ComponentContent::Q3GlobalScale {
            layer, segments, ..
        } => ComponentLayout::Q3GlobalScale {
            layer: *layer,
            segments: segments.len() as u64,
        },
    })
}

fn inventory(c: &Component) -> Vec<InventoryTensor> {
    let component: Arc<str> = c.name.as_str().into();
    let item = |key: String, sources: Vec<Arc<str>>| InventoryTensor {
        component: component.clone(),
        key,
        sources,
    };
    match &c.content {
        ComponentContent::Ftw { tensors } => tensors
            .iter()
            .map(|t| item(t.desc.key.clone(), source_names(&t.source)))
            .collect(),
        ComponentContent::Experts {
            fields, records, ..
        } => records
            .iter()
            .enumerate()
            .flat_map(|(e, rec)| {
                fields
                    .iter()
                    .zip(rec)
                    .map(move |(f, s)| item(format!("{e}.{}", f.key), source_names(s)))
            })
            .collect(),
        ComponentContent::Q3Segment { source, scale, .. } => {
            let mut names = vec![source.tensor.clone()];
            names.extend(scale.iter().map(|s| s.tensor.clone()));
            vec![item("rows".into(), names)]
        }
        ComponentContent::Q3GlobalScale {
            segments, scales, ..
        } => {
            let mut names: Vec<Arc<str>> = segments.iter().map(|s| s.tensor.clone()).collect();
            for s in scales {
                if !names.contains(&s.tensor) {
                    names.push(s.tensor.clone());
                }
            }
            vec![item("scale".into(), names)]
        }
    }
}

/// Each component's identity or the problem computing it, in `plan`'s
/// order (a global scale's problem ends it at once: the segments'
/// identities include the scales'). An identity is a hash of the converter,
/// the component and its content, and the source files it reads (with
/// config.json, which every component's plan reads); a Q3 segment's also
/// of its global scale's identity. Each hashes its component's content
/// (for the FTW stream and the sidecars, every span), so they are computed
/// in parallel: the skeleton is the plan's last step before the first
/// transfer.
fn component_identities(
    plan: &Plan,
    source: &SourceIdentity,
    converter: &ConverterIdentity,
) -> Result<Vec<Result<String, ConvertError>>, ConvertError> {
    let by_path: BTreeMap<&str, &SourceFileId> =
        source.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let identity = |c: &Component, scale: Option<&str>| {
        let sources = c
            .source_files
            .iter()
            .map(String::as_str)
            .chain([CONFIG_FILE])
            .filter_map(|f| by_path.get(f).copied())
            .collect();
        canonical_sha256(
            "a component identity",
            &IdentityInput {
                converter,
                component: c,
                content: &c.content,
                sources,
                scale,
            },
        )
    };
    // Scales first: a segment's identity includes its scale's.
    let mut scale_ids = BTreeMap::new();
    for c in &plan.components {
        if let ComponentContent::Q3GlobalScale { layer, .. } = &c.content {
            scale_ids.insert(*layer, identity(c, None)?);
        }
    }
    let ids = plan
        .components
        .par_iter()
        .map(|c| match &c.content {
            ComponentContent::Q3GlobalScale { layer, .. } => scale_ids
                .get(layer)
                .cloned()
                .ok_or_else(|| ConvertError::internal(format!("{}: no identity", c.name))),
            ComponentContent::Q3Segment { layer, .. } => {
                let scale = scale_ids
                    .get(layer)
                    .ok_or_else(|| ConvertError::MissingTensor {
                        tensor: format!("the global scale of PLE layer {layer}"),
                        needed_for: c.name.clone(),
                    })?;
                Ok(identity(c, Some(scale))?)
            }
            _ => Ok(identity(c, None)?),
        })
        .collect();
    Ok(ids)
}

impl Skeleton {
    /// The receipt of component `c`, written as `w` by `run`, under the
    /// identity this skeleton gives it.
    pub fn receipt(
        &self,
        c: &Component,
        w: crate::write::Written,
        run: ftpipe_receipts::RunId,
    ) -> Result<ftpipe_receipts::ComponentReceipt, ConvertError> {
        let identity = self.identities.get(&c.name).cloned().ok_or_else(|| {
            ConvertError::internal(format!(
                "component {} has no identity in the skeleton",
                c.name
            ))
        })?;
        Ok(ftpipe_receipts::ComponentReceipt {
            path: c.name.clone(),
            kind: c.kind.as_str().to_owned(),
            predicted_bytes: c.predicted_bytes,
            size: w.size,
            sha256: w.sha256,
            identity,
            run_id: run,
        })
    }

    /// Builds the skeleton of `plan` under `converter` from `source`.
    pub fn build(
        plan: &Plan,
        source: SourceIdentity,
        converter: ConverterIdentity,
        top_k: u64,
        headers: BTreeMap<String, KeptHeader>,
    ) -> Result<Skeleton, ConvertError> {
        let ids = component_identities(plan, &source, &converter)?;
        let mut components = Vec::with_capacity(plan.components.len());
        let mut identities = BTreeMap::new();
        let mut readers = BTreeMap::new();
        let mut tensors = Vec::new();
        let mut ftw_tensors = Vec::new();
        for (c, id) in plan.components.iter().zip(ids) {
            if let ComponentContent::Ftw { tensors: t } = &c.content {
                ftw_tensors.extend(t.iter().map(|t| t.desc.clone()));
            }
            // Each component's identity, then its layout: the first
            // problem in the plan's order, as one at a time would find.
            identities.insert(c.name.clone(), id?);
            readers.insert(c.name.clone(), c.source_files.iter().cloned().collect());
            tensors.extend(inventory(c));
            components.push(ManifestComponent {
                path: c.name.clone(),
                size: c.predicted_bytes,
                predicted_bytes: c.predicted_bytes,
                sha256: String::new(),
                layout: layout_of(c)?,
            });
        }
        Ok(Skeleton {
            manifest: Manifest {
                schema: MANIFEST_SCHEMA.to_owned(),
                fingerprint: String::new(),
                source,
                converter,
                components,
                ftw_tensors,
                tensors,
                omitted: plan
                    .omitted
                    .iter()
                    .map(|o| OmittedEntry {
                        tensor: o.tensor.clone(),
                        file: o.file.clone(),
                        reason: o.reason,
                        fetched: o.fetched,
                    })
                    .collect(),
            },
            identities,
            readers,
            top_k,
            headers,
        })
    }

    /// The finished manifest given every component's digest, `None` when
    /// a component has none.
    /// Consumes the skeleton: its manifest (with an inventory entry per
    /// source tensor) is finished in place, not cloned.
    pub fn finish(self, digests: &BTreeMap<String, String>) -> Result<Manifest, ConvertError> {
        let mut m = self.manifest;
        for c in &mut m.components {
            c.sha256 = digests
                .get(&c.path)
                .ok_or_else(|| {
                    ConvertError::internal(format!(
                        "component {} has no receipt after conversion",
                        c.path
                    ))
                })?
                .clone();
        }
        m.fingerprint = m.compute_fingerprint()?;
        Ok(m)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::plan::tests::plan_of_generated;

    fn plan() -> Plan {
        plan_of_generated(5)
    }

    /// Every file of `plan` with digest `a…`, `changed` with `b…`, at the
    /// commit `commit` repeated.
    pub(crate) fn source_identity(
        plan: &Plan,
        commit: char,
        changed: Option<&str>,
    ) -> SourceIdentity {
        let files = files_read(plan)
            .into_iter()
            .map(|path| SourceFileId {
                digest: if Some(path.as_str()) == changed {
                    "b"
                } else {
                    "a"
                }
                .repeat(64),
                digest_kind: "sha256".into(),
                size: 1,
                path,
            })
            .collect();
        SourceIdentity {
            repo: "r".into(),
            commit: commit.to_string().repeat(40),
            files,
        }
    }

    /// A segment is encoded under its table's global scale, which reads
    /// every segment's shard: another shard's digest changes the scale,
    /// so it must change the segment's identity too.
    #[test]
    fn a_segment_identity_follows_its_scale() {
        let plan = plan();
        let converter = ConverterIdentity::current("qwen4_exp", Default::default());
        let segment = plan
            .components
            .iter()
            .find(|c| matches!(c.content, ComponentContent::Q3Segment { .. }))
            .expect("a Q3 segment");
        let scale = plan
            .components
            .iter()
            .find(|c| matches!(c.content, ComponentContent::Q3GlobalScale { .. }))
            .expect("a global scale");
        let other_shard = scale
            .source_files
            .iter()
            .find(|f| !segment.source_files.contains(*f))
            .expect("a shard the scale reads and the segment does not");
        let build = |changed| {
            Skeleton::build(
                &plan,
                source_identity(&plan, 'c', changed),
                converter.clone(),
                8,
                BTreeMap::new(),
            )
            .unwrap()
        };
        let (before, after) = (build(None), build(Some(other_shard.as_str())));
        assert_ne!(
            before.identities[&scale.name],
            after.identities[&scale.name]
        );
        assert_ne!(
            before.identities[&segment.name], after.identities[&segment.name],
            "segment identity ignores its scale"
        );
        // A component that reads neither that shard nor a scale keeps its
        // identity.
        let unaffected = plan
            .components
            .iter()
            .find(|c| {
                !c.source_files.contains(other_shard)
                    && !matches!(c.content, ComponentContent::Q3Segment { .. })
            })
            .expect("a component not reading that shard");
        assert_eq!(
            before.identities[&unaffected.name],
            after.identities[&unaffected.name]
        );
    }
}
