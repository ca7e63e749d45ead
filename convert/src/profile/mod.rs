//! Profiles: which source tensor goes into which output component, chosen
//! from `config.json`'s `model_type`.
//!
//! * `qwen4_exp`, flat (text-only) layout: experts per-expert
//!   (`mlp.experts.{e}.{gate,up,down}_proj`) in BF16 or as ModelOpt NVFP4 triplets (`weight` U8 [out, in/2],
//!   `weight_scale` F8_E4M3 [out, in/16], `weight_scale_2` F32 scalar), or
//!   fused, with `p = model.layers.{l}.mlp.experts`, E = `num_experts`,
//!   I = `moe_intermediate_size`, H = `hidden_size`:
//!   - BF16: `{p}.gate_up_proj` [E, 2I, H], `{p}.down_proj` [E, H, I];
//!   - NVFP4: `{p}.gate_up_proj` U8 [E, 2I, H/2],
//!     `{p}.gate_up_proj_weight_scale` F8_E4M3 [E, 2I, H/16],
//!     `{p}.gate_up_proj_weight_scale_2` F32 [E, 2] (column 0 gate, 1 up),
//!     `{p}.down_proj` U8 [E, H, I/2], `{p}.down_proj_weight_scale` F8_E4M3
//!     [E, H, I/16], `{p}.down_proj_weight_scale_2` F32 [E], and optionally
//!     `{p}.gate_up_proj_input_scale` F32 [E, 2] and
//!     `{p}.down_proj_input_scale` F32 [E].
//!
//!   In both fused layouts rows [0, I) of expert `e` are its `gate_proj`,
//!   rows [I, 2I) its `up_proj`; each record field is a byte sub-span of the
//!   fused tensors (NVFP4: of all three parts), so the sidecar is byte for
//!   byte the one the equivalent per-expert tensors give. The PLE n-gram
//!   table comes as `split_ngram_parts` shards
//!   `model.layers.{l}.ple.ple_embedding.ngram_embedding.shard_{i}.weight`.
//! * `qwen4_exp` with `text_config` (the released layout): the text model
//!   under `model.language_model.` plus `lm_head.weight`, checked against
//!   the contract [`release`] derives from `layer_types` and the dims (every
//!   mismatch in one error); `model.visual.*` and `mtp.*` are omitted and
//!   listed; the PLE table's geometry follows the primes rule, and an
//!   F8_E4M3 table is decoded with its scale before Q3. This is the primary
//!   layout. The flat one above (`model.layers.{l}`, a top-level config) is
//!   read only when `config.json` declares it with `architectures`
//!   [`FLAT_QWEN4_ARCHITECTURES`] (the text-only model class); any other
//!   `qwen4_exp` config without `text_config` is an error naming
//!   `text_config`.
//! * `qwen3_moe`: per-expert experts only, no PLE.
//! * any other `model_type`: a declarative TOML [`Recipe`] given with
//!   `--recipe FILE.toml` ([`crate::recipe`]).
//!
//! Both MoE profiles accept ModelOpt's activation calibration
//! `{module}.input_scale` (F32, shape [] or [1]) beside any NVFP4 triplet,
//! experts included, and carry it unchanged into `model.ftw` as a `Plain` F32
//! tensor under its source name (the fused `*_input_scale` likewise); an
//! `input_scale` beside a module that is not NVFP4 is an error.
//!
//! Components: the active FTW v1 stream `model.ftw` (every other tensor:
//! NVFP4 `Native` where the source is an NVFP4 triplet, never re-quantized;
//! `Protected` where `quantization_config.ignore` names it; else `Plain`),
//! one FTEXPERT1 sidecar per MoE layer `experts/layer_{l:03}.ftexpert`
//! (fields `gate_proj`, `up_proj`, `down_proj`, each NVFP4 or BF16), and per
//! PLE layer the Q3_PLE_32 segments `ple/layer_{l:03}/shard_{i}.q3` plus
//! `ple/layer_{l:03}/global_scale.bf16`.
//!
//! Every tensor of the source must be claimed by exactly one rule and every
//! tensor a rule requires must be present with the shape the config implies;
//! otherwise a [`ConvertError`] names it. Sizes come from
//! `ftpipe_formats::sizes`, exact.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::Value;

use ftpipe_artifact::manifest::Partition;
use ftpipe_formats::{Dtype, TensorDesc, TensorKind, sizes};

use crate::error::ConvertError;
use crate::nvfp4::{NVFP4_PARTS, companion_of, is_nvfp4, nvfp4_module};
use crate::recipe::{Recipe, RecipeError};
use crate::safetensors::{SourceHeader, SourceTensor};

pub use crate::component::{
    CONFIG_FILE, Catalog, CheckedSpan, Component, ComponentContent, ComponentKind, FtwTensor,
    KNOWN_MODEL_TYPES, SourceSpan, TensorSource,
};
use crate::component::{FtwBuilder, expert_sidecar, fmt_err, plain_dtype};

/// The source tensors the rules have taken so far, by name: looked up once
/// per tensor of the source, so hashed (long names sharing prefixes make
/// an ordered set's comparisons the plan's largest cost).
type Claimed = HashSet<Arc<str>, foldhash::fast::RandomState>;

mod config;
mod fused;
pub mod release;
use config::TextConfig;
use fused::FUSED_NAMES;
pub use release::{OmittedTensor, Release};

// ---------------------------------------------------------------------------
// Config access.

fn glob_set(patterns: &[String], what: &str) -> Result<GlobSet, ConvertError> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(
            Glob::new(p).map_err(|source| ConvertError::InvalidConfigGlob {
                file: CONFIG_FILE.into(),
                field: what.into(),
                pattern: p.clone(),
                source: Box::new(source),
            })?,
        );
    }
    b.build().map_err(|source| ConvertError::InvalidConfigGlob {
        file: CONFIG_FILE.into(),
        field: what.into(),
        pattern: patterns.join(" "),
        source: Box::new(source),
    })
}

/// `architectures` of a flat (text-only, pre-release) `qwen4_exp` config.
pub const FLAT_QWEN4_ARCHITECTURES: &[&str] = &["Qwen4ExpForCausalLM"];

/// A `qwen4_exp` config without `text_config` is read in the flat layout
/// only when it declares the text-only architecture; the released layout
/// (`Qwen4ExpForConditionalGeneration`) must have its `text_config`.
fn flat_qwen4_declared(cfg: &Value) -> Result<(), ConvertError> {
    let arch = cfg.get("architectures");
    let declared = arch.and_then(Value::as_array).is_some_and(|a| {
        a.iter()
            .map(Value::as_str)
            .eq(FLAT_QWEN4_ARCHITECTURES.iter().map(|s| Some(*s)))
    });
    if declared {
        return Ok(());
    }
    Err(ConvertError::BadConfig {
        file: CONFIG_FILE.into(),
        field: "text_config".into(),
        problem: format!(
            "is missing: the released qwen4_exp layout has the text model under text_config; \
             the flat layout (model.layers.N.*) is read only for architectures {FLAT_QWEN4_ARCHITECTURES:?}, \
             and config.json has architectures {}",
            arch.map_or_else(|| "missing".to_owned(), Value::to_string)
        ),
    })
}

/// `num_experts_per_tok` of the text model, read where the layout keeps it
/// (`text_config.num_experts_per_tok` in the released multimodal layout,
/// the top level in flat ones). The placement's `read_queue_depth` follows
/// from it (docs/formats.md), so a missing key is an error naming its JSON
/// path, never a default.
pub fn experts_per_token(cfg: &Value) -> Result<u64, ConvertError> {
    TextConfig::of(cfg)?.u64("num_experts_per_tok")
}

/// The `model_type` of a config.
pub fn model_type(cfg: &Value) -> Result<&str, ConvertError> {
    cfg.get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| ConvertError::BadConfig {
            file: CONFIG_FILE.into(),
            field: "model_type".into(),
            problem: "is missing or not a string".into(),
        })
}

// ---------------------------------------------------------------------------
// Profiles.

/// The PLE table geometry from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PleConfig {
    layers: Vec<u64>,
    rows: u64,
    width: u64,
    parts: u64,
}

/// The rules of the Qwen MoE families.
#[derive(Debug, Clone)]
pub struct MoeProfile {
    family: &'static str,
    /// `model.layers` (flat) or `model.language_model.layers` (release).
    layer_prefix: &'static str,
    /// The release contract, for a config with `text_config`.
    release: Option<Box<Release>>,
    layers: u64,
    hidden: u64,
    vocab: u64,
    experts: u64,
    inter: u64,
    moe_layers: BTreeSet<u64>,
    tied: bool,
    allow_fused: bool,
    ple: Option<PleConfig>,
    ignore: GlobSet,
    /// The `--protect` globs (a converter option, not part of the config).
    protect: Vec<String>,
    protect_set: GlobSet,
}

/// A profile chosen from `config.json`.
#[derive(Debug, Clone)]
pub enum Profile {
    /// `qwen4_exp` or `qwen3_moe`.
    Moe(MoeProfile),
    /// A declarative TOML recipe (`--recipe FILE.toml`) for any other model.
    Recipe(Recipe),
}

impl Profile {
    /// Chooses the profile for `cfg` by `model_type`.
    pub fn from_config(cfg: &Value) -> Result<Profile, ConvertError> {
        let mt = model_type(cfg)?;
        let family = match mt {
            "qwen4_exp" => "qwen4_exp",
            "qwen3_moe" => "qwen3_moe",
            other => {
                return Err(ConvertError::UnknownModelType {
                    file: CONFIG_FILE.into(),
                    model_type: other.to_owned(),
                    known: KNOWN_MODEL_TYPES.join(", "),
                });
            }
        };
        let q4 = family == "qwen4_exp";
        let text = TextConfig::of(cfg)?;
        let layers = text.u64("num_hidden_layers")?;
        if q4 && !text.nested() {
            flat_qwen4_declared(cfg)?;
        }
        let experts = text.u64("num_experts")?;
        let step = text.u64_or("decoder_sparse_step", 1)?.max(1);
        let mlp_only: BTreeSet<u64> = text.u64_list("mlp_only_layers")?.into_iter().collect();
        let moe_layers = (0..layers)
            .filter(|l| experts > 0 && !mlp_only.contains(l) && (l + 1) % step == 0)
            .collect();
        let ignore: Vec<String> = match cfg.pointer("/quantization_config/ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| ConvertError::BadConfig {
                file: CONFIG_FILE.into(),
                field: "quantization_config.ignore".into(),
                problem: format!("is {v}, expected a list of strings"),
            })?,
        };
        let hidden = text.u64("hidden_size")?;
        let vocab = text.u64("vocab_size")?;
        let release = if q4 && text.nested() {
            Some(Box::new(Release::from_text(
                &text, layers, hidden, vocab, experts,
            )?))
        } else {
            None
        };
        let ple = if q4 && release.is_none() && text.get("ple_layer_ids").is_some() {
            let p = PleConfig {
                layers: text.u64_list("ple_layer_ids")?,
                rows: text.u64("ple_ngram_rows")?,
                width: text.u64("ple_embedding_dim")?,
                parts: text.u64("split_ngram_parts")?,
            };
            if p.parts == 0 || p.width == 0 || !p.width.is_multiple_of(32) {
                return Err(text.bad(
                    "ple_embedding_dim",
                    format!(
                        "is {}: the width must be a positive multiple of 32 and split_ngram_parts ({}) positive",
                        p.width, p.parts
                    ),
                ));
            }
            Some(p)
        } else {
            None
        };
        Ok(Profile::Moe(MoeProfile {
            family,
            layer_prefix: if release.is_some() {
                "model.language_model.layers"
            } else {
                "model.layers"
            },
            release,
            layers,
            hidden,
            vocab,
            experts,
            inter: text.u64("moe_intermediate_size")?,
            moe_layers,
            tied: text.bool_or("tie_word_embeddings", false)?,
            allow_fused: q4,
            ple,
            ignore: glob_set(&ignore, "quantization_config.ignore")?,
            protect: Vec::new(),
            protect_set: GlobSet::empty(),
        }))
    }

    /// Chooses the profile as [`Profile::from_config_with_recipe`] does and
    /// keeps the tensors matching `protect` (`--protect`) BF16, marked
    /// protected, beside those of `quantization_config.ignore`. `--protect`
    /// applies to the built-in profiles; a recipe says `dtype = "protected"`.
    pub fn with_options(
        cfg: &Value,
        recipe: Option<&Recipe>,
        protect: &[String],
    ) -> Result<Profile, ConvertError> {
        if let (Some(r), Some(glob)) = (recipe, protect.first()) {
            return Err(ConvertError::BadProtect {
                glob: glob.clone(),
                problem: format!(
                    "cannot be combined with --recipe {}; use dtype = \"protected\" in the recipe",
                    r.file()
                ),
            });
        }
        let mut profile = Profile::from_config_with_recipe(cfg, recipe)?;
        if let Profile::Moe(m) = &mut profile
            && !protect.is_empty()
        {
            let mut b = GlobSetBuilder::new();
            for p in protect {
                if p.is_empty() {
                    return Err(ConvertError::BadProtect {
                        glob: p.clone(),
                        problem: "is empty".into(),
                    });
                }
                b.add(
                    Glob::new(p).map_err(|source| ConvertError::InvalidProtectGlob {
                        glob: p.clone(),
                        source,
                    })?,
                );
            }
            m.protect_set = b
                .build()
                .map_err(|source| ConvertError::InvalidProtectGlob {
                    glob: protect.join(" "),
                    source,
                })?;
            m.protect = protect.to_vec();
        }
        Ok(profile)
    }

    /// Uses `recipe` when given (its `model_type` must be `cfg`'s), else
    /// chooses a built-in profile as [`Profile::from_config`] does.
    pub fn from_config_with_recipe(
        cfg: &Value,
        recipe: Option<&Recipe>,
    ) -> Result<Profile, ConvertError> {
        let Some(r) = recipe else {
            return Profile::from_config(cfg);
        };
        let mt = model_type(cfg)?;
        if mt != r.model_type() {
            return Err(RecipeError::ModelType {
                file: r.file().to_owned(),
                recipe: r.model_type().to_owned(),
                config: mt.to_owned(),
            }
            .into());
        }
        Ok(Profile::Recipe(r.bind(cfg)?))
    }

    /// The profile's name.
    pub fn name(&self) -> &str {
        match self {
            Profile::Moe(m) => m.family,
            Profile::Recipe(r) => r.name(),
        }
    }

    /// The partition of source tensor `tensor`: in the released layout
    /// by its name (`None` when it is in none); every tensor of the other
    /// layouts is text, which the artifact needs.
    pub fn partition(&self, tensor: &str) -> Option<Partition> {
        match self {
            Profile::Moe(MoeProfile {
                release: Some(_), ..
            }) => release::partition_of(tensor),
            Profile::Moe(_) | Profile::Recipe(_) => Some(Partition::Text),
        }
    }

    /// Maps every source tensor to a component and predicts each size.
    pub fn components(&self, headers: &[SourceHeader]) -> Result<Vec<Component>, ConvertError> {
        self.map(headers).map(|(c, _)| c)
    }

    /// The components, and the source tensors of other partitions (vision,
    /// MTP) left out of the artifact.
    pub fn map<'a>(
        &self,
        headers: impl IntoIterator<Item = &'a SourceHeader>,
    ) -> Result<(Vec<Component>, Vec<OmittedTensor>), ConvertError> {
        let cat = Catalog::new(headers)?;
        match self {
            Profile::Moe(m) => match &m.release {
                Some(r) => m.release_components(r, &cat),
                None => m.components(&cat).map(|c| (c, Vec::new())),
            },
            Profile::Recipe(r) => r.components(&cat).map(|c| (c, Vec::new())),
        }
    }
}

/// A linear layer's weight as found in the source.
struct Linear {
    dtype: Dtype,
    kind: TensorKind,
    shape: Vec<u64>,
    source: TensorSource,
    claimed: Vec<Arc<str>>,
    /// The NVFP4 module's activation `input_scale`, bound for the FTW stream.
    input_scale: Option<FtwTensor>,
}

impl MoeProfile {
    fn protected(&self, module: &str) -> bool {
        self.protected_by(module).is_some()
    }

    /// What protects `module`: `quantization_config.ignore` or the first
    /// `--protect` glob matching it (or its `.weight`).
    fn protected_by(&self, module: &str) -> Option<String> {
        let weight = format!("{module}.weight");
        if self.ignore.is_match(module) || self.ignore.is_match(&weight) {
            return Some("quantization_config.ignore".into());
        }
        let mut hits = self.protect_set.matches(module);
        hits.extend(self.protect_set.matches(&weight));
        let first = hits.into_iter().min()?;
        Some(format!("--protect {:?}", self.protect[first]))
    }

    /// The weight of linear `module` (BF16/F16/F32 or an NVFP4 triplet) with
    /// logical shape `expected`.
    fn linear(
        &self,
        cat: &Catalog,
        module: &str,
        expected: &[u64],
        needed_for: &str,
    ) -> Result<Linear, ConvertError> {
        let name = format!("{module}.weight");
        let (file, w) = cat.get(&name).ok_or_else(|| ConvertError::MissingTensor {
            tensor: name.clone(),
            needed_for: needed_for.to_owned(),
        })?;
        if is_nvfp4(cat, module) {
            let nv = nvfp4_module(cat, module)?;
            if let Some(by) = self.protected_by(module) {
                return Err(ConvertError::ProtectedQuantized {
                    file: file.to_owned(),
                    tensor: name,
                    by,
                });
            }
            if nv.native.shape() != expected {
                let mut want = expected.to_vec();
                if let Some(last) = want.last_mut() {
                    *last /= 2;
                }
                return Err(ConvertError::ShapeMismatch {
                    file: file.to_owned(),
                    tensor: name,
                    expected: want,
                    actual: w.shape().to_vec(),
                    because: format!(
                        "NVFP4 packs 2 per byte of logical {expected:?}; {needed_for}"
                    ),
                });
            }
            return Ok(Linear {
                dtype: Dtype::Nvfp4,
                kind: TensorKind::Native,
                shape: nv.native.shape().to_vec(),
                source: nv.source,
                claimed: nv.claimed,
                input_scale: nv.input_scale,
            });
        }
        let dtype = match w.dtype() {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::F32 => Dtype::F32,
            other => {
                return Err(ConvertError::DtypeMismatch {
                    file: file.to_owned(),
                    tensor: name,
                    expected: "BF16, F16, F32 or an NVFP4 triplet".into(),
                    actual: format!("{other:?}"),
                });
            }
        };
        if w.shape() != expected {
            return Err(ConvertError::ShapeMismatch {
                file: file.to_owned(),
                tensor: name,
                expected: expected.to_vec(),
                actual: w.shape().to_vec(),
                because: needed_for.to_owned(),
            });
        }
        Ok(Linear {
            dtype,
            kind: if self.protected(module) {
                TensorKind::Protected
            } else {
                TensorKind::Plain
            },
            shape: w.shape().to_vec(),
            claimed: vec![w.shared_name().clone()],
            source: TensorSource::Span(cat.span(&name).expect("present")),
            // A BF16 module's input_scale stays unclaimed: the FTW stream
            // refuses it as an orphan.
            input_scale: None,
        })
    }

    /// The FTEXPERT1 component of MoE layer `l`; tensors it reads go to
    /// `claimed`, the experts' input scales to `ftw_extra`.
    fn expert_component(
        &self,
        cat: &Catalog,
        l: u64,
        claimed: &mut Claimed,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<Component, ConvertError> {
        let name = format!("experts/layer_{l:03}.ftexpert");
        let (fields, records) = match self.expert_layout(cat, l) {
            ExpertLayout::FusedNvfp4 => self.fused_nvfp4(cat, l, claimed, ftw_extra)?,
            ExpertLayout::FusedBf16 => self.fused_bf16(cat, l, claimed)?,
            ExpertLayout::PerExpert => self.per_expert(cat, l, claimed, ftw_extra)?,
        };
        expert_sidecar(name, l, fields, records)
    }

    /// How the experts of MoE layer `l` are stored: fused (when the profile
    /// allows it and any fused name is present), NVFP4 when a fused scale is
    /// present or a fused weight is U8.
    fn expert_layout(&self, cat: &Catalog, l: u64) -> ExpertLayout {
        let p = format!("{}.{l}.mlp.experts", self.layer_prefix);
        let fused = self.allow_fused
            && FUSED_NAMES
                .iter()
                .any(|n| cat.get(&format!("{p}.{n}")).is_some());
        let nvfp4_fused = fused
            && (FUSED_NAMES[2..]
                .iter()
                .any(|n| cat.get(&format!("{p}.{n}")).is_some())
                || FUSED_NAMES[..2].iter().any(|n| {
                    cat.get(&format!("{p}.{n}"))
                        .is_some_and(|(_, t)| t.dtype() == safetensors::Dtype::U8)
                }));
        if nvfp4_fused {
            ExpertLayout::FusedNvfp4
        } else if fused {
            ExpertLayout::FusedBf16
        } else {
            ExpertLayout::PerExpert
        }
    }

    /// The record layout and records of the fused BF16 experts of layer `l`:
    /// expert `e`'s `gate_proj` and `up_proj` are its two row halves of
    /// `gate_up_proj`, its `down_proj` its block of `down_proj`.
    fn fused_bf16(
        &self,
        cat: &Catalog,
        l: u64,
        claimed: &mut Claimed,
    ) -> Result<ExpertRecords, ConvertError> {
        let (h, i, e_n) = (self.hidden, self.inter, self.experts);
        let p = format!("{}.{l}.mlp.experts", self.layer_prefix);
        let because = format!("num_experts {e_n}, moe_intermediate_size {i}, hidden_size {h}");
        let gu = fused_bf16_span(
            cat,
            &format!("{p}.gate_up_proj"),
            [e_n, 2 * i, h],
            l,
            &because,
        )?;
        claimed.insert(gu.tensor.clone());
        let d = fused_bf16_span(cat, &format!("{p}.down_proj"), [e_n, h, i], l, &because)?;
        claimed.insert(d.tensor.clone());
        let kind = if self.protected(&p) {
            TensorKind::Protected
        } else {
            TensorKind::Plain
        };
        let fields = vec![
            TensorDesc::new("gate_proj", Dtype::BF16, kind, [i, h]),
            TensorDesc::new("up_proj", Dtype::BF16, kind, [i, h]),
            TensorDesc::new("down_proj", Dtype::BF16, kind, [h, i]),
        ];
        let half = i * h * 2;
        let sub = |s: &SourceSpan, off: u64, len: u64| {
            TensorSource::Span(SourceSpan {
                offset: s.offset + off,
                len,
                ..s.clone()
            })
        };
        let mut records = Vec::with_capacity(e_n as usize);
        for e in 0..e_n {
            records.push(vec![
                sub(&gu, e * 2 * half, half),
                sub(&gu, e * 2 * half + half, half),
                sub(&d, e * half, half),
            ]);
        }
        Ok((fields, records))
    }

    /// The record layout and records of the per-expert tensors of layer
    /// `l` (`{p}.{e}.{gate,up,down}_proj`), every expert laid out as the
    /// first.
    fn per_expert(
        &self,
        cat: &Catalog,
        l: u64,
        claimed: &mut Claimed,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<ExpertRecords, ConvertError> {
        let mut fields: Option<Vec<TensorDesc>> = None;
        let mut records = Vec::with_capacity(self.experts as usize);
        for e in 0..self.experts {
            let (descs, rec) = self.expert_record(cat, l, e, claimed, ftw_extra)?;
            match &fields {
                None => fields = Some(descs),
                Some(f0) => same_expert_layout(l, e, f0, &descs)?,
            }
            records.push(rec);
        }
        let fields = fields.ok_or_else(|| {
            ConvertError::internal(format!("MoE layer {l} has no experts (num_experts is 0)"))
        })?;
        Ok((fields, records))
    }

    /// The field descriptions and sources of expert `e` of layer `l`; the
    /// tensors it reads go to `claimed`, its input scales to `ftw_extra`.
    fn expert_record(
        &self,
        cat: &Catalog,
        l: u64,
        e: u64,
        claimed: &mut Claimed,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<(Vec<TensorDesc>, Vec<TensorSource>), ConvertError> {
        let (h, i) = (self.hidden, self.inter);
        let p = format!("{}.{l}.mlp.experts", self.layer_prefix);
        let mut rec = Vec::with_capacity(3);
        let mut descs = Vec::with_capacity(3);
        for (proj, shape) in [
            ("gate_proj", [i, h]),
            ("up_proj", [i, h]),
            ("down_proj", [h, i]),
        ] {
            let lin = self.linear(
                cat,
                &format!("{p}.{e}.{proj}"),
                &shape,
                &format!("expert {e} of layer {l} (moe_intermediate_size {i}, hidden_size {h})"),
            )?;
            claimed.extend(lin.claimed);
            ftw_extra.extend(lin.input_scale);
            descs.push(TensorDesc::new(proj, lin.dtype, lin.kind, lin.shape));
            rec.push(lin.source);
        }
        Ok((descs, rec))
    }

    fn ple_components(
        &self,
        cat: &Catalog,
        ple: &PleConfig,
        l: u64,
        claimed: &mut Claimed,
    ) -> Result<Vec<Component>, ConvertError> {
        let mut out = Vec::new();
        let mut spans = Vec::new();
        let mut total_rows = 0u64;
        for i in 0..ple.parts {
            let n = format!("model.layers.{l}.ple.ple_embedding.ngram_embedding.shard_{i}.weight");
            let (f, t) = cat.get(&n).ok_or_else(|| ConvertError::MissingTensor {
                tensor: n.clone(),
                needed_for: format!(
                    "PLE segment shard_{i} of layer {l} (split_ngram_parts {})",
                    ple.parts
                ),
            })?;
            if t.dtype() != safetensors::Dtype::BF16 {
                return Err(ConvertError::DtypeMismatch {
                    file: f.to_owned(),
                    tensor: n,
                    expected: "BF16 (PLE table)".into(),
                    actual: format!("{:?}", t.dtype()),
                });
            }
            let rows = match t.shape() {
                [rows, w] if *w == ple.width => *rows,
                s => {
                    return Err(ConvertError::ShapeMismatch {
                        file: f.to_owned(),
                        tensor: n,
                        expected: vec![s.first().copied().unwrap_or(0), ple.width],
                        actual: s.to_vec(),
                        because: format!("ple_embedding_dim {}", ple.width),
                    });
                }
            };
            total_rows = total_rows.saturating_add(rows);
            let span = cat.span(&n).expect("present");
            claimed.insert(span.tensor.clone());
            let name = format!("ple/layer_{l:03}/shard_{i}.q3");
            let predicted = sizes::q3_len(rows, ple.width).map_err(fmt_err(&name))?;
            out.push(Component {
                name,
                kind: ComponentKind::Q3Segment,
                predicted_bytes: predicted,
                items: rows,
                source_files: [f.to_owned()].into(),
                content: ComponentContent::Q3Segment {
                    layer: l,
                    index: i,
                    rows,
                    width: ple.width,
                    source: span.clone(),
                    scale: None,
                },
            });
            spans.push(span);
        }
        if total_rows != ple.rows {
            return Err(ConvertError::PleGeometry {
                layer: l,
                problem: format!(
                    "the {} shards hold {total_rows} rows, config ple_ngram_rows is {}",
                    ple.parts, ple.rows
                ),
            });
        }
        out.push(Component {
            name: format!("ple/layer_{l:03}/global_scale.bf16"),
            kind: ComponentKind::Q3GlobalScale,
            predicted_bytes: sizes::Q3_GLOBAL_SCALE_LEN,
            items: 1,
            source_files: spans.iter().map(|s| s.file.to_string()).collect(),
            content: ComponentContent::Q3GlobalScale {
                layer: l,
                segments: spans,
                scales: Vec::new(),
            },
        });
        Ok(out)
    }

    /// Why `name` (not claimed by the expert or PLE rules) may or may not go
    /// to the FTW stream: `Ok(())` when a rule allows it.
    fn ftw_allowed(&self, name: &str) -> Result<(), String> {
        let base = NVFP4_PARTS
            .iter()
            .rev()
            .find_map(|p| name.strip_suffix(&format!(".{p}")).map(|m| (m, *p)));
        let top = ["model.embed_tokens", "model.norm", "lm_head"];
        let Some(rest) = name.strip_prefix("model.layers.") else {
            return match base {
                Some((m, _)) if top.contains(&m) => Ok(()),
                _ => Err(format!("no rule of profile {} matches it", self.family)),
            };
        };
        let (idx, rest) = rest.split_once('.').unwrap_or((rest, ""));
        let l: u64 = idx
            .parse()
            .map_err(|_| format!("layer index {idx:?} is not a number"))?;
        if l >= self.layers {
            return Err(format!(
                "layer {l} is beyond num_hidden_layers {}",
                self.layers
            ));
        }
        let moe = self.moe_layers.contains(&l);
        if let Some(ex) = rest.strip_prefix("mlp.experts.") {
            if !moe {
                return Err(format!("layer {l} is not a MoE layer"));
            }
            // `split` yields at least one item; "" fails the parse below.
            let e = ex.split('.').next().unwrap_or_default();
            return match e.parse::<u64>() {
                Ok(e) if e >= self.experts => {
                    Err(format!("expert {e} is beyond num_experts {}", self.experts))
                }
                _ => Err(format!(
                    "not part of the expert layout of profile {}",
                    self.family
                )),
            };
        }
        let module = base.map(|(m, _)| m).unwrap_or(name);
        // Classification only: "" is no attention or MLP module.
        let module_rest = module
            .strip_prefix(&format!("model.layers.{l}."))
            .unwrap_or_default();
        let attn = [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "self_attn.q_norm",
            "self_attn.k_norm",
            "input_layernorm",
            "post_attention_layernorm",
        ];
        let moe_only = ["mlp.gate", "mlp.shared_expert_gate"];
        let dense = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"];
        let ok = (base.is_some()
            && (attn.contains(&module_rest)
                || (moe && moe_only.contains(&module_rest))
                || (moe && module_rest.starts_with("mlp.shared_expert."))
                || (!moe && dense.contains(&module_rest))))
            || rest.ends_with(".bias") && attn.contains(&rest.trim_end_matches(".bias"))
            || (self.ple.as_ref().is_some_and(|p| p.layers.contains(&l))
                && rest.starts_with("ple.")
                && !rest.starts_with("ple.ple_embedding.ngram_embedding."));
        if ok {
            Ok(())
        } else if rest.starts_with("ple.ple_embedding.ngram_embedding.") {
            Err(match &self.ple {
                Some(p) if p.layers.contains(&l) => {
                    format!("not one of the split_ngram_parts {} PLE shards", p.parts)
                }
                _ => format!("layer {l} has no PLE table in the config"),
            })
        } else {
            Err(format!("no rule of profile {} matches it", self.family))
        }
    }

    /// Checks a required FTW tensor's presence and (when given) shape.
    fn require(
        &self,
        cat: &Catalog,
        name: &str,
        expected: Option<&[u64]>,
        because: &str,
    ) -> Result<(), ConvertError> {
        let (f, t) = cat.get(name).ok_or_else(|| ConvertError::MissingTensor {
            tensor: name.to_owned(),
            needed_for: because.to_owned(),
        })?;
        if let Some(exp) = expected
            && t.shape() != exp
        {
            return Err(ConvertError::ShapeMismatch {
                file: f.to_owned(),
                tensor: name.to_owned(),
                expected: exp.to_vec(),
                actual: t.shape().to_vec(),
                because: because.to_owned(),
            });
        }
        Ok(())
    }

    fn components(&self, cat: &Catalog) -> Result<Vec<Component>, ConvertError> {
        self.require_non_experts(cat)?;
        let mut claimed = Claimed::default();
        let mut ftw_extra = Vec::new();
        let mut components = self.sidecar_components(cat, &mut claimed, &mut ftw_extra)?;
        // The experts' input scales, then everything else, go to the FTW stream.
        let mut ftw = FtwBuilder::default();
        for t in ftw_extra {
            ftw.insert(t)?;
        }
        for (name, file, t) in cat.iter() {
            if claimed.contains(name) {
                continue;
            }
            self.add_to_ftw(cat, &mut ftw, &mut claimed, (name, file, t))?;
        }
        components.insert(0, ftw.finish()?);
        Ok(components)
    }

    /// Checks the required non-expert tensors, with the shapes the config
    /// fixes.
    fn require_non_experts(&self, cat: &Catalog) -> Result<(), ConvertError> {
        let (h, v) = (self.hidden, self.vocab);
        let emb = format!("vocab_size {v}, hidden_size {h}");
        self.require(cat, "model.embed_tokens.weight", Some(&[v, h]), &emb)?;
        self.require(
            cat,
            "model.norm.weight",
            Some(&[h]),
            &format!("hidden_size {h}"),
        )?;
        if !self.tied {
            self.require(cat, "lm_head.weight", None, &emb)?;
        }
        for l in 0..self.layers {
            self.require_layer(cat, l)?;
        }
        Ok(())
    }

    /// Checks the norms, attention and router or dense MLP of layer `l`.
    fn require_layer(&self, cat: &Catalog, l: u64) -> Result<(), ConvertError> {
        let (h, e) = (self.hidden, self.experts);
        let p = format!("model.layers.{l}");
        for n in ["input_layernorm", "post_attention_layernorm"] {
            self.require(
                cat,
                &format!("{p}.{n}.weight"),
                Some(&[h]),
                &format!("hidden_size {h}"),
            )?;
        }
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            self.require(cat, &format!("{p}.self_attn.{n}.weight"), None, "attention")?;
        }
        if self.moe_layers.contains(&l) {
            self.require(
                cat,
                &format!("{p}.mlp.gate.weight"),
                Some(&[e, h]),
                &format!("the router of layer {l}: num_experts {e}, hidden_size {h}"),
            )?;
        } else {
            for n in ["gate_proj", "up_proj", "down_proj"] {
                self.require(
                    cat,
                    &format!("{p}.mlp.{n}.weight"),
                    None,
                    "a dense MLP layer",
                )?;
            }
        }
        Ok(())
    }

    /// The expert sidecars of the MoE layers, then the PLE components of
    /// the PLE layers; the tensors they read go to `claimed`, the experts'
    /// input scales to `ftw_extra`.
    fn sidecar_components(
        &self,
        cat: &Catalog,
        claimed: &mut Claimed,
        ftw_extra: &mut Vec<FtwTensor>,
    ) -> Result<Vec<Component>, ConvertError> {
        let mut components = Vec::new();
        for &l in &self.moe_layers {
            components.push(self.expert_component(cat, l, claimed, ftw_extra)?);
        }
        if let Some(ple) = &self.ple {
            for &l in &ple.layers {
                if l >= self.layers {
                    return Err(ConvertError::BadConfig {
                        file: CONFIG_FILE.into(),
                        field: "ple_layer_ids".into(),
                        problem: format!(
                            "names layer {l}, beyond num_hidden_layers {}",
                            self.layers
                        ),
                    });
                }
                components.extend(self.ple_components(cat, ple, l, claimed)?);
            }
        }
        Ok(components)
    }

    /// Puts unclaimed tensor `(name, file, t)` into the FTW stream: an NVFP4
    /// weight with its parts, a companion part not at all (its weight
    /// carries it), anything else as it is; a tensor no rule allows, or a
    /// fused expert input scale left over, is an error.
    fn add_to_ftw(
        &self,
        cat: &Catalog,
        ftw: &mut FtwBuilder,
        claimed: &mut Claimed,
        (name, file, t): (&str, &str, &SourceTensor),
    ) -> Result<(), ConvertError> {
        if let Some(fused) = name.strip_suffix("_input_scale")
            && self.allow_fused
            && name.contains(".mlp.experts.")
        {
            // Fused NVFP4 experts claim theirs; any left is an orphan.
            return Err(ConvertError::OrphanInputScale {
                file: file.to_owned(),
                tensor: name.to_owned(),
                module: fused.to_owned(),
                expected: format!("{fused}_weight_scale"),
            });
        }
        if companion_of(cat, file, name)?.is_some() {
            // Placed with its NVFP4 weight, which `linear` checks.
            return Ok(());
        }
        if let Err(reason) = self.ftw_allowed(name) {
            return Err(ConvertError::UnexpectedTensor {
                file: file.to_owned(),
                tensor: name.to_owned(),
                reason,
            });
        }
        let module = name.strip_suffix(".weight").unwrap_or(name);
        if name.ends_with(".weight") && is_nvfp4(cat, module) {
            return self.add_nvfp4_to_ftw(cat, ftw, claimed, name, module);
        }
        let dtype = plain_dtype(t.dtype()).ok_or_else(|| ConvertError::DtypeMismatch {
            file: file.to_owned(),
            tensor: name.to_owned(),
            expected: "F32, F16, BF16, U8, I8, I32, I64 or F8_E4M3".into(),
            actual: format!("{:?}", t.dtype()),
        })?;
        let protected =
            self.protected(module) && matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32);
        let kind = if protected {
            TensorKind::Protected
        } else {
            TensorKind::Plain
        };
        ftw.insert(FtwTensor {
            desc: TensorDesc::new(name, dtype, kind, t.shape()),
            source: TensorSource::Span(cat.span(name).expect("present")),
        })
    }

    /// Puts NVFP4 weight `name` of `module` into the FTW stream, its parts
    /// claimed, its input scale (if any) beside it.
    fn add_nvfp4_to_ftw(
        &self,
        cat: &Catalog,
        ftw: &mut FtwBuilder,
        claimed: &mut Claimed,
        name: &str,
        module: &str,
    ) -> Result<(), ConvertError> {
        // The logical shape the block scales imply; `linear` checks the
        // codes against it.
        let shape = match cat.get(&format!("{module}.weight_scale")) {
            Some((_, s)) => {
                let mut k = s.shape().to_vec();
                if let Some(last) = k.last_mut() {
                    *last = last.saturating_mul(16);
                }
                k
            }
            None => Vec::new(),
        };
        let lin = self.linear(cat, module, &shape, "an NVFP4 tensor of the FTW stream")?;
        claimed.extend(lin.claimed);
        if let Some(s) = lin.input_scale {
            ftw.insert(s)?;
        }
        ftw.insert(FtwTensor {
            desc: TensorDesc::new(name, lin.dtype, lin.kind, lin.shape),
            source: lin.source,
        })
    }
}

/// How a MoE layer's experts are stored.
enum ExpertLayout {
    /// `{p}.{e}.{gate,up,down}_proj`, BF16/F16/F32 or NVFP4 triplets.
    PerExpert,
    /// `{p}.gate_up_proj` and `{p}.down_proj` in BF16.
    FusedBf16,
    /// The fused NVFP4 layout (module doc).
    FusedNvfp4,
}

/// An FTEXPERT1 record layout and its records, one per expert.
type ExpertRecords = (Vec<TensorDesc>, Vec<Vec<TensorSource>>);

/// The span of fused BF16 expert tensor `n` of layer `l`, checked to have
/// shape `shape` (`because` says why).
fn fused_bf16_span(
    cat: &Catalog,
    n: &str,
    shape: [u64; 3],
    l: u64,
    because: &str,
) -> Result<SourceSpan, ConvertError> {
    let (f, t) = cat.get(n).ok_or_else(|| ConvertError::MissingTensor {
        tensor: n.to_owned(),
        needed_for: format!("the fused experts of layer {l}"),
    })?;
    if t.dtype() != safetensors::Dtype::BF16 {
        return Err(ConvertError::DtypeMismatch {
            file: f.to_owned(),
            tensor: n.to_owned(),
            expected: "BF16 (fused experts)".into(),
            actual: format!("{:?}", t.dtype()),
        });
    }
    if t.shape() != shape {
        return Err(ConvertError::ShapeMismatch {
            file: f.to_owned(),
            tensor: n.to_owned(),
            expected: shape.to_vec(),
            actual: t.shape().to_vec(),
            because: because.to_owned(),
        });
    }
    Ok(cat.span(n).expect("present"))
}

/// Refuses expert `e` of layer `l` when its fields (`descs`) differ from
/// the first expert's (`first`).
fn same_expert_layout(
    l: u64,
    e: u64,
    first: &[TensorDesc],
    descs: &[TensorDesc],
) -> Result<(), ConvertError> {
    match first.iter().zip(descs).find(|(a, b)| a != b) {
        Some((a, b)) => Err(ConvertError::MixedExpertLayout {
            layer: l,
            expert: e,
            field: a.key.clone(),
            expected: format!("{} {:?} {:?}", a.dtype.name(), a.kind, a.shape),
            found: format!("{} {:?} {:?}", b.dtype.name(), b.kind, b.shape),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
