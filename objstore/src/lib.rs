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
//! - `checksum`: [`StoreChecksum`], the checksum a store computed itself
//!   from an object's bytes (whole, or over its parts), and what it proves.
//! - `client`: [`S3`], the requests (head, head with the store checksum,
//!   bounded get, ranged get under `If-Match`, list, put with metadata and
//!   checksum, create-only put, multipart upload).
//! - `target`: [`OutputTarget`], the seam `publish` and `mirror` write
//!   through (create-only put with checksum metadata, multipart sessions
//!   whose handle and part receipts the caller keeps durable, head, bounded
//!   get, list), held as [`SharedTarget`]. A new kind of target is one new
//!   module implementing it.
//! - `s3target`: S3 as an [`OutputTarget`] (a session is a multipart
//!   upload, a receipt a part's ETag with its checksum).
//! - `error`: [`ObjStoreError`] and its [`ftpipe_fs::ErrorClass`].
//!
//! Imports run one way: `error`, `location` and `checksum` are leaves,
//! `credentials` builds on them, `client` on all of them; `target` names `client`'s answer
//! types, and `s3target` joins `client` to `target`.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod checksum;
mod client;
mod credentials;
mod error;
mod location;
mod s3target;
mod target;

pub use checksum::{Sha256Digest, StoreChecksum, digest_of_parts, sha256_of};
pub use client::{
    Head, MAX_PART_NUMBER, MIN_PART_SIZE, ObjectBody, Precondition, Put, RangeGet, S3,
    SHA256_METADATA,
};
pub use credentials::{DEFAULT_READ_TIMEOUT, Env, S3Config, register_credentials_from_env};
pub use error::{ObjStoreError, Result};
pub use location::{ArtifactKeys, MANIFEST_KEY, S3Location, artifact_file_key};
pub use object_store::GetRange;
pub use target::{
    Listed, OutputTarget, PartRequest, PartRules, PutMode, SharedTarget, TargetFuture,
};
