//! The int4 kernel of Intel CPUs: nibbles to f32 by a permute, then FMAs.
//!
//! A 128-column step reads the row's 64 bytes as sixteen 32-bit lanes; lane `d` holds
//! columns `8d..8d+8` of the step, one per nibble (column `8d + k` in bits `4k..4k+4`:
//! the file's order, element `2j` in the low nibble of byte `j`). `vpermps` reads only
//! the low 4 bits of each lane's index, so the lanes shifted right by `4k` index the
//! table -8..7 straight to the f32 values of columns `8d + k`: eight shift-and-permutes
//! per step, no masking. The activation comes in the matching order ([`crate::Act`]'s
//! int4 lanes order: per step, the values of columns `8d + k` for `d` = 0..16, for
//! `k` = 0..8), so each permute meets one 16-value load of it in an FMA. Per token,
//! columns `8d + k` of even `k` and of odd `k` are summed in two chains, added, and the
//! lanes' sum scaled by their groups' scales into one of two accumulators (even and odd
//! steps), as the BF16 kernel does (`avx512::Bf16Steps`: the same lanes, the same
//! scales; the loops over steps and rows are theirs, `i4_steps.rs`).
//!
//! Why: the GPU box's Xeon runs the AVX-512 BF16 dot product at 0.46 per cycle, where
//! FMAs run at ~1.8 and permutes at 1 (`examples/core_probe.rs`), and the BF16 int4
//! kernel computed ~16-20 G weights/s per core there (docs/benchmarks.md, "Fourteenth
//! session"). On the CPU box's EPYC every one of them runs at 1 per cycle and the BF16
//! kernel, with half the instructions, stays.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::avx512::{lane_scales, prefetch};
use crate::i4_steps::{Groups, I4Step};

/// q = nibble - 8 as f32, indexed by the nibble.
const TABLE: [f32; 16] = [
    -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
];

/// The lanes kernel's step ([`crate::i4_steps`]), activations in the lanes order (f32).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes;

impl I4Step for Lanes {
    type X = f32;
    type Table = __m512;

    #[inline(always)]
    unsafe fn table() -> __m512 {
        // SAFETY: 16 readable f32; avx512f enabled in the caller.
        unsafe { _mm512_loadu_ps(TABLE.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn step<const T: usize, const G: usize>(
        w: *const u8,
        s: *const u8,
        c: usize,
        (group, groups, _, ahead): Groups,
        table: __m512,
        sidx: __m512i,
        xs: [*const f32; T],
        acc: &mut [__m512; T],
    ) {
        // SAFETY: as `i4_steps::dots`.
        unsafe {
            if ahead != 0 {
                prefetch(w.wrapping_add(c / 2 + ahead));
            }
            let v = _mm512_loadu_si512(w.add(c / 2).cast());
            let q = [
                _mm512_permutexvar_ps(v, table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<8>(v), table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<12>(v), table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<16>(v), table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<20>(v), table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<24>(v), table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<28>(v), table),
            ];
            let scale = lane_scales::<G>(s, c, group, groups, sidx);
            for (o, x) in acc.iter_mut().zip(xs) {
                let xk = |k: usize| _mm512_loadu_ps(x.add(c + 16 * k));
                let [q0, q1, q2, q3, q4, q5, q6, q7] = q;
                let even = _mm512_mul_ps(q0, xk(0));
                let even = _mm512_fmadd_ps(q2, xk(2), even);
                let even = _mm512_fmadd_ps(q4, xk(4), even);
                let even = _mm512_fmadd_ps(q6, xk(6), even);
                let odd = _mm512_mul_ps(q1, xk(1));
                let odd = _mm512_fmadd_ps(q3, xk(3), odd);
                let odd = _mm512_fmadd_ps(q5, xk(5), odd);
                let odd = _mm512_fmadd_ps(q7, xk(7), odd);
                *o = _mm512_fmadd_ps(_mm512_add_ps(even, odd), scale, *o);
            }
        }
    }
}
