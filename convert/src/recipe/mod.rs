//! Declarative TOML recipes: how to convert a model no built-in profile
//! knows.
//!
//! The built-in profiles ([`crate::profile`]) know their families in
//! detail: which tensors must exist and which shapes the config implies.
//! Every other model would need new code. A recipe covers the common case
//! without that: an ordered list of glob rules, each sending the tensors it
//! matches to the FTW stream or to per-layer FTEXPERT1 sidecars, with a
//! dtype policy. It stays as strict as a profile where it can: every tensor
//! must be placed by exactly one rule (there is no "skip"), every rule must
//! place at least one tensor (which catches typos and shadowed rules), and
//! every expert layer must be a dense, uniform table. Nothing is ever
//! re-quantized: a recipe only copies tensors, or passes NVFP4 through.
//!
//! # Format
//!
//! ```toml
//! # llama-moe.toml
//! model_type = "llama_moe"   # must equal config.json's model_type
//! name = "llama-moe-recipe"  # optional; default "recipe:<model_type>"
//!
//! [[rules]]                  # rules are tried in order; the first match wins
//! glob = "model.layers.*.mlp.experts.*.*.weight"
//! component = "experts"      # one FTEXPERT1 sidecar per layer
//!
//! [[rules]]
//! glob = "lm_head.weight"
//! component = "ftw"
//! dtype = "protected"        # kind Protected (BF16, F16 or F32 sources only)
//!
//! [[rules]]
//! glob = "*"                 # everything else
//! component = "ftw"          # dtype defaults to "keep"
//! ```
//!
//! * Top-level keys: `model_type` (required), `name` (optional), `rules`
//!   (one or more, at most [`MAX_RECIPE_RULES`]). Rule keys: `glob` and
//!   `component` (required), `dtype` (optional). Any other key is an error,
//!   as is a file larger than [`MAX_RECIPE_BYTES`].
//! * `glob`: a [`globset`] pattern over the full tensor name, case
//!   sensitive; `*` matches any run of characters, dots included (as in
//!   ModelOpt's `ignore` lists), `?` one character, `[..]` a class, `{a,b}`
//!   alternatives.
//! * `component = "ftw"`: the tensor goes to the FTW stream `model.ftw`,
//!   keyed by its source name; tensors are in name order.
//! * `component = "experts"`: the tensor is one field of one expert record
//!   of the FTEXPERT1 sidecar `experts/layer_{l:03}.ftexpert`. Its name must
//!   end in `.weight`; the layer is its first all-digit dot-separated
//!   segment, the expert its second, and the field the segments between the
//!   expert index and `.weight` (`model.layers.3.mlp.experts.7.gate_proj.weight`
//!   → layer 3, expert 7, field `gate_proj`). Indices are canonical decimal.
//!   Per layer the experts must be numbered `0..E-1` without gaps and share
//!   one field set with identical descriptors (dtype, kind, shape); fields
//!   are stored in name order.
//! * `dtype = "keep"` (default): the source dtype, kind Plain.
//!   `dtype = "protected"`: the source dtype, kind Protected; only BF16, F16
//!   and F32 sources qualify.
//! * NVFP4, by the rule the built-in profiles use ([`crate::nvfp4`]):
//!   module `X` is a ModelOpt NVFP4 triplet (`X.weight` U8,
//!   `X.weight_scale` F8_E4M3, `X.weight_scale_2` F32 scalar) when
//!   `X.weight` is U8 or `X.weight_scale` or `X.weight_scale_2` exists. The
//!   rule matching `X.weight` places the whole triplet as one NVFP4 tensor of
//!   kind Native (bit-for-bit pass through); the scales are claimed by it
//!   and need no rule, and so is an activation `X.input_scale` (F32, `[]` or
//!   `[1]`), which goes into the FTW stream under its own name (for experts
//!   too). A scale without its weight, and an `input_scale` beside a module
//!   that is not NVFP4, are errors. `dtype = "protected"` on a triplet is an
//!   error.
//! * `[[expect]]` (optional, at most [`MAX_EXPECT_TABLES`]): the tensors the
//!   model must have, with dtype and shape, read against `config.json`
//!   (format in [`contract`]). Checked before any rule places anything; every
//!   missing tensor or wrong dtype or shape is listed in one
//!   [`RecipeError::Contract`] (file, tensor, expected, found).
//!
//! Every violation is a [`RecipeError`] (or, for what the source itself
//! gets wrong, a [`ConvertError`]) naming the recipe file, the rule
//! (`rules[i]`, counted from 0) and glob, and the source file and tensor, or
//! the layer, expert and field. [`Recipe::digest`] identifies what decides
//! the output (model_type, the normalized rules and the `[[expect]]` tables)
//! for the converter identity.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use ftpipe_formats::{Dtype, TensorDesc, TensorKind};

use crate::component::{
    Catalog, Component, FtwBuilder, FtwTensor, KNOWN_MODEL_TYPES, TensorSource, expert_sidecar,
    plain_dtype,
};
use crate::error::ConvertError;
use crate::nvfp4::{companion_of, is_nvfp4, nvfp4_module};

pub mod contract;
mod error;
use crate::safetensors::SourceTensor;
use contract::{BoundExpect, Expect, RawExpect};
pub use contract::{MAX_EXPECT_TABLES, MAX_EXPECTED_TENSORS};
pub use error::RecipeError;

/// Largest recipe file accepted, in bytes.
pub const MAX_RECIPE_BYTES: usize = 1024 * 1024;
/// Most rules a recipe may have.
pub const MAX_RECIPE_RULES: usize = 4096;
/// Longest glob accepted, in bytes.
pub const MAX_RECIPE_GLOB_LEN: usize = 1024;
/// Longest `model_type` or `name` accepted, in bytes.
pub const MAX_RECIPE_NAME_LEN: usize = 256;

/// Version tag of the canonical form hashed by [`Recipe::digest`].
const DIGEST_FORMAT: &str = "ftpipe-recipe-v1";

/// Where a rule sends the tensors it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecipeComponent {
    /// The FTW stream `model.ftw`.
    Ftw,
    /// The FTEXPERT1 sidecar of the tensor's layer.
    Experts,
}

impl RecipeComponent {
    /// The value as written in a recipe.
    pub fn as_str(self) -> &'static str {
        match self {
            RecipeComponent::Ftw => "ftw",
            RecipeComponent::Experts => "experts",
        }
    }
}

/// How a rule stores the tensors it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DtypePolicy {
    /// Source dtype, kind Plain (NVFP4 triplets: kind Native).
    #[default]
    Keep,
    /// Source dtype, kind Protected; BF16, F16 or F32 sources only.
    Protected,
}

impl DtypePolicy {
    /// The value as written in a recipe.
    pub fn as_str(self) -> &'static str {
        match self {
            DtypePolicy::Keep => "keep",
            DtypePolicy::Protected => "protected",
        }
    }
}

/// One validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    glob: String,
    component: RecipeComponent,
    dtype: DtypePolicy,
}

impl Rule {
    /// The glob, as written.
    pub fn glob(&self) -> &str {
        &self.glob
    }
    /// Where matched tensors go.
    pub fn component(&self) -> RecipeComponent {
        self.component
    }
    /// How matched tensors are stored.
    pub fn dtype(&self) -> DtypePolicy {
        self.dtype
    }
}

/// A validated recipe: see the [module docs](self) for the format.
#[derive(Debug, Clone)]
pub struct Recipe {
    file: String,
    model_type: String,
    name: String,
    rules: Vec<Rule>,
    set: GlobSet,
    expects: Vec<Expect>,
    /// The `expects` with config.json's values ([`Recipe::bind`]).
    contract: Option<Vec<BoundExpect>>,
}

/// The recipe as deserialized, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRecipe {
    /// The recipe's file label (not a TOML key).
    #[serde(skip)]
    file: String,
    model_type: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    expect: Vec<RawExpect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    glob: String,
    component: String,
    #[serde(default)]
    dtype: Option<String>,
}

fn check_name(file: &str, field: &str, value: &str) -> Result<(), RecipeError> {
    let problem = if value.is_empty() {
        "is empty".to_owned()
    } else if value.len() > MAX_RECIPE_NAME_LEN {
        format!("is longer than {MAX_RECIPE_NAME_LEN} bytes")
    } else if value.chars().any(char::is_control) {
        "contains a control character".to_owned()
    } else if value.trim() != value {
        "has leading or trailing whitespace".to_owned()
    } else {
        return Ok(());
    };
    Err(RecipeError::BadName {
        file: file.to_owned(),
        field: field.to_owned(),
        value: value.to_owned(),
        problem,
    })
}

impl TryFrom<RawRecipe> for Recipe {
    type Error = RecipeError;

    fn try_from(raw: RawRecipe) -> Result<Recipe, RecipeError> {
        let file = raw.file;
        check_name(&file, "model_type", &raw.model_type)?;
        let name = recipe_name(&file, &raw.model_type, raw.name)?;
        if raw.rules.is_empty() {
            return Err(RecipeError::NoRules { file });
        }
        if raw.rules.len() > MAX_RECIPE_RULES {
            return Err(RecipeError::TooManyRules {
                file,
                count: raw.rules.len(),
                limit: MAX_RECIPE_RULES,
            });
        }
        let mut rules = Vec::with_capacity(raw.rules.len());
        let mut builder = GlobSetBuilder::new();
        for (i, r) in raw.rules.into_iter().enumerate() {
            let (glob, rule) = Rule::parse(&file, i, r)?;
            builder.add(glob);
            rules.push(rule);
        }
        let set = builder.build().map_err(|source| RecipeError::GlobSet {
            file: file.clone(),
            source,
        })?;
        if raw.expect.len() > MAX_EXPECT_TABLES {
            return Err(RecipeError::TooManyExpects {
                file,
                count: raw.expect.len(),
                limit: MAX_EXPECT_TABLES,
            });
        }
        let expects = raw
            .expect
            .into_iter()
            .enumerate()
            .map(|(i, e)| Expect::new(&file, i, e))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Recipe {
            file,
            model_type: raw.model_type,
            name,
            rules,
            set,
            expects,
            contract: None,
        })
    }
}

/// The profile name of the recipe in `file` for `model_type`: `name` as
/// written, checked and not a built-in profile's, else
/// `recipe:<model_type>`.
fn recipe_name(file: &str, model_type: &str, name: Option<String>) -> Result<String, RecipeError> {
    let Some(n) = name else {
        return Ok(format!("recipe:{model_type}"));
    };
    check_name(file, "name", &n)?;
    if KNOWN_MODEL_TYPES.contains(&n.as_str()) {
        return Err(RecipeError::BadName {
            file: file.to_owned(),
            field: "name".into(),
            value: n,
            problem: "is the name of a built-in profile".into(),
        });
    }
    Ok(n)
}

impl Rule {
    /// Rule `i` of the recipe in `file`, validated, and its compiled glob.
    fn parse(file: &str, i: usize, r: RawRule) -> Result<(Glob, Rule), RecipeError> {
        let bad_glob = |problem: String| RecipeError::BadGlob {
            file: file.to_owned(),
            rule: i,
            glob: r.glob.clone(),
            problem,
        };
        if r.glob.is_empty() {
            return Err(bad_glob("is empty".into()));
        }
        if r.glob.len() > MAX_RECIPE_GLOB_LEN {
            return Err(bad_glob(format!(
                "is longer than {MAX_RECIPE_GLOB_LEN} bytes"
            )));
        }
        let glob = Glob::new(&r.glob).map_err(|source| RecipeError::InvalidGlob {
            file: file.to_owned(),
            rule: i,
            glob: r.glob.clone(),
            source: Box::new(source),
        })?;
        let component = match r.component.as_str() {
            "ftw" => RecipeComponent::Ftw,
            "experts" => RecipeComponent::Experts,
            _ => {
                return Err(RecipeError::BadComponent {
                    file: file.to_owned(),
                    rule: i,
                    value: r.component,
                });
            }
        };
        let dtype = match r.dtype.as_deref() {
            None | Some("keep") => DtypePolicy::Keep,
            Some("protected") => DtypePolicy::Protected,
            Some(other) => {
                return Err(RecipeError::BadDtype {
                    file: file.to_owned(),
                    rule: i,
                    value: other.to_owned(),
                });
            }
        };
        let rule = Rule {
            glob: r.glob,
            component,
            dtype,
        };
        Ok((glob, rule))
    }
}

/// 1-based line and column of byte `at` of `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, col)
}

/// Feeds `s` to `h` length-prefixed, so the concatenation is unambiguous.
fn hash_str(h: &mut Sha256, s: &str) {
    h.update((s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

/// A tensor as it will be stored.
struct Placed {
    dtype: Dtype,
    kind: TensorKind,
    shape: Vec<u64>,
    source: TensorSource,
    /// An NVFP4 module's activation `input_scale`, bound for the FTW stream.
    input_scale: Option<FtwTensor>,
}

/// One expert field found in the source.
struct Slot {
    tensor: String,
    desc: TensorDesc,
    source: TensorSource,
}

/// Where a recipe's rules have sent the tensors so far.
struct Routed {
    /// Per rule: whether it matched a tensor.
    used: Vec<bool>,
    ftw: FtwBuilder,
    /// Expert slots by layer, expert and field.
    layers: BTreeMap<u64, BTreeMap<u64, BTreeMap<String, Slot>>>,
}

/// Is `s` an all-digit segment?
fn is_index(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Layer, expert and field of an expert tensor name, or why not.
fn expert_slot(name: &str) -> Result<(u64, u64, String), String> {
    let stem = name.strip_suffix(".weight").ok_or_else(|| {
        "an experts rule places only tensors whose name ends in .weight".to_owned()
    })?;
    let segs: Vec<&str> = stem.split('.').collect();
    let mut idx = segs.iter().enumerate().filter(|(_, s)| is_index(s));
    let (Some((_, l)), Some((ei, e))) = (idx.next(), idx.next()) else {
        return Err("its name needs two integer segments: the layer, then the expert".into());
    };
    let parse = |what: &str, s: &str| -> Result<u64, String> {
        if s.len() > 1 && s.starts_with('0') {
            return Err(format!("{what} index {s:?} has a leading zero"));
        }
        s.parse()
            .map_err(|_| format!("{what} index {s} is too large"))
    };
    let layer = parse("layer", l)?;
    if u32::try_from(layer).is_err() {
        return Err(format!("layer index {layer} exceeds {}", u32::MAX));
    }
    let expert = parse("expert", e)?;
    // No segment after the expert index is an empty field, refused below.
    let field = segs.get(ei + 1..).unwrap_or_default().join(".");
    if field.is_empty() || field.split('.').any(str::is_empty) {
        return Err(format!(
            "no field name between the expert index {expert} and .weight"
        ));
    }
    Ok((layer, expert, field))
}

/// `dtype kind shape` of a descriptor, for messages.
fn describe(d: &TensorDesc) -> String {
    format!("{} {:?} {:?}", d.dtype.name(), d.kind, d.shape)
}

impl Recipe {
    /// Parses and validates a recipe; `file_label` names it in errors.
    pub fn from_toml(file_label: &str, text: &str) -> Result<Recipe, RecipeError> {
        if text.len() > MAX_RECIPE_BYTES {
            return Err(RecipeError::TooLarge {
                file: file_label.to_owned(),
                len: text.len() as u64,
                limit: MAX_RECIPE_BYTES as u64,
            });
        }
        let mut raw: RawRecipe = toml::from_str(text).map_err(|e| {
            let at = match e.span() {
                Some(s) => {
                    let (line, col) = line_col(text, s.start);
                    format!("line {line}, column {col}: ")
                }
                None => String::new(),
            };
            RecipeError::Syntax {
                file: file_label.to_owned(),
                message: format!("{at}{}", e.message().trim_end()),
            }
        })?;
        raw.file = file_label.to_owned();
        Recipe::try_from(raw)
    }

    /// The label of the file the recipe came from.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The `model_type` the recipe is for.
    pub fn model_type(&self) -> &str {
        &self.model_type
    }

    /// The profile name shown in plans (default `recipe:<model_type>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// SHA-256 (hex) of the canonical form of what decides the output:
    /// `model_type` and every rule in order with its defaults filled in.
    /// Comments, formatting, key order and `name` do not change it.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        hash_str(&mut h, DIGEST_FORMAT);
        hash_str(&mut h, &self.model_type);
        h.update((self.rules.len() as u64).to_le_bytes());
        for r in &self.rules {
            hash_str(&mut h, &r.glob);
            hash_str(&mut h, r.component.as_str());
            hash_str(&mut h, r.dtype.as_str());
        }
        // Recipes without a contract keep the digest they had before
        // `[[expect]]` existed.
        if !self.expects.is_empty() {
            hash_str(&mut h, "expect");
            h.update((self.expects.len() as u64).to_le_bytes());
            for e in &self.expects {
                e.canonical(&mut |s| hash_str(&mut h, s));
            }
        }
        hex::encode(h.finalize())
    }

    /// The recipe with its `[[expect]]` tables read against `cfg`
    /// (config.json); [`Recipe::components`] checks the source against them.
    pub fn bind(&self, cfg: &serde_json::Value) -> Result<Recipe, ConvertError> {
        let contract = contract::bind(&self.file, &self.expects, cfg)?;
        Ok(Recipe {
            contract: Some(contract),
            ..self.clone()
        })
    }

    /// Maps every source tensor to a component and predicts each size: the
    /// FTW stream first, then one FTEXPERT1 sidecar per layer in layer order.
    /// The `[[expect]]` tables are checked first, every mismatch in one
    /// error; a recipe with tables must be [bound](Recipe::bind) to its
    /// config.
    pub fn components(&self, cat: &Catalog) -> Result<Vec<Component>, ConvertError> {
        self.check_contract(cat)?;
        let mut out = Routed {
            used: vec![false; self.rules.len()],
            ftw: FtwBuilder::default(),
            layers: BTreeMap::new(),
        };
        let mut hits = Vec::new();
        for (name, file, t) in cat.iter() {
            if companion_of(cat, file, name)?.is_some() {
                // Placed with its NVFP4 weight.
                continue;
            }
            self.set.matches_into(name, &mut hits);
            let Some(&ri) = hits.iter().min() else {
                return Err(ConvertError::UnexpectedTensor {
                    file: file.to_owned(),
                    tensor: name.to_owned(),
                    reason: format!("no rule of recipe {} matches it", self.name),
                });
            };
            out.used[ri] = true;
            let tensor = (name, file, t);
            match self.rules[ri].component {
                RecipeComponent::Ftw => self.route_ftw(cat, &mut out.ftw, ri, tensor)?,
                RecipeComponent::Experts => self.route_expert(cat, &mut out, ri, tensor)?,
            }
        }
        if let Some(ri) = out.used.iter().position(|u| !u) {
            return Err(RecipeError::RuleUnused {
                file: self.file.clone(),
                rule: ri,
                glob: self.rules[ri].glob.clone(),
            }
            .into());
        }

        let mut components = vec![out.ftw.finish()?];
        for (l, experts) in out.layers {
            components.push(expert_component(l, experts)?);
        }
        Ok(components)
    }

    /// Checks the source against the bound `[[expect]]` tables, every
    /// mismatch in one error.
    fn check_contract(&self, cat: &Catalog) -> Result<(), ConvertError> {
        let problems = match &self.contract {
            Some(c) => contract::check(c, cat),
            None if self.expects.is_empty() => Vec::new(),
            None => {
                return Err(ConvertError::internal(format!(
                    "recipe {} has [[expect]] tables but was not bound to a config.json",
                    self.file
                )));
            }
        };
        if !problems.is_empty() {
            return Err(RecipeError::Contract {
                file: self.file.clone(),
                recipe: self.name.clone(),
                count: problems.len(),
                problems: problems.join("\n"),
            }
            .into());
        }
        Ok(())
    }

    /// Puts tensor `(name, file, t)`, matched by FTW rule `ri`, into the FTW
    /// stream, its input scale (if any) after it.
    fn route_ftw(
        &self,
        cat: &Catalog,
        ftw: &mut FtwBuilder,
        ri: usize,
        (name, file, t): (&str, &str, &SourceTensor),
    ) -> Result<(), ConvertError> {
        let p = self.place(cat, ri, name, file, t)?;
        ftw.insert(FtwTensor {
            desc: TensorDesc::new(name, p.dtype, p.kind, p.shape),
            source: p.source,
        })?;
        if let Some(s) = p.input_scale {
            ftw.insert(s)?;
        }
        Ok(())
    }

    /// Puts tensor `(name, file, t)`, matched by experts rule `ri`, into
    /// its layer's expert slots, its input scale (if any) into the FTW
    /// stream; a field found twice is an error.
    fn route_expert(
        &self,
        cat: &Catalog,
        out: &mut Routed,
        ri: usize,
        (name, file, t): (&str, &str, &SourceTensor),
    ) -> Result<(), ConvertError> {
        let rule = &self.rules[ri];
        let (l, e, field) = expert_slot(name)
            .map_err(|problem| RecipeError::ExpertName {
                file: file.to_owned(),
                tensor: name.to_owned(),
                rule: ri,
                glob: rule.glob.clone(),
                problem,
            })
            .map_err(ConvertError::from)?;
        let p = self.place(cat, ri, name, file, t)?;
        if let Some(s) = p.input_scale {
            out.ftw.insert(s)?;
        }
        let slot = Slot {
            tensor: name.to_owned(),
            desc: TensorDesc::new(field.clone(), p.dtype, p.kind, p.shape),
            source: p.source,
        };
        let fields = out.layers.entry(l).or_default().entry(e).or_default();
        match fields.entry(field) {
            Entry::Vacant(v) => {
                v.insert(slot);
                Ok(())
            }
            Entry::Occupied(o) => Err(ConvertError::DuplicateExpertField {
                layer: l,
                expert: e,
                field: o.key().clone(),
                first: o.get().tensor.clone(),
                second: name.to_owned(),
            }),
        }
    }

    /// How tensor `name` (matched by rule `ri`) is stored: a plain copy or,
    /// with its scales, an NVFP4 pass-through.
    fn place(
        &self,
        cat: &Catalog,
        ri: usize,
        name: &str,
        file: &str,
        t: &SourceTensor,
    ) -> Result<Placed, ConvertError> {
        let rule = &self.rules[ri];
        if let Some(module) = name.strip_suffix(".weight")
            && is_nvfp4(cat, module)
        {
            if rule.dtype == DtypePolicy::Protected {
                return Err(RecipeError::ProtectedQuantized {
                    file: file.to_owned(),
                    tensor: name.to_owned(),
                    rule: ri,
                    glob: rule.glob.clone(),
                }
                .into());
            }
            let nv = nvfp4_module(cat, module)?;
            return Ok(Placed {
                dtype: Dtype::Nvfp4,
                kind: TensorKind::Native,
                shape: nv.native.shape().to_vec(),
                source: nv.source,
                input_scale: nv.input_scale,
            });
        }
        let dtype = plain_dtype(t.dtype()).ok_or_else(|| ConvertError::DtypeMismatch {
            file: file.to_owned(),
            tensor: name.to_owned(),
            expected: "F32, F16, BF16, U8, I8, I32, I64, F8_E4M3 or an NVFP4 triplet".into(),
            actual: format!("{:?}", t.dtype()),
        })?;
        let kind = match rule.dtype {
            DtypePolicy::Keep => TensorKind::Plain,
            DtypePolicy::Protected => {
                if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
                    return Err(ConvertError::DtypeMismatch {
                        file: file.to_owned(),
                        tensor: name.to_owned(),
                        expected: format!(
                            "BF16, F16 or F32 (rules[{ri}] (glob {:?}) asks for dtype = \"protected\")",
                            rule.glob
                        ),
                        actual: format!("{:?}", t.dtype()),
                    });
                }
                TensorKind::Protected
            }
        };
        Ok(Placed {
            dtype,
            kind,
            shape: t.shape().to_vec(),
            source: TensorSource::Span(cat.span(name).ok_or_else(|| {
                ConvertError::internal(format!("{file}: {name} is not in the catalog"))
            })?),
            input_scale: None,
        })
    }
}

fn expert_component_name(layer: u64) -> String {
    format!("experts/layer_{layer:03}.ftexpert")
}

/// The FTEXPERT1 sidecar of layer `l`: experts `0..E-1`, each with the
/// field set and descriptors of expert 0, fields in name order.
fn expert_component(
    l: u64,
    experts: BTreeMap<u64, BTreeMap<String, Slot>>,
) -> Result<Component, ConvertError> {
    let highest = experts.keys().next_back().copied().unwrap_or(0);
    for (i, &e) in experts.keys().enumerate() {
        if e != i as u64 {
            return Err(ConvertError::ExpertGap {
                layer: l,
                missing: i as u64,
                highest,
            });
        }
    }
    let mut records = Vec::with_capacity(experts.len());
    let mut fields: Vec<TensorDesc> = Vec::new();
    for (e, slots) in experts {
        if e == 0 {
            fields = slots.values().map(|s| s.desc.clone()).collect();
        } else {
            for f0 in &fields {
                match slots.get(&f0.key) {
                    Some(s) if s.desc == *f0 => {}
                    other => {
                        return Err(ConvertError::MixedExpertLayout {
                            layer: l,
                            expert: e,
                            field: f0.key.clone(),
                            expected: describe(f0),
                            found: other.map_or_else(|| "missing".into(), |s| describe(&s.desc)),
                        });
                    }
                }
            }
            if let Some(extra) = slots
                .values()
                .find(|s| !fields.iter().any(|f0| f0.key == s.desc.key))
            {
                return Err(ConvertError::MixedExpertLayout {
                    layer: l,
                    expert: e,
                    field: extra.desc.key.clone(),
                    expected: "no such field".into(),
                    found: describe(&extra.desc),
                });
            }
        }
        records.push(slots.into_values().map(|s| s.source).collect::<Vec<_>>());
    }
    expert_sidecar(expert_component_name(l), l, fields, records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::{ComponentContent, ComponentKind};
    use crate::profile::Profile;
    use crate::safetensors::SourceHeader;
    use ftpipe_artifact::manifest::FTW_COMPONENT;
    use ftpipe_formats::sizes;
    use serde_json::json;

    type Spec = Vec<(String, &'static str, Vec<u64>)>;

    const F1: &str = "model-00001-of-00002.safetensors";
    const F2: &str = "model-00002-of-00002.safetensors";

    fn width(d: &str) -> u64 {
        match d {
            "F32" | "I32" => 4,
            "BF16" | "F16" => 2,
            "I64" | "F64" => 8,
            _ => 1,
        }
    }

    /// A validated header holding `spec` contiguously.
    fn header(file: &str, spec: &Spec) -> SourceHeader {
        let mut map = serde_json::Map::new();
        let mut off = 0u64;
        for (n, d, shape) in spec {
            let len = shape.iter().product::<u64>() * width(d);
            map.insert(
                n.clone(),
                json!({"dtype": d, "shape": shape, "data_offsets": [off, off + len]}),
            );
            off += len;
        }
        let j = serde_json::to_vec(&map).unwrap();
        SourceHeader::parse(file, &j, 8 + j.len() as u64 + off).unwrap()
    }

    fn t(
        name: impl Into<String>,
        d: &'static str,
        shape: &[u64],
    ) -> (String, &'static str, Vec<u64>) {
        (name.into(), d, shape.to_vec())
    }

    fn nvfp4(spec: &mut Spec, module: &str, out: u64, k: u64) {
        spec.push(t(format!("{module}.weight"), "U8", &[out, k / 2]));
        spec.push(t(
            format!("{module}.weight_scale"),
            "F8_E4M3",
            &[out, k / 16],
        ));
        spec.push(t(format!("{module}.weight_scale_2"), "F32", &[]));
    }

    /// A llama-like dense model: 2 layers, hidden 16, vocab 32, MLP 32.
    fn llama() -> Spec {
        let mut s = vec![
            t("model.embed_tokens.weight", "BF16", &[32, 16]),
            t("model.norm.weight", "BF16", &[16]),
            t("lm_head.weight", "BF16", &[32, 16]),
        ];
        for l in 0..2 {
            let p = format!("model.layers.{l}");
            for n in ["input_layernorm", "post_attention_layernorm"] {
                s.push(t(format!("{p}.{n}.weight"), "BF16", &[16]));
            }
            for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                s.push(t(format!("{p}.self_attn.{n}.weight"), "BF16", &[16, 16]));
            }
            s.push(t(format!("{p}.mlp.gate_proj.weight"), "BF16", &[32, 16]));
            s.push(t(format!("{p}.mlp.up_proj.weight"), "BF16", &[32, 16]));
            s.push(t(format!("{p}.mlp.down_proj.weight"), "BF16", &[16, 32]));
        }
        s
    }

    const LLAMA: &str = r#"
model_type = "llama"
name = "llama-recipe"

[[rules]]
glob = "lm_head.weight"
component = "ftw"
dtype = "protected"

[[rules]]
glob = "*"
component = "ftw"
"#;

    /// A small MoE: layer 0 with 4 BF16 experts (file 1), layer 1 with 4
    /// NVFP4 experts and an NVFP4 attention projection (file 2).
    fn moe() -> (Spec, Spec) {
        let mut a = vec![
            t("model.embed_tokens.weight", "BF16", &[32, 16]),
            t("model.norm.weight", "BF16", &[16]),
            t("lm_head.weight", "BF16", &[32, 16]),
            t("model.layers.0.self_attn.q_proj.weight", "BF16", &[16, 16]),
            t("model.layers.0.mlp.gate.weight", "BF16", &[4, 16]),
        ];
        for e in 0..4 {
            let p = format!("model.layers.0.mlp.experts.{e}");
            a.push(t(format!("{p}.gate_proj.weight"), "BF16", &[8, 16]));
            a.push(t(format!("{p}.up_proj.weight"), "BF16", &[8, 16]));
            a.push(t(format!("{p}.down_proj.weight"), "BF16", &[16, 8]));
        }
        let mut b = vec![t("model.layers.1.mlp.gate.weight", "BF16", &[4, 16])];
        nvfp4(&mut b, "model.layers.1.self_attn.q_proj", 16, 16);
        for e in 0..4 {
            for p in ["gate_proj", "up_proj", "down_proj"] {
                nvfp4(
                    &mut b,
                    &format!("model.layers.1.mlp.experts.{e}.{p}"),
                    16,
                    16,
                );
            }
        }
        (a, b)
    }

    const MOE: &str = r#"
model_type = "tiny_moe"

[[rules]]
glob = "model.layers.*.mlp.experts.*.*.weight"
component = "experts"

[[rules]]
glob = "lm_head.weight"
component = "ftw"
dtype = "protected"

[[rules]]
glob = "*"
component = "ftw"
"#;

    fn moe_headers() -> Vec<SourceHeader> {
        let (a, b) = moe();
        vec![header(F1, &a), header(F2, &b)]
    }

    fn run(recipe: &str, headers: &[SourceHeader]) -> Result<Vec<Component>, ConvertError> {
        let r = Recipe::from_toml("recipe.toml", recipe)?;
        r.components(&Catalog::new(headers)?)
    }

    /// Through the profile entry point, which binds the recipe to `cfg`.
    fn run_with(
        recipe: &str,
        cfg: serde_json::Value,
        headers: &[SourceHeader],
    ) -> Result<Vec<Component>, ConvertError> {
        let r = Recipe::from_toml("recipe.toml", recipe)?;
        Profile::from_config_with_recipe(&cfg, Some(&r))?.components(headers)
    }

    fn moe_cfg() -> serde_json::Value {
        json!({"model_type": "tiny_moe", "num_hidden_layers": 2, "num_experts": 4,
               "moe_intermediate_size": 8, "text": {"hidden_size": 16}})
    }

    const MOE_EXPECT: &str = r#"
[[expect]]
tensor = "model.layers.{l}.mlp.experts.{e}.gate_proj.weight"
each = { l = "num_hidden_layers", e = "num_experts" }
dtype = ["BF16", "NVFP4"]
shape = ["moe_intermediate_size", "text.hidden_size"]

[[expect]]
tensor = "lm_head.weight"
dtype = "BF16"
shape = [32, "text.hidden_size"]
"#;

    #[test]
    fn contract_holds_and_changes_nothing_but_the_digest() {
        // Layer 1's experts are [16, 16]: expect them per layer.
        let expect = MOE_EXPECT.replace(
            "each = { l = \"num_hidden_layers\", e = \"num_experts\" }",
            "each = { e = \"num_experts\" }",
        );
        let expect = expect.replace("model.layers.{l}.", "model.layers.0.");
        let with = format!("{MOE}{expect}");
        let a = run_with(&with, moe_cfg(), &moe_headers()).unwrap();
        let b = run(MOE, &moe_headers()).unwrap();
        assert_eq!(a, b);
        let (r, r2) = (
            Recipe::from_toml("a", MOE).unwrap(),
            Recipe::from_toml("a", &with).unwrap(),
        );
        assert_ne!(r.digest(), r2.digest());
        // Unbound, a recipe with a contract refuses to map.
        let e = r2
            .components(&Catalog::new(&moe_headers()).unwrap())
            .unwrap_err();
        assert!(
            matches!(&e, ConvertError::Internal(ftpipe_fs::InternalError { what, .. }) if what.contains("not bound to a config.json")),
            "{e}"
        );
    }

    #[test]
    fn contract_reports_every_mismatch_in_one_error() {
        let mut extra = String::from(MOE_EXPECT);
        extra.push_str(
            "\n[[expect]]\ntensor = \"model.layers.0.self_attn.k_proj.weight\"\n\n[[expect]]\ntensor = \"model.layers.1.self_attn.q_proj.weight\"\ndtype = \"NVFP4\"\nshape = [16, \"2*moe_intermediate_size\"]\n",
        );
        let (mut a, b) = moe();
        for x in a.iter_mut().filter(|x| x.0 == "lm_head.weight") {
            x.1 = "F16";
        }
        let e = run_with(
            &format!("{MOE}{extra}"),
            moe_cfg(),
            &[header(F1, &a), header(F2, &b)],
        )
        .unwrap_err();
        let ConvertError::Recipe(RecipeError::Contract {
            count, problems, ..
        }) = &e
        else {
            panic!("{e}")
        };
        // 4 experts of layer 1 ([16, 16], not [8, 16]), lm_head, k_proj.
        assert_eq!(*count, 6, "{e}");
        for want in [
            format!("{F2}: model.layers.1.mlp.experts.3.gate_proj.weight: expected BF16 or NVFP4 [8, 16] (expect[0]), found NVFP4 [16, 16]"),
            format!("{F1}: lm_head.weight: expected BF16 [32, 16] (expect[1]), found F16 [32, 16]"),
            "-: model.layers.0.self_attn.k_proj.weight: expected any dtype (expect[2]), found nothing (missing)".to_owned(),
        ] {
            assert!(problems.contains(&want), "{want:?} not in {e}");
        }
        assert!(!problems.contains("q_proj"), "{e}");
        assert!(!problems.contains("layers.0.mlp.experts"), "{e}");
        // A config without the field names it.
        let mut cfg = moe_cfg();
        cfg["text"] = json!({});
        let e = run_with(&format!("{MOE}{MOE_EXPECT}"), cfg, &moe_headers()).unwrap_err();
        assert!(
            matches!(&e, ConvertError::BadConfig { field, problem, .. }
                if field == "text.hidden_size" && problem.contains("expect[0]")),
            "{e}"
        );
    }

    #[test]
    fn expect_tables_are_validated() {
        for (table, needle) in [
            ("tensor = \"a.{l}.w\"", "each has no key \"l\""),
            ("tensor = \"a.w\"\neach = { l = 2 }", "each.l is not used"),
            ("tensor = \"a.{l.w\"\neach = { l = 2 }", "without its '}'"),
            (
                "tensor = \"a.weight\"\ndtype = \"FP4\"",
                "dtype \"FP4\" is not one of",
            ),
            (
                "tensor = \"a.bias\"\ndtype = \"NVFP4\"",
                "ending in .weight",
            ),
            ("tensor = \"a.weight\"\nshape = [\"x*h\"]", "factor"),
            ("tensor = \"a.weight\"\ndtype = []", "empty list"),
            ("tensor = \"\"", "tensor is empty"),
        ] {
            let text = format!("{MOE}\n[[expect]]\n{table}\n");
            let e = parse_err(&text);
            assert!(
                matches!(&e, RecipeError::BadExpect { index: 0, problem, .. } if problem.contains(needle)),
                "{table}: {e}"
            );
        }
        let e = parse_err(&format!("{MOE}\n[[expect]]\ntensor = \"a\"\nsize = 1\n"));
        assert!(matches!(e, RecipeError::Syntax { .. }), "{e}");
        // The expansion is bounded before any name is built.
        let text = format!(
            "{MOE}\n[[expect]]\ntensor = \"a.{{x}}.{{y}}\"\neach = {{ x = \"num_experts\", y = \"num_experts\" }}\n"
        );
        let mut cfg = moe_cfg();
        cfg["num_experts"] = json!(1u64 << 12);
        let e = run_with(&text, cfg, &moe_headers()).unwrap_err();
        assert!(
            matches!(&e, ConvertError::Recipe(RecipeError::BadExpect { problem, .. }) if problem.contains("more than")),
            "{e}"
        );
    }

    #[test]
    fn nvfp4_input_scales_follow_their_module_as_in_the_profiles() {
        // Beside an NVFP4 triplet: into the FTW stream under its name, as
        // the built-in profiles do, also for experts.
        let (a, mut b) = moe();
        b.push(t("model.layers.1.self_attn.q_proj.input_scale", "F32", &[]));
        b.push(t(
            "model.layers.1.mlp.experts.0.up_proj.input_scale",
            "F32",
            &[1],
        ));
        let cs = run(MOE, &[header(F1, &a), header(F2, &b)]).unwrap();
        let ComponentContent::Ftw { tensors } = &cs[0].content else {
            panic!("ftw")
        };
        for n in [
            "model.layers.1.self_attn.q_proj.input_scale",
            "model.layers.1.mlp.experts.0.up_proj.input_scale",
        ] {
            let t = tensors.iter().find(|t| t.desc.key == n).expect(n);
            assert_eq!((t.desc.dtype, t.desc.kind), (Dtype::F32, TensorKind::Plain));
        }
        // Beside a BF16 module: refused, naming it.
        let (mut a, b) = moe();
        a.push(t("model.layers.0.self_attn.q_proj.input_scale", "F32", &[]));
        let e = run(MOE, &[header(F1, &a), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::OrphanInputScale { tensor, .. }
                if tensor == "model.layers.0.self_attn.q_proj.input_scale"),
            "{e}"
        );
        // A lone weight_scale_2 makes its module NVFP4, so the triplet's
        // missing weight_scale is named instead of the scale being dropped.
        let (mut a, b) = moe();
        a.push(t(
            "model.layers.0.self_attn.q_proj.weight_scale_2",
            "F32",
            &[],
        ));
        let e = run(MOE, &[header(F1, &a), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MissingTensor { tensor, .. }
                if tensor == "model.layers.0.self_attn.q_proj.weight_scale"),
            "{e}"
        );
    }

    fn parse_err(text: &str) -> RecipeError {
        Recipe::from_toml("recipe.toml", text).unwrap_err()
    }

    // Sizes straight from docs/formats.md, independent of `sizes`.
    fn ru(x: u64, a: u64) -> u64 {
        x.div_ceil(a) * a
    }
    fn body(d: &TensorDesc) -> u64 {
        let n: u64 = d.shape.iter().product();
        match d.dtype {
            Dtype::Nvfp4 => n / 2 + n / 16 + 4,
            Dtype::F32 | Dtype::I32 => 4 * n,
            Dtype::BF16 | Dtype::F16 => 2 * n,
            Dtype::I64 => 8 * n,
            _ => n,
        }
    }
    fn entry_len(d: &TensorDesc) -> u64 {
        2 + d.key.len() as u64 + 4 + 8 * d.shape.len() as u64 + 16
    }
    fn ftw_len_by_doc(descs: &[TensorDesc]) -> u64 {
        let index: u64 = descs.iter().map(entry_len).sum();
        let mut end = ru(40 + index, 4096);
        for d in descs {
            end = ru(end, 4096) + body(d);
        }
        ru(end, 4096)
    }
    fn ftexpert_len_by_doc(experts: u64, fields: &[TensorDesc]) -> u64 {
        let table: u64 = fields.iter().map(entry_len).sum();
        let mut end = 0;
        for d in fields {
            end = ru(end, 64) + body(d);
        }
        ru(64 + table, 4096) + experts * ru(end, 4096)
    }

    fn ftw_tensors(c: &Component) -> &[FtwTensor] {
        match &c.content {
            ComponentContent::Ftw { tensors } => tensors,
            other => panic!("not FTW: {other:?}"),
        }
    }

    #[test]
    fn dense_llama_goes_to_one_ftw_with_exact_size() {
        let spec = llama();
        let headers = [header(F1, &spec)];
        let r = Recipe::from_toml("llama.toml", LLAMA).unwrap();
        assert_eq!(r.model_type(), "llama");
        assert_eq!(r.name(), "llama-recipe");
        let cs = r.components(&Catalog::new(&headers).unwrap()).unwrap();
        assert_eq!(cs.len(), 1);
        let c = &cs[0];
        assert_eq!(
            (c.name.as_str(), c.kind),
            (FTW_COMPONENT, ComponentKind::Ftw)
        );
        assert_eq!(c.items, 21);
        assert_eq!(c.source_files, [F1.to_owned()].into());
        let ts = ftw_tensors(c);
        let keys: Vec<&str> = ts.iter().map(|t| t.desc.key.as_str()).collect();
        let mut sorted: Vec<&str> = spec.iter().map(|s| s.0.as_str()).collect();
        sorted.sort();
        assert_eq!(keys, sorted, "every tensor, in name order");
        for t in ts {
            let want = if t.desc.key == "lm_head.weight" {
                TensorKind::Protected
            } else {
                TensorKind::Plain
            };
            assert_eq!(
                (t.desc.dtype, t.desc.kind),
                (Dtype::BF16, want),
                "{}",
                t.desc.key
            );
            let TensorSource::Span(s) = &t.source else {
                panic!("plain tensors are spans")
            };
            let src = headers[0].tensor(&t.desc.key).unwrap();
            assert_eq!((s.offset, s.len), (src.offset(), src.len()));
        }
        // 21 tensors of at most one page each after a one-page header.
        assert_eq!(c.predicted_bytes, 22 * 4096);
        let descs: Vec<TensorDesc> = ts.iter().map(|t| t.desc.clone()).collect();
        assert_eq!(c.predicted_bytes, ftw_len_by_doc(&descs));
        assert_eq!(c.predicted_bytes, sizes::ftw_total_len(descs).unwrap());
    }

    #[test]
    fn small_moe_with_bf16_and_nvfp4_experts() {
        let headers = moe_headers();
        let cs = run(MOE, &headers).unwrap();
        let names: Vec<&str> = cs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.ftw",
                "experts/layer_000.ftexpert",
                "experts/layer_001.ftexpert"
            ]
        );

        let ftw = &cs[0];
        let ts = ftw_tensors(ftw);
        let keys: Vec<&str> = ts.iter().map(|t| t.desc.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.layers.0.mlp.gate.weight",
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.1.mlp.gate.weight",
                "model.layers.1.self_attn.q_proj.weight",
                "model.norm.weight",
            ]
        );
        assert_eq!(ts[0].desc.kind, TensorKind::Protected);
        let q1 = &ts[5];
        assert_eq!(
            q1.desc,
            TensorDesc::new(
                q1.desc.key.clone(),
                Dtype::Nvfp4,
                TensorKind::Native,
                [16, 16]
            )
        );
        let TensorSource::Native(parts) = &q1.source else {
            panic!("NVFP4 passes through")
        };
        let tensors: Vec<&str> = parts.iter().map(|p| &*p.tensor).collect();
        assert_eq!(
            tensors,
            [
                "model.layers.1.self_attn.q_proj.weight",
                "model.layers.1.self_attn.q_proj.weight_scale",
                "model.layers.1.self_attn.q_proj.weight_scale_2"
            ]
        );
        assert_eq!(
            parts.iter().map(|p| p.len).collect::<Vec<_>>(),
            [128, 16, 4]
        );
        assert_eq!(ftw.source_files, [F1.to_owned(), F2.to_owned()].into());
        assert_eq!(ftw.predicted_bytes, 8 * 4096);
        let descs: Vec<TensorDesc> = ts.iter().map(|t| t.desc.clone()).collect();
        assert_eq!(ftw.predicted_bytes, ftw_len_by_doc(&descs));

        // Layer 0: BF16 fields in name order.
        let ComponentContent::Experts {
            layer,
            fields,
            records,
        } = &cs[1].content
        else {
            panic!("experts")
        };
        assert_eq!(*layer, 0);
        let p = TensorKind::Plain;
        assert_eq!(
            *fields,
            [
                TensorDesc::new("down_proj", Dtype::BF16, p, [16, 8]),
                TensorDesc::new("gate_proj", Dtype::BF16, p, [8, 16]),
                TensorDesc::new("up_proj", Dtype::BF16, p, [8, 16]),
            ]
        );
        assert_eq!(records.len(), 4);
        let TensorSource::Span(s) = &records[2][1] else {
            panic!("span")
        };
        assert_eq!(&*s.tensor, "model.layers.0.mlp.experts.2.gate_proj.weight");
        assert_eq!(s.offset, headers[0].tensor(&s.tensor).unwrap().offset());
        // Table 47 + 47 + 45 bytes → data at 4096; record 3 × 256 bytes at
        // 64-aligned offsets → one page; 4 experts.
        assert_eq!((cs[1].items, cs[1].predicted_bytes), (4, 5 * 4096));
        assert_eq!(cs[1].predicted_bytes, ftexpert_len_by_doc(4, fields));
        assert_eq!(cs[1].source_files, [F1.to_owned()].into());

        // Layer 1: NVFP4 fields, each a Native triplet.
        let ComponentContent::Experts {
            layer,
            fields,
            records,
        } = &cs[2].content
        else {
            panic!("experts")
        };
        assert_eq!(*layer, 1);
        let n = TensorKind::Native;
        assert_eq!(
            *fields,
            [
                TensorDesc::new("down_proj", Dtype::Nvfp4, n, [16, 16]),
                TensorDesc::new("gate_proj", Dtype::Nvfp4, n, [16, 16]),
                TensorDesc::new("up_proj", Dtype::Nvfp4, n, [16, 16]),
            ]
        );
        let TensorSource::Native(parts) = &records[3][2] else {
            panic!("native")
        };
        assert_eq!(
            &*parts[2].tensor,
            "model.layers.1.mlp.experts.3.up_proj.weight_scale_2"
        );
        // Fields of 148 bytes at 0, 192, 384 → one page per record.
        assert_eq!((cs[2].items, cs[2].predicted_bytes), (4, 5 * 4096));
        assert_eq!(cs[2].predicted_bytes, ftexpert_len_by_doc(4, fields));
        assert_eq!(
            cs[2].predicted_bytes,
            sizes::ftexpert_total_len(1, 4, fields.clone()).unwrap()
        );
    }

    #[test]
    fn profile_uses_the_recipe_and_checks_model_type() {
        let r = Recipe::from_toml("moe.toml", MOE).unwrap();
        assert_eq!(r.name(), "recipe:tiny_moe");
        let cfg = json!({"model_type": "tiny_moe"});
        let p = Profile::from_config_with_recipe(&cfg, Some(&r)).unwrap();
        assert_eq!(p.name(), "recipe:tiny_moe");
        assert_eq!(p.components(&moe_headers()).unwrap().len(), 3);

        let other = json!({"model_type": "mistral"});
        let e = Profile::from_config_with_recipe(&other, Some(&r)).unwrap_err();
        assert!(
            matches!(&e, ConvertError::Recipe(RecipeError::ModelType { file, recipe, config })
                if file == "moe.toml" && recipe == "tiny_moe" && config == "mistral"),
            "{e}"
        );
        // Without a recipe: the built-in behaviour, now pointing at --recipe.
        let e = Profile::from_config_with_recipe(&other, None).unwrap_err();
        assert!(matches!(e, ConvertError::UnknownModelType { .. }));
        assert!(e.to_string().contains("--recipe FILE.toml"), "{e}");
    }

    #[test]
    fn schema_errors() {
        let e = parse_err(&format!("{MOE}\nextra = 1\n"));
        assert!(
            matches!(&e, RecipeError::Syntax { message, .. } if message.contains("unknown field `extra`")),
            "{e}"
        );
        let e = parse_err(&MOE.replace(
            "component = \"experts\"",
            "component = \"experts\"\nlayer = 2",
        ));
        assert!(
            matches!(&e, RecipeError::Syntax { message, .. }
                if message.contains("unknown field `layer`") && message.starts_with("line 7, column 1")),
            "{e}"
        );
        let e = parse_err(&MOE.replace("\"experts\"", "\"skip\""));
        assert!(
            matches!(&e, RecipeError::BadComponent { rule: 0, value, .. } if value == "skip"),
            "{e}"
        );
        let e = parse_err(&MOE.replace("\"protected\"", "\"fp8\""));
        assert!(
            matches!(&e, RecipeError::BadDtype { rule: 1, value, .. } if value == "fp8"),
            "{e}"
        );
        let e = parse_err("model_type = \"x\"\n");
        assert!(matches!(e, RecipeError::NoRules { .. }), "{e}");
        let e = parse_err("[[rules]]\nglob = \"*\"\ncomponent = \"ftw\"\n");
        assert!(
            matches!(&e, RecipeError::Syntax { message, .. } if message.contains("model_type")),
            "{e}"
        );
        let e = parse_err(&MOE.replace("tiny_moe", ""));
        assert!(
            matches!(&e, RecipeError::BadName { field, .. } if field == "model_type"),
            "{e}"
        );
        let e = parse_err(&MOE.replace(
            "model_type = \"tiny_moe\"",
            "model_type = \"m\"\nname = \"qwen3_moe\"",
        ));
        assert!(
            matches!(&e, RecipeError::BadName { field, .. } if field == "name"),
            "{e}"
        );
        let e = parse_err(&MOE.replace("\"lm_head.weight\"", "\"lm_head[\""));
        assert!(
            matches!(&e, RecipeError::InvalidGlob { rule: 1, glob, .. } if glob == "lm_head["),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("recipe.toml: rules[1]: glob \"lm_head[\" is invalid: "),
            "{e}"
        );
        assert!(
            std::error::Error::source(&e).is_some(),
            "the globset error is kept"
        );
        let e = parse_err(&MOE.replace("\"lm_head.weight\"", "\"\""));
        assert!(matches!(e, RecipeError::BadGlob { rule: 1, .. }), "{e}");
        let e = parse_err("model_type = 3\n");
        assert!(matches!(e, RecipeError::Syntax { .. }), "{e}");
        let e = parse_err("model_type = \"x\"\nrules = [");
        assert!(matches!(e, RecipeError::Syntax { .. }), "{e}");

        let mut many = String::from("model_type = \"x\"\n");
        for i in 0..=MAX_RECIPE_RULES {
            many.push_str(&format!(
                "[[rules]]\nglob = \"t{i}\"\ncomponent = \"ftw\"\n"
            ));
        }
        let e = parse_err(&many);
        assert!(
            matches!(e, RecipeError::TooManyRules { count, .. } if count == MAX_RECIPE_RULES + 1),
            "{e}"
        );
        let big = format!("{MOE}#{}", "x".repeat(MAX_RECIPE_BYTES));
        assert!(matches!(parse_err(&big), RecipeError::TooLarge { .. }));
    }

    #[test]
    fn unmatched_tensor_names_file_and_tensor() {
        let mut spec = llama();
        spec.push(t("rotary.inv_freq", "F32", &[8]));
        let recipe = LLAMA.replace("glob = \"*\"", "glob = \"model.*\"");
        let e = run(&recipe, &[header(F1, &spec)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::UnexpectedTensor { file, tensor, reason }
                if file == F1 && tensor == "rotary.inv_freq"
                    && reason == "no rule of recipe llama-recipe matches it"),
            "{e}"
        );
    }

    #[test]
    fn rule_matching_nothing_is_an_error() {
        let recipe = LLAMA.replace(
            "[[rules]]\nglob = \"*\"",
            "[[rules]]\nglob = \"lm_haed.weight\"\ncomponent = \"ftw\"\n\n[[rules]]\nglob = \"*\"",
        );
        let e = run(&recipe, &[header(F1, &llama())]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::Recipe(RecipeError::RuleUnused { rule: 1, glob, .. }) if glob == "lm_haed.weight"),
            "{e}"
        );
        // A rule shadowed by an earlier one never places anything either.
        let recipe =
            format!("{LLAMA}\n[[rules]]\nglob = \"model.norm.weight\"\ncomponent = \"ftw\"\n");
        let e = run(&recipe, &[header(F1, &llama())]).unwrap_err();
        assert!(
            matches!(
                e,
                ConvertError::Recipe(RecipeError::RuleUnused { rule: 2, .. })
            ),
            "{e}"
        );
    }

    #[test]
    fn protected_policy() {
        // On an NVFP4 triplet: an error naming the tensor and rule.
        let recipe = MOE.replace("glob = \"lm_head.weight\"", "glob = \"*.q_proj.weight\"");
        let e = run(&recipe, &moe_headers()).unwrap_err();
        assert!(
            matches!(&e, ConvertError::Recipe(RecipeError::ProtectedQuantized { file, tensor, rule: 1, .. })
                if file == F2 && tensor == "model.layers.1.self_attn.q_proj.weight"),
            "{e}"
        );
        // On a non-float source: a dtype error.
        let mut spec = llama();
        spec.push(t("model.position_ids", "I64", &[4]));
        let recipe = LLAMA.replace(
            "\"lm_head.weight\"",
            "\"{lm_head.weight,model.position_ids}\"",
        );
        let e = run(&recipe, &[header(F1, &spec)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::DtypeMismatch { tensor, .. } if tensor == "model.position_ids"),
            "{e}"
        );
        // Protected experts are fine when BF16.
        let recipe = MOE.replace(
            "component = \"experts\"",
            "component = \"experts\"\ndtype = \"protected\"",
        );
        let (a, _) = moe();
        let a: Spec = a
            .into_iter()
            .filter(|s| !s.0.contains("layers.1"))
            .collect();
        let cs = run(&recipe, &[header(F1, &a)]).unwrap();
        let ComponentContent::Experts { fields, .. } = &cs[1].content else {
            panic!("experts")
        };
        assert!(fields.iter().all(|f| f.kind == TensorKind::Protected));
    }

    #[test]
    fn expert_gap_is_an_error() {
        let (a, b) = moe();
        let a: Spec = a
            .into_iter()
            .filter(|s| !s.0.starts_with("model.layers.0.mlp.experts.2."))
            .collect();
        let e = run(MOE, &[header(F1, &a), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(
                e,
                ConvertError::ExpertGap {
                    layer: 0,
                    missing: 2,
                    highest: 3
                }
            ),
            "{e}"
        );
        // Experts must start at 0.
        let b: Spec = b
            .into_iter()
            .filter(|s| !s.0.starts_with("model.layers.1.mlp.experts.0."))
            .collect();
        let (a, _) = moe();
        let e = run(MOE, &[header(F1, &a), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(
                e,
                ConvertError::ExpertGap {
                    layer: 1,
                    missing: 0,
                    highest: 3
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn mixed_field_layout_is_an_error() {
        let (a, b) = moe();
        // Expert 1's up_proj is F16.
        let a2: Spec = a
            .iter()
            .cloned()
            .map(|(n, d, s)| {
                let d = if n == "model.layers.0.mlp.experts.1.up_proj.weight" {
                    "F16"
                } else {
                    d
                };
                (n, d, s)
            })
            .collect();
        let e = run(MOE, &[header(F1, &a2), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MixedExpertLayout { layer: 0, expert: 1, field, expected, found }
                if field == "up_proj" && expected == "BF16 Plain [8, 16]" && found == "F16 Plain [8, 16]"),
            "{e}"
        );
        // Expert 3 lacks down_proj.
        let a3: Spec = a
            .iter()
            .filter(|s| s.0 != "model.layers.0.mlp.experts.3.down_proj.weight")
            .cloned()
            .collect();
        let e = run(MOE, &[header(F1, &a3), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MixedExpertLayout { layer: 0, expert: 3, field, found, .. }
                if field == "down_proj" && found == "missing"),
            "{e}"
        );
        // Expert 2 has an extra field.
        let mut a4 = a.clone();
        a4.push(t(
            "model.layers.0.mlp.experts.2.extra.weight",
            "BF16",
            &[8, 16],
        ));
        let e = run(MOE, &[header(F1, &a4), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MixedExpertLayout { layer: 0, expert: 2, field, expected, .. }
                if field == "extra" && expected == "no such field"),
            "{e}"
        );
        // One expert NVFP4, the others BF16.
        let mut a5: Spec = a
            .iter()
            .filter(|s| !s.0.starts_with("model.layers.0.mlp.experts.1.gate_proj."))
            .cloned()
            .collect();
        nvfp4(&mut a5, "model.layers.0.mlp.experts.1.gate_proj", 8, 16);
        let e = run(MOE, &[header(F1, &a5), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MixedExpertLayout { expert: 1, field, found, .. }
                if field == "gate_proj" && found == "NVFP4 Native [8, 16]"),
            "{e}"
        );
    }

    #[test]
    fn expert_names_must_give_layer_expert_field() {
        let (a, b) = moe();
        for (bad, why) in [
            ("model.layers.0.mlp.experts.4.gate_proj.bias", ".weight"),
            (
                "model.layers.0.mlp.experts.04.up_proj.weight",
                "leading zero",
            ),
            (
                "model.layers.0.mlp.experts.x.up_proj.weight",
                "two integer segments",
            ),
        ] {
            let mut a2 = a.clone();
            a2.push(t(bad, "BF16", &[8, 16]));
            let recipe = MOE.replace(
                "model.layers.*.mlp.experts.*.*.weight",
                "model.layers.*.mlp.experts.*",
            );
            let e = run(&recipe, &[header(F1, &a2), header(F2, &b)]).unwrap_err();
            assert!(
                matches!(&e, ConvertError::Recipe(RecipeError::ExpertName { tensor, rule: 0, problem, .. })
                    if tensor == bad && problem.contains(why)),
                "{bad}: {e}"
            );
        }
        // Two tensors for one slot.
        let mut a2 = a.clone();
        a2.push(t(
            "model.layers.0.moe.experts.1.gate_proj.weight",
            "BF16",
            &[8, 16],
        ));
        let recipe = MOE.replace(
            "model.layers.*.mlp.experts.*.*.weight",
            "model.layers.*.experts.*",
        );
        let e = run(&recipe, &[header(F1, &a2), header(F2, &b)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::DuplicateExpertField { layer: 0, expert: 1, field, .. } if field == "gate_proj"),
            "{e}"
        );
    }

    #[test]
    fn broken_nvfp4_triplets() {
        let (a, b) = moe();
        // A scale without its weight.
        let b2: Spec = b
            .iter()
            .filter(|s| s.0 != "model.layers.1.self_attn.q_proj.weight")
            .cloned()
            .collect();
        let e = run(MOE, &[header(F1, &a), header(F2, &b2)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MissingTensor { tensor, .. } if tensor == "model.layers.1.self_attn.q_proj.weight"),
            "{e}"
        );
        // A weight and scale without weight_scale_2.
        let b3: Spec = b
            .iter()
            .filter(|s| s.0 != "model.layers.1.mlp.experts.2.down_proj.weight_scale_2")
            .cloned()
            .collect();
        let e = run(MOE, &[header(F1, &a), header(F2, &b3)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::MissingTensor { tensor, .. } if tensor == "model.layers.1.mlp.experts.2.down_proj.weight_scale_2"),
            "{e}"
        );
        // A scale of the wrong dtype.
        let b4: Spec = b
            .iter()
            .cloned()
            .map(|(n, d, s)| {
                let d = if n == "model.layers.1.self_attn.q_proj.weight_scale" {
                    "U8"
                } else {
                    d
                };
                (n, d, s)
            })
            .collect();
        let e = run(MOE, &[header(F1, &a), header(F2, &b4)]).unwrap_err();
        assert!(
            matches!(&e, ConvertError::DtypeMismatch { file, tensor, .. }
                if file == F2 && tensor == "model.layers.1.self_attn.q_proj.weight_scale"),
            "{e}"
        );
    }

    #[test]
    fn digest_is_stable_and_covers_the_rules() {
        let r = Recipe::from_toml("a.toml", MOE).unwrap();
        // Formatting, comments, key order, explicit defaults and the name
        // do not change it.
        let same = r#"
# the same recipe
model_type = "tiny_moe"
name = "renamed"
rules = [
  { component = "experts", glob = "model.layers.*.mlp.experts.*.*.weight", dtype = "keep" },
  { glob = "lm_head.weight", component = "ftw", dtype = "protected" },
  { glob = "*", component = "ftw" },
]
"#;
        let r2 = Recipe::from_toml("b.toml", same).unwrap();
        assert_eq!(r.digest(), r2.digest());
        assert_eq!(r.digest().len(), 64);
        // Pinned (reproduced independently from the canonical form: SHA-256
        // over u64-LE-length-prefixed "ftpipe-recipe-v1", model_type, the
        // u64 rule count, then glob, component, dtype per rule): the
        // identity must not drift between versions.
        assert_eq!(
            r.digest(),
            "54c98f77613bb7017cc0eeb28182285b3061e44610486cee663e90ce8b90379e"
        );
        let other = MOE.replace("dtype = \"protected\"", "dtype = \"keep\"");
        assert_ne!(r.digest(), Recipe::from_toml("c", &other).unwrap().digest());
        let other = MOE.replace("tiny_moe", "tiny_moe2");
        assert_ne!(r.digest(), Recipe::from_toml("c", &other).unwrap().digest());
        let rules = r.rules();
        assert_eq!(rules.len(), 3);
        assert_eq!(
            (rules[1].glob(), rules[1].component(), rules[1].dtype()),
            (
                "lm_head.weight",
                RecipeComponent::Ftw,
                DtypePolicy::Protected
            )
        );
    }
}
