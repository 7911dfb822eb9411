//! The engine end to end on real files: bytes, prefetch, cancel/promote, faults, fallback.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{write_model, Pool};
use io_engine::{Engine, EngineConfig, ExpertKey, IoError, Proj, ReadMode};

const T: Duration = Duration::from_secs(20);

fn key(layer: u32, expert: u32) -> ExpertKey {
    ExpertKey { layer, expert }
}

fn setup(
    dir: &std::path::Path,
    cfg: EngineConfig,
    slots: usize,
) -> (ftw_format::FtwReader, Arc<Pool>, Engine) {
    let path = dir.join("m.ftw");
    let r = write_model(&path, 2, 6, 320);
    let slab = r.experts()[0].len as usize;
    let pool = Arc::new(Pool::new(slots, slab));
    let engine = Engine::open(&path, r.experts(), pool.clone(), cfg).unwrap();
    (r, pool, engine)
}

fn file_bytes(r: &ftw_format::FtwReader, k: ExpertKey) -> Vec<u8> {
    let e = *r.expert(k.layer, k.expert).unwrap();
    let mut buf = vec![0u8; e.len as usize];
    r.read_expert_into(k.layer, k.expert, &mut buf).unwrap();
    buf
}

#[test]
fn demand_reads_equal_the_file_bytes_for_every_expert() {
    let dir = tempfile::tempdir().unwrap();
    let (r, pool, engine) = setup(
        dir.path(),
        EngineConfig {
            workers: 4,
            ..Default::default()
        },
        4,
    );
    assert_eq!(
        engine.mode(),
        ReadMode::Direct,
        "/tmp should allow O_DIRECT"
    );
    for e in r.experts() {
        let k = key(e.layer, e.expert);
        let slot = pool.take(k).unwrap();
        assert!(engine.demand(k, slot).unwrap());
        let got = engine.wait(k, Proj::Down, T).unwrap();
        assert_eq!(pool.bytes(got, e.len as usize), file_bytes(&r, k));
        pool.evict_all();
    }
    let st = engine.stats();
    assert_eq!(st.demands, 12);
    assert_eq!(st.bytes.0, r.experts().iter().map(|e| e.len).sum::<u64>());
}

#[test]
fn predictions_are_read_in_chunks_into_bound_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (r, pool, engine) = setup(dir.path(), EngineConfig::default(), 6);
    let preds: Vec<_> = (0..6).map(|e| (key(1, e), 1, e as u8)).collect();
    engine.predict(&preds).unwrap();
    assert!(engine.wait_idle(T));
    let st = engine.stats();
    assert_eq!(st.bound, 6);
    let slab = r.experts()[0].len;
    assert_eq!(
        st.reads.1,
        6 * slab.div_ceil(512 << 10),
        "one read per 512 KiB chunk"
    );
    for e in 0..6 {
        let got = engine.wait(key(1, e), Proj::Down, T).unwrap();
        assert_eq!(pool.bytes(got, slab as usize), file_bytes(&r, key(1, e)));
    }
    assert_eq!(pool.census().2, 6);
}

#[test]
fn predictions_beyond_the_free_slots_are_dropped_not_evicting() {
    let dir = tempfile::tempdir().unwrap();
    let (_r, pool, engine) = setup(dir.path(), EngineConfig::default(), 2);
    let preds: Vec<_> = (0..6).map(|e| (key(0, e), 1, e as u8)).collect();
    engine.predict(&preds).unwrap();
    assert!(engine.wait_idle(T));
    let st = engine.stats();
    assert_eq!((st.bound, st.bind_failed), (2, 4));
    // best-ranked predictions got the slots
    let mut res = pool.resident();
    res.sort();
    assert_eq!(res, vec![key(0, 0), key(0, 1)]);
}

#[test]
fn layer_start_cancels_wrong_guesses_and_reports_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (_r, pool, engine) = setup(dir.path(), EngineConfig::default(), 6);
    engine
        .predict(&[(key(1, 0), 1, 0), (key(1, 1), 1, 1), (key(1, 2), 1, 2)])
        .unwrap();
    assert!(engine.wait_idle(T));
    let start = engine.begin_layer(1, &[0, 4]);
    assert_eq!(start.done, vec![0]);
    assert_eq!(start.absent, vec![4]);
    assert_eq!(
        start.cancelled, 0,
        "finished prefetches are resident, not cancelled"
    );
    assert_eq!(pool.census().2, 3);
    assert_eq!(
        engine.tracked(),
        (0, 0),
        "finished records of the layer are swept"
    );
}

#[test]
fn a_failed_read_reaches_the_waiter_naming_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let fault: io_engine::FaultHook = Arc::new(|k: ExpertKey, _off: u64| {
        (k == ExpertKey {
            layer: 0,
            expert: 3,
        })
        .then(|| std::io::Error::from_raw_os_error(libc::EIO))
    });
    let cfg = EngineConfig {
        fault: Some(fault),
        ..Default::default()
    };
    let (_r, pool, engine) = setup(dir.path(), cfg, 2);
    let k = key(0, 3);
    engine.demand(k, pool.take(k).unwrap()).unwrap();
    match engine.wait(k, Proj::Gate, T) {
        Err(IoError::Read {
            layer: 0,
            expert: 3,
            message,
        }) => assert!(message.contains("Input/output error"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(engine.wait_idle(T));
    assert_eq!(pool.census(), (2, 0, 0, 0, 1), "the slot came back");
}

#[test]
fn a_file_truncated_underneath_gives_a_short_read_error() {
    let dir = tempfile::tempdir().unwrap();
    let (r, pool, engine) = setup(dir.path(), EngineConfig::default(), 2);
    let last = *r.experts().last().unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("m.ftw"))
        .unwrap();
    f.set_len(last.off + 8192).unwrap();
    let k = key(last.layer, last.expert);
    engine.demand(k, pool.take(k).unwrap()).unwrap();
    let err = engine.wait(k, Proj::Down, T).unwrap_err();
    assert!(
        matches!(err, IoError::ShortRead { got: 8192, .. }),
        "{err:?}"
    );
}

#[test]
fn corrupt_bytes_fail_the_checksum_and_are_never_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (r, pool, engine) = setup(dir.path(), EngineConfig::default(), 2);
    let e = r.experts()[4];
    let mut data = std::fs::read(dir.path().join("m.ftw")).unwrap();
    data[(e.off + e.len - 5000) as usize] ^= 1;
    std::fs::write(dir.path().join("m.ftw"), data).unwrap();
    let k = key(e.layer, e.expert);
    engine.demand(k, pool.take(k).unwrap()).unwrap();
    assert!(matches!(
        engine.wait(k, Proj::Down, T),
        Err(IoError::Checksum { .. })
    ));
    assert!(matches!(
        engine.wait(k, Proj::Gate, T),
        Err(IoError::Checksum { .. })
    ));
    assert_eq!(pool.census().2, 0, "nothing became resident");
}

#[test]
fn buffered_fallback_where_direct_io_is_refused() {
    // tmpfs accepts O_DIRECT on recent kernels, so the refusal is simulated.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.ftw");
    let r = write_model(&path, 1, 2, 320);
    std::env::set_var(io_engine::REFUSE_DIRECT_ENV, "1");
    let opened = io_engine::open_for_reads(&path, true);
    std::env::remove_var(io_engine::REFUSE_DIRECT_ENV);
    assert_eq!(opened.unwrap().1, ReadMode::Buffered);
    let pool = Arc::new(Pool::new(1, r.experts()[0].len as usize));
    let cfg = EngineConfig {
        direct: false,
        ..Default::default()
    };
    let engine = Engine::open(&path, r.experts(), pool.clone(), cfg).unwrap();
    assert_eq!(engine.mode(), ReadMode::Buffered);
    let k = key(0, 1);
    engine.demand(k, pool.take(k).unwrap()).unwrap();
    let got = engine.wait(k, Proj::Down, T).unwrap();
    assert_eq!(
        pool.bytes(got, r.experts()[0].len as usize),
        file_bytes(&r, k)
    );
}

#[test]
fn wait_times_out_and_unknown_experts_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (_r, pool, engine) = setup(dir.path(), EngineConfig::default(), 2);
    assert!(matches!(
        engine.wait(key(0, 1), Proj::Gate, T),
        Err(IoError::NotRequested { .. })
    ));
    let k = key(7, 0);
    let slot = pool.take(k).unwrap();
    assert!(matches!(
        engine.demand(k, slot),
        Err(IoError::NoSuchExpert { .. })
    ));
}
