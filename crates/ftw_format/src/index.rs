//! The two indexes: dense tensors (variable-length records) and experts (fixed 80-byte
//! records after the layout block). Decoding checks only the records' own syntax and
//! caps; placement rules (bounds, alignment, overlap) are checked by the reader.
//!
//! Tensor index: `count:u64`, then per tensor `name_len:u16 name[name_len] dtype:u8
//! ndim:u8 dims:u64[ndim] off:u64 nbytes:u64 xxh3:u64`.
//! Expert index: layout block (40 bytes), `count:u64`, then per expert `layer:u32
//! expert:u32 off:u64 len:u64 (rel_off:u64 len:u64)[3] xxh3:u64`.

use crate::consts::{EXPERT_RECORD_SIZE, MAX_DIMS, MAX_ITEM_BYTES, MAX_NAME_BYTES, MAX_TENSORS};
use crate::cursor::{Cursor, PutLe};
use crate::dtype::DType;
use crate::error::{FtwError, Result};
use crate::layout::ExpertLayout;

/// One dense tensor: name, type, shape and where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// Tensor name (the source checkpoint's, e.g. `model.embed_tokens.weight`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// Absolute offset of the first byte (4 KiB-aligned).
    pub off: u64,
    /// Exact byte count (`product(shape) * dtype.size()`).
    pub nbytes: u64,
    /// xxh3-64 of the `nbytes` bytes.
    pub xxh3: u64,
}

/// A projection's place inside its expert slab.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjSpan {
    /// Offset from the slab start (4 KiB-aligned).
    pub off: u64,
    /// Bytes.
    pub len: u64,
}

/// One routed expert: where its slab lies and where gate, up and down are inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertEntry {
    /// Model layer.
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
    /// Absolute offset of the slab (4 KiB-aligned).
    pub off: u64,
    /// Slab length, a multiple of 4 KiB (padding included, zero-filled).
    pub len: u64,
    /// Gate, up and down.
    pub proj: [ProjSpan; 3],
    /// xxh3-64 of the whole slab (`len` bytes, padding included).
    pub xxh3: u64,
}

impl ExpertEntry {
    /// Expert id = layer * n_experts + expert.
    pub fn id(&self, n_experts: u32) -> u64 {
        u64::from(self.layer) * u64::from(n_experts) + u64::from(self.expert)
    }
}

/// Checked `product(shape) * size`; `None` on overflow.
pub(crate) fn tensor_bytes(shape: &[u64], dtype: DType) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
}

pub(crate) fn encode_tensors(tensors: &[TensorEntry]) -> Vec<u8> {
    let mut b = Vec::new();
    b.put_u64(tensors.len() as u64);
    for t in tensors {
        b.put_u16(t.name.len() as u16);
        b.extend_from_slice(t.name.as_bytes());
        b.put_u8(t.dtype as u8);
        b.put_u8(t.shape.len() as u8);
        t.shape.iter().for_each(|&d| b.put_u64(d));
        b.put_u64(t.off);
        b.put_u64(t.nbytes);
        b.put_u64(t.xxh3);
    }
    b
}

pub(crate) fn decode_tensors(buf: &[u8]) -> Result<Vec<TensorEntry>> {
    let mut c = Cursor::new(buf, "tensor index");
    let count = c.u64()?;
    if count > MAX_TENSORS {
        return Err(FtwError::TooLarge {
            what: "tensor count".into(),
            value: count,
            cap: MAX_TENSORS,
        });
    }
    let mut out = Vec::with_capacity((count as usize).min(c.remaining() / 27));
    for _ in 0..count {
        let name_len = usize::from(c.u16()?);
        if name_len == 0 || name_len > MAX_NAME_BYTES {
            return Err(FtwError::TooLarge {
                what: "tensor name length (or zero)".into(),
                value: name_len as u64,
                cap: MAX_NAME_BYTES as u64,
            });
        }
        let raw = c.bytes(name_len)?;
        let name = std::str::from_utf8(raw)
            .map_err(|_| FtwError::InvalidUtf8 {
                what: "a tensor name".into(),
            })?
            .to_owned();
        let dtype = DType::from_code(c.u8()?, &format!("tensor {name:?}"))?;
        let ndim = usize::from(c.u8()?);
        if ndim > MAX_DIMS {
            return Err(FtwError::TooLarge {
                what: format!("dimension count of tensor {name:?}"),
                value: ndim as u64,
                cap: MAX_DIMS as u64,
            });
        }
        let shape = (0..ndim).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
        let (off, nbytes, xxh3) = (c.u64()?, c.u64()?, c.u64()?);
        let expected = tensor_bytes(&shape, dtype).ok_or_else(|| FtwError::Overflow {
            what: format!("shape of tensor {name:?}"),
        })?;
        if expected > MAX_ITEM_BYTES {
            return Err(FtwError::TooLarge {
                what: format!("tensor {name:?}"),
                value: expected,
                cap: MAX_ITEM_BYTES,
            });
        }
        if expected != nbytes {
            return Err(FtwError::SizeMismatch {
                what: format!("tensor {name:?}"),
                expected,
                found: nbytes,
            });
        }
        out.push(TensorEntry {
            name,
            dtype,
            shape,
            off,
            nbytes,
            xxh3,
        });
    }
    c.finish()?;
    Ok(out)
}

pub(crate) fn encode_experts(layout: &ExpertLayout, experts: &[ExpertEntry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(48 + experts.len() * EXPERT_RECORD_SIZE);
    layout.encode(&mut b);
    b.put_u64(experts.len() as u64);
    for e in experts {
        b.put_u32(e.layer);
        b.put_u32(e.expert);
        b.put_u64(e.off);
        b.put_u64(e.len);
        for p in e.proj {
            b.put_u64(p.off);
            b.put_u64(p.len);
        }
        b.put_u64(e.xxh3);
    }
    b
}

pub(crate) fn decode_experts(buf: &[u8]) -> Result<(ExpertLayout, Vec<ExpertEntry>)> {
    let mut c = Cursor::new(buf, "expert index");
    let layout = ExpertLayout::decode(&mut c)?;
    let count = c.u64()?;
    let cap = u64::from(layout.n_layers) * u64::from(layout.n_experts);
    if count > cap {
        return Err(FtwError::TooLarge {
            what: "expert count".into(),
            value: count,
            cap,
        });
    }
    let needed = count.saturating_mul(EXPERT_RECORD_SIZE as u64);
    if needed != c.remaining() as u64 {
        return Err(FtwError::BadIndex {
            index: "expert index",
            detail: format!(
                "{count} records need {needed} bytes, {} are present",
                c.remaining()
            ),
        });
    }
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (layer, expert, off, len) = (c.u32()?, c.u32()?, c.u64()?, c.u64()?);
        let mut proj = [ProjSpan::default(); 3];
        for p in &mut proj {
            *p = ProjSpan {
                off: c.u64()?,
                len: c.u64()?,
            };
        }
        out.push(ExpertEntry {
            layer,
            expert,
            off,
            len,
            proj,
            xxh3: c.u64()?,
        });
    }
    c.finish()?;
    Ok((layout, out))
}
