//! Fused CPU compute of a MoE layer's routed experts, reading each expert's bytes in
//! place (a resident slab or a RAM cache slot) in the exact layout of the `.ftw` file.
//!
//! - [`ExpertFormat`] / [`Proj`]: the projection layouts (raw f32/bf16/f16, int8 per
//!   row, int4 per group) and views of their bytes.
//! - [`Isa`] / [`Dot`]: a row dot product per instruction set, chosen at run time:
//!   the scalar reference, a portable 8-lane path, AVX2+FMA, AVX-512, AVX-512 BF16.
//! - [`Kernels`]: one call computes every listed expert of a layer on its rows (gate,
//!   up and SiLU fused, then down), split across a thread pool by output rows, waiting
//!   on a [`Ready`] source per projection; [`weighted_sum`] adds the top-k in rank order.
//!
//! Numerics (the contract the Python tests check): activations stay f32 from end to
//! end, except in the VNNI kernels (below); weights are widened to f32 exactly
//! (int8/int4 times their scales). The scalar path is the reference; the vector paths differ from it only by summation order and
//! fused multiply-adds, within 1e-5 of the largest |partial product sum| per row in
//! f32 (tests: `tests/kernels.rs`).
//!
//! The AVX-512 BF16 path ([`Isa::Avx512Bf16`]) keeps that contract: `vdpbf16ps`
//! multiplies bf16 weights (or int4 q in -8..7, exact in bf16) with bf16 activations,
//! and a product of two bf16 is exact in f32, so only the order of the adds differs
//! from the reference. It is used only where the activation row is exactly bf16 (its
//! f32 values have zero low 16 bits, checked per row once per call, [`Act`]): a bf16
//! model's hidden state into gate/up. The input of down (silu(g) * u in f32) is not
//! bf16 and stays on the f32 kernels; an exact split into three bf16 planes works
//! (`act::split_bf16`, now kept for the tests) but measured slower than the f32
//! kernel. The choice depends on the row only, so a streamed layer (in waves) and a
//! resident one take the same kernel. On Intel CPUs int4 rows take their own
//! kernel instead (`i4_lanes.rs`: nibbles to f32 by a permute, then FMAs; Intel's
//! `vdpbf16ps` runs at half the rate of its FMAs), on any f32 activation row: the
//! choice depends on the CPU and the row, so still the same for both.
//!
//! The VNNI kernels (`Dot::with_int8_vnni`, `with_int4_vnni`; by default int8 rows
//! where the CPU has AVX-512 VNNI, int4 rows on Intel CPUs with it) round the
//! activation to 8 bits per 32 columns, as llama.cpp's CPU kernels do: integer dot
//! products (`vpdpbusd`), exact, then one multiply-add per 4 or 8 columns with the
//! scales. Their references are [`dot_q8`] and [`dot_q4`] (the same rounded
//! activation); against the f32 reference they are within the activation's rounding
//! (docs/cpu-kernels.md, "The VNNI kernels").

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod crew;
mod decode;
mod error;
mod format;
#[cfg(target_arch = "x86_64")]
mod i4_lanes;
#[cfg(target_arch = "x86_64")]
mod i4_steps;
mod isa;
mod layer;
mod portable;
mod read;
mod scalar;
mod simd;
mod team;
mod tile;

pub use act::Act;
pub use decode::{Attn, Decoder, Ffn, KvRows, Layer, LayerCache, Moe, QkNorm, StepShape, Swiglu};
pub use error::{KernelError, Result};
pub use format::{bf16_to_f32, f16_to_f32, ExpertFormat, Proj, WeightKind, MAX_DIM, SCALE_ALIGN};
pub use isa::{Dot, Isa};
pub use layer::{weighted_sum, AllReady, ExpertWeights, Kernels, Ready, Routing, TILE_MIN_TOKENS};
pub use scalar::{bf16_round, dot_q4, dot_q8, silu};

/// The number in environment variable `name`, or `default` when it is unset or not a
/// number. The settings that read it (`FLINT_CPU_PREFETCH`, `FLINT_CPU_ROW_PREFETCH`,
/// `FLINT_CPU_SPIN_US`, `FLINT_CPU_TASKS`, `FLINT_CPU_ROWS`) keep the value in a
/// `OnceLock`: read once per process.
pub(crate) fn env_setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
