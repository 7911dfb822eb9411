//! The Python exception hierarchy of `flint._core`, and the one gateway for running
//! Rust work without the GIL.
//!
//! ```text
//! FlintError                   root: everything flint raises on purpose
//! └── CacheError               crate expert_cache
//!     ├── CacheArgumentError   a size, index, name or probability out of range
//!     ├── CacheStateError      an operation that does not fit the expert's state
//!     ├── CacheFullError       every slot of a layer is pinned
//!     ├── ArenaError           the arena budget or allocation
//!     ├── TraceError           a malformed routing trace
//!     └── UsageTableError      the usage table file (I/O, corrupt, foreign)
//! ```
//! Each Rust error variant maps to one class, case by case (no catch-all).

use expert_cache::CacheError as E;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    flint._core,
    FlintError,
    PyException,
    "Root of every error flint raises."
);
create_exception!(
    flint._core,
    CacheError,
    FlintError,
    "An error of the RAM expert cache."
);
create_exception!(
    flint._core,
    CacheArgumentError,
    CacheError,
    "A size, index, policy name or probability is out of range."
);
create_exception!(
    flint._core,
    CacheStateError,
    CacheError,
    "The expert is not in a state that allows the operation (resident, pinned)."
);
create_exception!(
    flint._core,
    CacheFullError,
    CacheError,
    "Every slot of the layer is pinned: nothing can be evicted until one is unpinned."
);
create_exception!(
    flint._core,
    ArenaError,
    CacheError,
    "The slot arena cannot be planned or allocated."
);
create_exception!(
    flint._core,
    TraceError,
    CacheError,
    "The routing trace is malformed."
);
create_exception!(
    flint._core,
    UsageTableError,
    CacheError,
    "The usage table file could not be read or written, is corrupt, or is another model's."
);

/// Maps a cache error to its Python exception, variant by variant.
pub fn cache_err(err: E) -> PyErr {
    let msg = err.to_string();
    match err {
        E::Zero { .. }
        | E::LayerOutOfRange { .. }
        | E::ExpertOutOfRange { .. }
        | E::SlotOutOfRange { .. }
        | E::CapacityBelowTopK { .. }
        | E::InvalidRecall { .. }
        | E::UnknownPolicy { .. }
        | E::BeladyNeedsTrace => CacheArgumentError::new_err(msg),
        E::NotResident { .. }
        | E::AlreadyResident { .. }
        | E::Pinned { .. }
        | E::NotPinned { .. } => CacheStateError::new_err(msg),
        E::AllPinned { .. } => CacheFullError::new_err(msg),
        E::Overflow { .. } | E::BudgetTooSmall { .. } | E::AllocFailed { .. } => {
            ArenaError::new_err(msg)
        }
        E::TraceShape { .. } | E::TraceExpert { .. } => TraceError::new_err(msg),
        E::UsageIo { .. } | E::UsageCorrupt { .. } | E::UsageForeign { .. } => {
            UsageTableError::new_err(msg)
        }
    }
}

/// Runs `work` with the GIL released, maps its error, and then turns a Ctrl-C that
/// arrived meanwhile into `KeyboardInterrupt`. All blocking calls go through here.
pub fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, E> + Send,
{
    let out = py.allow_threads(work).map_err(cache_err)?;
    py.check_signals()?;
    Ok(out)
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FlintError", py.get_type::<FlintError>())?;
    m.add("CacheError", py.get_type::<CacheError>())?;
    m.add("CacheArgumentError", py.get_type::<CacheArgumentError>())?;
    m.add("CacheStateError", py.get_type::<CacheStateError>())?;
    m.add("CacheFullError", py.get_type::<CacheFullError>())?;
    m.add("ArenaError", py.get_type::<ArenaError>())?;
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("UsageTableError", py.get_type::<UsageTableError>())?;
    Ok(())
}
