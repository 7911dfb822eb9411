//! Slots lent to a prompt's working memory (`ExpertCache::lend` / `reclaim`): empty
//! slots first, then the coldest unpinned residents; never a pinned slot; never below
//! `keep` usable slots per layer; nothing is ever placed in a lent slot.

#![allow(clippy::indexing_slicing)]

mod common;

use common::{cache, evicted, fill};
use expert_cache::{Admission, AdmitKind, AnyPolicy, ExpertCache, Lent, PolicyKind, Result};

fn lent_experts(lent: &[Lent]) -> Vec<Option<u32>> {
    lent.iter().map(|l| l.evicted).collect()
}

#[test]
fn empty_slots_are_lent_before_any_resident_and_layers_take_turns() -> Result<()> {
    let mut c = cache(4, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2])?; // layer 0: 2 residents, 2 empty; layer 1: 4 empty
    let lent = c.lend(3, 1);
    assert_eq!(lent_experts(&lent), vec![None; 3], "no resident leaves");
    let layers: Vec<usize> = lent.iter().map(|l| l.layer).collect();
    assert_eq!(layers, vec![0, 1, 0], "layers take turns");
    assert_eq!(
        (lent[0].slot, lent[1].slot),
        (3, 3),
        "the slot handed out last"
    );
    assert_eq!(c.resident(0)?.len(), 2);
    assert_eq!((c.usable_slots(0)?, c.usable_slots(1)?), (2, 3));
    assert_eq!((c.free_slots(0)?, c.free_slots(1)?), (0, 3));
    assert_eq!(c.total_lent(), 3);
    Ok(())
}

#[test]
fn residents_are_lent_coldest_first_by_the_policy_and_never_pinned() -> Result<()> {
    let mut c = cache(4, PolicyKind::Decay)?;
    fill(&mut c, &[1, 2, 3, 4])?;
    for _ in 0..3 {
        c.touch(0, 1)?; // 1 is the hottest, 2 the coldest by value and age
        c.touch(0, 4)?;
    }
    c.touch(0, 3)?;
    c.pin(0, 2)?; // the coldest, but pinned
    let keep = 4; // layer 1 lends nothing (4 usable, keeps 4); layer 0 keeps 1
    let lent: Vec<Lent> = c.lend(10, 1).into_iter().filter(|l| l.layer == 0).collect();
    // 3 has the lowest value; 1 and 4 tie on value, 1 was used less recently.
    assert_eq!(lent_experts(&lent), vec![Some(3), Some(1), Some(4)]);
    assert_eq!(c.resident(0)?, vec![(1, 2)], "only the pinned one is left");
    assert_eq!(c.usable_slots(0)?, 1);
    let mut c2 = cache(4, PolicyKind::Decay)?;
    assert!(c2.lend(10, keep).is_empty(), "never below keep");
    Ok(())
}

#[test]
fn every_layer_keeps_at_least_one_slot_and_pinned_slots_stay() -> Result<()> {
    let mut c = cache(3, PolicyKind::Lru)?;
    fill(&mut c, &[1, 2, 3])?;
    c.pin(0, 1)?;
    c.pin(0, 2)?;
    let lent = c.lend(100, 0); // keep 0 is raised to 1
    assert_eq!(
        lent.len(),
        1 + 2,
        "layer 0: only 3 (two pinned); layer 1: two of three"
    );
    assert_eq!((c.usable_slots(0)?, c.usable_slots(1)?), (2, 1));
    assert_eq!(lent_experts(&lent[..2]), vec![None, None], "empties first");
    assert_eq!(lent.last().map(|l| l.evicted), Some(Some(3)));
    assert!(c.lend(100, 1).is_empty(), "nothing more to give");
    Ok(())
}

#[test]
fn nothing_is_placed_in_a_lent_slot_and_reclaim_gives_them_back() -> Result<()> {
    let mut c = cache(3, PolicyKind::Lru)?;
    let lent = c.lend(4, 1);
    let lent0: Vec<u32> = lent
        .iter()
        .filter(|l| l.layer == 0)
        .map(|l| l.slot)
        .collect();
    assert_eq!(lent0, vec![2, 1]);
    assert_eq!(
        c.admit(0, 5, AdmitKind::Demand)?,
        Admission::Placed {
            slot: 0,
            evicted: None
        }
    );
    // Full as far as admissions go: a demand evicts, a fill is declined, a prefetch of
    // a protected pool is declined; none takes a lent slot.
    assert_eq!(c.admit(0, 6, AdmitKind::Fill)?, Admission::Declined);
    assert_eq!(
        c.admit(0, 6, AdmitKind::Demand)?,
        Admission::Placed {
            slot: 0,
            evicted: Some(5)
        }
    );
    assert_eq!(
        c.admit(0, 7, AdmitKind::Prefetch)?,
        Admission::Placed {
            slot: 0,
            evicted: Some(6)
        }
    );
    assert_eq!(
        evicted(c.admit(0, 8, AdmitKind::Prefetch)?),
        None,
        "declined"
    );
    assert_eq!(c.resident(0)?, vec![(0, 7)]);
    assert!(
        c.idle_fill().iter().all(|&(l, _)| l != 0),
        "no empty slot to fill"
    );
    let back = c.reclaim();
    assert_eq!(back.len(), 4);
    assert_eq!(
        (c.usable_slots(0)?, c.lent_slots(0)?, c.total_lent()),
        (3, 0, 0)
    );
    assert_eq!(c.free_slots(0)?, 2);
    for (e, slot) in [(8, 1), (9, 2)] {
        assert_eq!(
            c.admit(0, e, AdmitKind::Demand)?,
            Admission::Placed {
                slot,
                evicted: None
            },
            "lowest free slot first again"
        );
    }
    assert!(c.reclaim().is_empty());
    Ok(())
}

#[test]
fn reclaim_slot_returns_one_lent_slot() -> Result<()> {
    let mut c: ExpertCache<AnyPolicy> = cache(2, PolicyKind::Lru)?;
    let lent = c.lend(1, 1);
    let first = lent.first().map(|l| (l.layer, l.slot));
    assert_eq!(first, Some((0, 1)));
    assert!(c.reclaim_slot(0, 1)?);
    assert!(!c.reclaim_slot(0, 1)?, "not lent any more");
    assert_eq!(c.usable_slots(0)?, 2);
    assert!(c.reclaim_slot(5, 0).is_err(), "layer checked");
    Ok(())
}
