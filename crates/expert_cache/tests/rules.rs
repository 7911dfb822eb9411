//! One test per slot rule of `ExpertCache` (see `src/cache.rs`): free slots, pins,
//! protection, idle fill, usage counting, errors.

mod common;

use common::{cache, evicted, fill};
use expert_cache::{Admission, AdmitKind, AnyPolicy, CacheError, ExpertCache, PolicyKind, Result};

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
fn a_layer_with_a_slot_for_every_expert_is_filled_whole() -> Result<()> {
    let mut c = cache(16, PolicyKind::Decay)?; // 16 experts, 16 slots
    c.admit(0, 3, AdmitKind::Demand)?;
    c.touch(0, 3)?;
    c.evict(0, 3)?;
    c.admit(1, 9, AdmitKind::Demand)?;
    let plan = c.idle_fill();
    assert_eq!(plan.first(), Some(&(0, 3)), "the used one first");
    assert_eq!(plan.iter().filter(|&&(l, _)| l == 0).count(), 16);
    assert_eq!(
        plan.iter().filter(|&&(l, _)| l == 1).count(),
        15,
        "9 is resident"
    );
    assert!(!c.holds_every_expert());
    for (layer, e) in plan {
        c.admit(layer, e, AdmitKind::Fill)?;
    }
    assert!(c.holds_every_expert(), "every slot of every layer taken");
    c.evict(1, 9)?;
    assert!(!c.holds_every_expert());
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
