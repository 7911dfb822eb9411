//! Storms of demand / prediction / cancel / promote from several threads: no lost or
//! duplicate completions, no deadlock, every slot accounted for, bytes intact.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::{write_model, Pool};
use io_engine::{Engine, EngineConfig, ExpertKey, IoError, Proj};

const LAYERS: u32 = 3;
const EXPERTS: u32 = 8;
const SLOTS: usize = 10;

fn storm(seed: u64, engine: &Engine, pool: &Pool, taken: &AtomicU64, untaken: &AtomicU64) {
    let mut x = seed | 1;
    let mut rnd = move |n: u32| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % u64::from(n)) as u32
    };
    for _ in 0..400 {
        let k = ExpertKey {
            layer: rnd(LAYERS),
            expert: rnd(EXPERTS),
        };
        match rnd(12) {
            0..=2 => {
                let preds: Vec<_> = (0..4)
                    .map(|r| {
                        (
                            ExpertKey {
                                layer: k.layer,
                                expert: rnd(EXPERTS),
                            },
                            1 + rnd(2) as u8,
                            r,
                        )
                    })
                    .collect();
                engine.predict(&preds).unwrap();
            }
            3..=4 => {
                if let Some(slot) = pool.take(k) {
                    taken.fetch_add(1, Ordering::SeqCst);
                    if !engine.demand(k, slot).unwrap() {
                        pool.untake(slot);
                        untaken.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            5 => {
                let sel: Vec<u32> = (0..rnd(4)).map(|_| rnd(EXPERTS)).collect();
                engine.begin_layer(k.layer, &sel);
            }
            6 => engine.cancel(k),
            7..=8 => match engine.wait(k, Proj::Down, Duration::from_millis(5)) {
                Ok(_)
                | Err(IoError::Timeout { .. })
                | Err(IoError::NotRequested { .. })
                | Err(IoError::Cancelled { .. }) => {}
                Err(e) => panic!("unexpected error {e}"),
            },
            9 => pool.evict_all(),
            _ => std::thread::sleep(Duration::from_micros(300)), // let the workers run
        }
    }
}

#[test]
fn storms_conserve_slots_and_never_hang() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.ftw");
        let r = write_model(&path, LAYERS, EXPERTS, 96);
        let pool = Arc::new(Pool::new(SLOTS, r.experts()[0].len as usize));
        let cfg = EngineConfig {
            workers: 4,
            chunk_bytes: 128 << 10,
            ..Default::default()
        };
        let engine = Arc::new(Engine::open(&path, r.experts(), pool.clone(), cfg).unwrap());
        let taken = Arc::new(AtomicU64::new(0));
        let untaken = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (e, p, a, b) = (engine.clone(), pool.clone(), taken.clone(), untaken.clone());
                std::thread::spawn(move || storm(0x5eed + t * 7919, &e, &p, &a, &b))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for l in 0..LAYERS {
            engine.begin_layer(l, &[]);
        }
        assert!(
            engine.wait_idle(Duration::from_secs(30)),
            "engine did not drain"
        );
        let st = engine.stats();
        let (free, held, resident, completes, releases) = pool.census();
        assert_eq!(held, 0, "the engine still holds slots after draining");
        assert_eq!(free + resident, SLOTS, "slots lost");
        let handed = taken.load(Ordering::SeqCst) - untaken.load(Ordering::SeqCst) + st.bound;
        assert_eq!(
            completes + releases,
            handed,
            "every slot handed over came back exactly once"
        );
        assert!(st.demands > 0 && st.bound > 0 && st.cancelled > 0, "{st:?}");
        for k in pool.resident() {
            let got = engine.wait(k, Proj::Down, Duration::ZERO);
            assert!(got.is_ok() || matches!(got, Err(IoError::NotRequested { .. })));
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("stress test deadlocked or panicked");
}
