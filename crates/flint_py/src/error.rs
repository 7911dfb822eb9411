//! Python exceptions of `flint._core` and the mapping of each crate's error enum onto
//! them, case by case, plus the one gateway for leaving the GIL.

use ftw_format::FtwError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyKeyError, PyOSError, PyValueError};
use pyo3::marker::Ungil;
use pyo3::prelude::*;

create_exception!(
    _core,
    FlintError,
    PyException,
    "Root of every error flint raises."
);
create_exception!(
    _core,
    FormatError,
    FlintError,
    "The file is not a valid .ftw file (bad structure, truncated, unsupported)."
);
create_exception!(
    _core,
    ChecksumError,
    FormatError,
    "Bytes of the file do not match their stored checksum: the file is corrupt."
);
create_exception!(
    _core,
    WriterError,
    FlintError,
    "A .ftw writer was used out of order."
);

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

/// Runs blocking work without the GIL, maps its error, and turns a Ctrl-C that
/// arrived meanwhile into `KeyboardInterrupt`.
pub fn detach<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: Ungil + Send + FnOnce() -> Result<T, FtwError>,
    T: Ungil + Send,
{
    let out = py.allow_threads(work).map_err(ftw_to_py);
    py.check_signals()?;
    out
}

/// Registers the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FlintError", py.get_type::<FlintError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("ChecksumError", py.get_type::<ChecksumError>())?;
    m.add("WriterError", py.get_type::<WriterError>())?;
    Ok(())
}
