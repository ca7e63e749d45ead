//! The converted artifact as a receiver sees it: what `DIR/artifact/`
//! holds, how its identity is computed, and how to check it on its own.
//! Synchronous and free of network and database code, so a runtime that
//! loads an artifact can depend on this crate (and `ftpipe-formats` for the
//! codecs) alone.
//!
//! - [`manifest`]: `manifest.json` ([`manifest::Manifest`]: source and
//!   converter identity, components, tensor inventory), its fingerprint,
//!   the canonical SHA-256 helpers, and `placement.json`
//!   ([`manifest::Placement`]: which expert layers stay in RAM).
//! - [`verify`]: [`verify::verify_artifact`], every check of an artifact
//!   directory against its manifest, listed in one [`verify::VerifyReport`].
//! - [`ArtifactError`]: why verification could not start, or why a value
//!   could not be serialized to be hashed or written.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
pub mod manifest;
pub mod verify;

pub use error::ArtifactError;
