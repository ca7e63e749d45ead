//! The stages of ftpipe. Each is idempotent: running it again after a
//! success changes nothing, and after a crash continues from durable state.
//!
//! Stages, in the order a run takes them:
//! - [`resolve`]: pin the revision to a commit and store the listing.
//! - [`convert`]: plan every output component from source headers, then
//!   write FTW v1, FTEXPERT1 and Q3_PLE_32 components with receipts.
//! - [`fetch`]: download with strict Range resume (one stream or segmented
//!   ranges), verify against the pinned identity, publish.
//! - [`verify`]: check an artifact on its own, as a receiver would.
//! - [`audit`]: reconcile the byte ledger, receipts and artifact log
//!   against the disk; [`bundle`] packs the evidence into one archive.
//!
//! What they share:
//! - [`hub`]: the hub client (revision and tree APIs, bounded redirects,
//!   tokens never sent across hosts); [`hfcache`]: a Hugging Face cache as
//!   a source of pinned files.
//! - [`identity`]: the three identities of a hub file (git blob id, LFS
//!   SHA-256, ETag) as distinct types; [`paths`]: validation of paths from
//!   untrusted listings; [`limits`]: named limits on what a server may claim;
//!   [`json_keys`]: duplicate-key detection in JSON.
//! - [`inspect`]: what a format file holds, from its header only.
//! - [`progress`]: the [`progress::Reporter`] trait stages report through.
//! - [`crashpoint`]: named crash points for tests that stop at one step.
//! - `error`: [`StageError`], which names the file, header or value at fault.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]

pub mod audit;
pub mod bundle;
pub mod convert;
pub mod crashpoint;
mod error;
pub mod fetch;
pub mod hfcache;
pub mod hub;
pub mod identity;
pub mod inspect;
pub mod json_keys;
pub mod limits;
pub mod paths;
pub mod progress;
pub mod resolve;

pub use error::{Result, StageError};
