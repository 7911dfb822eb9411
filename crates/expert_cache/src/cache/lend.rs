//! Lending slots: while a prompt runs, its activations may need memory the cache holds.
//! The cache takes slots out of use (empty ones first, then the coldest residents,
//! evicted in the policy's order) so their memory can be given back to the OS, and
//! takes them back when the prompt is over ([`ExpertCache::reclaim`]).
//!
//! Rules: a pinned slot is never lent; every layer keeps at least `keep` (>= 1) usable
//! slots, so a wave of that many experts always fits; a lent slot is empty and not
//! free, so no admission (demand, prefetch or fill) can place an expert in it, and no
//! victim scan can pick it. A layer's usable capacity is its slots minus its lent ones.

use super::ExpertCache;
use crate::error::Result;
use crate::policy::Policy;

/// A slot taken out of use by [`ExpertCache::lend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lent {
    /// Streamed (cache) layer.
    pub layer: usize,
    /// Slot index in the layer's pool.
    pub slot: u32,
    /// The expert evicted from it (None: the slot was empty).
    pub evicted: Option<u32>,
}

impl<P: Policy> ExpertCache<P> {
    /// Takes up to `n` slots out of use, keeping at least `keep` (raised to 1) usable
    /// slots in every layer: first empty slots (those the layer would hand out last
    /// first, the layers taken in turn), then resident unpinned experts, evicted coldest
    /// first across all layers: unprotected before protected, then lowest policy value,
    /// least recently used, lower expert id, lower layer. Returns the slots lent, in
    /// that order; fewer than `n` when no more can be lent under the rules.
    pub fn lend(&mut self, n: usize, keep: usize) -> Vec<Lent> {
        let keep = keep.max(1);
        let mut usable: Vec<usize> = self
            .pools
            .iter()
            .map(|p| p.capacity() - p.lent_count())
            .collect();
        // Empty slots: (position from the front of the free list, layer, slot).
        let mut empty: Vec<(usize, usize, u32)> = Vec::new();
        for (layer, pool) in self.pools.iter().enumerate() {
            empty.extend(
                pool.free_slots()
                    .iter()
                    .enumerate()
                    .map(|(i, &slot)| (i, layer, slot)),
            );
        }
        empty.sort_unstable();
        // Residents: (protected, value, last use, expert, layer, slot).
        let mut resident: Vec<(bool, u64, u64, u32, usize, u32)> = Vec::new();
        for (layer, pool) in self.pools.iter().enumerate() {
            let base = layer * self.n_experts as usize;
            resident.extend(pool.occupants().filter(|o| o.pins == 0).map(|o| {
                let value = self.policy.value(base + o.expert as usize);
                (o.protected, value, o.last_use, o.expert, layer, o.slot)
            }));
        }
        resident.sort_unstable();
        let order = empty
            .into_iter()
            .map(|(_, layer, slot)| (layer, slot, false))
            .chain(
                resident
                    .into_iter()
                    .map(|(.., layer, slot)| (layer, slot, true)),
            );
        let mut out = Vec::new();
        for (layer, slot, occupied) in order {
            if out.len() >= n {
                break;
            }
            let Some(left) = usable.get_mut(layer) else {
                continue;
            };
            if *left <= keep {
                continue;
            }
            let evicted = if occupied {
                let Some(expert) = self.pools.get(layer).and_then(|p| p.expert_in(slot)) else {
                    continue;
                };
                if self.remove(layer, slot, expert).is_err() {
                    continue;
                }
                Some(expert)
            } else {
                None
            };
            let lent = self.pools.get_mut(layer).is_some_and(|p| p.lend(slot));
            if lent {
                *left -= 1;
                out.push(Lent {
                    layer,
                    slot,
                    evicted,
                });
            }
        }
        out
    }

    /// Every lent slot is usable again (empty, free); returns them as `(layer, slot)`.
    pub fn reclaim(&mut self) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        for (layer, pool) in self.pools.iter_mut().enumerate() {
            out.extend(pool.reclaim().into_iter().map(|slot| (layer, slot)));
        }
        out
    }

    /// Lent `slot` of `layer` is usable again (e.g. its memory could not be given
    /// back). False if it was not lent.
    pub fn reclaim_slot(&mut self, layer: usize, slot: u32) -> Result<bool> {
        Ok(self.pool_mut(layer)?.unlend(slot))
    }

    /// Slots of `layer` lent out now.
    pub fn lent_slots(&self, layer: usize) -> Result<usize> {
        Ok(self.layer_pool(layer)?.lent_count())
    }

    /// Slots of `layer` an admission may use: its capacity minus its lent slots. A
    /// wave of the layer holds at most this many experts.
    pub fn usable_slots(&self, layer: usize) -> Result<usize> {
        let pool = self.layer_pool(layer)?;
        Ok(pool.capacity() - pool.lent_count())
    }

    /// Slots lent out now, all layers together.
    pub fn total_lent(&self) -> usize {
        self.pools.iter().map(|p| p.lent_count()).sum()
    }
}
