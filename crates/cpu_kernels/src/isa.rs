//! Which vector path runs: detected from the CPU at run time, or forced (tests, benches).

use crate::error::{KernelError, Result};
use crate::format::Proj;

/// An instruction set the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The scalar reference (one accumulator, no fused multiply-add).
    Scalar,
    /// 8-lane arrays in plain Rust (any CPU).
    Portable,
    /// AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// AVX-512F, 16 lanes.
    Avx512,
}

impl Isa {
    /// Every instruction set, slowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// Its name (`scalar`, `portable`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The instruction set called `name`, or `auto`: the best this CPU has.
    pub fn parse(name: &str) -> Result<Self> {
        if name == "auto" {
            return Ok(Self::best());
        }
        let isa = Self::ALL
            .into_iter()
            .find(|i| i.name() == name)
            .ok_or_else(|| KernelError::UnknownIsa { name: name.into() })?;
        if !isa.available() {
            return Err(KernelError::IsaUnavailable { isa: isa.name() });
        }
        Ok(isa)
    }

    /// Whether this CPU can run it.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar | Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Isa::Avx2.available() && is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The fastest available: AVX-512, else AVX2, else portable.
    pub fn best() -> Self {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Portable)
    }
}

/// A row dot product for one instruction set, callable safely: it can only be made by
/// [`Dot::new`], which checks that the CPU has the instructions.
#[derive(Debug, Clone, Copy)]
pub struct Dot {
    isa: Isa,
}

impl Dot {
    /// The dot product of `isa`, if this CPU can run it.
    pub fn new(isa: Isa) -> Result<Self> {
        if isa.available() {
            Ok(Self { isa })
        } else {
            Err(KernelError::IsaUnavailable { isa: isa.name() })
        }
    }

    /// Its instruction set.
    pub fn isa(self) -> Isa {
        self.isa
    }

    /// `sum_c W[r, c] * x[c]` for row `r < p.rows` of `p`; `x` has `p.cols` values.
    #[inline]
    pub fn dot(self, p: &Proj<'_>, r: usize, x: &[f32]) -> f32 {
        match self.isa {
            Isa::Scalar => crate::scalar::dot(p, r, x),
            // SAFETY: plain Rust; the trait contract holds for any CPU.
            Isa::Portable => unsafe { crate::simd::dot::<crate::portable::Portable>(p, r, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx2, fma and f16c.
            Isa::Avx2 => unsafe { crate::avx2::dot_avx2(p, r, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx512f (and the AVX2 set).
            Isa::Avx512 => unsafe { crate::avx512::dot_avx512(p, r, x) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => crate::scalar::dot(p, r, x),
        }
    }

    /// [`Self::dot`] of row `r` with each of `xs` (each result bit-identical to it),
    /// reading and widening the row's weights once for all of them.
    #[inline]
    pub fn dots(
        self,
        p: &Proj<'_>,
        r: usize,
        xs: [&[f32]; crate::simd::TOKENS],
    ) -> [f32; crate::simd::TOKENS] {
        match self.isa {
            Isa::Scalar => xs.map(|x| crate::scalar::dot(p, r, x)),
            // SAFETY: plain Rust; the trait contract holds for any CPU.
            Isa::Portable => unsafe { crate::simd::dots::<crate::portable::Portable>(p, r, xs) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx2, fma and f16c.
            Isa::Avx2 => unsafe { crate::avx2::dots_avx2(p, r, xs) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx512f (and the AVX2 set).
            Isa::Avx512 => unsafe { crate::avx512::dots_avx512(p, r, xs) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => xs.map(|x| crate::scalar::dot(p, r, x)),
        }
    }
}
