//! Python wrapper for the slot arena: exposes the memory without copying, through the
//! buffer protocol (`memoryview(arena)`, `numpy.frombuffer(arena, ...)`,
//! `torch.frombuffer(arena, ...)`) and as a raw address for page-locking
//! (`cudaHostRegister`).
//!
//! Lifetime: a buffer export holds a reference to the `Arena` object (the buffer's
//! `obj`), so views made through the buffer protocol keep the memory alive. The raw
//! `address` does not: whoever uses it must keep the `Arena` alive, and unregister
//! any page-locking before it is dropped.

use std::ffi::{c_int, c_void};

use expert_cache::{Arena, ArenaPlan};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::error::{cache_err, detach};

/// One page-aligned allocation holding `slots_per_layer` slots of `slot_bytes` bytes for
/// each of `n_layers` layers, layer-major. Sized from a byte budget.
#[pyclass(module = "flint._core", name = "Arena", frozen)]
#[derive(Debug)]
pub struct PyArena {
    inner: Arena,
}

#[pymethods]
impl PyArena {
    #[new]
    fn new(
        py: Python<'_>,
        budget_bytes: u64,
        n_layers: usize,
        n_experts: u32,
        max_slab_bytes: u64,
    ) -> PyResult<Self> {
        let plan = ArenaPlan::from_budget(budget_bytes, n_layers, n_experts, max_slab_bytes)
            .map_err(cache_err)?;
        let inner = detach(py, move || Arena::new(plan))?;
        Ok(Self { inner })
    }

    #[getter]
    fn n_layers(&self) -> usize {
        self.inner.plan().n_layers
    }
    #[getter]
    fn slots_per_layer(&self) -> usize {
        self.inner.plan().slots_per_layer
    }
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.inner.plan().slot_bytes
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.len()
    }
    /// Start address (4 KiB aligned). Valid only while this object lives.
    #[getter]
    fn address(&self) -> usize {
        self.inner.as_ptr() as usize
    }

    /// Byte offset of a slot from the start of the arena.
    fn slot_offset(&self, layer: usize, slot: usize) -> PyResult<usize> {
        self.inner.slot_offset(layer, slot).map_err(cache_err)
    }

    /// Writable, one-dimensional byte buffer over the whole arena.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = (slf.get().inner.as_ptr(), slf.get().inner.len());
        let len = isize::try_from(len).map_err(|_| PyBufferError::new_err("arena too large"))?;
        // SAFETY: `view` is the caller-provided buffer struct; FillInfo takes a new
        // reference to `slf` as the view's owner, which keeps the arena alive for as
        // long as the view exists. The memory is valid and writable for `len` bytes.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast::<c_void>(), len, 0, flags)
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}
