//! One layer's slot pool: which expert holds which slot, pins, protection and recency.
//!
//! Slots are numbered 0..capacity and never move; a slot's bytes live in the arena at
//! [`crate::Arena::slot_offset`]. The pool keeps both directions of the mapping
//! (expert -> slot for O(1) lookup, slot -> expert for the victim scan) and a free
//! list, and keeps them consistent: every slot is either free or holds exactly one
//! expert whose entry points back at it.
//!
//! Protection uses a generation number instead of per-slot flags: a slot is protected
//! while its stamp equals the pool's generation, and ending protection for the whole
//! layer (layer start, token end) is one increment.

const EMPTY: u32 = u32::MAX;

/// The slots of one streamed layer.
#[derive(Debug, Clone)]
pub(crate) struct SlotPool {
    slot_expert: Vec<u32>,
    pins: Vec<u32>,
    last_use: Vec<u64>,
    protected_gen: Vec<u64>,
    expert_slot: Vec<u32>,
    /// Free slots, popped from the end; filled so that slot 0 is handed out first.
    free: Vec<u32>,
    generation: u64,
}

/// What the victim scan sees of an occupied slot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Occupant {
    pub slot: u32,
    pub expert: u32,
    pub pins: u32,
    pub protected: bool,
    pub last_use: u64,
}

impl SlotPool {
    pub fn new(capacity: u32, n_experts: u32) -> Self {
        let cap = capacity as usize;
        Self {
            slot_expert: vec![EMPTY; cap],
            pins: vec![0; cap],
            last_use: vec![0; cap],
            // Generation starts at 1 so that the initial stamps (0) mean "unprotected".
            protected_gen: vec![0; cap],
            expert_slot: vec![EMPTY; n_experts as usize],
            free: (0..capacity).rev().collect(),
            generation: 1,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slot_expert.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn slot_of(&self, expert: u32) -> Option<u32> {
        self.expert_slot
            .get(expert as usize)
            .copied()
            .filter(|&s| s != EMPTY)
    }

    pub fn expert_in(&self, slot: u32) -> Option<u32> {
        self.slot_expert
            .get(slot as usize)
            .copied()
            .filter(|&e| e != EMPTY)
    }

    pub fn pins(&self, slot: u32) -> u32 {
        self.pins.get(slot as usize).copied().unwrap_or(0)
    }

    /// Occupied slots in slot order.
    pub fn occupants(&self) -> impl Iterator<Item = Occupant> + '_ {
        let gen = self.generation;
        self.slot_expert
            .iter()
            .zip(&self.pins)
            .zip(self.last_use.iter().zip(&self.protected_gen))
            .enumerate()
            .filter(|(_, ((&e, _), _))| e != EMPTY)
            .map(
                move |(slot, ((&expert, &pins), (&last_use, &stamp)))| Occupant {
                    slot: slot as u32,
                    expert,
                    pins,
                    protected: stamp == gen,
                    last_use,
                },
            )
    }

    /// Places `expert` in a free slot, if there is one.
    pub fn place(&mut self, expert: u32, now: u64) -> Option<u32> {
        let slot = self.free.pop()?;
        if let (Some(se), Some(es), Some(lu)) = (
            self.slot_expert.get_mut(slot as usize),
            self.expert_slot.get_mut(expert as usize),
            self.last_use.get_mut(slot as usize),
        ) {
            *se = expert;
            *es = slot;
            *lu = now;
        }
        Some(slot)
    }

    /// Empties `slot`, returning the expert it held. Pins are the caller's check.
    pub fn remove(&mut self, slot: u32) -> Option<u32> {
        let expert = self.expert_in(slot)?;
        if let (Some(se), Some(es), Some(pg)) = (
            self.slot_expert.get_mut(slot as usize),
            self.expert_slot.get_mut(expert as usize),
            self.protected_gen.get_mut(slot as usize),
        ) {
            *se = EMPTY;
            *es = EMPTY;
            *pg = 0;
        }
        self.free.push(slot);
        Some(expert)
    }

    pub fn set_last_use(&mut self, slot: u32, now: u64) {
        if let Some(lu) = self.last_use.get_mut(slot as usize) {
            *lu = now;
        }
    }

    pub fn add_pin(&mut self, slot: u32) {
        if let Some(p) = self.pins.get_mut(slot as usize) {
            *p = p.saturating_add(1);
        }
    }

    /// Removes one pin; false if there was none.
    pub fn drop_pin(&mut self, slot: u32) -> bool {
        match self.pins.get_mut(slot as usize) {
            Some(p) if *p > 0 => {
                *p -= 1;
                true
            }
            _ => false,
        }
    }

    pub fn protect(&mut self, slot: u32) {
        let gen = self.generation;
        if let Some(pg) = self.protected_gen.get_mut(slot as usize) {
            *pg = gen;
        }
    }

    /// Ends every protection in this layer.
    pub fn end_protection(&mut self) {
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
