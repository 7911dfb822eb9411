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
//! end; weights are widened to f32 exactly (int8/int4 times their scales). The scalar
//! path is the reference; the vector paths differ from it only by summation order and
//! fused multiply-adds, within 1e-5 of the largest |partial product sum| per row in
//! f32 (tests: `tests/kernels.rs`).
//!
//! The AVX-512 BF16 path ([`Isa::Avx512Bf16`], bf16 experts) keeps that contract: each
//! activation row is split once per call into the fewest bf16 planes that sum to it
//! exactly ([`Act`]: one for a row that already holds bf16 values, such as a bf16
//! model's hidden state into gate/up; up to three for an f32 row, such as the SiLU
//! product into down), and `vdpbf16ps` multiplies the bf16 weights with each plane:
//! bf16 x bf16 products are exact in f32, so only the order of the adds differs from
//! the reference. Rows it cannot split exactly (inf/NaN, or |x| < 2^-100 where the
//! instruction flushes subnormals) go to the f32 kernel. The choice depends on the row
//! only, so a streamed layer (in waves) and a resident one take the same kernel. The
//! VNNI int8 dot product would round activations to 8 bits and is not used.

mod act;
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

pub use act::Act;
pub use error::{KernelError, Result};
pub use format::{bf16_to_f32, f16_to_f32, ExpertFormat, Proj, WeightKind, MAX_DIM, SCALE_ALIGN};
pub use isa::{Dot, Isa};
pub use layer::{weighted_sum, AllReady, ExpertWeights, Kernels, Ready, Routing};
pub use scalar::silu;
