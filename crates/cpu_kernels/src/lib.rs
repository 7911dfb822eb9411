//! Fused CPU compute of a MoE layer's routed experts, reading each expert's bytes in
//! place (a resident slab or a RAM cache slot) in the exact layout of the `.ftw` file.
//!
//! - [`ExpertFormat`] / [`Proj`]: the projection layouts (raw f32/bf16/f16, int8 per
//!   row, int4 per group) and views of their bytes.
//! - [`Isa`] / [`Dot`]: a row dot product per instruction set, chosen at run time:
//!   the scalar reference, a portable 8-lane path, AVX2+FMA, AVX-512.
//! - [`Kernels`]: one call computes every listed expert of a layer on its rows (gate,
//!   up and SiLU fused, then down), split across a thread pool by output rows, waiting
//!   on a [`Ready`] source per projection; [`weighted_sum`] adds the top-k in rank order.
//!
//! Numerics (the contract the Python tests check): activations stay f32 from end to
//! end; weights are widened to f32 exactly (int8/int4 times their scales). The scalar
//! path is the reference; the vector paths differ from it only by summation order and
//! fused multiply-adds, within 1e-5 of the largest |partial product sum| per row in
//! f32 (tests: `tests/kernels.rs`). The AVX-512 BF16 and VNNI dot products would
//! round activations to bf16 / int8 and are not used for that reason; decode at these
//! sizes is bound by weight bytes, not by multiply-adds (docs/cpu-kernels.md).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod error;
mod format;
mod isa;
mod layer;
mod portable;
mod scalar;
mod simd;

pub use error::{KernelError, Result};
pub use format::{bf16_to_f32, f16_to_f32, ExpertFormat, Proj, WeightKind, MAX_DIM, SCALE_ALIGN};
pub use isa::{Dot, Isa};
pub use layer::{weighted_sum, AllReady, ExpertWeights, Kernels, Ready, Routing};
pub use scalar::silu;
