//! The `.ftw` model file: one file per model, every routed expert on a 4 KiB boundary
//! so it can be read with direct I/O, an index of where each expert sits, and xxh3-64
//! checksums so a corrupt file stops the run before it produces output.
//!
//! The byte-level specification is `docs/ftw-format.md`; this crate is its reference
//! implementation. The reader validates everything before trusting it and returns a
//! typed [`FtwError`] on any malformed input; it never panics.

mod consts;
mod cursor;
mod dtype;
mod error;
mod header;
mod index;
mod io;
mod layout;
mod reader;
mod validate;
mod writer;

#[cfg(feature = "testing")]
pub mod testing;

pub use consts::*;
pub use dtype::DType;
pub use error::{FtwError, Result};
pub use header::{Extent, Header};
pub use index::{ExpertEntry, ProjSpan, TensorEntry};
pub use layout::{ExpertLayout, ProjShape, Scheme, PROJ_NAMES};
pub use reader::FtwReader;
pub use writer::FtwWriter;

/// The checksum used everywhere in the file: xxh3-64 with seed 0.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
