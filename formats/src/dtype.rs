//! Element types, tensor kinds and the dtype × shape → byte length rule.
//!
//! The byte length of every tensor is a pure function of its dtype and shape
//! ([`Dtype::byte_len`]); readers recompute it and compare it with the stored
//! length, and writers use it to plan the whole file before writing a byte.

use crate::error::{FormatError, Result};

/// Maximum number of dimensions of a tensor shape.
pub const MAX_RANK: usize = 8;

/// Element layout of a tensor. The `u8` code is what the files store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum Dtype {
    /// IEEE binary32.
    F32 = 1,
    /// IEEE binary16.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// Unsigned byte.
    U8 = 4,
    /// Signed byte.
    I8 = 5,
    /// Little-endian i32.
    I32 = 6,
    /// Little-endian i64.
    I64 = 7,
    /// OCP FP8 E4M3 (the "fn" variant: no infinities, max 448).
    F8E4M3 = 8,
    /// NVFP4 layout: E2M1 codes, E4M3 block scales (16 elements), FP32 tensor
    /// scale, concatenated in that order. See [`crate::nvfp4`].
    Nvfp4 = 16,
    /// Q3_PLE_32 blocks (14 bytes per 32 elements). See [`crate::q3`].
    Q3Ple32 = 17,
}

impl Dtype {
    /// All dtypes, in code order.
    pub const ALL: [Dtype; 10] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::BF16,
        Dtype::U8,
        Dtype::I8,
        Dtype::I32,
        Dtype::I64,
        Dtype::F8E4M3,
        Dtype::Nvfp4,
        Dtype::Q3Ple32,
    ];

    /// The stored code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`Dtype::code`].
    pub fn from_code(code: u8) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Canonical name (as in safetensors where one exists).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::Nvfp4 => "NVFP4",
            Dtype::Q3Ple32 => "Q3_PLE_32",
        }
    }

    /// Elements per block that the last dimension must be a multiple of.
    pub fn block(self) -> u64 {
        match self {
            Dtype::Nvfp4 => crate::nvfp4::NVFP4_BLOCK as u64,
            Dtype::Q3Ple32 => crate::q3::Q3_BLOCK as u64,
            _ => 1,
        }
    }

    /// True for the quantized layouts produced by ftpipe's encoders.
    pub fn is_quantized(self) -> bool {
        matches!(self, Dtype::Nvfp4 | Dtype::Q3Ple32)
    }

    /// Byte length of a tensor of this dtype and shape, checked.
    ///
    /// Scalars (`shape == []`) have one element. Blocked dtypes need rank ≥ 1
    /// and the last dimension a multiple of [`Dtype::block`]. NVFP4 with `n`
    /// elements is `n/2 + n/16 + 4` bytes; Q3_PLE_32 is `n/32 × 14`.
    pub fn byte_len(self, key: &str, shape: &[u64]) -> Result<u64> {
        if shape.len() > MAX_RANK {
            return Err(FormatError::RankTooLarge {
                key: key.to_owned(),
                rank: shape.len() as u64,
                max: MAX_RANK as u64,
            });
        }
        let overflow = || FormatError::ShapeOverflow {
            key: key.to_owned(),
            shape: shape.to_vec(),
        };
        let n = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)?;
        let block = self.block();
        if block > 1 {
            match shape.last() {
                Some(&last) if last % block == 0 => {}
                _ => {
                    return Err(FormatError::ShapeNotBlockAligned {
                        key: key.to_owned(),
                        dtype: self,
                        block,
                        shape: shape.to_vec(),
                    });
                }
            }
        }
        let len = match self {
            Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 => Some(n),
            Dtype::F16 | Dtype::BF16 => n.checked_mul(2),
            Dtype::F32 | Dtype::I32 => n.checked_mul(4),
            Dtype::I64 => n.checked_mul(8),
            Dtype::Nvfp4 => crate::nvfp4::nvfp4_len(n),
            Dtype::Q3Ple32 => (n / 32).checked_mul(crate::q3::Q3_BLOCK_BYTES as u64),
        };
        len.ok_or_else(overflow)
    }
}

/// Why a tensor is stored the way it is. Readers check that the kind allows
/// the dtype, so a "protected" tensor can never silently be quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum TensorKind {
    /// Copied from the source unchanged in value (any non-quantized dtype).
    Plain = 0,
    /// Deliberately kept at high precision beside quantized tensors
    /// (BF16, F16 or F32 only).
    Protected = 1,
    /// Produced by one of this crate's encoders (NVFP4 or Q3_PLE_32).
    Quantized = 2,
    /// Already quantized in the source and passed through bit for bit
    /// (NVFP4 only).
    Native = 3,
}

impl TensorKind {
    /// All kinds, in code order.
    pub const ALL: [TensorKind; 4] = [
        TensorKind::Plain,
        TensorKind::Protected,
        TensorKind::Quantized,
        TensorKind::Native,
    ];

    /// The stored code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`TensorKind::code`].
    pub fn from_code(code: u8) -> Option<TensorKind> {
        TensorKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// Whether this kind may hold `dtype`.
    pub fn allows(self, dtype: Dtype) -> bool {
        match self {
            TensorKind::Plain => !dtype.is_quantized(),
            TensorKind::Protected => matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32),
            TensorKind::Quantized => dtype.is_quantized(),
            TensorKind::Native => dtype == Dtype::Nvfp4,
        }
    }
}

/// Page size: every FTW tensor and every FTEXPERT1 record starts on one.
pub const PAGE: u64 = 4096;

/// Round `x` up to a multiple of `align` (a power of two), checked.
pub(crate) fn round_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Check that a name is non-empty, bounded, and (given as bytes) UTF-8.
pub(crate) fn check_name(index: u64, bytes: &[u8], max: usize) -> Result<String> {
    if bytes.is_empty() {
        return Err(FormatError::EmptyName { index });
    }
    if bytes.len() > max {
        return Err(FormatError::NameTooLong {
            index,
            len: bytes.len() as u64,
            max: max as u64,
        });
    }
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| FormatError::NameNotUtf8 { index })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_code(d.code()), Some(d));
        }
        for k in TensorKind::ALL {
            assert_eq!(TensorKind::from_code(k.code()), Some(k));
        }
        assert_eq!(Dtype::from_code(0), None);
        assert_eq!(TensorKind::from_code(9), None);
    }

    #[test]
    fn byte_lengths() {
        assert_eq!(Dtype::BF16.byte_len("t", &[3, 5]).unwrap(), 30);
        assert_eq!(Dtype::F32.byte_len("t", &[]).unwrap(), 4);
        assert_eq!(Dtype::Nvfp4.byte_len("t", &[2, 32]).unwrap(), 32 + 4 + 4);
        assert_eq!(Dtype::Q3Ple32.byte_len("t", &[3, 64]).unwrap(), 3 * 2 * 14);
        assert!(matches!(
            Dtype::Nvfp4.byte_len("t", &[]),
            Err(FormatError::ShapeNotBlockAligned { .. })
        ));
        assert!(matches!(
            Dtype::F32.byte_len("t", &[u64::MAX, 2]),
            Err(FormatError::ShapeOverflow { .. })
        ));
    }

    #[test]
    fn round_up_works() {
        assert_eq!(round_up(0, PAGE), Some(0));
        assert_eq!(round_up(1, PAGE), Some(4096));
        assert_eq!(round_up(4096, PAGE), Some(4096));
        assert_eq!(round_up(u64::MAX, PAGE), None);
    }
}
