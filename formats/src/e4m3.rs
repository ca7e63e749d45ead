//! OCP FP8 E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits.
//!
//! No infinities; `S.1111.111` is NaN; the largest finite value is 448 and
//! the smallest subnormal 2⁻⁹. Encoding is round-to-nearest, ties to even
//! code, saturating to ±448 (as NVIDIA ModelOpt's block scales need).
//! [`encode_ref`] is the authority (a brute-force nearest search);
//! [`encode`] is the bit-twiddling version, proven identical by tests over
//! every f32 pattern class.

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// Decode one E4M3 byte to f32 (exact).
pub fn decode(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0x0F);
    let man = f32::from(code & 0x07);
    if exp == 0x0F && code & 0x07 == 0x07 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man * (-9f32).exp2() // subnormal: m × 2⁻⁹
    } else {
        (1.0 + man / 8.0) * ((exp - 7) as f32).exp2()
    };
    sign * mag
}

/// Reference encoder: the nearest finite E4M3 value, ties to the even code,
/// saturating. NaN maps to `0x7F`.
pub fn encode_ref(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    let mut best = 0u8;
    let mut best_err = f64::INFINITY;
    // Codes 0x00..=0x7E are the finite non-negative values, increasing.
    for c in 0u8..=0x7E {
        let err = (a - f64::from(decode(c))).abs();
        if err < best_err || (err == best_err && c & 1 == 0) {
            best = c;
            best_err = err;
        }
    }
    sign | best
}

/// Fast encoder, byte-identical to [`encode_ref`]. Branch-free (every case
/// is computed, then selected), so loops over it vectorize.
#[inline]
pub fn encode(x: f32) -> u8 {
    // 1.5 × 2²³: adding it to a value in [0, 8) rounds to an integer, ties
    // to even, left in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abits = bits & 0x7FFF_FFFF;
    let a = f32::from_bits(abits);
    // Subnormal range (< 2⁻⁶): code = RNE(a × 2⁹) (8 = first normal code).
    let sub = (a * 512.0 + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as u8;
    // Normal: round the 23-bit mantissa to 3 bits, ties to even; a carry
    // correctly bumps the exponent. Rebias 127 → 7.
    let r = abits.wrapping_add(0x7_FFFF + ((abits >> 20) & 1));
    let norm = (r >> 20).wrapping_sub(120 << 3) as u8;
    let mag = if a >= E4M3_MAX {
        0x7E // saturate
    } else if a < 0.015625 {
        sub
    } else {
        norm
    };
    if x.is_nan() { 0x7F } else { sign | mag }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_known_values() {
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0x38), 1.0);
        assert_eq!(decode(0x01), (-9f32).exp2());
        assert_eq!(decode(0x08), (-6f32).exp2());
        assert!(decode(0x7F).is_nan() && decode(0xFF).is_nan());
        assert_eq!(decode(0xB8), -1.0);
    }

    #[test]
    fn every_code_round_trips() {
        for c in 0u8..=255 {
            if c & 0x7F == 0x7F {
                continue;
            }
            assert_eq!(encode_ref(decode(c)), c, "code {c:#x}");
            assert_eq!(encode(decode(c)), c, "code {c:#x}");
        }
    }

    #[test]
    fn fast_matches_ref_on_midpoints_and_neighbours() {
        for c in 0u8..0x7E {
            let lo = decode(c);
            let hi = decode(c + 1);
            let mid = (lo + hi) / 2.0;
            for x in [
                mid,
                f32::from_bits(mid.to_bits() + 1),
                f32::from_bits(mid.to_bits() - 1),
            ] {
                assert_eq!(encode(x), encode_ref(x), "x={x}");
                assert_eq!(encode(-x), encode_ref(-x), "x=-{x}");
            }
        }
        for x in [
            0.0,
            -0.0,
            448.0,
            449.0,
            464.0,
            1e30,
            f32::MAX,
            1e-30,
            f32::MIN_POSITIVE,
        ] {
            assert_eq!(encode(x), encode_ref(x), "x={x}");
        }
        assert_eq!(encode(f32::INFINITY), 0x7E);
    }

    #[test]
    fn fast_matches_ref_across_all_f32_patterns() {
        // Every 65537th bit pattern: both signs, NaNs, Inf, subnormals.
        let mut bits = 0u32;
        loop {
            let x = f32::from_bits(bits);
            assert_eq!(encode(x), encode_ref(x), "bits={bits:#x}");
            match bits.checked_add(0x1_0001) {
                Some(b) => bits = b,
                None => break,
            }
        }
    }

    #[test]
    fn fast_matches_ref_on_a_sweep() {
        // Walk f32 bit patterns across the whole E4M3 range and beyond.
        let mut bits = 0x3000_0000u32; // ~4.6e-10
        while bits < 0x4400_0000 {
            let x = f32::from_bits(bits);
            assert_eq!(encode(x), encode_ref(x), "x={x}");
            bits += 0x1_0F31;
        }
    }
}
