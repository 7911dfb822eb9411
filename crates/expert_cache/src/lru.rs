//! Plain LRU: every expert is worth the same, so the cache's tie-break (least recently
//! used, then lower id) alone picks the victim. The baseline of `naive` runs.

use crate::policy::{AdmitKind, Mode, Policy};

/// Least recently used. Stateless: recency lives in the cache's slots.
#[derive(Debug, Clone, Copy, Default)]
pub struct LruPolicy;

impl Policy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn on_admit(&mut self, _idx: usize, _kind: AdmitKind) {}
    fn on_touch(&mut self, _idx: usize) {}
    fn on_evict(&mut self, _idx: usize) {}
    fn on_tokens(&mut self, _tokens: u64) {}
    fn set_mode(&mut self, _mode: Mode) {}
    fn value(&self, _idx: usize) -> u64 {
        0
    }
}
