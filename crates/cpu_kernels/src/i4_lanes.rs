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
//! steps), as the BF16 kernel does (`avx512::i4_bf16_dot`: the same lanes, the same
//! scales).
//!
//! Why: the GPU box's Xeon runs the AVX-512 BF16 dot product at 0.46 per cycle, where
//! FMAs run at ~1.8 and permutes at 1 (`examples/core_probe.rs`), and the BF16 int4
//! kernel computed ~16-20 G weights/s per core there (docs/benchmarks.md, "Fourteenth
//! session"). On the CPU box's EPYC every one of them runs at 1 per cycle and the BF16
//! kernel, with half the instructions, stays.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::avx512::{
    by_group_and_rows, lane_scales, prefetch, prefetch_ahead, rows_by, scale_index, Avx512, I4Rows,
};
use crate::simd::Simd;

/// Columns per step.
pub(crate) const STEP: usize = 128;

/// q = nibble - 8 as f32, indexed by the nibble.
const TABLE: [f32; 16] = [
    -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
];

/// `sum_g scale_g * sum_{c in g} q[c] * x[c]` of `R` int4 rows (`w[r]`, `cols / 2`
/// bytes; bf16 scales `s[r]`, one per `group`) with `T` activation rows in the lanes
/// order (`xs[t]`, `cols` f32). Each (row, token) result gets the same operations in
/// the same order whatever `R` and `T` are: one row and one token is the reference.
///
/// # Safety
/// avx512f, avx512bw and avx512vl enabled in the caller; `cols` a multiple of [`STEP`] and of
/// `group`, `group` 32, 64 or a multiple of 128 (`G` = `group` for 32, 64, 128, else
/// 0); `w[r]` readable for `cols / 2` bytes, `s[r]` for `2 * cols / group`, `xs[t]` for
/// `cols` f32.
#[inline(always)]
unsafe fn dots<const R: usize, const T: usize, const G: usize>(
    w: [*const u8; R],
    s: [*const u8; R],
    cols: usize,
    group: usize,
    xs: [*const f32; T],
) -> [[f32; T]; R] {
    // SAFETY: the caller's guarantees; every read is below cols / 2 bytes of each w,
    // the group count of each s and cols values of each x.
    unsafe {
        let table = _mm512_loadu_ps(TABLE.as_ptr());
        let sidx = scale_index(group);
        let g = (group, cols / group, prefetch_ahead());
        let mut a0 = [[_mm512_setzero_ps(); T]; R];
        let mut a1 = [[_mm512_setzero_ps(); T]; R];
        let rows = || w.into_iter().zip(s);
        let mut c = 0;
        while c + 2 * STEP <= cols {
            for ((w, s), acc) in rows().zip(a0.iter_mut()) {
                step::<T, G>(w, s, c, g, (table, sidx), xs, acc);
            }
            for ((w, s), acc) in rows().zip(a1.iter_mut()) {
                step::<T, G>(w, s, c + STEP, g, (table, sidx), xs, acc);
            }
            c += 2 * STEP;
        }
        if c < cols {
            for ((w, s), acc) in rows().zip(a0.iter_mut()) {
                step::<T, G>(w, s, c, g, (table, sidx), xs, acc);
            }
        }
        let mut out = [[0.0f32; T]; R];
        for ((row, r0), r1) in out.iter_mut().zip(a0).zip(a1) {
            for ((o, x0), x1) in row.iter_mut().zip(r0).zip(r1) {
                *o = Avx512::hsum(_mm512_add_ps(x0, x1));
            }
        }
        out
    }
}

/// One step of [`dots`] for one row: per token, the lanes' sums times their scales,
/// added to `acc`.
///
/// # Safety
/// As [`dots`], `c` a multiple of [`STEP`] below `cols`.
#[inline(always)]
unsafe fn step<const T: usize, const G: usize>(
    w: *const u8,
    s: *const u8,
    c: usize,
    (group, groups, ahead): (usize, usize, usize),
    (table, sidx): (__m512, __m512i),
    xs: [*const f32; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: as dots.
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

/// [`dots`] of one row with `T` activation rows.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vl (groups of 256 and more read their
/// scales with a masked 128-bit load); the rest as [`dots`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dot<const T: usize>(
    w: *const u8,
    s: *const u8,
    cols: usize,
    group: usize,
    xs: [*const f32; T],
) -> [f32; T] {
    // SAFETY: the features are enabled here; pointers as the caller guarantees.
    let [out] = unsafe {
        match group {
            32 => dots::<1, T, 32>([w], [s], cols, group, xs),
            64 => dots::<1, T, 64>([w], [s], cols, group, xs),
            128 => dots::<1, T, 128>([w], [s], cols, group, xs),
            _ => dots::<1, T, 0>([w], [s], cols, group, xs),
        }
    };
    out
}

/// [`dot`] of one activation row with each of `out.len()` consecutive rows, `at_once`
/// (4, 2, else 1) rows at a time; each row's result the bits `dot::<1>` gives it.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vl; each row as [`dot`] requires.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn rows(rows: I4Rows<f32>, out: &mut [f32], at_once: usize) {
    // SAFETY: the features are enabled here; each row as the caller guarantees.
    unsafe { by_group_and_rows!(rows_of, rows, out, at_once) }
}

/// [`rows`] for groups `G`, `R` rows at a time.
///
/// # Safety
/// As [`rows`]. (Its own features, not `inline(always)`: closures get the features of
/// the function they are written in.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn rows_of<const G: usize, const R: usize>(rows: I4Rows<f32>, out: &mut [f32]) {
    let (cols, group, x) = (rows.cols, rows.group, rows.x);
    let at = |i: usize| rows.at(i);
    let one = |i: usize| {
        let (w, s) = at(i);
        // SAFETY: row i is valid (the caller's guarantee).
        unsafe { dots::<1, 1, G>([w], [s], cols, group, [x])[0][0] }
    };
    if R == 1 {
        // The plain row loop, as `avx512::i4_bf16_rows` (measured faster than `rows_by`).
        for (i, o) in out.iter_mut().enumerate() {
            *o = one(i);
        }
        return;
    }
    rows_by::<R>(
        out,
        |i| {
            let ws: [*const u8; R] = crate::simd::array_of(std::ptr::null(), |k| at(i + k).0);
            let ss: [*const u8; R] = crate::simd::array_of(std::ptr::null(), |k| at(i + k).1);
            // SAFETY: rows i..i + R are valid (`rows_by` asks for whole blocks only).
            unsafe { dots::<R, 1, G>(ws, ss, cols, group, [x]) }.map(|[o]| o)
        },
        one,
    );
}
