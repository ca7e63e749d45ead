//! ModelOpt NVFP4 sources: the `weight` / `weight_scale` / `weight_scale_2`
//! triplet, the activation `input_scale` beside it, and fused NVFP4 experts
//! (layouts in the parent module's doc). Everything is passed through as
//! byte spans of the source, never re-quantized.

use std::collections::BTreeSet;

use ftpipe_formats::{Dtype, NativeNvfp4, TensorDesc, TensorKind};

use super::{
    CONFIG_FILE, Catalog, ConvertError, FtwTensor, MoeProfile, SourceSpan, TensorSource, fmt_err,
};

/// Shapes of a ModelOpt activation `input_scale` (W4A4 calibration): one element.
pub(super) const INPUT_SCALE_SHAPES: [&[u64]; 2] = [&[], &[1]];

/// The F32 tensor `name`, whose shape must be one of `shapes`, as a `Plain`
/// FTW tensor copied from its source span; `what` says what it is.
pub(super) fn f32_scale(
    cat: &Catalog,
    name: &str,
    shapes: &[&[u64]],
    what: &str,
) -> Result<FtwTensor, ConvertError> {
    let (file, t) = cat.get(name).ok_or_else(|| ConvertError::MissingTensor {
        tensor: name.to_owned(),
        needed_for: what.to_owned(),
    })?;
    if t.dtype() != safetensors::Dtype::F32 {
        return Err(ConvertError::DtypeMismatch {
            file: file.to_owned(),
            tensor: name.to_owned(),
            expected: format!("F32 ({what})"),
            actual: format!("{:?}", t.dtype()),
        });
    }
    if !shapes.contains(&t.shape()) {
        return Err(ConvertError::ShapeMismatch {
            file: file.to_owned(),
            tensor: name.to_owned(),
            expected: shapes.first().map(|s| s.to_vec()).unwrap_or_default(),
            actual: t.shape().to_vec(),
            because: what.to_owned(),
        });
    }
    Ok(FtwTensor {
        desc: TensorDesc::new(name, Dtype::F32, TensorKind::Plain, t.shape()),
        source: TensorSource::Span(SourceSpan {
            file: file.to_owned(),
            tensor: name.to_owned(),
            offset: t.offset(),
            len: t.len(),
        }),
    })
}

/// The optional `input_scale` of NVFP4 `module`, checked.
pub(super) fn input_scale_of(
    cat: &Catalog,
    module: &str,
) -> Result<Option<FtwTensor>, ConvertError> {
    let name = format!("{module}.input_scale");
    if cat.get(&name).is_none() {
        return Ok(None);
    }
    let what =
        format!("the activation input_scale of NVFP4 {module}: one F32 element, shape [] or [1]");
    f32_scale(cat, &name, &INPUT_SCALE_SHAPES, &what).map(Some)
}

/// Whether `module` is stored as an NVFP4 triplet (the rule the FTW stream
/// and [`MoeProfile::linear`] use).
pub(super) fn is_nvfp4_module(cat: &Catalog, module: &str) -> bool {
    cat.get(&format!("{module}.weight"))
        .is_some_and(|(_, w)| w.dtype() == safetensors::Dtype::U8)
        || cat.get(&format!("{module}.weight_scale")).is_some()
}

/// Suffixes (after `model.layers.{l}.mlp.experts.`) of the fused layouts;
/// any of them present makes the layer fused.
pub(super) const FUSED_NAMES: [&str; 6] = [
    "gate_up_proj",
    "down_proj",
    "gate_up_proj_weight_scale",
    "gate_up_proj_weight_scale_2",
    "down_proj_weight_scale",
    "down_proj_weight_scale_2",
];

pub(super) const NVFP4_PARTS: [&str; 3] = ["weight", "weight_scale", "weight_scale_2"];

/// The ModelOpt NVFP4 triplet of `module` (`weight` U8, `weight_scale`
/// F8_E4M3, `weight_scale_2` F32), each part checked, as one native tensor
/// and its three source spans in body order.
pub(in crate::convert) fn nvfp4_triplet(
    cat: &Catalog,
    module: &str,
) -> Result<(NativeNvfp4, [SourceSpan; 3]), ConvertError> {
    let mut parts = Vec::with_capacity(3);
    let mut spans = Vec::with_capacity(3);
    for (p, want) in NVFP4_PARTS.iter().zip([
        safetensors::Dtype::U8,
        safetensors::Dtype::F8_E4M3,
        safetensors::Dtype::F32,
    ]) {
        let n = format!("{module}.{p}");
        let (f, t) = cat.get(&n).ok_or_else(|| ConvertError::MissingTensor {
            tensor: n.clone(),
            needed_for: format!("the NVFP4 triplet of {module}"),
        })?;
        if t.dtype() != want {
            return Err(ConvertError::DtypeMismatch {
                file: f.to_owned(),
                tensor: n,
                expected: format!("{want:?} (part of the NVFP4 triplet of {module})"),
                actual: format!("{:?}", t.dtype()),
            });
        }
        parts.push(t);
        spans.push(SourceSpan {
            file: f.to_owned(),
            tensor: n,
            offset: t.offset(),
            len: t.len(),
        });
    }
    let nv = NativeNvfp4::new(
        &format!("{module}.weight"),
        parts[0].shape(),
        parts[1].shape(),
        parts[2].shape(),
    )
    .map_err(fmt_err(module))?;
    let spans: [SourceSpan; 3] = spans.try_into().map_err(|_| ConvertError::MissingTensor {
        tensor: format!("{module}.weight"),
        needed_for: "the NVFP4 triplet".into(),
    })?;
    Ok((nv, spans))
}

impl MoeProfile {
    /// The record layout and records of the fused NVFP4 experts of layer
    /// `l` (layout in the module doc), every tensor checked against the
    /// config. Each field is `Native` over three byte sub-spans: expert `e`'s
    /// `gate_proj` is row block `2e` of `gate_up_proj` (and of its block
    /// scales) with tensor scale `[e, 0]`, `up_proj` row block `2e + 1` with
    /// `[e, 1]`, `down_proj` row block `e` of `down_proj` with `[e]`.
    pub(super) fn fused_nvfp4(
        &self,
        cat: &Catalog,
        l: u64,
        claimed: &mut BTreeSet<String>,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<(Vec<TensorDesc>, Vec<Vec<TensorSource>>), ConvertError> {
        let (h, i, e_n) = (self.hidden, self.inter, self.experts);
        let p = format!("{}.{l}.mlp.experts", self.layer_prefix);
        for (field, v) in [("hidden_size", h), ("moe_intermediate_size", i)] {
            if v == 0 || !v.is_multiple_of(16) {
                return Err(ConvertError::BadConfig {
                    file: CONFIG_FILE.into(),
                    field: field.into(),
                    problem: format!(
                        "is {v}; the NVFP4 fused experts of layer {l} need a positive multiple of 16"
                    ),
                });
            }
        }
        let overflow = || ConvertError::BadConfig {
            file: CONFIG_FILE.into(),
            field: "num_experts".into(),
            problem: format!(
                "num_experts {e_n}, moe_intermediate_size {i}, hidden_size {h}: the fused experts of layer {l} overflow 64-bit sizes"
            ),
        };
        let i2 = i.checked_mul(2).ok_or_else(overflow)?;
        let because = format!(
            "NVFP4 fused experts of layer {l}: num_experts {e_n}, moe_intermediate_size {i}, hidden_size {h}"
        );
        let mut get = |suffix: &str,
                       want: safetensors::Dtype,
                       shape: &[u64]|
         -> Result<SourceSpan, ConvertError> {
            let n = format!("{p}.{suffix}");
            let (f, t) = cat.get(&n).ok_or_else(|| ConvertError::MissingTensor {
                tensor: n.clone(),
                needed_for: format!("the NVFP4 fused experts of layer {l}"),
            })?;
            if t.dtype() != want {
                return Err(ConvertError::DtypeMismatch {
                    file: f.to_owned(),
                    tensor: n,
                    expected: format!("{want:?} (NVFP4 fused experts of layer {l})"),
                    actual: format!("{:?}", t.dtype()),
                });
            }
            if t.shape() != shape {
                return Err(ConvertError::ShapeMismatch {
                    file: f.to_owned(),
                    tensor: n,
                    expected: shape.to_vec(),
                    actual: t.shape().to_vec(),
                    because: because.clone(),
                });
            }
            claimed.insert(n.clone());
            Ok(SourceSpan {
                file: f.to_owned(),
                tensor: n,
                offset: t.offset(),
                len: t.len(),
            })
        };
        use safetensors::Dtype::{F8_E4M3, F32, U8};
        let gu = [
            get("gate_up_proj", U8, &[e_n, i2, h / 2])?,
            get("gate_up_proj_weight_scale", F8_E4M3, &[e_n, i2, h / 16])?,
            get("gate_up_proj_weight_scale_2", F32, &[e_n, 2])?,
        ];
        let down = [
            get("down_proj", U8, &[e_n, h, i / 2])?,
            get("down_proj_weight_scale", F8_E4M3, &[e_n, h, i / 16])?,
            get("down_proj_weight_scale_2", F32, &[e_n])?,
        ];
        for (suffix, shape) in [
            ("gate_up_proj_input_scale", vec![e_n, 2]),
            ("down_proj_input_scale", vec![e_n]),
        ] {
            let n = format!("{p}.{suffix}");
            if cat.get(&n).is_some() {
                let what = format!("the activation input_scale of the {because}");
                ftw_extra.push(f32_scale(cat, &n, &[&shape], &what)?);
                claimed.insert(n);
            }
        }
        for s in [&gu[0], &down[0]] {
            if self.protected(&p) || self.protected(&s.tensor) {
                return Err(ConvertError::ProtectedQuantized {
                    file: s.file.clone(),
                    tensor: s.tensor.clone(),
                });
            }
        }
        let gate_nv = NativeNvfp4::new(&gu[0].tensor, &[i, h / 2], &[i, h / 16], &[])
            .map_err(fmt_err(&gu[0].tensor))?;
        let down_nv = NativeNvfp4::new(&down[0].tensor, &[h, i / 2], &[h, i / 16], &[])
            .map_err(fmt_err(&down[0].tensor))?;
        // Block `k` of `len` bytes of `s`; the shape checks above make every
        // block the config allows lie inside the tensor.
        let block = |s: &SourceSpan, k: u64, len: u64| -> Result<SourceSpan, ConvertError> {
            let off = k.checked_mul(len).ok_or_else(overflow)?;
            let end = off.checked_add(len).ok_or_else(overflow)?;
            if end > s.len {
                return Err(overflow());
            }
            Ok(SourceSpan {
                offset: s.offset.checked_add(off).ok_or_else(overflow)?,
                len,
                ..s.clone()
            })
        };
        let native = |parts: &[SourceSpan; 3],
                      nv: &NativeNvfp4,
                      k: u64|
         -> Result<TensorSource, ConvertError> {
            let [w, sc, s2] = nv.part_lens();
            Ok(TensorSource::Native(Box::new([
                block(&parts[0], k, w)?,
                block(&parts[1], k, sc)?,
                block(&parts[2], k, s2)?,
            ])))
        };
        let mut records = Vec::with_capacity(usize::try_from(e_n).unwrap_or(0));
        for e in 0..e_n {
            let g = e.checked_mul(2).ok_or_else(overflow)?;
            records.push(vec![
                native(&gu, &gate_nv, g)?,
                native(&gu, &gate_nv, g + 1)?,
                native(&down, &down_nv, e)?,
            ]);
        }
        let desc = |key: &str, nv: &NativeNvfp4| {
            TensorDesc::new(key, Dtype::Nvfp4, TensorKind::Native, nv.shape())
        };
        let fields = vec![
            desc("gate_proj", &gate_nv),
            desc("up_proj", &gate_nv),
            desc("down_proj", &down_nv),
        ];
        Ok((fields, records))
    }
}
