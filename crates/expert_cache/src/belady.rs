//! Belady's offline optimum, the bound every online policy is measured against: the
//! victim is the expert whose next use is farthest in the future (never = infinitely
//! far). It needs the whole trace, so it only exists in replay.
//!
//! "Next use" counts from the current token inclusive: an expert selected by the
//! current token in a layer that has not run yet is needed now. Experts of the layer
//! being served are pinned by the replay while it runs, so they are never candidates.

use crate::policy::{AdmitKind, Mode, Policy};

/// Offline optimal eviction for one trace.
#[derive(Debug, Clone)]
pub struct BeladyPolicy {
    /// For each flat expert index, the ascending tokens at which it is selected.
    uses: Vec<Vec<u32>>,
    token: u64,
}

impl BeladyPolicy {
    /// Builds the next-use lists from `(token, flat index)` selections in token order.
    pub(crate) fn from_uses(n: usize, selections: impl Iterator<Item = (u32, usize)>) -> Self {
        let mut uses = vec![Vec::new(); n];
        for (token, idx) in selections {
            if let Some(list) = uses.get_mut(idx) {
                list.push(token);
            }
        }
        Self { uses, token: 0 }
    }

    /// The first token at or after the current one that selects `idx`, if any.
    pub fn next_use(&self, idx: usize) -> Option<u64> {
        let list = self.uses.get(idx)?;
        let at = list.partition_point(|&t| u64::from(t) < self.token);
        list.get(at).map(|&t| u64::from(t))
    }
}

impl Policy for BeladyPolicy {
    fn name(&self) -> &'static str {
        "belady"
    }
    fn on_admit(&mut self, _idx: usize, _kind: AdmitKind) {}
    fn on_touch(&mut self, _idx: usize) {}
    fn on_evict(&mut self, _idx: usize) {}
    fn on_tokens(&mut self, tokens: u64) {
        self.token = self.token.saturating_add(tokens);
    }
    fn set_mode(&mut self, _mode: Mode) {}
    fn value(&self, idx: usize) -> u64 {
        // Farthest next use leaves first, so the value falls as the next use recedes.
        self.next_use(idx).map_or(0, |t| u64::MAX - t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn farthest_next_use_has_the_lowest_value() {
        // expert 0 used at tokens 0 and 5, expert 1 at 2, expert 2 never.
        let mut p = BeladyPolicy::from_uses(3, [(0, 0), (2, 1), (5, 0)].into_iter());
        p.on_tokens(1);
        assert_eq!(p.next_use(0), Some(5));
        assert_eq!(p.next_use(1), Some(2));
        assert_eq!(p.next_use(2), None);
        assert!(p.value(2) < p.value(0) && p.value(0) < p.value(1));
        p.on_tokens(5);
        assert_eq!(p.value(0), 0, "no use left");
    }
}
