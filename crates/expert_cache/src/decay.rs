//! The decode policy: frequency with decay.
//!
//! value = use count, halved every [`HALF_LIFE_TOKENS`] tokens. A use is a router
//! selection (a hit, or a demand read). A prefetched or idle-filled expert that has not
//! been used since it arrived is worth 0, whatever its history: a wrong prediction must
//! be the first to leave. Counts are kept per expert across evictions, so an expert
//! that comes back after a short absence is recognised as hot.
//!
//! Halving is lazy and exact: each count remembers the 64-token epoch it was last
//! brought up to date in, and is shifted right by the epochs elapsed when read. So a
//! token tick is O(1) instead of touching every expert. Counts are fixed point (one use
//! = 2^16) so that a single use survives 16 halvings (1,024 tokens) before reading 0.
//!
//! In prompt mode every value reads 0, which leaves the cache's tie-break, least
//! recently used, to decide; uses still count, and a prompt batch advances the token
//! clock by its length, so a long prompt ages away the previous reply's counts.

use crate::policy::{AdmitKind, Mode, Policy};
use crate::pool::SlotPool;

/// Tokens after which a use count is worth half as much.
pub const HALF_LIFE_TOKENS: u64 = 64;

/// Fixed-point weight of one use.
const ONE_USE: u64 = 1 << 16;

/// One expert's heat, kept together so a value costs one memory access in the victim
/// scan.
#[derive(Debug, Clone, Copy, Default)]
struct Heat {
    /// Fixed-point use count as of `epoch`.
    count: u64,
    /// Epoch (token / 64) at which `count` was last brought up to date.
    epoch: u64,
    /// Admitted by prefetch or fill and not used since: worth 0.
    unused: bool,
}

/// Frequency with decay; see the module documentation.
#[derive(Debug, Clone)]
pub struct DecayPolicy {
    heat: Vec<Heat>,
    tokens: u64,
    mode: Mode,
}

impl DecayPolicy {
    /// State for `n` experts (all layers): no history.
    pub fn new(n: usize) -> Self {
        Self {
            heat: vec![Heat::default(); n],
            tokens: 0,
            mode: Mode::Decode,
        }
    }

    fn epoch(&self) -> u64 {
        self.tokens / HALF_LIFE_TOKENS
    }

    /// The decayed fixed-point count of `idx` now, ignoring the unused-prefetch rule.
    pub fn decayed(&self, idx: usize) -> u64 {
        self.heat.get(idx).map_or(0, |h| self.decay(h))
    }

    fn decay(&self, h: &Heat) -> u64 {
        decay_at(h, self.epoch())
    }

    fn record_use(&mut self, idx: usize) {
        let (count, epoch) = (self.decayed(idx).saturating_add(ONE_USE), self.epoch());
        if let Some(h) = self.heat.get_mut(idx) {
            *h = Heat {
                count,
                epoch,
                unused: false,
            };
        }
    }

    fn set_unused(&mut self, idx: usize, unused: bool) {
        if let Some(h) = self.heat.get_mut(idx) {
            h.unused = unused;
        }
    }
}

/// `h`'s count at `epoch`: halved once per elapsed epoch (0 after 64 or more).
fn decay_at(h: &Heat, epoch: u64) -> u64 {
    let halvings = u32::try_from(epoch.saturating_sub(h.epoch)).unwrap_or(u32::MAX);
    h.count.checked_shr(halvings).unwrap_or(0)
}

impl Policy for DecayPolicy {
    fn name(&self) -> &'static str {
        "decay"
    }
    fn on_admit(&mut self, idx: usize, kind: AdmitKind) {
        match kind {
            AdmitKind::Demand => self.record_use(idx),
            AdmitKind::Prefetch | AdmitKind::Fill => self.set_unused(idx, true),
        }
    }
    fn on_touch(&mut self, idx: usize) {
        self.record_use(idx);
    }
    fn on_evict(&mut self, idx: usize) {
        self.set_unused(idx, false);
    }
    fn on_tokens(&mut self, tokens: u64) {
        self.tokens = self.tokens.saturating_add(tokens);
    }
    fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }
    fn value(&self, idx: usize) -> u64 {
        match self.heat.get(idx) {
            Some(h) if self.mode == Mode::Decode && !h.unused => self.decay(h),
            _ => 0,
        }
    }
    /// Same order as the default, with the mode and epoch read once per scan instead
    /// of once per slot. Measured on the CPU box (loaded, 2026-11-29), 256 slots,
    /// every step a miss: 940 -> 740 ns per lookup+admit.
    fn pick(&self, base: usize, pool: &SlotPool, demand: bool) -> Option<(u32, u32)> {
        if self.mode == Mode::Prompt {
            return pool.scan(demand, |_| 0);
        }
        let (epoch, heat) = (self.epoch(), self.heat.get(base..).unwrap_or(&[]));
        pool.scan(demand, |e| match heat.get(e as usize) {
            Some(h) if !h.unused => decay_at(h, epoch),
            _ => 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_halve_every_64_tokens() {
        let mut p = DecayPolicy::new(1);
        for _ in 0..4 {
            p.on_touch(0);
        }
        assert_eq!(p.value(0), 4 * ONE_USE);
        p.on_tokens(63);
        assert_eq!(p.value(0), 4 * ONE_USE, "no halving before 64 tokens");
        p.on_tokens(1);
        assert_eq!(p.value(0), 2 * ONE_USE);
        p.on_tokens(128);
        assert_eq!(p.value(0), ONE_USE / 2);
        p.on_touch(0);
        assert_eq!(
            p.value(0),
            ONE_USE / 2 + ONE_USE,
            "a use adds to the decayed count"
        );
    }

    #[test]
    fn a_count_decays_to_zero_without_overflowing_the_shift() {
        let mut p = DecayPolicy::new(1);
        p.on_touch(0);
        p.on_tokens(u64::MAX);
        assert_eq!(p.value(0), 0);
    }

    #[test]
    fn unused_prefetch_is_worth_zero_until_used() {
        let mut p = DecayPolicy::new(1);
        p.on_touch(0);
        p.on_evict(0);
        p.on_admit(0, AdmitKind::Prefetch);
        assert_eq!(
            p.value(0),
            0,
            "history does not count for an unused prefetch"
        );
        p.on_touch(0);
        assert_eq!(p.value(0), 2 * ONE_USE, "once used, history counts again");
    }

    #[test]
    fn prompt_mode_reads_zero_but_keeps_counting() {
        let mut p = DecayPolicy::new(1);
        p.set_mode(Mode::Prompt);
        p.on_touch(0);
        assert_eq!(p.value(0), 0);
        p.set_mode(Mode::Decode);
        assert_eq!(p.value(0), ONE_USE);
    }
}
