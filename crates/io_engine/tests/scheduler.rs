//! The scheduler's rules, driven step by step without threads or I/O.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use common::Pool;
use ftw_format::{ExpertEntry, ProjSpan};
use io_engine::{EngineConfig, ExpertKey, Proj, ReadClass, Scheduler, WaitStatus};

const SLAB: u64 = 2 << 20; // 4 chunks of 512 KiB

fn entries(layers: u32, experts: u32) -> Vec<ExpertEntry> {
    let mut out = Vec::new();
    for l in 0..layers {
        for e in 0..experts {
            let off = 4096 + u64::from(l * experts + e) * SLAB;
            let proj = [
                ProjSpan {
                    off: 0,
                    len: 600 << 10,
                },
                ProjSpan {
                    off: 600 << 10,
                    len: 600 << 10,
                },
                ProjSpan {
                    off: 1200 << 10,
                    len: 848 << 10,
                },
            ];
            out.push(ExpertEntry {
                layer: l,
                expert: e,
                off,
                len: SLAB,
                proj,
                xxh3: 0,
            });
        }
    }
    out
}

fn key(layer: u32, expert: u32) -> ExpertKey {
    ExpertKey { layer, expert }
}

fn sched() -> (Scheduler, Pool) {
    let cfg = EngineConfig {
        verify: false,
        ..Default::default()
    };
    (
        Scheduler::new(cfg, &entries(3, 8)),
        Pool::new(16, SLAB as usize),
    )
}

#[test]
fn demand_goes_before_prefetch_and_stays_one_request() {
    let (mut s, pool) = sched();
    s.predict(key(1, 0), 1, 0).unwrap();
    let first = s.next_work(&pool).unwrap();
    assert_eq!((first.class, first.len), (ReadClass::Prefetch, 512 << 10));
    s.demand(key(0, 5), pool.take(key(0, 5)).unwrap()).unwrap();
    let next = s.next_work(&pool).unwrap();
    assert_eq!(
        (next.key, next.class, next.len),
        (key(0, 5), ReadClass::Demand, SLAB)
    );
}

#[test]
fn prefetch_chunks_are_capped_lower_while_a_demand_is_in_service() {
    let (mut s, pool) = sched();
    for e in 0..4 {
        s.predict(key(1, e), 1, e as u8).unwrap();
    }
    let idle: Vec<_> = std::iter::from_fn(|| s.next_work(&pool)).collect();
    assert_eq!(idle.len(), 4, "cap without demand");
    for item in &idle {
        s.finish(item, Ok(item.len), &pool);
    }
    s.demand(key(0, 0), pool.take(key(0, 0)).unwrap()).unwrap();
    let busy: Vec<_> = std::iter::from_fn(|| s.next_work(&pool)).collect();
    assert_eq!(busy[0].class, ReadClass::Demand);
    assert_eq!(
        busy.iter()
            .filter(|w| w.class == ReadClass::Prefetch)
            .count(),
        2
    );
}

#[test]
fn predictions_bind_late_in_distance_then_rank_order() {
    let (mut s, pool) = sched();
    s.predict(key(2, 7), 2, 0).unwrap();
    s.predict(key(1, 3), 1, 5).unwrap();
    s.predict(key(1, 1), 1, 2).unwrap();
    s.demand(key(0, 0), pool.take(key(0, 0)).unwrap()).unwrap();
    let d = s.next_work(&pool).unwrap();
    assert_eq!(d.class, ReadClass::Demand);
    assert_eq!(s.stats.bound, 0, "nothing bound while a demand was queued");
    let order: Vec<_> = std::iter::from_fn(|| s.next_work(&pool))
        .map(|w| w.key)
        .collect();
    assert_eq!(order[0], key(1, 1), "closest layer, best rank first");
    assert_eq!(
        s.stats.bound, 1,
        "the next prediction waits until this one's chunks are issued"
    );
}

#[test]
fn layer_start_promotes_selected_and_cancels_the_rest() {
    let (mut s, pool) = sched();
    s.predict(key(1, 0), 1, 0).unwrap();
    s.predict(key(1, 1), 1, 1).unwrap();
    s.predict(key(1, 2), 1, 2).unwrap();
    let a = s.next_work(&pool).unwrap(); // binds (1,0), first chunk in service
    assert_eq!(a.key, key(1, 0));
    let start = s.begin_layer(1, &[0, 2], &pool);
    assert_eq!(start.pending, vec![0]);
    assert_eq!(
        start.absent,
        vec![2],
        "an unbound prediction is demanded by the caller"
    );
    assert_eq!((start.promoted, start.cancelled), (1, 1));
    let b = s.next_work(&pool).unwrap();
    assert_eq!(
        (b.key, b.class),
        (key(1, 0), ReadClass::Demand),
        "remaining chunks moved to demand"
    );
    assert_eq!(s.stats.promoted, 1);
}

#[test]
fn a_cancelled_read_in_service_releases_its_slot_when_it_ends() {
    let (mut s, pool) = sched();
    s.predict(key(2, 4), 1, 0).unwrap();
    let w = s.next_work(&pool).unwrap();
    assert_eq!(pool.census().1, 1);
    s.begin_layer(2, &[1], &pool);
    assert_eq!(pool.census().1, 1, "still being written: not yet free");
    s.finish(&w, Ok(w.len), &pool);
    assert_eq!(pool.census(), (16, 0, 0, 0, 1));
    assert_eq!(s.tracked(), (0, 0));
}

#[test]
fn gate_is_ready_before_down_lands() {
    let (mut s, pool) = sched();
    s.predict(key(0, 1), 1, 0).unwrap();
    let w1 = s.next_work(&pool).unwrap();
    let w2 = s.next_work(&pool).unwrap();
    s.finish(&w1, Ok(w1.len), &pool);
    s.finish(&w2, Ok(w2.len), &pool); // 1 MiB in: gate (600 KiB) done, up (to 1200 KiB) not
    assert!(matches!(
        s.status(key(0, 1), Proj::Gate),
        WaitStatus::Ready(_)
    ));
    assert!(matches!(s.status(key(0, 1), Proj::Up), WaitStatus::Pending));
    assert!(matches!(
        s.status(key(0, 1), Proj::Down),
        WaitStatus::Pending
    ));
}

#[test]
fn a_finished_read_evicted_since_is_read_again_on_demand() {
    let (mut s, pool) = sched();
    s.demand(key(0, 3), pool.take(key(0, 3)).unwrap()).unwrap();
    let w = s.next_work(&pool).unwrap();
    s.finish(&w, Ok(w.len), &pool); // verify off: done, handed to the cache
    pool.evict_all();
    assert!(
        s.demand(key(0, 3), pool.take(key(0, 3)).unwrap()).unwrap(),
        "slot used"
    );
    assert_eq!(s.next_work(&pool).unwrap().key, key(0, 3));
}

/// Everything `next_work` hands out now, finishing none of it.
fn drain(s: &mut Scheduler, pool: &Pool) -> Vec<io_engine::WorkItem> {
    std::iter::from_fn(|| s.next_work(pool)).collect()
}

#[test]
fn fills_wait_for_demands_and_prefetches_and_use_every_worker_alone() {
    let (mut s, pool) = sched();
    for e in 0..4 {
        assert!(s.fill(key(0, e), pool.take(key(0, e)).unwrap()).unwrap());
    }
    s.predict(key(1, 0), 1, 0).unwrap();
    s.demand(key(2, 0), pool.take(key(2, 0)).unwrap()).unwrap();
    let first = drain(&mut s, &pool);
    assert_eq!(first[0].class, ReadClass::Demand);
    assert!(
        first.iter().all(|w| w.class != ReadClass::Fill),
        "no fill while a prefetch waits for its turn"
    );
    for item in &first {
        s.finish(item, Ok(item.len), &pool);
    }
    // the prefetch's last chunks first, then fills beside them on the other workers
    let second = drain(&mut s, &pool);
    let classes: Vec<_> = second.iter().map(|w| w.class).collect();
    let last_prefetch = classes
        .iter()
        .rposition(|&c| c == ReadClass::Prefetch)
        .unwrap();
    assert!(classes[last_prefetch + 1..]
        .iter()
        .all(|&c| c == ReadClass::Fill));
    assert_eq!(second.len(), EngineConfig::default().workers);
    assert!(
        second.iter().all(|w| w.len == 512 << 10),
        "fills are chunked"
    );
    for item in &second {
        s.finish(item, Ok(item.len), &pool);
    }
    // a demand in service: fills and prefetches share its lower cap
    s.demand(key(2, 1), pool.take(key(2, 1)).unwrap()).unwrap();
    let third = drain(&mut s, &pool);
    assert_eq!(third[0].class, ReadClass::Demand);
    assert_eq!(
        third.len(),
        1 + EngineConfig::default().prefetch_cap_with_demand
    );
}

#[test]
fn a_layer_start_keeps_fills_and_promotes_the_selected_one() {
    let (mut s, pool) = sched();
    for e in 0..3 {
        s.fill(key(1, e), pool.take(key(1, e)).unwrap()).unwrap();
    }
    s.fill(key(2, 0), pool.take(key(2, 0)).unwrap()).unwrap();
    assert_eq!(s.fills_left(), 4);
    let start = s.begin_layer(1, &[2], &pool);
    assert_eq!((start.pending.clone(), start.cancelled), (vec![2], 0));
    assert_eq!(s.fills_left(), 3, "the selected fill is a demand now");
    let next = s.next_work(&pool).unwrap();
    assert_eq!((next.key, next.class), (key(1, 2), ReadClass::Demand));
    assert!(
        matches!(s.status(key(1, 0), Proj::Gate), WaitStatus::Pending),
        "kept"
    );
    // a demand of an expert being filled promotes it too (its slot is not used)
    assert!(!s.demand(key(2, 0), pool.take(key(2, 0)).unwrap()).unwrap());
    assert_eq!(s.fills_left(), 2);
}

#[test]
fn finished_fills_are_counted_as_fill_reads() {
    let (mut s, pool) = sched();
    s.fill(key(0, 1), pool.take(key(0, 1)).unwrap()).unwrap();
    while let Some(item) = s.next_work(&pool) {
        s.finish(&item, Ok(item.len), &pool);
    }
    assert_eq!(s.fills_left(), 0);
    assert!(s.idle());
    assert_eq!(
        (s.stats.fills, s.stats.reads.0, s.stats.bytes.2),
        (1, 0, SLAB)
    );
    assert!(matches!(
        s.status(key(0, 1), Proj::Down),
        WaitStatus::Ready(_)
    ));
}

#[test]
fn waiters_blocked_together_stall_once_in_wall_time() {
    use std::time::{Duration, Instant};
    let mut s = Scheduler::new(EngineConfig::default(), &entries(1, 4));
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    // two threads wait on the same projection, overlapping from 10 to 30 ms
    s.block_begin(ms(0));
    s.block_begin(ms(10));
    s.block_end(ms(30));
    assert_eq!(s.stats.wait_us, 0, "one waiter is still blocked");
    s.block_end(ms(50));
    assert_eq!(
        s.stats.wait_us, 50_000,
        "0..50 ms with someone blocked, not 50 + 20"
    );
    // a later stall on its own adds its own length
    s.block_begin(ms(100));
    s.block_end(ms(105));
    assert_eq!(s.stats.wait_us, 55_000);
    assert_eq!(s.stats.waits, 3);
}
