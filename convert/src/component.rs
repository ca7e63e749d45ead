//! The conversion's shared types, used by the built-in profiles
//! ([`crate::profile`]) and by recipes ([`crate::recipe`]) alike: the
//! source [`Catalog`], where output bytes come from ([`SourceSpan`],
//! [`TensorSource`]), the output [`Component`]s, and the builders that size
//! them exactly ([`FtwBuilder`], [`expert_sidecar`]). How ModelOpt NVFP4
//! tensors are recognised lives beside it in [`crate::nvfp4`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use foldhash::fast::RandomState;
use serde::Serialize;

use ftpipe_artifact::manifest::FTW_COMPONENT;
use ftpipe_formats::{Dtype, TensorDesc, sizes};

use crate::error::ConvertError;
use crate::safetensors::{SourceHeader, SourceTensor};

/// The config file every profile is chosen from.
pub const CONFIG_FILE: &str = "config.json";
/// The `model_type`s the built-in profiles handle.
pub const KNOWN_MODEL_TYPES: &[&str] = &["qwen4_exp", "qwen3_moe"];

/// Bytes `[offset, offset + len)` of a source file, holding (part of) a tensor.
///
/// File and tensor names are shared with the source headers (a plan of the
/// NVFP4 export holds ~300k spans: owned names would be ~40 MB of copies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceSpan {
    /// Source file (repo-relative).
    pub file: Arc<str>,
    /// Source tensor name.
    pub tensor: Arc<str>,
    /// Absolute offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Where the bytes of one output tensor come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum TensorSource {
    /// Copied from one span.
    Span(SourceSpan),
    /// NVFP4 pass-through: `weight ‖ weight_scale ‖ weight_scale_2`.
    Native(Box<[SourceSpan; 3]>),
    /// Copied from one span whose bytes the config fixes (a lookup
    /// buffer); the writer refuses other bytes.
    Checked(Box<CheckedSpan>),
}

impl TensorSource {
    /// The spans read, in output order.
    pub fn spans(&self) -> &[SourceSpan] {
        match self {
            TensorSource::Span(s) => std::slice::from_ref(s),
            TensorSource::Native(p) => &p[..],
            TensorSource::Checked(c) => std::slice::from_ref(&c.span),
        }
    }

    pub(super) fn files(&self) -> Vec<&str> {
        self.spans().iter().map(|s| &*s.file).collect()
    }
}

/// One tensor of the FTW stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FtwTensor {
    /// Target descriptor.
    pub desc: TensorDesc,
    /// Source bytes.
    pub source: TensorSource,
}

/// What a component holds, in enough detail to convert it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ComponentContent {
    /// The FTW stream, tensors in key order.
    Ftw {
        /// Tensors in index order.
        tensors: Vec<FtwTensor>,
    },
    /// One FTEXPERT1 sidecar.
    Experts {
        /// MoE layer.
        layer: u64,
        /// Record layout (same for every expert).
        fields: Vec<TensorDesc>,
        /// `records[e][f]`: the bytes of field `f` of expert `e`.
        records: Vec<Vec<TensorSource>>,
    },
    /// One Q3_PLE_32 segment, quantized from a BF16 source shard, or an
    /// F8_E4M3 one decoded with its scale.
    Q3Segment {
        /// Layer of the PLE table.
        layer: u64,
        /// Segment index `i` of `shard_i`.
        index: u64,
        /// Rows.
        rows: u64,
        /// Row width.
        width: u64,
        /// The BF16 or F8_E4M3 source.
        source: SourceSpan,
        /// The F32 scale of an F8_E4M3 source (value = e4m3 × scale).
        #[serde(skip_serializing_if = "Option::is_none")]
        scale: Option<SourceSpan>,
    },
    /// The table's global scale: the absolute max over every segment.
    Q3GlobalScale {
        /// Layer of the PLE table.
        layer: u64,
        /// Every source segment, in index order.
        segments: Vec<SourceSpan>,
        /// For an F8_E4M3 table, each segment's scale (parallel to
        /// `segments`); empty for BF16.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        scales: Vec<SourceSpan>,
    },
}

/// Kind of an output component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComponentKind {
    /// FTW v1 stream.
    Ftw,
    /// FTEXPERT1 sidecar.
    Ftexpert,
    /// Q3_PLE_32 segment.
    Q3Segment,
    /// Q3_PLE_32 global scale record.
    Q3GlobalScale,
}

impl ComponentKind {
    /// Short label.
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentKind::Ftw => "ftw",
            ComponentKind::Ftexpert => "ftexpert",
            ComponentKind::Q3Segment => "q3_segment",
            ComponentKind::Q3GlobalScale => "q3_global_scale",
        }
    }
}

/// One output component with its exact predicted size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Component {
    /// Path relative to the artifact directory.
    pub name: String,
    /// Format.
    pub kind: ComponentKind,
    /// Exact size in bytes.
    pub predicted_bytes: u64,
    /// Tensors (FTW), experts (FTEXPERT1) or rows (Q3 segment) it holds.
    pub items: u64,
    /// Source files it reads.
    pub source_files: BTreeSet<String>,
    /// What goes into it (not part of the JSON plan).
    #[serde(skip)]
    pub content: ComponentContent,
}

/// All tensors of the source by name, with their file: a hash map for the
/// profiles' lookups (several per tensor, by names sharing long prefixes,
/// which a search tree compares byte by byte at every level) and the same
/// entries in name order.
pub struct Catalog<'a> {
    by_name: HashMap<&'a str, (&'a Arc<str>, &'a SourceTensor), RandomState>,
    in_order: Vec<(&'a str, &'a Arc<str>, &'a SourceTensor)>,
}

impl<'a> Catalog<'a> {
    /// Indexes the headers; a tensor in two files is an error.
    pub fn new(headers: impl IntoIterator<Item = &'a SourceHeader>) -> Result<Self, ConvertError> {
        let mut by_name = HashMap::default();
        let mut in_order = Vec::new();
        for h in headers {
            for t in h.tensors() {
                if let Some((first, _)) = by_name.insert(t.name(), (h.shared_file(), t)) {
                    return Err(ConvertError::DuplicateTensor {
                        tensor: t.name().to_owned(),
                        first: first.to_string(),
                        second: h.file().to_owned(),
                    });
                }
                in_order.push((t.name(), h.shared_file(), t));
            }
        }
        in_order.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Ok(Catalog { by_name, in_order })
    }

    pub(super) fn get(&self, name: &str) -> Option<(&'a str, &'a SourceTensor)> {
        self.by_name.get(name).map(|&(f, t)| (&**f, t))
    }

    /// How many tensors the headers hold.
    pub(super) fn len(&self) -> usize {
        self.in_order.len()
    }

    /// Every tensor in name order: `(name, file, tensor)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str, &'a SourceTensor)> + '_ {
        self.in_order.iter().map(|&(n, f, t)| (n, &**f, t))
    }

    /// The whole of tensor `name`, its names shared with the header.
    pub(super) fn span(&self, name: &str) -> Option<SourceSpan> {
        self.by_name.get(name).map(|&(f, t)| SourceSpan {
            file: f.clone(),
            tensor: t.shared_name().clone(),
            offset: t.offset(),
            len: t.len(),
        })
    }
}

/// The formats dtype of a non-quantized source dtype.
pub(crate) fn plain_dtype(d: safetensors::Dtype) -> Option<Dtype> {
    use safetensors::Dtype as S;
    Some(match d {
        S::F32 => Dtype::F32,
        S::F16 => Dtype::F16,
        S::BF16 => Dtype::BF16,
        S::U8 => Dtype::U8,
        S::I8 => Dtype::I8,
        S::I32 => Dtype::I32,
        S::I64 => Dtype::I64,
        S::F8_E4M3 => Dtype::F8E4M3,
        _ => return None,
    })
}

pub(crate) fn fmt_err(
    component: &str,
) -> impl Fn(ftpipe_formats::FormatError) -> ConvertError + '_ {
    move |source| ConvertError::Format {
        component: component.to_owned(),
        source,
    }
}

/// The FTEXPERT1 component `name` of layer `l`, sized exactly.
pub(crate) fn expert_sidecar(
    name: String,
    l: u64,
    fields: Vec<TensorDesc>,
    records: Vec<Vec<TensorSource>>,
) -> Result<Component, ConvertError> {
    let count = records.len() as u64;
    let predicted = sizes::ftexpert_total_len(
        u32::try_from(l).unwrap_or(u32::MAX),
        u32::try_from(count).unwrap_or(u32::MAX),
        fields.clone(),
    )
    .map_err(fmt_err(&name))?;
    let source_files = records
        .iter()
        .flatten()
        .flat_map(|s| s.files())
        .map(str::to_owned)
        .collect();
    Ok(Component {
        name,
        kind: ComponentKind::Ftexpert,
        predicted_bytes: predicted,
        items: count,
        source_files,
        content: ComponentContent::Experts {
            layer: l,
            fields,
            records,
        },
    })
}

/// Formats I64 values for an error.
fn i64s(b: &[u8]) -> String {
    let v: Vec<i64> = b
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    format!("{v:?}")
}

/// A lookup buffer whose bytes the writer must find exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckedSpan {
    /// The source bytes.
    pub span: SourceSpan,
    /// What they must be.
    pub expected: Vec<u8>,
    /// Which config fields fix them.
    pub because: String,
}

impl CheckedSpan {
    /// `Ok` when `found` are the expected bytes, else the error naming both.
    pub fn check(&self, found: &[u8]) -> Result<(), ConvertError> {
        if found == self.expected {
            return Ok(());
        }
        Err(ConvertError::LookupBufferMismatch {
            file: self.span.file.to_string(),
            tensor: self.span.tensor.to_string(),
            problem: format!(
                "holds {}, expected {} ({})",
                i64s(found),
                i64s(&self.expected),
                self.because
            ),
        })
    }
}

/// The FTW stream being assembled: tensors by key, sized when finished.
#[derive(Debug, Default)]
pub(crate) struct FtwBuilder {
    tensors: BTreeMap<String, FtwTensor>,
}

impl FtwBuilder {
    /// Adds `t`; a key given twice is an error naming both sources.
    pub(crate) fn insert(&mut self, t: FtwTensor) -> Result<(), ConvertError> {
        use std::collections::btree_map::Entry;
        match self.tensors.entry(t.desc.key.clone()) {
            Entry::Vacant(v) => {
                v.insert(t);
                Ok(())
            }
            Entry::Occupied(o) => Err(ConvertError::DuplicateTensor {
                tensor: o.key().clone(),
                first: o.get().source.files().join(", "),
                second: t.source.files().join(", "),
            }),
        }
    }

    /// The FTW component holding the tensors in key order, sized exactly.
    pub(crate) fn finish(self) -> Result<Component, ConvertError> {
        let tensors: Vec<FtwTensor> = self.tensors.into_values().collect();
        let predicted = sizes::ftw_total_len(tensors.iter().map(|t| t.desc.clone()).collect())
            .map_err(fmt_err(FTW_COMPONENT))?;
        let source_files = tensors
            .iter()
            .flat_map(|t| t.source.files())
            .map(str::to_owned)
            .collect();
        Ok(Component {
            name: FTW_COMPONENT.into(),
            kind: ComponentKind::Ftw,
            predicted_bytes: predicted,
            items: tensors.len() as u64,
            source_files,
            content: ComponentContent::Ftw { tensors },
        })
    }
}
