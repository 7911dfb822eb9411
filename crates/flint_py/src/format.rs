//! `FtwReader` and `FtwWriter`: the `.ftw` file for Python.
//!
//! Buffers cross the boundary as raw addresses: methods taking `(address, nbytes)`
//! read from (writer) or write into (`*_into`) the `nbytes` bytes at `address`. The
//! caller owns that memory and must keep it alive, unmoved and untouched by other
//! threads until the call returns; the wrappers in `flint.format` pass the data
//! pointer of a contiguous CPU torch tensor they hold a reference to. The GIL is
//! released while bytes move.

use std::path::PathBuf;

use ftw_format::{DType, ExpertLayout, FtwError, FtwReader, FtwWriter, ProjShape, Scheme};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{detach, ftw_to_py};

/// # Safety
/// `address` must point to `nbytes` bytes the caller keeps valid for the whole call.
unsafe fn bytes<'a>(address: usize, nbytes: usize) -> &'a [u8] {
    // SAFETY: upheld by the caller (see the module contract).
    unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) }
}

/// # Safety
/// As [`bytes`], and nobody else may access the bytes during the call.
unsafe fn bytes_mut<'a>(address: usize, nbytes: usize) -> &'a mut [u8] {
    // SAFETY: upheld by the caller (see the module contract).
    unsafe { std::slice::from_raw_parts_mut(address as *mut u8, nbytes) }
}

fn check_address(address: usize, nbytes: usize) -> PyResult<()> {
    if address == 0 && nbytes != 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "null buffer address",
        ));
    }
    Ok(())
}

/// An open, validated .ftw file (see docs/ftw-format.md).
#[derive(Debug)]
#[pyclass(module = "flint._core", name = "FtwReader", frozen)]
pub struct PyFtwReader {
    inner: FtwReader,
}

#[pymethods]
impl PyFtwReader {
    /// Opens and validates the file at `path`; raises FormatError naming what is wrong.
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Ok(Self {
            inner: detach(py, move || FtwReader::open(path))?,
        })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> String {
        self.inner.path().display().to_string()
    }

    /// The metadata JSON object, as text.
    #[getter]
    fn metadata_json(&self) -> &str {
        self.inner.metadata()
    }

    /// Size of the file in bytes.
    #[getter]
    fn file_size(&self) -> u64 {
        self.inner.header().file_size
    }

    /// Sections as {name: (offset, length)}.
    fn sections<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = self.inner.header();
        let d = PyDict::new(py);
        for (name, e) in [
            ("dense", h.dense),
            ("experts", h.experts),
            ("metadata", h.metadata),
            ("tensor_index", h.tensor_index),
            ("expert_index", h.expert_index),
        ] {
            d.set_item(name, (e.off, e.len))?;
        }
        Ok(d)
    }

    /// Every dense tensor as (name, dtype, shape, offset, nbytes), in file order.
    fn tensors(&self) -> Vec<(String, &'static str, Vec<u64>, u64, u64)> {
        let ts = self.inner.tensors();
        ts.iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.dtype.name(),
                    t.shape.clone(),
                    t.off,
                    t.nbytes,
                )
            })
            .collect()
    }

    /// The expert layout as a dict (n_layers, n_experts, scheme, dtype, group_size,
    /// shapes, proj_bytes, slab_bytes).
    fn expert_layout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let l = self.inner.layout();
        let d = PyDict::new(py);
        d.set_item("n_layers", l.n_layers)?;
        d.set_item("n_experts", l.n_experts)?;
        let (scheme, dtype, group) = match l.scheme {
            Scheme::Raw(dt) => ("raw", dt.name(), 0),
            Scheme::Int8 => ("int8", "i8", 0),
            Scheme::Int4 { group_size } => ("int4", "u8", group_size),
        };
        d.set_item("scheme", scheme)?;
        d.set_item("dtype", dtype)?;
        d.set_item("group_size", group)?;
        d.set_item(
            "shapes",
            l.proj.iter().map(|s| (s.rows, s.cols)).collect::<Vec<_>>(),
        )?;
        if !l.is_empty() {
            let (offs, lens, slab) = l.canonical_slab().map_err(ftw_to_py)?;
            d.set_item("proj_offsets", offs.to_vec())?;
            d.set_item("proj_bytes", lens.to_vec())?;
            d.set_item("slab_bytes", slab)?;
        }
        Ok(d)
    }

    /// Every expert as (layer, expert, offset, slab length), in ascending id.
    fn experts(&self) -> Vec<(u32, u32, u64, u64)> {
        self.inner
            .experts()
            .iter()
            .map(|e| (e.layer, e.expert, e.off, e.len))
            .collect()
    }

    /// One expert's (offset, slab length, [(proj offset, proj length)] x 3, xxh3).
    #[allow(clippy::type_complexity)]
    fn expert_entry(&self, layer: u32, expert: u32) -> PyResult<(u64, u64, Vec<(u64, u64)>, u64)> {
        let e = self.inner.expert(layer, expert).map_err(ftw_to_py)?;
        Ok((
            e.off,
            e.len,
            e.proj.iter().map(|p| (p.off, p.len)).collect(),
            e.xxh3,
        ))
    }

    /// Reads tensor `name` into the buffer at `address` (exactly its size), verifying
    /// its checksum. See the module docs for the buffer contract.
    fn read_tensor_into(
        &self,
        py: Python<'_>,
        name: &str,
        address: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        check_address(address, nbytes)?;
        // SAFETY: the caller keeps the buffer alive and exclusive (module contract).
        detach(py, || {
            self.inner
                .read_tensor_into(name, unsafe { bytes_mut(address, nbytes) })
        })
    }

    /// Reads the slab of expert (layer, expert) into the buffer at `address` (exactly
    /// the slab length), verifying its checksum.
    fn read_expert_into(
        &self,
        py: Python<'_>,
        layer: u32,
        expert: u32,
        address: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        check_address(address, nbytes)?;
        // SAFETY: as in read_tensor_into.
        detach(py, || {
            self.inner
                .read_expert_into(layer, expert, unsafe { bytes_mut(address, nbytes) })
        })
    }

    /// Verifies one dense tensor's checksum; raises ChecksumError naming it.
    fn verify_tensor(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        detach(py, || self.inner.read_tensor(name).map(drop))
    }

    /// Verifies one expert's checksum; raises ChecksumError naming layer and expert.
    fn verify_expert(&self, py: Python<'_>, layer: u32, expert: u32) -> PyResult<()> {
        detach(py, || {
            self.inner.verify_expert(layer, expert, &mut Vec::new())
        })
    }

    /// Verifies `n` experts spread evenly over the file (done at load).
    fn verify_expert_sample(&self, py: Python<'_>, n: usize) -> PyResult<()> {
        detach(py, || self.inner.verify_expert_sample(n))
    }
}

/// Writes a .ftw file: dense tensors, then experts in ascending id, then finish().
#[derive(Debug)]
#[pyclass(module = "flint._core", name = "FtwWriter")]
pub struct PyFtwWriter {
    inner: Option<FtwWriter>,
}

impl PyFtwWriter {
    fn writer(&mut self) -> PyResult<&mut FtwWriter> {
        self.inner.as_mut().ok_or_else(|| {
            crate::error::WriterError::new_err("the writer is already finished or aborted")
        })
    }
}

#[pymethods]
impl PyFtwWriter {
    /// Starts writing `path` (through `path.partial`, renamed by finish()).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Ok(Self {
            inner: Some(detach(py, move || FtwWriter::create(path))?),
        })
    }

    /// Appends a dense tensor from the `nbytes` bytes at `address`.
    fn add_tensor(
        &mut self,
        py: Python<'_>,
        name: &str,
        dtype: &str,
        shape: Vec<u64>,
        address: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        check_address(address, nbytes)?;
        let dtype = DType::from_name(dtype).map_err(ftw_to_py)?;
        let w = self.writer()?;
        // SAFETY: the caller keeps the buffer alive (module contract).
        detach(py, || {
            w.add_tensor(name, dtype, &shape, unsafe { bytes(address, nbytes) })
        })
    }

    /// Ends the dense section. `scheme` is "raw" (with `dtype` f32/f16/bf16), "int8" or
    /// "int4" (with `group_size`); `shapes` are (rows, cols) of gate, up, down.
    fn begin_experts(
        &mut self,
        n_layers: u32,
        n_experts: u32,
        scheme: &str,
        dtype: &str,
        group_size: u32,
        shapes: [(u32, u32); 3],
    ) -> PyResult<()> {
        let scheme = match scheme {
            "raw" => Scheme::Raw(DType::from_name(dtype).map_err(ftw_to_py)?),
            "int8" => Scheme::Int8,
            "int4" => Scheme::Int4 { group_size },
            other => {
                let detail = format!("unknown scheme {other:?} (raw, int8, int4)");
                return Err(ftw_to_py(FtwError::InvalidArgument { detail }));
            }
        };
        let proj = shapes.map(|(rows, cols)| ProjShape { rows, cols });
        let layout = ExpertLayout {
            n_layers,
            n_experts,
            scheme,
            proj,
        };
        self.writer()?.begin_experts(layout).map_err(ftw_to_py)
    }

    /// Appends expert (layer, expert); each projection is an (address, nbytes) pair.
    fn add_expert(
        &mut self,
        py: Python<'_>,
        layer: u32,
        expert: u32,
        gate: (usize, usize),
        up: (usize, usize),
        down: (usize, usize),
    ) -> PyResult<()> {
        for (a, n) in [gate, up, down] {
            check_address(a, n)?;
        }
        let w = self.writer()?;
        detach(py, || {
            // SAFETY: the caller keeps the three buffers alive (module contract).
            let p = unsafe {
                [
                    bytes(gate.0, gate.1),
                    bytes(up.0, up.1),
                    bytes(down.0, down.1),
                ]
            };
            w.add_expert(layer, expert, p)
        })
    }

    /// Writes metadata, indexes and footer, syncs and renames the file into place.
    /// Returns the file size.
    fn finish(&mut self, py: Python<'_>, metadata_json: String) -> PyResult<u64> {
        let w = self.inner.take().ok_or_else(|| {
            crate::error::WriterError::new_err("the writer is already finished or aborted")
        })?;
        detach(py, move || w.finish(&metadata_json).map(|h| h.file_size))
    }

    /// Stops writing and removes the partial file.
    fn abort(&mut self) {
        self.inner = None;
    }
}

/// The format's constants, for the test that Python and Rust agree.
#[pyfunction]
pub fn format_constants(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    use ftw_format as f;
    let d = PyDict::new(py);
    d.set_item("MAGIC", f::MAGIC.to_vec())?;
    d.set_item("FOOTER_MAGIC", f::FOOTER_MAGIC.to_vec())?;
    d.set_item("FORMAT_VERSION", f::FORMAT_VERSION)?;
    d.set_item("ALIGN", f::ALIGN)?;
    d.set_item("HEADER_PAGE", f::HEADER_PAGE)?;
    d.set_item("HEADER_STRUCT_SIZE", f::HEADER_STRUCT_SIZE)?;
    d.set_item("SCALE_ALIGN", f::SCALE_ALIGN)?;
    d.set_item("EXPERT_RECORD_SIZE", f::EXPERT_RECORD_SIZE)?;
    d.set_item("EXPERT_LAYOUT_SIZE", f::EXPERT_LAYOUT_SIZE)?;
    d.set_item("MAX_METADATA_BYTES", f::MAX_METADATA_BYTES)?;
    d.set_item("MAX_TENSORS", f::MAX_TENSORS)?;
    d.set_item("MAX_NAME_BYTES", f::MAX_NAME_BYTES)?;
    d.set_item("MAX_DIMS", f::MAX_DIMS)?;
    let dtypes = PyDict::new(py);
    for dt in DType::ALL {
        dtypes.set_item(dt.name(), (dt as u8, dt.size()))?;
    }
    d.set_item("DTYPES", dtypes)?;
    let schemes = PyDict::new(py);
    for (name, s) in [
        ("raw", Scheme::Raw(DType::BF16)),
        ("int8", Scheme::Int8),
        ("int4", Scheme::Int4 { group_size: 32 }),
    ] {
        schemes.set_item(name, s.code())?;
    }
    d.set_item("SCHEMES", schemes)?;
    Ok(d)
}

/// Registers the format classes and functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFtwReader>()?;
    m.add_class::<PyFtwWriter>()?;
    m.add_function(wrap_pyfunction!(format_constants, m)?)?;
    Ok(())
}
