//! Filesystem durability for ftpipe: the one place that knows how bytes
//! become durable on the target volume. Everything above it (receipts,
//! stages, pipeline) writes through these functions, so the power-cut test
//! guards one module.
//!
//! - [`durable`]: temp file → write → `sync_all` → rename → fsync the
//!   directory; durable directory creation; leftover temp cleanup.
//! - [`bounded`]: [`bounded::read_bounded`], the one reader of small files
//!   a user or another program controls (regular files only, never
//!   blocking, at most a named limit).
//! - [`crashpoint`]: named points where tests stop the process between two
//!   durable steps (`FTPIPE_CRASH_AT`).
//! - [`direct`]: positioned writes and reads of whole blocks that bypass
//!   the page cache (`O_DIRECT`) where the filesystem allows.
//! - [`nofollow`]: opening files under `DIR` without following links.
//! - [`overlapped`]: a file's prefix read on one thread while the caller
//!   hashes it on another.
//! - [`paths`]: untrusted relative paths checked as text and against the
//!   tree ([`paths::safe_join`]) before they name a file.
//! - [`punch`]: freeing ranges of a file in place (holes punched), and
//!   whether the volume can; copying ranges aside durably where it cannot.
//! - [`space`]: the free-space preflight, [`require_space`].
//! - [`layout`]: [`Layout`], the paths of `DIR/{source,artifact,.ftpipe}`.
//! - [`error`]: the errors every crate shares: [`IoError`] (the operation
//!   and path at fault), [`InsufficientSpace`], [`InternalError`]; and
//!   [`FsError`], what this crate's operations fail with.
//! - [`class`]: [`ErrorClass`], the kind of failure every error of ftpipe
//!   says it is (the binary's exit code follows it).

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod bounded;
pub mod class;
pub mod crashpoint;
pub mod direct;
pub mod durable;
mod error;
pub mod layout;
pub mod nofollow;
pub mod overlapped;
pub mod paths;
pub mod punch;
pub mod space;

pub use class::ErrorClass;
pub use durable::TEMP_SUFFIX;
pub use error::{FsError, InsufficientSpace, InternalError, IoError, Result};
pub use layout::Layout;
pub use space::require_space;
