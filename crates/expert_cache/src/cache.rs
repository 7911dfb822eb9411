//! The RAM expert cache's decisions: one slot pool per streamed layer plus a policy.
//!
//! Rules that hold for every policy (the policy only supplies values, see
//! [`crate::policy`]):
//! - A pinned slot (being read into, or copied to the GPU) is never a victim.
//! - An expert predicted in this token for a layer that has not started yet is
//!   protected: a prefetch never evicts it; a demand read evicts it only when every
//!   unpinned resident expert is protected.
//! - Among the remaining candidates the lowest value leaves first, ties to the least
//!   recently used, then to the lower expert id. Recency is a logical clock that
//!   moves on every use and admission, so two residents of a layer never share it;
//!   the lower-id rule only makes the order total. Decisions depend on the calls
//!   alone: the same sequence of calls gives the same decisions.
//!
//! Every router selection is also recorded in the usage table (undecayed counts).

use crate::error::{CacheError, Result};
use crate::policy::{AdmitKind, Mode, Policy};
use crate::pool::SlotPool;
use crate::usage::UsageTable;

mod fill;
mod lend;
mod marks;

pub use lend::Lent;

/// Outcome of [`ExpertCache::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The expert got `slot`; `evicted` is the expert that held it, if any. The caller
    /// reads the expert into the slot (pinning it for the read).
    Placed {
        /// Slot now assigned to the expert.
        slot: u32,
        /// Expert evicted to make room.
        evicted: Option<u32>,
    },
    /// A prefetch or fill found no slot it may take; nothing changed.
    Declined,
}

/// Slot pools for every streamed layer and the policy that fills them.
#[derive(Debug, Clone)]
pub struct ExpertCache<P: Policy> {
    n_experts: u32,
    pools: Vec<SlotPool>,
    policy: P,
    usage: UsageTable,
    /// Logical clock, one tick per use or admission: the recency order.
    clock: u64,
    mode: Mode,
}

impl<P: Policy> ExpertCache<P> {
    /// A cache of `n_layers` pools of `capacity` slots for `n_experts` experts each.
    /// `capacity` above `n_experts` is clamped: extra slots could never be used.
    pub fn new(n_layers: usize, n_experts: u32, capacity: usize, policy: P) -> Result<Self> {
        for (what, n) in [
            ("layers", n_layers),
            ("experts", n_experts as usize),
            ("capacity", capacity),
        ] {
            if n == 0 {
                return Err(CacheError::Zero { what });
            }
        }
        let capacity = u32::try_from(capacity).unwrap_or(u32::MAX).min(n_experts);
        let pools = (0..n_layers)
            .map(|_| SlotPool::new(capacity, n_experts))
            .collect();
        let usage = UsageTable::new(n_layers, n_experts)?;
        Ok(Self {
            n_experts,
            pools,
            policy,
            usage,
            clock: 0,
            mode: Mode::Decode,
        })
    }

    /// Streamed layers.
    pub fn n_layers(&self) -> usize {
        self.pools.len()
    }
    /// Experts per layer.
    pub fn n_experts(&self) -> u32 {
        self.n_experts
    }
    /// Slots per layer.
    pub fn capacity(&self) -> usize {
        self.pools.first().map_or(0, SlotPool::capacity)
    }
    /// True when every expert of every layer holds a slot (none free, none lent): the
    /// cache can miss no more until a prompt lends slots. Its experts may still be
    /// being read into them (the caller checks its reads).
    pub fn holds_every_expert(&self) -> bool {
        let n = self.n_experts as usize;
        self.pools
            .iter()
            .all(|p| p.capacity() == n && p.free_count() == 0 && p.lent_count() == 0)
    }
    /// The policy (for its name and, in tests, its state).
    pub fn policy(&self) -> &P {
        &self.policy
    }
    /// Per-expert undecayed use counts.
    pub fn usage(&self) -> &UsageTable {
        &self.usage
    }
    /// Replaces the usage table (e.g. one loaded from disk); it must match the geometry.
    pub fn set_usage(&mut self, usage: UsageTable) -> Result<()> {
        usage.check_geometry(self.n_layers(), self.n_experts)?;
        self.usage = usage;
        Ok(())
    }

    fn pool(&self, layer: usize, expert: u32) -> Result<(&SlotPool, usize)> {
        let idx = self.index(layer, expert)?;
        let pool = self.layer_pool(layer)?;
        Ok((pool, idx))
    }

    fn index(&self, layer: usize, expert: u32) -> Result<usize> {
        if layer >= self.pools.len() {
            return Err(CacheError::LayerOutOfRange {
                layer,
                n_layers: self.pools.len(),
            });
        }
        if expert >= self.n_experts {
            return Err(CacheError::ExpertOutOfRange {
                expert,
                n_experts: self.n_experts,
            });
        }
        // Cannot overflow: the usage table allocated n_layers * n_experts entries.
        Ok(layer * self.n_experts as usize + expert as usize)
    }

    fn layer_pool(&self, layer: usize) -> Result<&SlotPool> {
        let n_layers = self.pools.len();
        self.pools
            .get(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, n_layers })
    }

    fn pool_mut(&mut self, layer: usize) -> Result<&mut SlotPool> {
        let n_layers = self.pools.len();
        self.pools
            .get_mut(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, n_layers })
    }

    fn resident_slot(&self, layer: usize, expert: u32) -> Result<(u32, usize)> {
        let (pool, idx) = self.pool(layer, expert)?;
        let slot = pool
            .slot_of(expert)
            .ok_or(CacheError::NotResident { layer, expert })?;
        Ok((slot, idx))
    }

    fn next_clock(&mut self) -> u64 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }

    /// The slot holding `expert` of `layer`, if resident. Changes nothing.
    pub fn lookup(&self, layer: usize, expert: u32) -> Result<Option<u32>> {
        let (pool, _) = self.pool(layer, expert)?;
        Ok(pool.slot_of(expert))
    }

    /// Records a router selection served outside this cache (e.g. by a VRAM copy): the
    /// usage table counts it; residency, recency and the policy are unchanged.
    pub fn record_use(&mut self, layer: usize, expert: u32) -> Result<()> {
        let idx = self.index(layer, expert)?;
        self.usage.record(idx);
        Ok(())
    }

    /// Records a router selection of a resident expert (a hit). Returns its slot.
    pub fn touch(&mut self, layer: usize, expert: u32) -> Result<u32> {
        let (slot, idx) = self.resident_slot(layer, expert)?;
        let now = self.next_clock();
        self.pool_mut(layer)?.set_last_use(slot, now);
        self.policy.on_touch(idx);
        self.usage.record(idx);
        Ok(slot)
    }

    /// Gives a non-resident expert a slot: a free one if any, else the victim chosen by
    /// the rules above. A demand fails only if every slot is pinned; a prefetch or fill
    /// that may not evict anything is [`Admission::Declined`].
    pub fn admit(&mut self, layer: usize, expert: u32, kind: AdmitKind) -> Result<Admission> {
        let (pool, idx) = self.pool(layer, expert)?;
        if let Some(slot) = pool.slot_of(expert) {
            return Err(CacheError::AlreadyResident {
                layer,
                expert,
                slot,
            });
        }
        let mut evicted = None;
        if pool.free_count() == 0 {
            if kind == AdmitKind::Fill {
                return Ok(Admission::Declined);
            }
            let Some((slot, victim)) = self.victim(layer, kind)? else {
                return Ok(Admission::Declined);
            };
            self.remove(layer, slot, victim)?;
            evicted = Some(victim);
        }
        let now = self.next_clock();
        let pool = self.pool_mut(layer)?;
        let slot = pool.place(expert, now).ok_or(CacheError::AllPinned {
            layer,
            capacity: pool.capacity(),
        })?;
        if kind == AdmitKind::Prefetch {
            pool.protect(slot);
        }
        self.policy.on_admit(idx, kind);
        if kind == AdmitKind::Demand {
            self.usage.record(idx);
        }
        Ok(Admission::Placed { slot, evicted })
    }

    /// The `(slot, expert)` to evict for an admission of `kind` into a full `layer`, or
    /// `None` for a prefetch that may not take any.
    fn victim(&self, layer: usize, kind: AdmitKind) -> Result<Option<(u32, u32)>> {
        let pool = self.layer_pool(layer)?;
        let base = layer * self.n_experts as usize;
        let best = self.policy.pick(base, pool, kind == AdmitKind::Demand);
        match best {
            Some(found) => Ok(Some(found)),
            None if kind == AdmitKind::Demand => Err(CacheError::AllPinned {
                layer,
                capacity: pool.capacity(),
            }),
            None => Ok(None),
        }
    }

    /// Empties `slot` of `layer`, which holds `expert` (checked by the caller).
    fn remove(&mut self, layer: usize, slot: u32, expert: u32) -> Result<()> {
        let idx = self.index(layer, expert)?;
        self.pool_mut(layer)?.remove(slot);
        self.policy.on_evict(idx);
        Ok(())
    }

    /// Pins on a resident expert (0 when it is not resident).
    pub fn pins(&self, layer: usize, expert: u32) -> u32 {
        match (self.lookup(layer, expert), self.pools.get(layer)) {
            (Ok(Some(slot)), Some(pool)) => pool.pins(slot),
            _ => 0,
        }
    }

    /// Removes a resident, unpinned expert (e.g. a cancelled prefetch). Returns its slot.
    pub fn evict(&mut self, layer: usize, expert: u32) -> Result<u32> {
        let (slot, _) = self.resident_slot(layer, expert)?;
        let pins = self.pools.get(layer).map_or(0, |p| p.pins(slot));
        if pins > 0 {
            return Err(CacheError::Pinned {
                layer,
                expert,
                pins,
            });
        }
        self.remove(layer, slot, expert)?;
        Ok(slot)
    }
}
