//! Element types the format allows (an allow-list: any other code is rejected).

use crate::error::{FtwError, Result};

/// Element type of a dense tensor or of an expert projection's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    I8 = 3,
    U8 = 4,
    I32 = 5,
    I64 = 6,
}

impl DType {
    /// Every allowed type, in code order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Decodes a type code; `what` names the item for the error.
    pub fn from_code(code: u8, what: &str) -> Result<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|d| *d as u8 == code)
            .ok_or_else(|| FtwError::UnknownDtype {
                code,
                what: what.to_owned(),
            })
    }

    /// Parses the lower-case name used by the Python side (`"bf16"`, `"f32"`, ...).
    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .ok_or_else(|| FtwError::InvalidArgument {
                detail: format!("unknown dtype name {name:?}"),
            })
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }

    /// Lower-case name, as Python sees it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// True for the floating-point types an unquantized projection may use.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}
