//! The row dot products, written once over a small vector interface ([`Simd`]) and
//! instantiated for AVX-512, AVX2+FMA and a portable 8-lane array (which compilers
//! vectorize for whatever the target has). Weights are widened to f32 in registers
//! (bf16 by a shift, f16 by the hardware conversion, int8/int4 by integer widening) and
//! multiplied with f32 activations. (The AVX-512 kernels that read activations
//! prepared per call, bf16 planes and the int4 column order, are in `avx512.rs`.)

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
    /// Asks for the cache line at `p` (a hint: any address; none by default).
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
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
    // SAFETY: the caller's guarantee.
    unsafe { dot_ahead::<S>(p, r, x, 0) }
}

/// [`dot`], and an int8 row also asks for the line `ahead` bytes past each 64 bytes it
/// reads (0: none); the same operations, so the same bits.
///
/// # Safety
/// As [`dot`].
#[inline(always)]
pub(crate) unsafe fn dot_ahead<S: Simd>(p: &Proj<'_>, r: usize, x: &[f32], ahead: usize) -> f32 {
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
                let load = |c: usize| {
                    if ahead != 0 && c.is_multiple_of(64) {
                        S::prefetch(wp.wrapping_add(c).wrapping_add(ahead));
                    }
                    S::load_i8(wp.add(c))
                };
                let v = lanes::<S>(main, load, xp);
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

/// `[f(0), .., f(R - 1)]`, inlined (`std::array::from_fn` stayed a call per block of
/// rows in the rows kernels: ~10% of a one-thread int4 call on the CPU box).
#[inline(always)]
pub(crate) fn array_of<T: Copy, const R: usize>(init: T, mut f: impl FnMut(usize) -> T) -> [T; R] {
    let mut a = [init; R];
    for (k, v) in a.iter_mut().enumerate() {
        *v = f(k);
    }
    a
}

/// [`dot_ahead`] of the `R` int8 rows from `r` with `x`, each result bit-identical to
/// `dot_ahead`'s for its row (the same loads, multiply-adds, sums and scale, in the same
/// order; `x` is loaded once for all rows and the rows' chains of multiply-adds are
/// interleaved). None where a row is not a whole int8 row of `x.len()` columns with its
/// scale (the caller then takes `dot_ahead` row by row).
///
/// # Safety
/// `S`'s instructions must be available on this CPU.
#[inline(always)]
pub(crate) unsafe fn dot_i8_rows<S: Simd, const R: usize>(
    p: &Proj<'_>,
    r: usize,
    x: &[f32],
    ahead: usize,
) -> Option<[f32; R]> {
    let cols = x.len();
    let rows: [&[u8]; R] = array_of(&[], |k| p.row(r + k));
    let scales: [&[u8]; R] = array_of(&[], |k| p.row_scales(r + k));
    let whole = rows
        .iter()
        .zip(&scales)
        .all(|(w, s)| w.len() >= cols && s.len() >= 4);
    if p.kind != WeightKind::Int8 || cols != p.cols || !whole {
        return None;
    }
    let xp = x.as_ptr();
    let main = cols - cols % S::W;
    // SAFETY: every row holds `cols` int8 weights and `x` `cols` values (checked above);
    // the loops read elements `< main <= cols` only; `S` is available (the caller).
    unsafe {
        let load = |w: &[u8], c: usize| {
            let wp = w.as_ptr();
            if ahead != 0 && c.is_multiple_of(64) {
                S::prefetch(wp.wrapping_add(c).wrapping_add(ahead));
            }
            S::load_i8(wp.add(c))
        };
        let (mut a0, mut a1) = ([S::zero(); R], [S::zero(); R]);
        let mut c = 0;
        while c + 2 * S::W <= main {
            let (x0, x1) = (S::load_f32(xp.add(c)), S::load_f32(xp.add(c + S::W)));
            for ((w, e), o) in rows.iter().zip(a0.iter_mut()).zip(a1.iter_mut()) {
                *e = S::fmadd(load(w, c), x0, *e);
                *o = S::fmadd(load(w, c + S::W), x1, *o);
            }
            c += 2 * S::W;
        }
        if c < main {
            let x0 = S::load_f32(xp.add(c));
            for (w, e) in rows.iter().zip(a0.iter_mut()) {
                *e = S::fmadd(load(w, c), x0, *e);
            }
        }
        let mut out = [0.0f32; R];
        let sums = rows.into_iter().zip(scales).zip(a0).zip(a1);
        for (o, (((w, s), e), d)) in out.iter_mut().zip(sums) {
            let t = tail(
                main,
                cols,
                |c| f32::from(i8::from_le_bytes([w.get(c).copied().unwrap_or(0)])),
                x,
            );
            *o = (S::hsum(S::add(e, d)) + t) * crate::format::le_f32(s, 0);
        }
        Some(out)
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

/// Tokens one [`dots`] call serves: each weight vector is loaded and widened once and
/// multiplied with this many activation rows.
pub(crate) const TOKENS: usize = 4;

/// Row `r` of `p` dotted with each of `xs`: every result is bit-identical to
/// [`dot`]`(p, r, xs[t])` (the same accumulators, the same order of operations per
/// token); the weights are only read and widened once for all of them.
///
/// # Safety
/// `S`'s instructions must be available on this CPU.
#[inline(always)]
pub(crate) unsafe fn dots<S: Simd>(p: &Proj<'_>, r: usize, xs: [&[f32]; TOKENS]) -> [f32; TOKENS] {
    let w = p.row(r);
    let cols = p.cols;
    if w.len() < row_needs(p.kind, cols) || xs.iter().any(|x| x.len() != cols) {
        // A loop, not `xs.map(closure)`: a closure does not get the caller's target
        // features, so `dot`'s intrinsics would not inline into it (measured 20x slower).
        let mut out = [0.0; TOKENS];
        for (o, x) in out.iter_mut().zip(xs) {
            // SAFETY: the caller's guarantee, passed on.
            *o = unsafe { dot::<S>(p, r, x) };
        }
        return out;
    }
    let s = p.row_scales(r);
    let wp = w.as_ptr();
    let xp = xs.map(<[f32]>::as_ptr);
    let main = cols - cols % S::W;
    // SAFETY: as in `dot`: a whole row of `cols` elements and `cols` values per token
    // (checked above), reads of elements `< main <= cols` only, `S` available.
    unsafe {
        match p.kind {
            WeightKind::F32 => {
                let wf = wp.cast::<f32>();
                let v = lanes_n::<S>(main, |c| S::load_f32(wf.add(c)), xp);
                finish(v, xs, |x| {
                    tail(main, cols, |c| crate::format::le_f32(w, c), x)
                })
            }
            WeightKind::Bf16 => {
                let v = lanes_n::<S>(main, |c| S::load_bf16(wp.add(2 * c)), xp);
                finish(v, xs, |x| {
                    tail(main, cols, |c| bf16_to_f32(le_u16(w, c)), x)
                })
            }
            WeightKind::F16 => {
                let v = lanes_n::<S>(main, |c| S::load_f16(wp.add(2 * c)), xp);
                finish(v, xs, |x| {
                    tail(main, cols, |c| crate::format::f16_to_f32(le_u16(w, c)), x)
                })
            }
            WeightKind::Int8 => {
                let v = lanes_n::<S>(main, |c| S::load_i8(wp.add(c)), xp);
                let scale = crate::format::le_f32(s, 0);
                let q = |c: usize| f32::from(i8::from_le_bytes([w.get(c).copied().unwrap_or(0)]));
                finish(v, xs, |x| tail(main, cols, q, x)).map(|d| d * scale)
            }
            // One token at a time here (a four-token loop measured 2x slower: 743 vs 1416
            // prompt tok/s on tiny-code-moe int4, AVX-512, 1 thread); the AVX-512
            // kernels serve int4 four tokens at a time from prepared rows (`avx512.rs`).
            // A loop, not a closure, for the reason above.
            WeightKind::Int4 { .. } => {
                let mut out = [0.0; TOKENS];
                for (o, x) in out.iter_mut().zip(xs) {
                    *o = dot::<S>(p, r, x);
                }
                out
            }
        }
    }
}

/// `lanes` for [`TOKENS`] activation rows at once, each with its own two accumulators
/// in the same order as `lanes`.
#[inline(always)]
unsafe fn lanes_n<S: Simd>(
    main: usize,
    load: impl Fn(usize) -> S::V,
    xp: [*const f32; TOKENS],
) -> [f32; TOKENS] {
    // SAFETY: as `lanes`, for every token's pointer.
    unsafe {
        let (mut a0, mut a1) = ([S::zero(); TOKENS], [S::zero(); TOKENS]);
        let mut c = 0;
        while c + 2 * S::W <= main {
            let (w0, w1) = (load(c), load(c + S::W));
            for ((b0, b1), x) in a0.iter_mut().zip(a1.iter_mut()).zip(xp) {
                *b0 = S::fmadd(w0, S::load_f32(x.add(c)), *b0);
                *b1 = S::fmadd(w1, S::load_f32(x.add(c + S::W)), *b1);
            }
            c += 2 * S::W;
        }
        if c < main {
            let w0 = load(c);
            for (b0, x) in a0.iter_mut().zip(xp) {
                *b0 = S::fmadd(w0, S::load_f32(x.add(c)), *b0);
            }
        }
        let mut out = [0.0; TOKENS];
        for ((o, b0), b1) in out.iter_mut().zip(a0).zip(a1) {
            *o = S::hsum(S::add(b0, b1));
        }
        out
    }
}

/// The vector part of each token plus its scalar tail, as `dot` adds them.
#[inline(always)]
fn finish(
    v: [f32; TOKENS],
    xs: [&[f32]; TOKENS],
    tail_of: impl Fn(&[f32]) -> f32,
) -> [f32; TOKENS] {
    let mut out = v;
    for (o, x) in out.iter_mut().zip(xs) {
        *o += tail_of(x);
    }
    out
}
