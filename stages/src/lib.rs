//! The stages of ftpipe. Each is idempotent: running it again after a
//! success changes nothing, and after a crash continues from durable state.
//!
//! - [`resolve`]: pin the revision to a commit and store the listing.
//! - [`fetch`]: download with strict Range resume, verify, publish.
//! - [`audit`]: reconcile the byte ledger against receipts and disk.

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
