//! Q3_PLE_32: 3-bit codes in blocks of 32 for the per-layer embedding table.
//!
//! A block is 14 bytes: `scale: f16 LE` then 12 bytes of codes (3.5 bits per
//! weight). The 32 codes form a 96-bit little-endian bit string: code `i`
//! occupies bits `3i..3i+3`. A code `q ∈ 0..=7` stands for `k = q − 4 ∈ −4..=3`.
//!
//! One bf16 global scale `G` (stored separately, 2 bytes) covers the table:
//! `G` is the table's absolute max, and block scales are f16 values relative
//! to it, so any bf16 range fits f16's narrow exponent range.
//!
//! Quantization of a block (IEEE f32 arithmetic throughout), after checking
//! every element is finite and `|x| ≤ G`:
//! * `m` = the element of largest magnitude (first one on ties), sign kept,
//!   as llama.cpp's `quantize_row_q4_0_ref` does: `m` maps to the extreme
//!   code `k = −4`, which spends the asymmetric code on the larger side.
//! * `s = f16(m / G / −4)` rounded to nearest even (`s = +0` if `m = 0` or
//!   `G = 0`); `|s| ≤ 0.25`.
//! * step `d = G × s`; `k = clamp(round_half_even(x / d), −4, 3)`
//!   (`k = 0` if `d = 0`); `q = k + 4`.
//!
//! Decoding: `x̂ = d × (q − 4)`. Elements with `x/d ∈ [−4.5, 3.5]` decode
//! within `|d|/2`; elements on the far side of `m` above `3.5|d|` clamp to
//! `3d`. Documented bound for every element:
//! `|x − x̂| ≤ |d| × (1 + 2⁻⁸) + G × 2⁻²² + 2⁻¹²⁵` ([`error_bound`]); the
//! `G` term covers block scales that round into f16's subnormal range, the
//! last term f32 underflow for absurdly small tables.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::{FormatError, Result};
use crate::scan;

/// Elements per block.
pub const Q3_BLOCK: usize = 32;
/// Bytes per block: 2 (f16 scale) + 12 (codes).
pub const Q3_BLOCK_BYTES: usize = 14;
/// Bytes of packed codes per block.
pub const Q3_CODE_BYTES: usize = 12;
/// Length of the separately stored global scale record.
pub const Q3_GLOBAL_SCALE_BYTES: u64 = 2;

/// Byte length of a segment of `rows` rows of `width` elements:
/// `rows × (width / 32) × 14`. `width` must be a positive multiple of 32.
pub fn q3_segment_len(rows: u64, width: u64) -> Result<u64> {
    if width == 0 || !width.is_multiple_of(Q3_BLOCK as u64) {
        return Err(FormatError::Q3BadWidth { width });
    }
    (width / Q3_BLOCK as u64)
        .checked_mul(Q3_BLOCK_BYTES as u64)
        .and_then(|r| r.checked_mul(rows))
        .ok_or_else(|| FormatError::Overflow {
            what: format!("Q3 segment length {rows} x {width}"),
        })
}

/// The table-wide bf16 global scale `G` (finite, non-negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Q3GlobalScale(u16);

impl Q3GlobalScale {
    /// `G` for a table whose absolute max is `amax` (rounded up to bf16 so
    /// that every element satisfies `|x| ≤ G`; exact for bf16 inputs).
    pub fn from_absmax(amax: f32) -> Result<Self> {
        if !amax.is_finite() || amax < 0.0 {
            return Err(FormatError::Q3GlobalScaleInvalid {
                bits: bf16::from_f32(amax).to_bits(),
            });
        }
        let mut g = bf16::from_f32(amax);
        if g.to_f32() < amax {
            g = bf16::from_bits(g.to_bits() + 1);
        }
        Self::from_bits(g.to_bits())
    }

    /// Validate raw bits.
    pub fn from_bits(bits: u16) -> Result<Self> {
        let g = bf16::from_bits(bits);
        if !g.is_finite() || g.is_sign_negative() {
            return Err(FormatError::Q3GlobalScaleInvalid { bits });
        }
        Ok(Q3GlobalScale(bits))
    }

    /// Parse the 2-byte record.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        match b {
            [lo, hi] => Self::from_bits(u16::from_le_bytes([*lo, *hi])),
            _ => Err(FormatError::Q3GlobalScaleSize {
                found: b.len() as u64,
            }),
        }
    }

    /// The 2-byte record (bf16 LE).
    pub fn to_bytes(self) -> [u8; 2] {
        self.0.to_le_bytes()
    }

    /// `G` as bf16.
    pub fn value(self) -> bf16 {
        bf16::from_bits(self.0)
    }
}

/// Absolute max of (part of) a table, checking finiteness; `base` is the
/// flat index of `x[0]` for error messages. Fast and parallel; combine the
/// results of several segments with `f32::max`.
pub fn table_absmax(key: &str, x: &[bf16], base: u64) -> Result<f32> {
    scan::absmax_fast(key, x, base)
}

fn check_sizes(x_len: usize, width: usize, out_len: usize) -> Result<()> {
    if width == 0 || !width.is_multiple_of(Q3_BLOCK) {
        return Err(FormatError::Q3BadWidth {
            width: width as u64,
        });
    }
    if !x_len.is_multiple_of(width) {
        return Err(FormatError::BufferSize {
            what: "Q3 input (whole rows)",
            expected: (x_len / width * width) as u64,
            found: x_len as u64,
        });
    }
    let want = x_len / Q3_BLOCK * Q3_BLOCK_BYTES;
    if out_len != want {
        return Err(FormatError::BufferSize {
            what: "Q3 output",
            expected: want as u64,
            found: out_len as u64,
        });
    }
    Ok(())
}

fn exceeds(key: &str, index: u64, value: f32, g: f32) -> FormatError {
    FormatError::Q3ExceedsGlobalScale {
        key: key.to_owned(),
        index,
        value,
        global: g,
    }
}

/// Block scale for signed max `m` under global scale `g`.
#[inline]
fn block_scale(m: f32, g: f32) -> f16 {
    if m == 0.0 || g == 0.0 {
        f16::ZERO
    } else {
        f16::from_f32(m / g / -4.0)
    }
}

/// Reference encoder. `x` holds whole rows of `width` elements (flat index
/// `base` at `x[0]`, used in errors); `out` receives `x.len()/32` blocks.
pub fn encode_ref(
    key: &str,
    x: &[bf16],
    width: usize,
    g: Q3GlobalScale,
    base: u64,
    out: &mut [u8],
) -> Result<()> {
    check_sizes(x.len(), width, out.len())?;
    encode_ref_by(key, x, bf16::to_f32, g, base, out)
}

/// Reference encoder for f32 input (a table decoded from FP8 × scale):
/// [`encode_ref`]'s arithmetic on the exact f32 values.
pub fn encode_ref_f32(
    key: &str,
    x: &[f32],
    width: usize,
    g: Q3GlobalScale,
    base: u64,
    out: &mut [u8],
) -> Result<()> {
    check_sizes(x.len(), width, out.len())?;
    encode_ref_by(key, x, |v| v, g, base, out)
}

/// Fast encoder for f32 input: byte-identical to [`encode_ref_f32`] (same
/// errors too), parallel over chunks of blocks with rayon on the current
/// pool. On error `out` may be partly written; its contents are then
/// meaningless.
pub fn encode_f32(
    key: &str,
    x: &[f32],
    width: usize,
    g: Q3GlobalScale,
    base: u64,
    out: &mut [u8],
) -> Result<()> {
    check_sizes(x.len(), width, out.len())?;
    let gf = g.value().to_f32();
    const CHUNK: usize = PAR_BLOCKS * Q3_BLOCK;
    let bad = x
        .par_chunks(CHUNK)
        .zip(out.par_chunks_mut(PAR_BLOCKS * Q3_BLOCK_BYTES))
        .enumerate()
        .find_map_first(|(ci, (c, o))| {
            // `!(|v| ≤ G)` also catches NaN and ±inf; a branch-free fold
            // so the common all-good chunk is one vectorized pass.
            if c.iter().fold(true, |ok, v| ok & (v.abs() <= gf)) {
                encode_blocks_f32(c, gf, o);
                return None;
            }
            // Rare path: the reference's serial scan gives the exact error.
            encode_ref_by(key, c, |v| v, g, base + (ci * CHUNK) as u64, o).err()
        });
    bad.map_or(Ok(()), Err)
}

/// `round_half_even(q)` for `|q| ≤ 2²²`: adding and removing 1.5 × 2²³
/// leaves `q` rounded to an integer by the FPU's round-to-nearest-even
/// (IEEE default, which Rust never changes), without a libm call on
/// targets lacking `roundps`.
#[inline(always)]
fn round_half_even_small(q: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 × 2²³
    (q + MAGIC) - MAGIC
}

/// Encode whole blocks of validated f32 input (fast path, single thread):
/// the reference's `m`, `s`, `d` and `fl(x / d)`, its rounding done by
/// [`round_half_even_small`] after clamping to ±8 (which changes no code:
/// every quotient beyond ±8 rounds beyond the ±4 clamp anyway).
fn encode_blocks_f32(x: &[f32], g: f32, out: &mut [u8]) {
    let (blocks, _) = x.as_chunks::<Q3_BLOCK>();
    let (outs, _) = out.as_chunks_mut::<Q3_BLOCK_BYTES>();
    for (block, o) in blocks.iter().zip(outs) {
        // Signed max: the first element of the largest magnitude (an
        // all-zero block gives m = ±0, scale +0 either way).
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let m = block
            .iter()
            .copied()
            .find(|v| v.abs() == amax)
            .unwrap_or(0.0);
        let s = block_scale(m, g);
        let d = g * s.to_f32();
        let mut q = [4u16; Q3_BLOCK];
        if d != 0.0 {
            for (q, &v) in q.iter_mut().zip(block) {
                let k = round_half_even_small((v / d).clamp(-8.0, 8.0)).clamp(-4.0, 3.0);
                *q = (k as i32 + 4).cast_unsigned() as u16;
            }
        }
        pack_block(s, &q, o);
    }
}

/// Absolute max of f32 values, checking finiteness (`base` as in
/// [`table_absmax`]).
pub fn table_absmax_f32(key: &str, x: &[f32], base: u64) -> Result<f32> {
    let mut m = 0f32;
    for (i, &v) in x.iter().enumerate() {
        if !v.is_finite() {
            return Err(FormatError::NonFinite {
                key: key.to_owned(),
                index: base + i as u64,
                value: v,
            });
        }
        m = m.max(v.abs());
    }
    Ok(m)
}

/// The reference encoding of whole blocks `x`, read through `f`.
fn encode_ref_by<T: Copy>(
    key: &str,
    x: &[T],
    f: impl Fn(T) -> f32,
    g: Q3GlobalScale,
    base: u64,
    out: &mut [u8],
) -> Result<()> {
    let gf = g.value().to_f32();
    // Validate everything first so the error is always the first bad element.
    for (i, &v) in x.iter().enumerate() {
        let f = f(v);
        if !f.is_finite() {
            return Err(FormatError::NonFinite {
                key: key.to_owned(),
                index: base + i as u64,
                value: f,
            });
        }
        if f.abs() > gf {
            return Err(exceeds(key, base + i as u64, f, gf));
        }
    }
    for (block, o) in x.chunks(Q3_BLOCK).zip(out.chunks_mut(Q3_BLOCK_BYTES)) {
        // Signed max: first element of largest magnitude.
        let mut m = 0.0f32;
        for &v in block {
            if f(v).abs() > m.abs() {
                m = f(v);
            }
        }
        let s = block_scale(m, gf);
        let d = gf * s.to_f32();
        o[..2].copy_from_slice(&s.to_bits().to_le_bytes());
        let codes = &mut o[2..];
        codes.fill(0);
        for (i, &v) in block.iter().enumerate() {
            let k = if d == 0.0 {
                0.0
            } else {
                (f(v) / d).round_ties_even().clamp(-4.0, 3.0)
            };
            let q = (k as i32 + 4).cast_unsigned();
            // Append q's three bits to the little-endian bit string.
            for bit in 0..3 {
                if q >> bit & 1 == 1 {
                    let pos = 3 * i + bit;
                    codes[pos / 8] |= 1 << (pos % 8);
                }
            }
        }
    }
    Ok(())
}

/// Blocks per parallel work item of the fast encoder (224 KiB of BF16 in,
/// 56 KiB out: big enough that rayon's per-task cost is noise).
const PAR_BLOCKS: usize = 3584;

/// `|d|` at and above which the fast encoder uses threshold compares.
const EXACT_D_MIN: f32 = f32::MIN_POSITIVE * 2.0; // 2⁻¹²⁵

/// Signed max of a block (the reference's `m`): largest magnitude, sign of
/// its first occurrence. Branch-free i16 maxima, so it vectorizes.
#[inline(always)]
fn signed_max(block: &[u16; Q3_BLOCK]) -> f32 {
    let mb = block.iter().fold(0i16, |m, &b| m.max((b & 0x7FFF) as i16));
    // Among elements of magnitude `mb`, the earliest has the largest
    // `(32 − i) << 1`; the low bit carries its sign.
    let first = block.iter().enumerate().fold(0i16, |k, (i, &b)| {
        let key = ((Q3_BLOCK - i) as i16) << 1 | (b >> 15) as i16;
        k.max(if (b & 0x7FFF) as i16 == mb { key } else { 0 })
    });
    scan::widen(mb.cast_unsigned() | (first & 1).cast_unsigned() << 15)
}

/// Compare constants for a block whose step `d` satisfies
/// `|d| ≥ EXACT_D_MIN`, in BF16 magnitude bits: `[c0, c1, c2, c3]`.
///
/// With `x' = x·sign(d)` (so `x / d = x' / |d|`) and `a = |x'|`, the
/// reference's `q = clamp(round_half_even(x / d), −4, 3) + 4` is
/// `4 + n` for `x' ≥ 0` and `4 − n − [a ≥ 3.5|d|]` for `x' < 0`, where
/// `n = [a > 0.5|d|] + [a ≥ 1.5|d|] + [a > 2.5|d|]`: crossing a
/// half-integer `h·|d|` moves `q` by one, and a tie goes to the even `k`
/// (0.5 → 0, 1.5 → 2, 2.5 → 2, −3.5 → −4; 3.5 and beyond clamp to 3).
/// Exactness:
/// * `h·|d|` is exact: `d = G × s` multiplies an 8-bit (bf16) and an
///   11-bit (f16) significand, exact in f32 because `|d| ≥ 2⁻¹²⁵` keeps it
///   normal; `2h` is an odd number ≤ 7 (3 bits), so `h·|d|` has ≤ 23 bits,
///   and `3.5·|d| ≤ 3.5·G/4` cannot overflow. So `a ⋚ h·|d|` compares the
///   *exact* quotient with `h`.
/// * The reference's rounded quotient `fl(x / d)` is on the same side of
///   `h` (rounding is monotone, `h` is representable) and never lands on
///   `h` unless the quotient is exactly `h`: where `a ≈ h·|d|`, both `a`
///   and `h·|d|` are multiples of `|d|·2⁻²⁰`, so a nonzero `a/|d| − h` is
///   at least `2⁻²⁰`, more than the `2⁻²³` it takes to round onto `h`.
/// * For a BF16 `a ≥ 0` and `t > 0`, with `⌊t⌋ = t` truncated to BF16
///   (its top 16 bits) and `⌈t⌉ = ⌊t⌋ + [t inexact]` in bits:
///   `a > t ⇔ bits(a) > ⌊t⌋` and `a ≥ t ⇔ bits(a) > ⌈t⌉ − 1`.
#[inline(always)]
fn compare_constants(d: f32) -> [i16; 4] {
    let ad = d.abs();
    let floor = |t: f32| (t.to_bits() >> 16) as i16;
    let ceil_m1 = |t: f32| {
        let b = t.to_bits();
        (b >> 16) as i16 + i16::from(b & 0xFFFF != 0) - 1
    };
    [
        floor(0.5 * ad),
        ceil_m1(1.5 * ad),
        floor(2.5 * ad),
        ceil_m1(3.5 * ad),
    ]
}

/// Codes of a block from its compare constants (see [`compare_constants`]);
/// `flip` is the sign bit of `d` in BF16 position.
#[inline(always)]
fn codes_by_compares(block: &[u16; Q3_BLOCK], flip: u16, c: &[i16; 4], q: &mut [u16; Q3_BLOCK]) {
    for (q, &b) in q.iter_mut().zip(block) {
        let a = (b & 0x7FFF) as i16;
        let neg = ((b ^ flip) as i16) >> 15; // all ones if x' < 0
        let n = i16::from(a > c[0]) + i16::from(a > c[1]) + i16::from(a > c[2]);
        // x' < 0: −(n + [a ≥ 3.5|d|]), else +n (−0 has n = 0).
        let v = n + (i16::from(a > c[3]) & neg);
        *q = (4 + ((v ^ neg) - neg)).cast_unsigned();
    }
}

/// Blocks whose scales the fast encoder computes together (vectorized
/// divisions and hardware f16 conversions when the CPU has them).
const GROUP: usize = 64;

/// Encode whole blocks (fast path, single thread; input already validated).
fn encode_blocks(x: &[u16], g: f32, out: &mut [u8]) {
    let (blocks, _) = x.as_chunks::<Q3_BLOCK>();
    let (outs, _) = out.as_chunks_mut::<Q3_BLOCK_BYTES>();
    for (blocks, outs) in blocks.chunks(GROUP).zip(outs.chunks_mut(GROUP)) {
        let n = blocks.len();
        // Scales of the group: the reference's `block_scale`, in bulk.
        let mut m = [0f32; GROUP];
        for (m, b) in m.iter_mut().zip(blocks) {
            *m = signed_max(b);
        }
        let mut r = [0f32; GROUP];
        for (r, &m) in r.iter_mut().zip(&m) {
            *r = m / g / -4.0;
        }
        let mut s = [f16::ZERO; GROUP];
        s[..n].convert_from_f32_slice(&r[..n]);
        for (s, &m) in s.iter_mut().zip(&m) {
            if m == 0.0 || g == 0.0 {
                *s = f16::ZERO;
            }
        }
        let mut d = [0f32; GROUP];
        s[..n].convert_to_f32_slice(&mut d[..n]);
        for d in &mut d {
            *d *= g;
        }
        let mut c = [[0i16; 4]; GROUP];
        for (c, &d) in c.iter_mut().zip(&d) {
            *c = compare_constants(d);
        }
        for ((((block, o), s), &d), c) in blocks.iter().zip(outs.iter_mut()).zip(&s).zip(&d).zip(&c)
        {
            encode_block(block, *s, d, c, o);
        }
    }
}

/// Encode one block given its scale `s`, step `d = G × s` and compare
/// constants `c` (used when `|d| ≥ EXACT_D_MIN`).
#[inline(always)]
fn encode_block(
    block: &[u16; Q3_BLOCK],
    s: f16,
    d: f32,
    c: &[i16; 4],
    o: &mut [u8; Q3_BLOCK_BYTES],
) {
    let mut q = [4u16; Q3_BLOCK];
    if d.abs() >= EXACT_D_MIN {
        let flip = ((d.to_bits() >> 16) & 0x8000) as u16;
        codes_by_compares(block, flip, c, &mut q);
    } else if d != 0.0 {
        // Step in f32's subnormal range (tables below ~2⁻¹⁰⁰): the
        // reference's own arithmetic.
        for (q, &b) in q.iter_mut().zip(block) {
            let k = (scan::widen(b) / d).round_ties_even().clamp(-4.0, 3.0);
            *q = (k as i32 + 4).cast_unsigned() as u16;
        }
    }
    pack_block(s, &q, o);
}

/// Writes a block: its scale `s`, then its codes `q` (each `0..=7`) as
/// the 96-bit little-endian bit string.
#[inline(always)]
fn pack_block(s: f16, q: &[u16; Q3_BLOCK], o: &mut [u8; Q3_BLOCK_BYTES]) {
    let (sc, codes) = o.split_at_mut(2);
    sc.copy_from_slice(&s.to_bits().to_le_bytes());
    // Pack 3-bit codes pairwise (6, 12, then 24 bits per lane).
    let p: [u16; 16] = std::array::from_fn(|j| q[2 * j] | q[2 * j + 1] << 3);
    let r: [u32; 8] = std::array::from_fn(|j| u32::from(p[2 * j] | p[2 * j + 1] << 6));
    for (j, o3) in codes.chunks_exact_mut(3).enumerate() {
        let w = r[2 * j] | r[2 * j + 1] << 12;
        o3.copy_from_slice(&w.to_le_bytes()[..3]);
    }
}

/// Fast encoder: byte-identical to [`encode_ref`] (same errors too),
/// parallel over chunks of blocks with rayon on the current pool. On error
/// `out` may be partly written (the reference leaves it untouched); its
/// contents are then meaningless.
pub fn encode(
    key: &str,
    x: &[bf16],
    width: usize,
    g: Q3GlobalScale,
    base: u64,
    out: &mut [u8],
) -> Result<()> {
    check_sizes(x.len(), width, out.len())?;
    let gf = g.value().to_f32();
    let gbits = g.0;
    let b = scan::bits(x);
    const CHUNK: usize = PAR_BLOCKS * Q3_BLOCK;
    // One pass: each chunk is checked, then encoded while still in cache.
    let bad = b
        .par_chunks(CHUNK)
        .zip(out.par_chunks_mut(PAR_BLOCKS * Q3_BLOCK_BYTES))
        .enumerate()
        .find_map_first(|(ci, (c, o))| {
            if scan::max_mag_bits(c) <= gbits {
                encode_blocks(c, gf, o);
                return None;
            }
            // Rare path: the reference's serial scan gives the exact error.
            let xs = &x[ci * CHUNK..ci * CHUNK + c.len()];
            xs.iter().enumerate().find_map(|(i, v)| {
                let f = v.to_f32();
                let idx = base + (ci * CHUNK + i) as u64;
                if !f.is_finite() {
                    Some(FormatError::NonFinite {
                        key: key.to_owned(),
                        index: idx,
                        value: f,
                    })
                } else if f.abs() > gf {
                    Some(exceeds(key, idx, f, gf))
                } else {
                    None
                }
            })
        });
    bad.map_or(Ok(()), Err)
}

/// Decode blocks into `out` (`out.len()` must be `blocks.len() / 14 × 32`).
pub fn decode(blocks: &[u8], g: Q3GlobalScale, out: &mut [f32]) -> Result<()> {
    if !blocks.len().is_multiple_of(Q3_BLOCK_BYTES)
        || out.len() != blocks.len() / Q3_BLOCK_BYTES * Q3_BLOCK
    {
        return Err(FormatError::BufferSize {
            what: "Q3 decode output",
            expected: (blocks.len() / Q3_BLOCK_BYTES * Q3_BLOCK) as u64,
            found: out.len() as u64,
        });
    }
    let gf = g.value().to_f32();
    for (o, blk) in out
        .chunks_exact_mut(Q3_BLOCK)
        .zip(blocks.chunks_exact(Q3_BLOCK_BYTES))
    {
        let d = gf * f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        for (g8, c3) in o.chunks_exact_mut(8).zip(blk[2..].chunks_exact(3)) {
            let w = u32::from_le_bytes([c3[0], c3[1], c3[2], 0]);
            for (j, o) in g8.iter_mut().enumerate() {
                *o = d * (((w >> (3 * j)) & 7) as i32 - 4) as f32;
            }
        }
    }
    Ok(())
}

/// The documented per-element error bound for a block whose stored scale
/// has bits `scale_bits`, under global scale `g`.
pub fn error_bound(scale_bits: u16, g: Q3GlobalScale) -> f32 {
    let gf = g.value().to_f32();
    let d = (gf * f16::from_bits(scale_bits).to_f32()).abs();
    d * (1.0 + (-8f32).exp2()) + gf * (-22f32).exp2() + (-125f32).exp2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_geometry_is_pinned() {
        assert_eq!(q3_segment_len(320_001_536, 160).unwrap(), 22_400_107_520);
        assert_eq!(q3_segment_len(2_500_012, 160).unwrap(), 175_000_840);
        assert_eq!(175_000_840u64 * 128, 22_400_107_520);
    }

    /// The compares reproduce `clamp(round_half_even(x / d), −4, 3) + 4`
    /// for every finite BF16 and many steps `d = G × s` (bf16 × f16, as the
    /// encoder forms them) of both signs, including steps at and just above
    /// `EXACT_D_MIN`.
    #[test]
    fn compare_codes_match_reference_arithmetic_on_every_bf16() {
        let step = |g: f32, s: f32| bf16::from_f32(g).to_f32() * f16::from_f32(s).to_f32();
        let mut steps = vec![
            step(1.0, -0.25),
            step(4.0, 0.25),
            step((-120f32).exp2(), 2f32.powi(-5)), // = EXACT_D_MIN
            step((-120f32).exp2(), -(2f32.powi(-5))),
            step(1.9921875 * (-121f32).exp2(), 0.249_877_93), // 8 × 11 bits
            step(bf16::MAX.to_f32(), 0.25),
            step(bf16::MAX.to_f32(), -(2f32.powi(-24))), // f16 subnormal s
        ];
        let mut r = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..48 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            let g = bf16::from_bits((r as u16) & 0x7F7F).to_f32();
            // Any f16 with |s| ≤ 0.25 (exponent field ≤ 13), either sign.
            let sb = (r >> 16) as u16;
            let s = f16::from_bits(sb & 0x83FF | ((sb >> 10) % 14) << 10);
            steps.push(g * s.to_f32());
        }
        let all: Vec<u16> = (0..=u16::MAX).filter(|b| b & 0x7FFF < 0x7F80).collect();
        steps.retain(|d| d.abs() >= EXACT_D_MIN);
        assert!(steps.len() >= 30, "{} steps", steps.len());
        for d in steps {
            let flip = ((d.to_bits() >> 16) & 0x8000) as u16;
            let c = compare_constants(d);
            for block in all.chunks_exact(Q3_BLOCK) {
                let block: &[u16; Q3_BLOCK] = block.try_into().unwrap();
                let mut q = [0u16; Q3_BLOCK];
                codes_by_compares(block, flip, &c, &mut q);
                for (&b, &q) in block.iter().zip(&q) {
                    let k = (scan::widen(b) / d).round_ties_even().clamp(-4.0, 3.0);
                    assert_eq!(
                        q,
                        (k as i32 + 4).cast_unsigned() as u16,
                        "d={d:e} x={:e}",
                        scan::widen(b)
                    );
                }
            }
        }
    }

    /// The fast f32 encoder gives the reference's bytes and errors on f32
    /// values that are not BF16: random magnitudes over many binades,
    /// elements exactly on and one ulp beside every half-integer multiple
    /// of their block's step (the ties `round_half_even` decides), zero
    /// and signed-zero blocks, equal magnitudes of both signs, steps in
    /// f32's subnormal range, and a non-finite or too-large element.
    #[test]
    fn fast_f32_encoder_matches_reference() {
        let mut r = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r
        };
        let mut x = Vec::new();
        for b in 0..8192u32 {
            let e = (next() % 60) as i32 - 30 - if b % 97 == 0 { 110 } else { 0 };
            let scale = (e as f32).exp2();
            let mut block: Vec<f32> = (0..Q3_BLOCK)
                .map(|_| {
                    let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                    (u * 2.0 - 1.0) * scale
                })
                .collect();
            match b % 5 {
                0 => {
                    // Ties: put elements on h·d (and one ulp beside).
                    let m = block[0].abs().max(scale) * if b % 2 == 0 { 1.0 } else { -1.0 };
                    block[0] = m;
                    let d = scale_of(m, m.abs() * 1.5);
                    for (i, v) in block.iter_mut().enumerate().skip(1) {
                        let h = (i % 8) as f32 - 3.5;
                        let t = h * d;
                        *v = match i % 3 {
                            0 => t,
                            1 => f32::from_bits(t.to_bits() + 1),
                            _ => f32::from_bits(t.to_bits().saturating_sub(1)),
                        };
                    }
                }
                1 => block
                    .iter_mut()
                    .for_each(|v| *v = if next() % 2 == 0 { 0.0 } else { -0.0 }),
                2 => {
                    let m = block[3];
                    block.iter_mut().step_by(2).for_each(|v| *v = -m);
                }
                _ => {}
            }
            x.extend(block);
        }
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let g = Q3GlobalScale::from_absmax(amax * 1.5).unwrap();
        let mut fast = vec![0u8; x.len() / Q3_BLOCK * Q3_BLOCK_BYTES];
        let mut reference = fast.clone();
        encode_f32("t", &x, 64, g, 0, &mut fast).unwrap();
        encode_ref_f32("t", &x, 64, g, 0, &mut reference).unwrap();
        assert_eq!(fast, reference);
        // A table whose steps fall in f32's subnormal range.
        let tiny: Vec<f32> = x.iter().map(|v| v * (-118f32).exp2()).collect();
        let gt = Q3GlobalScale::from_absmax(amax * (-118f32).exp2()).unwrap();
        encode_f32("t", &tiny, 64, gt, 0, &mut fast).unwrap();
        encode_ref_f32("t", &tiny, 64, gt, 0, &mut reference).unwrap();
        assert_eq!(fast, reference);
        for bad in [f32::NAN, f32::INFINITY, amax * 4.0] {
            let mut y = x.clone();
            y[PAR_BLOCKS * Q3_BLOCK + 77] = bad;
            y[PAR_BLOCKS * Q3_BLOCK * 2 + 5] = bad;
            let e = encode_f32("t", &y, 64, g, 10, &mut fast)
                .unwrap_err()
                .to_string();
            let r = encode_ref_f32("t", &y, 64, g, 10, &mut reference)
                .unwrap_err()
                .to_string();
            assert_eq!(e, r);
            assert!(
                e.contains(&(10 + PAR_BLOCKS * Q3_BLOCK + 77).to_string()),
                "{e}"
            );
        }
    }

    /// The step `d` the encoder forms for a block of signed max `m` under
    /// a table absmax `amax`.
    fn scale_of(m: f32, amax: f32) -> f32 {
        let g = Q3GlobalScale::from_absmax(amax).unwrap().value().to_f32();
        g * block_scale(m, g).to_f32()
    }

    #[test]
    fn bad_widths() {
        assert!(matches!(
            q3_segment_len(1, 0),
            Err(FormatError::Q3BadWidth { width: 0 })
        ));
        assert!(matches!(
            q3_segment_len(1, 48),
            Err(FormatError::Q3BadWidth { width: 48 })
        ));
        assert!(matches!(
            q3_segment_len(u64::MAX, 64),
            Err(FormatError::Overflow { .. })
        ));
    }

    #[test]
    fn global_scale_validation() {
        let g = Q3GlobalScale::from_absmax(1.5).unwrap();
        assert_eq!(Q3GlobalScale::from_bytes(&g.to_bytes()).unwrap(), g);
        // Rounds up, never down.
        let g = Q3GlobalScale::from_absmax(1.0 + 1.0 / 1024.0).unwrap();
        assert!(g.value().to_f32() >= 1.0 + 1.0 / 1024.0);
        assert!(matches!(
            Q3GlobalScale::from_bytes(&[0; 3]),
            Err(FormatError::Q3GlobalScaleSize { found: 3 })
        ));
        assert!(matches!(
            Q3GlobalScale::from_bits(0xBF80),
            Err(FormatError::Q3GlobalScaleInvalid { .. })
        ));
        assert!(matches!(
            Q3GlobalScale::from_bits(0x7FC0),
            Err(FormatError::Q3GlobalScaleInvalid { .. })
        ));
        assert!(Q3GlobalScale::from_absmax(f32::NAN).is_err());
    }
}
