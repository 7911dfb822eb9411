//! The validating reader. `open` checks the whole structure (header, footer, sections,
//! metadata, both indexes) before anything is trusted; data reads verify checksums.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::consts::{HEADER_PAGE, HEADER_STRUCT_SIZE, MAX_METADATA_BYTES};
use crate::error::{FtwError, Result};
use crate::header::{Extent, Header};
use crate::index::{decode_experts, decode_tensors, ExpertEntry, TensorEntry};
use crate::io::read_exact_at;
use crate::layout::ExpertLayout;
use crate::validate::{check_experts, check_sections, check_tensors};

/// Largest index section accepted (bounds the allocation before decoding).
const MAX_INDEX_BYTES: u64 = 1 << 30;

/// An open, validated `.ftw` file. Reads are positioned (`pread`), so one reader can
/// serve several threads.
#[derive(Debug)]
pub struct FtwReader {
    path: PathBuf,
    file: File,
    header: Header,
    metadata: String,
    tensors: Vec<TensorEntry>,
    by_name: HashMap<String, usize>,
    layout: ExpertLayout,
    experts: Vec<ExpertEntry>,
}

impl FtwReader {
    /// Opens and validates `path`. Errors name what is wrong; nothing panics.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |context, source| FtwError::Io {
            context,
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(|e| io("opening", e))?;
        let size = file
            .metadata()
            .map_err(|e| io("reading the size of", e))?
            .len();
        let hs = HEADER_STRUCT_SIZE as u64;
        let mut head = [0u8; HEADER_STRUCT_SIZE];
        let head_len = size.min(hs) as usize;
        read_exact_at(&file, head.get_mut(..head_len).unwrap_or_default(), 0)
            .map_err(|e| io("reading", e))?;
        if head_len >= 8 && head.get(..8) != Some(&crate::MAGIC[..]) {
            let mut found = [0u8; 8];
            found.copy_from_slice(head.get(..8).unwrap_or(&[0; 8]));
            return Err(FtwError::BadMagic { found });
        }
        if size < HEADER_PAGE + hs {
            return Err(FtwError::Truncated {
                expected: HEADER_PAGE + hs,
                actual: size,
            });
        }
        let header = Header::decode(&head, false)?;
        if header.file_size != size {
            return Err(FtwError::Truncated {
                expected: header.file_size,
                actual: size,
            });
        }
        let mut foot = [0u8; HEADER_STRUCT_SIZE];
        read_exact_at(&file, &mut foot, size - hs).map_err(|e| io("reading", e))?;
        let footer = Header::decode(&foot, true)?;
        if footer != header {
            return Err(FtwError::FooterMismatch {
                detail: first_difference(&header, &footer),
            });
        }
        check_sections(&header)?;
        let read = |e: Extent, cap: u64, what: &'static str, sum: u64| -> Result<Vec<u8>> {
            if e.len > cap {
                return Err(FtwError::TooLarge {
                    what: what.into(),
                    value: e.len,
                    cap,
                });
            }
            let mut buf = vec![0u8; e.len as usize];
            read_exact_at(&file, &mut buf, e.off).map_err(|s| io("reading", s))?;
            let computed = crate::checksum(&buf);
            if computed != sum {
                return Err(FtwError::SectionChecksum {
                    section: what,
                    stored: sum,
                    computed,
                });
            }
            Ok(buf)
        };
        let meta = read(
            header.metadata,
            MAX_METADATA_BYTES,
            "metadata",
            header.metadata_xxh3,
        )?;
        let tidx = read(
            header.tensor_index,
            MAX_INDEX_BYTES,
            "tensor index",
            header.tensor_index_xxh3,
        )?;
        let eidx = read(
            header.expert_index,
            MAX_INDEX_BYTES,
            "expert index",
            header.expert_index_xxh3,
        )?;
        let metadata = String::from_utf8(meta).map_err(|_| FtwError::InvalidUtf8 {
            what: "metadata".into(),
        })?;
        match serde_json::from_str::<serde_json::Value>(&metadata) {
            Ok(v) if v.is_object() => {}
            Ok(_) => {
                return Err(FtwError::InvalidJson {
                    detail: "metadata is not a JSON object".into(),
                })
            }
            Err(e) => {
                return Err(FtwError::InvalidJson {
                    detail: e.to_string(),
                })
            }
        }
        let tensors = decode_tensors(&tidx)?;
        let by_name = check_tensors(&tensors, header.dense)?;
        let (layout, experts) = decode_experts(&eidx)?;
        check_experts(&layout, &experts, header.experts)?;
        Ok(Self {
            path,
            file,
            header,
            metadata,
            tensors,
            by_name,
            layout,
            experts,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The metadata JSON object, as text.
    pub fn metadata(&self) -> &str {
        &self.metadata
    }
    /// Every dense tensor, in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }
    /// The expert layout (empty for a model without routed experts).
    pub fn layout(&self) -> &ExpertLayout {
        &self.layout
    }
    /// Every expert, in ascending id.
    pub fn experts(&self) -> &[ExpertEntry] {
        &self.experts
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorEntry> {
        self.by_name
            .get(name)
            .and_then(|&i| self.tensors.get(i))
            .ok_or_else(|| FtwError::NoSuchTensor {
                name: name.to_owned(),
            })
    }

    /// The index entry of expert `(layer, expert)`.
    pub fn expert(&self, layer: u32, expert: u32) -> Result<&ExpertEntry> {
        let n = self.layout.n_experts;
        let id = u64::from(layer) * u64::from(n) + u64::from(expert);
        let missing = || FtwError::NoSuchExpert { layer, expert };
        if layer >= self.layout.n_layers || expert >= n {
            return Err(missing());
        }
        let i = self
            .experts
            .binary_search_by_key(&id, |e| e.id(n))
            .map_err(|_| missing())?;
        self.experts.get(i).ok_or_else(missing)
    }

    /// Reads tensor `name` into `buf` (exactly its size) and verifies its checksum.
    pub fn read_tensor_into(&self, name: &str, buf: &mut [u8]) -> Result<()> {
        let t = self.tensor(name)?;
        check_len(buf.len(), t.nbytes, name)?;
        self.read_at(buf, t.off)?;
        if crate::checksum(buf) != t.xxh3 {
            return Err(FtwError::TensorChecksum {
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Reads tensor `name` into a new buffer, verifying its checksum.
    pub fn read_tensor(&self, name: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.tensor(name)?.nbytes as usize];
        self.read_tensor_into(name, &mut buf)?;
        Ok(buf)
    }

    /// Reads the whole slab of expert `(layer, expert)` into `buf` (exactly the slab's
    /// length) and verifies its checksum.
    pub fn read_expert_into(&self, layer: u32, expert: u32, buf: &mut [u8]) -> Result<()> {
        let e = *self.expert(layer, expert)?;
        check_len(buf.len(), e.len, &format!("expert ({layer}, {expert})"))?;
        self.read_at(buf, e.off)?;
        if crate::checksum(buf) != e.xxh3 {
            return Err(FtwError::ExpertChecksum { layer, expert });
        }
        Ok(())
    }

    /// Verifies one expert's checksum, reading through `scratch` (grown as needed).
    pub fn verify_expert(&self, layer: u32, expert: u32, scratch: &mut Vec<u8>) -> Result<()> {
        let len = self.expert(layer, expert)?.len as usize;
        scratch.resize(len, 0);
        self.read_expert_into(layer, expert, scratch.get_mut(..len).unwrap_or_default())
    }

    /// Verifies `n` experts spread evenly over the file (the check done at load).
    pub fn verify_expert_sample(&self, n: usize) -> Result<()> {
        let total = self.experts.len();
        let mut scratch = Vec::new();
        for i in 0..n.min(total) {
            if let Some(e) = self.experts.get(i * total / n.min(total)) {
                self.verify_expert(e.layer, e.expert, &mut scratch)?;
            }
        }
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        read_exact_at(&self.file, buf, off).map_err(|source| FtwError::Io {
            context: "reading",
            path: self.path.clone(),
            source,
        })
    }
}

fn check_len(got: usize, want: u64, what: &str) -> Result<()> {
    if got as u64 == want {
        Ok(())
    } else {
        Err(FtwError::InvalidArgument {
            detail: format!("buffer for {what} is {got} bytes, needs {want}"),
        })
    }
}

fn first_difference(h: &Header, f: &Header) -> String {
    let pairs = [
        ("file size", h.file_size, f.file_size),
        ("metadata offset", h.metadata.off, f.metadata.off),
        (
            "tensor index offset",
            h.tensor_index.off,
            f.tensor_index.off,
        ),
        (
            "expert index offset",
            h.expert_index.off,
            f.expert_index.off,
        ),
        ("dense section", h.dense.off, f.dense.off),
        ("expert section", h.experts.off, f.experts.off),
    ];
    pairs
        .iter()
        .find(|(_, a, b)| a != b)
        .map(|(n, a, b)| format!("{n}: header {a}, footer {b}"))
        .unwrap_or_else(|| "a length or checksum field".into())
}
