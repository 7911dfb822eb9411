//! Trace replay on small hand-made traces whose answers can be worked out by hand.

use expert_cache::{replay, CacheError, PolicyKind, Predictor, ReplayConfig, Result, Trace};

fn config(capacity: usize, policy: PolicyKind) -> ReplayConfig {
    ReplayConfig {
        capacity,
        policy,
        predictor: None,
    }
}

/// One layer, top-1, capacity 2: the classic Belady example.
/// Sequence 1 2 3 1 2 4 1 2: LRU always evicts the expert needed next.
#[test]
fn belady_beats_lru_on_the_textbook_sequence() -> Result<()> {
    let trace = Trace::new(vec![1, 2, 3, 1, 2, 4, 1, 2], 8, 1, 1, 5)?;
    let lru = replay(&trace, &config(2, PolicyKind::Lru))?;
    let opt = replay(&trace, &config(2, PolicyKind::Belady))?;
    // LRU: 1 2 3(ev 1) 1(ev 2) 2(ev 3) 4(ev 1) 1(ev 2) 2(ev 4): no hits.
    assert_eq!(lru.hits, 0);
    // Belady: 3 evicts 2 (next use t4, farther than 1's t3); 1 hits; 2 evicts 3
    // (never used again); 4 evicts 2 (t7, farther than 1's t6); 1 hits; 2 misses.
    assert_eq!(opt.hits, 2);
    assert_eq!(opt.demand_reads(), 6);
    Ok(())
}

#[test]
fn a_token_never_evicts_its_own_experts() -> Result<()> {
    // top-2 with capacity 2: token 1 selects {1, 3}; 1 is a hit and must survive the
    // admission of 3, even though it is the least recently used.
    let trace = Trace::new(vec![1, 2, 1, 3, 1, 2], 3, 1, 2, 4)?;
    let lru = replay(&trace, &config(2, PolicyKind::Lru))?;
    assert_eq!(lru.hits, 2, "token 1 hits 1; token 2 hits 1 only");
    assert_eq!(lru.layer_hits, vec![2]);
    Ok(())
}

#[test]
fn replay_is_deterministic_and_the_predictor_is_seeded() -> Result<()> {
    // 50 tokens x 2 layers x top-4; each row is base, base+4, base+8, base+12 (mod 16),
    // so its ids are distinct, with bases wandering enough to make eviction matter.
    let rows: Vec<u16> = (0..100u16)
        .flat_map(|r| (0..4).map(move |k| ((r * 7 + r / 3) % 16 + k * 4) % 16))
        .collect();
    let trace = Trace::new(rows, 50, 2, 4, 16)?;
    for policy in PolicyKind::ALL {
        for seed in [1, 2] {
            let cfg = ReplayConfig {
                capacity: 6,
                policy,
                predictor: Some(Predictor { recall: 0.6, seed }),
            };
            assert_eq!(replay(&trace, &cfg)?, replay(&trace, &cfg)?, "{policy:?}");
        }
    }
    let with = |recall, seed| ReplayConfig {
        capacity: 6,
        policy: PolicyKind::Decay,
        predictor: Some(Predictor { recall, seed }),
    };
    let (a, b) = (
        replay(&trace, &with(0.6, 1))?,
        replay(&trace, &with(0.6, 2))?,
    );
    assert_ne!(a.prefetch_reads, 0);
    assert_ne!(
        (a.hits, a.prefetch_reads),
        (b.hits, b.prefetch_reads),
        "seed changes the guesses"
    );
    let perfect = replay(&trace, &with(1.0, 1))?;
    let blind = replay(&trace, &with(0.0, 1))?;
    assert!(
        perfect.hits > blind.hits,
        "{} vs {}",
        perfect.hits,
        blind.hits
    );
    Ok(())
}

#[test]
fn bad_replay_settings_are_errors() -> Result<()> {
    let trace = Trace::new(vec![0, 1, 2, 3], 1, 2, 2, 4)?;
    assert!(matches!(
        replay(&trace, &config(1, PolicyKind::Lru)),
        Err(CacheError::CapacityBelowTopK { .. })
    ));
    let bad = ReplayConfig {
        capacity: 2,
        policy: PolicyKind::Lru,
        predictor: Some(Predictor {
            recall: 1.5,
            seed: 0,
        }),
    };
    assert!(matches!(
        replay(&trace, &bad),
        Err(CacheError::InvalidRecall { .. })
    ));
    Ok(())
}
