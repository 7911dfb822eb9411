//! What the speed examples share: a seeded xorshift generator, random experts in the
//! file's layouts (finite bf16 weights, small positive scales), random routing.

use cpu_kernels::{ExpertFormat, ExpertWeights, WeightKind};

/// A xorshift64 generator with a fixed seed (every run draws the same numbers).
pub fn rng() -> impl FnMut() -> u64 {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The expert kinds named in `list` (comma separated: bf16, int8, int4), int4 in
/// groups of 32.
pub fn kinds(list: &str) -> Vec<(WeightKind, &'static str)> {
    [
        (WeightKind::Bf16, "bf16"),
        (WeightKind::Int8, "int8"),
        (WeightKind::Int4 { group: 32 }, "int4"),
    ]
    .into_iter()
    .filter(|(_, name)| list.split(',').any(|k| k == *name))
    .collect()
}

/// `n` experts of format `f` (`kind`) as random projection bytes: bf16 weights kept
/// finite and small, int8/int4 scales all 0x3a bytes.
pub fn slabs(
    f: &ExpertFormat,
    kind: WeightKind,
    n: usize,
    rnd: &mut impl FnMut() -> u64,
) -> Vec<[Vec<u8>; 3]> {
    (0..n)
        .map(|_| {
            [0, 1, 2].map(|p| {
                let mut b: Vec<u8> = (0..f.proj_bytes(p).unwrap()).map(|_| rnd() as u8).collect();
                if kind == WeightKind::Bf16 {
                    for c in b.chunks_exact_mut(2) {
                        c[1] &= 0x3c; // finite, small
                    }
                } else {
                    let (rows, cols) = f.shapes[p];
                    let tail = if kind == WeightKind::Int8 {
                        rows * 4
                    } else {
                        rows * cols / 32 * 2
                    };
                    let len = b.len();
                    for v in &mut b[len - tail..] {
                        *v = 0x3a;
                    }
                }
                b
            })
        })
        .collect()
}

/// The experts of `slabs` as the kernels take them, expert e at index e.
pub fn experts<'a>(f: &ExpertFormat, slabs: &'a [[Vec<u8>; 3]]) -> Vec<(u32, ExpertWeights<'a>)> {
    slabs
        .iter()
        .enumerate()
        .map(|(e, s)| {
            (
                e as u32,
                ExpertWeights::new(f, [&s[0], &s[1], &s[2]]).unwrap(),
            )
        })
        .collect()
}

/// `k` distinct random experts of `n`.
pub fn pick(n: usize, k: usize, rnd: &mut impl FnMut() -> u64) -> Vec<i64> {
    let mut ids: Vec<i64> = Vec::new();
    while ids.len() < k {
        let e = (rnd() % n as u64) as i64;
        if !ids.contains(&e) {
            ids.push(e);
        }
    }
    ids
}
