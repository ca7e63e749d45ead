//! Shared helpers for the codecs: BF16 → f32, finiteness, absolute max.
//!
//! On the bit level a BF16's magnitude is `bits & 0x7FFF`, and for
//! non-negative floats the integer order of the bits equals the numeric
//! order, so the absolute max is an integer max (which vectorizes) and a
//! value is non-finite exactly when its magnitude bits are `>= 0x7F80`.

use half::bf16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::error::{FormatError, Result};

/// Magnitude bits at and above which a BF16 is Inf or NaN.
const NON_FINITE: u16 = 0x7F80;

/// Exact BF16 → f32 widening.
#[inline(always)]
pub(crate) fn widen(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// View BF16 values as their raw bits (no copy).
#[inline]
pub(crate) fn bits(x: &[bf16]) -> &[u16] {
    x.reinterpret_cast()
}

/// The `NonFinite` error for the first non-finite element of `x`.
fn first_non_finite(key: &str, x: &[u16], base: u64) -> Option<FormatError> {
    x.iter()
        .position(|&b| b & 0x7FFF >= NON_FINITE)
        .map(|i| FormatError::NonFinite {
            key: key.to_owned(),
            index: base + i as u64,
            value: widen(x[i]),
        })
}

/// Reference: absolute max of `x` as f32, or `NonFinite` naming the first
/// offending element (`base` is the flat index of `x[0]` in its tensor).
pub(crate) fn absmax_ref(key: &str, x: &[bf16], base: u64) -> Result<f32> {
    let mut amax = 0.0f32;
    for (i, v) in x.iter().enumerate() {
        let f = v.to_f32();
        if !f.is_finite() {
            return Err(FormatError::NonFinite {
                key: key.to_owned(),
                index: base + i as u64,
                value: f,
            });
        }
        amax = amax.max(f.abs());
    }
    Ok(amax)
}

/// Max magnitude bits of a chunk (vectorizes as an i16 max).
#[inline]
pub(crate) fn max_mag_bits(x: &[u16]) -> u16 {
    x.iter()
        .fold(0i16, |m, &b| m.max((b & 0x7FFF).cast_signed()))
        .cast_unsigned()
}

/// Fast, parallel version of [`absmax_ref`] with the same result and error.
pub(crate) fn absmax_fast(key: &str, x: &[bf16], base: u64) -> Result<f32> {
    const CHUNK: usize = 1 << 16;
    let b = bits(x);
    let m = b.par_chunks(CHUNK).map(max_mag_bits).max().unwrap_or(0);
    if m >= NON_FINITE {
        // Rare path: find the first offender serially.
        return Err(
            first_non_finite(key, b, base).unwrap_or(FormatError::Overflow {
                what: "non-finite scan".into(),
            }),
        );
    }
    Ok(widen(m))
}
