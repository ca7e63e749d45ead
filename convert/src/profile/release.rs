//! The released Qwen4-Exp layout (`config.json` with `text_config`) as
//! data: from `layer_types` and the dims, every expected text tensor with
//! its dtype and shape ([`Release::expected`]), checked all at once.
//!
//! With `P = model.language_model`, H = `hidden_size`, `hc` =
//! `hc_count` × H, `r` = `hc_lowrank`:
//! * global: `P.embed_tokens.weight` [V, H], `lm_head.weight` [V, H],
//!   `P.hyper_connection_mixer.{hc_norm [hc], input_mix_weight_down [r, hc],
//!   input_mix_weight_up [hc, r]}.weight`;
//! * every layer `P.layers.{l}`: `{attn,mlp}_hyper_connection.*` (the
//!   mixer's three plus `block_inject_weight` [hc_count, hc]), the router
//!   `mlp.gate.weight` [E, H], `mlp.shared_expert.{gate,up}_proj` [Is, H],
//!   `down_proj` [H, Is], `mlp.shared_expert_gate.weight` [1, H], and the
//!   routed experts (fused BF16 or per-expert, see the parent module);
//! * `full_attention` layers: `self_attn.{q_proj [2·nh·hd, H], k_proj,
//!   v_proj [nkv·hd, H], o_proj [H, nh·hd], q_norm, k_norm [hd],
//!   indexer.index_qk_proj [(ih + ikv)·ihd, H], indexer.{q,k}_layernorm
//!   [ihd]}`;
//! * `linear_attention` (Gated DeltaNet) layers, with `c = 2·lk·lkd +
//!   lv·lvd`: `linear_attn.{A_log, dt_bias [lv], conv1d.weight [c, 1, k],
//!   in_proj_qkv [c, H], in_proj_z [lv·lvd, H], in_proj_a, in_proj_b
//!   [lv, H], norm [lvd], out_proj [H, lv·lvd]}`;
//! * the PLE layer (`ple_layer_ids` is one-indexed: id `n` is decoder layer
//!   `n − 1`): `ple.{key_proj [hc, D], value_proj [H, D], conv1d [hc, 1,
//!   ple_conv_kernel_size], norm_key, norm_query, norm_conv [hc]}.weight`
//!   (D = `ple_embed_dim`), the I64 lookup buffers
//!   `ple.ple_embedding.{layer_multipliers [ngram_size],
//!   ngram_heads_vocab_sizes [heads], ngram_heads_offsets [heads]}` and the
//!   n-gram shards ([`PleGeometry`]).
//!
//! Linear weights are BF16 or ModelOpt NVFP4 triplets (with an optional
//! `input_scale`); vectors and convolutions BF16 or F32; lookup buffers I64.
//! `model.visual.*` (vision) and `mtp.*` (multi-token prediction) are other
//! partitions: omitted from the text artifact and listed in the manifest.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use ftpipe_artifact::manifest::Partition;
use ftpipe_formats::{Dtype, TensorDesc, TensorKind, sizes};

use super::config::TextConfig;
use super::{
    CONFIG_FILE, Catalog, CheckedSpan, Claimed, Component, ComponentContent, ComponentKind,
    ConvertError, FtwBuilder, FtwTensor, MoeProfile, SourceSpan, TensorSource, fmt_err,
};

/// Name prefix of the text model.
pub const TEXT_PREFIX: &str = "model.language_model";

/// Largest `ngram_vocab_size_base` the primes search accepts.
pub const MAX_NGRAM_VOCAB_BASE: u64 = 1 << 40;
/// Most n-gram heads the config may ask for.
pub const MAX_NGRAM_HEADS: u64 = 4096;
/// Most n-gram shards the config may ask for.
pub const MAX_NGRAM_PARTS: u64 = 1 << 20;

/// The partition of source tensor `name`, `None` when it is in none.
pub(crate) fn partition_of(name: &str) -> Option<Partition> {
    if name.starts_with("model.language_model.") || name == "lm_head.weight" {
        Some(Partition::Text)
    } else if name.starts_with("model.visual.") {
        Some(Partition::Vision)
    } else if name.starts_with("mtp.") {
        Some(Partition::Mtp)
    } else {
        None
    }
}

/// A source tensor left out of the text artifact, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OmittedTensor {
    /// Source tensor name.
    pub tensor: String,
    /// Source file.
    pub file: String,
    /// The partition it belongs to (`vision` or `mtp`).
    pub reason: Partition,
    /// Its bytes in the source; 0 when it was not fetched (its file's
    /// header was never read: the plan's `excluded_sources` have the
    /// file sizes).
    pub bytes: u64,
    /// False when its file was left out of the fetch (`--exclude`).
    #[serde(
        default = "ftpipe_artifact::manifest::fetched_default",
        skip_serializing_if = "ftpipe_artifact::manifest::is_fetched"
    )]
    pub fetched: bool,
}

/// What a release tensor must be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Want {
    /// `{module}.weight` of logical shape `[out, in]`: BF16, or an NVFP4
    /// triplet with an optional `input_scale`.
    Linear([u64; 2]),
    /// A parameter tensor: BF16 or F32 of this shape.
    Float(Vec<u64>),
    /// An I64 lookup buffer `[len]`, its values fixed by the config when
    /// given.
    Lookup(u64, Option<Vec<i64>>),
}

impl Want {
    fn describe(&self) -> String {
        match self {
            Want::Linear(s) => format!("BF16 {s:?} or an NVFP4 triplet of logical {s:?}"),
            Want::Float(s) => format!("BF16 or F32 {s:?}"),
            Want::Lookup(n, _) => format!("I64 [{n}]"),
        }
    }
}

/// The geometry of one PLE n-gram table, derived from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PleGeometry {
    /// The zero-based decoder layer.
    pub layer: u64,
    /// `(ngram_size − 1) × heads_per_ngram`.
    pub heads: u64,
    /// Head `h`'s vocabulary: the `(h+1)`-th prime ≥ `ngram_vocab_size_base`.
    pub sizes: Vec<u64>,
    /// Exclusive prefix sums of `sizes`.
    pub offsets: Vec<u64>,
    /// `round_up(Σ sizes, make_ngram_vocab_size_divisible_by)`.
    pub rows: u64,
    /// Rows of shard `i`: `rows / parts` (+1 for `i < rows mod parts`).
    pub shard_rows: Vec<u64>,
    /// `ple_embed_dim / heads`.
    pub width: u64,
    /// `ngram_size`.
    pub ngram_size: u64,
}

impl PleGeometry {
    fn because(&self) -> String {
        format!(
            "heads {} with sizes {:?} (primes ≥ ngram_vocab_size_base), rows {} in {} shards, width {}",
            self.heads,
            self.sizes,
            self.rows,
            self.shard_rows.len(),
            self.width
        )
    }
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// The first `heads` primes ≥ `base`.
pub fn ngram_head_sizes(base: u64, heads: u64) -> Vec<u64> {
    (base..)
        .filter(|&n| is_prime(n))
        .take(usize::try_from(heads).unwrap_or(0))
        .collect()
}

/// The dims the release layout is derived from.
#[derive(Debug, Clone)]
struct Dims {
    hidden: u64,
    vocab: u64,
    experts: u64,
    shared: u64,
    hc_count: u64,
    hc_lowrank: u64,
    head_dim: u64,
    heads: u64,
    kv_heads: u64,
    ix_heads: u64,
    ix_kv_heads: u64,
    ix_dim: u64,
    lk_heads: u64,
    lk_dim: u64,
    lv_heads: u64,
    lv_dim: u64,
    conv: u64,
}

/// A layer kind of `layer_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerType {
    Linear,
    Full,
}

/// The release contract of one config.
#[derive(Debug, Clone)]
pub struct Release {
    dims: Dims,
    layer_types: Vec<LayerType>,
    /// `ple_layer_ids` as written (one-indexed).
    ple_ids: Vec<u64>,
    ple_embed_dim: u64,
    ple_conv: u64,
    ple: Vec<PleGeometry>,
}

fn overflow(field: &str) -> ConvertError {
    ConvertError::BadConfig {
        file: CONFIG_FILE.into(),
        field: format!("text_config.{field}"),
        problem: "overflows 64-bit sizes".into(),
    }
}

fn mul(a: u64, b: u64, field: &str) -> Result<u64, ConvertError> {
    a.checked_mul(b).ok_or_else(|| overflow(field))
}

impl Release {
    /// The contract `text` implies for a model of `layers` layers and
    /// `hidden` × `vocab`, `experts`.
    pub(super) fn from_text(
        text: &TextConfig,
        layers: u64,
        hidden: u64,
        vocab: u64,
        experts: u64,
    ) -> Result<Release, ConvertError> {
        let types = match text.get("layer_types") {
            None => return Err(text.bad("layer_types", "is missing".into())),
            Some(v) => v
                .as_array()
                .ok_or_else(|| text.bad("layer_types", format!("is {v}, expected a list")))?,
        };
        if types.len() as u64 != layers {
            return Err(text.bad(
                "layer_types",
                format!("has {} entries, num_hidden_layers is {layers}", types.len()),
            ));
        }
        let layer_types = types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("linear_attention") => Ok(LayerType::Linear),
                Some("full_attention") => Ok(LayerType::Full),
                _ => Err(text.bad(
                    &format!("layer_types[{i}]"),
                    format!("is {t}, expected \"linear_attention\" or \"full_attention\""),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dims = Dims {
            hidden,
            vocab,
            experts,
            shared: text.u64("shared_expert_intermediate_size")?,
            hc_count: text.u64("hc_count")?,
            hc_lowrank: text.u64("hc_lowrank")?,
            head_dim: text.u64("head_dim")?,
            heads: text.u64("num_attention_heads")?,
            kv_heads: text.u64("num_key_value_heads")?,
            ix_heads: text.u64("indexer_n_heads")?,
            ix_kv_heads: text.u64("indexer_kv_heads")?,
            ix_dim: text.u64("indexer_head_dim")?,
            lk_heads: text.u64("linear_num_key_heads")?,
            lk_dim: text.u64("linear_key_head_dim")?,
            lv_heads: text.u64("linear_num_value_heads")?,
            lv_dim: text.u64("linear_value_head_dim")?,
            conv: text.u64("linear_conv_kernel_dim")?,
        };
        // Every derived size must fit: the largest products, checked once.
        mul(dims.hc_count, hidden, "hc_count")?;
        mul(
            mul(2, dims.heads, "num_attention_heads")?,
            dims.head_dim,
            "head_dim",
        )?;
        mul(
            mul(2, dims.lk_heads, "linear_num_key_heads")?,
            dims.lk_dim,
            "linear_key_head_dim",
        )?
        .checked_add(mul(dims.lv_heads, dims.lv_dim, "linear_value_head_dim")?)
        .ok_or_else(|| overflow("linear_value_head_dim"))?;
        mul(
            dims.ix_heads.saturating_add(dims.ix_kv_heads),
            dims.ix_dim,
            "indexer_head_dim",
        )?;
        let ple_ids = text.u64_list("ple_layer_ids")?;
        let (mut ple, mut ple_embed_dim, mut ple_conv) = (Vec::new(), 0, 0);
        if !ple_ids.is_empty() {
            ple_embed_dim = text.u64("ple_embed_dim")?;
            ple_conv = text.u64("ple_conv_kernel_size")?;
            for &id in &ple_ids {
                if id == 0 || id > layers {
                    return Err(text.bad(
                        "ple_layer_ids",
                        format!(
                            "is {ple_ids:?}: ids are one-indexed (1..={layers} for num_hidden_layers {layers}); {id} names no decoder layer"
                        ),
                    ));
                }
                ple.push(ple_geometry(text, id - 1, ple_embed_dim)?);
            }
        }
        Ok(Release {
            dims,
            layer_types,
            ple_ids,
            ple_embed_dim,
            ple_conv,
            ple,
        })
    }

    /// The PLE tables, by zero-based decoder layer.
    pub fn ple(&self) -> &[PleGeometry] {
        &self.ple
    }

    /// Every expected text tensor but the routed experts and the n-gram
    /// shards, with what it must be.
    fn expected(&self) -> BTreeMap<String, Want> {
        let d = &self.dims;
        let mut e = ExpectedTensors {
            dims: d,
            hc: d.hc_count * d.hidden,
            want: BTreeMap::new(),
        };
        let p = TEXT_PREFIX;
        e.linear(format!("{p}.embed_tokens"), [d.vocab, d.hidden]);
        e.linear("lm_head".into(), [d.vocab, d.hidden]);
        e.hyper_connection(&format!("{p}.hyper_connection_mixer"), false);
        for (l, &t) in (0u64..).zip(&self.layer_types) {
            e.layer(&format!("{p}.layers.{l}"), t);
        }
        for g in &self.ple {
            e.ple(g, self.ple_embed_dim, self.ple_conv);
        }
        e.want
    }

    /// Whether `name` is handled by the expert or n-gram rules rather than
    /// [`Release::expected`].
    fn has_own_rule(&self, name: &str, moe_layers: &BTreeSet<u64>) -> bool {
        let Some(rest) = name.strip_prefix(&format!("{TEXT_PREFIX}.layers.")) else {
            return false;
        };
        let (l, rest) = rest.split_once('.').unwrap_or((rest, ""));
        let Ok(l) = l.parse::<u64>() else {
            return false;
        };
        (moe_layers.contains(&l) && rest.starts_with("mlp.experts."))
            || (self.ple.iter().any(|g| g.layer == l)
                && rest.starts_with("ple.ple_embedding.ngram_embedding."))
    }

    /// The decoder layers holding PLE tensors in the source.
    fn ple_layers_found(cat: &Catalog) -> BTreeSet<u64> {
        cat.iter()
            .filter_map(|(n, _, _)| {
                let rest = n.strip_prefix(&format!("{TEXT_PREFIX}.layers."))?;
                let (l, rest) = rest.split_once('.')?;
                rest.starts_with("ple.").then(|| l.parse().ok()).flatten()
            })
            .collect()
    }

    /// `ple_layer_ids` against where the PLE tensors sit, with the
    /// zero-based mistake named.
    fn check_ple_placement(&self, cat: &Catalog) -> Result<(), ConvertError> {
        let found = Self::ple_layers_found(cat);
        let want: BTreeSet<u64> = self.ple.iter().map(|g| g.layer).collect();
        if found.is_empty() || found == want {
            return Ok(());
        }
        let ids = &self.ple_ids;
        let one_based: Vec<u64> = found.iter().map(|l| l + 1).collect();
        let zero_based = ids.iter().copied().collect::<BTreeSet<_>>() == found;
        let problem = if zero_based {
            format!(
                "is {ids:?}, which names decoder layer(s) {:?} (ple_layer_ids is one-indexed), but the PLE tensors sit under layers.{} — the config names decoder layer {:?}; ple_layer_ids {one_based:?} would name the layers that hold them",
                want,
                found
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", layers."),
                want.iter().next().copied().unwrap_or(0),
            )
        } else {
            format!(
                "is {ids:?} (one-indexed: decoder layer(s) {want:?}), but PLE tensors sit under decoder layer(s) {found:?} (ple_layer_ids {one_based:?})"
            )
        };
        Err(ConvertError::BadConfig {
            file: CONFIG_FILE.into(),
            field: "text_config.ple_layer_ids".into(),
            problem,
        })
    }
}

/// The expected tensors of a release, as they are listed
/// ([`Release::expected`]).
struct ExpectedTensors<'a> {
    dims: &'a Dims,
    /// `hc_count` × `hidden`.
    hc: u64,
    want: BTreeMap<String, Want>,
}

impl ExpectedTensors<'_> {
    /// Linear `module` of logical shape `shape`.
    fn linear(&mut self, module: String, shape: [u64; 2]) {
        self.want.insert(module, Want::Linear(shape));
    }

    /// Parameter tensor `name` of shape `shape`.
    fn float(&mut self, name: String, shape: &[u64]) {
        self.want.insert(name, Want::Float(shape.to_vec()));
    }

    /// The hyper-connection mixer under `q`; a layer's (`inject`) also has
    /// its block inject weight.
    fn hyper_connection(&mut self, q: &str, inject: bool) {
        let (hc, d) = (self.hc, self.dims);
        self.float(format!("{q}.hc_norm.weight"), &[hc]);
        self.linear(format!("{q}.input_mix_weight_down"), [d.hc_lowrank, hc]);
        self.linear(format!("{q}.input_mix_weight_up"), [hc, d.hc_lowrank]);
        if inject {
            self.linear(format!("{q}.block_inject_weight"), [d.hc_count, hc]);
        }
    }

    /// Decoder layer `q` of type `t`: its hyper-connections, router, shared
    /// expert and attention.
    fn layer(&mut self, q: &str, t: LayerType) {
        let d = self.dims;
        let h = d.hidden;
        self.hyper_connection(&format!("{q}.attn_hyper_connection"), true);
        self.hyper_connection(&format!("{q}.mlp_hyper_connection"), true);
        let m = format!("{q}.mlp");
        self.linear(format!("{m}.gate"), [d.experts, h]);
        self.linear(format!("{m}.shared_expert.gate_proj"), [d.shared, h]);
        self.linear(format!("{m}.shared_expert.up_proj"), [d.shared, h]);
        self.linear(format!("{m}.shared_expert.down_proj"), [h, d.shared]);
        self.linear(format!("{m}.shared_expert_gate"), [1, h]);
        match t {
            LayerType::Full => self.full_attention(&format!("{q}.self_attn")),
            LayerType::Linear => self.linear_attention(&format!("{q}.linear_attn")),
        }
    }

    /// The full attention `a` of a layer, with its indexer.
    fn full_attention(&mut self, a: &str) {
        let d = self.dims;
        let h = d.hidden;
        let kv = d.kv_heads * d.head_dim;
        self.linear(format!("{a}.q_proj"), [2 * d.heads * d.head_dim, h]);
        self.linear(format!("{a}.k_proj"), [kv, h]);
        self.linear(format!("{a}.v_proj"), [kv, h]);
        self.linear(format!("{a}.o_proj"), [h, d.heads * d.head_dim]);
        self.float(format!("{a}.q_norm.weight"), &[d.head_dim]);
        self.float(format!("{a}.k_norm.weight"), &[d.head_dim]);
        let qk = (d.ix_heads + d.ix_kv_heads) * d.ix_dim;
        self.linear(format!("{a}.indexer.index_qk_proj"), [qk, h]);
        self.float(format!("{a}.indexer.q_layernorm.weight"), &[d.ix_dim]);
        self.float(format!("{a}.indexer.k_layernorm.weight"), &[d.ix_dim]);
    }

    /// The linear (Gated DeltaNet) attention `a` of a layer.
    fn linear_attention(&mut self, a: &str) {
        let d = self.dims;
        let h = d.hidden;
        let v = d.lv_heads * d.lv_dim;
        let c = 2 * d.lk_heads * d.lk_dim + v;
        self.float(format!("{a}.A_log"), &[d.lv_heads]);
        self.float(format!("{a}.dt_bias"), &[d.lv_heads]);
        self.float(format!("{a}.conv1d.weight"), &[c, 1, d.conv]);
        self.linear(format!("{a}.in_proj_qkv"), [c, h]);
        self.linear(format!("{a}.in_proj_z"), [v, h]);
        self.linear(format!("{a}.in_proj_a"), [d.lv_heads, h]);
        self.linear(format!("{a}.in_proj_b"), [d.lv_heads, h]);
        self.float(format!("{a}.norm.weight"), &[d.lv_dim]);
        self.linear(format!("{a}.out_proj"), [h, v]);
    }

    /// The PLE module of table `g` (embedding dim `embed_dim`, convolution
    /// kernel `conv`) and its lookup buffers, the vocabulary sizes and
    /// offsets fixed by the geometry.
    fn ple(&mut self, g: &PleGeometry, embed_dim: u64, conv: u64) {
        let (h, hc) = (self.dims.hidden, self.hc);
        let q = format!("{TEXT_PREFIX}.layers.{}.ple", g.layer);
        self.linear(format!("{q}.key_proj"), [hc, embed_dim]);
        self.linear(format!("{q}.value_proj"), [h, embed_dim]);
        self.float(format!("{q}.conv1d.weight"), &[hc, 1, conv]);
        for n in ["norm_key", "norm_query", "norm_conv"] {
            self.float(format!("{q}.{n}.weight"), &[hc]);
        }
        let e = format!("{q}.ple_embedding");
        let as_i64 = |v: &[u64]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        self.want.insert(
            format!("{e}.layer_multipliers"),
            Want::Lookup(g.ngram_size, None),
        );
        self.want.insert(
            format!("{e}.ngram_heads_vocab_sizes"),
            Want::Lookup(g.heads, Some(as_i64(&g.sizes))),
        );
        self.want.insert(
            format!("{e}.ngram_heads_offsets"),
            Want::Lookup(g.heads, Some(as_i64(&g.offsets))),
        );
    }
}

fn ple_geometry(
    text: &TextConfig,
    layer: u64,
    embed_dim: u64,
) -> Result<PleGeometry, ConvertError> {
    let ngram_size = text.u64("ngram_size")?;
    let per = text.u64("heads_per_ngram")?;
    let base = text.u64("ngram_vocab_size_base")?;
    let div = text.u64("make_ngram_vocab_size_divisible_by")?;
    let parts = text.u64("split_ngram_parts")?;
    let heads = ngram_size
        .checked_sub(1)
        .and_then(|n| n.checked_mul(per))
        .filter(|&h| (1..=MAX_NGRAM_HEADS).contains(&h))
        .ok_or_else(|| {
            text.bad(
                "heads_per_ngram",
                format!(
                    "is {per} with ngram_size {ngram_size}: (ngram_size − 1) × heads_per_ngram must be in 1..={MAX_NGRAM_HEADS}"
                ),
            )
        })?;
    if base > MAX_NGRAM_VOCAB_BASE {
        return Err(text.bad(
            "ngram_vocab_size_base",
            format!("is {base}, beyond the limit {MAX_NGRAM_VOCAB_BASE}"),
        ));
    }
    if div == 0 {
        return Err(text.bad(
            "make_ngram_vocab_size_divisible_by",
            "is 0, expected a positive integer".into(),
        ));
    }
    if parts == 0 || parts > MAX_NGRAM_PARTS {
        return Err(text.bad(
            "split_ngram_parts",
            format!("is {parts}, expected 1..={MAX_NGRAM_PARTS}"),
        ));
    }
    if embed_dim == 0 || !embed_dim.is_multiple_of(heads) {
        return Err(text.bad(
            "ple_embed_dim",
            format!("is {embed_dim}, not a positive multiple of the {heads} n-gram heads"),
        ));
    }
    let width = embed_dim / heads;
    if !width.is_multiple_of(32) {
        return Err(text.bad(
            "ple_embed_dim",
            format!(
                "is {embed_dim}: the row width {width} (ple_embed_dim / {heads} heads) must be a multiple of 32 for Q3_PLE_32"
            ),
        ));
    }
    let sizes = ngram_head_sizes(base, heads);
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut sum = 0u64;
    for &s in &sizes {
        offsets.push(sum);
        sum = sum
            .checked_add(s)
            .ok_or_else(|| overflow("ngram_vocab_size_base"))?;
    }
    let rows = sum
        .div_ceil(div)
        .checked_mul(div)
        .ok_or_else(|| overflow("make_ngram_vocab_size_divisible_by"))?;
    let shard_rows = (0..parts)
        .map(|i| rows / parts + u64::from(i < rows % parts))
        .collect();
    Ok(PleGeometry {
        layer,
        heads,
        sizes,
        offsets,
        rows,
        shard_rows,
        width,
        ngram_size,
    })
}

impl MoeProfile {
    /// Components of a release-layout source, and the tensors of other
    /// partitions it leaves out.
    pub(super) fn release_components(
        &self,
        r: &Release,
        cat: &Catalog,
    ) -> Result<(Vec<Component>, Vec<OmittedTensor>), ConvertError> {
        let mut omitted = Vec::new();
        let mut stray = Vec::new();
        for (name, file, t) in cat.iter() {
            match partition_of(name) {
                Some(Partition::Text) => {}
                Some(reason) => omitted.push(OmittedTensor {
                    tensor: name.to_owned(),
                    file: file.to_owned(),
                    reason,
                    bytes: t.len(),
                    fetched: true,
                }),
                None => stray.push(format!("  {file}: {name}")),
            }
        }
        if !stray.is_empty() {
            return Err(ConvertError::UnknownPartition {
                count: stray.len(),
                tensors: stray.join("\n"),
            });
        }
        r.check_ple_placement(cat)?;

        let mut problems = Vec::new();
        // Sized for every tensor at once: the sets merged into it are not
        // hashed again at each growth.
        let mut claimed = Claimed::with_capacity_and_hasher(cat.len(), Default::default());
        let mut ftw = FtwBuilder::default();
        let expected = r.expected();
        // Each expected tensor is looked up on its own (in parallel: the
        // plan runs before the first transfer); found in name order.
        let found: Vec<_> = expected
            .par_iter()
            .map(|(name, want)| self.release_tensor(cat, name, want))
            .collect();
        for tensor in found {
            match tensor {
                Ok((tensors, names)) => {
                    claimed.extend(names);
                    for t in tensors {
                        ftw.insert(t)?;
                    }
                }
                Err(p) => problems.push(p),
            }
        }
        let mut segments = Vec::new();
        for g in r.ple() {
            match self.ngram_shards(cat, g) {
                Ok(s) => segments.push((g, s)),
                Err(p) => problems.extend(p),
            }
        }
        for (name, file, _) in cat.iter() {
            if partition_of(name) == Some(Partition::Text)
                && !claimed.contains(name)
                && !r.has_own_rule(name, &self.moe_layers)
                && !is_claimed_part(name, &expected)
            {
                problems.push(format!(
                    "  {file}: {name}: expected no such tensor (not in the release layout), found it"
                ));
            }
        }
        if !problems.is_empty() {
            return Err(ConvertError::ReleaseLayout {
                profile: self.family.into(),
                count: problems.len(),
                problems: problems.join("\n"),
            });
        }

        let (mut components, ftw_extra) = self.expert_components(cat, &mut claimed)?;
        for (g, shards) in segments {
            components.extend(ple_table(g, shards, &mut claimed)?);
        }
        for t in ftw_extra {
            ftw.insert(t)?;
        }
        // Whatever the rules above did not take is not part of the layout.
        for (name, file, _) in cat.iter() {
            if partition_of(name) == Some(Partition::Text) && !claimed.contains(name) {
                return Err(ConvertError::UnexpectedTensor {
                    file: file.to_owned(),
                    tensor: name.to_owned(),
                    reason: format!("not part of the {} release layout", self.family),
                });
            }
        }
        components.insert(0, ftw.finish()?);
        Ok((components, omitted))
    }

    /// The FTEXPERT1 components of the MoE layers in layer order, mapped in
    /// parallel (the first error in layer order, as one at a time would
    /// give), and the experts' input scales bound for the FTW stream.
    fn expert_components(
        &self,
        cat: &Catalog,
        claimed: &mut Claimed,
    ) -> Result<(Vec<Component>, Vec<FtwTensor>), ConvertError> {
        let layers: Vec<u64> = self.moe_layers.iter().copied().collect();
        let mapped: Vec<_> = layers
            .par_iter()
            .map(|&l| {
                let (mut taken, mut extra) = (Claimed::default(), Vec::new());
                self.expert_component(cat, l, &mut taken, &mut extra)
                    .map(|c| (c, taken, extra))
            })
            .collect();
        let mut components = Vec::with_capacity(mapped.len());
        let mut ftw_extra = Vec::new();
        for layer in mapped {
            let (component, taken, extra) = layer?;
            components.push(component);
            claimed.extend(taken);
            ftw_extra.extend(extra);
        }
        Ok((components, ftw_extra))
    }

    /// The FTW tensors for expected `name` and the source tensors they
    /// claim, or the problem line.
    fn release_tensor(
        &self,
        cat: &Catalog,
        name: &str,
        want: &Want,
    ) -> Result<ReleaseTensors, String> {
        match want {
            Want::Linear(shape) => self.release_linear(cat, name, shape, want),
            Want::Float(shape) => self.release_float(cat, name, shape, want),
            Want::Lookup(len, values) => release_lookup(cat, name, *len, values.as_deref(), want),
        }
    }

    /// [`MoeProfile::release_tensor`] of linear `name` of logical shape
    /// `shape`: BF16 or an NVFP4 triplet, with its input scale if any.
    fn release_linear(
        &self,
        cat: &Catalog,
        name: &str,
        shape: &[u64; 2],
        want: &Want,
    ) -> Result<ReleaseTensors, String> {
        let w = format!("{name}.weight");
        let Some((file, t)) = cat.get(&w) else {
            return Err(problem_line(want, "-", &w, "nothing (missing)".into()));
        };
        let found = format!("{:?} {:?}", t.dtype(), t.shape());
        let lin = self
            .linear(cat, name, shape, "the release layout")
            .map_err(|e| match t.dtype() {
                safetensors::Dtype::BF16 | safetensors::Dtype::F16 | safetensors::Dtype::F32 => {
                    problem_line(want, file, &w, found.clone())
                }
                _ => problem_line(want, file, &w, format!("{found} ({e})")),
            })?;
        if !matches!(lin.dtype, Dtype::BF16 | Dtype::Nvfp4) {
            return Err(problem_line(
                want,
                file,
                &w,
                format!("{:?} {:?}", t.dtype(), t.shape()),
            ));
        }
        let mut out = vec![FtwTensor {
            desc: TensorDesc::new(&w, lin.dtype, lin.kind, lin.shape),
            source: lin.source,
        }];
        out.extend(lin.input_scale);
        Ok((out, lin.claimed))
    }

    /// [`MoeProfile::release_tensor`] of parameter `name`: BF16 or F32 of
    /// shape `shape`.
    fn release_float(
        &self,
        cat: &Catalog,
        name: &str,
        shape: &[u64],
        want: &Want,
    ) -> Result<ReleaseTensors, String> {
        let Some((file, t)) = cat.get(name) else {
            return Err(problem_line(want, "-", name, "nothing (missing)".into()));
        };
        let dtype = match t.dtype() {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F32 => Dtype::F32,
            d => {
                return Err(problem_line(
                    want,
                    file,
                    name,
                    format!("{d:?} {:?}", t.shape()),
                ));
            }
        };
        if t.shape() != shape {
            return Err(problem_line(
                want,
                file,
                name,
                format!("{:?} {:?}", t.dtype(), t.shape()),
            ));
        }
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let kind = if self.protected(module) {
            TensorKind::Protected
        } else {
            TensorKind::Plain
        };
        let span = cat.span(name).expect("present");
        Ok((
            vec![FtwTensor {
                desc: TensorDesc::new(name, dtype, kind, t.shape()),
                source: TensorSource::Span(span),
            }],
            vec![t.shared_name().clone()],
        ))
    }

    /// The n-gram shards of `g` with their FP8 scale spans, every problem
    /// listed.
    fn ngram_shards(
        &self,
        cat: &Catalog,
        g: &PleGeometry,
    ) -> Result<Vec<(SourceSpan, Option<SourceSpan>)>, Vec<String>> {
        let base = format!(
            "{TEXT_PREFIX}.layers.{}.ple.ple_embedding.ngram_embedding",
            g.layer
        );
        let table_scale = format!("{base}.weight_scale");
        let mut problems = Vec::new();
        let mut out = Vec::new();
        let mut dtypes = BTreeSet::new();
        let scale_ok = |n: &str, problems: &mut Vec<String>| -> Option<SourceSpan> {
            let (f, t) = cat.get(n)?;
            if t.dtype() != safetensors::Dtype::F32 || !matches!(t.shape(), [] | [1]) {
                problems.push(format!(
                    "  {f}: {n}: expected F32 [] (the FP8 table's scale), found {:?} {:?}",
                    t.dtype(),
                    t.shape()
                ));
            }
            cat.span(n)
        };
        for (i, &rows) in (0u64..).zip(&g.shard_rows) {
            let n = format!("{base}.shard_{i}.weight");
            let Some((f, t)) = cat.get(&n) else {
                problems.push(format!(
                    "  -: {n}: expected BF16 or F8_E4M3 [{rows}, {}] ({}), found nothing (missing)",
                    g.width,
                    g.because()
                ));
                continue;
            };
            let fp8 = match t.dtype() {
                safetensors::Dtype::BF16 => false,
                safetensors::Dtype::F8_E4M3 => true,
                d => {
                    problems.push(format!(
                        "  {f}: {n}: expected BF16 or F8_E4M3 (PLE table), found {d:?}"
                    ));
                    continue;
                }
            };
            dtypes.insert(fp8);
            if t.shape() != [rows, g.width] {
                problems.push(format!(
                    "  {f}: {n}: expected [{rows}, {}] ({}), found {:?}",
                    g.width,
                    g.because(),
                    t.shape()
                ));
                continue;
            }
            let scale = if fp8 {
                let own = format!("{base}.shard_{i}.weight_scale");
                match scale_ok(&own, &mut problems)
                    .or_else(|| scale_ok(&table_scale, &mut problems))
                {
                    Some(s) => Some(s),
                    None => {
                        problems.push(format!(
                            "  {f}: {n}: F8_E4M3 PLE table without a scale: expected {table_scale} F32 [] or {own} F32 [], found neither"
                        ));
                        continue;
                    }
                }
            } else {
                None
            };
            out.push((cat.span(&n).expect("present"), scale));
        }
        if dtypes.len() > 1 {
            problems.push(format!(
                "  -: {base}.shard_*: expected one dtype for the whole table, found BF16 and F8_E4M3 shards"
            ));
        }
        let parts = g.shard_rows.len() as u64;
        let shard_prefix = format!("{base}.shard_");
        for (n, f, _) in cat.iter() {
            let index = n
                .strip_prefix(&shard_prefix)
                .and_then(|r| r.strip_suffix(".weight"))
                .and_then(|i| i.parse::<u64>().ok());
            if index.is_some_and(|i| i >= parts) {
                problems.push(format!(
                    "  {f}: {n}: expected no such shard (split_ngram_parts {parts}), found it"
                ));
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems)
        }
    }
}

/// The FTW tensors of one expected release tensor, and the source tensors
/// they claim.
type ReleaseTensors = (Vec<FtwTensor>, Vec<Arc<str>>);

/// The problem line for `tensor` of `file` found as `found`, not as `want`.
fn problem_line(want: &Want, file: &str, tensor: &str, found: String) -> String {
    format!(
        "  {file}: {tensor}: expected {}, found {found}",
        want.describe()
    )
}

/// [`MoeProfile::release_tensor`] of lookup buffer `name`: I64 `[len]`,
/// checked to hold `values` when the config fixes them.
fn release_lookup(
    cat: &Catalog,
    name: &str,
    len: u64,
    values: Option<&[i64]>,
    want: &Want,
) -> Result<ReleaseTensors, String> {
    let Some((file, t)) = cat.get(name) else {
        return Err(problem_line(want, "-", name, "nothing (missing)".into()));
    };
    if t.dtype() != safetensors::Dtype::I64 || t.shape() != [len] {
        return Err(problem_line(
            want,
            file,
            name,
            format!("{:?} {:?}", t.dtype(), t.shape()),
        ));
    }
    let span = cat.span(name).expect("present");
    let source = match values {
        None => TensorSource::Span(span),
        Some(v) => TensorSource::Checked(Box::new(CheckedSpan {
            span,
            expected: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            because: if name.ends_with("offsets") {
                "the prefix sums of the primes ≥ ngram_vocab_size_base".into()
            } else {
                "the primes ≥ ngram_vocab_size_base, (ngram_size − 1) × heads_per_ngram of them"
                    .into()
            },
        })),
    };
    Ok((
        vec![FtwTensor {
            desc: TensorDesc::new(name, Dtype::I64, TensorKind::Plain, [len]),
            source,
        }],
        vec![t.shared_name().clone()],
    ))
}

/// Whether `name` is an expected tensor or a part (weight, NVFP4 scale,
/// input scale) of an expected linear, whose own check reports it.
fn is_claimed_part(name: &str, expected: &BTreeMap<String, Want>) -> bool {
    expected.contains_key(name)
        || ["weight", "weight_scale", "weight_scale_2", "input_scale"]
            .iter()
            .filter_map(|p| name.strip_suffix(&format!(".{p}")))
            .any(|m| matches!(expected.get(m), Some(Want::Linear(_))))
}

/// The Q3_PLE_32 segments and global scale of table `g`.
fn ple_table(
    g: &PleGeometry,
    shards: Vec<(SourceSpan, Option<SourceSpan>)>,
    claimed: &mut Claimed,
) -> Result<Vec<Component>, ConvertError> {
    let l = g.layer;
    let mut out = Vec::new();
    let mut segments = Vec::new();
    let mut scales = Vec::new();
    for ((i, rows), (span, scale)) in (0u64..).zip(g.shard_rows.iter().copied()).zip(shards) {
        let name = format!("ple/layer_{l:03}/shard_{i}.q3");
        let predicted = sizes::q3_len(rows, g.width).map_err(fmt_err(&name))?;
        claimed.insert(span.tensor.clone());
        let mut files: BTreeSet<String> = [span.file.to_string()].into();
        if let Some(s) = &scale {
            claimed.insert(s.tensor.clone());
            files.insert(s.file.to_string());
            scales.push(s.clone());
        }
        out.push(Component {
            name,
            kind: ComponentKind::Q3Segment,
            predicted_bytes: predicted,
            items: rows,
            source_files: files,
            content: ComponentContent::Q3Segment {
                layer: l,
                index: i,
                rows,
                width: g.width,
                source: span.clone(),
                scale,
            },
        });
        segments.push(span);
    }
    let mut files: BTreeSet<String> = segments.iter().map(|s| s.file.to_string()).collect();
    files.extend(scales.iter().map(|s| s.file.to_string()));
    out.push(Component {
        name: format!("ple/layer_{l:03}/global_scale.bf16"),
        kind: ComponentKind::Q3GlobalScale,
        predicted_bytes: sizes::Q3_GLOBAL_SCALE_LEN,
        items: 1,
        source_files: files,
        content: ComponentContent::Q3GlobalScale {
            layer: l,
            segments,
            scales,
        },
    });
    Ok(out)
}
