//! NVFP4: E2M1 elements in blocks of 16, an E4M3 scale per block, an FP32
//! scale per tensor, following NVIDIA ModelOpt's conventions.
//!
//! Body layout of an `n`-element tensor (`n` a multiple of 16):
//! `codes[n/2] ‖ block_scales[n/16] ‖ tensor_scale: f32 LE` — exactly the
//! bytes of ModelOpt's `weight` (U8), `weight_scale` (F8_E4M3) and
//! `weight_scale_2` (F32) concatenated, so native checkpoints pass through
//! bit for bit ([`NativeNvfp4`]). Element `2i` is the low nibble of code byte
//! `i`, element `2i+1` the high nibble. A nibble is `sign << 3 | m` with `m`
//! indexing [`E2M1_VALUES`].
//!
//! Quantization (all arithmetic IEEE f32):
//! * `scale_2 = amax / 2688` (2688 = 6 × 448); `amax = 0` gives `scale_2 = 0`.
//! * per block: `s = block_amax / (6 × scale_2)`; `s = 1` if `scale_2 = 0` or
//!   `s = 0`; block scale `e = e4m3(min(s, 448))` (nearest, ties to even).
//! * `d = decode(e) × scale_2`; each element `v = x / d` (`v = 0` if `d = 0`)
//!   becomes the nearest E2M1 magnitude (ties to the even code, clamped at 6)
//!   with sign bit `x < 0`.
//!
//! Decoding: `x̂ = ±E2M1[m] × d`. Error bound per element:
//! `|x − x̂| ≤ d × (1 + 2⁻⁸) + 6 × scale_2 × 2⁻¹⁰ + 2⁻¹²⁵` (half the widest
//! E2M1 step is `d`, the factor absorbs f32 rounding of `x / d`; the second
//! term covers block scales in E4M3's subnormal range, the last f32
//! underflow for tensors whose amax is below 2⁻¹²⁶).

use std::sync::OnceLock;

use half::bf16;
use rayon::prelude::*;

use crate::e4m3;
use crate::error::{FormatError, Result};
use crate::scan;

/// Elements per block.
pub const NVFP4_BLOCK: usize = 16;
/// Magnitudes of the eight E2M1 codes.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// `6 × 448`: the tensor scale maps the tensor amax to E2M1 max × E4M3 max.
pub const NVFP4_SCALE_DIVISOR: f32 = 2688.0;

/// Body length of an NVFP4 tensor of `n` elements: `n/2 + n/16 + 4`.
/// `n` must be a multiple of 16 (callers check via the shape).
pub fn nvfp4_len(n: u64) -> Option<u64> {
    (n / 2).checked_add(n / 16)?.checked_add(4)
}

fn check_sizes(x_len: usize, out_len: usize) -> Result<()> {
    if !x_len.is_multiple_of(NVFP4_BLOCK) {
        return Err(FormatError::BufferSize {
            what: "NVFP4 input (multiple of 16)",
            expected: (x_len - x_len % NVFP4_BLOCK + NVFP4_BLOCK) as u64,
            found: x_len as u64,
        });
    }
    let want = nvfp4_len(x_len as u64).unwrap_or(u64::MAX);
    if out_len as u64 != want {
        return Err(FormatError::BufferSize {
            what: "NVFP4 output",
            expected: want,
            found: out_len as u64,
        });
    }
    Ok(())
}

/// Tensor scale for a tensor whose absolute max is `amax`.
pub fn tensor_scale(amax: f32) -> f32 {
    amax / NVFP4_SCALE_DIVISOR
}

/// Reference nearest-E2M1 code of `v`: brute force, ties to the even code.
pub fn e2m1_ref(v: f32) -> u8 {
    let sign = if v < 0.0 { 8 } else { 0 };
    let a = v.abs().min(6.0); // clamp first: far out, f32 distances tie
    let mut best = 0u8;
    for m in 1..8u8 {
        let (eb, em) = (
            (a - E2M1_VALUES[best as usize]).abs(),
            (a - E2M1_VALUES[m as usize]).abs(),
        );
        if em < eb || (em == eb && m % 2 == 0) {
            best = m;
        }
    }
    sign | best
}

/// Fast nearest-E2M1 code: a sum of threshold comparisons (branch-free).
/// Strict `>` at midpoints rounding down to an even code, `>=` where the
/// upper neighbour is even.
#[inline(always)]
pub fn e2m1_fast(v: f32) -> u8 {
    let a = v.abs();
    let m = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    (u8::from(v < 0.0) << 3) | m
}

/// Block scale code for a block with absolute max `bamax`.
fn block_scale(bamax: f32, s2: f32, enc: fn(f32) -> u8) -> u8 {
    let mut s = if s2 == 0.0 { 1.0 } else { bamax / (6.0 * s2) };
    if s == 0.0 {
        s = 1.0; // ModelOpt: zero blocks get scale 1
    }
    enc(s.min(e4m3::E4M3_MAX))
}

/// Reference encoder: `x` (flat, `n` a multiple of 16) → NVFP4 body `out`.
/// `key` names the tensor in errors.
pub fn encode_ref(key: &str, x: &[bf16], out: &mut [u8]) -> Result<()> {
    check_sizes(x.len(), out.len())?;
    let amax = scan::absmax_ref(key, x, 0)?;
    let s2 = tensor_scale(amax);
    let n = x.len();
    let (codes, rest) = out.split_at_mut(n / 2);
    let (scales, ts) = rest.split_at_mut(n / NVFP4_BLOCK);
    codes.fill(0);
    for (b, block) in x.chunks(NVFP4_BLOCK).enumerate() {
        let bamax = block.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
        let e = block_scale(bamax, s2, e4m3::encode_ref);
        scales[b] = e;
        let d = e4m3::decode(e) * s2;
        for (i, v) in block.iter().enumerate() {
            let x = v.to_f32();
            // d = 0 only when the block scale underflows: magnitude 0, keep the sign.
            let q = if d == 0.0 {
                u8::from(x < 0.0) << 3
            } else {
                e2m1_ref(x / d)
            };
            codes[b * 8 + i / 2] |= q << (4 * (i % 2));
        }
    }
    ts.copy_from_slice(&s2.to_le_bytes());
    Ok(())
}

/// Elements per parallel work item of the fast encoder (128 KiB of BF16).
const PAR_CHUNK: usize = 1 << 16;

/// Sentinel magnitude bits: above every finite BF16 (a threshold never met).
const NEVER: i16 = 0x7F80;

/// Smallest BF16 magnitude bits `b ∈ 0..=0x7F80` with `pred(b)` (taken as
/// true at `0x7F80`), for `pred` monotone (false…false true…true).
/// Gallops from `guess`, then bisects, so a good guess costs a few calls
/// and a bad one is merely slower.
fn first_true(pred: impl Fn(i16) -> bool, guess: i16) -> i16 {
    let p = |b: i16| b >= NEVER || pred(b);
    let guess = guess.clamp(0, NEVER);
    // Invariant after galloping: !p(lo) (or lo = −1), p(hi).
    let (mut lo, mut hi);
    if p(guess) {
        hi = guess;
        let mut step = 1i16;
        loop {
            let c = hi.saturating_sub(step);
            if c < 0 || hi == 0 {
                lo = -1;
                break;
            }
            if !p(c) {
                lo = c;
                break;
            }
            hi = c;
            step = step.saturating_mul(2);
        }
    } else {
        lo = guess;
        let mut step = 1i16;
        loop {
            let c = lo.saturating_add(step).min(NEVER);
            if p(c) {
                hi = c;
                break;
            }
            lo = c;
            step = step.saturating_mul(2);
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if p(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Decision boundaries, in BF16 magnitude bits, of one block step `d`:
/// `[z, b1, …, b7]`. An element with magnitude bits `a` gets magnitude code
/// `#{i ≥ 1 : a ≥ bᵢ}` and keeps its sign bit iff `a ≥ z`; that is exactly
/// what the reference computes, because:
/// * `fl(|x| / d)` is monotone in `|x|` and `e2m1_ref` is monotone in its
///   magnitude (it is the threshold function `e2m1_fast`; monotonicity
///   was also checked once over every non-negative f32), so each code
///   boundary is one BF16 value, found here by evaluating the reference's
///   own expressions (`x / d`, `e2m1_ref`);
/// * the reference's sign bit is `x / d < 0`, which is false when the
///   quotient underflows to −0 (`a < z`); with `d = 0` it is `x < 0`
///   (`z = 1`, and every magnitude boundary is unreachable).
fn boundaries(d: f32) -> [i16; 8] {
    if d == 0.0 {
        return [1, NEVER, NEVER, NEVER, NEVER, NEVER, NEVER, NEVER];
    }
    // Guess from the real-valued midpoint `t × d` (truncated to BF16).
    let guess = |t: f32| ((t * d).to_bits() >> 16).min(NEVER as u32) as i16;
    let mut out = [0i16; 8];
    // Smallest magnitude whose quotient does not underflow to zero.
    out[0] = first_true(
        |b| scan::widen(b.cast_unsigned()) / d > 0.0,
        guess(f32::from_bits(1)),
    );
    const MID: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    for (i, t) in MID.iter().enumerate() {
        let code = (i + 1) as u8;
        out[i + 1] = first_true(
            |b| e2m1_ref(scan::widen(b.cast_unsigned()) / d) >= code,
            guess(*t),
        );
    }
    out
}

/// The code of BF16 bits `b` given `t = boundaries(d) − 1` of its block's
/// step (`a ≥ B ⇔ a > B − 1`: one signed compare per boundary).
#[inline(always)]
fn nibble(b: u16, t: &[i16; 8]) -> u16 {
    let a = (b & 0x7FFF) as i16;
    let m = t[1..].iter().map(|&t| u16::from(a > t)).sum::<u16>();
    ((b >> 15) & u16::from(a > t[0])) << 3 | m
}

/// Per-tensor table of `boundaries − 1` (see [`nibble`]) by block scale
/// code, each entry computed on first use (a tensor uses a few dozen of
/// the 127 finite non-negative codes), so small tensors stay cheap.
struct BoundaryTable {
    s2: f32,
    cells: [OnceLock<[i16; 8]>; 128],
}

impl BoundaryTable {
    fn new(s2: f32) -> Self {
        BoundaryTable {
            s2,
            cells: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Entry for block scale code `e` (a finite non-negative code).
    #[inline(always)]
    fn get(&self, e: u8) -> &[i16; 8] {
        self.cells[usize::from(e & 0x7F)]
            .get_or_init(|| boundaries(e4m3::decode(e & 0x7F) * self.s2).map(|b| b - 1))
    }
}

/// Blocks whose scales the fast encoder computes together (so the
/// divisions and E4M3 roundings vectorize).
const GROUP: usize = 64;

/// Encode whole blocks of a chunk (fast path, single thread): block scales
/// a group at a time, then integer compares per element.
fn encode_chunk(x: &[u16], s2: f32, table: &BoundaryTable, codes: &mut [u8], scales: &mut [u8]) {
    let six_s2 = 6.0 * s2; // the reference's divisor, same f32 value
    let (blocks, _) = x.as_chunks::<NVFP4_BLOCK>();
    let (cs, _) = codes.as_chunks_mut::<{ NVFP4_BLOCK / 2 }>();
    for ((blocks, cs), scales) in blocks
        .chunks(GROUP)
        .zip(cs.chunks_mut(GROUP))
        .zip(scales.chunks_mut(GROUP))
    {
        let mut bamax = [0u16; GROUP];
        for (a, b) in bamax.iter_mut().zip(blocks) {
            *a = b
                .iter()
                .fold(0i16, |m, &v| m.max((v & 0x7FFF).cast_signed()))
                .cast_unsigned();
        }
        // The reference's `block_scale`, branch-free.
        for (e, &a) in scales.iter_mut().zip(&bamax) {
            let s = scan::widen(a) / six_s2;
            let s = if s2 == 0.0 || s == 0.0 { 1.0 } else { s };
            *e = e4m3::encode(s.min(e4m3::E4M3_MAX));
        }
        for ((block, c), &e) in blocks.iter().zip(cs.iter_mut()).zip(scales.iter()) {
            // `e` is a finite non-negative code (≤ 0x7E): the step is ≥ 0.
            let t = table.get(e);
            let mut q = [0u16; NVFP4_BLOCK];
            for (q, &b) in q.iter_mut().zip(block) {
                *q = nibble(b, t);
            }
            // Nibble pairs: as one u32 the pair is `lo | hi << 16`.
            for (i, c) in c.iter_mut().enumerate() {
                let v = u32::from(q[2 * i]) | u32::from(q[2 * i + 1]) << 16;
                *c = (v | v >> 12) as u8;
            }
        }
    }
}

/// Fast encoder: byte-identical to [`encode_ref`], parallel over chunks
/// with rayon (runs on the current rayon pool).
pub fn encode(key: &str, x: &[bf16], out: &mut [u8]) -> Result<()> {
    check_sizes(x.len(), out.len())?;
    let amax = scan::absmax_fast(key, x, 0)?;
    let s2 = tensor_scale(amax);
    let table = BoundaryTable::new(s2);
    let n = x.len();
    let (codes, rest) = out.split_at_mut(n / 2);
    let (scales, ts) = rest.split_at_mut(n / NVFP4_BLOCK);
    scan::bits(x)
        .par_chunks(PAR_CHUNK)
        .zip(codes.par_chunks_mut(PAR_CHUNK / 2))
        .zip(scales.par_chunks_mut(PAR_CHUNK / NVFP4_BLOCK))
        .for_each(|((x, c), s)| encode_chunk(x, s2, &table, c, s));
    ts.copy_from_slice(&s2.to_le_bytes());
    Ok(())
}

/// Decode an NVFP4 body into `out` (`out.len()` elements).
pub fn decode(body: &[u8], out: &mut [f32]) -> Result<()> {
    check_sizes(out.len(), body.len())?;
    let n = out.len();
    let (codes, rest) = body.split_at(n / 2);
    let (scales, ts) = rest.split_at(n / NVFP4_BLOCK);
    let s2 = f32::from_le_bytes([ts[0], ts[1], ts[2], ts[3]]);
    let steps: [f32; 256] = std::array::from_fn(|e| e4m3::decode(e as u8) * s2);
    let (outs, _) = out.as_chunks_mut::<NVFP4_BLOCK>();
    let (cs, _) = codes.as_chunks::<{ NVFP4_BLOCK / 2 }>();
    for ((o, c), &e) in outs.iter_mut().zip(cs).zip(scales) {
        let d = steps[usize::from(e)];
        // The 16 possible outputs of this block: ±E2M1[m] × d.
        let lut: [f32; 16] = std::array::from_fn(|q| {
            let mag = E2M1_VALUES[q & 7] * d;
            if q & 8 != 0 { -mag } else { mag }
        });
        for (o2, &byte) in o.as_chunks_mut::<2>().0.iter_mut().zip(c) {
            o2[0] = lut[usize::from(byte & 0x0F)];
            o2[1] = lut[usize::from(byte >> 4)];
        }
    }
    Ok(())
}

/// Per-element error bound of [`decode`] for a block whose block scale
/// decodes to `e` in a tensor with tensor scale `s2`; see the module docs.
pub fn error_bound(e: u8, s2: f32) -> f32 {
    e4m3::decode(e) * s2 * (1.0 + (-8f32).exp2()) + 6.0 * s2 * (-10f32).exp2() + (-125f32).exp2()
}

/// Shapes of a source tensor already in ModelOpt's NVFP4 layout:
/// `weight` U8 `[.., k/2]`, `weight_scale` F8_E4M3 `[.., k/16]`,
/// `weight_scale_2` F32 with one element. Its FTW body is the three byte
/// strings concatenated, unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeNvfp4 {
    shape: Vec<u64>,
    parts: [u64; 3],
}

impl NativeNvfp4 {
    /// Validate the three source shapes and derive the logical shape.
    pub fn new(
        key: &str,
        weight: &[u64],
        weight_scale: &[u64],
        weight_scale_2: &[u64],
    ) -> Result<Self> {
        let bad = |reason: String| FormatError::NativeNvfp4Shape {
            key: key.to_owned(),
            reason,
        };
        let (&wl, lead) = weight
            .split_last()
            .ok_or_else(|| bad("weight is a scalar".into()))?;
        let (&sl, slead) = weight_scale
            .split_last()
            .ok_or_else(|| bad("weight_scale is a scalar".into()))?;
        if lead != slead {
            return Err(bad(format!(
                "leading dims differ: {weight:?} vs {weight_scale:?}"
            )));
        }
        let k = wl.checked_mul(2).ok_or_else(|| bad("overflow".into()))?;
        if k % NVFP4_BLOCK as u64 != 0 || sl != k / NVFP4_BLOCK as u64 {
            return Err(bad(format!(
                "weight_scale last dim {sl} must be weight last dim {wl} x 2 / 16"
            )));
        }
        if weight_scale_2.iter().product::<u64>() != 1 {
            return Err(bad(format!(
                "weight_scale_2 shape {weight_scale_2:?} is not one element"
            )));
        }
        let mut shape = lead.to_vec();
        shape.push(k);
        let n = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("overflow".into()))?;
        Ok(NativeNvfp4 {
            shape,
            parts: [n / 2, n / NVFP4_BLOCK as u64, 4],
        })
    }

    /// Logical shape `[.., k]` to declare in the FTW index (dtype NVFP4).
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Byte lengths of `weight`, `weight_scale`, `weight_scale_2`.
    pub fn part_lens(&self) -> [u64; 3] {
        self.parts
    }

    /// Total body length (sum of the parts).
    pub fn body_len(&self) -> u64 {
        self.parts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_fast_matches_ref() {
        let mut v = -8.0f32;
        while v <= 8.0 {
            assert_eq!(e2m1_fast(v), e2m1_ref(v), "v={v}");
            v += 1.0 / 64.0;
        }
        for v in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, 1e30, -1e30] {
            assert_eq!(e2m1_fast(v), e2m1_ref(v), "v={v}");
        }
    }

    /// The boundary table reproduces the reference's per-element code for
    /// every finite BF16 under many steps `d = E4M3⁻¹(e) × scale_2`.
    #[test]
    fn boundaries_match_reference_on_every_bf16() {
        let mut r = 0x2545_F491_4F6C_DD1Du64;
        let mut steps = vec![0.0f32, 1.0, 0.5, 6.0 * 448.0, f32::MIN_POSITIVE];
        for _ in 0..40 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            // Random finite amax (BF16, any exponent) and block scale code.
            let amax = scan::widen((r as u16) & 0x7F7F);
            let e = ((r >> 20) % 0x7F) as u8;
            steps.push(e4m3::decode(e) * tensor_scale(amax));
        }
        for d in steps {
            let t = boundaries(d).map(|b| b - 1);
            for b in 0..=u16::MAX {
                if b & 0x7FFF >= 0x7F80 {
                    continue;
                }
                let x = scan::widen(b);
                let want = if d == 0.0 {
                    u8::from(x < 0.0) << 3
                } else {
                    e2m1_ref(x / d)
                };
                assert_eq!(nibble(b, &t), u16::from(want), "d={d:e} x={x:e}");
            }
        }
    }

    #[test]
    fn ties_go_to_even_codes() {
        assert_eq!(e2m1_ref(0.25), 0);
        assert_eq!(e2m1_ref(0.75), 2);
        assert_eq!(e2m1_ref(5.0), 6);
        assert_eq!(e2m1_ref(-2.5), 8 | 4);
    }

    #[test]
    fn native_shapes() {
        let n = NativeNvfp4::new("w", &[4, 8], &[4, 1], &[]).unwrap();
        assert_eq!(n.shape(), &[4, 16]);
        assert_eq!(n.part_lens(), [32, 4, 4]);
        assert_eq!(
            n.body_len(),
            crate::Dtype::Nvfp4.byte_len("w", &[4, 16]).unwrap()
        );
        assert!(NativeNvfp4::new("w", &[4, 8], &[4, 2], &[1]).is_err());
        assert!(NativeNvfp4::new("w", &[4, 8], &[3, 1], &[1]).is_err());
        assert!(NativeNvfp4::new("w", &[4, 8], &[4, 1], &[2]).is_err());
        assert!(NativeNvfp4::new("w", &[], &[4, 1], &[1]).is_err());
    }
}
