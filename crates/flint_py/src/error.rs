//! The Python exception hierarchy of `flint._core`, the mapping of each crate's error
//! enum onto it (case by case, no catch-all), and the one gateway for running Rust work
//! without the GIL.
//!
//! ```text
//! FlintError                   root: everything flint raises on purpose
//! ├── FormatError              crate ftw_format: not a valid .ftw file
//! │   └── ChecksumError        bytes do not match their checksum
//! ├── WriterError              a .ftw writer used out of order
//! ├── ExpertReadError          crate io_engine: a read of an expert failed or was cancelled
//! └── CacheError               crate expert_cache
//!     ├── CacheArgumentError   a size, index, name or probability out of range
//!     ├── CacheStateError      an operation that does not fit the expert's state
//!     ├── CacheFullError       every slot of a layer is pinned
//!     ├── ArenaError           the arena budget or allocation
//!     ├── TraceError           a malformed routing trace
//!     └── UsageTableError      the usage table file (I/O, corrupt, foreign)
//! ```
//! OS failures map to `OSError` (`FileNotFoundError` where it applies), missing names
//! to `KeyError`, bad arguments to `ValueError`.

use cpu_kernels::KernelError;
use expert_cache::CacheError as CacheErr;
use ftw_format::FtwError;
use io_engine::IoError;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyKeyError, PyOSError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;

create_exception!(
    flint._core,
    FlintError,
    PyException,
    "Root of every error flint raises."
);
create_exception!(
    flint._core,
    FormatError,
    FlintError,
    "The file is not a valid .ftw file (bad structure, truncated, unsupported)."
);
create_exception!(
    flint._core,
    ChecksumError,
    FormatError,
    "Bytes of the file do not match their stored checksum: the file is corrupt."
);
create_exception!(
    flint._core,
    WriterError,
    FlintError,
    "A .ftw writer was used out of order."
);
create_exception!(
    flint._core,
    ExpertReadError,
    FlintError,
    "Reading an expert from the model file failed (I/O error, short read) or was cancelled."
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

/// A crate error that knows its Python exception.
pub trait IntoPyErr {
    /// The Python exception for this error.
    fn into_py_err(self) -> PyErr;
}

impl IntoPyErr for FtwError {
    fn into_py_err(self) -> PyErr {
        ftw_to_py(self)
    }
}

impl IntoPyErr for IoError {
    fn into_py_err(self) -> PyErr {
        let msg = self.to_string();
        match self {
            IoError::Open { .. } => PyOSError::new_err(msg),
            IoError::Read { .. } | IoError::ShortRead { .. } | IoError::Cancelled { .. } => {
                ExpertReadError::new_err(msg)
            }
            IoError::Checksum { .. } => ChecksumError::new_err(msg),
            IoError::Timeout { .. } => PyTimeoutError::new_err(msg),
            IoError::NotRequested { .. } | IoError::NoSuchExpert { .. } => PyKeyError::new_err(msg),
            IoError::BadSlot { .. } | IoError::Config(_) => PyValueError::new_err(msg),
        }
    }
}

impl IntoPyErr for PyErr {
    fn into_py_err(self) -> PyErr {
        self
    }
}

/// Maps a format error to the Python exception that best names it.
pub fn ftw_to_py(err: FtwError) -> PyErr {
    let msg = err.to_string();
    match err {
        FtwError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        FtwError::Io { .. } => PyOSError::new_err(msg),
        FtwError::SectionChecksum { .. }
        | FtwError::TensorChecksum { .. }
        | FtwError::ExpertChecksum { .. } => ChecksumError::new_err(msg),
        FtwError::NoSuchTensor { .. } | FtwError::NoSuchExpert { .. } => PyKeyError::new_err(msg),
        FtwError::InvalidArgument { .. } => PyValueError::new_err(msg),
        FtwError::WriterState { .. } => WriterError::new_err(msg),
        FtwError::BadMagic { .. }
        | FtwError::UnsupportedVersion { .. }
        | FtwError::Truncated { .. }
        | FtwError::FooterMismatch { .. }
        | FtwError::BadHeader { .. }
        | FtwError::Overflow { .. }
        | FtwError::OutOfBounds { .. }
        | FtwError::Overlap { .. }
        | FtwError::Misaligned { .. }
        | FtwError::SizeMismatch { .. }
        | FtwError::UnknownDtype { .. }
        | FtwError::BadLayout { .. }
        | FtwError::TooLarge { .. }
        | FtwError::InvalidJson { .. }
        | FtwError::InvalidUtf8 { .. }
        | FtwError::BadIndex { .. } => FormatError::new_err(msg),
    }
}

/// Maps a cache error to its Python exception, variant by variant.
impl IntoPyErr for CacheErr {
    fn into_py_err(self) -> PyErr {
        use CacheErr as E;
        let msg = self.to_string();
        match self {
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
            E::Overflow { .. }
            | E::BudgetTooSmall { .. }
            | E::AllocFailed { .. }
            | E::Release { .. } => ArenaError::new_err(msg),
            E::TraceShape { .. } | E::TraceExpert { .. } => TraceError::new_err(msg),
            E::UsageIo { .. } | E::UsageCorrupt { .. } | E::UsageForeign { .. } => {
                UsageTableError::new_err(msg)
            }
        }
    }
}

/// Maps a kernel error: bad arguments to `ValueError`, a failed wait to
/// `ExpertReadError`, a pool that cannot start to `OSError`.
impl IntoPyErr for KernelError {
    fn into_py_err(self) -> PyErr {
        let msg = self.to_string();
        match self {
            KernelError::BadFormat { .. }
            | KernelError::BadLength { .. }
            | KernelError::ExpertOutOfRange { .. }
            | KernelError::MissingExpert { .. }
            | KernelError::UnknownIsa { .. }
            | KernelError::IsaUnavailable { .. } => PyValueError::new_err(msg),
            KernelError::NotReady { .. } => ExpertReadError::new_err(msg),
            KernelError::Pool { .. } => PyOSError::new_err(msg),
        }
    }
}

/// Maps a cache error to its Python exception.
pub fn cache_err(err: CacheErr) -> PyErr {
    err.into_py_err()
}

/// Runs blocking work without the GIL, maps its error, and turns a Ctrl-C that
/// arrived meanwhile into `KeyboardInterrupt`. All blocking calls go through here.
pub fn detach<T, E, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send,
    E: IntoPyErr + Send,
    F: Send + FnOnce() -> Result<T, E>,
{
    let out = py.allow_threads(work).map_err(IntoPyErr::into_py_err);
    py.check_signals()?;
    out
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FlintError", py.get_type::<FlintError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("ChecksumError", py.get_type::<ChecksumError>())?;
    m.add("WriterError", py.get_type::<WriterError>())?;
    m.add("ExpertReadError", py.get_type::<ExpertReadError>())?;
    m.add("CacheError", py.get_type::<CacheError>())?;
    m.add("CacheArgumentError", py.get_type::<CacheArgumentError>())?;
    m.add("CacheStateError", py.get_type::<CacheStateError>())?;
    m.add("CacheFullError", py.get_type::<CacheFullError>())?;
    m.add("ArenaError", py.get_type::<ArenaError>())?;
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("UsageTableError", py.get_type::<UsageTableError>())?;
    Ok(())
}
