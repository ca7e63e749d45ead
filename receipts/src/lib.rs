//! The durable store of ftpipe: one SQLite file per target directory.
//!
//! Why SQLite: a single file, transactional, and its WAL mode survives
//! `kill -9` and power loss once `synchronous=FULL` is set. This crate is
//! the only place that speaks SQL. It has one writer (a single connection
//! behind a mutex), every write runs in `BEGIN IMMEDIATE`, and WAL is set
//! once, when the database is created.
//!
//! The store never decides anything: callers fsync their bytes first and
//! only then call the method that claims them.
//!
//! - `store`: [`Store`], the single writer: runs, stage events, the pin and
//!   listing, the byte ledger, attempts, discards, download receipts, the
//!   Hugging Face cache log; [`ReadOnlyStore`], another directory's
//!   database opened read-only (`--reuse-from`).
//! - `ranges`: durable watermarks of a file fetched in segments.
//! - `convert_store`: component receipts, span claims of components
//!   written span by span, the retirement log and the artifact log.
//! - `punch_store`: sources held down to their PLE spans by a budgeted
//!   run or one with `--retire-sources` ([`PunchRecord`]: punched, or
//!   copied aside, [`KeptMethod`]), live until retired or re-acquired.
//! - `rebuild_store`: what a repin's incremental rebuild compares: the
//!   digest of each component's old spans in the files it changed
//!   ([`RebuildSpans`]).
//! - `upload_store`: the target-neutral records of publish and mirror:
//!   uploads (a `verified` row is the upload receipt), acknowledged parts of
//!   multipart sessions, every request, publications.
//! - `xet_store`: the terms of files fetched from Xet storage
//!   ([`XetTermRow`]): file range, xorb chunks, each chunk's hash, and
//!   whether their bytes were fetched or reused ([`TermBytes`]); the
//!   chunks of a xorb an earlier fetch recorded ([`XetChunkRun`]).
//! - `events`: [`RunId`] and the enums stored as text ([`Stage`],
//!   [`StageEvent`], [`RetirementEvent`], [`ArtifactEvent`], [`KeptMethod`],
//!   [`AttemptOutcome`], [`DiscardReason`], [`CacheKind`], [`CacheOutcome`],
//!   [`Placement`], [`UploadState`], [`UploadOp`], [`UploadOutcome`],
//!   [`PublicationOutcome`]).
//! - `model`: the plain row types; `error`: [`StoreError`].

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]

mod convert_store;
mod error;
mod events;
mod model;
mod punch_store;
mod ranges;
mod rebuild_store;
mod store;
mod upload_store;
mod xet_store;

pub use convert_store::{
    ArtifactRow, ComponentReceipt, DiskBudgetRecord, RetirementRow, SpanClaim,
};
pub use error::{Result, StoreError};
pub use events::{
    ArtifactEvent, AttemptOutcome, CacheKind, CacheOutcome, DiscardReason, FoundObject, KeptMethod,
    Placement, PublicationOutcome, RetirementEvent, RunId, Stage, StageEvent, UploadOp,
    UploadOutcome, UploadState,
};
pub use model::{
    Attempt, CacheCandidate, DiscardRow, FileRow, LedgerRow, Pin, Receipt, SelectionGlobs,
    StageEventRow,
};
pub use punch_store::{KeptRange, PunchRecord};
pub use ranges::{CrashTail, RangeProgress, RangeRow};
pub use rebuild_store::RebuildSpans;
pub use store::{ReadOnlyStore, Store};
pub use upload_store::{Publication, UploadAttempt, UploadPart, UploadRow};
pub use xet_store::{MAX_CHUNK_RUNS, TermBytes, XetChunkRun, XetTermRow, XetTotals};
