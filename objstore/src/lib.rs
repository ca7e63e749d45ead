//! S3-compatible object storage for `publish` and `pull`: where an
//! artifact lives in a bucket, the credentials the AWS tools would use, and
//! the few requests the two commands make, each bounded and each naming the
//! object key in its error. No database and no durable local state: the
//! pipeline records what these requests did.
//!
//! Modules:
//! - `location`: [`S3Location`] (`s3://BUCKET/PREFIX`) and the object keys
//!   of a published artifact under it ([`ArtifactKeys`]).
//! - `credentials`: [`S3Config`], resolved the AWS way (environment, then
//!   `AWS_PROFILE` in the shared credentials and config files), every
//!   secret registered with the redaction point as it is read.
//! - `client`: [`S3`], the requests (head, bounded get, ranged get under
//!   `If-Match`, put with metadata, create-only put, multipart upload).
//! - `error`: [`ObjStoreError`] and its [`ftpipe_fs::ErrorClass`].
//!
//! Imports run one way: `error` and `location` are leaves, `credentials`
//! builds on them, `client` on all three.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod client;
mod credentials;
mod error;
mod location;

pub use client::{
    Head, MAX_PART_NUMBER, MIN_PART_SIZE, ObjectBody, Precondition, Put, RangeGet, S3,
    SHA256_METADATA,
};
pub use credentials::{Env, S3Config, register_credentials_from_env};
pub use error::{ObjStoreError, Result};
pub use location::{ArtifactKeys, S3Location};
pub use object_store::GetRange;
