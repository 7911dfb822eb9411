//! The RAM expert cache's decisions: one slot pool per streamed layer plus a policy.
//!
//! Rules that hold for every policy (the policy only supplies values, see
//! [`crate::policy`]):
//! - A pinned slot (being read into, or copied to the GPU) is never a victim.
//! - An expert predicted in this token for a layer that has not started yet is
//!   protected: a prefetch never evicts it; a demand read evicts it only when every
//!   unpinned resident expert is protected.
//! - Among the remaining candidates the lowest value leaves first, ties to the least
//!   recently used, then to the lower expert id. So decisions depend on the calls
//!   alone: the same sequence of calls gives the same decisions.
//!
//! Every router selection is also recorded in the usage table (undecayed counts).

use crate::error::{CacheError, Result};
use crate::policy::{AdmitKind, Mode, Policy};
use crate::pool::SlotPool;
use crate::usage::UsageTable;

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
        let n_layers = self.pools.len();
        let pool = self
            .pools
            .get(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, n_layers })?;
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
        let n_layers = self.pools.len();
        let pool = self
            .pools
            .get(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, n_layers })?;
        let base = layer * self.n_experts as usize;
        let mut best: Option<((bool, u64, u64, u32), u32)> = None;
        for o in pool.occupants() {
            if o.pins > 0 || (o.protected && kind != AdmitKind::Demand) {
                continue;
            }
            let key = (
                o.protected,
                self.policy.value(base + o.expert as usize),
                o.last_use,
                o.expert,
            );
            match best {
                Some((b, _)) if b <= key => {}
                _ => best = Some((key, o.slot)),
            }
        }
        match best {
            Some(((_, _, _, expert), slot)) => Ok(Some((slot, expert))),
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

    /// Pins a resident expert's slot (a read into it or a GPU copy from it is in
    /// flight). Pins nest; each needs an [`ExpertCache::unpin`].
    pub fn pin(&mut self, layer: usize, expert: u32) -> Result<u32> {
        let (slot, _) = self.resident_slot(layer, expert)?;
        self.pool_mut(layer)?.add_pin(slot);
        Ok(slot)
    }

    /// Drops one pin.
    pub fn unpin(&mut self, layer: usize, expert: u32) -> Result<u32> {
        let (slot, _) = self.resident_slot(layer, expert)?;
        if !self.pool_mut(layer)?.drop_pin(slot) {
            return Err(CacheError::NotPinned { layer, expert });
        }
        Ok(slot)
    }

    /// Marks a resident expert as predicted for `layer` in this token (a prefetch
    /// admission does this itself). Lasts until the layer starts or the token ends.
    pub fn protect(&mut self, layer: usize, expert: u32) -> Result<u32> {
        let (slot, _) = self.resident_slot(layer, expert)?;
        self.pool_mut(layer)?.protect(slot);
        Ok(slot)
    }

    /// `layer` starts running in this token: its predictions are no longer protected.
    pub fn start_layer(&mut self, layer: usize) -> Result<()> {
        self.pool_mut(layer)?.end_protection();
        Ok(())
    }

    /// A decode token is done: ends all protections, advances the token clock by one.
    pub fn tick(&mut self) {
        self.advance(1);
    }

    /// A prompt batch of `tokens` tokens is done: like `tokens` ticks at once, so it
    /// ages the decay values by its length.
    pub fn prompt_batch(&mut self, tokens: u64) {
        self.advance(tokens);
    }

    fn advance(&mut self, tokens: u64) {
        self.pools.iter_mut().for_each(SlotPool::end_protection);
        self.policy.on_tokens(tokens);
    }

    /// Switches between prompt (LRU) and decode (the policy's values) eviction.
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
        self.policy.set_mode(mode);
    }

    /// Current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Resident `(slot, expert)` pairs of `layer`, in slot order.
    pub fn resident(&self, layer: usize) -> Result<Vec<(u32, u32)>> {
        let n_layers = self.pools.len();
        let pool = self
            .pools
            .get(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, n_layers })?;
        Ok(pool.occupants().map(|o| (o.slot, o.expert)).collect())
    }

    /// Free slots in `layer`.
    pub fn free_slots(&self, layer: usize) -> Result<usize> {
        let n_layers = self.pools.len();
        let pool = self
            .pools
            .get(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, n_layers })?;
        Ok(pool.free_count())
    }

    /// Idle fill: for every empty slot, the most-used (by the usage table) expert of
    /// that layer that is not resident, as `(layer, expert)`; ties to the lower id,
    /// experts never used are not listed. Lists only, never evicts: admit each with
    /// [`AdmitKind::Fill`], which takes free slots only.
    pub fn idle_fill(&self) -> Vec<(usize, u32)> {
        let mut plan = Vec::new();
        for (layer, pool) in self.pools.iter().enumerate() {
            let mut wanted: Vec<(u64, u32)> = (0..self.n_experts)
                .filter(|&e| pool.slot_of(e).is_none())
                .map(|e| (self.usage.count(layer, e), e))
                .filter(|&(count, _)| count > 0)
                .collect();
            wanted.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            plan.extend(
                wanted
                    .into_iter()
                    .take(pool.free_count())
                    .map(|(_, e)| (layer, e)),
            );
        }
        plan
    }
}
