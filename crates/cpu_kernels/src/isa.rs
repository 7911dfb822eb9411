//! Which vector path runs: detected from the CPU at run time, or forced (tests, benches).

use crate::act::{prepare, Act, I4_BLOCK};
use crate::error::{KernelError, Result};
use crate::format::{Proj, WeightKind};
use crate::simd::TOKENS;

/// An instruction set the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The scalar reference (one accumulator, no fused multiply-add).
    Scalar,
    /// 8-lane arrays in plain Rust (any CPU).
    Portable,
    /// AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// AVX-512F, 16 lanes (int4 rows through the permute-unpack kernel).
    Avx512,
    /// AVX-512F + BW + VL + BF16: as [`Isa::Avx512`], and bf16 and int4 rows through the
    /// BF16 dot product where the activation row is exactly bf16 (`act.rs`).
    Avx512Bf16,
}

impl Isa {
    /// Every instruction set, slowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Bf16,
    ];

    /// Its name (`scalar`, `portable`, `avx2`, `avx512`, `avx512bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
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
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => {
                Isa::Avx512.available()
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 => false,
        }
    }

    /// The fastest available: AVX-512 BF16, else AVX-512, else AVX2, else portable.
    pub fn best() -> Self {
        [Isa::Avx512Bf16, Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Portable)
    }
}

/// Rows the AVX-512 int8 rows kernel and the int4 BF16 and lanes kernels compute at
/// once, interleaved, by default (`FLINT_CPU_ROWS`: 4, 2 or 1, read once; anything
/// else: 1): 4 on Intel CPUs, 1 elsewhere. On the GPU box's Xeon four rows made a
/// one-thread layer call with its experts cached 2.1x (int8) and 1.45x (int4) faster,
/// and lost nothing from DRAM; on the CPU box's EPYC int8 lost ~10% at one thread, and
/// int4 from DRAM 25-33% (1,899 against 1,424 us at one thread, 1,008 against 787 at
/// two) though it gained 5-9% cached (docs/benchmarks.md, "Fourteenth session").
fn rows_at_once() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let default = if crate::avx512::intel() { 4 } else { 1 };
        #[cfg(not(target_arch = "x86_64"))]
        let default = 1;
        crate::env_setting("FLINT_CPU_ROWS", default)
    })
}

/// Whether int4 rows take the lanes kernel by default (`FLINT_CPU_INT4`: `lanes` or
/// `bf16`, read once; default `lanes` on Intel CPUs, where the AVX-512 BF16 dot product
/// runs at 0.46 per cycle against 1-1.8 for the permutes and FMAs the lanes kernel uses,
/// docs/benchmarks.md, "Fourteenth session").
fn int4_lanes() -> bool {
    // (`vnni` takes the int4 VNNI kernel instead: `int4_vnni`)
    static LANES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LANES.get_or_init(|| match std::env::var("FLINT_CPU_INT4").as_deref() {
        Ok("lanes") => true,
        Ok("bf16") => false,
        #[cfg(target_arch = "x86_64")]
        _ => crate::avx512::intel(),
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    })
}

/// Whether int8 rows take the VNNI kernel by default (`FLINT_CPU_INT8`: `vnni` or
/// `f32`, read once; default `vnni`, where the CPU has AVX-512 VNNI): the activation
/// rounded to 8 bits per 32 columns (llama.cpp's Q8_0 activations), integer dot
/// products of 64 columns a `vpdpbusd`. On the GPU box's Xeon issue 15's figure at 16
/// threads went 0.59-0.64 -> 0.89-0.90 of the plain read; on the CPU box's EPYC a
/// one-thread call from the caches 1.4-1.6x faster, from DRAM the same
/// (docs/benchmarks.md, "Nineteenth session").
fn int8_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| !matches!(std::env::var("FLINT_CPU_INT8").as_deref(), Ok("f32")))
}

/// Whether int4 rows take the VNNI kernel by default (`FLINT_CPU_INT4`: `vnni`, or
/// `lanes` / `bf16` for the others, read once; default `vnni` on Intel CPUs with AVX-512
/// VNNI): the activation rounded to 8 bits as for int8, the nibbles as unsigned bytes
/// into `vpdpbusd`. On the Xeon issue 15's figure at 16 threads went 0.77-0.79 -> 0.81-
/// 0.84 (0.76 -> 0.91 for the binding alone) and the rows kernel 26 -> 54 G weights/s a
/// thread; on the EPYC it computes no faster than the BF16 kernel (53 against 50-51 G
/// weights/s from L2, the same layer call), so the exact kernels stay there.
fn int4_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| match std::env::var("FLINT_CPU_INT4").as_deref() {
        Ok("vnni") => true,
        Ok("lanes" | "bf16") => false,
        #[cfg(target_arch = "x86_64")]
        _ => crate::avx512::intel(),
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    })
}

/// Whether this CPU has what the VNNI kernels need (AVX-512 F, BW, VL, VNNI).
fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A row dot product for one instruction set, callable safely: it can only be made by
/// [`Dot::new`], which checks that the CPU has the instructions.
#[derive(Debug, Clone, Copy)]
pub struct Dot {
    isa: Isa,
    /// Rows [`Self::rows_act`]'s AVX-512 kernels compute at once: 1, 2 or 4.
    rows: usize,
    /// Whether int4 rows go through the lanes kernel (`i4_lanes.rs`) instead of the
    /// AVX-512 BF16 one (AVX-512 BF16 CPUs only).
    lanes: bool,
    /// Whether int8 rows go through the VNNI kernel with 8-bit activations (AVX-512
    /// VNNI CPUs only, `with_int8_vnni`).
    q8: bool,
    /// The same for int4 rows (`with_int4_vnni`).
    q4: bool,
}

impl Dot {
    /// The dot product of `isa`, if this CPU can run it, computing `FLINT_CPU_ROWS` rows
    /// at once in the rows kernels (default 4 on Intel CPUs, 1 elsewhere), int8 rows by
    /// the kernel `FLINT_CPU_INT8` names (`vnni` or `f32`; default `vnni` where the CPU
    /// has AVX-512 VNNI) and int4 rows by the one `FLINT_CPU_INT4` names (`vnni`, `lanes`
    /// or `bf16`; default `vnni` on Intel CPUs with AVX-512 VNNI, `lanes` on other Intel
    /// CPUs, `bf16` elsewhere). Any other value of either: the default.
    pub fn new(isa: Isa) -> Result<Self> {
        if isa.available() {
            let dot = Self {
                isa,
                rows: 1,
                lanes: false,
                q8: false,
                q4: false,
            };
            Ok(dot
                .with_rows(rows_at_once())
                .with_int4_lanes(int4_lanes())
                .with_int8_vnni(int8_vnni())
                .with_int4_vnni(int4_vnni()))
        } else {
            Err(KernelError::IsaUnavailable { isa: isa.name() })
        }
    }

    /// The same, int4 rows through the lanes kernel (`lanes`) or the AVX-512 BF16 one,
    /// on AVX-512 BF16 (elsewhere this changes nothing). The two round differently;
    /// each is tested against the reference.
    pub fn with_int4_lanes(self, lanes: bool) -> Self {
        let lanes = lanes && self.isa == Isa::Avx512Bf16;
        Self { lanes, ..self }
    }

    /// The same, int8 rows through the VNNI kernel (`vnni`: the activation rounded to 8
    /// bits per 32 columns, `Act::with_q8`, rows of a multiple of 64 columns with
    /// finite activations) or the f32 kernels, on AVX-512 with VNNI (elsewhere the f32
    /// kernels). Its results are the int8 scheme's (`scalar::dot_q8`), not the f32
    /// reference's: the rounding of the activation is the difference.
    pub fn with_int8_vnni(self, vnni: bool) -> Self {
        let avx512 = matches!(self.isa, Isa::Avx512 | Isa::Avx512Bf16);
        Self {
            q8: vnni && avx512 && vnni_available(),
            ..self
        }
    }

    /// Whether int8 rows go through the VNNI kernel (`with_int8_vnni`).
    pub fn int8_vnni(self) -> bool {
        self.q8
    }

    /// The same, int4 rows (the shapes `act::q4_group` takes: groups of 32, 64 or a
    /// multiple of 128, rows of whole groups and of a multiple of 128 columns) through
    /// the int4 VNNI kernel with the 8-bit activation, ahead of the lanes and BF16
    /// kernels (`scalar::dot_q4` is its reference).
    pub fn with_int4_vnni(self, vnni: bool) -> Self {
        let avx512 = matches!(self.isa, Isa::Avx512 | Isa::Avx512Bf16);
        Self {
            q4: vnni && avx512 && vnni_available(),
            ..self
        }
    }

    /// Whether int4 rows go through the VNNI kernel (`with_int4_vnni`).
    pub fn int4_vnni(self) -> bool {
        self.q4
    }

    /// The same, [`Self::rows_act`] computing `rows` rows at once, interleaved (4 or 2;
    /// anything else: one at a time). Every row's result is the same bits at any count.
    pub fn with_rows(self, rows: usize) -> Self {
        let rows = if matches!(rows, 2 | 4) { rows } else { 1 };
        Self { rows, ..self }
    }

    /// Its instruction set.
    pub fn isa(self) -> Isa {
        self.isa
    }

    /// The variants it takes for rows of `kind` where the instruction set has a choice,
    /// for run headers: `int8 vnni` or `int4 vnni` (the VNNI kernels, for the shapes
    /// they take), else `int4 lanes` or `int4 bf16` (int4 on AVX-512 BF16; `bf16` is the
    /// AVX-512 BF16 kernel for exactly-bf16 activations, the f32 int4 kernel for others),
    /// then `one row at a time` or `N rows at once` (int8 on AVX-512, int4 on AVX-512
    /// BF16 or through VNNI); empty elsewhere.
    pub fn variants(self, kind: WeightKind) -> String {
        let mut parts = Vec::new();
        if self.q8 && kind == WeightKind::Int8 {
            parts.push("int8 vnni".to_string());
        }
        let int4 = matches!(kind, WeightKind::Int4 { .. });
        if self.q4 && int4 {
            parts.push("int4 vnni".to_string());
        } else if self.isa == Isa::Avx512Bf16 && int4 {
            parts.push(
                if self.lanes {
                    "int4 lanes"
                } else {
                    "int4 bf16"
                }
                .to_string(),
            );
        }
        // int4 rows on plain AVX-512 take the f32 int4 kernel, one row at a time (the
        // VNNI kernel takes rows at once on either).
        let rows = kind == WeightKind::Int8 || (int4 && (self.isa == Isa::Avx512Bf16 || self.q4));
        if matches!(self.isa, Isa::Avx512 | Isa::Avx512Bf16) && rows {
            parts.push(match self.rows {
                1 => "one row at a time".to_string(),
                n => format!("{n} rows at once"),
            });
        }
        parts.join(", ")
    }

    /// `x` prepared for this instruction set's kernels of `kind` (once per activation
    /// row and layer call; see [`Act`]).
    pub fn prepare<'a>(self, kind: WeightKind, x: &'a [f32]) -> Act<'a> {
        let i4 = matches!(self.isa, Isa::Avx512 | Isa::Avx512Bf16);
        prepare(
            x,
            kind,
            self.isa == Isa::Avx512Bf16,
            i4,
            self.lanes,
            self.q8,
            self.q4,
        )
    }

    /// `sum_c W[r, c] * x[c]` for row `r < p.rows` of `p`; `x` has `p.cols` values.
    /// The same as [`Self::dot_act`] of [`Self::prepare`]`(p.kind, x)`.
    #[inline]
    pub fn dot(self, p: &Proj<'_>, r: usize, x: &[f32]) -> f32 {
        self.dot_act(p, r, &self.prepare(p.kind, x))
    }

    /// [`Self::dot`] of row `r` with each of `xs` (each result bit-identical to it),
    /// reading and widening the row's weights once for all of them (the VNNI kernels:
    /// once per token).
    #[inline]
    pub fn dots(self, p: &Proj<'_>, r: usize, xs: [&[f32]; TOKENS]) -> [f32; TOKENS] {
        let acts = xs.map(|x| self.prepare(p.kind, x));
        self.dots_act(p, r, [&acts[0], &acts[1], &acts[2], &acts[3]])
    }

    /// Row `r` of `p` dotted with a prepared activation row.
    #[inline]
    pub fn dot_act(self, p: &Proj<'_>, r: usize, a: &Act<'_>) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if let Some([v]) = self.special(p, r, [a]) {
            return v;
        }
        self.dot_f32(p, r, a.f32_row())
    }

    /// Rows `r0..r0 + out.len()` of `p` dotted with `a`, each the bits [`Self::dot_act`]
    /// gives for that row; in one kernel call where one exists (AVX-512: the BF16 bf16
    /// and int4 kernels of a one-plane activation, the int4 kernel of the f32 int4
    /// order, and the f32 kernels of a plain row), else row by row. A decode step's tasks
    /// (one token) take this: per-row dispatch cost about as much as a 768-column int4
    /// row's reading (docs/benchmarks.md, "Rows in one call").
    pub fn rows_act(self, p: &Proj<'_>, r0: usize, a: &Act<'_>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if self.rows_special(p, r0, a, out) {
                return;
            }
            if a.is_plain() && matches!(self.isa, Isa::Avx512 | Isa::Avx512Bf16) {
                // SAFETY: `Dot::new` checked avx512f; a plain row is what `dot_act` reads
                // through the same kernel (`dot_f32`), row by row.
                return unsafe { crate::avx512::rows_avx512(p, r0, a.f32_row(), out, self.rows) };
            }
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dot_act(p, r0 + i, a);
        }
    }

    /// [`Self::rows_act`] by the AVX-512 rows kernels of prepared activations; false
    /// where they do not apply (the conditions of [`Self::special`] for each row).
    #[cfg(target_arch = "x86_64")]
    fn rows_special(self, p: &Proj<'_>, r0: usize, a: &Act<'_>, out: &mut [f32]) -> bool {
        let (n, cols, rb) = (out.len(), p.cols, p.row_bytes());
        let avx512 = matches!(self.isa, Isa::Avx512 | Isa::Avx512Bf16);
        if n == 0 || a.x.len() != cols || !avx512 {
            return false;
        }
        if p.kind == WeightKind::Int8 && a.q8.len() > 0 {
            return self.rows_q8(p, r0, a, out);
        }
        let int4 = matches!(p.kind, WeightKind::Int4 { .. });
        if int4 && a.q4.len() > 0 {
            return self.rows_q4(p, r0, a, out);
        }
        if int4 && a.i4l.len() > 0 {
            return self.rows_i4_lanes(p, r0, a, out);
        }
        if int4 && (self.isa == Isa::Avx512 || a.i4_planes == 0) {
            return self.rows_i4_f32(p, r0, a, out);
        }
        if self.isa != Isa::Avx512Bf16 {
            return false;
        }
        let Some(w) = p.weights.get(r0 * rb..(r0 + n) * rb) else {
            return false;
        };
        match p.kind {
            WeightKind::Bf16 => {
                let stride = cols.next_multiple_of(crate::act::BF16_BLOCK);
                if a.planes != 1 || rb != 2 * cols || a.bf16.as_slice().len() < stride {
                    return false;
                }
                let x = a.bf16.as_slice().as_ptr();
                // SAFETY: `Dot::new` checked avx512f/bw/bf16; each of the n rows has 2 * cols
                // bytes (the slice above) and the plane `stride` values (checked above).
                unsafe { crate::avx512::rows_bf16(w.as_ptr(), cols, x, stride, out) };
                true
            }
            WeightKind::Int4 { .. } if a.i4_planes == 1 => {
                let Some(rows) = i4_rows(p, r0, n, a.i4_bf16.as_slice()) else {
                    return false;
                };
                // SAFETY: `Dot::new` checked avx512f/bw/vl/bf16; `i4_rows` checked the n
                // rows (cols / 2 bytes and cols / group bf16 scales each) and the plane.
                unsafe { crate::i4_steps::rows::<crate::avx512::Bf16Steps>(rows, out, self.rows) };
                true
            }
            _ => false,
        }
    }

    /// The int8 rows of an 8-bit activation (`Act::with_q8`) through the VNNI kernel:
    /// false where it does not apply (then row by row through `dot_act`, the same
    /// kernel a row at a time).
    #[cfg(target_arch = "x86_64")]
    fn rows_q8(self, p: &Proj<'_>, r0: usize, a: &Act<'_>, out: &mut [f32]) -> bool {
        let (n, cols) = (out.len(), p.cols);
        let ok = self.q8
            && p.row_bytes() == cols
            && cols.is_multiple_of(crate::act::Q8_STEP)
            && a.q8.len() == cols
            && a.q8_neg.len() == cols / 4
            && a.q8_scale.len() == cols / 4
            && p.weights.len() >= (r0 + n) * cols
            && p.scales.len() >= (r0 + n) * 4;
        if !ok {
            return false;
        }
        // SAFETY: `with_int8_vnni` checked avx512f/bw/vnni; the rows, their scales and
        // the activation's parts have the lengths the kernel reads (checked above).
        unsafe {
            crate::avx512::rows_i8_q8(
                p.weights.as_ptr(),
                p.scales.as_ptr(),
                cols,
                a.q8.as_slice().as_ptr(),
                a.q8_neg.as_slice().as_ptr(),
                a.q8_scale.as_slice().as_ptr(),
                r0,
                out,
                self.rows,
            )
        };
        true
    }

    /// The int4 rows of an 8-bit activation in the int4 VNNI order (`Act::with_q4`)
    /// through the VNNI kernel: false where it does not apply.
    #[cfg(target_arch = "x86_64")]
    fn rows_q4(self, p: &Proj<'_>, r0: usize, a: &Act<'_>, out: &mut [f32]) -> bool {
        let WeightKind::Int4 { group } = p.kind else {
            return false;
        };
        let (n, cols, rb) = (out.len(), p.cols, p.row_bytes());
        let sb = cols / group.max(1) * 2;
        let ok = self.q4
            && crate::act::q4_group(group, cols)
            && rb == cols / 2
            && a.q4.len() == cols
            && a.q4_neg.len() == cols / 8
            && a.q4_scale.len() == cols / 8
            && p.weights.len() >= (r0 + n) * rb
            && p.scales.len() >= (r0 + n) * sb;
        if !ok {
            return false;
        }
        // SAFETY: `with_int4_vnni` checked avx512f/bw/vl/vnni; the rows, their scales and
        // the activation's parts have the lengths the kernel reads (checked above).
        unsafe {
            crate::avx512::rows_i4_q4(
                p.weights.as_ptr(),
                p.scales.as_ptr(),
                cols,
                group,
                a.q4.as_slice().as_ptr(),
                a.q4_neg.as_slice().as_ptr(),
                a.q4_scale.as_slice().as_ptr(),
                r0,
                out,
                self.rows,
            )
        };
        true
    }

    /// The int4 rows of an activation in the lanes order (`rows_special`'s): false where
    /// the lanes kernel does not apply.
    #[cfg(target_arch = "x86_64")]
    fn rows_i4_lanes(self, p: &Proj<'_>, r0: usize, a: &Act<'_>, out: &mut [f32]) -> bool {
        if self.isa != Isa::Avx512Bf16 {
            return false;
        }
        let Some(rows) = i4_rows(p, r0, out.len(), a.i4l.as_slice()) else {
            return false;
        };
        // SAFETY: `Dot::new` checked avx512f/bw/vl (AVX-512 BF16); `i4_rows` checked the
        // rows and `x`.
        unsafe { crate::i4_steps::rows::<crate::i4_lanes::Lanes>(rows, out, self.rows) };
        true
    }

    /// The int4 rows of an f32 activation in the int4 order ([`Self::special`]'s last
    /// arm, on AVX-512): `rows_special` for those; false where they do not apply.
    #[cfg(target_arch = "x86_64")]
    fn rows_i4_f32(self, p: &Proj<'_>, r0: usize, a: &Act<'_>, out: &mut [f32]) -> bool {
        let WeightKind::Int4 { group } = p.kind else {
            return false;
        };
        let (n, cols, rb) = (out.len(), p.cols, p.row_bytes());
        if group == 0 || !i4_shape(group, cols) || rb != cols / 2 || a.i4.as_slice().len() != cols {
            return false;
        }
        let sb = cols / group * 2;
        let (Some(w), Some(s)) = (
            p.weights.get(r0 * rb..(r0 + n) * rb),
            p.scales.get(r0 * sb..(r0 + n) * sb),
        ) else {
            return false;
        };
        let x = a.i4.as_slice().as_ptr();
        // SAFETY: `Dot::new` checked avx512f; each of the n rows has cols / 2 bytes and
        // cols / group bf16 scales (the slices above), the reordered x cols values.
        unsafe { crate::avx512::rows_i4(w.as_ptr(), rb, s.as_ptr(), sb, cols, group, x, out) };
        true
    }

    /// [`Self::dot_act`] of row `r` with each of `acts`, bit-identical to it, reading
    /// the row's weights once for all of them.
    #[inline]
    pub fn dots_act(self, p: &Proj<'_>, r: usize, acts: [&Act<'_>; TOKENS]) -> [f32; TOKENS] {
        #[cfg(target_arch = "x86_64")]
        {
            let same = acts.iter().all(|a| {
                a.planes == acts[0].planes
                    && a.i4_planes == acts[0].i4_planes
                    && a.i4.len() == acts[0].i4.len()
                    && a.i4l.len() == acts[0].i4l.len()
                    && a.q8.len() == acts[0].q8.len()
                    && a.q4.len() == acts[0].q4.len()
            });
            if !same {
                return acts.map(|a| self.dot_act(p, r, a));
            }
            if let Some(v) = self.special(p, r, acts) {
                return v;
            }
        }
        self.dots_f32(p, r, acts.map(|a| a.f32_row()))
    }

    /// The AVX-512 kernels that read prepared activations (bf16 planes, int4 order), for
    /// `T` rows prepared alike; `None` where they do not apply (then the f32 kernels).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn special<const T: usize>(
        self,
        p: &Proj<'_>,
        r: usize,
        acts: [&Act<'_>; T],
    ) -> Option<[f32; T]> {
        let w = p.row(r);
        let cols = p.cols;
        if acts.iter().any(|a| a.x.len() != cols) {
            return None;
        }
        match (self.isa, p.kind) {
            (_, WeightKind::Int4 { .. }) if acts.iter().all(|a| a.q4.len() > 0) => {
                let mut out = [0.0f32; T];
                for (o, a) in out.iter_mut().zip(acts) {
                    let mut one = [0.0f32];
                    if !self.rows_q4(p, r, a, &mut one) {
                        return None;
                    }
                    *o = one[0];
                }
                Some(out)
            }
            (_, WeightKind::Int8) if acts.iter().all(|a| a.q8.len() > 0) => {
                // one row at a time through the rows kernel: each token's bits as alone
                let mut out = [0.0f32; T];
                for (o, a) in out.iter_mut().zip(acts) {
                    let mut one = [0.0f32];
                    if !self.rows_q8(p, r, a, &mut one) {
                        return None;
                    }
                    *o = one[0];
                }
                Some(out)
            }
            (Isa::Avx512Bf16, WeightKind::Bf16) => {
                let np = acts.first()?.planes;
                let stride = cols.next_multiple_of(crate::act::BF16_BLOCK);
                let ok = np == 1
                    && w.len() >= 2 * cols
                    && acts
                        .iter()
                        .all(|a| a.planes == np && a.bf16.as_slice().len() >= np * stride);
                if !ok {
                    return None;
                }
                let xs = acts.map(|a| a.bf16.as_slice().as_ptr());
                // SAFETY: `Dot::new` checked avx512f/bw/bf16; the row has 2 * cols bytes and
                // every plane `stride` values (checked above).
                Some(unsafe { crate::avx512::dot_bf16_planes::<T>(w.as_ptr(), cols, xs, stride) })
            }
            (Isa::Avx512Bf16, WeightKind::Int4 { group })
                if acts.first().is_some_and(|a| a.i4l.len() > 0) =>
            {
                let s = i4_row_scales(p, r, group)?;
                if !acts.iter().all(|a| a.i4l.as_slice().len() >= cols) {
                    return None;
                }
                let xs = acts.map(|a| a.i4l.as_slice().as_ptr());
                // SAFETY: `Dot::new` checked avx512f/bw/vl (AVX-512 BF16); the row has cols / 2
                // bytes, its scales cols / group bf16, every activation cols values (above).
                Some(unsafe {
                    crate::i4_steps::dot::<crate::i4_lanes::Lanes, T>(
                        w.as_ptr(),
                        s.as_ptr(),
                        cols,
                        group,
                        xs,
                    )
                })
            }
            (Isa::Avx512Bf16, WeightKind::Int4 { group })
                if acts.first().is_some_and(|a| a.i4_planes > 0) =>
            {
                let s = i4_row_scales(p, r, group)?;
                let np = acts.first()?.i4_planes;
                let ok = acts
                    .iter()
                    .all(|a| a.i4_planes == np && a.i4_bf16.as_slice().len() >= np * cols);
                if !ok || np != 1 {
                    return None;
                }
                let xs = acts.map(|a| a.i4_bf16.as_slice().as_ptr());
                // SAFETY: `Dot::new` checked avx512f/bw/vl/bf16; the row has cols / 2 bytes,
                // its scales cols / group bf16, every plane cols values (checked above).
                Some(unsafe {
                    crate::i4_steps::dot::<crate::avx512::Bf16Steps, T>(
                        w.as_ptr(),
                        s.as_ptr(),
                        cols,
                        group,
                        xs,
                    )
                })
            }
            (Isa::Avx512 | Isa::Avx512Bf16, WeightKind::Int4 { group }) => {
                let s = p.row_scales(r);
                let ok = i4_shape(group, cols)
                    && w.len() >= cols / 2
                    && s.len() >= cols / group * 2
                    && acts.iter().all(|a| a.i4.as_slice().len() == cols);
                if !ok {
                    return None;
                }
                let xs = acts.map(|a| a.i4.as_slice().as_ptr());
                // SAFETY: `Dot::new` checked avx512f; the row has cols / 2 bytes, its scales
                // cols / group bf16 and every reordered x cols values (checked above).
                Some(unsafe { crate::avx512::dot_i4::<T>(w.as_ptr(), s.as_ptr(), cols, group, xs) })
            }
            _ => None,
        }
    }

    /// The f32 kernels: row `r` of `p` dotted with the f32 row `x`.
    #[inline]
    pub(crate) fn dot_f32(self, p: &Proj<'_>, r: usize, x: &[f32]) -> f32 {
        match self.isa {
            Isa::Scalar => crate::scalar::dot(p, r, x),
            // SAFETY: plain Rust; the trait contract holds for any CPU.
            Isa::Portable => unsafe { crate::simd::dot::<crate::portable::Portable>(p, r, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx2, fma and f16c.
            Isa::Avx2 => unsafe { crate::avx2::dot_avx2(p, r, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx512f (and the AVX2 set).
            Isa::Avx512 | Isa::Avx512Bf16 => unsafe { crate::avx512::dot_avx512(p, r, x) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 => crate::scalar::dot(p, r, x),
        }
    }

    /// [`Self::dot_f32`] of row `r` with each of `xs` (each bit-identical to it).
    #[inline]
    pub(crate) fn dots_f32(self, p: &Proj<'_>, r: usize, xs: [&[f32]; TOKENS]) -> [f32; TOKENS] {
        match self.isa {
            Isa::Scalar => xs.map(|x| crate::scalar::dot(p, r, x)),
            // SAFETY: plain Rust; the trait contract holds for any CPU.
            Isa::Portable => unsafe { crate::simd::dots::<crate::portable::Portable>(p, r, xs) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx2, fma and f16c.
            Isa::Avx2 => unsafe { crate::avx2::dots_avx2(p, r, xs) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Dot::new` checked avx512f (and the AVX2 set).
            Isa::Avx512 | Isa::Avx512Bf16 => unsafe { crate::avx512::dots_avx512(p, r, xs) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 => xs.map(|x| crate::scalar::dot(p, r, x)),
        }
    }
}

/// Whether int4 rows of `cols` columns in groups of `group` take the kernels of
/// 128-column steps (`i4_steps.rs`: the AVX-512 BF16 and lanes kernels), one row or many.
#[cfg(target_arch = "x86_64")]
fn i4_bf16_shape(group: usize, cols: usize) -> bool {
    crate::act::i4_bf16_group(group)
        && cols.is_multiple_of(crate::act::I4_BF16_BLOCK)
        && cols.is_multiple_of(group)
}

/// Row `r`'s scales of int4 projection `p` (groups of `group`), if the row fits the
/// kernels of 128-column steps ([`i4_bf16_shape`], a whole row and its scales).
#[cfg(target_arch = "x86_64")]
fn i4_row_scales<'a>(p: &Proj<'a>, r: usize, group: usize) -> Option<&'a [u8]> {
    let (cols, s) = (p.cols, p.row_scales(r));
    let ok = group > 0
        && i4_bf16_shape(group, cols)
        && p.row(r).len() >= cols / 2
        && s.len() >= cols / group * 2;
    ok.then_some(s)
}

/// Rows `r0..r0 + n` of int4 projection `p` for the kernels of 128-column steps (the
/// BF16 and lanes kernels) with activation `x` in their order, if the shapes fit
/// ([`i4_bf16_shape`], whole rows and scales, `x` of `cols` values).
#[cfg(target_arch = "x86_64")]
fn i4_rows<X>(p: &Proj<'_>, r0: usize, n: usize, x: &[X]) -> Option<crate::i4_steps::I4Rows<X>> {
    let WeightKind::Int4 { group } = p.kind else {
        return None;
    };
    let (cols, rb) = (p.cols, p.row_bytes());
    if group == 0 || !i4_bf16_shape(group, cols) || rb != cols / 2 || x.len() < cols {
        return None;
    }
    let sb = cols / group * 2;
    let w = p.weights.get(r0 * rb..(r0 + n) * rb)?;
    let s = p.scales.get(r0 * sb..(r0 + n) * sb)?;
    Some(crate::i4_steps::I4Rows {
        w: w.as_ptr(),
        row_bytes: rb,
        s: s.as_ptr(),
        scale_bytes: sb,
        cols,
        group,
        x: x.as_ptr(),
    })
}

/// Whether they take the AVX-512 int4 kernel of the f32 int4 order (`avx512::dot_i4`).
#[cfg(target_arch = "x86_64")]
fn i4_shape(group: usize, cols: usize) -> bool {
    group.is_multiple_of(I4_BLOCK) && cols.is_multiple_of(group)
}
