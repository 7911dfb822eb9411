//! The prompt path: an expert with many tokens in one layer call (a prompt) runs as a
//! small matrix product instead of row dot products. A block of weight rows is widened
//! once into an f32 tile laid out column by column (`tile[c][j]` = row j's column c:
//! bf16/f16/f32 exactly, int8 as q with the row's f32 scale applied to the sum, int4 as
//! q * group scale, exact in f32), then an AVX-512 micro-kernel keeps 4 x 16 rows by 6
//! tokens of sums in registers and, per column, loads 4 weight vectors and broadcasts
//! each token's value into 24 fused multiply-adds. Nothing is summed across lanes, so
//! the row dot products' horizontal sums (one per row and token: a down row of
//! tiny-code-moe has only 4 vectors of columns) are gone.
//!
//! Numerics: every output `(row, token)` is one lane's chain of fused multiply-adds over
//! the columns in order from 0 (then x the int8 row scale): it does not depend on the
//! row block, the token block, the task split or the thread, so resident and streamed
//! calls, at any thread count, give the same bits. It differs from the row dot products
//! by summation order and rounding only, within the vector paths' tolerance against the
//! scalar reference (`tests/kernels.rs`).

use crate::format::{bf16_to_f32, f16_to_f32, Proj, WeightKind};
use crate::scalar::silu;

/// Rows of one weight vector.
pub(crate) const LANES: usize = 16;
/// Weight vectors per micro-kernel step (rows of a block: 64; gate/up: 32 + 32).
const RV: usize = 4;
/// Tokens per micro-kernel step.
pub(crate) const TB: usize = 6;
/// Tile columns: rows of one block.
pub(crate) const BLOCK: usize = RV * LANES;
/// Rows of gate (and of up) in one gate/up block.
pub(crate) const HALF: usize = BLOCK / 2;

/// Row `r` of `p` widened to f32 into `out` (`p.cols` values): exact for the raw kinds,
/// q for int8, q * the group's scale for int4.
#[inline(always)]
fn widen(p: &Proj<'_>, r: usize, out: &mut [f32]) {
    let w = p.row(r);
    match p.kind {
        WeightKind::F32 => {
            for (o, b) in out.iter_mut().zip(w.chunks_exact(4)) {
                *o = f32::from_le_bytes([
                    b.first().copied().unwrap_or(0),
                    b.get(1).copied().unwrap_or(0),
                    b.get(2).copied().unwrap_or(0),
                    b.get(3).copied().unwrap_or(0),
                ]);
            }
        }
        WeightKind::Bf16 => {
            for (o, b) in out.iter_mut().zip(w.chunks_exact(2)) {
                if let &[lo, hi] = b {
                    *o = bf16_to_f32(u16::from_le_bytes([lo, hi]));
                }
            }
        }
        WeightKind::F16 => {
            for (o, b) in out.iter_mut().zip(w.chunks_exact(2)) {
                if let &[lo, hi] = b {
                    *o = f16_to_f32(u16::from_le_bytes([lo, hi]));
                }
            }
        }
        WeightKind::Int8 => {
            for (o, &q) in out.iter_mut().zip(w) {
                *o = f32::from(i8::from_le_bytes([q]));
            }
        }
        WeightKind::Int4 { group } => {
            let s = p.row_scales(r);
            let half = group.max(2) / 2;
            for ((og, wg), sg) in out
                .chunks_mut(group.max(1))
                .zip(w.chunks(half))
                .zip(s.chunks_exact(2))
            {
                let scale = match sg {
                    &[lo, hi] => bf16_to_f32(u16::from_le_bytes([lo, hi])),
                    _ => 0.0,
                };
                for (o2, &b) in og.chunks_exact_mut(2).zip(wg) {
                    if let [lo, hi] = o2 {
                        *lo = f32::from((b & 0x0f) as i8 - 8) * scale;
                        *hi = f32::from((b >> 4) as i8 - 8) * scale;
                    }
                }
            }
        }
    }
}

/// The f32 scale each row's sum is multiplied by: int8's row scale, else 1 (exact).
fn row_scale(p: &Proj<'_>, r: usize) -> f32 {
    match p.kind {
        WeightKind::Int8 => crate::format::le_f32(p.row_scales(r), 0),
        _ => 1.0,
    }
}

/// Widens rows `r0..r0 + n` of `p` into tile columns `off..off + n` (`tile[c * BLOCK +
/// off + j]`); `rows` is scratch of [`LANES`] x `p.cols` values. Sixteen rows at a
/// time are widened row by row, then transposed 16 x 16 in registers.
///
/// # Safety
/// AVX-512F available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn fill(p: &Proj<'_>, r0: usize, n: usize, tile: &mut [f32], off: usize, rows: &mut [f32]) {
    let cols = p.cols;
    let main = cols - cols % LANES;
    let mut j0 = 0;
    while j0 < n {
        let nj = LANES.min(n - j0);
        for (j, row) in rows.chunks_exact_mut(cols.max(1)).enumerate() {
            if j < nj {
                widen(p, r0 + j0 + j, row);
            } else {
                row.fill(0.0);
            }
        }
        if rows.len() >= LANES * cols && tile.len() >= cols * BLOCK && off + j0 + LANES <= BLOCK {
            let mut c = 0;
            while c < main {
                // SAFETY: 16 rows of `cols` values from column c < main, and 16 tile rows
                // of BLOCK from row c at column off + j0 + 16 <= BLOCK (checked above).
                unsafe {
                    transpose16(
                        rows.as_ptr().add(c),
                        cols,
                        tile.as_mut_ptr().add(c * BLOCK + off + j0),
                        BLOCK,
                    );
                }
                c += LANES;
            }
        }
        for (j, row) in rows.chunks_exact(cols.max(1)).take(nj).enumerate() {
            for (d, &v) in tile
                .iter_mut()
                .skip(main * BLOCK + off + j0 + j)
                .step_by(BLOCK)
                .zip(row.iter().skip(main))
            {
                *d = v;
            }
        }
        j0 += nj;
    }
}

/// `dst[c * ds + j] = src[j * ss + c]` for 16 x 16 values.
///
/// # Safety
/// AVX-512F available; both blocks valid.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::indexing_slicing)] // indices from loops bounded below 16, unrolled
unsafe fn transpose16(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's guarantee.
    unsafe {
        let mut r = [_mm512_setzero_ps(); 16];
        let mut q = src;
        for v in &mut r {
            *v = _mm512_loadu_ps(q);
            q = q.add(ss);
        }
        let mut t = [_mm512_setzero_ps(); 16];
        for k in 0..8 {
            t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
        }
        let pd = _mm512_castps_pd;
        for k in 0..4 {
            let b = 4 * k;
            r[b] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[b]), pd(t[b + 2])));
            r[b + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[b]), pd(t[b + 2])));
            r[b + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[b + 1]), pd(t[b + 3])));
            r[b + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[b + 1]), pd(t[b + 3])));
        }
        for h in 0..2 {
            let b = 8 * h;
            for k in 0..4 {
                t[b + k] = _mm512_shuffle_f32x4::<0x88>(r[b + k], r[b + 4 + k]);
                t[b + 4 + k] = _mm512_shuffle_f32x4::<0xdd>(r[b + k], r[b + 4 + k]);
            }
        }
        for k in 0..8 {
            r[k] = _mm512_shuffle_f32x4::<0x88>(t[k], t[k + 8]);
            r[k + 8] = _mm512_shuffle_f32x4::<0xdd>(t[k], t[k + 8]);
        }
        let mut d = dst;
        for v in &r {
            _mm512_storeu_ps(d, *v);
            d = d.add(ds);
        }
    }
}

/// Scratch of one task: the tile, one widened row, the micro-kernel's sums.
pub(crate) struct Scratch {
    tile: crate::act::Aligned<f32>,
    rows: Vec<f32>,
    acc: crate::act::Aligned<f32>,
}

impl Scratch {
    fn new(cols: usize) -> Self {
        Self {
            tile: crate::act::Aligned::zeroed(cols * BLOCK),
            rows: vec![0.0; LANES * cols],
            acc: crate::act::Aligned::zeroed(TB * BLOCK),
        }
    }

    /// Runs `f` on this thread's scratch for `cols` columns (kept between tasks and
    /// calls: a fresh 80 KiB per task was allocated and faulted in again and again).
    pub(crate) fn with<T>(cols: usize, f: impl FnOnce(&mut Scratch) -> T) -> T {
        thread_local! {
            static KEPT: std::cell::RefCell<Vec<Scratch>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        KEPT.with(|kept| {
            let mut kept = kept.borrow_mut();
            let at = kept.iter().position(|s| s.rows.len() == LANES * cols);
            let mut s = match at {
                Some(at) => kept.swap_remove(at),
                None => Scratch::new(cols),
            };
            drop(kept);
            let out = f(&mut s);
            KEPT.with(|kept| {
                let mut kept = kept.borrow_mut();
                if kept.len() < 4 {
                    kept.push(s);
                }
            });
            out
        })
    }
}

/// `acc[t][0..BLOCK]` = tile (`cols` x [`BLOCK`]) times each token row of `xs` (up to
/// [`TB`] rows of `cols` values), on AVX-512.
///
/// # Safety
/// AVX-512F available; `tile` holds `cols * BLOCK` values, every `xs` row `cols`, `acc`
/// `TB * BLOCK`.
#[cfg(target_arch = "x86_64")]
unsafe fn product(tile: &[f32], cols: usize, xs: &[&[f32]], acc: &mut [f32]) {
    let t = tile.as_ptr();
    let o = acc.as_mut_ptr();
    macro_rules! go {
        ($n:literal) => {{
            let mut p = [std::ptr::null::<f32>(); $n];
            for (d, x) in p.iter_mut().zip(xs) {
                *d = x.as_ptr();
            }
            // SAFETY: the caller's guarantee.
            unsafe { micro::<$n>(t, cols, p, o) }
        }};
    }
    match xs.len() {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        _ => go!(6),
    }
}

/// The micro-kernel: `N` tokens x [`RV`] vectors of rows, one lane per (row, token), a
/// fused multiply-add per column in column order.
///
/// # Safety
/// As [`product`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro<const N: usize>(tile: *const f32, cols: usize, xs: [*const f32; N], out: *mut f32) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's guarantee (pointers valid for the reads and writes below).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); RV]; N];
        let mut wt = tile;
        for c in 0..cols {
            let mut w = [_mm512_setzero_ps(); RV];
            let mut q = wt;
            for v in &mut w {
                *v = _mm512_load_ps(q);
                q = q.add(LANES);
            }
            for (a, x) in acc.iter_mut().zip(xs) {
                let b = _mm512_set1_ps(*x.add(c));
                for (s, &wv) in a.iter_mut().zip(&w) {
                    *s = _mm512_fmadd_ps(wv, b, *s);
                }
            }
            wt = wt.add(BLOCK);
        }
        let mut d = out;
        for a in &acc {
            for &s in a {
                _mm512_store_ps(d, s);
                d = d.add(LANES);
            }
        }
    }
}

/// Gate/up of rows `r0..r1` for every token m of `xs` (each `gate.cols` values):
/// `emit(m, r, values)` with `silu(g) * u` of rows `r..r + values.len()`.
///
/// # Safety
/// AVX-512F available.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn gate_up(
    gate: &Proj<'_>,
    up: &Proj<'_>,
    rows: (usize, usize),
    xs: &[&[f32]],
    s: &mut Scratch,
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let (r0, r1) = rows;
    let cols = gate.cols;
    if xs.iter().any(|x| x.len() != cols) || up.cols != cols {
        return;
    }
    let mut vals = [0.0f32; HALF];
    let mut rb = r0;
    while rb < r1 {
        let nb = HALF.min(r1 - rb);
        let tile = s.tile.as_mut_slice();
        if nb < HALF {
            tile.fill(0.0);
        }
        // SAFETY: the caller's AVX-512F.
        unsafe {
            fill(gate, rb, nb, tile, 0, &mut s.rows);
            fill(up, rb, nb, tile, HALF, &mut s.rows);
        }
        let sg: Vec<f32> = (rb..rb + nb).map(|r| row_scale(gate, r)).collect();
        let su: Vec<f32> = (rb..rb + nb).map(|r| row_scale(up, r)).collect();
        for (c, chunk) in xs.chunks(TB).enumerate() {
            // SAFETY: the caller's AVX-512F; sizes as `product` needs (checked above).
            unsafe { product(s.tile.as_slice(), cols, chunk, s.acc.as_mut_slice()) };
            let acc = s.acc.as_slice();
            for (t, a) in acc.chunks_exact(BLOCK).take(chunk.len()).enumerate() {
                let (g, u) = a.split_at(HALF);
                for ((((d, &g), &u), &sg), &su) in vals.iter_mut().zip(g).zip(u).zip(&sg).zip(&su) {
                    *d = silu(g * sg) * (u * su);
                }
                emit(c * TB + t, rb, vals.get(..nb).unwrap_or_default());
            }
        }
        rb += nb;
    }
}

/// Down of rows `r0..r1` for every token m of `hs` (each `down.cols` values):
/// `emit(m, r, values)` with rows `r..r + values.len()`.
///
/// # Safety
/// AVX-512F available.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn down(
    down: &Proj<'_>,
    rows: (usize, usize),
    hs: &[&[f32]],
    s: &mut Scratch,
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let (r0, r1) = rows;
    let cols = down.cols;
    if hs.iter().any(|x| x.len() != cols) {
        return;
    }
    let mut vals = [0.0f32; BLOCK];
    let mut rb = r0;
    while rb < r1 {
        let nb = BLOCK.min(r1 - rb);
        let tile = s.tile.as_mut_slice();
        if nb < BLOCK {
            tile.fill(0.0);
        }
        // SAFETY: the caller's AVX-512F.
        unsafe { fill(down, rb, nb, tile, 0, &mut s.rows) };
        let sd: Vec<f32> = (rb..rb + nb).map(|r| row_scale(down, r)).collect();
        for (c, chunk) in hs.chunks(TB).enumerate() {
            // SAFETY: the caller's AVX-512F; sizes as `product` needs (checked above).
            unsafe { product(s.tile.as_slice(), cols, chunk, s.acc.as_mut_slice()) };
            let acc = s.acc.as_slice();
            for (t, a) in acc.chunks_exact(BLOCK).take(chunk.len()).enumerate() {
                for ((d, &v), &sd) in vals.iter_mut().zip(a).zip(&sd) {
                    *d = v * sd;
                }
                emit(c * TB + t, rb, vals.get(..nb).unwrap_or_default());
            }
        }
        rb += nb;
    }
}
