//! Integration tests of `ftpipe-formats`: one test binary (`cargo test -p
//! ftpipe-formats --test integration`), one module per area; filter by
//! module path, e.g. `cargo test -p ftpipe-formats --test integration ftw::`.
//!
//! * `common`: builders of small valid files.
//! * `codecs`: NVFP4, E4M3 and Q3 codecs (fast = reference, error bounds,
//!   fixed vectors, non-finite input, edge vectors).
//! * `ftw`: FTW v1 round trips, header-only validation, every reader check
//!   and writer misuse.
//! * `ftexpert`: FTEXPERT1 round trips, one-pread record access, every check.
//! * `q3_set`: the Q3_PLE_32 segment set and its errors.
//! * `no_panic`: arbitrary and mutated bytes through every reader's fuzz
//!   entry point never panic.
//! * `regressions`: every crash a fuzzer found.
//!
//! Everything here is pure computation on in-memory bytes: the tests share
//! the process without sharing any state.

// Dev-dependencies are shared by every test and bench target of a package, so
// an unused one here is not a finding; the lint stays on for libraries and binaries.
#![allow(unused_crate_dependencies)]
// Tests write their inputs with plain `std::fs` calls (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod common;

mod codecs;
mod ftexpert;
mod ftw;
mod no_panic;
mod q3_set;
mod regressions;
