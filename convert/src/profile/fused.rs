//! Fused NVFP4 experts of the flat `qwen4_exp` layout (layout in the parent
//! module's doc), passed through as byte sub-spans of the fused tensors.

use ftpipe_formats::{Dtype, NativeNvfp4, TensorDesc, TensorKind};

use super::{
    CONFIG_FILE, Catalog, Claimed, ConvertError, FtwTensor, MoeProfile, SourceSpan, TensorSource,
    fmt_err,
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
        claimed: &mut Claimed,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<(Vec<TensorDesc>, Vec<Vec<TensorSource>>), ConvertError> {
        let layer = FusedLayer::new(self, cat, l)?;
        let gu = layer.gate_up_parts(claimed)?;
        let down = layer.down_parts(claimed)?;
        layer.input_scales(claimed, ftw_extra)?;
        self.refuse_protected_fused(&layer.prefix, [&gu[0], &down[0]])?;
        let (h, i) = (layer.hidden, layer.inter);
        let gate_nv = NativeNvfp4::new(&gu[0].tensor, &[i, h / 2], &[i, h / 16], &[])
            .map_err(fmt_err(&gu[0].tensor))?;
        let down_nv = NativeNvfp4::new(&down[0].tensor, &[h, i / 2], &[h, i / 16], &[])
            .map_err(fmt_err(&down[0].tensor))?;
        let records = layer.records(&gu, &gate_nv, &down, &down_nv)?;
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

    /// Refuses fused quantized weights (`weights`) that the config's
    /// `ignore` or `--protect` name, by their module `prefix` or by name.
    fn refuse_protected_fused(
        &self,
        prefix: &str,
        weights: [&SourceSpan; 2],
    ) -> Result<(), ConvertError> {
        for s in weights {
            if let Some(by) = self
                .protected_by(prefix)
                .or_else(|| self.protected_by(&s.tensor))
            {
                return Err(ConvertError::ProtectedQuantized {
                    file: s.file.to_string(),
                    tensor: s.tensor.to_string(),
                    by,
                });
            }
        }
        Ok(())
    }
}

/// The fused NVFP4 experts of one layer: where their tensors are and the
/// sizes the config gives them (`hidden` and `inter` positive multiples of
/// 16, `2 * inter` within 64 bits).
struct FusedLayer<'a> {
    cat: &'a Catalog<'a>,
    l: u64,
    /// `{layer_prefix}.{l}.mlp.experts`.
    prefix: String,
    hidden: u64,
    inter: u64,
    experts: u64,
    /// `2 * inter`: the rows of one expert's `gate_up_proj`.
    inter2: u64,
    /// The config values the shapes follow from, for a shape mismatch.
    because: String,
}

/// The three parts of a fused NVFP4 tensor: packed weights, block scales,
/// tensor scales.
type FusedParts = [SourceSpan; 3];

impl<'a> FusedLayer<'a> {
    /// Layer `l` of `profile`, its sizes checked.
    fn new(profile: &MoeProfile, cat: &'a Catalog<'a>, l: u64) -> Result<Self, ConvertError> {
        let (h, i, e_n) = (profile.hidden, profile.inter, profile.experts);
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
        let inter2 = i
            .checked_mul(2)
            .ok_or_else(|| overflow_error(l, e_n, i, h))?;
        Ok(FusedLayer {
            cat,
            l,
            prefix: format!("{}.{l}.mlp.experts", profile.layer_prefix),
            hidden: h,
            inter: i,
            experts: e_n,
            inter2,
            because: format!(
                "NVFP4 fused experts of layer {l}: num_experts {e_n}, moe_intermediate_size {i}, hidden_size {h}"
            ),
        })
    }

    /// The error for a size of this layer beyond 64 bits.
    fn overflow(&self) -> ConvertError {
        overflow_error(self.l, self.experts, self.inter, self.hidden)
    }

    /// `gate_up_proj` and its two scales, checked and claimed.
    fn gate_up_parts(&self, claimed: &mut Claimed) -> Result<FusedParts, ConvertError> {
        use safetensors::Dtype::{F8_E4M3, F32, U8};
        let (h, i2, e_n) = (self.hidden, self.inter2, self.experts);
        Ok([
            self.claim("gate_up_proj", U8, &[e_n, i2, h / 2], claimed)?,
            self.claim(
                "gate_up_proj_weight_scale",
                F8_E4M3,
                &[e_n, i2, h / 16],
                claimed,
            )?,
            self.claim("gate_up_proj_weight_scale_2", F32, &[e_n, 2], claimed)?,
        ])
    }

    /// `down_proj` and its two scales, checked and claimed.
    fn down_parts(&self, claimed: &mut Claimed) -> Result<FusedParts, ConvertError> {
        use safetensors::Dtype::{F8_E4M3, F32, U8};
        let (h, i, e_n) = (self.hidden, self.inter, self.experts);
        Ok([
            self.claim("down_proj", U8, &[e_n, h, i / 2], claimed)?,
            self.claim(
                "down_proj_weight_scale",
                F8_E4M3,
                &[e_n, h, i / 16],
                claimed,
            )?,
            self.claim("down_proj_weight_scale_2", F32, &[e_n], claimed)?,
        ])
    }

    /// The span of tensor `{prefix}.{suffix}`, checked to have dtype `want`
    /// and shape `shape`, and claimed.
    fn claim(
        &self,
        suffix: &str,
        want: safetensors::Dtype,
        shape: &[u64],
        claimed: &mut Claimed,
    ) -> Result<SourceSpan, ConvertError> {
        let l = self.l;
        let n = format!("{}.{suffix}", self.prefix);
        let (f, t) = self
            .cat
            .get(&n)
            .ok_or_else(|| ConvertError::MissingTensor {
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
                because: self.because.clone(),
            });
        }
        let span = self
            .cat
            .span(&n)
            .ok_or_else(|| ConvertError::MissingTensor {
                tensor: n.clone(),
                needed_for: format!("the NVFP4 fused experts of layer {l}"),
            })?;
        claimed.insert(span.tensor.clone());
        Ok(span)
    }

    /// The optional activation input scales, claimed and carried into
    /// `ftw_extra`.
    fn input_scales(
        &self,
        claimed: &mut Claimed,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<(), ConvertError> {
        let e_n = self.experts;
        for (suffix, shape) in [
            ("gate_up_proj_input_scale", vec![e_n, 2]),
            ("down_proj_input_scale", vec![e_n]),
        ] {
            let n = format!("{}.{suffix}", self.prefix);
            if self.cat.get(&n).is_some() {
                let what = format!("the activation input_scale of the {}", self.because);
                let scale = f32_scale(self.cat, &n, &[&shape], &what)?;
                claimed.extend(scale.source.spans().iter().map(|s| s.tensor.clone()));
                ftw_extra.push(scale);
            }
        }
        Ok(())
    }

    /// One record per expert: `gate_proj` and `up_proj` from row blocks
    /// `2e` and `2e + 1` of `gu`, `down_proj` from row block `e` of `down`.
    fn records(
        &self,
        gu: &FusedParts,
        gate_nv: &NativeNvfp4,
        down: &FusedParts,
        down_nv: &NativeNvfp4,
    ) -> Result<Vec<Vec<TensorSource>>, ConvertError> {
        let mut records = Vec::with_capacity(usize::try_from(self.experts).unwrap_or(0));
        for e in 0..self.experts {
            let g = e.checked_mul(2).ok_or_else(|| self.overflow())?;
            records.push(vec![
                self.native(gu, gate_nv, g)?,
                self.native(gu, gate_nv, g + 1)?,
                self.native(down, down_nv, e)?,
            ]);
        }
        Ok(records)
    }

    /// Row block `k` of all three `parts`, sized as `nv` says.
    fn native(
        &self,
        parts: &FusedParts,
        nv: &NativeNvfp4,
        k: u64,
    ) -> Result<TensorSource, ConvertError> {
        let [w, sc, s2] = nv.part_lens();
        Ok(TensorSource::Native(Box::new([
            self.block(&parts[0], k, w)?,
            self.block(&parts[1], k, sc)?,
            self.block(&parts[2], k, s2)?,
        ])))
    }

    /// Block `k` of `len` bytes of `s`; the shape checks make every block
    /// the config allows lie inside the tensor.
    fn block(&self, s: &SourceSpan, k: u64, len: u64) -> Result<SourceSpan, ConvertError> {
        let off = k.checked_mul(len).ok_or_else(|| self.overflow())?;
        let end = off.checked_add(len).ok_or_else(|| self.overflow())?;
        if end > s.len {
            return Err(self.overflow());
        }
        Ok(SourceSpan {
            offset: s.offset.checked_add(off).ok_or_else(|| self.overflow())?,
            len,
            ..s.clone()
        })
    }
}

/// The error for a size of the fused experts of layer `l` beyond 64 bits.
fn overflow_error(l: u64, e_n: u64, i: u64, h: u64) -> ConvertError {
    ConvertError::BadConfig {
        file: CONFIG_FILE.into(),
        field: "num_experts".into(),
        problem: format!(
            "num_experts {e_n}, moe_intermediate_size {i}, hidden_size {h}: the fused experts of layer {l} overflow 64-bit sizes"
        ),
    }
}
