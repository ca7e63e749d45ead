//! Fused NVFP4 experts of the flat `qwen4_exp` layout (layout in the parent
//! module's doc), passed through as byte sub-spans of the fused tensors.

use std::collections::BTreeSet;
use std::sync::Arc;

use ftpipe_formats::{Dtype, NativeNvfp4, TensorDesc, TensorKind};

use super::{
    CONFIG_FILE, Catalog, ConvertError, FtwTensor, MoeProfile, SourceSpan, TensorSource, fmt_err,
};
use crate::nvfp4::f32_scale;

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
        claimed: &mut BTreeSet<Arc<str>>,
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
            let span = cat.span(&n).ok_or_else(|| ConvertError::MissingTensor {
                tensor: n.clone(),
                needed_for: format!("the NVFP4 fused experts of layer {l}"),
            })?;
            claimed.insert(span.tensor.clone());
            Ok(span)
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
                let scale = f32_scale(cat, &n, &[&shape], &what)?;
                claimed.extend(scale.source.spans().iter().map(|s| s.tensor.clone()));
                ftw_extra.push(scale);
            }
        }
        for s in [&gu[0], &down[0]] {
            if let Some(by) = self
                .protected_by(&p)
                .or_else(|| self.protected_by(&s.tensor))
            {
                return Err(ConvertError::ProtectedQuantized {
                    file: s.file.to_string(),
                    tensor: s.tensor.to_string(),
                    by,
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
