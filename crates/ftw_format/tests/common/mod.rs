//! Shared helpers of the integration tests: the fixed tiny file used for golden bytes
//! and as the seed of the hostile corpus.
#![allow(dead_code, clippy::unwrap_used, clippy::indexing_slicing)]

use std::path::Path;

use ftw_format::{DType, ExpertLayout, FtwWriter, ProjShape, Scheme};

pub const GOLDEN_META: &str = r#"{"arch":"golden","config":{"hidden_size":8}}"#;

/// Deterministic bytes: `i * 31 + seed` truncated, so every item differs.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn golden_layout() -> ExpertLayout {
    ExpertLayout {
        n_layers: 1,
        n_experts: 2,
        scheme: Scheme::Raw(DType::BF16),
        proj: [
            ProjShape { rows: 4, cols: 8 },
            ProjShape { rows: 4, cols: 8 },
            ProjShape { rows: 8, cols: 4 },
        ],
    }
}

/// Writes the golden file: two dense tensors and a 1 x 2 expert grid.
pub fn write_golden(path: &Path) {
    let mut w = FtwWriter::create(path).unwrap();
    w.add_tensor("embed.weight", DType::F32, &[2, 3], &pattern(24, 1))
        .unwrap();
    w.add_tensor("final.weight", DType::BF16, &[4], &pattern(8, 2))
        .unwrap();
    w.begin_experts(golden_layout()).unwrap();
    for e in 0..2u8 {
        let p = [
            pattern(64, 10 + e),
            pattern(64, 20 + e),
            pattern(64, 30 + e),
        ];
        w.add_expert(0, u32::from(e), [&p[0], &p[1], &p[2]])
            .unwrap();
    }
    w.finish(GOLDEN_META).unwrap();
}
