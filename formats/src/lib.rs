//! ftpipe-formats: the bytes ftpipe produces and a runtime reads.
//!
//! Pure: no async, no network, no database, no `unsafe`. A runtime can
//! depend on this crate alone. The byte-level specification lives in
//! `docs/formats.md`; each module's docs restate the part it implements.
//!
//! * [`ftw`] — FTW v1, the active tensor stream (index + page-aligned data).
//! * [`ftexpert`] — FTEXPERT1, one sidecar of fixed-size expert records per
//!   MoE layer.
//! * [`q3`], [`q3_set`] — Q3_PLE_32, the 3.5-bit per-layer embedding table
//!   and its segment set.
//! * [`nvfp4`], [`e4m3`] — NVFP4 and its FP8 block scales.
//! * [`dtype`] — element types and their byte widths; [`entry`] — the
//!   aligned entry layout rule shared by the indexes; [`sizes`] — exact
//!   output sizes from tensor descriptions, for planning before writing.
//! * [`error`] — [`FormatError`], naming the offset and field at fault.
//! * `cursor`, `scan`, `slots` — bounds-checked reading, bf16 range scans
//!   and fixed-size slot arithmetic used by the readers and encoders.
//!
//! Every quantized format has a scalar reference encoder (`encode_ref`, the
//! authority) and a fast parallel encoder (`encode`) that is byte-identical
//! to it, plus a decoder.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod cursor;
pub mod dtype;
pub mod e4m3;
pub mod entry;
pub mod error;
pub mod ftexpert;
pub mod ftw;
pub mod nvfp4;
pub mod q3;
pub mod q3_set;
mod scan;
pub mod sizes;
mod slots;

pub use dtype::{Dtype, MAX_RANK, PAGE, TensorKind};
pub use entry::{Entry, MAX_KEY_LEN, TensorDesc};
pub use error::{FormatError, Result};
pub use ftexpert::{ExpertLayout, ExpertRecord, ExpertView, ExpertWriter};
pub use ftw::{FtwHeader, FtwLayout, FtwTensor, FtwView, FtwWriter};
pub use nvfp4::NativeNvfp4;
pub use q3::{Q3GlobalScale, q3_segment_len};
pub use q3_set::{Q3Geometry, Q3SegmentSet};
pub use slots::SlotMap;

/// Version of the FTW container.
pub const FTW_VERSION: u32 = ftw::FTW_VERSION;
/// Version of the FTEXPERT1 container.
pub const FTEXPERT_VERSION: u32 = ftexpert::FTEXPERT_VERSION;
/// Version of the Q3_PLE_32 codec (bump when encoder output could change).
pub const Q3_PLE_32_CODEC_VERSION: u32 = 1;
/// Version of the NVFP4 codec (bump when encoder output could change).
pub const NVFP4_CODEC_VERSION: u32 = 1;
/// Every format and codec version, for recording converter identity.
pub const FORMAT_VERSIONS: &[(&str, u32)] = &[
    ("FTW", FTW_VERSION),
    ("FTEXPERT1", FTEXPERT_VERSION),
    ("Q3_PLE_32", Q3_PLE_32_CODEC_VERSION),
    ("NVFP4", NVFP4_CODEC_VERSION),
];
/// This crate's version.
pub const CRATE_VERSION: &str = env!("CARGO_PKG_VERSION");
