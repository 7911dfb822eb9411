//! Cost of one cache step, lookup then touch (hit) or demand admit (miss, with the
//! victim scan), at 512 experts per layer. Target: < 1 us (issue 4).
//!
//! Two streams per policy and capacity:
//! - `skewed`: experts drawn with probability ~ 1/(rank+1) (Zipf-like, like real
//!   routing's popularity skew), so both hits and misses occur;
//! - `all-miss`: experts in round robin, so with a full pool every step is a miss
//!   that scans every slot: the worst case.
//!
//! Run: `cargo bench -p expert_cache --bench lookup_admit`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use expert_cache::{AdmitKind, AnyPolicy, ExpertCache, PolicyKind};

const EXPERTS: u32 = 512;
const LAYERS: usize = 4;

/// Deterministic Zipf-like stream from a 64-bit LCG (no dependency needed).
fn skewed(n: usize) -> Vec<u32> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let weights: Vec<f64> = (1..=EXPERTS).map(|r| 1.0 / f64::from(r)).collect();
    let total: f64 = weights.iter().sum();
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let mut x = (state >> 11) as f64 / (1u64 << 53) as f64 * total;
            let mut pick = 0;
            for (e, w) in weights.iter().enumerate() {
                x -= w;
                pick = e as u32;
                if x <= 0.0 {
                    break;
                }
            }
            // Scatter popular experts over the id range.
            (pick * 97) % EXPERTS
        })
        .collect()
}

fn step(cache: &mut ExpertCache<AnyPolicy>, layer: usize, expert: u32) {
    let hit = matches!(cache.lookup(layer, expert), Ok(Some(_)));
    let out = if hit {
        cache.touch(layer, expert).map(|_| ())
    } else {
        cache.admit(layer, expert, AdmitKind::Demand).map(|_| ())
    };
    black_box(out).ok();
}

fn bench(c: &mut Criterion) {
    let streams = [
        ("skewed", skewed(1 << 16)),
        ("all-miss", (0..EXPERTS).collect()),
    ];
    let mut group = c.benchmark_group("lookup+admit, 512 experts/layer");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for kind in [PolicyKind::Decay, PolicyKind::Lru] {
        for capacity in [64usize, 128, 256] {
            for (name, stream) in &streams {
                let Ok(policy) = AnyPolicy::online(kind, LAYERS * EXPERTS as usize) else {
                    return;
                };
                let Ok(mut cache) = ExpertCache::new(LAYERS, EXPERTS, capacity, policy) else {
                    return;
                };
                // Layer i % LAYERS gets stream[(i / LAYERS) % len]: every layer sees the
                // whole stream. Fill the pools first.
                let at = |i: usize| {
                    stream
                        .get((i / LAYERS) % stream.len())
                        .copied()
                        .unwrap_or(0)
                };
                for i in 0..LAYERS * 4 * capacity {
                    step(&mut cache, i % LAYERS, at(i));
                }
                let id = BenchmarkId::new(format!("{}/{name}", kind.name()), capacity);
                let mut i = 0usize;
                group.bench_function(id, |b| {
                    b.iter(|| {
                        i = i.wrapping_add(1);
                        step(&mut cache, i % LAYERS, at(i));
                        if i.is_multiple_of(8 * LAYERS) {
                            cache.tick();
                        }
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
