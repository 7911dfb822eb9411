//! Errors of the CPU expert kernels: bad shapes or buffers handed in by the caller, and
//! failures reported by the readiness source (a read that failed while the call waited).

/// Result alias of this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// What can go wrong computing a layer's experts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A projection shape is zero, too large, or does not fit the scheme.
    #[error("bad expert format: {reason}")]
    BadFormat {
        /// What is wrong with it.
        reason: String,
    },
    /// A buffer does not have the length the shapes imply.
    #[error("{what}: {got} elements, expected {want}")]
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the shapes imply.
        want: usize,
    },
    /// A routed expert id is outside the layer's experts.
    #[error("expert id {id} at position {position} is outside 0..{n_experts}")]
    ExpertOutOfRange {
        /// The id found in the routing table.
        id: i64,
        /// Its flat position (token * top_k + rank).
        position: usize,
        /// Experts in the layer.
        n_experts: usize,
    },
    /// A routed expert has no weights in the table of a call that needs all of them.
    #[error("expert {expert} was routed to but has no weights in the table")]
    MissingExpert {
        /// The expert.
        expert: u32,
    },
    /// The unknown name of an instruction set.
    #[error("unknown instruction set {name:?} (scalar, portable, avx2, avx512, avx512bf16)")]
    UnknownIsa {
        /// The name given.
        name: String,
    },
    /// The instruction set was asked for but this CPU does not have it.
    #[error("this CPU cannot run the {isa} kernels")]
    IsaUnavailable {
        /// The instruction set.
        isa: &'static str,
    },
    /// The thread pool could not be built.
    #[error("building a pool of {threads} threads: {message}")]
    Pool {
        /// Threads asked for.
        threads: usize,
        /// The reason.
        message: String,
    },
    /// Waiting for an expert's bytes failed (the message is the readiness source's).
    #[error("waiting for expert {expert}: {message}")]
    NotReady {
        /// The expert.
        expert: u32,
        /// The readiness source's error.
        message: String,
    },
}
