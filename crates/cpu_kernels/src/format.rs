//! The byte layouts of an expert's projections, as `docs/ftw-format.md` ("Expert
//! projections") defines them, and typed views of one projection's bytes.
//!
//! A projection is `[rows, cols]` (`[out, in]`). Views keep the raw bytes and read
//! multi-byte values little-endian (the format's byte order, and that of every CPU the
//! vector paths run on), so no alignment is assumed of the caller's buffers.

use crate::error::{KernelError, Result};

/// Largest rows or cols of a projection (the format's cap).
pub const MAX_DIM: usize = 1 << 24;
/// int8 and int4 weights are padded to this many bytes before their scales.
pub const SCALE_ALIGN: usize = 64;

/// How an expert's weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightKind {
    /// `raw` f32, row-major.
    F32,
    /// `raw` bf16, row-major.
    Bf16,
    /// `raw` f16, row-major.
    F16,
    /// `int8`: q `[rows, cols]`, pad, f32 scale per row.
    Int8,
    /// `int4`: packed nibbles `[rows, cols/2]` (`q + 8`, element 2j low), pad, bf16 scales
    /// `[rows, cols/group]`.
    Int4 {
        /// Inputs per scale (even, divides cols).
        group: usize,
    },
}

impl WeightKind {
    /// The kind for a file's scheme name (`raw`, `int8`, `int4`) and raw dtype name.
    pub fn parse(scheme: &str, dtype: &str, group: usize) -> Result<Self> {
        match (scheme, dtype) {
            ("raw", "f32") => Ok(Self::F32),
            ("raw", "bf16") => Ok(Self::Bf16),
            ("raw", "f16") => Ok(Self::F16),
            ("int8", _) => Ok(Self::Int8),
            ("int4", _) if group >= 2 && group.is_multiple_of(2) => Ok(Self::Int4 { group }),
            _ => Err(KernelError::BadFormat {
                reason: format!("scheme {scheme:?} dtype {dtype:?} group {group}"),
            }),
        }
    }
}

/// Rounds `n` up to a multiple of [`SCALE_ALIGN`].
fn padded(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(SCALE_ALIGN)
}

/// The format of every expert of a layer: one kind and the shapes of gate, up, down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertFormat {
    /// Storage of all three projections.
    pub kind: WeightKind,
    /// `(rows, cols)` of gate `[I, H]`, up `[I, H]`, down `[H, I]`.
    pub shapes: [(usize, usize); 3],
}

impl ExpertFormat {
    /// Checks that the shapes form a SwiGLU expert and fit the kind.
    pub fn new(kind: WeightKind, shapes: [(usize, usize); 3]) -> Result<Self> {
        let [g, u, d] = shapes;
        let bad = |reason: String| Err(KernelError::BadFormat { reason });
        if g != u || d != (g.1, g.0) {
            return bad(format!(
                "gate {g:?}, up {u:?}, down {d:?} are not [I,H],[I,H],[H,I]"
            ));
        }
        for (rows, cols) in shapes {
            if rows == 0 || cols == 0 || rows > MAX_DIM || cols > MAX_DIM {
                return bad(format!("shape ({rows}, {cols}) outside 1..={MAX_DIM}"));
            }
            if let WeightKind::Int4 { group } = kind {
                if cols % group != 0 {
                    return bad(format!("int4 group {group} does not divide {cols} columns"));
                }
            }
        }
        let f = Self { kind, shapes };
        for p in 0..3 {
            f.proj_bytes(p)?;
        }
        Ok(f)
    }

    /// Hidden size H (gate's cols).
    pub fn hidden(&self) -> usize {
        self.shapes[0].1
    }

    /// Expert intermediate size I (gate's rows).
    pub fn inter(&self) -> usize {
        self.shapes[0].0
    }

    /// Bytes of projection `p` (0 gate, 1 up, 2 down) in this format.
    pub fn proj_bytes(&self, p: usize) -> Result<usize> {
        let &(rows, cols) = self.shapes.get(p).ok_or_else(|| KernelError::BadFormat {
            reason: format!("projection {p}"),
        })?;
        let over = || KernelError::BadFormat {
            reason: format!("[{rows}, {cols}] overflows"),
        };
        let n = rows.checked_mul(cols).ok_or_else(over)?;
        let bytes = match self.kind {
            WeightKind::F32 => n.checked_mul(4),
            WeightKind::Bf16 | WeightKind::F16 => n.checked_mul(2),
            WeightKind::Int8 => padded(n).and_then(|b| b.checked_add(rows.checked_mul(4)?)),
            WeightKind::Int4 { group } => {
                padded(n / 2).and_then(|b| b.checked_add((n / group).checked_mul(2)?))
            }
        };
        bytes.ok_or_else(over)
    }

    /// A view of projection `p` from its bytes (exactly [`Self::proj_bytes`] long).
    pub fn view<'a>(&self, p: usize, bytes: &'a [u8]) -> Result<Proj<'a>> {
        let want = self.proj_bytes(p)?;
        if bytes.len() != want {
            return Err(KernelError::BadLength {
                what: "projection bytes",
                got: bytes.len(),
                want,
            });
        }
        let (rows, cols) = self.shapes.get(p).copied().unwrap_or_default();
        let n = rows * cols; // checked by proj_bytes
        let (weights, scales) = match self.kind {
            WeightKind::Int8 => bytes.split_at(padded(n).unwrap_or(n)),
            WeightKind::Int4 { .. } => bytes.split_at(padded(n / 2).unwrap_or(n)),
            _ => (bytes, &[][..]),
        };
        Ok(Proj {
            kind: self.kind,
            rows,
            cols,
            weights,
            scales,
        })
    }
}

/// One projection's bytes, split into weights and scales.
#[derive(Debug, Clone, Copy)]
pub struct Proj<'a> {
    /// Storage kind.
    pub kind: WeightKind,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The weights (including int8/int4 padding at the end).
    pub weights: &'a [u8],
    /// The scales (empty for raw kinds).
    pub scales: &'a [u8],
}

impl<'a> Proj<'a> {
    /// Bytes of one row's weights.
    pub fn row_bytes(&self) -> usize {
        match self.kind {
            WeightKind::F32 => self.cols * 4,
            WeightKind::Bf16 | WeightKind::F16 => self.cols * 2,
            WeightKind::Int8 => self.cols,
            WeightKind::Int4 { .. } => self.cols / 2,
        }
    }

    /// Row `r`'s weight bytes (`r < rows`).
    pub fn row(&self, r: usize) -> &'a [u8] {
        let b = self.row_bytes();
        self.weights.get(r * b..(r + 1) * b).unwrap_or_default()
    }

    /// Row `r`'s scales as bytes: one f32 (int8), `cols / group` bf16 (int4), none (raw).
    pub fn row_scales(&self, r: usize) -> &'a [u8] {
        let b = match self.kind {
            WeightKind::Int8 => 4,
            WeightKind::Int4 { group } => self.cols / group * 2,
            _ => 0,
        };
        self.scales.get(r * b..(r + 1) * b).unwrap_or_default()
    }
}

/// bf16 bits -> f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f16 bits -> f32 (exact; subnormals, infinities and NaN included).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exp = u32::from((bits >> 10) & 0x1f);
    let man = u32::from(bits & 0x3ff);
    let out = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: m * 2^-24, exactly representable in f32.
            let v = (m as f32) * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(out)
}

/// Little-endian u16 at element `i` of `b`.
#[inline(always)]
pub fn le_u16(b: &[u8], i: usize) -> u16 {
    match b.get(2 * i..2 * i + 2) {
        Some(&[lo, hi]) => u16::from_le_bytes([lo, hi]),
        _ => 0,
    }
}

/// Little-endian f32 at element `i` of `b`.
#[inline(always)]
pub fn le_f32(b: &[u8], i: usize) -> f32 {
    match b.get(4 * i..4 * i + 4) {
        Some(&[a, c, d, e]) => f32::from_le_bytes([a, c, d, e]),
        _ => 0.0,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_follow_the_format() {
        let shapes = [(64, 256), (64, 256), (256, 64)];
        let f = ExpertFormat::new(WeightKind::Int8, shapes).unwrap();
        assert_eq!(f.proj_bytes(0).unwrap(), 64 * 256 + 64 * 4);
        let f = ExpertFormat::new(WeightKind::Int4 { group: 32 }, shapes).unwrap();
        assert_eq!(f.proj_bytes(2).unwrap(), 256 * 32 + 256 * 2 * 2);
        let f = ExpertFormat::new(WeightKind::Int8, [(3, 5), (3, 5), (5, 3)]).unwrap();
        assert_eq!(f.proj_bytes(0).unwrap(), 64 + 12); // 15 bytes padded to 64
        assert!(
            ExpertFormat::new(WeightKind::Int4 { group: 4 }, [(3, 6), (3, 6), (6, 3)]).is_err()
        );
        assert!(ExpertFormat::new(WeightKind::F32, [(3, 6), (3, 6), (3, 6)]).is_err());
    }

    #[test]
    fn f16_conversion_is_exact() {
        for (bits, want) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x0001, 5.960_464_5e-8),
            (0x8001, -5.960_464_5e-8),
            (0x7bff, 65504.0),
            (0x0000, 0.0),
        ] {
            assert_eq!(f16_to_f32(bits), want, "{bits:#x}");
        }
        assert!(f16_to_f32(0x7c00).is_infinite() && f16_to_f32(0x7e00).is_nan());
    }
}
