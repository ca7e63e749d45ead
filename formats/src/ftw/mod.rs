//! FTW v1, the active tensor stream: one file holding a tensor index and
//! page-aligned tensor data.
//!
//! Layout (all integers little-endian):
//! ```text
//! 0   magic        [u8; 8] = "FTW\0\r\n\x1a\n"
//! 8   version      u32 = 1
//! 12  tensor_count u32            ≤ MAX_FTW_TENSORS
//! 16  index_len    u64            ≤ MAX_FTW_INDEX_LEN
//! 24  data_offset  u64 = round_up(40 + index_len, 4096)
//! 32  total_len    u64 = round_up(end of last tensor, 4096) (data_offset if none)
//! 40  index        tensor_count entries (see `entry`), exactly index_len bytes
//! ..  zero padding to data_offset
//! ..  tensor data: tensor i at round_up(end of i−1, 4096), zero padded
//! ```
//! Because every length follows from dtype × shape, the whole layout and
//! the exact file length are known before any data is written
//! ([`FtwLayout::plan`]), and a reader can check a multi-GB file from its
//! header alone ([`FtwHeader::read_from`] + [`FtwHeader::check_file_len`]).

mod reader;
mod writer;

pub use reader::{FtwHeader, FtwTensor, FtwView};
pub use writer::{FtwLayout, FtwWriter};

/// File magic: "FTW", NUL, then CR LF SUB LF to catch text-mode mangling.
pub const FTW_MAGIC: [u8; 8] = *b"FTW\0\r\n\x1a\n";
/// The only version this crate reads and writes.
pub const FTW_VERSION: u32 = 1;
/// Size of the fixed header before the index.
pub const FTW_FIXED_HEADER_LEN: u64 = 40;
/// Maximum number of tensors in one file.
pub const MAX_FTW_TENSORS: u32 = 1 << 20;
/// Maximum index size in bytes (bounds header memory).
pub const MAX_FTW_INDEX_LEN: u64 = 256 << 20;
