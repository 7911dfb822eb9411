//! The crate's one error type. Every variant carries the values that explain it, so a
//! message names the layer, expert, size or file that was wrong.

use std::path::PathBuf;

/// Everything that can go wrong in the expert cache, its arena, its usage table and
/// trace replay. Nothing in this crate panics on caller input; it returns one of these.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A size that must be positive was zero (layers, experts, capacity, top-k, slab).
    #[error("{what} must be at least 1")]
    Zero {
        /// Which size was zero.
        what: &'static str,
    },
    /// A layer index at or past the number of streamed layers.
    #[error("layer {layer} is out of range: the cache has {n_layers} layers")]
    LayerOutOfRange {
        /// The layer asked for.
        layer: usize,
        /// How many layers the cache has.
        n_layers: usize,
    },
    /// An expert index at or past the number of experts per layer.
    #[error("expert {expert} is out of range: layers have {n_experts} experts")]
    ExpertOutOfRange {
        /// The expert asked for.
        expert: u32,
        /// How many experts each layer has.
        n_experts: u32,
    },
    /// An arena slot index at or past the slots of a layer.
    #[error("slot {slot} is out of range: layers have {slots_per_layer} slots")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: usize,
        /// Slots per layer.
        slots_per_layer: usize,
    },
    /// The operation needs the expert resident (touch, pin, evict, protect) and it is not.
    #[error("expert {expert} of layer {layer} is not resident")]
    NotResident {
        /// Layer of the expert.
        layer: usize,
        /// The expert.
        expert: u32,
    },
    /// `admit` was called for an expert that already has a slot.
    #[error("expert {expert} of layer {layer} is already resident in slot {slot}")]
    AlreadyResident {
        /// Layer of the expert.
        layer: usize,
        /// The expert.
        expert: u32,
        /// The slot it occupies.
        slot: u32,
    },
    /// A demand admission found every slot of the layer pinned: nothing may be evicted
    /// until a read or GPU copy finishes and unpins one.
    #[error("no slot of layer {layer} can be evicted: all {capacity} slots are pinned")]
    AllPinned {
        /// The layer whose pool is full of pinned slots.
        layer: usize,
        /// Slots in that pool.
        capacity: usize,
    },
    /// The OS refused to take back a slot's pages (`madvise`).
    #[error("could not give slot {slot} of layer {layer} back to the OS: {source}")]
    Release {
        /// Layer of the slot.
        layer: usize,
        /// The slot.
        slot: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// `evict` of an expert whose slot is still pinned (being read into or copied).
    #[error("expert {expert} of layer {layer} is pinned {pins} time(s) and cannot be evicted")]
    Pinned {
        /// Layer of the expert.
        layer: usize,
        /// The expert.
        expert: u32,
        /// Outstanding pins.
        pins: u32,
    },
    /// `unpin` of an expert that has no outstanding pin.
    #[error("expert {expert} of layer {layer} is not pinned")]
    NotPinned {
        /// Layer of the expert.
        layer: usize,
        /// The expert.
        expert: u32,
    },
    /// A size computation overflowed (the arena would not fit the address space).
    #[error("size overflow computing {what}")]
    Overflow {
        /// The quantity that overflowed.
        what: &'static str,
    },
    /// The byte budget cannot hold one slot for every streamed layer.
    #[error("a budget of {budget} bytes cannot hold one {slot_bytes}-byte slot for each of {n_layers} layers")]
    BudgetTooSmall {
        /// The budget given.
        budget: u64,
        /// Bytes per slot (largest slab rounded up to 4 KiB).
        slot_bytes: u64,
        /// Streamed layers.
        n_layers: usize,
    },
    /// The allocator refused the arena.
    #[error("could not allocate a {bytes}-byte arena")]
    AllocFailed {
        /// Bytes asked for.
        bytes: usize,
    },
    /// The routing trace does not have the shape it claims.
    #[error("trace holds {len} values but {n_tokens} tokens x {n_layers} layers x top-{top_k} need {expected}")]
    TraceShape {
        /// Values present.
        len: usize,
        /// Tokens claimed.
        n_tokens: usize,
        /// Layers claimed.
        n_layers: usize,
        /// Experts per token and layer claimed.
        top_k: usize,
        /// Values the claimed shape needs.
        expected: usize,
    },
    /// The trace names an expert outside the layer, or the same expert twice in one
    /// token and layer.
    #[error("trace token {token}, layer {layer}: expert {expert} is {problem}")]
    TraceExpert {
        /// Token index.
        token: usize,
        /// Layer index.
        layer: usize,
        /// The offending expert id.
        expert: u32,
        /// "out of range", "negative" or "repeated".
        problem: &'static str,
    },
    /// A replay capacity smaller than top-k cannot hold one token's experts.
    #[error(
        "capacity {capacity} per layer is below top-k {top_k}: one token's experts do not fit"
    )]
    CapacityBelowTopK {
        /// Slots per layer asked for.
        capacity: usize,
        /// Experts per token and layer.
        top_k: usize,
    },
    /// The simulated predictor's recall must be a probability.
    #[error("predictor recall {recall} is not in [0, 1]")]
    InvalidRecall {
        /// The value given.
        recall: f64,
    },
    /// A policy name that is none of lru, lfu, decay, belady.
    #[error("unknown policy {name:?}: expected one of lru, lfu, decay, belady")]
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// Belady needs the future, so it exists only in trace replay.
    #[error("the belady policy knows the future and exists only in trace replay")]
    BeladyNeedsTrace,
    /// Reading or writing the usage table failed at the file-system level.
    #[error("usage table {path}: {source}")]
    UsageIo {
        /// The table's path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The usage table's bytes are damaged (magic, version, length or checksum).
    #[error("usage table {path} is corrupt: {reason}")]
    UsageCorrupt {
        /// The table's path.
        path: PathBuf,
        /// What check failed.
        reason: &'static str,
    },
    /// The usage table is intact but belongs to another model or geometry.
    #[error("usage table {path} is for another model ({found}), expected {expected}")]
    UsageForeign {
        /// The table's path.
        path: PathBuf,
        /// Geometry and model key found in the file.
        found: String,
        /// Geometry and model key expected.
        expected: String,
    },
}

/// Result alias for this crate.
pub type Result<T, E = CacheError> = std::result::Result<T, E>;
