//! Conversion of safetensors sources into the runtime formats: the plan,
//! the profiles and recipes that map tensors to components, the engine and
//! the component writers. It reads remote headers only through
//! [`ftpipe_hub::remote::RemoteFiles`], never through the fetch machinery.
//!
//! A conversion is planned in full before a byte is written: source headers
//! are read and validated without touching tensor data, every source
//! tensor is mapped to an output component by a built-in [`profile`] or a
//! [`recipe`], and every component's exact size is predicted ([`plan`]),
//! locally or over HTTP Range with only the first 8 + N bytes of each shard.
//! Then [`engine`] writes the components, each with a receipt, and the
//! manifest last.
//!
//! - [`safetensors`]: the validating header reader.
//! - [`profile`], [`recipe`], [`component`], `nvfp4`: which tensors become
//!   which components (built-in Qwen4-Exp layouts, user recipes, ModelOpt
//!   NVFP4 triples).
//! - [`plan`]: the component list with exact sizes; [`space`]: the space a
//!   conversion still needs, for the preflights.
//! - [`skeleton`]: everything the manifest will say except digests, saved
//!   before the first component so a run after `--retire-sources` can finish.
//! - [`placed`]: an FTW or FTEXPERT1 component written span by span in any
//!   order of its source files, byte-identical to the streamed one.
//! - [`engine`]: the idempotent stage (reuse by identity, stale artifacts,
//!   manifest and placement); `batch`: parallel component writes; [`write`]:
//!   one component, streamed; `retire`: deleting shards once consumed;
//!   `aside`: setting a stale artifact aside under `--rebuild`.
//! - [`keep`]: what a budgeted run keeps of a converted PLE file (its
//!   PLE spans; holes punched over the rest, or copied aside); [`punched`]:
//!   the punch, logged first, and its resumption; [`copied`]: the copy
//!   aside on a volume that cannot punch, made durable, logged, then the
//!   file released.
//! - [`schedule`]: the order of fetch, conversion and retirement under a
//!   disk budget, and its predicted peak.
//! - [`stream`]: the convert side of a budgeted, pipelined build: a
//!   verified file's spans written at once, Q3 once every PLE file is in,
//!   and when a file may be deleted.
//! - [`pipelined`]: a pipelined build as the fetch drives it (the
//!   skeleton from the listing before any shard, receipts and retirement
//!   as each verified shard is converted).
//! - [`rebuild`]: incremental rebuild after a repin (which components
//!   are kept, checked against their spans' old bytes, or rebuilt).
//! - `options`: [`ConvertOptions`] and the converter identity they give.
//! - `current`: whether the artifact on disk is current (the no-op check).
//! - [`inspect`]: what a format file holds, from its header only.
//! - `error`: [`ConvertError`], naming the file, tensor or field at fault.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod aside;
mod batch;
pub mod component;
pub mod copied;
mod current;
pub mod engine;
mod error;
pub mod inspect;
pub mod keep;
mod nvfp4;
mod options;
pub mod pipelined;
pub mod placed;
pub mod plan;
pub mod profile;
pub mod punched;
pub mod rebuild;
pub mod recipe;
mod retire;
pub mod safetensors;
pub mod schedule;
pub mod skeleton;
pub mod space;
pub mod stream;
pub mod write;

pub use component::{Component, ComponentContent, ComponentKind};
pub use current::{CurrentArtifact, current_artifact};
pub use engine::{ConvertOutcome, convert};
pub use error::{ConvertError, Result, RetiredBy};
pub use options::{ConvertOptions, converter_identity};
pub use plan::{
    HeaderSource, Plan, PlanOptions, Planned, PlannedSource, Published, SavedHeader, load_recipe,
    plan, read_config,
};
pub use profile::Profile;
pub use recipe::RecipeError;
pub use safetensors::{MAX_HEADER_LEN, SourceError, SourceHeader, SourceTensor};
