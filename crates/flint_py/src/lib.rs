//! `flint._core`: the thin PyO3 layer over flint's Rust crates. No logic lives here;
//! each submodule maps one crate's API and errors to Python.

use pyo3::prelude::*;

mod arena;
mod cache;
mod decode;
mod error;
mod format;
mod io;
mod kernels;

/// The private extension module. The public API is the `flint` Python package.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    error::register(m)?;
    format::register(m)?;
    m.add_class::<io::PyIoEngine>()?;
    m.add_class::<kernels::PyCpuKernels>()?;
    m.add_class::<decode::PyDecodeStep>()?;
    m.add_class::<arena::PyArena>()?;
    m.add_class::<cache::PyExpertCache>()?;
    m.add_class::<cache::PyReplayResult>()?;
    m.add_function(wrap_pyfunction!(cache::replay, m)?)?;
    Ok(())
}
