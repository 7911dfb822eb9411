//! The streaming writer: a small state machine `Dense -> Experts -> finished`.
//!
//! Bytes go straight to disk as they arrive (peak memory is one item plus the write
//! buffer); the indexes, metadata and footer are written at the end and the header
//! last, so a file whose writing stopped half-way never passes validation. Writing
//! goes to `<path>.partial`, renamed to `<path>` by [`FtwWriter::finish`].

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use crate::consts::{ALIGN, HEADER_PAGE, MAX_DIMS, MAX_ITEM_BYTES, MAX_NAME_BYTES};
use crate::cursor::align_up;
use crate::dtype::DType;
use crate::error::{FtwError, Result};
use crate::header::{Extent, Header};
use crate::index::{
    encode_experts, encode_tensors, tensor_bytes, ExpertEntry, ProjSpan, TensorEntry,
};
use crate::layout::{ExpertLayout, PROJ_NAMES};

const ZEROS: [u8; ALIGN as usize] = [0u8; ALIGN as usize];
/// 8 MiB: large enough that small tensors coalesce, small enough to stay cheap.
const WRITE_BUFFER: usize = 8 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Dense,
    Experts,
    Finished,
}

/// Writes one `.ftw` file. Call [`add_tensor`](Self::add_tensor) for every dense
/// tensor, then [`begin_experts`](Self::begin_experts) and
/// [`add_expert`](Self::add_expert) in ascending expert id, then
/// [`finish`](Self::finish).
#[derive(Debug)]
pub struct FtwWriter {
    path: PathBuf,
    partial: PathBuf,
    out: BufWriter<File>,
    pos: u64,
    state: State,
    tensors: Vec<TensorEntry>,
    names: HashSet<String>,
    layout: ExpertLayout,
    slab: ([u64; 3], [u64; 3], u64),
    experts: Vec<ExpertEntry>,
    header: Header,
    committed: bool,
}

impl FtwWriter {
    /// Starts writing `path` (through `<path>.partial`).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut partial = path.clone().into_os_string();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let file = File::create(&partial).map_err(|source| FtwError::Io {
            context: "creating",
            path: partial.clone(),
            source,
        })?;
        let mut w = Self {
            path,
            partial,
            out: BufWriter::with_capacity(WRITE_BUFFER, file),
            pos: 0,
            state: State::Dense,
            tensors: Vec::new(),
            names: HashSet::new(),
            layout: ExpertLayout::empty(),
            slab: ([0; 3], [0; 3], 0),
            experts: Vec::new(),
            header: Header::new(),
            committed: false,
        };
        w.pad_to(HEADER_PAGE)?; // the header page, written for real by `finish`
        w.header.dense.off = HEADER_PAGE;
        Ok(w)
    }

    /// Appends one dense tensor at the next 4 KiB boundary.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        data: &[u8],
    ) -> Result<()> {
        self.expect(State::Dense, "add_tensor after begin_experts")?;
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(invalid(format!(
                "tensor name must be 1..={MAX_NAME_BYTES} bytes: {name:?}"
            )));
        }
        if shape.len() > MAX_DIMS {
            return Err(invalid(format!(
                "tensor {name:?} has {} dims (max {MAX_DIMS})",
                shape.len()
            )));
        }
        let nbytes = tensor_bytes(shape, dtype).filter(|&n| n <= MAX_ITEM_BYTES);
        if nbytes != Some(data.len() as u64) {
            return Err(FtwError::SizeMismatch {
                what: format!("tensor {name:?}"),
                expected: nbytes.unwrap_or(u64::MAX),
                found: data.len() as u64,
            });
        }
        if !self.names.insert(name.to_owned()) {
            return Err(invalid(format!("duplicate tensor name {name:?}")));
        }
        let off = self.align()?;
        self.write(data)?;
        self.tensors.push(TensorEntry {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            off,
            nbytes: data.len() as u64,
            xxh3: crate::checksum(data),
        });
        Ok(())
    }

    /// Ends the dense section and fixes the layout every expert will follow.
    pub fn begin_experts(&mut self, layout: ExpertLayout) -> Result<()> {
        self.expect(State::Dense, "begin_experts called twice")?;
        layout.validate()?;
        self.slab = layout.canonical_slab()?;
        self.layout = layout;
        let end = self.align()?;
        self.header.dense.len = end - HEADER_PAGE;
        self.header.experts.off = end;
        self.state = State::Experts;
        Ok(())
    }

    /// Appends the slab of expert `(layer, expert)`: gate, up, down, each 4 KiB-aligned.
    pub fn add_expert(&mut self, layer: u32, expert: u32, proj: [&[u8]; 3]) -> Result<()> {
        self.expect(State::Experts, "add_expert before begin_experts")?;
        let l = &self.layout;
        if layer >= l.n_layers || expert >= l.n_experts {
            return Err(invalid(format!(
                "expert ({layer}, {expert}) outside the {}x{} grid",
                l.n_layers, l.n_experts
            )));
        }
        let entry_id = u64::from(layer) * u64::from(l.n_experts) + u64::from(expert);
        if let Some(prev) = self.experts.last() {
            if prev.id(l.n_experts) >= entry_id {
                return Err(invalid(format!(
                    "expert ({layer}, {expert}) out of ascending id order"
                )));
            }
        }
        let (offs, lens, slab_len) = self.slab;
        for ((data, &want), name) in proj.iter().zip(&lens).zip(PROJ_NAMES) {
            if data.len() as u64 != want {
                return Err(FtwError::SizeMismatch {
                    what: format!("{name} projection of expert ({layer}, {expert})"),
                    expected: want,
                    found: data.len() as u64,
                });
            }
        }
        let start = self.pos; // always aligned here: every slab ends on a boundary
        let mut hasher = Xxh3::new();
        for (data, &off) in proj.iter().zip(&offs) {
            self.pad_hashed(start + off, &mut hasher)?;
            hasher.update(data);
            self.write(data)?;
        }
        self.pad_hashed(start + slab_len, &mut hasher)?;
        let mut spans = [ProjSpan::default(); 3];
        for ((s, &off), &len) in spans.iter_mut().zip(&offs).zip(&lens) {
            *s = ProjSpan { off, len };
        }
        self.experts.push(ExpertEntry {
            layer,
            expert,
            off: start,
            len: slab_len,
            proj: spans,
            xxh3: hasher.digest(),
        });
        Ok(())
    }

    /// Writes metadata, indexes, footer and header, syncs, and renames the file into
    /// place. `metadata_json` must be a JSON object.
    pub fn finish(mut self, metadata_json: &str) -> Result<Header> {
        match serde_json::from_str::<serde_json::Value>(metadata_json) {
            Ok(v) if v.is_object() => {}
            Ok(_) => {
                return Err(FtwError::InvalidJson {
                    detail: "metadata must be an object".into(),
                })
            }
            Err(e) => {
                return Err(FtwError::InvalidJson {
                    detail: e.to_string(),
                })
            }
        }
        if self.state == State::Dense {
            self.begin_experts(ExpertLayout::empty())?;
        }
        self.state = State::Finished;
        let end = self.align()?;
        self.header.experts.len = end - self.header.experts.off;
        let tindex = encode_tensors(&self.tensors);
        let eindex = encode_experts(&self.layout, &self.experts);
        self.header.metadata = self.section(metadata_json.as_bytes())?;
        self.header.metadata_xxh3 = crate::checksum(metadata_json.as_bytes());
        self.header.tensor_index = self.section(&tindex)?;
        self.header.tensor_index_xxh3 = crate::checksum(&tindex);
        self.header.expert_index = self.section(&eindex)?;
        self.header.expert_index_xxh3 = crate::checksum(&eindex);
        self.header.file_size = self.pos + crate::consts::HEADER_STRUCT_SIZE as u64;
        let footer = self.header.encode(true);
        self.write(&footer)?;
        self.out.flush().map_err(|e| self.io("writing", e))?;
        let file = self.out.get_mut();
        let header = self.header.encode(false);
        let res = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&header))
            .and_then(|_| file.sync_all());
        res.map_err(|e| FtwError::Io {
            context: "writing",
            path: self.partial.clone(),
            source: e,
        })?;
        std::fs::rename(&self.partial, &self.path).map_err(|source| FtwError::Io {
            context: "renaming into",
            path: self.path.clone(),
            source,
        })?;
        self.committed = true;
        Ok(self.header)
    }

    fn section(&mut self, bytes: &[u8]) -> Result<Extent> {
        let off = self.pos;
        self.write(bytes)?;
        Ok(Extent {
            off,
            len: bytes.len() as u64,
        })
    }

    fn expect(&self, state: State, misuse: &str) -> Result<()> {
        if self.state == state {
            Ok(())
        } else {
            Err(FtwError::WriterState {
                detail: format!("{misuse} (writer is in state {:?})", self.state),
            })
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.out
            .write_all(data)
            .map_err(|e| self.io("writing", e))?;
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Writes zeros up to the next 4 KiB boundary and returns it.
    fn align(&mut self) -> Result<u64> {
        let target = align_up(self.pos, ALIGN).ok_or_else(|| FtwError::Overflow {
            what: "file".into(),
        })?;
        self.pad_to(target)?;
        Ok(target)
    }

    fn pad_to(&mut self, target: u64) -> Result<()> {
        while self.pos < target {
            let n = (target - self.pos).min(ALIGN) as usize;
            self.write(ZEROS.get(..n).unwrap_or_default())?;
        }
        Ok(())
    }

    fn pad_hashed(&mut self, target: u64, hasher: &mut Xxh3) -> Result<()> {
        while self.pos < target {
            let n = (target - self.pos).min(ALIGN) as usize;
            let zeros = ZEROS.get(..n).unwrap_or_default();
            hasher.update(zeros);
            self.write(zeros)?;
        }
        Ok(())
    }

    fn io(&self, context: &'static str, source: std::io::Error) -> FtwError {
        FtwError::Io {
            context,
            path: self.partial.clone(),
            source,
        }
    }
}

impl Drop for FtwWriter {
    /// A writer dropped before `finish` succeeded removes its `.partial` file.
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

fn invalid(detail: String) -> FtwError {
    FtwError::InvalidArgument { detail }
}
