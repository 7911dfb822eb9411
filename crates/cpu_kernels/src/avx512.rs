//! AVX-512 (F): 16 f32 lanes in a `__m512`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

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
