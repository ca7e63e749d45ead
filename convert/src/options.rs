//! What the command line chose for a conversion ([`ConvertOptions`]), and
//! the converter identity those options and a checkpoint's config give:
//! shared by the engine, its parallel writers and the no-op check.

use std::collections::BTreeSet;

use serde_json::Value;

use ftpipe_artifact::manifest::{ConvertOptionsId, ConverterIdentity};
use ftpipe_hub::resolve::FetchSelection;

use crate::error::Result;
use crate::plan::PlanOptions;
use crate::profile::model_type;
use crate::recipe::Recipe;

/// What the command line chose.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Components converted in parallel.
    pub jobs: usize,
    /// Delete each source shard once every component reading it has a receipt.
    pub retire_sources: bool,
    /// Set a stale artifact aside and rebuild instead of refusing.
    pub rebuild: bool,
    /// Extra globs of tensors kept BF16 and marked protected.
    pub protect: Vec<String>,
    /// A declarative recipe instead of a built-in profile.
    pub recipe: Option<Recipe>,
    /// RAM budget for placement (bytes).
    pub ram_budget: u64,
    /// Bytes of the budget kept free.
    pub reserve: u64,
    /// Check free space before writing.
    pub preflight: bool,
}

impl ConvertOptions {
    /// The options that change the plan.
    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            protect: self.protect_globs(),
            recipe: self.recipe.clone(),
            selection: FetchSelection::default(),
        }
    }

    /// `--protect` globs sorted and deduplicated: their order on the
    /// command line is not part of the converter identity.
    fn protect_globs(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.protect.iter().collect();
        set.into_iter().cloned().collect()
    }

    /// The options as recorded in the converter identity.
    pub fn options_id(&self) -> ConvertOptionsId {
        ConvertOptionsId {
            protect: self.protect_globs(),
            recipe: self.recipe.as_ref().map(Recipe::digest),
        }
    }
}

/// The converter identity `opts` gives for a checkpoint with `config`.
pub fn converter_identity(config: &Value, opts: &ConvertOptions) -> Result<ConverterIdentity> {
    let _ = model_type(config)?;
    Ok(ConverterIdentity::current(
        opts.plan_options().profile(config)?.name(),
        opts.options_id(),
    ))
}
