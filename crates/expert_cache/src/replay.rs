//! Trace replay: runs a recorded routing trace through the cache with one policy and
//! counts what the cache would have read.
//!
//! Per token and layer, in the order the engine does it:
//! 1. the layer starts (its predictions stop being protected);
//! 2. hits are the selected experts already resident; they are pinned, since the layer
//!    computes with them;
//! 3. in reverse router rank (so rank 0 ends up the most recent), hits are touched and
//!    misses are admitted as demand reads and pinned; with the hits pinned, a demand
//!    never evicts an expert the same token and layer needs;
//! 4. everything is unpinned; with a predictor, the next layer's predictions are
//!    prefetched (resident ones just protected).
//!
//! These are the definitions of the LRU/Belady table in the tiny-code-moe README
//! (hits counted before any admission, all selected experts made resident, Belady
//! evicting the farthest next use among experts the current token does not need), and
//! the replay reproduces its numbers (test in `tests/cache/`).
//!
//! The simulated predictor includes each of the next layer's true experts with
//! probability `recall` and fills the rest of its top-k with distinct wrong experts,
//! drawn uniformly; its random stream is seeded, so a replay is deterministic.

use crate::belady::BeladyPolicy;
use crate::cache::{Admission, ExpertCache};
use crate::error::{CacheError, Result};
use crate::policy::{AdmitKind, AnyPolicy, PolicyKind};
use crate::rng::SplitMix64;
use crate::trace::Trace;

/// A simulated router-lookahead predictor (distance 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Predictor {
    /// Probability that each true expert of the next layer is predicted.
    pub recall: f64,
    /// Seed of the predictor's random stream.
    pub seed: u64,
}

/// One replay run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayConfig {
    /// Slots per layer.
    pub capacity: usize,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Prefetches from a simulated predictor, or none.
    pub predictor: Option<Predictor>,
}

/// What a replay counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayStats {
    /// Tokens replayed.
    pub tokens: u64,
    /// Router selections (tokens x layers x top-k).
    pub selections: u64,
    /// Selections that found their expert resident.
    pub hits: u64,
    /// Prefetch reads issued (admissions by the predictor that got a slot).
    pub prefetch_reads: u64,
    /// Hits per layer.
    pub layer_hits: Vec<u64>,
}

impl ReplayStats {
    /// Selections that had to be read on demand.
    pub fn demand_reads(&self) -> u64 {
        self.selections - self.hits
    }
}

/// Replays `trace` under `config`.
pub fn replay(trace: &Trace, config: &ReplayConfig) -> Result<ReplayStats> {
    let (n_layers, top_k, n_experts) = (trace.n_layers(), trace.top_k(), trace.n_experts());
    if config.capacity < top_k {
        return Err(CacheError::CapacityBelowTopK {
            capacity: config.capacity,
            top_k,
        });
    }
    if let Some(p) = config.predictor {
        if !(0.0..=1.0).contains(&p.recall) {
            return Err(CacheError::InvalidRecall { recall: p.recall });
        }
    }
    let n = n_layers * n_experts as usize; // cannot overflow: the trace holds n_layers * top_k values
    let policy = match config.policy {
        PolicyKind::Belady => AnyPolicy::Belady(BeladyPolicy::from_uses(n, trace.uses())),
        kind => AnyPolicy::online(kind, n)?,
    };
    let mut cache = ExpertCache::new(n_layers, n_experts, config.capacity, policy)?;
    let mut rng = SplitMix64::new(config.predictor.map_or(0, |p| p.seed));
    let mut stats = ReplayStats {
        tokens: trace.n_tokens() as u64,
        selections: (trace.n_tokens() * n_layers * top_k) as u64,
        hits: 0,
        prefetch_reads: 0,
        layer_hits: vec![0; n_layers],
    };
    let mut hit = vec![false; top_k];
    let mut guess = Vec::with_capacity(top_k);
    for t in 0..trace.n_tokens() {
        for l in 0..n_layers {
            cache.start_layer(l)?;
            let selected = trace.selection(t, l);
            for (h, &e) in hit.iter_mut().zip(selected) {
                *h = cache.lookup(l, u32::from(e))?.is_some();
                if *h {
                    cache.pin(l, u32::from(e))?;
                }
            }
            let layer_hits = hit.iter().filter(|&&h| h).count() as u64;
            stats.hits += layer_hits;
            if let Some(count) = stats.layer_hits.get_mut(l) {
                *count += layer_hits;
            }
            for (&h, &e) in hit.iter().zip(selected).rev() {
                if h {
                    cache.touch(l, u32::from(e))?;
                } else {
                    cache.admit(l, u32::from(e), AdmitKind::Demand)?;
                    cache.pin(l, u32::from(e))?;
                }
            }
            for &e in selected {
                cache.unpin(l, u32::from(e))?;
            }
            if let (Some(p), true) = (config.predictor, l + 1 < n_layers) {
                predict(
                    &mut rng,
                    p.recall,
                    trace.selection(t, l + 1),
                    n_experts,
                    &mut guess,
                );
                stats.prefetch_reads += prefetch(&mut cache, l + 1, &guess)?;
            }
        }
        cache.tick();
    }
    Ok(stats)
}

/// Fills `out` with a simulated top-k prediction of `truth`, in random order.
fn predict(rng: &mut SplitMix64, recall: f64, truth: &[u16], n_experts: u32, out: &mut Vec<u32>) {
    out.clear();
    out.extend(
        truth
            .iter()
            .map(|&e| u32::from(e))
            .filter(|_| rng.next_f64() < recall),
    );
    let mut wrong: Vec<u32> = (0..n_experts)
        .filter(|&e| !truth.iter().any(|&x| u32::from(x) == e))
        .collect();
    while out.len() < truth.len() && !wrong.is_empty() {
        let pick = wrong.swap_remove(rng.below(wrong.len()));
        out.push(pick);
    }
    rng.shuffle(out);
}

/// Prefetches `guess` into `layer`: resident guesses are protected, others admitted.
/// Returns the reads issued.
fn prefetch(cache: &mut ExpertCache<AnyPolicy>, layer: usize, guess: &[u32]) -> Result<u64> {
    let mut reads = 0;
    for &e in guess {
        if cache.lookup(layer, e)?.is_some() {
            cache.protect(layer, e)?;
        } else if let Admission::Placed { .. } = cache.admit(layer, e, AdmitKind::Prefetch)? {
            reads += 1;
        }
    }
    Ok(reads)
}
