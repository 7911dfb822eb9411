//! One test per eviction rule of `ExpertCache` (see `src/cache.rs` and `src/decay.rs`).

use expert_cache::{
    Admission, AdmitKind, AnyPolicy, CacheError, ExpertCache, Mode, PolicyKind, Result,
};

fn cache(capacity: usize, kind: PolicyKind) -> Result<ExpertCache<AnyPolicy>> {
    ExpertCache::new(2, 16, capacity, AnyPolicy::online(kind, 32)?)
}

/// Admits `experts` of layer 0 by demand, in order.
fn fill(c: &mut ExpertCache<AnyPolicy>, experts: &[u32]) -> Result<()> {
    for &e in experts {
        c.admit(0, e, AdmitKind::Demand)?;
    }
    Ok(())
}

fn evicted(a: Admission) -> Option<u32> {
    match a {
        Admission::Placed { evicted, .. } => evicted,
        Admission::Declined => None,
    }
}

#[test]
fn free_slots_are_used_before_anything_is_evicted() -> Result<()> {
    let mut c = cache(3, PolicyKind::Decay)?;
    for (e, want_slot) in [(5, 0), (6, 1), (7, 2)] {
        assert_eq!(
            c.admit(0, e, AdmitKind::Demand)?,
            Admission::Placed {
                slot: want_slot,
                evicted: None
            }
        );
    }
    assert_eq!(c.free_slots(0)?, 0);
    assert_eq!(c.free_slots(1)?, 3, "layers have separate pools");
    Ok(())
}

#[test]
fn decay_evicts_the_lowest_use_count() -> Result<()> {
    let mut c = cache(3, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2, 3])?;
    c.touch(0, 1)?;
    c.touch(0, 3)?;
    // 2 has one use, 1 and 3 two: 2 leaves although 1 is less recently used.
    assert_eq!(evicted(c.admit(0, 4, AdmitKind::Demand)?), Some(2));
    Ok(())
}

#[test]
fn equal_values_go_to_the_least_recently_used() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[3, 9])?;
    c.touch(0, 3)?;
    c.touch(0, 9)?;
    // Both have two uses; 3 was used less recently. The reverse order shows that
    // recency, not the id, decided.
    assert_eq!(evicted(c.admit(0, 5, AdmitKind::Demand)?), Some(3));
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[9, 3])?;
    assert_eq!(evicted(c.admit(0, 5, AdmitKind::Demand)?), Some(9));
    Ok(())
}

#[test]
fn counts_halve_every_64_tokens_so_old_heat_fades() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?;
    for _ in 0..7 {
        c.touch(0, 1)?; // expert 1: 8 uses
    }
    for _ in 0..192 {
        c.tick(); // three halvings: 8 -> 1, and expert 2's single use -> 1/8
    }
    c.touch(0, 2)?;
    c.touch(0, 2)?; // expert 2: 2.125
    c.touch(0, 1)?; // expert 1: 2, and the most recent, so only decay can pick it
    assert_eq!(evicted(c.admit(0, 3, AdmitKind::Demand)?), Some(1));
    Ok(())
}

#[test]
fn an_unused_prefetch_is_worth_zero() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1])?;
    c.admit(0, 2, AdmitKind::Prefetch)?;
    c.start_layer(0)?; // the layer runs and does not pick expert 2
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(2),
        "more recent, but never used"
    );
    Ok(())
}

#[test]
fn a_prefetch_never_evicts_a_protected_prediction() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    c.admit(0, 1, AdmitKind::Prefetch)?;
    c.admit(0, 2, AdmitKind::Prefetch)?;
    assert_eq!(c.admit(0, 3, AdmitKind::Prefetch)?, Admission::Declined);
    // Protection also covers resident experts marked by `protect`.
    let mut c = cache(2, PolicyKind::Lru)?;
    fill(&mut c, &[1, 2])?;
    c.protect(0, 1)?;
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Prefetch)?),
        Some(2),
        "1 is older but protected"
    );
    Ok(())
}

#[test]
fn a_demand_evicts_a_protected_expert_only_if_nothing_else_is_left() -> Result<()> {
    let mut c = cache(3, PolicyKind::Lru)?;
    fill(&mut c, &[1, 2, 3])?;
    c.protect(0, 1)?;
    c.protect(0, 2)?;
    assert_eq!(
        evicted(c.admit(0, 4, AdmitKind::Demand)?),
        Some(3),
        "the unprotected one goes"
    );
    c.protect(0, 4)?;
    assert_eq!(
        evicted(c.admit(0, 5, AdmitKind::Demand)?),
        Some(1),
        "all protected: LRU among them"
    );
    Ok(())
}

#[test]
fn protection_ends_when_the_layer_starts_or_the_token_ends() -> Result<()> {
    for end in ["start_layer", "tick", "other layer"] {
        let mut c = cache(1, PolicyKind::Lru)?;
        c.admit(0, 1, AdmitKind::Prefetch)?;
        match end {
            "start_layer" => c.start_layer(0)?,
            "tick" => c.tick(),
            _ => c.start_layer(1)?,
        }
        let out = c.admit(0, 2, AdmitKind::Prefetch)?;
        let still_protected = out == Admission::Declined;
        assert_eq!(still_protected, end == "other layer", "after {end}");
    }
    Ok(())
}

#[test]
fn pinned_slots_are_never_victims() -> Result<()> {
    let mut c = cache(2, PolicyKind::Lru)?;
    fill(&mut c, &[1, 2])?;
    c.pin(0, 1)?;
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(2),
        "1 is older but pinned"
    );
    c.pin(0, 3)?;
    assert!(matches!(
        c.admit(0, 4, AdmitKind::Demand),
        Err(CacheError::AllPinned {
            layer: 0,
            capacity: 2
        })
    ));
    assert_eq!(c.admit(0, 4, AdmitKind::Prefetch)?, Admission::Declined);
    assert!(matches!(
        c.evict(0, 1),
        Err(CacheError::Pinned { pins: 1, .. })
    ));
    c.unpin(0, 1)?;
    assert!(matches!(c.unpin(0, 1), Err(CacheError::NotPinned { .. })));
    assert_eq!(c.evict(0, 1)?, 0, "unpinned: evictable, slot 0 freed");
    Ok(())
}

#[test]
fn prompt_mode_evicts_least_recently_used_whatever_the_counts() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?;
    for _ in 0..5 {
        c.touch(0, 1)?;
    }
    c.touch(0, 2)?;
    c.set_mode(Mode::Prompt);
    assert_eq!(c.mode(), Mode::Prompt);
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(1),
        "decode would evict 2"
    );
    Ok(())
}

#[test]
fn a_long_prompt_batch_ages_away_the_previous_counts() -> Result<()> {
    let mut c = cache(2, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?;
    for _ in 0..9 {
        c.touch(0, 1)?; // expert 1: 10 uses in the previous reply
    }
    c.set_mode(Mode::Prompt);
    c.prompt_batch(1024); // 16 halvings
    c.set_mode(Mode::Decode);
    c.touch(0, 2)?;
    c.touch(0, 2)?;
    c.touch(0, 1)?; // 1: about 1 use, and most recent; 2: about 2 uses
    assert_eq!(
        evicted(c.admit(0, 3, AdmitKind::Demand)?),
        Some(1),
        "unaged, 2 would go"
    );
    Ok(())
}

#[test]
fn idle_fill_lists_the_most_used_missing_experts_and_never_evicts() -> Result<()> {
    let mut c = cache(3, PolicyKind::Decay)?;
    fill(&mut c, &[4, 5, 6])?;
    c.touch(0, 5)?;
    c.touch(0, 5)?;
    c.touch(0, 4)?;
    c.evict(0, 5)?;
    c.evict(0, 4)?;
    c.admit(1, 7, AdmitKind::Demand)?;
    c.evict(1, 7)?;
    // Layer 0: 2 free slots, 5 (3 uses) before 4 (2 uses); 6 is resident. Layer 1: 7.
    assert_eq!(c.idle_fill(), vec![(0, 5), (0, 4), (1, 7)]);
    for (layer, e) in c.idle_fill() {
        c.admit(layer, e, AdmitKind::Fill)?;
    }
    assert_eq!(c.free_slots(0)?, 0);
    assert_eq!(
        c.admit(0, 9, AdmitKind::Fill)?,
        Admission::Declined,
        "a fill never evicts"
    );
    Ok(())
}

#[test]
fn usage_counts_router_selections_only() -> Result<()> {
    let mut c = cache(3, PolicyKind::Decay)?;
    c.admit(0, 1, AdmitKind::Demand)?;
    c.touch(0, 1)?;
    c.admit(0, 2, AdmitKind::Prefetch)?;
    c.admit(1, 3, AdmitKind::Fill)?;
    assert_eq!(
        (
            c.usage().count(0, 1),
            c.usage().count(0, 2),
            c.usage().count(1, 3)
        ),
        (2, 0, 0)
    );
    Ok(())
}

#[test]
fn bad_indices_and_states_are_errors_not_panics() -> Result<()> {
    let mut c = cache(2, PolicyKind::Lfu)?;
    assert!(matches!(
        c.lookup(2, 0),
        Err(CacheError::LayerOutOfRange {
            layer: 2,
            n_layers: 2
        })
    ));
    assert!(matches!(
        c.admit(0, 16, AdmitKind::Demand),
        Err(CacheError::ExpertOutOfRange { .. })
    ));
    assert!(matches!(c.touch(0, 1), Err(CacheError::NotResident { .. })));
    c.admit(0, 1, AdmitKind::Demand)?;
    assert!(matches!(
        c.admit(0, 1, AdmitKind::Demand),
        Err(CacheError::AlreadyResident { slot: 0, .. })
    ));
    assert!(matches!(
        ExpertCache::new(0, 4, 1, AnyPolicy::online(PolicyKind::Lru, 0)?),
        Err(CacheError::Zero { .. })
    ));
    let clamped = ExpertCache::new(1, 4, 99, AnyPolicy::online(PolicyKind::Lru, 4)?)?;
    assert_eq!(clamped.capacity(), 4, "capacity above n_experts is clamped");
    Ok(())
}

#[test]
fn lfu_keeps_all_time_counts_across_evictions() -> Result<()> {
    let mut c = cache(2, PolicyKind::Lfu)?;
    fill(&mut c, &[1, 2])?;
    c.touch(0, 1)?;
    c.touch(0, 1)?;
    c.evict(0, 1)?;
    c.admit(0, 1, AdmitKind::Demand)?; // 4 uses in all, least recent is 2 (1 use)
    c.touch(0, 2)?;
    assert_eq!(evicted(c.admit(0, 3, AdmitKind::Demand)?), Some(2));
    Ok(())
}
