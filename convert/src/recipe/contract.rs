//! A recipe's contract: the tensors a model must have, with their dtype and
//! shape, written as `[[expect]]` tables and checked like the built-in
//! profiles check theirs (presence, dtype, shape; every mismatch in one
//! error naming the tensor, what was expected and what was found).
//!
//! ```toml
//! [[expect]]
//! tensor = "model.layers.{l}.mlp.experts.{e}.gate_proj.weight"
//! each = { l = "num_hidden_layers", e = "num_experts" }  # {l} in 0..config value
//! dtype = ["BF16", "NVFP4"]                     # one name or a list; optional
//! shape = ["moe_intermediate_size", "hidden_size"]  # optional
//! ```
//!
//! * `tensor`: a full tensor name; `{x}` is replaced by every value of
//!   `each.x`, counting from 0 (all combinations). Every placeholder must be
//!   in `each` and every key of `each` in `tensor`.
//! * `each.x`, and each `shape` entry: a non-negative integer, or a string
//!   naming a `config.json` field by its dotted path (`"hidden_size"`,
//!   `"text_config.hidden_size"`), optionally with an integer factor
//!   (`"2*moe_intermediate_size"`).
//! * `dtype`: safetensors dtype names (`F32`, `F16`, `BF16`, `U8`, `I8`,
//!   `I32`, `I64`, `F8_E4M3`) or `NVFP4`, a ModelOpt triplet (`tensor`
//!   ends in `.weight`; its shape is the logical one, twice the codes' last
//!   dimension).
//!
//! At most [`MAX_EXPECTED_TENSORS`] names per recipe; the bound is checked
//! before any name is built.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::RecipeError;
use crate::component::{CONFIG_FILE, Catalog};
use crate::error::ConvertError;
use crate::nvfp4::{is_nvfp4, nvfp4_triplet};

/// Most tensor names the `[[expect]]` tables of one recipe may expand to.
pub const MAX_EXPECTED_TENSORS: u64 = 1 << 22;
/// Most `[[expect]]` tables in one recipe.
pub const MAX_EXPECT_TABLES: usize = 4096;

/// Dtype names an `[[expect]]` table may list.
const DTYPES: [&str; 9] = [
    "F32", "F16", "BF16", "U8", "I8", "I32", "I64", "F8_E4M3", "NVFP4",
];

/// A count or dimension as written: a literal or a config field.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(super) enum RawDim {
    Literal(u64),
    Field(String),
}

/// One `[[expect]]` table as deserialized.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpect {
    tensor: String,
    #[serde(default)]
    each: BTreeMap<String, RawDim>,
    #[serde(default)]
    dtype: Option<OneOrMany>,
    #[serde(default)]
    shape: Option<Vec<RawDim>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A validated `[[expect]]` table, config fields not yet read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Expect {
    tensor: String,
    each: BTreeMap<String, RawDim>,
    dtypes: Vec<String>,
    shape: Option<Vec<RawDim>>,
}

/// The placeholders `{x}` of `pattern`, in order, or why it is malformed.
fn placeholders(pattern: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err("has a '}' without its '{'".into());
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| "has a '{' without its '}'".to_owned())?;
        let name = &after[..close];
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!(
                "has the placeholder {{{name}}}: names are letters, digits and _"
            ));
        }
        out.push(name);
        rest = &after[close + 1..];
    }
    Ok(out)
}

impl Expect {
    /// Validates table `i` of recipe `file`.
    pub(super) fn new(file: &str, i: usize, raw: RawExpect) -> Result<Expect, RecipeError> {
        let bad = |problem: String| RecipeError::BadExpect {
            file: file.to_owned(),
            index: i,
            problem,
        };
        if raw.tensor.is_empty() {
            return Err(bad("tensor is empty".into()));
        }
        let used = placeholders(&raw.tensor).map_err(|p| bad(format!("tensor {p}")))?;
        for u in &used {
            if !raw.each.contains_key(*u) {
                return Err(bad(format!(
                    "tensor uses {{{u}}}, but each has no key {u:?}"
                )));
            }
        }
        for k in raw.each.keys() {
            if !used.contains(&k.as_str()) {
                return Err(bad(format!(
                    "each.{k} is not used by tensor {:?}",
                    raw.tensor
                )));
            }
        }
        let dtypes = match raw.dtype {
            None => Vec::new(),
            Some(OneOrMany::One(d)) => vec![d],
            Some(OneOrMany::Many(v)) if v.is_empty() => {
                return Err(bad("dtype is an empty list".into()));
            }
            Some(OneOrMany::Many(v)) => v,
        };
        for d in &dtypes {
            if !DTYPES.contains(&d.as_str()) {
                return Err(bad(format!(
                    "dtype {d:?} is not one of {}",
                    DTYPES.join(", ")
                )));
            }
        }
        if dtypes.iter().any(|d| d == "NVFP4") && !raw.tensor.ends_with(".weight") {
            return Err(bad(format!(
                "dtype NVFP4 needs a tensor ending in .weight (the triplet's weight), not {:?}",
                raw.tensor
            )));
        }
        for d in raw.each.values().chain(raw.shape.iter().flatten()) {
            if let RawDim::Field(f) = d {
                parse_field(f).map_err(|p| bad(format!("{f:?} {p}")))?;
            }
        }
        Ok(Expect {
            tensor: raw.tensor,
            each: raw.each,
            dtypes,
            shape: raw.shape,
        })
    }

    /// Feeds the canonical form to `put` (for the recipe digest).
    pub(super) fn canonical(&self, put: &mut dyn FnMut(&str)) {
        let dim = |d: &RawDim| match d {
            RawDim::Literal(n) => n.to_string(),
            RawDim::Field(f) => format!("={f}"),
        };
        put(&self.tensor);
        put(&self.each.len().to_string());
        for (k, v) in &self.each {
            put(k);
            put(&dim(v));
        }
        put(&self.dtypes.join(","));
        match &self.shape {
            None => put("-"),
            Some(s) => put(&s.iter().map(dim).collect::<Vec<_>>().join(",")),
        }
    }
}

/// `"k*a.b"` or `"a.b"`: the factor and the dotted path.
fn parse_field(s: &str) -> Result<(u64, Vec<&str>), String> {
    let (k, path) = match s.split_once('*') {
        Some((k, p)) => (
            k.trim()
                .parse::<u64>()
                .map_err(|_| "has a factor that is not a non-negative integer".to_owned())?,
            p.trim(),
        ),
        None => (1, s),
    };
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err("is not a dotted config.json path".into());
    }
    Ok((k, parts))
}

/// The value of `d` in `cfg`, or the error naming table `i` and the field.
fn resolve(cfg: &Value, file: &str, i: usize, d: &RawDim) -> Result<u64, ConvertError> {
    let s = match d {
        RawDim::Literal(n) => return Ok(*n),
        RawDim::Field(s) => s,
    };
    let (k, path) = parse_field(s)
        .map_err(|problem| RecipeError::BadExpect {
            file: file.to_owned(),
            index: i,
            problem: format!("{s:?} {problem}"),
        })
        .map_err(ConvertError::from)?;
    let field = path.join(".");
    let v = path
        .iter()
        .try_fold(cfg, |v, p| v.get(p))
        .ok_or_else(|| ConvertError::BadConfig {
            file: CONFIG_FILE.into(),
            field: field.clone(),
            problem: format!("is missing (the recipe {file} expect[{i}] reads it)"),
        })?;
    let n = v.as_u64().ok_or_else(|| ConvertError::BadConfig {
        file: CONFIG_FILE.into(),
        field: field.clone(),
        problem: format!("is {v}, expected a non-negative integer (recipe {file} expect[{i}])"),
    })?;
    n.checked_mul(k).ok_or_else(|| ConvertError::BadConfig {
        file: CONFIG_FILE.into(),
        field,
        problem: format!("is {n}: {k} × {n} overflows (recipe {file} expect[{i}])"),
    })
}

/// One table with its config fields read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BoundExpect {
    index: usize,
    tensor: String,
    /// `(placeholder, count)` in name order.
    each: Vec<(String, u64)>,
    dtypes: Vec<String>,
    shape: Option<Vec<u64>>,
}

/// The tables with the config's values, the expansion bounded.
pub(super) fn bind(
    file: &str,
    expects: &[Expect],
    cfg: &Value,
) -> Result<Vec<BoundExpect>, ConvertError> {
    let mut total = 0u64;
    let mut out = Vec::with_capacity(expects.len());
    for (i, e) in expects.iter().enumerate() {
        let mut each = Vec::with_capacity(e.each.len());
        let mut names = 1u64;
        for (k, d) in &e.each {
            let n = resolve(cfg, file, i, d)?;
            names = names.saturating_mul(n);
            each.push((k.clone(), n));
        }
        total = total.saturating_add(names);
        if total > MAX_EXPECTED_TENSORS {
            return Err(RecipeError::BadExpect {
                file: file.to_owned(),
                index: i,
                problem: format!(
                    "with config.json's values the [[expect]] tables name more than {MAX_EXPECTED_TENSORS} tensors"
                ),
            }
            .into());
        }
        let shape = match &e.shape {
            None => None,
            Some(s) => Some(
                s.iter()
                    .map(|d| resolve(cfg, file, i, d))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        out.push(BoundExpect {
            index: i,
            tensor: e.tensor.clone(),
            each,
            dtypes: e.dtypes.clone(),
            shape,
        });
    }
    Ok(out)
}

impl BoundExpect {
    fn describe(&self) -> String {
        let d = if self.dtypes.is_empty() {
            "any dtype".to_owned()
        } else {
            self.dtypes.join(" or ")
        };
        match &self.shape {
            Some(s) => format!("{d} {s:?}"),
            None => d,
        }
    }

    /// Calls `f` with every name the table expands to.
    fn names(&self, f: &mut dyn FnMut(&str)) {
        let mut idx = vec![0u64; self.each.len()];
        if self.each.iter().any(|(_, n)| *n == 0) {
            return;
        }
        loop {
            let mut name = self.tensor.clone();
            for ((k, _), v) in self.each.iter().zip(&idx) {
                name = name.replace(&format!("{{{k}}}"), &v.to_string());
            }
            f(&name);
            // Odometer over the placeholders, last one fastest.
            let mut d = idx.len();
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < self.each[d].1 {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// The problem line for `name`, if it disagrees with the table.
    fn check(&self, cat: &Catalog, name: &str) -> Option<String> {
        let expected = self.describe();
        let Some((file, t)) = cat.get(name) else {
            return Some(format!(
                "  -: {name}: expected {expected} (expect[{}]), found nothing (missing)",
                self.index
            ));
        };
        let module = name.strip_suffix(".weight").filter(|m| is_nvfp4(cat, m));
        let (dtype, shape) = match module {
            Some(m) => match nvfp4_triplet(cat, m) {
                Ok((nv, _)) => ("NVFP4".to_owned(), nv.shape().to_vec()),
                Err(e) => {
                    return Some(format!(
                        "  {file}: {name}: expected {expected} (expect[{}]), found a broken NVFP4 triplet ({e})",
                        self.index
                    ));
                }
            },
            None => (format!("{:?}", t.dtype()), t.shape().to_vec()),
        };
        let dtype_ok = self.dtypes.is_empty() || self.dtypes.contains(&dtype);
        let shape_ok = self.shape.as_ref().is_none_or(|s| *s == shape);
        if dtype_ok && shape_ok {
            return None;
        }
        Some(format!(
            "  {file}: {name}: expected {expected} (expect[{}]), found {dtype} {shape:?}",
            self.index
        ))
    }
}

/// Every problem of the source against `contract`, one line each.
pub(super) fn check(contract: &[BoundExpect], cat: &Catalog) -> Vec<String> {
    let mut problems = Vec::new();
    for e in contract {
        e.names(&mut |n| problems.extend(e.check(cat, n)));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_parsed_and_checked() {
        assert_eq!(placeholders("a.{l}.b.{e}.w").unwrap(), vec!["l", "e"]);
        assert!(placeholders("a.{l.w").is_err());
        assert!(placeholders("a.l}.w").is_err());
        assert!(placeholders("a.{}.w").is_err());
        assert!(placeholders("a.{l-1}.w").is_err());
    }

    #[test]
    fn fields_with_factors() {
        assert_eq!(
            parse_field("hidden_size").unwrap(),
            (1, vec!["hidden_size"])
        );
        assert_eq!(
            parse_field("2*text_config.moe").unwrap(),
            (2, vec!["text_config", "moe"])
        );
        assert!(parse_field("x*h").is_err());
        assert!(parse_field("a..b").is_err());
    }

    #[test]
    fn names_cover_every_combination_and_none_for_a_zero_count() {
        let e = BoundExpect {
            index: 0,
            tensor: "l{l}.e{e}".into(),
            each: vec![("e".into(), 3), ("l".into(), 2)],
            dtypes: vec![],
            shape: None,
        };
        let mut v = Vec::new();
        e.names(&mut |n| v.push(n.to_owned()));
        assert_eq!(v, ["l0.e0", "l1.e0", "l0.e1", "l1.e1", "l0.e2", "l1.e2"]);
        let z = BoundExpect {
            each: vec![("e".into(), 0), ("l".into(), 2)],
            ..e
        };
        let mut n = 0;
        z.names(&mut |_| n += 1);
        assert_eq!(n, 0);
    }
}
