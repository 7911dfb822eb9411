//! Errors of the I/O engine. Every failure of a read reaches the waiter of that expert
//! as one of these, naming the expert; nothing hangs and no half-filled slot is ready.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = IoError> = std::result::Result<T, E>;

/// What can go wrong reading experts.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IoError {
    /// The model file could not be opened.
    #[error("opening {path}: {message}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// The operating system failed a read of this expert.
    #[error("reading expert {expert} of layer {layer}: {message}")]
    Read {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
        /// The operating system's message (e.g. EIO).
        message: String,
    },
    /// The file ended before the expert's bytes (it was truncated underneath).
    #[error("short read of expert {expert} of layer {layer}: file ended at {got} of {want} bytes")]
    ShortRead {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
        /// Bytes obtained.
        got: u64,
        /// Bytes needed.
        want: u64,
    },
    /// The slab's bytes do not match its stored checksum.
    #[error("checksum mismatch in expert {expert} of layer {layer}: the file is corrupt")]
    Checksum {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
    },
    /// The read was cancelled before it finished.
    #[error("read of expert {expert} of layer {layer} was cancelled")]
    Cancelled {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
    },
    /// Nothing was requested for this expert (or its record was already swept).
    #[error("no read of expert {expert} of layer {layer} is known to the engine")]
    NotRequested {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
    },
    /// The wait ran out before the bytes arrived.
    #[error("timed out after {ms} ms waiting for expert {expert} of layer {layer}")]
    Timeout {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
        /// The timeout.
        ms: u64,
    },
    /// The expert is not in the file.
    #[error("expert {expert} of layer {layer} is not in the model file")]
    NoSuchExpert {
        /// Layer asked for.
        layer: u32,
        /// Expert asked for.
        expert: u32,
    },
    /// A slot is too small or misaligned for the expert's slab.
    #[error("slot for expert {expert} of layer {layer} is unusable: {detail}")]
    BadSlot {
        /// Layer of the expert.
        layer: u32,
        /// Expert within the layer.
        expert: u32,
        /// What is wrong with it.
        detail: String,
    },
    /// An engine setting is invalid.
    #[error("invalid engine setting: {0}")]
    Config(String),
}
