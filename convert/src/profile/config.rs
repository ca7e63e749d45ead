//! Reading `config.json`: the text model sits under `text_config` in
//! multimodal releases (Qwen4-Exp) and at the top level in flat ones
//! (Qwen3-MoE). Every error names the JSON path it read.

use serde_json::Value;

use super::{CONFIG_FILE, ConvertError};

/// The object the text model's fields are read from, with its JSON path.
#[derive(Debug, Clone, Copy)]
pub(super) struct TextConfig<'a> {
    value: &'a Value,
    /// `"text_config."` or `""`.
    at: &'static str,
    /// Whether the top level has the field being read when `text_config`
    /// lacks it (for the error message only).
    root: &'a Value,
}

impl<'a> TextConfig<'a> {
    /// `cfg.text_config` when it is present, else `cfg` itself.
    pub(super) fn of(cfg: &'a Value) -> Result<Self, ConvertError> {
        match cfg.get("text_config") {
            None | Some(Value::Null) => Ok(TextConfig {
                value: cfg,
                at: "",
                root: cfg,
            }),
            Some(v @ Value::Object(_)) => Ok(TextConfig {
                value: v,
                at: "text_config.",
                root: cfg,
            }),
            Some(v) => Err(ConvertError::BadConfig {
                file: CONFIG_FILE.into(),
                field: "text_config".into(),
                problem: format!("is {v}, expected an object"),
            }),
        }
    }

    /// Whether the fields come from `text_config`.
    pub(super) fn nested(&self) -> bool {
        !self.at.is_empty()
    }

    /// The JSON path of `field`.
    pub(super) fn path(&self, field: &str) -> String {
        format!("{}{field}", self.at)
    }

    pub(super) fn get(&self, field: &str) -> Option<&'a Value> {
        self.value.get(field).filter(|v| !v.is_null())
    }

    /// An error about `field`.
    pub(super) fn bad(&self, field: &str, problem: String) -> ConvertError {
        ConvertError::BadConfig {
            file: CONFIG_FILE.into(),
            field: self.path(field),
            problem,
        }
    }

    fn missing(&self, field: &str) -> ConvertError {
        let problem = if self.nested() {
            "is missing".to_owned()
        } else if self.root.get("text_config").is_none() && field == "num_hidden_layers" {
            // Neither layout: say both places that were looked at.
            return ConvertError::BadConfig {
                file: CONFIG_FILE.into(),
                field: "text_config.num_hidden_layers".into(),
                problem: "is missing (config.json has neither text_config nor a top-level \
                          num_hidden_layers)"
                    .into(),
            };
        } else {
            "is missing".to_owned()
        };
        self.bad(field, problem)
    }

    /// A required non-negative integer.
    pub(super) fn u64(&self, field: &str) -> Result<u64, ConvertError> {
        match self.get(field) {
            None => Err(self.missing(field)),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| self.bad(field, format!("is {v}, expected a non-negative integer"))),
        }
    }

    /// An optional non-negative integer.
    pub(super) fn u64_or(&self, field: &str, default: u64) -> Result<u64, ConvertError> {
        match self.get(field) {
            None => Ok(default),
            Some(_) => self.u64(field),
        }
    }

    /// An optional list of non-negative integers (empty when absent).
    pub(super) fn u64_list(&self, field: &str) -> Result<Vec<u64>, ConvertError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                self.bad(
                    field,
                    format!("is {v}, expected a list of non-negative integers"),
                )
            }),
        }
    }

    /// An optional boolean.
    pub(super) fn bool_or(&self, field: &str, default: bool) -> Result<bool, ConvertError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.bad(field, format!("is {v}, expected true or false"))),
        }
    }
}
