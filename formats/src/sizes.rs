//! Size prediction: the exact byte length of every artifact, computed from
//! descriptors alone, so the converter can check free space and record the
//! sizes before writing anything.

use crate::entry::TensorDesc;
use crate::error::Result;
use crate::ftexpert::ExpertLayout;
use crate::ftw::FtwLayout;
use crate::q3::{Q3_GLOBAL_SCALE_BYTES, q3_segment_len};

/// Exact length of the FTW file holding `descs` (in that order).
pub fn ftw_total_len(descs: Vec<TensorDesc>) -> Result<u64> {
    Ok(FtwLayout::plan(descs)?.total_len())
}

/// Exact length of an FTEXPERT1 sidecar.
pub fn ftexpert_total_len(layer: u32, expert_count: u32, fields: Vec<TensorDesc>) -> Result<u64> {
    Ok(ExpertLayout::plan(layer, expert_count, fields)?.total_len())
}

/// Exact length of one Q3_PLE_32 segment.
pub fn q3_len(rows: u64, width: u64) -> Result<u64> {
    q3_segment_len(rows, width)
}

/// Length of the Q3 global scale record.
pub const Q3_GLOBAL_SCALE_LEN: u64 = Q3_GLOBAL_SCALE_BYTES;
