//! Conversion of safetensors sources into the runtime formats.
//!
//! This first part reads and validates source headers without touching
//! tensor data, so a plan can be made (locally, or over HTTP Range with only
//! the first 8 + N bytes of each shard) before anything is written.

pub mod safetensors;

pub use safetensors::{MAX_HEADER_LEN, SourceError, SourceHeader, SourceTensor};
