//! LFU for comparison: value = how often the expert was used since start, kept across
//! evictions ("perfect" LFU). Without decay it cannot follow a change of topic, which
//! is what the decay policy adds.

use crate::policy::{AdmitKind, Mode, Policy};

/// Least frequently used, all-time counts.
#[derive(Debug, Clone)]
pub struct LfuPolicy {
    uses: Vec<u64>,
}

impl LfuPolicy {
    /// Counts for `n` experts (all layers), all zero.
    pub fn new(n: usize) -> Self {
        Self { uses: vec![0; n] }
    }

    fn record(&mut self, idx: usize) {
        if let Some(u) = self.uses.get_mut(idx) {
            *u = u.saturating_add(1);
        }
    }
}

impl Policy for LfuPolicy {
    fn name(&self) -> &'static str {
        "lfu"
    }
    fn on_admit(&mut self, idx: usize, kind: AdmitKind) {
        if kind == AdmitKind::Demand {
            self.record(idx);
        }
    }
    fn on_touch(&mut self, idx: usize) {
        self.record(idx);
    }
    fn on_evict(&mut self, _idx: usize) {}
    fn on_tokens(&mut self, _tokens: u64) {}
    fn set_mode(&mut self, _mode: Mode) {}
    fn value(&self, idx: usize) -> u64 {
        self.uses.get(idx).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_demand_and_touch_but_not_prefetch() {
        let mut p = LfuPolicy::new(3);
        p.on_admit(0, AdmitKind::Demand);
        p.on_touch(0);
        p.on_admit(1, AdmitKind::Prefetch);
        p.on_admit(2, AdmitKind::Fill);
        assert_eq!([p.value(0), p.value(1), p.value(2)], [2, 0, 0]);
        p.on_evict(0);
        assert_eq!(p.value(0), 2, "counts survive eviction");
    }
}
