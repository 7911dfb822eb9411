//! The memory behind the slots: one page-aligned allocation, cut into equal slots,
//! `slots_per_layer` for each streamed layer, layer-major.
//!
//! Why one arena: it can be page-locked (cudaHostRegister) in one call for fast GPU
//! uploads, wrapped by Python as one buffer, and every slot offset is a multiple of
//! 4 KiB, as O_DIRECT reads need. Slot size is the largest expert slab rounded up to
//! 4 KiB, so any expert fits any slot of its layer.
//!
//! The bytes are zero-initialised by `alloc_zeroed`, which for sizes this large maps
//! fresh pages from the kernel: untouched slots cost no resident memory.
//!
//! # Lifetime contract
//! - The arena owns its memory. It never moves, grows or shrinks; it is freed when the
//!   `Arena` is dropped. Pointers from [`Arena::as_ptr`] / [`Arena::slot_ptr`] are
//!   valid for exactly that long, and holders (the I/O engine, a Python buffer or
//!   tensor view) must keep the `Arena` alive while they use them.
//! - The arena never reads or writes the bytes itself. Who may touch a slot is decided
//!   by the cache: a slot is written only while pinned for a read into it, and read
//!   only while its expert is resident (pinned while a GPU copy is in flight). The
//!   arena does not enforce this; two writers to one slot are the caller's data race.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::{CacheError, Result};

/// Alignment of the arena and of every slot (the page size O_DIRECT needs).
pub const SLOT_ALIGN: u64 = 4096;

/// Shape of an arena: how many slots of what size for how many layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Streamed layers.
    pub n_layers: usize,
    /// Slots in each layer's pool.
    pub slots_per_layer: usize,
    /// Bytes per slot, a multiple of [`SLOT_ALIGN`].
    pub slot_bytes: u64,
}

impl ArenaPlan {
    /// As many slots per layer as `budget_bytes` holds (at most `n_experts`, more
    /// could never be used), each sized for the largest slab rounded up to 4 KiB.
    pub fn from_budget(
        budget_bytes: u64,
        n_layers: usize,
        n_experts: u32,
        max_slab_bytes: u64,
    ) -> Result<Self> {
        for (what, n) in [
            ("layers", n_layers as u64),
            ("experts", u64::from(n_experts)),
            ("slab bytes", max_slab_bytes),
        ] {
            if n == 0 {
                return Err(CacheError::Zero { what });
            }
        }
        let slot_bytes = max_slab_bytes
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or(CacheError::Overflow { what: "slot size" })?;
        let layer_row = slot_bytes
            .checked_mul(n_layers as u64)
            .ok_or(CacheError::Overflow {
                what: "one slot per layer",
            })?;
        let slots = (budget_bytes / layer_row).min(u64::from(n_experts));
        if slots == 0 {
            return Err(CacheError::BudgetTooSmall {
                budget: budget_bytes,
                slot_bytes,
                n_layers,
            });
        }
        let slots_per_layer =
            usize::try_from(slots).map_err(|_| CacheError::Overflow { what: "slots" })?;
        Ok(Self {
            n_layers,
            slots_per_layer,
            slot_bytes,
        })
    }

    /// Total slots (all layers).
    pub fn total_slots(&self) -> Result<usize> {
        self.n_layers
            .checked_mul(self.slots_per_layer)
            .ok_or(CacheError::Overflow { what: "slot count" })
    }

    /// Total bytes of the arena.
    pub fn total_bytes(&self) -> Result<usize> {
        let slot = usize::try_from(self.slot_bytes)
            .map_err(|_| CacheError::Overflow { what: "slot size" })?;
        self.total_slots()?
            .checked_mul(slot)
            .ok_or(CacheError::Overflow { what: "arena size" })
    }
}

/// One page-aligned allocation holding every slot. See the module's lifetime contract.
#[derive(Debug)]
pub struct Arena {
    ptr: NonNull<u8>,
    layout: Layout,
    plan: ArenaPlan,
}

// SAFETY: the arena is a plain owned allocation; it never touches the bytes itself, and
// access to slot contents is coordinated by the cache's pins (see the module docs).
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only hands out addresses.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates the arena for `plan`, zeroed.
    pub fn new(plan: ArenaPlan) -> Result<Self> {
        let bytes = plan.total_bytes()?;
        if bytes == 0 {
            return Err(CacheError::Zero { what: "arena size" });
        }
        let layout = Layout::from_size_align(bytes, SLOT_ALIGN as usize).map_err(|_| {
            CacheError::Overflow {
                what: "arena layout",
            }
        })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(CacheError::AllocFailed { bytes })?;
        Ok(Self { ptr, layout, plan })
    }

    /// The arena's shape.
    pub fn plan(&self) -> ArenaPlan {
        self.plan
    }

    /// Start of the arena (4 KiB aligned). Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: an arena holds at least one slot.
    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    /// Byte offset of `slot` of `layer` from [`Arena::as_ptr`].
    pub fn slot_offset(&self, layer: usize, slot: usize) -> Result<usize> {
        let n_layers = self.plan.n_layers;
        if layer >= n_layers {
            return Err(CacheError::LayerOutOfRange { layer, n_layers });
        }
        let slots_per_layer = self.plan.slots_per_layer;
        if slot >= slots_per_layer {
            return Err(CacheError::SlotOutOfRange {
                slot,
                slots_per_layer,
            });
        }
        // In range, so below total_slots and total_bytes, which were checked at new().
        Ok((layer * self.plan.slots_per_layer + slot) * self.plan.slot_bytes as usize)
    }

    /// Address of `slot` of `layer`; `slot_bytes` bytes are valid from it while `self`
    /// lives.
    pub fn slot_ptr(&self, layer: usize, slot: usize) -> Result<*mut u8> {
        let offset = self.slot_offset(layer, slot)?;
        Ok(self.as_ptr().wrapping_add(offset))
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_rounds_slots_to_pages_and_divides_the_budget() -> Result<()> {
        let plan = ArenaPlan::from_budget(10 * 8192 * 3 + 100, 3, 64, 5000)?;
        assert_eq!((plan.slot_bytes, plan.slots_per_layer), (8192, 10));
        assert_eq!(plan.total_bytes()?, 30 * 8192);
        let capped = ArenaPlan::from_budget(u64::MAX, 2, 4, 4096)?;
        assert_eq!(capped.slots_per_layer, 4, "never more slots than experts");
        Ok(())
    }

    #[test]
    fn too_small_a_budget_and_zero_sizes_are_errors() {
        assert!(matches!(
            ArenaPlan::from_budget(4095, 1, 8, 1),
            Err(CacheError::BudgetTooSmall { .. })
        ));
        assert!(matches!(
            ArenaPlan::from_budget(1 << 20, 0, 8, 1),
            Err(CacheError::Zero { .. })
        ));
        assert!(matches!(
            ArenaPlan::from_budget(u64::MAX, 2, 8, u64::MAX),
            Err(CacheError::Overflow { .. })
        ));
    }

    #[test]
    fn slots_are_page_aligned_and_bounds_checked() -> Result<()> {
        let arena = Arena::new(ArenaPlan::from_budget(4 * 4096 * 2, 2, 8, 4096)?)?;
        assert_eq!(arena.len(), 8 * 4096);
        for (layer, slot) in [(0, 0), (0, 3), (1, 0), (1, 3)] {
            assert_eq!(arena.slot_ptr(layer, slot)? as usize % 4096, 0);
        }
        assert_eq!(arena.slot_offset(1, 1)?, 5 * 4096);
        assert!(arena.slot_offset(2, 0).is_err() && arena.slot_offset(0, 4).is_err());
        Ok(())
    }
}
