//! The eviction-policy interface and the run-time choice between policies.
//!
//! The cache ([`crate::ExpertCache`]) owns the mechanics every policy shares: slots,
//! pins, protection of predicted experts, recency. A policy only answers one question,
//! "what is this resident expert worth?", from the events the cache reports to it.
//! The victim is the unpinned expert with the lowest value; ties go to the least
//! recently used, then to the lower expert id. So plain LRU is the policy whose value
//! is always 0, and comparing policies by replay compares exactly their values.
//!
//! Experts are passed as a flat index `layer * n_experts + expert`, already validated
//! by the cache, so policies index their tables without further checks.

use std::str::FromStr;

use crate::belady::BeladyPolicy;
use crate::decay::DecayPolicy;
use crate::error::CacheError;
use crate::lfu::LfuPolicy;
use crate::lru::LruPolicy;
use crate::pool::SlotPool;

/// Why an expert is being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdmitKind {
    /// The router selected it and it is not resident: a demand read. Counts as a use.
    Demand,
    /// Predicted for a layer that has not run yet: a prefetch. Not a use; the expert is
    /// protected for the rest of this token (see [`crate::ExpertCache::protect`]).
    Prefetch,
    /// Idle fill of an empty slot with a historically hot expert. Not a use, not
    /// protected; it only ever takes a free slot.
    Fill,
}

/// Whether the model is reading a prompt or decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Token by token generation: the policy's own values decide.
    #[default]
    Decode,
    /// Prompt batches: eviction is LRU (a prompt touches most experts once, so
    /// frequencies say little), and each batch ages values by its token count.
    Prompt,
}

/// The per-policy part of eviction: the value of a resident expert.
pub trait Policy: std::fmt::Debug {
    /// Short name used in reports ("lru", "decay", ...).
    fn name(&self) -> &'static str;
    /// `idx` was admitted for `kind`.
    fn on_admit(&mut self, idx: usize, kind: AdmitKind);
    /// `idx` was used by the router while resident.
    fn on_touch(&mut self, idx: usize);
    /// `idx` left the cache.
    fn on_evict(&mut self, idx: usize);
    /// The token clock moved forward by `tokens` (1 per decode step, the batch size for
    /// a prompt batch).
    fn on_tokens(&mut self, tokens: u64);
    /// The mode changed.
    fn set_mode(&mut self, mode: Mode);
    /// The value of resident `idx`: lowest leaves first.
    fn value(&self, idx: usize) -> u64;

    /// The victim in `pool` (experts of the layer whose flat indices start at `base`)
    /// as (slot, expert): unpinned, unprotected before protected (protected ones only
    /// for a demand), then lowest value, least recently used, lower id. One call per
    /// eviction, so [`AnyPolicy`] dispatches once and the scan runs monomorphized for
    /// the concrete policy.
    fn pick(&self, base: usize, pool: &SlotPool, demand: bool) -> Option<(u32, u32)>
    where
        Self: Sized,
    {
        pool.scan(demand, |expert| self.value(base + expert as usize))
    }
}

/// The policies that can be chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// Least frequently used (all-time use counts).
    Lfu,
    /// Use counts halved every 64 tokens (the default).
    Decay,
    /// Offline optimal: evicts the expert whose next use is farthest. Replay only.
    Belady,
}

impl PolicyKind {
    /// All kinds, in report order.
    pub const ALL: [PolicyKind; 4] = [Self::Lru, Self::Lfu, Self::Decay, Self::Belady];

    /// The policy's name as accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Lfu => "lfu",
            Self::Decay => "decay",
            Self::Belady => "belady",
        }
    }
}

impl FromStr for PolicyKind {
    type Err = CacheError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| CacheError::UnknownPolicy { name: s.to_owned() })
    }
}

/// Any of the policies, dispatched by `match` (a predictable branch, cheaper than a
/// vtable call in the victim scan, and one concrete type for the Python binding).
#[derive(Debug, Clone)]
pub enum AnyPolicy {
    /// See [`LruPolicy`].
    Lru(LruPolicy),
    /// See [`LfuPolicy`].
    Lfu(LfuPolicy),
    /// See [`DecayPolicy`].
    Decay(DecayPolicy),
    /// See [`BeladyPolicy`].
    Belady(BeladyPolicy),
}

impl AnyPolicy {
    /// A fresh online policy for `n_slots_total = n_layers * n_experts` experts.
    /// Belady is refused: it needs the future ([`BeladyPolicy::from_trace`]).
    pub fn online(kind: PolicyKind, n_experts_total: usize) -> Result<Self, CacheError> {
        Ok(match kind {
            PolicyKind::Lru => Self::Lru(LruPolicy),
            PolicyKind::Lfu => Self::Lfu(LfuPolicy::new(n_experts_total)),
            PolicyKind::Decay => Self::Decay(DecayPolicy::new(n_experts_total)),
            PolicyKind::Belady => return Err(CacheError::BeladyNeedsTrace),
        })
    }
}

macro_rules! dispatch {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            AnyPolicy::Lru($p) => $e,
            AnyPolicy::Lfu($p) => $e,
            AnyPolicy::Decay($p) => $e,
            AnyPolicy::Belady($p) => $e,
        }
    };
}

impl Policy for AnyPolicy {
    fn name(&self) -> &'static str {
        dispatch!(self, p => p.name())
    }
    fn on_admit(&mut self, idx: usize, kind: AdmitKind) {
        dispatch!(self, p => p.on_admit(idx, kind))
    }
    fn on_touch(&mut self, idx: usize) {
        dispatch!(self, p => p.on_touch(idx))
    }
    fn on_evict(&mut self, idx: usize) {
        dispatch!(self, p => p.on_evict(idx))
    }
    fn on_tokens(&mut self, tokens: u64) {
        dispatch!(self, p => p.on_tokens(tokens))
    }
    fn set_mode(&mut self, mode: Mode) {
        dispatch!(self, p => p.set_mode(mode))
    }
    fn value(&self, idx: usize) -> u64 {
        dispatch!(self, p => p.value(idx))
    }
    fn pick(&self, base: usize, pool: &SlotPool, demand: bool) -> Option<(u32, u32)> {
        dispatch!(self, p => p.pick(base, pool, demand))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>().ok(), Some(kind));
        }
        assert!(matches!(
            "fifo".parse::<PolicyKind>(),
            Err(CacheError::UnknownPolicy { .. })
        ));
    }

    #[test]
    fn belady_is_not_an_online_policy() {
        assert!(matches!(
            AnyPolicy::online(PolicyKind::Belady, 4),
            Err(CacheError::BeladyNeedsTrace)
        ));
        assert!(AnyPolicy::online(PolicyKind::Decay, 4).is_ok());
    }
}
