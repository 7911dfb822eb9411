//! The expert layout: grid size, quantization scheme and projection shapes shared by
//! every routed expert of the file, and the byte size of each projection it implies.
//!
//! A projection is stored as the compute kernels read it (row-major `[rows, cols]`,
//! `rows` = output features):
//! - `Raw(dtype)`: `rows * cols` elements of `dtype` (f32, f16 or bf16);
//! - `Int8`: `rows * cols` int8 (symmetric, per output row), zero padding to a multiple
//!   of 64 bytes, then `rows` f32 scales;
//! - `Int4 { group_size }`: `rows * cols / 2` bytes, element `2j` in the low nibble and
//!   `2j + 1` in the high nibble of byte `j`, each nibble `q + 8` for `q` in [-8, 7];
//!   zero padding to 64 bytes; then `rows * cols / group_size` bf16 scales, row-major
//!   (group `g` of row `r` at index `r * cols / group_size + g`).

use crate::consts::{
    ALIGN, EXPERT_LAYOUT_SIZE, MAX_EXPERTS_PER_LAYER, MAX_GROUP_SIZE, MAX_ITEM_BYTES, MAX_LAYERS,
    MAX_PROJ_DIM, SCALE_ALIGN,
};
use crate::cursor::{align_up, Cursor, PutLe};
use crate::dtype::DType;
use crate::error::{FtwError, Result};

/// Quantization scheme of the routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Unquantized, in the given float type.
    Raw(DType),
    /// Per-output-channel symmetric int8 with f32 scales.
    Int8,
    /// Symmetric int4 in groups along the input dimension, one bf16 scale per group.
    Int4 {
        /// Elements per scale group.
        group_size: u32,
    },
}

impl Scheme {
    /// Code stored in the layout block.
    pub fn code(self) -> u8 {
        match self {
            Scheme::Raw(_) => 0,
            Scheme::Int8 => 1,
            Scheme::Int4 { .. } => 2,
        }
    }
}

/// Shape of one projection: `rows` output features by `cols` input features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProjShape {
    /// Output features.
    pub rows: u32,
    /// Input features.
    pub cols: u32,
}

/// What every expert slab of the file looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Layers in the expert grid (all model layers, MoE or not).
    pub n_layers: u32,
    /// Routed experts per layer.
    pub n_experts: u32,
    /// Quantization of every projection.
    pub scheme: Scheme,
    /// Shapes of gate, up and down, in that order.
    pub proj: [ProjShape; 3],
}

/// Names of the three projections, in storage order.
pub const PROJ_NAMES: [&str; 3] = ["gate", "up", "down"];

impl ExpertLayout {
    /// The layout of a file without routed experts.
    pub fn empty() -> Self {
        let zero = ProjShape { rows: 0, cols: 0 };
        Self {
            n_layers: 0,
            n_experts: 0,
            scheme: Scheme::Raw(DType::BF16),
            proj: [zero; 3],
        }
    }

    /// True when the file holds no expert grid.
    pub fn is_empty(&self) -> bool {
        self.n_layers == 0
    }

    /// Bytes of projection `p` (0 = gate, 1 = up, 2 = down).
    pub fn proj_bytes(&self, p: usize) -> Result<u64> {
        let s = self
            .proj
            .get(p)
            .ok_or_else(|| bad(format!("no projection {p}")))?;
        let n = u64::from(s.rows) * u64::from(s.cols); // both < 2^24: no overflow
        let name = PROJ_NAMES.get(p).unwrap_or(&"?");
        let overflow = || FtwError::Overflow {
            what: format!("{name} projection"),
        };
        let bytes = match self.scheme {
            Scheme::Raw(d) => n.checked_mul(d.size()).ok_or_else(overflow)?,
            Scheme::Int8 => align_up(n, SCALE_ALIGN)
                .and_then(|w| w.checked_add(u64::from(s.rows) * 4))
                .ok_or_else(overflow)?,
            Scheme::Int4 { group_size } => {
                let groups = n / u64::from(group_size);
                align_up(n / 2, SCALE_ALIGN)
                    .and_then(|w| w.checked_add(groups * 2))
                    .ok_or_else(overflow)?
            }
        };
        Ok(bytes)
    }

    /// Offsets of gate, up, down inside a slab and the slab's length, as the writer
    /// lays them out: each projection starts on the next 4 KiB boundary.
    pub fn canonical_slab(&self) -> Result<([u64; 3], [u64; 3], u64)> {
        let mut offs = [0u64; 3];
        let mut lens = [0u64; 3];
        let mut pos = 0u64;
        for (p, (off, len_out)) in offs.iter_mut().zip(lens.iter_mut()).enumerate() {
            let len = self.proj_bytes(p)?;
            *off = pos;
            *len_out = len;
            pos = pos
                .checked_add(len)
                .and_then(|e| align_up(e, ALIGN))
                .ok_or_else(|| FtwError::Overflow {
                    what: "expert slab".into(),
                })?;
        }
        Ok((offs, lens, pos))
    }

    /// Checks the layout against the format's rules.
    pub fn validate(&self) -> Result<()> {
        if self.n_layers > MAX_LAYERS {
            return Err(too_large(
                "layer count",
                self.n_layers.into(),
                MAX_LAYERS.into(),
            ));
        }
        if self.n_experts > MAX_EXPERTS_PER_LAYER {
            return Err(too_large(
                "experts per layer",
                self.n_experts.into(),
                MAX_EXPERTS_PER_LAYER.into(),
            ));
        }
        if self.is_empty() {
            return Ok(());
        }
        if self.n_experts == 0 {
            return Err(bad(
                "a grid with layers needs at least one expert per layer".into(),
            ));
        }
        for (s, name) in self.proj.iter().zip(PROJ_NAMES) {
            for (v, dim) in [(s.rows, "rows"), (s.cols, "cols")] {
                if v == 0 || v > MAX_PROJ_DIM {
                    return Err(bad(format!(
                        "{name} {dim} = {v}, must be in 1..={MAX_PROJ_DIM}"
                    )));
                }
            }
        }
        match self.scheme {
            Scheme::Raw(d) if !d.is_float() => {
                return Err(bad(format!(
                    "unquantized experts must be f32/f16/bf16, not {}",
                    d.name()
                )))
            }
            Scheme::Int4 { group_size: g } => {
                if g < 2 || g % 2 != 0 || g > MAX_GROUP_SIZE {
                    return Err(bad(format!(
                        "int4 group size {g} must be even and in 2..={MAX_GROUP_SIZE}"
                    )));
                }
                if let Some(s) = self.proj.iter().find(|s| s.cols % g != 0) {
                    return Err(bad(format!(
                        "int4: {} input features not a multiple of group size {g}",
                        s.cols
                    )));
                }
            }
            _ => {}
        }
        for p in 0..3 {
            let b = self.proj_bytes(p)?;
            if b > MAX_ITEM_BYTES {
                return Err(too_large("projection bytes", b, MAX_ITEM_BYTES));
            }
        }
        Ok(())
    }

    /// Encodes the 40-byte layout block.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.n_layers);
        out.put_u32(self.n_experts);
        out.put_u8(self.scheme.code());
        out.put_u8(match self.scheme {
            Scheme::Raw(d) => d as u8,
            Scheme::Int8 => DType::I8 as u8,
            Scheme::Int4 { .. } => DType::U8 as u8,
        });
        out.put_u16(0);
        out.put_u32(match self.scheme {
            Scheme::Int4 { group_size } => group_size,
            _ => 0,
        });
        for s in self.proj {
            out.put_u32(s.rows);
            out.put_u32(s.cols);
        }
    }

    /// Decodes and validates the layout block.
    pub(crate) fn decode(c: &mut Cursor<'_>) -> Result<Self> {
        let start = c.remaining();
        let n_layers = c.u32()?;
        let n_experts = c.u32()?;
        let code = c.u8()?;
        let dtype = DType::from_code(c.u8()?, "expert layout")?;
        if c.u16()? != 0 {
            return Err(bad("reserved field not zero".into()));
        }
        let group_size = c.u32()?;
        let scheme = match (code, dtype) {
            (0, d) => Scheme::Raw(d),
            (1, DType::I8) => Scheme::Int8,
            (2, DType::U8) => Scheme::Int4 { group_size },
            (c, d) => {
                return Err(bad(format!(
                    "scheme code {c} with dtype {} is not a known scheme",
                    d.name()
                )))
            }
        };
        if !matches!(scheme, Scheme::Int4 { .. }) && group_size != 0 {
            return Err(bad(format!(
                "group size {group_size} given for a scheme without groups"
            )));
        }
        let mut proj = [ProjShape { rows: 0, cols: 0 }; 3];
        for s in &mut proj {
            *s = ProjShape {
                rows: c.u32()?,
                cols: c.u32()?,
            };
        }
        debug_assert_eq!(start - c.remaining(), EXPERT_LAYOUT_SIZE);
        let layout = Self {
            n_layers,
            n_experts,
            scheme,
            proj,
        };
        if layout.is_empty() && (n_experts != 0 || proj.iter().any(|s| s.rows != 0 || s.cols != 0))
        {
            return Err(bad(
                "a layout with no layers must have zero experts and shapes".into(),
            ));
        }
        layout.validate()?;
        Ok(layout)
    }
}

fn bad(detail: String) -> FtwError {
    FtwError::BadLayout { detail }
}

fn too_large(what: &str, value: u64, cap: u64) -> FtwError {
    FtwError::TooLarge {
        what: what.to_owned(),
        value,
        cap,
    }
}
