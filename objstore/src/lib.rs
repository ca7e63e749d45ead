//! S3-compatible object storage for `publish` and `pull`: where an
//! artifact lives in a bucket, the credentials the AWS tools would use, and
//! the few requests the two commands make, each bounded and each naming the
//! object key in its error. No database and no durable local state: the
//! pipeline records what these requests did.
//!
//! Modules:
//! - `location`: [`S3Location`] (`s3://BUCKET/PREFIX`) and the object keys
//!   of a published artifact under it ([`ArtifactKeys`]).
//! - `credentials`: [`S3Config`], resolved by the AWS SDK's default chain
//!   (environment, profiles with keys, `credential_process`, SSO or roles,
//!   web identity, container and instance credentials), adapted to
//!   `object_store`'s credential provider; every secret registered with the
//!   redaction point as it is obtained.
//! - `checksum`: [`StoreChecksum`], the checksum a store computed itself
//!   from an object's bytes (whole, or over its parts), and what it proves.
//! - `client`: [`S3`], the requests (head, head with the store checksum,
//!   bounded get, ranged get under `If-Match`, list, put with metadata and
//!   checksum, create-only put, multipart upload whose parts carry the
//!   SHA-256 their caller computed, sent to presigned `UploadPart` URLs).
//! - `target`: [`OutputTarget`], the seam `publish` and `mirror` write
//!   through (create-only put with checksum metadata, multipart sessions
//!   whose handle and part receipts the caller keeps durable, head, bounded
//!   get, list), held as [`SharedTarget`]. A new kind of target is one new
//!   module implementing it.
//! - `s3target`: S3 as an [`OutputTarget`] (a session is a multipart
//!   upload, a receipt a part's ETag with its checksum).
//! - `reference`: [`OciReference`], `oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]`,
//!   and [`RepositoryName`] (a mount's source).
//! - `registry_auth`: registry credentials from the container auth files
//!   and their credential helpers ([`registry_credentials`], an
//!   [`AuthLookup`] naming unreadable files) and the `WWW-Authenticate`
//!   challenges.
//! - `registry`: [`Registry`], the OCI distribution protocol over
//!   `reqwest` (blob head/get/ranged get, chunked uploads whose stall check
//!   is the body's progress, cross-repository mounts ([`Mount`]),
//!   manifests; the Basic and Bearer flows).
//! - `ocitarget`: [`OciTarget`], a registry's blobs as an [`OutputTarget`]
//!   (a key a digest, a session a chunked upload, a receipt the location
//!   each chunk was answered with).
//! - `upload_progress`: an upload's stall check under `--read-timeout`
//!   (its body's progress; `reqwest`'s read timeout cut slow uploads),
//!   shared by the registry's uploads and S3's.
//! - `watched_http`: the `object_store` HTTP connector S3 puts go
//!   through, with that check, and the same client for S3 part uploads.
//! - `error`: [`ObjStoreError`] and its [`ftpipe_fs::ErrorClass`]; a
//!   server's S3 error document read into [`ServerAnswer`] and
//!   [`S3Refusal`] (one sentence with the fix per common code, no XML).
//!
//! Imports run one way: `error`, `location` and `checksum` are leaves,
//! `credentials` builds on them, `client` on all of them; `target` names `client`'s answer
//! types, and `s3target` joins `client` to `target`; `reference` is a
//! leaf, `registry_auth` builds on `error`, `registry` on both, and
//! `ocitarget` joins `registry` to `target`.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod checksum;
mod client;
mod credentials;
mod error;
mod location;
mod ocitarget;
mod reference;
mod registry;
mod registry_auth;
mod s3target;
mod target;
mod upload_progress;
mod watched_http;

pub use checksum::{Sha256Digest, StoreChecksum, digest_of_parts, sha256_of};
pub use client::{
    Head, MAX_PART_NUMBER, MIN_PART_SIZE, ObjectBody, Precondition, Put, RangeGet, S3,
    SHA256_METADATA,
};
pub use credentials::{DEFAULT_READ_TIMEOUT, S3Config, Transport, register_credentials_from_env};
pub use error::{ObjStoreError, Result, S3Refusal, ServerAnswer};
pub use location::{ArtifactKeys, MANIFEST_KEY, S3Location, artifact_file_key};
pub use object_store::GetRange;
pub use ocitarget::OciTarget;
pub use reference::{
    DEFAULT_TAG, OCI_SCHEME, OciReference, Pointer, RepositoryName, is_sha256_digest, is_sha256_hex,
};
pub use registry::{
    FetchedManifest, MAX_OCI_MANIFEST_BYTES, MAX_TOKEN_ANSWER_BYTES, Mount,
    OCI_MANIFEST_MEDIA_TYPE, Registry, RegistryConfig,
};
pub use registry_auth::{
    AuthLookup, CredentialKind, CredentialSource, MAX_AUTH_FILE_BYTES, MAX_HELPER_ANSWER_BYTES,
    RegistryCredentials, registry_credentials,
};
pub use target::{
    Listed, OutputTarget, PartRequest, PartRules, PutMode, SharedTarget, TargetFuture,
};
