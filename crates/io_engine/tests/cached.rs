//! The engine over the real expert cache: hits, demand reads, prefetches, eviction.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use std::time::Duration;

use common::write_model;
use expert_cache::{AnyPolicy, Arena, ArenaPlan, ExpertCache, PolicyKind};
use io_engine::{CacheSlots, CachedEngine, EngineConfig, Proj};

const T: Duration = Duration::from_secs(20);

fn open(dir: &std::path::Path, slots_per_layer: usize) -> (ftw_format::FtwReader, CachedEngine) {
    let path = dir.join("m.ftw");
    let r = write_model(&path, 2, 8, 128);
    let slab = r.experts()[0].len;
    let plan = ArenaPlan {
        n_layers: 2,
        slots_per_layer,
        slot_bytes: slab,
    };
    let arena = Arena::new(plan).unwrap();
    let policy = AnyPolicy::online(PolicyKind::Decay, 16).unwrap();
    let cache = ExpertCache::new(2, 8, slots_per_layer, policy).unwrap();
    let slots = CacheSlots::new(cache, arena, &[0, 1]);
    let eng = CachedEngine::open(&path, r.experts(), slots, EngineConfig::default()).unwrap();
    (r, eng)
}

/// begin_layer + place, as the runtime does for a wave that fits.
fn start(
    eng: &CachedEngine,
    layer: u32,
    sel: &[u32],
) -> (Vec<io_engine::Placement>, io_engine::LayerStart) {
    let st = eng.begin_layer(layer, sel).unwrap();
    (eng.place(layer, sel).unwrap(), st)
}

fn slab_bytes(r: &ftw_format::FtwReader, layer: u32, e: u32) -> Vec<u8> {
    let mut b = vec![0u8; r.expert(layer, e).unwrap().len as usize];
    r.read_expert_into(layer, e, &mut b).unwrap();
    b
}

fn slot_bytes(s: io_engine::Slot, len: usize) -> Vec<u8> {
    // SAFETY: the slot lies in the engine's arena, alive for the test.
    unsafe { std::slice::from_raw_parts(s.addr as *const u8, len) }.to_vec()
}

#[test]
fn selected_experts_are_placed_read_and_hit_next_time() {
    let dir = tempfile::tempdir().unwrap();
    let (r, eng) = open(dir.path(), 3);
    let len = r.experts()[0].len as usize;
    let (placed, _) = start(&eng, 1, &[5, 2]);
    assert!(placed.iter().all(|p| !p.hit));
    for p in &placed {
        let s = eng.wait(1, p.expert, Proj::Down, T).unwrap();
        assert_eq!(s, p.slot);
        assert_eq!(slot_bytes(s, len), slab_bytes(&r, 1, p.expert));
    }
    eng.unpin(1, &[5, 2]).unwrap();
    eng.tick();
    let (again, _) = start(&eng, 1, &[2, 5]);
    assert!(again.iter().all(|p| p.hit), "{again:?}");
    let (_, counts) = eng.stats();
    assert_eq!((counts.demand, counts.hits), (2, 2));
}

#[test]
fn predictions_fill_free_slots_and_become_hits_or_are_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (r, eng) = open(dir.path(), 4);
    let len = r.experts()[0].len as usize;
    eng.predict(&[(1, 0, 1, 0), (1, 1, 1, 1), (1, 2, 1, 2)])
        .unwrap();
    assert!(eng.engine().wait_idle(T));
    let (placed, st) = start(&eng, 1, &[1, 7]);
    assert_eq!(st.done, vec![1]);
    assert!(placed[0].hit && !placed[1].hit);
    let s = eng.wait(1, 7, Proj::Down, T).unwrap();
    assert_eq!(slot_bytes(s, len), slab_bytes(&r, 1, 7));
    assert_eq!(slot_bytes(placed[0].slot, len), slab_bytes(&r, 1, 1));
}

#[test]
fn a_full_layer_evicts_by_policy_and_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (r, eng) = open(dir.path(), 2);
    let len = r.experts()[0].len as usize;
    for token in 0..6u32 {
        let sel = [token % 8, (token * 3 + 1) % 8];
        let (placed, _) = start(&eng, 0, &sel);
        for p in placed {
            let s = eng.wait(0, p.expert, Proj::Down, T).unwrap();
            assert_eq!(
                slot_bytes(s, len),
                slab_bytes(&r, 0, p.expert),
                "token {token}"
            );
        }
        eng.unpin(0, &sel).unwrap();
        eng.tick();
    }
    let (st, counts) = eng.stats();
    assert!(st.demands >= 8 && counts.demand >= 8, "{st:?} {counts:?}");
}

#[test]
fn a_wave_larger_than_the_layer_is_refused_not_corrupted() {
    let dir = tempfile::tempdir().unwrap();
    let (_r, eng) = open(dir.path(), 2);
    eng.begin_layer(0, &[0, 1, 2]).unwrap();
    let err = eng.place(0, &[0, 1, 2]).unwrap_err();
    assert!(err.to_string().contains("pinned"), "{err}");
}

#[test]
fn pin_resident_pins_only_complete_experts_and_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (r, eng) = open(dir.path(), 3);
    let len = r.experts()[0].len as usize;
    let (placed, _) = start(&eng, 1, &[4]);
    eng.wait(1, 4, Proj::Down, T).unwrap();
    eng.unpin(1, &[4]).unwrap();
    let reads_before = eng.stats().0.demands;
    // 4 is complete in RAM; 6 is not resident and must not be read.
    let pinned = eng.pin_resident(1, &[6, 4]).unwrap();
    assert_eq!(pinned.len(), 1);
    assert_eq!(pinned[0].expert, 4);
    assert_eq!(pinned[0].slot, placed[0].slot);
    assert_eq!(slot_bytes(pinned[0].slot, len), slab_bytes(&r, 1, 4));
    assert_eq!(eng.stats().0.demands, reads_before);
    // While pinned for the copy, a full layer evicts the others, never it.
    for sel in [[0u32, 1], [2, 3], [5, 7]] {
        let (placed, _) = start(&eng, 1, &sel);
        for p in &placed {
            eng.wait(1, p.expert, Proj::Down, T).unwrap();
        }
        eng.unpin(1, &sel).unwrap();
        eng.tick();
        assert_eq!(slot_bytes(pinned[0].slot, len), slab_bytes(&r, 1, 4));
    }
    eng.unpin(1, &[4]).unwrap();
}

#[test]
fn uses_served_elsewhere_count_in_the_usage_table_only() {
    let dir = tempfile::tempdir().unwrap();
    let (_r, eng) = open(dir.path(), 2);
    eng.record_use(0, &[3, 3, 5]).unwrap();
    let counts = eng.usage(0).unwrap();
    assert_eq!((counts[3], counts[5], counts[0]), (2, 1, 0));
    assert!(
        eng.pin_resident(0, &[3, 5]).unwrap().is_empty(),
        "not resident"
    );
    assert_eq!(eng.usage(1).unwrap().iter().sum::<u64>(), 0);
    assert!(eng.record_use(0, &[99]).is_err());
}

#[test]
fn protected_residents_outlive_a_wave_of_demand_reads() {
    // A prompt's later wave may hold experts that are resident when the layer starts:
    // protected, they survive the earlier waves' demand reads; unprotected, LRU takes
    // the oldest slots first.
    let dir = tempfile::tempdir().unwrap();
    let (_r, eng) = open(dir.path(), 3);
    let (_, _) = start(&eng, 0, &[0, 1, 2]);
    for e in [0, 1, 2] {
        eng.wait(0, e, Proj::Down, T).unwrap();
    }
    eng.unpin(0, &[0, 1, 2]).unwrap();
    assert_eq!(eng.resident(0).unwrap(), vec![0, 1, 2]);
    assert_eq!(eng.usage(0).unwrap()[..4], [1, 1, 1, 0]);
    eng.forward_done(3);
    eng.set_prompt_mode(true);
    eng.begin_layer(0, &[3, 4, 0]).unwrap();
    assert_eq!(eng.protect(0, &[0, 7]).unwrap(), 1, "7 is not resident");
    let wave = eng.place(0, &[3, 4]).unwrap();
    for p in &wave {
        eng.wait(0, p.expert, Proj::Down, T).unwrap();
    }
    eng.unpin(0, &[3, 4]).unwrap();
    assert_eq!(
        eng.resident(0).unwrap(),
        vec![0, 3, 4],
        "1 and 2 (LRU) left, 0 kept"
    );
    let last = eng.place(0, &[0]).unwrap();
    assert!(last[0].hit);
    eng.unpin(0, &[0]).unwrap();
    assert!(eng.resident(9).is_err() && eng.usage(9).is_err());
}

#[test]
fn a_wave_pins_its_residents_before_its_demand_reads_evict() {
    // Slots hold 0 (older) and 1; a wave [2, 0] must not evict 0 to read 2: 0 is
    // pinned first, so 2 takes 1's slot and 0 is a hit.
    let dir = tempfile::tempdir().unwrap();
    let (_r, eng) = open(dir.path(), 2);
    let (_, _) = start(&eng, 0, &[0, 1]);
    for e in [0, 1] {
        eng.wait(0, e, Proj::Down, T).unwrap();
    }
    eng.unpin(0, &[0, 1]).unwrap();
    eng.forward_done(2);
    eng.set_prompt_mode(true);
    let (placed, _) = start(&eng, 0, &[2, 0]);
    assert_eq!((placed[0].expert, placed[0].hit), (2, false));
    assert_eq!((placed[1].expert, placed[1].hit), (0, true));
    eng.wait(0, 2, Proj::Down, T).unwrap();
    eng.unpin(0, &[2, 0]).unwrap();
    assert_eq!(eng.resident(0).unwrap(), vec![0, 2]);
}

#[test]
fn lent_slots_give_memory_back_and_are_never_read_into_until_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let (r, eng) = open(dir.path(), 4);
    let len = r.experts()[0].len as usize;
    let slot = eng.slots().arena().plan().slot_bytes;
    // Layer 0 holds 0, 1, 2 (slot 3 empty); 1 is used again, so 0 is the coldest;
    // 2 stays pinned (in use).
    let (_, _) = start(&eng, 0, &[0, 1, 2]);
    for e in [0, 1, 2] {
        eng.wait(0, e, Proj::Down, T).unwrap();
    }
    eng.unpin(0, &[0, 1]).unwrap();
    eng.tick();
    let (_, _) = start(&eng, 0, &[1]);
    eng.unpin(0, &[1]).unwrap();
    // 7 slots asked; each layer keeps one usable slot: layer 0 lends its empty slot,
    // then 0 and 1 (2 is pinned and is its last usable slot), layer 1 three empties.
    let given = eng.lend(6 * slot + 1).unwrap();
    assert_eq!(given, 6 * slot);
    assert_eq!(eng.usable_slots(), vec![1, 1]);
    assert_eq!(eng.resident(0).unwrap(), vec![2]);
    let lc = eng.lend_counts();
    assert_eq!(
        (
            lc.lent_slots,
            lc.lent_bytes,
            lc.lends,
            lc.given_bytes,
            lc.evicted
        ),
        (6, 6 * slot, 1, 6 * slot, 2)
    );
    assert_eq!(eng.lend(slot).unwrap(), 0, "nothing more can be lent");
    // A wave fits the usable slots: read into the one slot left, never a lent one.
    eng.unpin(0, &[2]).unwrap();
    for (layer, expert, want_slot) in [(0u32, 5u32, 2u32), (1, 3, 0)] {
        let (placed, _) = start(&eng, layer, &[expert]);
        assert_eq!(placed[0].slot.index, want_slot);
        let s = eng.wait(layer, expert, Proj::Down, T).unwrap();
        assert_eq!(slot_bytes(s, len), slab_bytes(&r, layer, expert));
        eng.unpin(layer, &[expert]).unwrap();
    }
    assert_eq!(eng.reclaim(), 6);
    assert_eq!(eng.usable_slots(), vec![4, 4]);
    let lc = eng.lend_counts();
    assert_eq!(
        (lc.lent_slots, lc.lent_bytes, lc.given_bytes),
        (0, 0, 6 * slot)
    );
    // The given-back pages fault in again when read into: a full wave is exact.
    let sel = [0, 1, 2, 5];
    let (placed, _) = start(&eng, 0, &sel);
    for p in &placed {
        let s = eng.wait(0, p.expert, Proj::Down, T).unwrap();
        assert_eq!(slot_bytes(s, len), slab_bytes(&r, 0, p.expert));
    }
    eng.unpin(0, &sel).unwrap();
}

#[test]
fn a_demand_takes_the_slot_of_a_fill_not_started_instead_of_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.ftw");
    let r = write_model(&path, 2, 8, 128);
    let len = r.experts()[0].len as usize;
    let plan = ArenaPlan {
        n_layers: 2,
        slots_per_layer: 2,
        slot_bytes: r.experts()[0].len,
    };
    let policy = AnyPolicy::online(PolicyKind::Decay, 16).unwrap();
    let cache = ExpertCache::new(2, 8, 2, policy).unwrap();
    let slots = CacheSlots::new(cache, Arena::new(plan).unwrap(), &[0, 1]);
    // one slow worker: the fills queue behind each other
    let slow: io_engine::FaultHook = std::sync::Arc::new(|_, _| {
        std::thread::sleep(Duration::from_millis(50));
        None
    });
    let cfg = EngineConfig {
        workers: 1,
        fault: Some(slow),
        ..EngineConfig::default()
    };
    let eng = CachedEngine::open(&path, r.experts(), slots, cfg).unwrap();
    for layer in [0, 1] {
        eng.record_use(layer, &[0, 1]).unwrap();
    }
    assert_eq!(
        eng.idle_fill().unwrap(),
        4,
        "every slot of both layers taken by a fill"
    );
    // layer 1's slots are held by fills the one worker has not reached
    let (placed, _) = start(&eng, 1, &[5]);
    let s = eng.wait(1, 5, Proj::Down, T).unwrap();
    assert_eq!(
        (placed[0].slot, slot_bytes(s, len)),
        (s, slab_bytes(&r, 1, 5))
    );
    let (stats, _) = eng.stats();
    assert_eq!(stats.cancelled, 1, "one queued fill gave its slot back");
    eng.unpin(1, &[5]).unwrap();
    assert!(eng.engine().wait_idle(T));
    assert_eq!(eng.fills_left(), 0);
    let mut kept = eng.resident(1).unwrap();
    kept.sort_unstable();
    assert!(kept.contains(&5) && kept.len() == 2, "{kept:?}");
}
