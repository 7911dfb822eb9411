//! AVX2 + FMA + F16C: 8 f32 lanes in a `__m256`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::simd::Simd;

/// 8 lanes in a `__m256`; only used where AVX2, FMA and F16C were detected.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2;

// SAFETY: every method is only called from `dot_avx2` (target features avx2, fma, f16c),
// which is only called after runtime detection of those features; loads read W
// elements from pointers the caller guarantees valid.
unsafe impl Simd for Avx2 {
    const W: usize = 8;
    type V = __m256;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX is available (see the impl's contract).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        // SAFETY: as above.
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        // SAFETY: 8 readable f32 at p (caller); unaligned load.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes at p (caller); bf16 -> f32 is a 16-bit shift.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes at p (caller); F16C is available.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> __m256 {
        // SAFETY: 8 readable bytes at p (caller).
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn load_i4(p: *const u8) -> __m256 {
        // SAFETY: 4 readable bytes at p (caller). Low nibbles are even elements, high
        // nibbles odd ones: interleaving the two byte vectors restores element order.
        unsafe {
            let b = _mm_cvtsi32_si128(p.cast::<i32>().read_unaligned());
            let m = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(b, m);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m);
            let n = _mm_unpacklo_epi8(lo, hi);
            let q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(n), _mm256_set1_epi32(8));
            _mm256_cvtepi32_ps(q)
        }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: FMA is available.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn hsum(a: __m256) -> f32 {
        // SAFETY: AVX/SSE are available.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
}

/// [`crate::simd::dot`] compiled for AVX2 + FMA + F16C.
///
/// # Safety
/// The CPU must have avx2, fma and f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_avx2(p: &crate::format::Proj<'_>, r: usize, x: &[f32]) -> f32 {
    // SAFETY: the features are enabled here (caller's guarantee).
    unsafe { crate::simd::dot::<Avx2>(p, r, x) }
}

/// [`crate::simd::dots`] on Avx2.
///
/// # Safety
/// The CPU must have the features enabled here.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dots_avx2(
    p: &crate::format::Proj<'_>,
    r: usize,
    xs: [&[f32]; crate::simd::TOKENS],
) -> [f32; crate::simd::TOKENS] {
    // SAFETY: the features are enabled here (caller's guarantee).
    unsafe { crate::simd::dots::<Avx2>(p, r, xs) }
}
