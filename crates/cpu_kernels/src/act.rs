//! Activation rows prepared once per layer call, in the form a kernel reads them: the
//! f32 row itself, plus (only where the chosen kernel uses them) exact bf16 planes of
//! the row for the AVX-512 BF16 dot product, or the row reordered for the int4 kernel.
//!
//! Preparing is exact: the planes sum to the row, the reordering moves values. The
//! kernels that read them therefore still compute `sum_c W[r, c] * x[c]` on the f32
//! activations with exact products; only the summation order differs from the scalar
//! reference (see `lib.rs`). The one exception is the VNNI kernels' 8-bit rounding of
//! the row (`with_q8`, `with_q4`, [`quantize`]), whose own references are
//! `scalar::dot_q8` and `dot_q4`.

use crate::format::WeightKind;

/// Columns per AVX-512 BF16 dot-product step (32 bf16 in a register); planes are
/// zero-padded to a multiple of it.
pub(crate) const BF16_BLOCK: usize = 32;
/// Columns per int4 step of the AVX-512 kernel (16 bytes of nibbles). (A 128-column
/// step reading 64 bytes as 32-bit lanes, eight shift-and-permute per step, measured
/// slower on the CPU box's EPYC: 16.6 vs 17.3 G weights/s; with half the nibbles
/// converted on the ALU instead, 15.4. On Intel CPUs that step is the lanes kernel,
/// `i4_lanes.rs`, which replaces the AVX-512 BF16 one there.)
pub(crate) const I4_BLOCK: usize = 32;
/// Columns per int4 step of the AVX-512 BF16 kernel (64 bytes of nibbles).
pub(crate) const I4_BF16_BLOCK: usize = 128;

/// A zeroed buffer of `len` values starting on a 64-byte boundary (one cache line, one
/// AVX-512 load): activation loads that straddle two lines measured ~25% slower (27.8 vs
/// 22.0 G weights/s, bf16 row from L2, 0 vs 16 bytes mod 64).
#[derive(Debug, Clone, Default)]
pub(crate) struct Aligned<T> {
    buf: Vec<T>,
    off: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    pub(crate) fn zeroed(len: usize) -> Self {
        let size = std::mem::size_of::<T>().max(1);
        let extra = 64 / size;
        let buf = vec![T::default(); len + extra];
        let mis = buf.as_ptr() as usize % 64;
        let off = if mis == 0 { 0 } else { (64 - mis) / size };
        Self { buf, off, len }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        self.buf
            .get(self.off..self.off + self.len)
            .unwrap_or_default()
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        self.buf
            .get_mut(self.off..self.off + self.len)
            .unwrap_or_default()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn from_slice(v: &[T]) -> Self {
        let mut a = Self::zeroed(v.len());
        a.as_mut_slice().copy_from_slice(v);
        a
    }
}

/// An activation row and what the kernels of one instruction set need of it.
#[derive(Debug, Clone)]
pub struct Act<'a> {
    pub(crate) x: &'a [f32],
    /// A 64-byte-aligned copy of `x` for the vector kernels when `x` is not aligned.
    pub(crate) xa: Aligned<f32>,
    /// `planes` bf16 rows, each `x.len()` rounded up to [`BF16_BLOCK`], zero-padded,
    /// whose sum is `x` exactly; empty when not prepared.
    pub(crate) bf16: Aligned<u16>,
    pub(crate) planes: usize,
    /// `x` with every [`I4_BLOCK`] of columns stored as its 16 even columns, then its
    /// 16 odd ones (the order the int4 kernel unpacks nibbles in); empty when unused.
    pub(crate) i4: Aligned<f32>,
    /// For the AVX-512 BF16 int4 kernel: `x` with every [`I4_BF16_BLOCK`] of columns
    /// stored as columns 4j (j = 0..32), then 4j+1, 4j+2, 4j+3, split into `i4_planes`
    /// exact bf16 planes of `x.len()` values each; empty when not prepared.
    pub(crate) i4_bf16: Aligned<u16>,
    pub(crate) i4_planes: usize,
    /// For the int4 lanes kernel (`i4_lanes.rs`, Intel CPUs): `x` with every
    /// [`I4_BF16_BLOCK`] of columns stored as columns 8d + k for d = 0..16, for k = 0..8;
    /// empty when not prepared.
    pub(crate) i4l: Aligned<f32>,
    /// For the int8 VNNI kernel (`Dot::with_int8_vnni`): `x` rounded to 8 bits per
    /// block of [`Q8_BLOCK`] columns (`q8`, each block's values over its largest |x|
    /// / 127), and per 4 columns (one 32-bit lane of a `vpdpbusd`) that block's scale
    /// (`q8_scale`) and -128 x the sum of the 4 q (`q8_neg`: the weights are read as
    /// unsigned `q + 128`); empty when not prepared.
    pub(crate) q8: Aligned<i8>,
    pub(crate) q8_scale: Aligned<f32>,
    pub(crate) q8_neg: Aligned<i32>,
    /// For the int4 VNNI kernel (`Dot::with_int4_vnni`): `x` rounded as for `q8`, each
    /// 128 columns as the 64 even columns then the 64 odd ones (byte 4l + i of the even
    /// half is column 8l + 2i: the low nibbles of a 64-byte load of weights), and per 8
    /// columns (one 32-bit lane of both halves) -8 x the sum of their q (`q4_neg`: the
    /// nibbles are read as unsigned `q + 8`) and their block's scale (`q4_scale`).
    pub(crate) q4: Aligned<i8>,
    pub(crate) q4_scale: Aligned<f32>,
    pub(crate) q4_neg: Aligned<i32>,
}

impl<'a> Act<'a> {
    /// `x` as it is, nothing prepared (every kernel can read this).
    pub fn plain(x: &'a [f32]) -> Self {
        Self {
            x,
            xa: Aligned::default(),
            bf16: Aligned::default(),
            planes: 0,
            i4: Aligned::default(),
            i4_bf16: Aligned::default(),
            i4_planes: 0,
            i4l: Aligned::default(),
            q8: Aligned::default(),
            q8_scale: Aligned::default(),
            q8_neg: Aligned::default(),
            q4: Aligned::default(),
            q4_scale: Aligned::default(),
            q4_neg: Aligned::default(),
        }
    }

    /// The f32 row.
    pub fn x(&self) -> &'a [f32] {
        self.x
    }

    /// Whether nothing but (maybe) an aligned copy was prepared: only the f32 kernels
    /// read this row.
    pub(crate) fn is_plain(&self) -> bool {
        self.planes == 0
            && self.i4_planes == 0
            && self.i4.len() == 0
            && self.i4l.len() == 0
            && self.q8.len() == 0
            && self.q4.len() == 0
    }

    /// The f32 row the f32 kernels read: the aligned copy if there is one.
    pub(crate) fn f32_row(&self) -> &[f32] {
        if self.xa.len() == self.x.len() && !self.x.is_empty() {
            self.xa.as_slice()
        } else {
            self.x
        }
    }

    /// With a 64-byte-aligned copy of `x` if `x` is not aligned (vector kernels).
    pub(crate) fn aligned(mut self) -> Self {
        if !(self.x.as_ptr() as usize).is_multiple_of(64) {
            self.xa = Aligned::from_slice(self.x);
        }
        self
    }

    /// What was prepared, i.e. which kernel reads this row: `int8-vnni` / `int4-vnni`
    /// (the VNNI kernels), `bf16` (AVX-512 BF16, bf16 rows), `int4-bf16` (AVX-512 BF16,
    /// int4 rows), `int4-lanes` (the int4 lanes kernel), `int4` (AVX-512 int4 order) or
    /// `f32`.
    pub fn prepared(&self) -> &'static str {
        if self.q8.len() > 0 {
            "int8-vnni"
        } else if self.q4.len() > 0 {
            "int4-vnni"
        } else if self.i4l.len() > 0 {
            "int4-lanes"
        } else if self.planes > 0 {
            "bf16"
        } else if self.i4_planes > 0 {
            "int4-bf16"
        } else if self.i4.len() > 0 {
            "int4"
        } else {
            "f32"
        }
    }

    /// bf16 planes prepared for bf16 rows (0: none, the f32 kernel; 1: the row is
    /// exactly bf16, the AVX-512 BF16 kernel).
    pub fn bf16_planes(&self) -> usize {
        self.planes
    }

    /// With `x` as bf16, if that is exact (one plane of `split_bf16`, the test-only
    /// general split). Rows that need two or three planes stay f32: the BF16 kernel on
    /// three planes measured slower than the f32 kernel (20.6 vs 27.8 G weights/s from
    /// L2, examples/dot_speed.rs).
    pub(crate) fn with_bf16(mut self) -> Self {
        if !is_bf16(self.x) {
            return self;
        }
        // Exactly bf16 (checked): the one plane of `split_bf16` is each value's high 16
        // bits, zero-padded to the block (built directly: the split's general loop was
        // most of a decode call's serial start).
        let mut plane = vec![0u16; self.x.len().next_multiple_of(BF16_BLOCK)];
        for (p, v) in plane.iter_mut().zip(self.x) {
            *p = (v.to_bits() >> 16) as u16;
        }
        self.bf16 = Aligned::from_slice(&plane);
        self.planes = 1;
        self
    }

    /// With the int4 order of `x`, if its length is a multiple of [`I4_BLOCK`].
    pub(crate) fn with_i4(mut self) -> Self {
        if self.x.len().is_multiple_of(I4_BLOCK) {
            let mut out = Vec::with_capacity(self.x.len());
            for block in self.x.chunks_exact(I4_BLOCK) {
                out.extend(block.iter().step_by(2));
                out.extend(block.iter().skip(1).step_by(2));
            }
            self.i4 = Aligned::from_slice(&out);
        }
        self
    }
}

impl Act<'_> {
    /// With the AVX-512 BF16 int4 order of `x` as bf16, if its length is a multiple of
    /// [`I4_BF16_BLOCK`] and it is exactly bf16 (one plane; on three planes that kernel
    /// measured slower than the f32 int4 kernel, 15.5 vs 17.4 G weights/s); else the
    /// f32 int4 order.
    pub(crate) fn with_i4_bf16(mut self) -> Self {
        if self.x.len().is_multiple_of(I4_BF16_BLOCK) && is_bf16(self.x) {
            // Exactly bf16 (checked): one plane, each value's high 16 bits (what
            // `split_bf16` gives such a row), in the kernel's column order.
            let mut plane = Vec::with_capacity(self.x.len());
            for block in self.x.chunks_exact(I4_BF16_BLOCK) {
                for k in 0..4 {
                    plane.extend(
                        block
                            .iter()
                            .skip(k)
                            .step_by(4)
                            .map(|v| (v.to_bits() >> 16) as u16),
                    );
                }
            }
            self.i4_bf16 = Aligned::from_slice(&plane);
            self.i4_planes = 1;
            return self;
        }
        self.with_i4()
    }
}

impl Act<'_> {
    /// With the int4 lanes order of `x` (any f32 values), if its length is a multiple of
    /// [`I4_BF16_BLOCK`]; else the f32 int4 order.
    pub(crate) fn with_i4_lanes(mut self) -> Self {
        if !self.x.len().is_multiple_of(I4_BF16_BLOCK) {
            return self.with_i4();
        }
        let mut out = Vec::with_capacity(self.x.len());
        for block in self.x.chunks_exact(I4_BF16_BLOCK) {
            for k in 0..8 {
                out.extend(block.iter().skip(k).step_by(8));
            }
        }
        self.i4l = Aligned::from_slice(&out);
        self
    }
}

/// Columns per scale of [`Act::with_q8`]'s 8-bit activations (llama.cpp's Q8_0 block).
pub(crate) const Q8_BLOCK: usize = 32;
/// Columns per step of the int8 VNNI kernel (64 bytes of weights); rows it takes have a
/// multiple of it.
pub(crate) const Q8_STEP: usize = 64;

impl Act<'_> {
    /// With `x` rounded to 8 bits per [`Q8_BLOCK`] columns for the int8 VNNI kernel, if
    /// its length is a multiple of [`Q8_STEP`] and every value is finite (else as it
    /// is: the f32 kernels), as [`quantize`] rounds it.
    pub(crate) fn with_q8(mut self) -> Self {
        let n = self.x.len();
        if n == 0 || !n.is_multiple_of(Q8_STEP) {
            return self;
        }
        let Some((q, scales)) = quantize(self.x) else {
            return self;
        };
        let mut qa = Aligned::<i8>::zeroed(n);
        let mut scale = Aligned::<f32>::zeroed(n / 4);
        let mut neg = Aligned::<i32>::zeroed(n / 4);
        qa.as_mut_slice().copy_from_slice(&q);
        for (l, (s, d)) in scale
            .as_mut_slice()
            .iter_mut()
            .zip(neg.as_mut_slice())
            .enumerate()
        {
            *s = scales.get(l * 4 / Q8_BLOCK).copied().unwrap_or(0.0);
            *d = -128
                * q.iter()
                    .skip(4 * l)
                    .take(4)
                    .map(|&v| i32::from(v))
                    .sum::<i32>();
        }
        self.q8 = qa;
        self.q8_scale = scale;
        self.q8_neg = neg;
        self
    }

    /// With `x` rounded to 8 bits as [`Self::with_q8`] rounds it, in the int4 VNNI
    /// kernel's order (`q4`), if its length is a multiple of [`Q4_STEP`] and every
    /// value is finite (else as it is).
    pub(crate) fn with_q4(mut self) -> Self {
        let n = self.x.len();
        if n == 0 || !n.is_multiple_of(Q4_STEP) {
            return self;
        }
        let Some((q, scales)) = quantize(self.x) else {
            return self;
        };
        let mut qa = Aligned::<i8>::zeroed(n);
        let mut scale = Aligned::<f32>::zeroed(n / 8);
        let mut neg = Aligned::<i32>::zeroed(n / 8);
        for (step, (src, dst)) in q
            .chunks_exact(Q4_STEP)
            .zip(qa.as_mut_slice().chunks_exact_mut(Q4_STEP))
            .enumerate()
        {
            let (even, odd) = dst.split_at_mut(Q4_STEP / 2);
            for (j, pair) in src.chunks_exact(2).enumerate() {
                if let (Some(e), Some(o), [a, b]) = (even.get_mut(j), odd.get_mut(j), pair) {
                    (*e, *o) = (*a, *b);
                }
            }
            for l in 0..Q4_STEP / 8 {
                let at = step * Q4_STEP / 8 + l;
                let lane = src.get(8 * l..8 * l + 8).unwrap_or_default();
                if let Some(d) = neg.as_mut_slice().get_mut(at) {
                    *d = -8 * lane.iter().map(|&v| i32::from(v)).sum::<i32>();
                }
                if let Some(d) = scale.as_mut_slice().get_mut(at) {
                    *d = scales.get(at * 8 / Q8_BLOCK).copied().unwrap_or(0.0);
                }
            }
        }
        self.q4 = qa;
        self.q4_scale = scale;
        self.q4_neg = neg;
        self
    }
}

/// Columns per step of the int4 VNNI kernel (64 bytes of nibbles); rows it takes have
/// a multiple of it.
pub(crate) const Q4_STEP: usize = 128;

/// `x` rounded to 8 bits per [`Q8_BLOCK`] columns and each block's scale: the block's
/// largest |x| / 127, each q = x * (127 / largest) rounded to nearest, ties to even, in
/// -127..=127. A block whose largest |x| is under 127 x the smallest normal f32 (~1.5e-36,
/// where 127 / largest would overflow) counts as zeros: scale 0, q 0. None if a value
/// is not finite or the length is not a multiple of the block.
pub(crate) fn quantize(x: &[f32]) -> Option<(Vec<i8>, Vec<f32>)> {
    if !x.len().is_multiple_of(Q8_BLOCK) || !x.iter().all(|v| v.is_finite()) {
        return None;
    }
    let mut q = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / Q8_BLOCK);
    for block in x.chunks_exact(Q8_BLOCK) {
        let top = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (inv, s) = if top >= 127.0 * f32::MIN_POSITIVE {
            (127.0 / top, top / 127.0)
        } else {
            (0.0, 0.0)
        };
        q.extend(
            block
                .iter()
                .map(|v| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8),
        );
        scales.push(s);
    }
    Some((q, scales))
}

/// Which preparation `kind` gets on an instruction set that has the BF16 dot product
/// (`bf16`) and the AVX-512 int4 kernel (`i4`), int4 rows of groups the lanes kernel
/// takes going to it where `lanes` (Intel CPUs with AVX-512 BF16: `Dot`), int8 rows to
/// the VNNI kernel where `q8`, int4 rows of the shapes [`q4_group`] takes (and finite
/// activations) to theirs where `q4`.
pub(crate) fn prepare(
    x: &[f32],
    kind: WeightKind,
    bf16: bool,
    i4: bool,
    lanes: bool,
    q8: bool,
    q4: bool,
) -> Act<'_> {
    let act = Act::plain(x);
    let act = if bf16 || i4 { act.aligned() } else { act };
    let q4_ok = |group: usize| {
        q4_group(group, x.len()) && x.iter().all(|v| v.is_finite()) // else the other kernels
    };
    match kind {
        WeightKind::Int8 if q8 => act.with_q8(),
        WeightKind::Int4 { group } if q4 && q4_ok(group) => act.with_q4(),
        WeightKind::Int4 { group } if lanes && i4_bf16_group(group) => act.with_i4_lanes(),
        WeightKind::Bf16 if bf16 => act.with_bf16(),
        WeightKind::Int4 { group } if bf16 && i4_bf16_group(group) => act.with_i4_bf16(),
        WeightKind::Int4 { group } if i4 && group.is_multiple_of(I4_BLOCK) => act.with_i4(),
        _ => act,
    }
}

/// Whether the int4 VNNI kernel takes rows of `cols` columns in groups of `group`: a
/// multiple of 128 columns, whole groups of 32 or 64 or of a multiple of 128 (a 128-column
/// step then holds whole groups, or lies inside one).
pub(crate) fn q4_group(group: usize, cols: usize) -> bool {
    group > 0 && i4_bf16_group(group) && cols.is_multiple_of(group) && cols.is_multiple_of(Q4_STEP)
}

/// Whether the AVX-512 BF16 int4 kernel takes groups of `group` (a 16-lane register
/// of a 128-column step then holds whole groups of 8-column lanes).
pub(crate) fn i4_bf16_group(group: usize) -> bool {
    group == 32 || group == 64 || group.is_multiple_of(I4_BF16_BLOCK)
}

/// Whether every value of `x` is finite and exactly bf16, stopping at the first that is
/// not (an f32 row: the first value, so preparing costs nothing where the BF16 kernels
/// do not apply; a full split of every f32 row cost tiny-code-moe ~20% of its prefill).
fn is_bf16(x: &[f32]) -> bool {
    x.iter()
        .all(|v| v.is_finite() && v.to_bits().trailing_zeros() >= 16)
}

/// `x` as the fewest bf16 planes (1, 2 or 3, each zero-padded to [`BF16_BLOCK`]) whose
/// element-wise sum is `x` exactly: plane 0 is `x` truncated to bf16, plane 1 the
/// next 8 significant bits of the remainder, plane 2 the last 8 (an f32 significand
/// has 24 bits). A row that came from bf16 needs one plane. `None` if `x` has an
/// infinity or NaN (the split would make NaN of an infinity), or an element whose
/// remainder would fall below the smallest normal f32 (|x| < 2^-100: the BF16 dot
/// product flushes subnormals, so such a row is not split; those go to the f32
/// kernel).
#[cfg(test)]
pub(crate) fn split_bf16(x: &[f32]) -> Option<(Vec<u16>, usize)> {
    const TINY: f32 = 7.888_609e-31; // 2^-100
    let len = x.len().next_multiple_of(BF16_BLOCK);
    let mut planes = vec![0u16; 3 * len];
    let mut used = 1;
    for (c, &v) in x.iter().enumerate() {
        if !v.is_finite() {
            return None;
        }
        let hi = v.to_bits() & 0xffff_0000;
        let r1 = v - f32::from_bits(hi); // exact: the low 16 bits of v's significand
        if r1 != 0.0 && v.abs() < TINY {
            return None;
        }
        let mid = r1.to_bits() & 0xffff_0000;
        let r2 = r1 - f32::from_bits(mid); // exact, at most 8 significant bits
        if r2.to_bits() & 0xffff != 0 {
            return None; // not reachable for normal v; kept as a guard of exactness
        }
        used = used.max(if r2 != 0.0 {
            3
        } else if r1 != 0.0 {
            2
        } else {
            1
        });
        for (p, bits) in [hi, mid, r2.to_bits()].into_iter().enumerate() {
            if let Some(dst) = planes.get_mut(p * len + c) {
                *dst = (bits >> 16) as u16;
            }
        }
    }
    planes.truncate(used * len);
    Some((planes, used))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sum_of_planes(planes: &[u16], n: usize, len: usize, c: usize) -> f64 {
        (0..n)
            .map(|p| f64::from(f32::from_bits(u32::from(planes[p * len + c]) << 16)))
            .sum()
    }

    #[test]
    fn planes_sum_to_the_row_exactly() {
        let x = [
            1.0f32,
            -3.140_625,
            0.1,
            -1.0e-20,
            3.0e30,
            f32::from_bits(0x3f80_0001),
            0.0,
            -0.0,
            1.5e-25,
        ];
        let (planes, n) = split_bf16(&x).unwrap();
        assert_eq!(n, 3);
        for (c, &v) in x.iter().enumerate() {
            assert_eq!(sum_of_planes(&planes, n, 32, c), f64::from(v), "{v}");
        }
        let bf: Vec<f32> = x
            .iter()
            .map(|v| f32::from_bits(v.to_bits() & 0xffff_0000))
            .collect();
        assert_eq!(split_bf16(&bf).unwrap().1, 1);
        assert!(split_bf16(&[1.0, f32::INFINITY]).is_none());
        assert!(split_bf16(&[1.0, f32::NAN]).is_none());
        assert!(split_bf16(&[f32::from_bits(0x0000_1234)]).is_none());
    }

    #[test]
    fn a_bf16_row_gets_the_one_plane_of_the_split() {
        // The direct planes of `with_bf16` / `with_i4_bf16` equal `split_bf16`'s one plane.
        for len in [1, 31, 33, 128, 256, 2048] {
            let x: Vec<f32> = (0..len)
                .map(|c| f32::from_bits(((c as f32 - 40.5) * 0.37).to_bits() & 0xffff_0000))
                .collect();
            let (planes, n) = split_bf16(&x).unwrap();
            assert_eq!(n, 1);
            let a = Act::plain(&x).with_bf16();
            assert_eq!((a.planes, a.bf16.as_slice()), (1, &planes[..]), "{len}");
            if len % I4_BF16_BLOCK == 0 {
                let mut order = Vec::new();
                for block in x.chunks_exact(I4_BF16_BLOCK) {
                    for k in 0..4 {
                        order.extend(block.iter().skip(k).step_by(4));
                    }
                }
                let (planes, _) = split_bf16(&order).unwrap();
                let a = Act::plain(&x).with_i4_bf16();
                assert_eq!(
                    (a.i4_planes, a.i4_bf16.as_slice()),
                    (1, &planes[..]),
                    "{len}"
                );
            }
        }
    }

    #[test]
    fn int4_order_is_even_then_odd_columns() {
        let x: Vec<f32> = (0..64).map(|c| c as f32).collect();
        let a = Act::plain(&x).with_i4();
        let i4 = a.i4.as_slice();
        let even: Vec<f32> = (0..16).map(|j| (2 * j) as f32).collect();
        let odd: Vec<f32> = (0..16).map(|j| (2 * j + 1) as f32).collect();
        assert_eq!(i4[..16], even[..]);
        assert_eq!(i4[16..32], odd[..]);
        assert_eq!(i4[32], 32.0);
        assert_eq!(i4.as_ptr() as usize % 64, 0);
        assert_eq!(Act::plain(&x[..48]).with_i4().i4.len(), 0);
    }
}
