//! The one error type of the crate. Every variant names what is wrong and carries the
//! values that explain it; the reader maps every malformed input to one of them.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = FtwError> = std::result::Result<T, E>;

/// Everything that can go wrong writing or reading a `.ftw` file.
#[derive(Debug, thiserror::Error)]
pub enum FtwError {
    /// The operating system refused an operation on the file.
    #[error("{context} {path}: {source}")]
    Io {
        /// What flint was doing ("reading", "writing", ...).
        context: &'static str,
        /// The file involved.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the `.ftw` magic bytes.
    #[error("not a .ftw file: magic bytes are {found:02x?}")]
    BadMagic {
        /// The first eight bytes found.
        found: [u8; 8],
    },
    /// The file was written by a format version this reader does not understand.
    #[error("unsupported .ftw version {found} (this flint reads version {supported})")]
    UnsupportedVersion {
        /// Version in the file.
        found: u32,
        /// Version this reader supports.
        supported: u32,
    },
    /// The file is shorter or longer than its header says, or its footer is missing.
    #[error("truncated or extended file: header says {expected} bytes, file has {actual}")]
    Truncated {
        /// Size recorded in the header.
        expected: u64,
        /// Size on disk.
        actual: u64,
    },
    /// The footer does not repeat the header (the file was cut or overwritten).
    #[error("footer does not match header: {detail}")]
    FooterMismatch {
        /// Which field differs.
        detail: String,
    },
    /// A header field is invalid on its own.
    #[error("invalid header: {detail}")]
    BadHeader {
        /// What is wrong.
        detail: String,
    },
    /// A checksum over a structural part (header, metadata, an index) does not match.
    #[error("checksum mismatch in {section}: stored {stored:016x}, computed {computed:016x}")]
    SectionChecksum {
        /// The part that failed ("header", "metadata", ...).
        section: &'static str,
        /// Checksum stored in the file.
        stored: u64,
        /// Checksum of the bytes read.
        computed: u64,
    },
    /// A dense tensor's bytes do not match its checksum.
    #[error("checksum mismatch in tensor {name:?}: the file is corrupt")]
    TensorChecksum {
        /// The tensor's name.
        name: String,
    },
    /// An expert slab's bytes do not match its checksum.
    #[error("checksum mismatch in expert {expert} of layer {layer}: the file is corrupt")]
    ExpertChecksum {
        /// Layer of the expert.
        layer: u32,
        /// Expert index within the layer.
        expert: u32,
    },
    /// An offset or size computation overflowed 64 bits.
    #[error("offset or size overflows in {what}")]
    Overflow {
        /// The item whose arithmetic overflowed.
        what: String,
    },
    /// An extent lies (partly) outside the region that must contain it.
    #[error("{what} at [{start}, {end}) lies outside {region} [{lo}, {hi})")]
    OutOfBounds {
        /// The item.
        what: String,
        /// Its first byte.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The region it must lie in.
        region: &'static str,
        /// Region start.
        lo: u64,
        /// Region end.
        hi: u64,
    },
    /// Two extents overlap.
    #[error("{first} overlaps {second}")]
    Overlap {
        /// The earlier item.
        first: String,
        /// The later item.
        second: String,
    },
    /// An offset or size is not on its required boundary.
    #[error("{what} at {value} is not aligned to {align} bytes")]
    Misaligned {
        /// The item.
        what: String,
        /// The offending value.
        value: u64,
        /// The required alignment.
        align: u64,
    },
    /// A byte count differs from what the shape and type require.
    #[error("{what} holds {found} bytes, its shape and type need {expected}")]
    SizeMismatch {
        /// The item.
        what: String,
        /// Bytes required.
        expected: u64,
        /// Bytes recorded.
        found: u64,
    },
    /// A type code outside the allow-list.
    #[error("unknown dtype code {code} in {what}")]
    UnknownDtype {
        /// The code found.
        code: u8,
        /// The item.
        what: String,
    },
    /// A quantization scheme code or combination this reader does not know.
    #[error("invalid expert layout: {detail}")]
    BadLayout {
        /// What is wrong.
        detail: String,
    },
    /// A count, length or dimension above the format's caps.
    #[error("{what} is {value}, above the limit of {cap}")]
    TooLarge {
        /// The item.
        what: String,
        /// The value found.
        value: u64,
        /// The cap.
        cap: u64,
    },
    /// The metadata is not a JSON object.
    #[error("metadata is not valid JSON: {detail}")]
    InvalidJson {
        /// Parser message.
        detail: String,
    },
    /// Text that must be UTF-8 is not.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The item.
        what: String,
    },
    /// An index is malformed (short, trailing bytes, bad ordering, duplicates).
    #[error("malformed {index}: {detail}")]
    BadIndex {
        /// Which index.
        index: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// No dense tensor has this name.
    #[error("no tensor named {name:?} in the file")]
    NoSuchTensor {
        /// The name asked for.
        name: String,
    },
    /// No expert with this (layer, expert) is in the file.
    #[error("no expert {expert} in layer {layer} in the file")]
    NoSuchExpert {
        /// Layer asked for.
        layer: u32,
        /// Expert asked for.
        expert: u32,
    },
    /// A caller-supplied buffer or argument is unusable.
    #[error("invalid argument: {detail}")]
    InvalidArgument {
        /// What is wrong.
        detail: String,
    },
    /// A writer call came in the wrong order (e.g. a dense tensor after the experts).
    #[error("writer: {detail}")]
    WriterState {
        /// What was called when.
        detail: String,
    },
}
