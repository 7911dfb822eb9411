//! One layer's slot pool: which expert holds which slot, pins, protection and recency.
//!
//! Slots are numbered 0..capacity and never move; a slot's bytes live in the arena at
//! [`crate::Arena::slot_offset`]. The pool keeps both directions of the mapping
//! (expert -> slot for O(1) lookup, slot -> expert for the victim scan) and a free
//! list, and keeps them consistent: every slot is free, lent, or holds exactly one
//! expert whose entry points back at it. A lent slot (its memory given back to the OS
//! while a prompt runs, see [`crate::ExpertCache::lend`]) is on neither side: not in
//! the free list, so nothing is placed in it, and empty, so no scan picks it.
//!
//! Protection uses a generation number instead of per-slot flags: a slot is protected
//! while its stamp equals the pool's generation, and ending protection for the whole
//! layer (layer start, token end) is one increment.

const EMPTY: u32 = u32::MAX;

/// One slot's state, kept together so the victim scan walks one contiguous array
/// (measured: parallel arrays zipped together scanned at ~9 ns per slot, see
/// `benches/lookup_admit.rs`).
#[derive(Debug, Clone, Copy)]
struct Slot {
    expert: u32,
    pins: u32,
    last_use: u64,
    protected_gen: u64,
}

const FREE_SLOT: Slot = Slot {
    expert: EMPTY,
    pins: 0,
    last_use: 0,
    protected_gen: 0,
};

/// The slots of one streamed layer. Public only so that [`crate::Policy::pick`] can
/// name it; its methods are crate-private.
#[derive(Debug, Clone)]
pub struct SlotPool {
    slots: Vec<Slot>,
    expert_slot: Vec<u32>,
    /// Free slots, popped from the end; filled so that slot 0 is handed out first.
    free: Vec<u32>,
    /// Lent slots (empty, not free), in the order they were lent.
    lent: Vec<u32>,
    /// Starts at 1 so that a fresh slot's stamp (0) means "unprotected".
    generation: u64,
}

/// An occupied slot as the victim scan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Slot index in the layer's pool.
    pub slot: u32,
    /// Expert held (index within the layer).
    pub expert: u32,
    /// Outstanding pins.
    pub pins: u32,
    /// Predicted for this layer in this token, layer not started yet.
    pub protected: bool,
    /// Logical time of the last use or admission (larger = more recent).
    pub last_use: u64,
}

impl SlotPool {
    pub(crate) fn new(capacity: u32, n_experts: u32) -> Self {
        Self {
            slots: vec![FREE_SLOT; capacity as usize],
            expert_slot: vec![EMPTY; n_experts as usize],
            free: (0..capacity).rev().collect(),
            lent: Vec::new(),
            generation: 1,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Slots lent out now.
    pub(crate) fn lent_count(&self) -> usize {
        self.lent.len()
    }

    /// Free slots, in the order they would be handed out (the last one first).
    pub(crate) fn free_slots(&self) -> &[u32] {
        &self.free
    }

    /// Takes free `slot` out of use: it leaves the free list and stays empty until
    /// [`Self::reclaim`]. False (nothing changed) if `slot` is not free.
    pub(crate) fn lend(&mut self, slot: u32) -> bool {
        let Some(pos) = self.free.iter().position(|&s| s == slot) else {
            return false;
        };
        self.free.remove(pos);
        self.lent.push(slot);
        true
    }

    /// Lent `slot` is free again; false if it was not lent.
    pub(crate) fn unlend(&mut self, slot: u32) -> bool {
        let Some(pos) = self.lent.iter().position(|&s| s == slot) else {
            return false;
        };
        self.lent.remove(pos);
        self.free.push(slot);
        true
    }

    /// Every lent slot is free again (lowest slot handed out first); returns them.
    pub(crate) fn reclaim(&mut self) -> Vec<u32> {
        let back = std::mem::take(&mut self.lent);
        self.free.extend_from_slice(&back);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        back
    }

    pub(crate) fn slot_of(&self, expert: u32) -> Option<u32> {
        self.expert_slot
            .get(expert as usize)
            .copied()
            .filter(|&s| s != EMPTY)
    }

    pub(crate) fn expert_in(&self, slot: u32) -> Option<u32> {
        self.slots
            .get(slot as usize)
            .map(|s| s.expert)
            .filter(|&e| e != EMPTY)
    }

    pub(crate) fn pins(&self, slot: u32) -> u32 {
        self.slots.get(slot as usize).map_or(0, |s| s.pins)
    }

    /// Occupied slots in slot order.
    pub(crate) fn occupants(&self) -> impl Iterator<Item = Candidate> + '_ {
        let gen = self.generation;
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.expert != EMPTY)
            .map(move |(i, s)| {
                Candidate {
                    slot: i as u32, // capacity is a u32
                    expert: s.expert,
                    pins: s.pins,
                    protected: s.protected_gen == gen,
                    last_use: s.last_use,
                }
            })
    }

    /// The eviction candidate with the smallest key (protected, value, last use,
    /// expert): unpinned, and unprotected unless `demand`. Returns (slot, expert).
    /// A plain loop over the slot array: this is the cost of a miss in a full pool.
    pub(crate) fn scan(&self, demand: bool, value: impl Fn(u32) -> u64) -> Option<(u32, u32)> {
        let gen = self.generation;
        let mut best: Option<((bool, u64, u64, u32), u32)> = None;
        for (i, s) in self.slots.iter().enumerate() {
            let protected = s.protected_gen == gen;
            if s.expert == EMPTY || s.pins > 0 || (protected && !demand) {
                continue;
            }
            let key = (protected, value(s.expert), s.last_use, s.expert);
            match best {
                Some((b, _)) if b <= key => {}
                _ => best = Some((key, i as u32)), // capacity is a u32
            }
        }
        best.map(|((_, _, _, expert), slot)| (slot, expert))
    }

    /// Places `expert` in a free slot, if there is one.
    pub(crate) fn place(&mut self, expert: u32, now: u64) -> Option<u32> {
        let slot = self.free.pop()?;
        if let (Some(s), Some(es)) = (
            self.slots.get_mut(slot as usize),
            self.expert_slot.get_mut(expert as usize),
        ) {
            *s = Slot {
                expert,
                last_use: now,
                ..FREE_SLOT
            };
            *es = slot;
        }
        Some(slot)
    }

    /// Empties `slot`, returning the expert it held. Pins are the caller's check.
    pub(crate) fn remove(&mut self, slot: u32) -> Option<u32> {
        let expert = self.expert_in(slot)?;
        if let (Some(s), Some(es)) = (
            self.slots.get_mut(slot as usize),
            self.expert_slot.get_mut(expert as usize),
        ) {
            *s = FREE_SLOT;
            *es = EMPTY;
        }
        self.free.push(slot);
        Some(expert)
    }

    pub(crate) fn set_last_use(&mut self, slot: u32, now: u64) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.last_use = now;
        }
    }

    pub(crate) fn add_pin(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.pins = s.pins.saturating_add(1);
        }
    }

    /// Removes one pin; false if there was none.
    pub(crate) fn drop_pin(&mut self, slot: u32) -> bool {
        match self.slots.get_mut(slot as usize) {
            Some(s) if s.pins > 0 => {
                s.pins -= 1;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn protect(&mut self, slot: u32) {
        let gen = self.generation;
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.protected_gen = gen;
        }
    }

    /// Ends every protection in this layer.
    pub(crate) fn end_protection(&mut self) {
        self.generation = self.generation.wrapping_add(1).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_and_remove_keep_both_maps_and_the_free_list_consistent() {
        let mut pool = SlotPool::new(2, 5);
        assert_eq!(pool.place(3, 1), Some(0), "slot 0 is handed out first");
        assert_eq!(pool.place(4, 2), Some(1));
        assert_eq!(pool.place(1, 3), None, "full");
        assert_eq!((pool.slot_of(3), pool.expert_in(1)), (Some(0), Some(4)));
        assert_eq!(pool.remove(0), Some(3));
        assert_eq!((pool.slot_of(3), pool.free_count()), (None, 1));
        assert_eq!(pool.remove(0), None, "already empty");
    }

    #[test]
    fn protection_ends_with_the_generation() {
        let mut pool = SlotPool::new(1, 1);
        let slot = pool.place(0, 0).unwrap_or(EMPTY);
        pool.protect(slot);
        assert!(pool.occupants().all(|o| o.protected));
        pool.end_protection();
        assert!(pool.occupants().all(|o| !o.protected));
    }
}
