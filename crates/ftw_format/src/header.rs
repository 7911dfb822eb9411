//! The header struct at offset 0 and its copy, the footer, at the end of the file.
//!
//! Layout (little-endian, `HEADER_STRUCT_SIZE` = 192 bytes):
//! magic[8] version:u32 header_page:u32 file_size:u64, then for each of metadata,
//! tensor index, expert index: off:u64 len:u64 xxh3:u64; then dense off/len and expert
//! off/len (u64 each); 56 reserved zero bytes; xxh3-64 of the preceding 184 bytes.

use crate::consts::{FOOTER_MAGIC, FORMAT_VERSION, HEADER_PAGE, HEADER_STRUCT_SIZE, MAGIC};
use crate::cursor::{Cursor, PutLe};
use crate::error::{FtwError, Result};

/// A byte range of the file with an optional checksum of its contents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    /// Absolute offset of the first byte.
    pub off: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Extent {
    /// One past the last byte, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.off.checked_add(self.len)
    }
}

/// Where every section of the file lies; stored at the start and repeated at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Format version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// Bytes reserved for the header at offset 0 ([`HEADER_PAGE`]).
    pub header_page: u32,
    /// Total size of the file.
    pub file_size: u64,
    /// Metadata JSON.
    pub metadata: Extent,
    /// xxh3-64 of the metadata.
    pub metadata_xxh3: u64,
    /// Dense tensor index.
    pub tensor_index: Extent,
    /// xxh3-64 of the tensor index.
    pub tensor_index_xxh3: u64,
    /// Expert index (layout block + records).
    pub expert_index: Extent,
    /// xxh3-64 of the expert index.
    pub expert_index_xxh3: u64,
    /// Section holding the dense tensors' bytes.
    pub dense: Extent,
    /// Section holding the expert slabs.
    pub experts: Extent,
}

const RESERVED: usize = 56;
const BODY: usize = HEADER_STRUCT_SIZE - 8;

impl Header {
    /// A header for a file being written (offsets filled in by the writer).
    pub fn new() -> Self {
        Self {
            version: FORMAT_VERSION,
            header_page: HEADER_PAGE as u32,
            ..Self::default()
        }
    }

    /// Encodes the header (with `MAGIC`) or the footer (with `FOOTER_MAGIC`).
    pub fn encode(&self, footer: bool) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_STRUCT_SIZE);
        b.extend_from_slice(if footer { &FOOTER_MAGIC } else { &MAGIC });
        b.put_u32(self.version);
        b.put_u32(self.header_page);
        b.put_u64(self.file_size);
        for (e, sum) in [
            (self.metadata, self.metadata_xxh3),
            (self.tensor_index, self.tensor_index_xxh3),
            (self.expert_index, self.expert_index_xxh3),
        ] {
            b.put_u64(e.off);
            b.put_u64(e.len);
            b.put_u64(sum);
        }
        for e in [self.dense, self.experts] {
            b.put_u64(e.off);
            b.put_u64(e.len);
        }
        b.extend_from_slice(&[0u8; RESERVED]);
        let sum = crate::checksum(&b);
        b.put_u64(sum);
        debug_assert_eq!(b.len(), HEADER_STRUCT_SIZE);
        b
    }

    /// Decodes and checks magic, version and checksum. `footer` selects the magic.
    pub fn decode(buf: &[u8], footer: bool) -> Result<Self> {
        let what = if footer { "footer" } else { "header" };
        let mut c = Cursor::new(buf, what);
        let magic = c.magic()?;
        let want = if footer { FOOTER_MAGIC } else { MAGIC };
        if magic != want {
            return Err(if footer {
                FtwError::FooterMismatch {
                    detail: format!("footer magic is {magic:02x?}"),
                }
            } else {
                FtwError::BadMagic { found: magic }
            });
        }
        let version = c.u32()?;
        if version != FORMAT_VERSION {
            return Err(FtwError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let mut h = Header {
            version,
            header_page: c.u32()?,
            file_size: c.u64()?,
            ..Self::default()
        };
        h.metadata = Extent {
            off: c.u64()?,
            len: c.u64()?,
        };
        h.metadata_xxh3 = c.u64()?;
        h.tensor_index = Extent {
            off: c.u64()?,
            len: c.u64()?,
        };
        h.tensor_index_xxh3 = c.u64()?;
        h.expert_index = Extent {
            off: c.u64()?,
            len: c.u64()?,
        };
        h.expert_index_xxh3 = c.u64()?;
        h.dense = Extent {
            off: c.u64()?,
            len: c.u64()?,
        };
        h.experts = Extent {
            off: c.u64()?,
            len: c.u64()?,
        };
        if c.bytes(RESERVED)?.iter().any(|&b| b != 0) {
            return Err(FtwError::BadHeader {
                detail: format!("{what}: reserved bytes not zero"),
            });
        }
        let stored = c.u64()?;
        let computed = crate::checksum(buf.get(..BODY).unwrap_or_default());
        if stored != computed {
            return Err(FtwError::SectionChecksum {
                section: what,
                stored,
                computed,
            });
        }
        if h.header_page as u64 != HEADER_PAGE {
            return Err(FtwError::BadHeader {
                detail: format!(
                    "header page is {} bytes, must be {HEADER_PAGE}",
                    h.header_page
                ),
            });
        }
        Ok(h)
    }
}
