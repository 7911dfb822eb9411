//! AVX-512 (F): 16 f32 lanes in a `__m512`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::i4_steps::{Groups, I4Step};
use crate::simd::Simd;

/// 16 lanes in a `__m512`; only used where AVX-512F was detected.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512;

// SAFETY: every method is only called from `dot_avx512` (target feature avx512f), which
// is only called after runtime detection; loads read W elements from pointers the
// caller guarantees valid.
unsafe impl Simd for Avx512 {
    const W: usize = 16;
    type V = __m512;

    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        prefetch(p);
    }

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F is available (see the impl's contract).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        // SAFETY: as above.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m512 {
        // SAFETY: 16 readable f32 at p (caller); unaligned load.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes at p (caller); bf16 -> f32 is a 16-bit shift.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes at p (caller).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> __m512 {
        // SAFETY: 16 readable bytes at p (caller).
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn load_i4(p: *const u8) -> __m512 {
        // SAFETY: 8 readable bytes at p (caller). Low nibbles are even elements, high
        // nibbles odd ones: interleaving the two byte vectors restores element order.
        unsafe {
            let b = _mm_loadl_epi64(p.cast());
            let m = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(b, m);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m);
            let n = _mm_unpacklo_epi8(lo, hi);
            let q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(n), _mm512_set1_epi32(8));
            _mm512_cvtepi32_ps(q)
        }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F is available.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn hsum(a: __m512) -> f32 {
        // SAFETY: AVX-512F is available. A fixed tree (not _mm512_reduce_add_ps, whose
        // order is the compiler's): halves, then the AVX2-style 128-bit reduction.
        unsafe {
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            let s = _mm256_add_ps(lo, hi);
            let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
}

/// [`crate::simd::dot`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must have avx512f.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn dot_avx512(p: &crate::format::Proj<'_>, r: usize, x: &[f32]) -> f32 {
    // SAFETY: the features are enabled here (caller's guarantee).
    unsafe { crate::simd::dot::<Avx512>(p, r, x) }
}

/// `out[i] = dot_avx512(p, start + i, x)` for every `i`, bit for bit, with the row loop
/// inside the AVX-512 function so the dot product inlines into it (one call per matrix
/// instead of one per row: the decode step's matrices have 64-4096 rows of 256 columns,
/// where the call and dispatch per row cost as much as the row). Int8 rows are computed
/// `rows` (4, 2, else 1) at a time, interleaved ([`crate::simd::dot_i8_rows`]).
///
/// # Safety
/// The CPU must have avx512f.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn rows_avx512(
    p: &crate::format::Proj<'_>,
    start: usize,
    x: &[f32],
    out: &mut [f32],
    rows: usize,
) {
    if p.kind != crate::format::WeightKind::Int8 {
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: the features are enabled here (caller's guarantee).
            *o = unsafe { crate::simd::dot::<Avx512>(p, start + i, x) };
        }
        return;
    }
    // SAFETY: the features are enabled here (caller's guarantee).
    unsafe {
        match rows {
            4 => i8_rows::<4>(p, start, x, out),
            2 => i8_rows::<2>(p, start, x, out),
            _ => i8_rows::<1>(p, start, x, out),
        }
    }
}

/// [`rows_avx512`] of int8 rows, `R` at a time ([`crate::simd::dot_i8_rows`]), each
/// row's line `row_prefetch_ahead` bytes ahead asked for per 64 bytes read.
///
/// # Safety
/// As [`rows_avx512`]. (Its own features, not `inline(always)`: closures get the
/// features of the function they are written in.)
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn i8_rows<const R: usize>(
    p: &crate::format::Proj<'_>,
    start: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let ahead = row_prefetch_ahead();
    // SAFETY: the caller's guarantee (the features), passed on.
    let one = |r: usize| unsafe { crate::simd::dot_ahead::<Avx512>(p, r, x, ahead) };
    rows_by::<R>(
        out,
        |i| {
            let r = start + i;
            // SAFETY: as `one`.
            unsafe { crate::simd::dot_i8_rows::<Avx512, R>(p, r, x, ahead) }
                .unwrap_or_else(|| crate::simd::array_of(0.0, |k| one(r + k)))
        },
        |i| one(start + i),
    );
}

/// [`crate::simd::dots`] on Avx512.
///
/// # Safety
/// The CPU must have the features enabled here.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn dots_avx512(
    p: &crate::format::Proj<'_>,
    r: usize,
    xs: [&[f32]; crate::simd::TOKENS],
) -> [f32; crate::simd::TOKENS] {
    // SAFETY: the features are enabled here (caller's guarantee).
    unsafe { crate::simd::dots::<Avx512>(p, r, xs) }
}

/// `sum_c W[r, c] * x[c]` for `T` activation rows at once from one read of a bf16 weight
/// row `w` of `cols` columns, with the AVX-512 BF16 dot product against each row's `NP`
/// exact bf16 planes (`xs[t]`: plane `p` starts at `xs[t] + p * stride`, zero-padded
/// to a multiple of 32). Every product is exact (bf16 x bf16 fits f32); per plane two
/// accumulators (even and odd 32-column steps, the last partial step masked into the
/// even one), summed as (plane NP-1 + ... ) + plane 0, then [`Avx512::hsum`]. The
/// operations of a token do not depend on `T` (four-token calls are bit-identical to
/// one-token calls).
///
/// # Safety
/// avx512f, avx512bw and avx512bf16 must be enabled in the caller; `w` readable for
/// `2 * cols` bytes and each plane for `cols` rounded up to 32 values.
#[inline(always)]
unsafe fn bf16_planes_dot<const NP: usize, const T: usize>(
    w: *const u8,
    cols: usize,
    xs: [*const u16; T],
    stride: usize,
) -> [f32; T] {
    // SAFETY: the caller's guarantees; reads stay below 2 * cols bytes of w (the last
    // step is masked) and below the padded plane length of each x.
    unsafe {
        let mut a0 = [[_mm512_setzero_ps(); NP]; T];
        let mut a1 = [[_mm512_setzero_ps(); NP]; T];
        let mut c = 0;
        while c + 64 <= cols {
            let w0 = bh(_mm512_loadu_si512(w.add(2 * c).cast()));
            let w1 = bh(_mm512_loadu_si512(w.add(2 * c + 64).cast()));
            for ((b0, b1), x) in a0.iter_mut().zip(a1.iter_mut()).zip(xs) {
                for (p, (e, o)) in b0.iter_mut().zip(b1.iter_mut()).enumerate() {
                    *e = _mm512_dpbf16_ps(*e, w0, load_bh(x.add(p * stride + c)));
                    *o = _mm512_dpbf16_ps(*o, w1, load_bh(x.add(p * stride + c + 32)));
                }
            }
            c += 64;
        }
        while c < cols {
            let n = cols - c;
            let w0 = if n >= 32 {
                _mm512_loadu_si512(w.add(2 * c).cast())
            } else {
                _mm512_maskz_loadu_epi16((1u32 << n) - 1, w.add(2 * c).cast())
            };
            let w0 = bh(w0);
            for (b0, x) in a0.iter_mut().zip(xs) {
                for (p, e) in b0.iter_mut().enumerate() {
                    *e = _mm512_dpbf16_ps(*e, w0, load_bh(x.add(p * stride + c)));
                }
            }
            c += 32;
        }
        let mut out = [0.0f32; T];
        for ((o, b0), b1) in out.iter_mut().zip(a0).zip(a1) {
            let mut s = _mm512_setzero_ps();
            for (e, d) in b0.into_iter().zip(b1).rev() {
                s = _mm512_add_ps(s, _mm512_add_ps(e, d));
            }
            *o = Avx512::hsum(s);
        }
        out
    }
}

/// `prefetch_ahead`'s default.
const PREFETCH_DEFAULT: usize = 4096;

/// Bytes ahead of the weights being read that the int4 BF16 kernel asks the cache for,
/// a line per 64-byte step (`FLINT_CPU_PREFETCH`, read once; default
/// `PREFETCH_DEFAULT`, 0: none). On the CPU box 4 KiB ahead made the fused int4 layer
/// call ~10% faster at one and two threads, four rounds alternating; the bf16 kernel
/// lost 15% at one thread with it and stays without (docs/benchmarks.md, "Software
/// prefetch").
pub(crate) fn prefetch_ahead() -> usize {
    static AHEAD: OnceLock<usize> = OnceLock::new();
    *AHEAD.get_or_init(|| crate::env_setting("FLINT_CPU_PREFETCH", PREFETCH_DEFAULT))
}

/// Asks for the cache line at `p` (a hint: any address, never a fault).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    // SAFETY: a prefetch reads nothing the program sees and never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

/// Bytes ahead that the rows kernels of bf16 rows ([`rows_bf16`]: all of a row's lines
/// before it is read) and int8 rows ([`rows_avx512`]: a line per 64 bytes read) ask the
/// cache for (`FLINT_CPU_ROW_PREFETCH`, read once; 0: none). Default 4 KiB on Intel
/// CPUs, none elsewhere. On the GPU box's Xeon a one-token bf16 layer call took 628-693
/// us with it against 809 without at 16 threads (6.1 against 7.5 ms at one thread), an
/// int8 call 4.9 against 5.7 ms at one thread and the same at 16; the CPU box's EPYC lost
/// 15-25% (bf16) and 0-20% (int8) at one thread (docs/benchmarks.md, "Thirteenth
/// session"). The int8 rows asked for whole rows at once lost on the Xeon (448 -> 475-520
/// us at 16 threads); a line per 64 bytes did not.
fn row_prefetch_ahead() -> usize {
    static AHEAD: OnceLock<usize> = OnceLock::new();
    *AHEAD.get_or_init(|| {
        let default = if intel() { ROW_PREFETCH_INTEL } else { 0 };
        crate::env_setting("FLINT_CPU_ROW_PREFETCH", default)
    })
}

/// [`row_prefetch_ahead`]'s default on Intel CPUs.
const ROW_PREFETCH_INTEL: usize = 4096;

/// Whether the CPU's vendor string is Intel's.
pub(crate) fn intel() -> bool {
    // `__cpuid` is safe from Rust 1.94 on, unsafe before (the crate builds on 1.89).
    #[allow(unused_unsafe)]
    // SAFETY: leaf 0 (the vendor) exists on every x86_64 CPU.
    let id = unsafe { std::arch::x86_64::__cpuid(0) };
    let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    vendor == b"GenuineIntel"
}

/// [`prefetch`] of every line of `len` bytes from `p`.
#[inline(always)]
fn prefetch_span(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        prefetch(p.wrapping_add(off));
        off += 64;
    }
}

/// The 512 bits of a register as 32 bf16.
#[inline(always)]
fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512 plain bits; every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// 32 bf16 at `p`.
///
/// # Safety
/// avx512f enabled in the caller; 64 readable bytes at `p`.
#[inline(always)]
unsafe fn load_bh(p: *const u16) -> __m512bh {
    // SAFETY: the caller's guarantees.
    bh(unsafe { _mm512_loadu_si512(p.cast()) })
}

/// [`bf16_planes_dot`] for `T` rows of one plane each (rows exactly bf16; more planes
/// measured slower than the f32 kernel, see `act.rs`).
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512bf16; the rest as `bf16_planes_dot`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16_planes<const T: usize>(
    w: *const u8,
    cols: usize,
    xs: [*const u16; T],
    stride: usize,
) -> [f32; T] {
    // SAFETY: the features are enabled here; pointers as the caller guarantees.
    unsafe { bf16_planes_dot::<1, T>(w, cols, xs, stride) }
}

/// `sum_g scale_g * sum_{c in g} q[c] * x[c]` for `T` activation rows from one read of
/// an int4 row `w` (`cols / 2` bytes; `group` a multiple of 32 dividing `cols`; bf16
/// scales `s`, one per group). Each 16 bytes (32 columns) widen to 16 lanes once; a
/// permute through the table -8..7 turns the low nibbles (even columns) and, after a
/// 4-bit shift, the high nibbles (odd columns) into f32 without unpacking them in
/// order: the activations come reordered to match ([`crate::act::Act`]'s int4 order).
/// The permute goes through the table times the group's scale (q * s is exact: 4 by
/// 8 significant bits), so each 16 columns cost one FMA per token and no per-group
/// add or scale multiply (one multiply of the table per group, shared by the tokens);
/// scales are read two per 4-byte load, and groups of 32 get their own unrolled loop.
/// Four accumulators per token (even and odd columns of even and odd groups), summed
/// at the end. (Against the per-group sum then scale: 22.7 vs 17.7 G weights/s, one
/// token, group 32, `examples/dot_speed.rs`; four tokens 43.5 vs 34.8.)
///
/// # Safety
/// avx512f must be enabled in the caller; `w` readable for `cols / 2` bytes, `s` for
/// `2 * cols / group` bytes, each `xs[t]` for `cols` f32.
#[inline(always)]
unsafe fn i4_dot<const T: usize, const G: usize>(
    w: *const u8,
    s: *const u8,
    cols: usize,
    group: usize,
    xs: [*const f32; T],
) -> [f32; T] {
    // A group size known at compile time (G > 0) unrolls the group loop.
    let group = if G > 0 { G } else { group };
    // SAFETY: the caller's guarantees; every read is below cols / 2 bytes of w, below
    // the group count of s and below cols of each x.
    unsafe {
        let table = _mm512_setr_ps(
            -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
        );
        let groups = cols / group;
        let mut a = [[[_mm512_setzero_ps(); 2]; 2]; T];
        let mut g = 0;
        while g + 2 <= groups {
            // Both scales from one 4-byte read.
            let d = _mm512_set1_epi32(i32::from_le(s.add(2 * g).cast::<i32>().read_unaligned()));
            let s0 = _mm512_slli_epi32::<16>(d);
            let s1 = _mm512_and_si512(d, _mm512_set1_epi32(0xffff_0000_u32 as i32));
            let t0 = _mm512_mul_ps(table, _mm512_castsi512_ps(s0));
            let t1 = _mm512_mul_ps(table, _mm512_castsi512_ps(s1));
            i4_group::<T>(w, g * group, (g + 1) * group, t0, xs, &mut a, 0);
            i4_group::<T>(w, (g + 1) * group, (g + 2) * group, t1, xs, &mut a, 1);
            g += 2;
        }
        if g < groups {
            let t0 = _mm512_mul_ps(table, bf16_splat(s, g));
            i4_group::<T>(w, g * group, (g + 1) * group, t0, xs, &mut a, 0);
        }
        let mut out = [0.0f32; T];
        for (o, [[e0, o0], [e1, o1]]) in out.iter_mut().zip(a) {
            *o = Avx512::hsum(_mm512_add_ps(_mm512_add_ps(e0, o0), _mm512_add_ps(e1, o1)));
        }
        out
    }
}

/// One int4 group (columns `c0..c1`, a multiple of 32) through `table` (q = -8..7 times
/// the group's scale: exact, 4 by 8 significant bits): `q * s * x` added per token to
/// accumulators `a[t][j]` (even and odd columns apart). (A function, not a closure:
/// closures do not get the caller's target features, so their intrinsics would not
/// inline.)
///
/// # Safety
/// As [`i4_dot`].
#[inline(always)]
unsafe fn i4_group<const T: usize>(
    w: *const u8,
    c0: usize,
    c1: usize,
    table: __m512,
    xs: [*const f32; T],
    a: &mut [[[__m512; 2]; 2]; T],
    j: usize,
) {
    // SAFETY: as i4_dot (the caller's guarantees).
    unsafe {
        let mut c = c0;
        while c < c1 {
            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(w.add(c / 2).cast()));
            let lo = _mm512_permutexvar_ps(v, table);
            let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table);
            for (at, x) in a.iter_mut().zip(xs) {
                if let Some([e, o]) = at.get_mut(j) {
                    *e = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x.add(c)), *e);
                    *o = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x.add(c + 16)), *o);
                }
            }
            c += crate::act::I4_BLOCK;
        }
    }
}

/// bf16 scale `g` of `s`, in every lane.
///
/// # Safety
/// avx512f enabled in the caller; `s` readable for `2 * g + 2` bytes.
#[inline(always)]
unsafe fn bf16_splat(s: *const u8, g: usize) -> __m512 {
    // SAFETY: the caller's guarantees.
    unsafe {
        let bits = u32::from(u16::from_le(s.add(2 * g).cast::<u16>().read_unaligned()));
        _mm512_set1_ps(f32::from_bits(bits << 16))
    }
}

/// The 16-bit permute index that puts scale `(8 i) / group` of a 128-column step (0 for
/// groups of 128 or more) in the high half of 32-bit lane i. (Constants: built per row
/// call, the 16 divisions cost tiny-code-moe's 256-column rows 30% of a layer call.)
///
/// # Safety
/// avx512f enabled in the caller.
#[inline(always)]
pub(crate) unsafe fn scale_index(group: usize) -> __m512i {
    // Evaluated at compile time only: an index out of range fails the build.
    #[allow(clippy::indexing_slicing)]
    const fn index(group: usize) -> [u16; 32] {
        let mut sidx = [0u16; 32];
        let mut i = 0;
        while i < 16 {
            sidx[2 * i + 1] = if group < 128 {
                (8 * i / group) as u16
            } else {
                0
            };
            i += 1;
        }
        sidx
    }
    const G32: [u16; 32] = index(32);
    const G64: [u16; 32] = index(64);
    const G128: [u16; 32] = index(128);
    let sidx = match group {
        32 => &G32,
        64 => &G64,
        _ => &G128,
    };
    // SAFETY: 64 readable bytes; avx512f enabled in the caller.
    unsafe { _mm512_loadu_si512(sidx.as_ptr().cast()) }
}

/// q = -8..7 as bf16 bits, twice (a 16-bit permute indexes by the low 5 bits).
// Evaluated at compile time: an index out of range fails the build.
#[allow(clippy::indexing_slicing)]
const Q_BF16: [u16; 32] = {
    let mut tab = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        tab[i] = ((((i & 15) as f32) - 8.0).to_bits() >> 16) as u16;
        i += 1;
    }
    tab
};

/// `vpshufb` control putting the 16-bit scale `i / 4` (groups of 32: the step's four
/// scales in every 128-bit lane) in the high half of 32-bit lane i, zeroing the low half.
const SCALE_CTRL_32: [u32; 16] = scale_ctrl(4);
/// As [`SCALE_CTRL_32`] for groups of 64: scale `i / 8` of two.
const SCALE_CTRL_64: [u32; 16] = scale_ctrl(8);

/// The control of [`SCALE_CTRL_32`] for `lanes` 32-bit lanes per group.
// Evaluated at compile time only: an index out of range fails the build.
#[allow(clippy::indexing_slicing)]
const fn scale_ctrl(lanes: u32) -> [u32; 16] {
    let mut out = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        let j = i as u32 / lanes;
        out[i] = 0x8080 | (2 * j) << 16 | (2 * j + 1) << 24;
        i += 1;
    }
    out
}

/// The scales of the 128-column step at `c`, lane i holding that of columns 8i..8i+7.
///
/// # Safety
/// avx512f/bw/vl enabled in the caller; `s` readable for `2 * groups` bytes.
#[inline(always)]
unsafe fn step_scales(
    s: *const u8,
    c: usize,
    group: usize,
    groups: usize,
    sidx: __m512i,
) -> __m512 {
    // SAFETY: the masked load reads at most the step's groups, all below `groups`.
    unsafe {
        let g0 = c / group;
        let n = groups.saturating_sub(g0).min(4);
        let sc = _mm_maskz_loadu_epi16(((1u32 << n) - 1) as u8, s.add(2 * g0).cast());
        _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
            0xaaaa_aaaa,
            sidx,
            _mm512_castsi128_si512(sc),
        ))
    }
}

/// [`i4_dot`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must have avx512f; the rest as `i4_dot`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn dot_i4<const T: usize>(
    w: *const u8,
    s: *const u8,
    cols: usize,
    group: usize,
    xs: [*const f32; T],
) -> [f32; T] {
    // SAFETY: the features are enabled here; pointers as the caller guarantees.
    unsafe {
        if group == 32 {
            i4_dot::<T, 32>(w, s, cols, group, xs)
        } else {
            i4_dot::<T, 0>(w, s, cols, group, xs)
        }
    }
}

/// The AVX-512 BF16 int4 kernel's step ([`crate::i4_steps`]): an int4 row (`cols / 2`
/// bytes, `cols` a multiple of 128, bf16 scales, one per `group` of 32, 64 or a multiple
/// of 128) dotted with activation rows given as one exact bf16 plane in the int4 BF16
/// order ([`crate::act::Act`]), by the AVX-512 BF16 dot product: q in -8..7 is exact in bf16, so every product is exact. Each 64 bytes
/// (128 columns) are read once as 32 16-bit words; word j holds columns 4j..4j+3, and
/// a permute of 32 words through the table of q as bf16 (indexed by the low 5 bits,
/// the table repeats every 16) turns the word, and the word shifted by 4, 8, 12, into
/// columns 4j, 4j+1, 4j+2, 4j+3 as bf16 without unpacking. Lane i of the dot product
/// then sums columns 8i..8i+7 of the step, all of one group; the step's lanes are
/// scaled by their groups' scales and added (one FMA) to one of two accumulators (even
/// and odd steps), summed at the end. Groups of 32, 64 and 128 get their own loop,
/// whose step reads its scales with one plain load (no division, no masked load) and
/// places them with an in-lane byte shuffle: 43.6 vs 34.8 G weights/s, one token,
/// group 32 (`examples/dot_speed.rs`); the FMA instead of a multiply and an add is
/// 2% of that (four tokens: 81 vs 76).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bf16Steps;

impl I4Step for Bf16Steps {
    type X = u16;
    type Table = __m512i;

    #[inline(always)]
    unsafe fn table() -> __m512i {
        // SAFETY: 64 readable bytes; avx512f enabled in the caller.
        unsafe { _mm512_loadu_si512(Q_BF16.as_ptr().cast()) }
    }

    #[inline(always)]
    unsafe fn step<const T: usize, const G: usize>(
        w: *const u8,
        s: *const u8,
        c: usize,
        g: Groups,
        table: __m512i,
        sidx: __m512i,
        xs: [*const u16; T],
        acc: &mut [__m512; T],
    ) {
        // SAFETY: as `i4_steps::dots`.
        unsafe { i4_bf16_step::<1, T, G>(w, s, c, g, table, sidx, xs, acc) }
    }
}

/// [`Bf16Steps`]'s step for activations of `NP` planes (plane `p` at `xs[t] + p * cols`;
/// the kernels use one).
///
/// # Safety
/// As `i4_steps::dots`, `c` a multiple of 128 below `cols`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn i4_bf16_step<const NP: usize, const T: usize, const G: usize>(
    w: *const u8,
    s: *const u8,
    c: usize,
    (group, groups, cols, ahead): Groups,
    table: __m512i,
    sidx: __m512i,
    xs: [*const u16; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: as the caller's.
    unsafe {
        if ahead != 0 {
            prefetch(w.wrapping_add(c / 2 + ahead));
        }
        let v = _mm512_loadu_si512(w.add(c / 2).cast());
        let q = [
            bh(_mm512_permutexvar_epi16(v, table)),
            bh(_mm512_permutexvar_epi16(_mm512_srli_epi16::<4>(v), table)),
            bh(_mm512_permutexvar_epi16(_mm512_srli_epi16::<8>(v), table)),
            bh(_mm512_permutexvar_epi16(_mm512_srli_epi16::<12>(v), table)),
        ];
        let scale = lane_scales::<G>(s, c, group, groups, sidx);
        for (o, x) in acc.iter_mut().zip(xs) {
            let mut part = _mm512_setzero_ps();
            for (k, qk) in q.iter().enumerate() {
                for p in 0..NP {
                    part = _mm512_dpbf16_ps(part, *qk, load_bh(x.add(p * cols + c + 32 * k)));
                }
            }
            *o = _mm512_fmadd_ps(part, scale, *o);
        }
    }
}

/// The scales of the 128-column step at `c` of an int4 row, one per 32-bit lane (lane `i`:
/// columns `8i..8i+8` of the step, all of one group), as f32 (bf16 in the high half).
///
/// # Safety
/// avx512f and avx512bw enabled in the caller; `s` readable for `groups` bf16 scales;
/// `c` a multiple of 128 below `groups * group`; `sidx` = `scale_index(group)`.
#[inline(always)]
pub(crate) unsafe fn lane_scales<const G: usize>(
    s: *const u8,
    c: usize,
    group: usize,
    groups: usize,
    sidx: __m512i,
) -> __m512 {
    // SAFETY: the caller's guarantees (groups of 32/64/128 read the step's own 4/2/1
    // scales: c + 128 <= cols).
    unsafe {
        match G {
            // Groups of 32 (64): the step's 4 (2) scales in one 8-byte (4-byte) read,
            // broadcast, then moved to their lanes' high halves in-lane.
            32 => _mm512_castsi512_ps(_mm512_shuffle_epi8(
                _mm512_set1_epi64(s.add(2 * (c / 32)).cast::<i64>().read_unaligned()),
                _mm512_loadu_si512(SCALE_CTRL_32.as_ptr().cast()),
            )),
            64 => _mm512_castsi512_ps(_mm512_shuffle_epi8(
                _mm512_set1_epi32(s.add(2 * (c / 64)).cast::<i32>().read_unaligned()),
                _mm512_loadu_si512(SCALE_CTRL_64.as_ptr().cast()),
            )),
            128 => bf16_splat(s, c / 128),
            _ => step_scales(s, c, group, groups, sidx),
        }
    }
}

/// [`dot_bf16_planes`] of one activation row (one plane) with `out.len()` consecutive
/// bf16 rows of `cols` values from `w`, as `i4_steps::rows` (one row at a time: two or
/// four interleaved were slower on the CPU box's EPYC, 20-26 -> 12-19 GB/s at one thread,
/// and within the noise at 16 threads on the GPU box's Xeon; docs/benchmarks.md,
/// "Fourteenth session").
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512bf16; each row as `dot_bf16_planes`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn rows_bf16(
    w: *const u8,
    cols: usize,
    x: *const u16,
    stride: usize,
    out: &mut [f32],
) {
    let ahead = row_prefetch_ahead();
    // SAFETY: the features are enabled here; each row as the caller guarantees.
    unsafe {
        rows_of(out, |i| {
            if ahead != 0 {
                prefetch_span(w.wrapping_add(i * 2 * cols).wrapping_add(ahead), 2 * cols);
            }
            bf16_planes_dot::<1, 1>(w.add(i * 2 * cols), cols, [x], stride)
        })
    }
}

/// `out[i] = row(i)[0]` for every row.
#[inline(always)]
fn rows_of(out: &mut [f32], mut row: impl FnMut(usize) -> [f32; 1]) {
    for (i, o) in out.iter_mut().enumerate() {
        let [v] = row(i);
        *o = v;
    }
}

/// `out[i..i + R] = many(i)` for each whole block of `R` rows, then `out[i] = one(i)`
/// for the rows after the last block.
#[inline(always)]
pub(crate) fn rows_by<const R: usize>(
    out: &mut [f32],
    mut many: impl FnMut(usize) -> [f32; R],
    mut one: impl FnMut(usize) -> f32,
) {
    let (blocks, rest) = out.as_chunks_mut::<R>();
    let done = blocks.len() * R;
    for (b, block) in blocks.iter_mut().enumerate() {
        *block = many(b * R);
    }
    for (i, o) in rest.iter_mut().enumerate() {
        *o = one(done + i);
    }
}

/// [`dot_i4`] of one activation row (in the int4 order, f32) with `out.len()`
/// consecutive int4 rows laid out as in `i4_steps::I4Rows`, each result the bits
/// `dot_i4::<1>` gives for that row.
///
/// # Safety
/// The CPU must have avx512f; each row as `dot_i4` requires.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // reason: the rows' layout and the activation
pub(crate) unsafe fn rows_i4(
    w: *const u8,
    row_bytes: usize,
    s: *const u8,
    scale_bytes: usize,
    cols: usize,
    group: usize,
    x: *const f32,
    out: &mut [f32],
) {
    // SAFETY: the features are enabled here; each row as the caller guarantees.
    unsafe {
        let row = |i: usize| (w.add(i * row_bytes), s.add(i * scale_bytes));
        if group == 32 {
            rows_of(out, |i| {
                let (w, s) = row(i);
                i4_dot::<1, 32>(w, s, cols, group, [x])
            });
        } else {
            rows_of(out, |i| {
                let (w, s) = row(i);
                i4_dot::<1, 0>(w, s, cols, group, [x])
            });
        }
    }
}

/// `out[i]` = row `r0 + i` of int8 weights `w` (`cols` bytes a row, f32 row scales at
/// `s`) dotted with an 8-bit activation (`Act::with_q8`: `q`, and per 4 columns `neg`
/// = -128 x their q's sum and `scale`), `R` rows at a time. Per 64 columns and row: the
/// weights read as unsigned `q + 128` (`vpxord` 0x80) into one `vpdpbusd` against q,
/// started from `neg` (so each 32-bit lane is exactly its 4 columns' sum of q_w * q_x),
/// converted to f32 (exact: |sum| < 2^17) and multiplied-added with the lanes' scales;
/// at the end [`Avx512::hsum`] times the row's scale. A row's operations do not depend
/// on `R`.
///
/// # Safety
/// avx512f, avx512bw and avx512vnni must be available; `w` readable for
/// `(r0 + out.len()) * cols` bytes from row 0, `s` for as many f32, `q` for `cols`
/// values and `neg`, `scale` for `cols / 4`; `cols` a multiple of 64.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
#[allow(clippy::too_many_arguments)] // reason: the rows' layout and the prepared activation
pub(crate) unsafe fn rows_i8_q8(
    w: *const u8,
    s: *const u8,
    cols: usize,
    q: *const i8,
    neg: *const i32,
    scale: *const f32,
    r0: usize,
    out: &mut [f32],
    rows: usize,
) {
    let a = Q8Rows {
        w,
        s,
        cols,
        q,
        neg,
        scale,
        ahead: row_prefetch_ahead(),
    };
    // SAFETY (each closure): the caller's guarantee (features, bounds), passed on.
    let one = |i: usize| unsafe { q8_rows::<1>(&a, r0 + i)[0] };
    match rows {
        4 => rows_by::<4>(out, |i| unsafe { q8_rows::<4>(&a, r0 + i) }, one),
        2 => rows_by::<2>(out, |i| unsafe { q8_rows::<2>(&a, r0 + i) }, one),
        _ => rows_by::<1>(out, |i| [one(i)], one),
    }
}

/// [`rows_i8_q8`]'s arguments.
#[derive(Clone, Copy)]
struct Q8Rows {
    w: *const u8,
    s: *const u8,
    cols: usize,
    q: *const i8,
    neg: *const i32,
    scale: *const f32,
    ahead: usize,
}

/// [`rows_i8_q8`]'s kernel: rows `r..r + R` (their results in order).
///
/// # Safety
/// As [`rows_i8_q8`] for these rows.
#[inline(always)]
unsafe fn q8_rows<const R: usize>(a: &Q8Rows, r: usize) -> [f32; R] {
    // SAFETY: the caller's bounds and features.
    unsafe {
        let Q8Rows {
            w,
            s,
            cols,
            q,
            neg,
            scale,
            ahead,
        } = *a;
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut c = 0;
        while c < cols {
            let x = _mm512_loadu_si512(q.add(c).cast());
            let n = _mm512_loadu_si512(neg.add(c / 4).cast());
            let sc = _mm512_loadu_ps(scale.add(c / 4));
            for (k, a) in acc.iter_mut().enumerate() {
                let row = w.add((r + k) * cols + c);
                if ahead > 0 {
                    prefetch(row.wrapping_add(ahead));
                }
                let wv = _mm512_xor_si512(_mm512_loadu_si512(row.cast()), flip);
                let sum = _mm512_dpbusd_epi32(n, wv, x);
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, *a);
            }
            c += crate::act::Q8_STEP;
        }
        let mut out = [0.0f32; R];
        for (k, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            let row_scale: [u8; 4] = std::ptr::read_unaligned(s.add(4 * (r + k)).cast());
            *o = Avx512::hsum(a) * f32::from_le_bytes(row_scale);
        }
        out
    }
}

/// `out[i]` = row `r0 + i` of int4 weights `w` (`cols / 2` bytes a row, bf16 scales of
/// `group` columns at `s`) dotted with an 8-bit activation in the int4 VNNI order
/// (`Act::with_q4`: `q` the 128-column steps' even then odd q, `neg` per 8 columns -8
/// x their q's sum, `scale` per 8 columns the block's scale), `R` rows at a
/// time. Per 128 columns and row: the low and the high nibbles of 64 bytes as unsigned
/// bytes into two `vpdpbusd` against the even and the odd q, started from the -8 sums
/// (so each 32-bit lane is exactly its 8 columns' sum of q_w * q_x); converted to f32
/// and multiplied-added with (its group's scale x its block's scale); at the end
/// [`Avx512::hsum`]. A row's operations do not depend on `R`.
///
/// # Safety
/// avx512f, avx512bw, avx512vl and avx512vnni must be available; `w` readable for rows
/// `0..r0 + out.len()` of `cols / 2` bytes, `s` for their `cols / group` bf16 scales
/// each, `q` for `cols` bytes, `neg` and `scale` for `cols / 8` values; `cols` a
/// multiple of 128 and of `group`, `group` 32, 64 or a multiple of 128
/// (`act::q4_group`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[allow(clippy::too_many_arguments)] // reason: the rows' layout and the prepared activation
pub(crate) unsafe fn rows_i4_q4(
    w: *const u8,
    s: *const u8,
    cols: usize,
    group: usize,
    q: *const i8,
    neg: *const i32,
    scale: *const f32,
    r0: usize,
    out: &mut [f32],
    rows: usize,
) {
    let ahead = prefetch_ahead();
    let rows_of_k = Q4Rows {
        w,
        s,
        cols,
        group,
        q,
        neg,
        scale,
        ahead,
    };
    // SAFETY (each closure): the caller's guarantee (features, bounds), passed on.
    let one = |i: usize| unsafe { q4_rows::<1>(&rows_of_k, r0 + i)[0] };
    match rows {
        4 => rows_by::<4>(out, |i| unsafe { q4_rows::<4>(&rows_of_k, r0 + i) }, one),
        2 => rows_by::<2>(out, |i| unsafe { q4_rows::<2>(&rows_of_k, r0 + i) }, one),
        _ => rows_by::<1>(out, |i| [one(i)], one),
    }
}

/// [`rows_i4_q4`]'s arguments.
struct Q4Rows {
    w: *const u8,
    s: *const u8,
    cols: usize,
    group: usize,
    q: *const i8,
    neg: *const i32,
    scale: *const f32,
    ahead: usize,
}

/// [`rows_i4_q4`]'s kernel: rows `r..r + R` (their results in order).
///
/// # Safety
/// As [`rows_i4_q4`] for these rows.
#[inline(always)]
unsafe fn q4_rows<const R: usize>(a: &Q4Rows, r: usize) -> [f32; R] {
    // SAFETY: the caller's bounds and features.
    unsafe {
        let (cols, group) = (a.cols, a.group);
        let (rb, sb) = (cols / 2, cols / group * 2);
        let low = _mm512_set1_epi8(0x0f);
        // the step's scales (one per group in 128 columns, at most 4) and each 8-column
        // lane's among them
        let per_step = (crate::act::Q4_STEP / group).max(1);
        let mask: __mmask8 = (1u8 << per_step) - 1;
        let mut lane = [0i32; 16];
        for (l, v) in lane.iter_mut().enumerate() {
            *v = (8 * l / group) as i32 % per_step as i32;
        }
        let which = _mm512_loadu_si512(lane.as_ptr().cast());
        let mut acc = [_mm512_setzero_ps(); R];
        let mut c = 0;
        while c < cols {
            let xe = _mm512_loadu_si512(a.q.add(c).cast());
            let xo = _mm512_loadu_si512(a.q.add(c + 64).cast());
            let n = _mm512_loadu_si512(a.neg.add(c / 8).cast());
            let sx = _mm512_loadu_ps(a.scale.add(c / 8));
            for (k, acc_k) in acc.iter_mut().enumerate() {
                let row = a.w.add((r + k) * rb + c / 2);
                if a.ahead > 0 {
                    prefetch(row.wrapping_add(a.ahead));
                }
                let wv = _mm512_loadu_si512(row.cast());
                let lo = _mm512_and_si512(wv, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), low);
                let sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(n, lo, xe), hi, xo);
                let sp = a.s.add((r + k) * sb + 2 * (c / group));
                let s16 = _mm_maskz_loadu_epi16(mask, sp.cast());
                let sw = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                    _mm256_castsi128_si256(s16),
                )));
                let ls = _mm512_mul_ps(_mm512_permutexvar_ps(which, sw), sx);
                *acc_k = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ls, *acc_k);
            }
            c += crate::act::Q4_STEP;
        }
        let mut out = [0.0f32; R];
        for (o, v) in out.iter_mut().zip(acc) {
            *o = Avx512::hsum(v);
        }
        out
    }
}
