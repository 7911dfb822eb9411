//! Shared fixtures: a .ftw file of distinct random experts and a slot pool that checks
//! the engine's slot contract (every slot returned exactly once).
#![allow(dead_code, clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use ftw_format::{DType, ExpertLayout, FtwReader, FtwWriter, ProjShape, Scheme};
use io_engine::{AlignedBuf, ExpertKey, ReadClass, Slot, SlotSource};

/// Writes `layers x experts` experts whose slabs span several 512 KiB chunks
/// (gate/up 640 KiB, down 640 KiB in bf16) and returns the reader.
pub fn write_model(path: &Path, layers: u32, experts: u32, rows: u32) -> FtwReader {
    let mut w = FtwWriter::create(path).unwrap();
    w.add_tensor("x", DType::F32, &[1], &[0; 4]).unwrap();
    let cols = 1024;
    let layout = ExpertLayout {
        n_layers: layers,
        n_experts: experts,
        scheme: Scheme::Raw(DType::BF16),
        proj: [
            ProjShape { rows, cols },
            ProjShape { rows, cols },
            ProjShape {
                rows: cols,
                cols: rows,
            },
        ],
    };
    w.begin_experts(layout).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for l in 0..layers {
        for e in 0..experts {
            let p: Vec<Vec<u8>> = (0..3)
                .map(|i| {
                    (0..layout.proj_bytes(i).unwrap())
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect()
                })
                .collect();
            w.add_expert(l, e, [&p[0], &p[1], &p[2]]).unwrap();
        }
    }
    w.finish("{}").unwrap();
    FtwReader::open(path).unwrap()
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<u32>,
    engine: HashMap<u32, ExpertKey>,
    resident: HashMap<u32, ExpertKey>,
    completes: u64,
    releases: u64,
}

/// A pool of aligned slots; panics if the engine returns a slot it does not own.
#[derive(Debug)]
pub struct Pool {
    bufs: Vec<AlignedBuf>,
    state: Mutex<PoolState>,
}

impl Pool {
    pub fn new(n: usize, slot_bytes: usize) -> Self {
        let bufs: Vec<_> = (0..n)
            .map(|_| AlignedBuf::new(slot_bytes, 4096).unwrap())
            .collect();
        let state = PoolState {
            free: (0..n as u32).rev().collect(),
            ..Default::default()
        };
        Self {
            bufs,
            state: Mutex::new(state),
        }
    }
    fn slot(&self, i: u32) -> Slot {
        let b = &self.bufs[i as usize];
        Slot {
            index: i,
            addr: b.as_mut_ptr() as usize,
            len: b.len() as u64,
        }
    }
    /// A free slot taken for a demand read.
    pub fn take(&self, key: ExpertKey) -> Option<Slot> {
        let mut s = self.state.lock().unwrap();
        let i = s.free.pop()?;
        s.engine.insert(i, key);
        Some(self.slot(i))
    }
    /// Gives back a slot the engine did not use.
    pub fn untake(&self, slot: Slot) {
        let mut s = self.state.lock().unwrap();
        s.engine.remove(&slot.index).unwrap();
        s.free.push(slot.index);
    }
    /// Evicts every resident expert.
    pub fn evict_all(&self) {
        let mut s = self.state.lock().unwrap();
        let ids: Vec<u32> = s.resident.keys().copied().collect();
        for i in ids {
            s.resident.remove(&i);
            s.free.push(i);
        }
    }
    pub fn bytes(&self, slot: Slot, len: usize) -> Vec<u8> {
        self.bufs[slot.index as usize].as_slice()[..len].to_vec()
    }
    /// (free, held by engine, resident, completes, releases)
    pub fn census(&self) -> (usize, usize, usize, u64, u64) {
        let s = self.state.lock().unwrap();
        (
            s.free.len(),
            s.engine.len(),
            s.resident.len(),
            s.completes,
            s.releases,
        )
    }
    pub fn resident(&self) -> Vec<ExpertKey> {
        self.state
            .lock()
            .unwrap()
            .resident
            .values()
            .copied()
            .collect()
    }
}

impl SlotSource for Pool {
    fn bind(&self, key: ExpertKey, _class: ReadClass) -> Option<Slot> {
        self.take(key)
    }
    fn complete(&self, key: ExpertKey, slot: Slot) {
        let mut s = self.state.lock().unwrap();
        assert_eq!(
            s.engine.remove(&slot.index),
            Some(key),
            "complete of a slot not held for {key:?}"
        );
        s.resident.insert(slot.index, key);
        s.completes += 1;
    }
    fn release(&self, key: ExpertKey, slot: Slot) {
        let mut s = self.state.lock().unwrap();
        assert_eq!(
            s.engine.remove(&slot.index),
            Some(key),
            "release of a slot not held for {key:?}"
        );
        s.free.push(slot.index);
        s.releases += 1;
    }
}
