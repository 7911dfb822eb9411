//! Read-only views of the pools and the idle-fill plan.

use super::ExpertCache;
use crate::error::Result;
use crate::policy::Policy;

impl<P: Policy> ExpertCache<P> {
    /// Resident `(slot, expert)` pairs of `layer`, in slot order.
    pub fn resident(&self, layer: usize) -> Result<Vec<(u32, u32)>> {
        let pool = self.layer_pool(layer)?;
        Ok(pool.occupants().map(|o| (o.slot, o.expert)).collect())
    }

    /// Free slots in `layer`.
    pub fn free_slots(&self, layer: usize) -> Result<usize> {
        let pool = self.layer_pool(layer)?;
        Ok(pool.free_count())
    }

    /// Idle fill: for every empty slot, the most-used (by the usage table) expert of
    /// that layer that is not resident, as `(layer, expert)`; ties to the lower id.
    /// Experts never used are not listed, except in a layer with a slot for every
    /// expert: that layer is kept whole, every expert read. Lists only, never evicts:
    /// admit each with [`AdmitKind::Fill`], which takes free slots only.
    pub fn idle_fill(&self) -> Vec<(usize, u32)> {
        let mut plan = Vec::new();
        for (layer, pool) in self.pools.iter().enumerate() {
            let whole = pool.capacity() >= self.n_experts as usize;
            let mut wanted: Vec<(u64, u32)> = (0..self.n_experts)
                .filter(|&e| pool.slot_of(e).is_none())
                .map(|e| (self.usage.count(layer, e), e))
                .filter(|&(count, _)| count > 0 || whole)
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
