//! Bounds-checked little-endian decoding and encoding of the binary structures.

use crate::error::{FtwError, Result};

/// Reads little-endian values from a byte slice; running past the end is an error
/// naming the structure being decoded, never a panic.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| FtwError::BadIndex {
                index: self.what,
                detail: format!("ends early: needs {n} bytes at offset {}", self.pos),
            })?;
        let out = self.buf.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn magic(&mut self) -> Result<[u8; 8]> {
        self.array()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Errors unless every byte was consumed.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(FtwError::BadIndex {
                index: self.what,
                detail: format!("{n} trailing bytes after the last record"),
            }),
        }
    }
}

/// Appends little-endian values to a byte vector (the writer's side of [`Cursor`]).
pub(crate) trait PutLe {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
}

impl PutLe for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// Rounds `v` up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    v.checked_add(align - 1).map(|x| x & !(align - 1))
}
