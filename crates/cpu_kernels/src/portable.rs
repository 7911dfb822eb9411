//! The portable vector path: 8 f32 lanes as a plain array, for CPUs without AVX2
//! (compilers turn the lane loops into the target's own vector instructions).

use crate::format::{bf16_to_f32, f16_to_f32};
use crate::simd::Simd;

/// 8 lanes in an array.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

const W: usize = 8;

#[inline(always)]
fn map(f: impl Fn(usize) -> f32) -> [f32; W] {
    std::array::from_fn(f)
}

// SAFETY: plain Rust, available everywhere; the loads read W elements from pointers the
// caller guarantees valid (the trait's contract).
unsafe impl Simd for Portable {
    const W: usize = W;
    type V = [f32; W];

    unsafe fn zero() -> Self::V {
        [0.0; W]
    }
    unsafe fn splat(v: f32) -> Self::V {
        [v; W]
    }
    unsafe fn load_f32(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees W readable f32 at p (unaligned allowed).
        map(|i| unsafe { p.add(i).read_unaligned() })
    }
    unsafe fn load_bf16(p: *const u8) -> Self::V {
        // SAFETY: the caller guarantees 2W readable bytes at p.
        map(|i| {
            bf16_to_f32(u16::from_le_bytes(unsafe {
                p.add(2 * i).cast::<[u8; 2]>().read()
            }))
        })
    }
    unsafe fn load_f16(p: *const u8) -> Self::V {
        // SAFETY: the caller guarantees 2W readable bytes at p.
        map(|i| {
            f16_to_f32(u16::from_le_bytes(unsafe {
                p.add(2 * i).cast::<[u8; 2]>().read()
            }))
        })
    }
    unsafe fn load_i8(p: *const u8) -> Self::V {
        // SAFETY: the caller guarantees W readable bytes at p.
        map(|i| f32::from(unsafe { p.add(i).cast::<i8>().read() }))
    }
    unsafe fn load_i4(p: *const u8) -> Self::V {
        map(|i| {
            // SAFETY: the caller guarantees W/2 readable bytes at p; i / 2 < W / 2.
            let b = unsafe { p.add(i / 2).read() };
            let n = if i.is_multiple_of(2) {
                b & 0x0f
            } else {
                b >> 4
            };
            f32::from(n as i8 - 8)
        })
    }
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // A multiply then an add: `mul_add` is a slow library call without hardware FMA.
        let mut out = c;
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o += x * y;
        }
        out
    }
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        let mut out = a;
        for (o, y) in out.iter_mut().zip(b) {
            *o += y;
        }
        out
    }
    unsafe fn hsum(a: Self::V) -> f32 {
        let [a0, a1, a2, a3, a4, a5, a6, a7] = a;
        ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
    }
}
