//! ModelOpt NVFP4 sources, recognised by one rule for the built-in profiles
//! and recipes alike: the `weight` / `weight_scale` / `weight_scale_2`
//! triplet of a module, and the activation `input_scale` beside it.
//! Everything is passed through as byte spans of the source, never
//! re-quantized.
//!
//! Module `X` is NVFP4 ([`is_nvfp4`]) when `X.weight` is U8 or when
//! `X.weight_scale` or `X.weight_scale_2` exists; its triplet must then be
//! complete and well typed ([`nvfp4_triplet`]). `X.input_scale` (F32, shape
//! `[]` or `[1]`) goes with an NVFP4 `X` and is an orphan beside anything
//! else ([`companion_of`]).

use std::sync::Arc;

use ftpipe_formats::{Dtype, NativeNvfp4, TensorDesc, TensorKind};

use crate::component::{Catalog, FtwTensor, SourceSpan, TensorSource, fmt_err};
use crate::error::ConvertError;

/// Shapes of a ModelOpt activation `input_scale` (W4A4 calibration): one element.
pub(crate) const INPUT_SCALE_SHAPES: [&[u64]; 2] = [&[], &[1]];

/// The parts of a triplet, in body order.
pub(crate) const NVFP4_PARTS: [&str; 3] = ["weight", "weight_scale", "weight_scale_2"];

/// The F32 tensor `name`, whose shape must be one of `shapes`, as a `Plain`
/// FTW tensor copied from its source span; `what` says what it is.
pub(crate) fn f32_scale(
    cat: &Catalog,
    name: &str,
    shapes: &[&[u64]],
    what: &str,
) -> Result<FtwTensor, ConvertError> {
    let missing = || ConvertError::MissingTensor {
        tensor: name.to_owned(),
        needed_for: what.to_owned(),
    };
    let (file, t) = cat.get(name).ok_or_else(missing)?;
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
            // Message only; callers always pass at least one shape.
            expected: shapes.first().map(|s| s.to_vec()).unwrap_or_default(),
            actual: t.shape().to_vec(),
            because: what.to_owned(),
        });
    }
    Ok(FtwTensor {
        desc: TensorDesc::new(name, Dtype::F32, TensorKind::Plain, t.shape()),
        source: TensorSource::Span(cat.span(name).ok_or_else(missing)?),
    })
}

/// The optional `input_scale` of NVFP4 `module`, checked.
pub(crate) fn input_scale_of(
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

/// Whether `module` is stored as an NVFP4 triplet: its `weight` is U8, or a
/// `weight_scale` or `weight_scale_2` sits beside it.
pub(crate) fn is_nvfp4(cat: &Catalog, module: &str) -> bool {
    cat.get(&format!("{module}.weight"))
        .is_some_and(|(_, w)| w.dtype() == safetensors::Dtype::U8)
        || cat.get(&format!("{module}.weight_scale")).is_some()
        || cat.get(&format!("{module}.weight_scale_2")).is_some()
}

/// For a tensor no rule has placed: `Ok(Some(module))` when it is a scale
/// of NVFP4 `module`, placed with `{module}.weight`; `Ok(None)` when it is
/// no NVFP4 part at all; an error for a scale without its weight and for
/// an `input_scale` beside a module that is not NVFP4.
pub(crate) fn companion_of<'n>(
    cat: &Catalog,
    file: &str,
    name: &'n str,
) -> Result<Option<&'n str>, ConvertError> {
    if let Some(module) = name.strip_suffix(".input_scale") {
        if is_nvfp4(cat, module) {
            return Ok(Some(module));
        }
        return Err(ConvertError::OrphanInputScale {
            file: file.to_owned(),
            tensor: name.to_owned(),
            module: module.to_owned(),
            expected: format!("{module}.weight_scale"),
        });
    }
    let Some(module) = name
        .strip_suffix(".weight_scale_2")
        .or_else(|| name.strip_suffix(".weight_scale"))
    else {
        return Ok(None);
    };
    let weight = format!("{module}.weight");
    if cat.get(&weight).is_none() {
        return Err(ConvertError::MissingTensor {
            tensor: weight,
            needed_for: format!("the NVFP4 triplet of {name}"),
        });
    }
    Ok(Some(module))
}

/// An NVFP4 module as it goes to the output: the native tensor over its
/// triplet, and its checked `input_scale` bound for the FTW stream.
pub(crate) struct Nvfp4Module {
    /// Logical shape and part lengths.
    pub native: NativeNvfp4,
    /// `weight ‖ weight_scale ‖ weight_scale_2`.
    pub source: TensorSource,
    /// The activation `input_scale`, when present.
    pub input_scale: Option<FtwTensor>,
    /// Every source tensor it takes.
    pub claimed: Vec<Arc<str>>,
}

/// NVFP4 `module` ([`is_nvfp4`] holds) with its triplet and input scale checked.
pub(crate) fn nvfp4_module(cat: &Catalog, module: &str) -> Result<Nvfp4Module, ConvertError> {
    let (native, spans) = nvfp4_triplet(cat, module)?;
    let input_scale = input_scale_of(cat, module)?;
    let claimed = spans
        .iter()
        .chain(input_scale.iter().flat_map(|t| t.source.spans()))
        .map(|s| s.tensor.clone())
        .collect();
    Ok(Nvfp4Module {
        native,
        source: TensorSource::Native(Box::new(spans)),
        input_scale,
        claimed,
    })
}

/// The ModelOpt NVFP4 triplet of `module` (`weight` U8, `weight_scale`
/// F8_E4M3, `weight_scale_2` F32), each part checked, as one native tensor
/// and its three source spans in body order.
pub(crate) fn nvfp4_triplet(
    cat: &Catalog,
    module: &str,
) -> Result<(NativeNvfp4, [SourceSpan; 3]), ConvertError> {
    // A missing part says more than a mistyped one: look for all first.
    for p in NVFP4_PARTS {
        let n = format!("{module}.{p}");
        if cat.get(&n).is_none() {
            return Err(ConvertError::MissingTensor {
                tensor: n,
                needed_for: format!("the NVFP4 triplet of {module}"),
            });
        }
    }
    let mut parts = Vec::with_capacity(3);
    let mut spans = Vec::with_capacity(3);
    for (p, want) in NVFP4_PARTS.iter().zip([
        safetensors::Dtype::U8,
        safetensors::Dtype::F8_E4M3,
        safetensors::Dtype::F32,
    ]) {
        let n = format!("{module}.{p}");
        let missing = || ConvertError::MissingTensor {
            tensor: n.clone(),
            needed_for: format!("the NVFP4 triplet of {module}"),
        };
        let (f, t) = cat.get(&n).ok_or_else(missing)?;
        if t.dtype() != want {
            return Err(ConvertError::DtypeMismatch {
                file: f.to_owned(),
                tensor: n.clone(),
                expected: format!("{want:?} (part of the NVFP4 triplet of {module})"),
                actual: format!("{:?}", t.dtype()),
            });
        }
        parts.push(t);
        spans.push(cat.span(&n).ok_or_else(missing)?);
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
