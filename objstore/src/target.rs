//! The output-target seam: everything `publish` and `mirror` ask of the
//! place they write to, in their own terms. S3 is the first
//! implementation (`s3target`); a second kind of target is one more file
//! beside it implementing [`OutputTarget`], and the pipeline, its durable
//! upload records and its crash points stay as they are.
//!
//! The terms, and how a target maps them:
//!
//! - A *key* is a name relative to the target's root, built with
//!   [`OutputTarget::key`]; [`OutputTarget::url_of`] is how records and
//!   messages name it (`s3://BUCKET/KEY`).
//! - A *put* writes a whole object with its SHA-256 as checksum metadata,
//!   and as the checksum the target checks the bytes it receives against
//!   and keeps ([`crate::StoreChecksum`]); [`PutMode::CreateOnly`] for a commit
//!   point (`manifest.json`, `listing.json`): exactly one of two racing
//!   creates wins. Each part of a session is sent the same way, and the
//!   completed object's checksum is over its parts.
//! - A *session* is a multipart upload in progress, named by a handle the
//!   target gives ([`OutputTarget::begin_upload`]) and the caller stores
//!   before sending any part. Each part the target takes is answered with a
//!   *receipt* ([`OutputTarget::send_part`]) the caller stores after the
//!   answer; completing the session takes the receipts in part order. S3:
//!   the upload id and the parts' ETags (with their checksums), any order, several at once. A
//!   registry's chunked blob upload: the upload location, and for each
//!   chunk the location and acknowledged range it answered, in order
//!   ([`PartRules::in_order`]: each part is sent with the receipt of the
//!   one before it).
//! - A *head* says whether an object is there with its size, version tag,
//!   SHA-256 metadata and the target's own checksum of its bytes: the check
//!   made before an upload (already complete?) and after it (the object is
//!   the one sent). The metadata is a claim anyone with write access can
//!   make; only the target's checksum proves bytes, so an object found
//!   there is reused only when its checksum is the local file's
//!   ([`crate::StoreChecksum::proves_whole`], [`crate::StoreChecksum::proves_parts`]),
//!   and one without a checksum is written again.
//! - A *bounded get* reads a small whole object (a commit point) within a
//!   limit; a *list* names the objects under a prefix, within a limit.
//!
//! Errors are [`crate::ObjStoreError`]s; the ones a caller decides on are typed:
//! [`crate::ObjStoreError::UploadGone`] (the target no longer knows a session: a
//! new one starts), [`crate::ObjStoreError::NotFound`],
//! [`crate::ObjStoreError::TooLarge`], [`crate::ObjStoreError::TooManyObjects`].
//!
//! The methods return boxed futures so a target is held as
//! `Arc<dyn OutputTarget>`.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::checksum::Sha256Digest;
use crate::client::{Head, ObjectBody, Put};
use crate::error::Result;

/// What a request to a target answers, later.
pub type TargetFuture<'a, T> = BoxFuture<'a, Result<T>>;

/// A target as publish and mirror hold it.
pub type SharedTarget = Arc<dyn OutputTarget>;

/// How a target takes the parts of one multipart session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartRules {
    /// Smallest part the target accepts (every part but the last).
    pub min_part_size: u64,
    /// Most parts one session may have.
    pub max_parts: u64,
    /// Parts must arrive one at a time in order, each with the receipt of
    /// the one before it; false: any order, several at once.
    pub in_order: bool,
}

/// Whether a put may replace an object already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Only when nothing is there yet ([`Put::Exists`] otherwise).
    CreateOnly,
    /// Whatever is there is replaced.
    Replace,
}

/// One part of a session to send.
#[derive(Debug, Clone)]
pub struct PartRequest {
    /// 1-based part number.
    pub number: u64,
    /// Where its bytes start in the object.
    pub offset: u64,
    /// Its bytes.
    pub bytes: Bytes,
    /// The SHA-256 of `bytes`, computed once by the caller as it read
    /// them: the checksum a target that checks parts sends with it.
    pub sha256: Sha256Digest,
    /// The receipt of part `number - 1`, for a target whose parts arrive in
    /// order ([`PartRules::in_order`]); `None` for the first part, and for
    /// a target that takes parts in any order.
    pub previous: Option<String>,
}

/// An object found by [`OutputTarget::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key.
    pub key: String,
    /// Its size.
    pub size: u64,
}

/// Where `publish` and `mirror` write (see the module doc).
pub trait OutputTarget: std::fmt::Debug + Send + Sync {
    /// The destination as records and messages name it
    /// (`s3://BUCKET/PREFIX`).
    fn dest(&self) -> String;

    /// The key of `rel` under the destination.
    fn key(&self, rel: &str) -> String;

    /// How records and messages name the object at `key`.
    fn url_of(&self, key: &str) -> String;

    /// The host (and port) requests go to, as upload attempts record it.
    fn host(&self) -> &str;

    /// How this target takes the parts of a session.
    fn part_rules(&self) -> PartRules;

    /// The object's size, version tag, SHA-256 metadata and the target's
    /// own checksum of its bytes (`None` in [`Head::checksum`]: the target
    /// keeps none for it); `None` when it is not there.
    fn head<'a>(&'a self, key: &'a str) -> TargetFuture<'a, Option<Head>>;

    /// The whole object when it has at most `max` bytes (the limit holds
    /// while reading); `None` when it is not there.
    fn get_bounded<'a>(&'a self, key: &'a str, max: u64) -> TargetFuture<'a, Option<ObjectBody>>;

    /// The objects under `prefix`, at most `max` of them (more is
    /// [`crate::ObjStoreError::TooManyObjects`]).
    fn list<'a>(&'a self, prefix: &'a str, max: usize) -> TargetFuture<'a, Vec<Listed>>;

    /// Writes `bytes` at `key` with `sha256`, the SHA-256 of `bytes` (hex,
    /// computed by the caller as it read them), as its checksum metadata
    /// and as the checksum a target that checks puts sends with them (as a
    /// part's, [`PartRequest::sha256`]): the target does not hash them
    /// again; it keeps its own checksum of the bytes it received.
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        sha256: &'a str,
        mode: PutMode,
    ) -> TargetFuture<'a, Put>;

    /// Starts a session for `key`, whose object will carry `sha256`, and
    /// whose parts the target checksums as they arrive; its handle.
    fn begin_upload<'a>(&'a self, key: &'a str, sha256: &'a str) -> TargetFuture<'a, String>;

    /// Sends one part of `session`; the target's receipt for it.
    fn send_part<'a>(
        &'a self,
        key: &'a str,
        session: &'a str,
        part: PartRequest,
    ) -> TargetFuture<'a, String>;

    /// Completes `session` from its parts' receipts in part order; the
    /// object's version tag when the target answered one.
    fn complete_upload<'a>(
        &'a self,
        key: &'a str,
        session: &'a str,
        receipts: Vec<String>,
        sha256: &'a str,
    ) -> TargetFuture<'a, Option<String>>;

    /// Ends `session` without an object (its parts are freed); a session
    /// the target no longer knows is no error.
    fn abort_upload<'a>(&'a self, key: &'a str, session: &'a str) -> TargetFuture<'a, ()>;
}
