//! The scalar reference: one accumulator, columns in order, a multiply then an add per
//! weight (no fused multiply-add). It defines what every vector path computes; they
//! differ from it only by summation order and fused rounding (see `lib.rs`, tolerance).
//! It is also what any row a vector path cannot take (odd int4 groups) runs through.

use crate::format::{bf16_to_f32, f16_to_f32, le_f32, le_u16, Proj, WeightKind};

/// `sum_c W[r, c] * x[c]` for row `r` of `p`; `x` has `p.cols` values.
pub fn dot(p: &Proj<'_>, r: usize, x: &[f32]) -> f32 {
    let w = p.row(r);
    let s = p.row_scales(r);
    match p.kind {
        WeightKind::F32 => x
            .iter()
            .enumerate()
            .fold(0.0, |acc, (c, &xc)| acc + le_f32(w, c) * xc),
        WeightKind::Bf16 => x
            .iter()
            .enumerate()
            .fold(0.0, |acc, (c, &xc)| acc + bf16_to_f32(le_u16(w, c)) * xc),
        WeightKind::F16 => x
            .iter()
            .enumerate()
            .fold(0.0, |acc, (c, &xc)| acc + f16_to_f32(le_u16(w, c)) * xc),
        WeightKind::Int8 => {
            let sum = x.iter().zip(w).fold(0.0f32, |acc, (&xc, &q)| {
                acc + f32::from(i8::from_le_bytes([q])) * xc
            });
            sum * le_f32(s, 0)
        }
        WeightKind::Int4 { group } => {
            let mut acc = 0.0f32;
            for (g, xg) in x.chunks_exact(group).enumerate() {
                let mut part = 0.0f32;
                for (i, &xc) in xg.iter().enumerate() {
                    part += f32::from(nibble(w, g * group + i)) * xc;
                }
                acc += part * bf16_to_f32(le_u16(s, g));
            }
            acc
        }
    }
}

/// The int8 VNNI scheme's reference: row `r` of int8 projection `p` with `x` rounded
/// to 8 bits as `Act::with_q8` rounds it: each 4 columns' integer sum (exact), times
/// that block's scale, added in column order (a multiply then an add), then times the
/// row's scale. None where the activation is not rounded (`with_q8`'s conditions).
pub fn dot_q8(p: &Proj<'_>, r: usize, x: &[f32]) -> Option<f32> {
    let a = crate::act::Act::plain(x).with_q8();
    if a.q8.len() != x.len() || x.len() != p.cols || p.kind != WeightKind::Int8 {
        return None;
    }
    let (q, scale) = (a.q8.as_slice(), a.q8_scale.as_slice());
    let mut acc = 0.0f32;
    for (l, (wl, ql)) in p.row(r).chunks_exact(4).zip(q.chunks_exact(4)).enumerate() {
        let sum: i32 = wl
            .iter()
            .zip(ql)
            .map(|(&a, &b)| i32::from(i8::from_le_bytes([a])) * i32::from(b))
            .sum();
        acc += sum as f32 * scale.get(l).copied().unwrap_or(0.0);
    }
    Some(acc * le_f32(p.row_scales(r), 0))
}

/// The int4 VNNI scheme's reference: row `r` of int4 projection `p` (the shapes
/// `act::q4_group` takes) with `x` rounded to 8 bits as
/// `Act::with_q8` rounds it: each 8 columns' integer sum (exact), times (their group's
/// scale x their block's scale), added in column order (a multiply then an add). None
/// where the kernel does not take the row or the activation.
pub fn dot_q4(p: &Proj<'_>, r: usize, x: &[f32]) -> Option<f32> {
    let WeightKind::Int4 { group } = p.kind else {
        return None;
    };
    let ok = crate::act::q4_group(group, p.cols) && x.len() == p.cols;
    let (q, scales) = crate::act::quantize(x).filter(|_| ok)?;
    let (w, s) = (p.row(r), p.row_scales(r));
    let mut acc = 0.0f32;
    for l in 0..p.cols / 8 {
        let sum: i32 = (8 * l..8 * l + 8)
            .map(|c| i32::from(nibble(w, c)) * i32::from(q.get(c).copied().unwrap_or(0)))
            .sum();
        let ws = bf16_to_f32(le_u16(s, 8 * l / group));
        acc += sum as f32
            * (ws
                * scales
                    .get(8 * l / crate::act::Q8_BLOCK)
                    .copied()
                    .unwrap_or(0.0));
    }
    Some(acc)
}

/// Element `c` of a packed int4 row, as q in [-8, 7].
#[inline(always)]
pub fn nibble(w: &[u8], c: usize) -> i8 {
    let b = w.get(c / 2).copied().unwrap_or(8 | (8 << 4));
    let n = if c.is_multiple_of(2) {
        b & 0x0f
    } else {
        b >> 4
    };
    n as i8 - 8
}

/// SiLU in f32: `g / (1 + exp(-g))`.
#[inline(always)]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// `v` rounded to the nearest bf16 value (ties to even), as an f32: what a bf16 tensor
/// holds after torch's `.to(torch.bfloat16)`. NaN stays NaN.
pub fn bf16_round(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let b = v.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}
