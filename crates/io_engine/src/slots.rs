//! Where reads land: slots of the RAM expert cache, handed out by a [`SlotSource`].

use crate::job::{ExpertKey, ReadClass};

/// A destination for one expert slab: a 4 KiB-aligned region of the cache's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The slot's index in its pool (meaning is the source's).
    pub index: u32,
    /// Address of the first byte.
    pub addr: usize,
    /// Usable bytes (at least the slab length).
    pub len: u64,
}

/// The cache side of the engine. The engine calls these with its own lock held, so an
/// implementation must never call back into the engine.
///
/// Memory contract: a slot handed out by `bind` (or given to `Engine::demand`) stays
/// valid and is written by nobody but the engine until the engine passes it back
/// through `complete` or `release`.
pub trait SlotSource: Send + Sync {
    /// A slot for a prediction that a worker is about to start reading (late binding),
    /// or `None` when none can be had without evicting something that must stay.
    fn bind(&self, key: ExpertKey, class: ReadClass) -> Option<Slot>;
    /// The slab is in the slot and verified: the expert is now resident there.
    fn complete(&self, key: ExpertKey, slot: Slot);
    /// The read was cancelled or failed: the slot is free again.
    fn release(&self, key: ExpertKey, slot: Slot);
}
