//! The hub: everything ftpipe knows about a Hugging Face-compatible hub and
//! the identities of the files it serves. Fetch and convert build on it;
//! it knows nothing of either.
//!
//! - [`client`]: [`HubClient`] (revision and tree APIs, bounded redirects,
//!   tokens never sent across hosts, offline mode) and [`Token`].
//! - [`resolve`]: pin a revision to a commit and store the listing; the
//!   `--include` / `--exclude` selection ([`resolve::FetchSelection`]).
//! - [`remote`]: [`remote::RemoteFiles`], the seam through which the
//!   planner reads small pieces of pinned files (headers, config) without
//!   fetching them, and its hub implementation.
//! - [`headers`]: strict parsing of the response headers that decide
//!   whether received bytes may be kept (`Content-Range`, validators, the
//!   hub's `X-Linked-*` metadata).
//! - [`identity`]: the three identities of a hub file (git blob id, LFS
//!   SHA-256, ETag) as distinct types, and hashing against them.
//! - [`hfcache`]: a Hugging Face cache as a source of pinned files.
//! - [`token`]: where the token comes from (`--token-file`, `HF_TOKEN`,
//!   `HF_TOKEN_PATH`, `$HF_HOME/token`), read bounded and checked.
//! - [`paths`]: validation of repo ids and revisions; [`limits`]: named
//!   limits on what a server may claim; [`json_keys`]: duplicate-key
//!   detection in JSON.
//! - [`says`]: the hub's `X-Error-Code` / `X-Error-Message`, bounded and
//!   redacted as they are read.
//! - `error`: [`HubError`], naming the URL, header or entry at fault;
//!   [`Unreachable`] tells why a request got no answer.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod client;
mod error;
pub mod headers;
pub mod hfcache;
pub mod identity;
pub mod json_keys;
pub mod limits;
pub mod paths;
pub mod remote;
pub mod resolve;
pub mod says;
pub mod token;

pub use client::{HubClient, Token};
pub use error::{HubError, Result, Unreachable};
