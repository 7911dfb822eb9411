//! The row dot products, written once over a small vector interface ([`Simd`]) and
//! instantiated for AVX-512, AVX2+FMA and a portable 8-lane array (which compilers
//! vectorize for whatever the target has). Weights are widened to f32 in registers
//! (bf16 by a shift, f16 by the hardware conversion, int8/int4 by integer widening) and
//! multiplied with f32 activations: activations are never rounded to bf16 or int8, so
//! the AVX-512 BF16 and VNNI dot-product instructions are not used (see `lib.rs`).

use crate::format::{bf16_to_f32, le_u16, Proj, WeightKind};
use crate::scalar;

/// A vector of `W` f32 lanes and the loads the kernels need.
///
/// # Safety
/// Implementations are only used where the CPU has their instructions (checked by
/// [`crate::Isa::available`]); every `load_*` reads `W` elements from a pointer the
/// caller guarantees to be valid for them.
pub(crate) unsafe trait Simd {
    /// Lanes.
    const W: usize;
    /// The register type.
    type V: Copy;
    /// All lanes 0.
    unsafe fn zero() -> Self::V;
    /// All lanes `v`.
    unsafe fn splat(v: f32) -> Self::V;
    /// `W` f32.
    unsafe fn load_f32(p: *const f32) -> Self::V;
    /// `W` bf16 (2W bytes).
    unsafe fn load_bf16(p: *const u8) -> Self::V;
    /// `W` f16 (2W bytes).
    unsafe fn load_f16(p: *const u8) -> Self::V;
    /// `W` int8 (W bytes).
    unsafe fn load_i8(p: *const u8) -> Self::V;
    /// `W` int4 elements (W/2 bytes, element 2j in the low nibble), as q = nibble - 8.
    unsafe fn load_i4(p: *const u8) -> Self::V;
    /// `a * b + c`.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// The sum of the lanes (fixed order).
    unsafe fn hsum(a: Self::V) -> f32;
}

/// Bytes each kind's row needs for `cols` inputs (what the loads below may touch).
fn row_needs(kind: WeightKind, cols: usize) -> usize {
    match kind {
        WeightKind::F32 => cols * 4,
        WeightKind::Bf16 | WeightKind::F16 => cols * 2,
        WeightKind::Int8 => cols,
        WeightKind::Int4 { .. } => cols / 2,
    }
}

/// Row `r` of `p` dotted with `x`, on `S`. Rows a vector path cannot take (int4 groups
/// that are not a multiple of `S::W`) and malformed inputs go to the scalar reference.
///
/// # Safety
/// `S`'s instructions must be available on this CPU.
#[inline(always)]
pub(crate) unsafe fn dot<S: Simd>(p: &Proj<'_>, r: usize, x: &[f32]) -> f32 {
    let w = p.row(r);
    let cols = x.len();
    if cols != p.cols || w.len() < row_needs(p.kind, cols) {
        return scalar::dot(p, r, x);
    }
    let s = p.row_scales(r);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let main = cols - cols % S::W;
    // SAFETY: `w` holds a whole row of `cols` elements and `x` has `cols` values (both
    // checked above), the loops below read elements `< main <= cols` only, and the
    // caller guarantees `S`'s instructions.
    unsafe {
        match p.kind {
            WeightKind::F32 => {
                let wf = wp.cast::<f32>();
                let v = lanes::<S>(main, |c| S::load_f32(wf.add(c)), xp);
                v + tail(main, cols, |c| crate::format::le_f32(w, c), x)
            }
            WeightKind::Bf16 => {
                let v = lanes::<S>(main, |c| S::load_bf16(wp.add(2 * c)), xp);
                v + tail(main, cols, |c| bf16_to_f32(le_u16(w, c)), x)
            }
            WeightKind::F16 => {
                let v = lanes::<S>(main, |c| S::load_f16(wp.add(2 * c)), xp);
                v + tail(main, cols, |c| crate::format::f16_to_f32(le_u16(w, c)), x)
            }
            WeightKind::Int8 => {
                let v = lanes::<S>(main, |c| S::load_i8(wp.add(c)), xp);
                let t = tail(
                    main,
                    cols,
                    |c| f32::from(i8::from_le_bytes([w.get(c).copied().unwrap_or(0)])),
                    x,
                );
                (v + t) * crate::format::le_f32(s, 0)
            }
            WeightKind::Int4 { group } => {
                if group % S::W != 0 || s.len() < cols / group * 2 {
                    return scalar::dot(p, r, x);
                }
                let mut acc = S::zero();
                for g in 0..cols / group {
                    let mut part = S::zero();
                    let mut c = g * group;
                    while c < (g + 1) * group {
                        part = S::fmadd(S::load_i4(wp.add(c / 2)), S::load_f32(xp.add(c)), part);
                        c += S::W;
                    }
                    acc = S::fmadd(part, S::splat(bf16_to_f32(le_u16(s, g))), acc);
                }
                S::hsum(acc)
            }
        }
    }
}

/// `sum_{c < main} load(c) * x[c]` in `S`'s lanes with two accumulators (two chains of
/// fused multiply-adds in flight), reduced to one f32.
#[inline(always)]
unsafe fn lanes<S: Simd>(main: usize, load: impl Fn(usize) -> S::V, xp: *const f32) -> f32 {
    // SAFETY: the caller guarantees `load(c)` and `xp + c` valid for W elements at every
    // c < main stepping by W, and `S`'s instructions.
    unsafe {
        let (mut a0, mut a1) = (S::zero(), S::zero());
        let mut c = 0;
        while c + 2 * S::W <= main {
            a0 = S::fmadd(load(c), S::load_f32(xp.add(c)), a0);
            a1 = S::fmadd(load(c + S::W), S::load_f32(xp.add(c + S::W)), a1);
            c += 2 * S::W;
        }
        if c < main {
            a0 = S::fmadd(load(c), S::load_f32(xp.add(c)), a0);
        }
        S::hsum(S::add(a0, a1))
    }
}

/// The columns after the last whole vector, scalar.
#[inline(always)]
fn tail(main: usize, cols: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
    (main..cols).fold(0.0, |acc, c| acc + w(c) * x.get(c).copied().unwrap_or(0.0))
}
