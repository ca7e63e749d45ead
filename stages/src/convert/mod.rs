//! Conversion of safetensors sources into the runtime formats.
//!
//! This first part reads and validates source headers without touching
//! tensor data, maps every source tensor to an output component through a
//! [`profile`], and predicts every component's exact size ([`plan`]) —
//! locally, or over HTTP Range with only the first 8 + N bytes of each shard
//! — before anything is written.

mod aside;
mod batch;
pub mod component;
pub mod engine;
mod error;
pub mod manifest;
mod nvfp4;
pub mod plan;
pub mod profile;
pub mod recipe;
mod retire;
pub mod safetensors;
pub mod skeleton;
pub mod space;
pub mod write;

pub use component::{Component, ComponentContent, ComponentKind};
pub use engine::{ConvertOptions, ConvertOutcome, convert};
pub use error::ConvertError;
pub use plan::{
    Plan, PlanOptions, PlannedSource, Published, SavedHeader, load_recipe, plan_local,
    plan_local_saved, plan_local_with, plan_published_or_remote, plan_remote,
};
pub use profile::Profile;
pub use recipe::RecipeError;
pub use safetensors::{MAX_HEADER_LEN, SourceError, SourceHeader, SourceTensor};
