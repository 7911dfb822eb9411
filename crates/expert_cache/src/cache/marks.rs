//! Pins, protection, the token clock and the mode: the calls that change which
//! experts may be evicted without choosing a victim themselves.

use super::ExpertCache;
use crate::error::{CacheError, Result};
use crate::policy::{Mode, Policy};
use crate::pool::SlotPool;

impl<P: Policy> ExpertCache<P> {
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
}
