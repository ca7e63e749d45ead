//! One error type for every format, with one variant per check.
//!
//! Readers never panic: every malformed input maps to exactly one variant
//! below, and every variant names what it found (the key, the offset, the
//! value) so a verifier's report points at the offending byte range.

use crate::dtype::{Dtype, TensorKind};

/// Result alias used throughout the crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Every way a format check, codec or writer can fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    // ---- shared structure checks -------------------------------------
    /// The input ends before a field that must be present.
    #[error("truncated {what}: need {needed} bytes at offset {offset}, have {available}")]
    Truncated {
        /// Which structure was being read.
        what: &'static str,
        /// Offset at which the read started.
        offset: u64,
        /// Bytes the read needed.
        needed: u64,
        /// Bytes actually available from that offset.
        available: u64,
    },
    /// The file does not start with the expected magic bytes.
    #[error("bad magic for {format}: found {found:02x?}")]
    BadMagic {
        /// Format being parsed.
        format: &'static str,
        /// The bytes found instead.
        found: Vec<u8>,
    },
    /// The version field names a version this crate cannot read.
    #[error("unsupported {format} version {version}")]
    UnsupportedVersion {
        /// Format being parsed.
        format: &'static str,
        /// Version found.
        version: u32,
    },
    /// A reserved field or byte is not zero.
    #[error("reserved field {field} is not zero (found {found})")]
    ReservedNonZero {
        /// Name of the reserved field.
        field: String,
        /// Value found.
        found: u64,
    },
    /// A count exceeds its `MAX_*` limit.
    #[error("{what} count {count} exceeds limit {max}")]
    TooMany {
        /// What was counted.
        what: &'static str,
        /// Count found.
        count: u64,
        /// The limit.
        max: u64,
    },
    /// A length-prefixed region exceeds its `MAX_*` limit.
    #[error("{what} length {len} exceeds limit {max}")]
    TooLong {
        /// Which region.
        what: &'static str,
        /// Length found.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Offset arithmetic overflowed `u64`.
    #[error("arithmetic overflow computing {what}")]
    Overflow {
        /// Quantity being computed.
        what: String,
    },
    /// A key (tensor name or record field name) is empty.
    #[error("empty name at index entry {index}")]
    EmptyName {
        /// Position in the index.
        index: u64,
    },
    /// A key is longer than `MAX_KEY_LEN`.
    #[error("name at index entry {index} has length {len}, limit {max}")]
    NameTooLong {
        /// Position in the index.
        index: u64,
        /// Length found.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A key is not valid UTF-8.
    #[error("name at index entry {index} is not UTF-8")]
    NameNotUtf8 {
        /// Position in the index.
        index: u64,
    },
    /// Two index entries share a key.
    #[error("duplicate name {key:?}")]
    DuplicateName {
        /// The repeated key.
        key: String,
    },
    /// The dtype code is not one this crate knows.
    #[error("tensor {key:?}: unknown dtype code {code}")]
    UnknownDtype {
        /// Tensor key.
        key: String,
        /// Code found.
        code: u8,
    },
    /// The kind code is not one this crate knows.
    #[error("tensor {key:?}: unknown kind code {code}")]
    UnknownKind {
        /// Tensor key.
        key: String,
        /// Code found.
        code: u8,
    },
    /// The tensor kind does not allow this dtype.
    #[error("tensor {key:?}: kind {kind:?} does not allow dtype {dtype:?}")]
    KindDtypeMismatch {
        /// Tensor key.
        key: String,
        /// Kind declared.
        kind: TensorKind,
        /// Dtype declared.
        dtype: Dtype,
    },
    /// The shape has more dimensions than `MAX_RANK`.
    #[error("tensor {key:?}: rank {rank} exceeds limit {max}")]
    RankTooLarge {
        /// Tensor key.
        key: String,
        /// Rank found.
        rank: u64,
        /// The limit.
        max: u64,
    },
    /// A blocked dtype needs its last dimension to be a multiple of its block.
    #[error("tensor {key:?}: dtype {dtype:?} needs last dim multiple of {block}, shape {shape:?}")]
    ShapeNotBlockAligned {
        /// Tensor key.
        key: String,
        /// Dtype declared.
        dtype: Dtype,
        /// Block size of the dtype.
        block: u64,
        /// Shape declared.
        shape: Vec<u64>,
    },
    /// The element count or byte length of the shape overflows `u64`.
    #[error("tensor {key:?}: shape {shape:?} overflows")]
    ShapeOverflow {
        /// Tensor key.
        key: String,
        /// Shape declared.
        shape: Vec<u64>,
    },
    /// The stored length differs from dtype × shape.
    #[error("tensor {key:?}: stored length {found} but dtype x shape gives {expected}")]
    LengthMismatch {
        /// Tensor key.
        key: String,
        /// Length implied by dtype and shape.
        expected: u64,
        /// Length stored.
        found: u64,
    },
    /// A tensor offset is not a multiple of the page size.
    #[error("tensor {key:?}: offset {offset} is not page aligned")]
    OffsetNotPageAligned {
        /// Tensor key.
        key: String,
        /// Offset found.
        offset: u64,
    },
    /// A tensor or field has zero bytes (offsets must strictly increase).
    #[error("tensor {key:?} has zero length")]
    EmptyTensor {
        /// Tensor key.
        key: String,
    },
    /// A tensor does not start exactly where the layout rule puts it.
    #[error("tensor {key:?}: offset {found}, layout requires {expected}")]
    OffsetMismatch {
        /// Tensor key.
        key: String,
        /// Offset the layout rule requires.
        expected: u64,
        /// Offset stored.
        found: u64,
    },
    /// The index region holds bytes beyond its last entry.
    #[error("index has {extra} trailing bytes after its last entry")]
    IndexTrailingBytes {
        /// Number of unexplained bytes.
        extra: u64,
    },
    /// The stored data offset differs from the one the layout rule gives.
    #[error("data offset {found}, layout requires {expected}")]
    DataOffsetMismatch {
        /// Offset the layout rule requires.
        expected: u64,
        /// Offset stored.
        found: u64,
    },
    /// The stored total length differs from the one the layout gives.
    #[error("header total length {found}, layout gives {expected}")]
    TotalLenMismatch {
        /// Length implied by the layout.
        expected: u64,
        /// Length stored.
        found: u64,
    },
    /// The file (or slice) length differs from the header's total length.
    #[error("file length {found}, header says {expected}")]
    FileLenMismatch {
        /// Length in the header.
        expected: u64,
        /// Actual length.
        found: u64,
    },
    /// A padding byte is not zero.
    #[error("non-zero padding byte at offset {offset}")]
    NonZeroPadding {
        /// Absolute offset of the first non-zero padding byte.
        offset: u64,
    },

    // ---- FTEXPERT1 ----------------------------------------------------
    /// The record size is not what the layout table requires.
    #[error("record size {found}, layout table requires {expected}")]
    RecordSizeMismatch {
        /// Size the layout rule requires.
        expected: u64,
        /// Size stored.
        found: u64,
    },
    /// An expert index is out of range.
    #[error("expert {expert} out of range (count {count})")]
    ExpertOutOfRange {
        /// Index requested.
        expert: u64,
        /// Number of experts.
        count: u64,
    },
    /// The record layout table is empty.
    #[error("record layout table has no fields")]
    EmptyRecord,

    // ---- Q3_PLE_32 segment set -------------------------------------------
    /// The row width is zero or not a multiple of 32.
    #[error("Q3_PLE_32 width {width} is not a positive multiple of 32")]
    Q3BadWidth {
        /// Width given.
        width: u64,
    },
    /// A segment `shard_i` with `i < N` is absent.
    #[error("Q3 segment {name} is missing")]
    Q3MissingSegment {
        /// Expected segment name.
        name: String,
    },
    /// A segment name appears twice.
    #[error("Q3 segment {name} appears more than once")]
    Q3DuplicateSegment {
        /// Repeated name.
        name: String,
    },
    /// A segment `shard_i` with `i >= N`, or any other name.
    #[error("unexpected Q3 segment {name:?}")]
    Q3ExtraSegment {
        /// Name found.
        name: String,
    },
    /// A segment has the wrong byte length.
    #[error("Q3 segment {name} has {found} bytes, expected {expected}")]
    Q3SegmentSize {
        /// Segment name.
        name: String,
        /// Length the geometry gives.
        expected: u64,
        /// Length found.
        found: u64,
    },
    /// A segment has the wrong dtype or shape in its container.
    #[error("Q3 segment {name}: dtype {dtype:?} shape {shape:?}, expected Q3_PLE_32 {expected:?}")]
    Q3SegmentShape {
        /// Segment name.
        name: String,
        /// Dtype found.
        dtype: Dtype,
        /// Shape found.
        shape: Vec<u64>,
        /// Shape expected.
        expected: Vec<u64>,
    },
    /// The global scale record is absent.
    #[error("Q3 global scale is missing")]
    Q3MissingGlobalScale,
    /// The global scale record is not exactly 2 bytes.
    #[error("Q3 global scale has {found} bytes, expected 2")]
    Q3GlobalScaleSize {
        /// Length found.
        found: u64,
    },
    /// The global scale is negative, NaN or infinite.
    #[error("Q3 global scale bits {bits:#06x} are not a finite non-negative bf16")]
    Q3GlobalScaleInvalid {
        /// Raw bf16 bits.
        bits: u16,
    },
    /// An encode input's absolute max exceeds the global scale.
    #[error("tensor {key:?}: element {index} magnitude {value} exceeds global scale {global}")]
    Q3ExceedsGlobalScale {
        /// Tensor name.
        key: String,
        /// Element index.
        index: u64,
        /// Offending value.
        value: f32,
        /// Global scale.
        global: f32,
    },

    // ---- codecs ---------------------------------------------------------
    /// An input element is NaN or infinite.
    #[error("tensor {key:?}: element {index} is not finite ({value})")]
    NonFinite {
        /// Tensor name.
        key: String,
        /// Flat element index.
        index: u64,
        /// The value (NaN or ±inf).
        value: f32,
    },
    /// Input or output buffer sizes do not match the declared geometry.
    #[error("{what}: expected {expected} elements/bytes, got {found}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// Size required.
        expected: u64,
        /// Size given.
        found: u64,
    },
    /// Native NVFP4 parts do not have the ModelOpt shapes.
    #[error("native NVFP4 {key:?}: {reason}")]
    NativeNvfp4Shape {
        /// Tensor name.
        key: String,
        /// What is wrong.
        reason: String,
    },

    // ---- writers --------------------------------------------------------
    /// Data was offered for a tensor other than the next one in the index.
    #[error("expected data for {expected:?}, got {found:?}")]
    WrongOrder {
        /// Next key in the index (or `"<end>"`).
        expected: String,
        /// Key offered.
        found: String,
    },
    /// More bytes were offered than the tensor's length.
    #[error("tensor {key:?}: {attempted} bytes offered, length is {len}")]
    TooManyBytes {
        /// Tensor key.
        key: String,
        /// Declared length.
        len: u64,
        /// Bytes offered so far including this chunk.
        attempted: u64,
    },
    /// A tensor was closed before all its bytes arrived.
    #[error("tensor {key:?}: closed after {written} of {len} bytes")]
    TooFewBytes {
        /// Tensor key.
        key: String,
        /// Declared length.
        len: u64,
        /// Bytes written.
        written: u64,
    },
    /// Data was written with no tensor open.
    #[error("no tensor is open")]
    NoOpenTensor,
    /// `finish` was called with tensors still unwritten.
    #[error("{remaining} slots unwritten, next is {next:?}")]
    Unfinished {
        /// Count of unwritten tensors or fields.
        remaining: u64,
        /// The next expected key.
        next: String,
    },
    /// The underlying writer or reader failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
