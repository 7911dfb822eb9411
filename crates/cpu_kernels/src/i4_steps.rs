//! The int4 kernels of 128-column steps, written once over their step: the AVX-512 BF16
//! kernel (`avx512::Bf16Steps`) and the lanes kernel of Intel CPUs (`i4_lanes::Lanes`).
//! A step reads a row's 64 bytes (128 columns) and adds, per token, the sums of its 16
//! lanes (lane `i`: columns `8i..8i+8` of the step, all of one group) times their
//! groups' scales into an accumulator; the row's two accumulators (even and odd steps)
//! are summed at the end. This module holds the loop over steps and rows, the rows
//! kernels' loop over a task's rows and the dispatch on group size and rows at once.
//!
//! Both kernels are only chosen on AVX-512 BF16 CPUs (`isa.rs`), so everything here is
//! compiled for that feature set.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::avx512::{prefetch_ahead, rows_by, scale_index, Avx512};
use crate::simd::{array_of, Simd};

/// Columns per step.
pub(crate) const STEP: usize = 128;

/// One kernel's step.
pub(crate) trait I4Step {
    /// An activation value in the kernel's column order.
    type X: Copy;
    /// What the step reads besides the row and the activation, made once per call.
    type Table: Copy;

    /// The table.
    ///
    /// # Safety
    /// avx512f enabled in the caller.
    unsafe fn table() -> Self::Table;

    /// The step at column `c` of row `w` (scales `s`): per token `t`, the lanes' sums of
    /// q * x times their groups' scales, added to `acc[t]`.
    ///
    /// # Safety
    /// As [`dots`]; `c` a multiple of [`STEP`] below `cols`.
    #[allow(clippy::too_many_arguments)] // reason: the row, the step and the call's constants
    unsafe fn step<const T: usize, const G: usize>(
        w: *const u8,
        s: *const u8,
        c: usize,
        g: Groups,
        table: Self::Table,
        sidx: __m512i,
        xs: [*const Self::X; T],
        acc: &mut [__m512; T],
    );
}

/// A row's groups and reading: (group, groups per row, columns, prefetch distance).
pub(crate) type Groups = (usize, usize, usize, usize);

/// `sum_g scale_g * sum_{c in g} q[c] * x[c]` of `R` int4 rows (`w[r]`, `cols / 2` bytes;
/// bf16 scales `s[r]`, one per `group`) with `T` activation rows (`xs[t]`, `cols`
/// values in `K`'s order). Each (row, token) result gets the same operations in the same
/// order whatever `R` and `T` are: the rows' steps are only interleaved, so that one
/// row's chains of dependent operations overlap the others'.
///
/// # Safety
/// avx512f, avx512bw, avx512vl and avx512bf16 enabled in the caller; `cols` a multiple
/// of [`STEP`] and of `group`, `group` 32, 64 or a multiple of 128 (`G` = `group` for 32,
/// 64, 128, else 0); `w[r]` readable for `cols / 2` bytes, `s[r]` for `2 * cols / group`,
/// `xs[t]` for `cols` values.
#[inline(always)]
pub(crate) unsafe fn dots<K: I4Step, const R: usize, const T: usize, const G: usize>(
    w: [*const u8; R],
    s: [*const u8; R],
    cols: usize,
    group: usize,
    xs: [*const K::X; T],
) -> [[f32; T]; R] {
    // SAFETY: the caller's guarantees; the steps read below cols / 2 bytes of each w,
    // the group count of each s and cols values of each x.
    unsafe {
        let table = K::table();
        let sidx = scale_index(group);
        let g = (group, cols / group, cols, prefetch_ahead());
        let mut a0 = [[_mm512_setzero_ps(); T]; R];
        let mut a1 = [[_mm512_setzero_ps(); T]; R];
        let rows = || w.into_iter().zip(s);
        let mut c = 0;
        while c + 2 * STEP <= cols {
            for ((w, s), acc) in rows().zip(a0.iter_mut()) {
                K::step::<T, G>(w, s, c, g, table, sidx, xs, acc);
            }
            for ((w, s), acc) in rows().zip(a1.iter_mut()) {
                K::step::<T, G>(w, s, c + STEP, g, table, sidx, xs, acc);
            }
            c += 2 * STEP;
        }
        if c < cols {
            for ((w, s), acc) in rows().zip(a0.iter_mut()) {
                K::step::<T, G>(w, s, c, g, table, sidx, xs, acc);
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

/// [`dots`] of one row with `T` activation rows.
///
/// # Safety
/// The CPU must have AVX-512 BF16 (with F, BW, VL); the rest as [`dots`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn dot<K: I4Step, const T: usize>(
    w: *const u8,
    s: *const u8,
    cols: usize,
    group: usize,
    xs: [*const K::X; T],
) -> [f32; T] {
    // SAFETY: the features are enabled here; pointers as the caller guarantees.
    let [out] = unsafe {
        match group {
            32 => dots::<K, 1, T, 32>([w], [s], cols, group, xs),
            64 => dots::<K, 1, T, 64>([w], [s], cols, group, xs),
            128 => dots::<K, 1, T, 128>([w], [s], cols, group, xs),
            _ => dots::<K, 1, T, 0>([w], [s], cols, group, xs),
        }
    };
    out
}

/// An int4 rows kernel's rows and activation: row `i` at `w + i * row_bytes`, its bf16
/// scales (one per `group` of `cols`) at `s + i * scale_bytes`, the activation `x`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct I4Rows<X> {
    pub(crate) w: *const u8,
    pub(crate) row_bytes: usize,
    pub(crate) s: *const u8,
    pub(crate) scale_bytes: usize,
    pub(crate) cols: usize,
    pub(crate) group: usize,
    pub(crate) x: *const X,
}

impl<X> I4Rows<X> {
    /// Row `i`'s weights and scales.
    #[inline(always)]
    fn at(&self, i: usize) -> (*const u8, *const u8) {
        (
            self.w.wrapping_add(i * self.row_bytes),
            self.s.wrapping_add(i * self.scale_bytes),
        )
    }
}

/// [`dot`] of one activation row with each of `out.len()` consecutive rows, `at_once`
/// (4, 2, else 1) rows at a time ([`crate::Dot::with_rows`]); each row's result the bits
/// `dot::<K, 1>` gives it. One call for a task's rows instead of one per row: a
/// 768-column down row is ~25 ns of reading, and the dispatch per row (bounds, checks,
/// the call, the table) cost about as much again.
///
/// # Safety
/// The CPU must have AVX-512 BF16 (with F, BW, VL); each row as [`dot`] requires.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn rows<K: I4Step>(rows: I4Rows<K::X>, out: &mut [f32], at_once: usize) {
    // SAFETY: the features are enabled here; each row as the caller guarantees.
    unsafe {
        match (rows.group, at_once) {
            (32, 4) => rows_of::<K, 32, 4>(rows, out),
            (32, 2) => rows_of::<K, 32, 2>(rows, out),
            (32, _) => rows_of::<K, 32, 1>(rows, out),
            (64, 4) => rows_of::<K, 64, 4>(rows, out),
            (64, 2) => rows_of::<K, 64, 2>(rows, out),
            (64, _) => rows_of::<K, 64, 1>(rows, out),
            (128, 4) => rows_of::<K, 128, 4>(rows, out),
            (128, 2) => rows_of::<K, 128, 2>(rows, out),
            (128, _) => rows_of::<K, 128, 1>(rows, out),
            (_, 4) => rows_of::<K, 0, 4>(rows, out),
            (_, 2) => rows_of::<K, 0, 2>(rows, out),
            _ => rows_of::<K, 0, 1>(rows, out),
        }
    }
}

/// [`rows`] for groups `G`, `R` rows at a time.
///
/// # Safety
/// As [`rows`]. (Its own features, not `inline(always)`: closures get the features of
/// the function they are written in.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
unsafe fn rows_of<K: I4Step, const G: usize, const R: usize>(rows: I4Rows<K::X>, out: &mut [f32]) {
    let (cols, group, x) = (rows.cols, rows.group, rows.x);
    let one = |i: usize| {
        let (w, s) = rows.at(i);
        // SAFETY: row i is valid (the caller's guarantee).
        unsafe { dots::<K, 1, 1, G>([w], [s], cols, group, [x])[0][0] }
    };
    if R == 1 {
        // The plain row loop: through `rows_by` one row at a time measured ~6% slower on
        // the CPU box's EPYC (six rounds of a one-thread call).
        for (i, o) in out.iter_mut().enumerate() {
            *o = one(i);
        }
        return;
    }
    rows_by::<R>(
        out,
        |i| {
            let ws: [*const u8; R] = array_of(std::ptr::null(), |k| rows.at(i + k).0);
            let ss: [*const u8; R] = array_of(std::ptr::null(), |k| rows.at(i + k).1);
            // SAFETY: rows i..i + R are valid (`rows_by` asks for whole blocks only).
            unsafe { dots::<K, R, 1, G>(ws, ss, cols, group, [x]) }.map(|[o]| o)
        },
        one,
    );
}
