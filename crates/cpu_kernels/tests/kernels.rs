//! Every kernel against an independent scalar reference written here, on odd shapes:
//! bit-identical for the scalar path, within tolerance for the vector paths; the layer
//! call is the same on 1 and 3 threads, in one call or in waves, and when its experts'
//! bytes land in random order while it waits.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use cpu_kernels::{
    weighted_sum, AllReady, ExpertFormat, ExpertWeights, Isa, KernelError, Kernels, Ready, Routing,
    WeightKind,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn f16_bits(v: f32) -> u16 {
    // Values in [-1, 1) with 10 mantissa bits kept (no subnormals needed here).
    if v == 0.0 {
        return 0;
    }
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// Random bytes of one projection in `kind`'s layout, and its weights as f32 the way
/// docs/ftw-format.md defines them (w = q * scale), row-major.
fn projection(rng: &mut Rng, kind: WeightKind, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let n = rows * cols;
    let pad = |len: usize| len.next_multiple_of(64);
    match kind {
        WeightKind::F32 => {
            let w: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            (w.iter().flat_map(|v| v.to_le_bytes()).collect(), w)
        }
        WeightKind::Bf16 => {
            let bits: Vec<u16> = (0..n).map(|_| (rng.f().to_bits() >> 16) as u16).collect();
            let w = bits
                .iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect();
            (bits.iter().flat_map(|v| v.to_le_bytes()).collect(), w)
        }
        WeightKind::F16 => {
            let vals: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let bits: Vec<u16> = vals.iter().map(|&v| f16_bits(v)).collect();
            let w = bits.iter().map(|&b| cpu_kernels::f16_to_f32(b)).collect();
            (bits.iter().flat_map(|v| v.to_le_bytes()).collect(), w)
        }
        WeightKind::Int8 => {
            let q: Vec<i8> = (0..n)
                .map(|_| ((rng.next() % 255) as i16 - 127) as i8)
                .collect();
            let s: Vec<f32> = (0..rows).map(|_| rng.f().abs() * 0.01 + 1e-4).collect();
            let mut bytes: Vec<u8> = q.iter().map(|&v| v as u8).collect();
            bytes.resize(pad(n), 0);
            bytes.extend(s.iter().flat_map(|v| v.to_le_bytes()));
            let w = (0..n).map(|i| f32::from(q[i]) * s[i / cols]).collect();
            (bytes, w)
        }
        WeightKind::Int4 { group } => {
            let q: Vec<i8> = (0..n).map(|_| (rng.next() % 16) as i8 - 8).collect();
            let g = cols / group;
            let s: Vec<u16> = (0..rows * g)
                .map(|_| ((rng.f().abs() * 0.05 + 1e-3).to_bits() >> 16) as u16)
                .collect();
            let mut bytes: Vec<u8> = q
                .chunks(2)
                .map(|p| ((p[0] + 8) as u8) | (((p[1] + 8) as u8) << 4))
                .collect();
            bytes.resize(pad(n / 2), 0);
            bytes.extend(s.iter().flat_map(|v| v.to_le_bytes()));
            let sf = |r: usize, c: usize| f32::from_bits(u32::from(s[r * g + c / group]) << 16);
            let w = (0..n)
                .map(|i| f32::from(q[i]) * sf(i / cols, i % cols))
                .collect();
            (bytes, w)
        }
    }
}

/// The reference dot of row `r`, written from the format's definition: one f32
/// accumulator in column order; int8 sums q * x then scales; int4 scales each group's
/// sum of q * x (the order `scalar.rs` documents).
fn reference_dot(
    kind: WeightKind,
    bytes: &[u8],
    w: &[f32],
    rows: usize,
    cols: usize,
    r: usize,
    x: &[f32],
) -> f32 {
    match kind {
        WeightKind::Int8 => {
            let mut acc = 0.0f32;
            for c in 0..cols {
                acc += f32::from(bytes[r * cols + c] as i8) * x[c];
            }
            let off = (rows * cols).next_multiple_of(64) + 4 * r;
            acc * f32::from_le_bytes(bytes[off..off + 4].try_into().unwrap())
        }
        WeightKind::Int4 { group } => {
            let mut acc = 0.0f32;
            for g in 0..cols / group {
                let mut part = 0.0f32;
                for c in g * group..(g + 1) * group {
                    let b = bytes[(r * cols + c) / 2];
                    let nib = if c % 2 == 0 { b & 15 } else { b >> 4 };
                    part += f32::from(nib as i8 - 8) * x[c];
                }
                let off = (rows * cols / 2).next_multiple_of(64) + 2 * (r * (cols / group) + g);
                let s = u16::from_le_bytes([bytes[off], bytes[off + 1]]);
                acc += part * f32::from_bits(u32::from(s) << 16);
            }
            acc
        }
        _ => {
            let mut acc = 0.0f32;
            for c in 0..cols {
                acc += w[r * cols + c] * x[c];
            }
            acc
        }
    }
}

const KINDS: [WeightKind; 7] = [
    WeightKind::F32,
    WeightKind::Bf16,
    WeightKind::F16,
    WeightKind::Int8,
    WeightKind::Int4 { group: 32 },
    WeightKind::Int4 { group: 16 },
    WeightKind::Int4 { group: 6 },
];

/// (I, H) shapes: odd for raw and int8, multiples of the group (but not of 2 x 16
/// lanes) for int4.
fn shapes(kind: WeightKind) -> Vec<(usize, usize)> {
    match kind {
        WeightKind::Int4 { group: 32 } => vec![(32, 96), (160, 224)],
        WeightKind::Int4 { group: 16 } => vec![(48, 80), (16, 16)],
        WeightKind::Int4 { group } => vec![(group * 3, group * 7)],
        _ => vec![(37, 53), (5, 17), (64, 256), (1, 1), (19, 200)],
    }
}

/// The dot product of `isa` on the kernels that keep activations in f32 (the VNNI
/// kernels, defaults where the CPU has them, round them to 8 bits: their own tests).
fn exact_dot(isa: Isa) -> cpu_kernels::Dot {
    cpu_kernels::Dot::new(isa)
        .unwrap()
        .with_int8_vnni(false)
        .with_int4_vnni(false)
}

/// The largest |a - b| over two results.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

fn available() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.available()).collect()
}

#[test]
fn this_cpu_runs_its_best_vector_path() {
    let best = Isa::best();
    assert!(best.available());
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512bf16") && std::is_x86_feature_detected!("avx512bw") {
        assert_eq!(best, Isa::Avx512Bf16);
    } else if std::is_x86_feature_detected!("avx512f") {
        assert_eq!(best, Isa::Avx512);
    }
    println!("kernels tested on: {:?}", available());
}

#[test]
fn row_dots_match_the_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for kind in KINDS {
        for (inter, hidden) in shapes(kind) {
            let format =
                ExpertFormat::new(kind, [(inter, hidden), (inter, hidden), (hidden, inter)])
                    .unwrap();
            let (bytes, w) = projection(&mut rng, kind, inter, hidden);
            let proj = format.view(0, &bytes).unwrap();
            let x: Vec<f32> = (0..hidden).map(|_| rng.f()).collect();
            for isa in available() {
                let dot = exact_dot(isa);
                for r in 0..inter {
                    let want = reference_dot(kind, &bytes, &w, inter, hidden, r, &x);
                    let got = dot.dot(&proj, r, &x);
                    let scale: f32 = (0..hidden).map(|c| (w[r * hidden + c] * x[c]).abs()).sum();
                    if isa == Isa::Scalar {
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{kind:?} {inter}x{hidden} row {r}"
                        );
                    } else {
                        let err = (got - want).abs();
                        assert!(
                            err <= 1e-5 * scale + 1e-30,
                            "{isa:?} {kind:?} {inter}x{hidden} row {r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn four_token_dots_equal_one_token_dots_bit_for_bit() {
    // The layer call serves tokens four at a time from one read of each weight row;
    // a token's result must not depend on the batch it came in.
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for kind in KINDS {
        for (inter, hidden) in shapes(kind) {
            let format =
                ExpertFormat::new(kind, [(inter, hidden), (inter, hidden), (hidden, inter)])
                    .unwrap();
            let (bytes, _) = projection(&mut rng, kind, inter, hidden);
            let proj = format.view(0, &bytes).unwrap();
            let xs: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..hidden).map(|_| rng.f()).collect())
                .collect();
            for isa in available() {
                let dot = exact_dot(isa);
                for r in 0..inter {
                    let four = dot.dots(&proj, r, [&xs[0], &xs[1], &xs[2], &xs[3]]);
                    for (t, got) in four.iter().enumerate() {
                        let want = dot.dot(&proj, r, &xs[t]);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{isa:?} {kind:?} {inter}x{hidden} row {r} token {t}"
                        );
                    }
                }
            }
        }
    }
}

struct Layer {
    format: ExpertFormat,
    slabs: Vec<[Vec<u8>; 3]>,
    x: Vec<f32>,
    ids: Vec<i64>,
    weights: Vec<f32>,
    top_k: usize,
}

impl Layer {
    fn new(rng: &mut Rng, kind: WeightKind, inter: usize, hidden: usize, tokens: usize) -> Self {
        let (n_experts, top_k) = (6, 3);
        let format =
            ExpertFormat::new(kind, [(inter, hidden), (inter, hidden), (hidden, inter)]).unwrap();
        let slabs = (0..n_experts)
            .map(|_| {
                [
                    projection(rng, kind, inter, hidden).0,
                    projection(rng, kind, inter, hidden).0,
                    projection(rng, kind, hidden, inter).0,
                ]
            })
            .collect();
        let x = (0..tokens * hidden).map(|_| rng.f()).collect();
        let mut ids = Vec::new();
        for _ in 0..tokens {
            let mut pick: Vec<i64> = Vec::new();
            while pick.len() < top_k {
                let e = (rng.next() % n_experts as u64) as i64;
                if !pick.contains(&e) {
                    pick.push(e);
                }
            }
            ids.extend(pick);
        }
        let weights = (0..tokens * top_k).map(|_| rng.f().abs()).collect();
        Self {
            format,
            slabs,
            x,
            ids,
            weights,
            top_k,
        }
    }

    fn experts(&self, which: impl Fn(u32) -> bool) -> Vec<(u32, ExpertWeights<'_>)> {
        self.slabs
            .iter()
            .enumerate()
            .filter(|(e, _)| which(*e as u32))
            .map(|(e, s)| {
                let w = ExpertWeights::new(&self.format, [&s[0], &s[1], &s[2]]).unwrap();
                (e as u32, w)
            })
            .collect()
    }

    fn routing(&self) -> Routing<'_> {
        Routing {
            x: &self.x,
            ids: &self.ids,
            top_k: self.top_k,
            n_experts: self.slabs.len(),
        }
    }

    /// Every expert's outputs by `k`'s `expert_outputs`, waiting on `ready`.
    fn outputs(&self, k: &Kernels, ready: &impl Ready, y: &mut [f32]) -> cpu_kernels::Result<()> {
        let experts = self.experts(|_| true);
        k.expert_outputs(&self.format, &self.routing(), &experts, ready, y)
    }

    fn run(&self, isa: Isa, threads: usize) -> Vec<f32> {
        self.run_from(isa, threads, cpu_kernels::TILE_MIN_TOKENS)
    }

    /// [`Self::run`] with the prompt path taken from `tile_min` tokens per expert.
    fn run_from(&self, isa: Isa, threads: usize, tile_min: usize) -> Vec<f32> {
        self.run_rounded(isa, threads, tile_min, false)
    }

    /// [`Self::run_from`], hidden rows rounded to bf16 before down with `round`.
    fn run_rounded(&self, isa: Isa, threads: usize, tile_min: usize, round: bool) -> Vec<f32> {
        self.run_with(isa, threads, tile_min, round, false)
    }

    /// [`Self::run_rounded`], int4 rows through the lanes kernel with `lanes` (else the
    /// AVX-512 BF16 one, whatever the CPU's default).
    fn run_with(
        &self,
        isa: Isa,
        threads: usize,
        tile_min: usize,
        round: bool,
        lanes: bool,
    ) -> Vec<f32> {
        let mut k = Kernels::new(isa, threads).unwrap();
        k.set_tile_min_tokens(tile_min);
        k.set_round_hidden(round);
        k.set_int4_lanes(lanes);
        k.set_int8_vnni(false); // the exact kernels (the VNNI ones: their own tests)
        k.set_int4_vnni(false);
        self.call(&k)
    }

    /// The layer through `k`'s `moe_layer`, every expert resident.
    fn call(&self, k: &Kernels) -> Vec<f32> {
        let mut out = vec![0.0; self.x.len()];
        k.moe_layer(
            &self.format,
            &self.routing(),
            &self.experts(|_| true),
            &self.weights,
            &mut out,
        )
        .unwrap();
        out
    }

    /// The layer from the reference dots: silu(g) * u, down, rank-order weighted sum.
    fn reference(&self) -> Vec<f32> {
        self.reference_rounded(false)
    }

    /// [`Self::reference`], silu(g) * u rounded to bf16 with `round`.
    fn reference_rounded(&self, round: bool) -> Vec<f32> {
        let (i, h) = (self.format.inter(), self.format.hidden());
        let kind = self.format.kind;
        let mut out = vec![0.0f32; self.x.len()];
        for t in 0..self.x.len() / h {
            let x = &self.x[t * h..(t + 1) * h];
            for k in 0..self.top_k {
                let s = &self.slabs[self.ids[t * self.top_k + k] as usize];
                let mid: Vec<f32> = (0..i)
                    .map(|r| {
                        let g = reference_dot(kind, &s[0], &decode(kind, &s[0], i, h), i, h, r, x);
                        let u = reference_dot(kind, &s[1], &decode(kind, &s[1], i, h), i, h, r, x);
                        let h = g / (1.0 + (-g).exp()) * u;
                        if round {
                            cpu_kernels::bf16_round(h)
                        } else {
                            h
                        }
                    })
                    .collect();
                let w = self.weights[t * self.top_k + k];
                for r in 0..h {
                    let y = reference_dot(kind, &s[2], &decode(kind, &s[2], h, i), h, i, r, &mid);
                    out[t * h + r] = if k == 0 {
                        y * w
                    } else {
                        out[t * h + r] + y * w
                    };
                }
            }
        }
        out
    }
}

/// Raw weights as f32 (only the raw kinds read them in `reference_dot`).
fn decode(kind: WeightKind, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let n = rows * cols;
    match kind {
        WeightKind::F32 => bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        WeightKind::Bf16 => bytes
            .chunks(2)
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect(),
        WeightKind::F16 => bytes
            .chunks(2)
            .map(|b| cpu_kernels::f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        _ => vec![0.0; n],
    }
}

/// The int4 lanes kernel (Intel's default) in the layer call, on shapes it takes (columns
/// a multiple of 128, groups of 32, 64, 128): within the tolerance of the reference,
/// the same bits on 1 and 3 threads, with hidden rows rounded or not, one token and five
/// (rows, four-token dots and the prompt path).
#[test]
fn layer_call_through_the_int4_lanes_kernel_matches_the_reference() {
    let mut rng = Rng(0x1a4e_5000_0000_0007);
    for (group, inter, hidden) in [(32, 128, 256), (64, 256, 128), (128, 128, 384)] {
        let kind = WeightKind::Int4 { group };
        for tokens in [1, 5] {
            let layer = Layer::new(&mut rng, kind, inter, hidden, tokens);
            for round in [false, true] {
                let want = layer.reference_rounded(round);
                let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for isa in available() {
                    let one = layer.run_with(isa, 1, cpu_kernels::TILE_MIN_TOKENS, round, true);
                    let three = layer.run_with(isa, 3, cpu_kernels::TILE_MIN_TOKENS, round, true);
                    assert_eq!(one, three, "{isa:?} group {group}: thread count changed it");
                    let err = max_diff(&one, &want);
                    // A hidden value at a rounding tie may round the other way: one bf16
                    // step of one of down's inputs (as in the test of rounded rows).
                    let tol = if round { 2e-3 } else { 1e-4 };
                    assert!(
                        err <= tol * scale,
                        "{isa:?} group {group} T={tokens} round {round}: {err} vs {scale}"
                    );
                }
            }
        }
    }
}

#[test]
fn layer_call_matches_the_reference_on_any_thread_count() {
    let mut rng = Rng(12345);
    for kind in KINDS {
        let (inter, hidden) = shapes(kind)[0];
        for tokens in [1, 5] {
            let layer = Layer::new(&mut rng, kind, inter, hidden, tokens);
            let want = layer.reference();
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for isa in available() {
                let one = layer.run(isa, 1);
                let three = layer.run(isa, 3);
                assert_eq!(
                    one, three,
                    "{isa:?} {kind:?}: thread count changed the result"
                );
                if isa == Isa::Scalar {
                    assert_eq!(
                        one, want,
                        "{kind:?}: scalar layer differs from the reference"
                    );
                } else {
                    let err = max_diff(&one, &want);
                    assert!(
                        err <= 1e-4 * scale,
                        "{isa:?} {kind:?} T={tokens}: {err} vs {scale}"
                    );
                }
            }
        }
    }
}

/// The prompt path (experts with many tokens, AVX-512: `tile.rs`) on odd shapes (rows
/// and columns not multiples of its 16-row vectors, 64-row blocks or 16-column
/// transposes; int4 groups), token counts not multiples of its 6-token blocks, experts
/// split by tokens across tasks: within
/// the vector paths' tolerance of the reference and of the row dot products, the same
/// bytes on any thread count, and with bf16-exact activations (the BF16 kernels' input)
/// as well.
#[test]
fn prompt_path_matches_the_reference_on_odd_shapes() {
    let mut rng = Rng(97531);
    for kind in KINDS {
        for (inter, hidden) in shapes(kind) {
            // 100 tokens: ~50 per expert, split by tokens across tasks on the pool
            let big = if inter * hidden >= 10_000 { 100 } else { 23 };
            for tokens in [4, 9, 23, big] {
                for bf16_x in [false, tokens < 100] {
                    let mut layer = Layer::new(&mut rng, kind, inter, hidden, tokens);
                    if bf16_x {
                        for v in &mut layer.x {
                            *v = f32::from_bits(v.to_bits() & 0xffff_0000);
                        }
                    }
                    let want = layer.reference();
                    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    for isa in available() {
                        let tiled = layer.run_from(isa, 1, 1);
                        let dots = layer.run_from(isa, 1, usize::MAX);
                        for threads in [2, 3] {
                            assert_eq!(
                                tiled,
                                layer.run_from(isa, threads, 1),
                                "{isa:?} {kind:?} T={tokens}: threads changed the result"
                            );
                        }
                        for (what, got) in [("reference", &want), ("row dots", &dots)] {
                            let err = max_diff(&tiled, got);
                            assert!(
                                err <= 1e-4 * scale,
                                "{isa:?} {kind:?} {inter}x{hidden} T={tokens}: {err} vs {what} ({scale})"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Hidden rows rounded to bf16 (the CPU side of a bf16 model on CUDA): the scalar
/// layer equals the rounded reference bit for bit; every path (row dots, the prompt
/// path, any thread count) stays within rounding of it; and the rows really are
/// rounded (the result differs from the unrounded layer's).
#[test]
fn rounded_hidden_rows_match_the_rounded_reference() {
    let mut rng = Rng(86420);
    for kind in KINDS {
        let (inter, hidden) = shapes(kind)[0];
        for tokens in [1, 9] {
            let layer = Layer::new(&mut rng, kind, inter, hidden, tokens);
            let want = layer.reference_rounded(true);
            assert_ne!(
                want,
                layer.reference(),
                "{kind:?}: rounding changed nothing"
            );
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for isa in available() {
                let one = layer.run_rounded(isa, 1, usize::MAX, true);
                assert_eq!(
                    one,
                    layer.run_rounded(isa, 3, usize::MAX, true),
                    "{isa:?} {kind:?}"
                );
                if isa == Isa::Scalar {
                    assert_eq!(
                        one, want,
                        "{kind:?}: scalar layer differs from the reference"
                    );
                }
                for got in [one, layer.run_rounded(isa, 1, 1, true)] {
                    let err = max_diff(&got, &want);
                    // a hidden value at a rounding tie may round the other way: one
                    // bf16 step of one of down's inputs
                    assert!(
                        err <= 2e-3 * scale,
                        "{isa:?} {kind:?} T={tokens}: {err} vs {scale}"
                    );
                }
            }
        }
    }
}

#[test]
fn bf16_round_is_round_to_nearest_even() {
    use cpu_kernels::bf16_round;
    let one = 1.0f32.to_bits();
    assert_eq!(
        bf16_round(f32::from_bits(one | 0x7fff)),
        1.0,
        "below half: down"
    );
    assert_eq!(
        bf16_round(f32::from_bits(one | 0x8001)).to_bits(),
        one + 0x1_0000,
        "above: up"
    );
    assert_eq!(
        bf16_round(f32::from_bits(one | 0x8000)),
        1.0,
        "tie to the even 1.0"
    );
    let odd = one + 0x1_0000;
    assert_eq!(
        bf16_round(f32::from_bits(odd | 0x8000)).to_bits(),
        odd + 0x1_0000,
        "tie: up"
    );
    assert_eq!(bf16_round(-2.5e-3).to_bits() & 0xffff, 0);
    assert!(bf16_round(f32::NAN).is_nan());
    assert_eq!(bf16_round(f32::INFINITY), f32::INFINITY);
    assert_eq!(
        bf16_round(f32::MAX),
        f32::INFINITY,
        "past bf16's largest: infinity"
    );
}

/// Calls of at least 1 Mi multiply-adds run on the pool (smaller ones on the calling
/// thread alone): the same bytes as one thread.
#[test]
fn calls_large_enough_for_the_pool_match_one_thread() {
    let mut rng = Rng(2468);
    for kind in KINDS {
        let (inter, hidden) = shapes(kind)[0];
        // 3 x K = 9 multiply-adds per (inter, hidden) cell and token; 2 Mi in all.
        let tokens = (2usize << 20).div_ceil(inter * hidden * 9);
        let layer = Layer::new(&mut rng, kind, inter, hidden, tokens);
        for isa in available() {
            let one = layer.run(isa, 1);
            for threads in [2, 3] {
                assert_eq!(
                    one,
                    layer.run(isa, threads),
                    "{isa:?} {kind:?} T={tokens}: {threads} threads changed the result"
                );
            }
        }
    }
}

#[test]
fn waves_give_the_bytes_of_one_call() {
    let mut rng = Rng(777);
    // 64 tokens: each wave is above the pool's 1 Mi multiply-adds.
    let layer = Layer::new(&mut rng, WeightKind::Bf16, 64, 96, 64);
    let k = Kernels::new(Isa::best(), 2).unwrap();
    let whole = layer.run(Isa::best(), 2);
    let mut y = vec![f32::NAN; layer.ids.len() * 96];
    for wave in [[0u32, 4], [2, 5], [1, 3]] {
        let ex = layer.experts(|e| wave.contains(&e));
        k.expert_outputs(&layer.format, &layer.routing(), &ex, &AllReady, &mut y)
            .unwrap();
    }
    let mut out = vec![0.0; layer.x.len()];
    weighted_sum(&y, &layer.weights, layer.top_k, 96, &mut out).unwrap();
    assert_eq!(out, whole);
}

/// Projections land one by one in a random order on another thread.
struct Landing {
    landed: Mutex<Vec<[bool; 3]>>,
    cv: Condvar,
    waits: AtomicUsize,
}

impl Ready for Landing {
    fn wait(&self, expert: u32, proj: usize) -> Result<(), String> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let mut g = self.landed.lock().unwrap();
        while !g[expert as usize][proj] {
            g = self.cv.wait(g).unwrap();
        }
        Ok(())
    }
}

#[test]
fn waiting_on_landings_in_random_order_gives_the_same_result() {
    let mut rng = Rng(4242);
    // 48 tokens: above the pool's 1 Mi multiply-adds.
    let layer = Layer::new(&mut rng, WeightKind::Int4 { group: 32 }, 64, 96, 48);
    let want = layer.run(Isa::best(), 2);
    for seed in 1..=4u64 {
        let mut order: Vec<(usize, usize)> = (0..6).flat_map(|e| [(e, 1), (e, 2)]).collect();
        let mut r = Rng(seed * 99991);
        for i in (1..order.len()).rev() {
            order.swap(i, (r.next() % (i as u64 + 1)) as usize);
        }
        // Down only counts as landed after gate/up (the engine's flags are cumulative).
        let ready = Landing {
            landed: Mutex::new(vec![[true, false, false]; 6]),
            cv: Condvar::new(),
            waits: AtomicUsize::new(0),
        };
        let k = Kernels::new(Isa::best(), 2).unwrap();
        let mut y = vec![0.0; layer.ids.len() * 96];
        std::thread::scope(|s| {
            s.spawn(|| {
                for (e, p) in order {
                    std::thread::sleep(Duration::from_micros(300));
                    let mut g = ready.landed.lock().unwrap();
                    g[e][p] = true;
                    if p == 2 {
                        g[e][1] = true;
                    }
                    ready.cv.notify_all();
                }
            });
            layer.outputs(&k, &ready, &mut y).unwrap();
        });
        let mut out = vec![0.0; layer.x.len()];
        weighted_sum(&y, &layer.weights, layer.top_k, 96, &mut out).unwrap();
        assert_eq!(out, want, "landing order {seed}");
        assert!(ready.waits.load(Ordering::Relaxed) >= 2 * 6);
    }
}

/// One expert's read fails (its gate/up or its down).
struct Failing {
    expert: u32,
    proj: usize,
}

impl Ready for Failing {
    fn wait(&self, expert: u32, proj: usize) -> Result<(), String> {
        if expert == self.expert && proj == self.proj {
            return Err(format!("expert {expert} failed its checksum"));
        }
        Ok(())
    }
}

/// A failed read ends the call with its error: the down tasks waiting for the failed
/// expert's gate/up stop instead of waiting forever, on one thread and on the pool.
#[test]
fn a_failed_read_is_the_calls_error() {
    let mut rng = Rng(31337);
    // 48 tokens: above the pool's 1 Mi multiply-adds.
    let layer = Layer::new(&mut rng, WeightKind::Int4 { group: 32 }, 64, 96, 48);
    for threads in [1, 2, 3] {
        let k = Kernels::new(Isa::best(), threads).unwrap();
        for (expert, proj) in [(0, 1), (3, 1), (5, 2)] {
            let mut y = vec![f32::NAN; layer.ids.len() * 96];
            let got = layer.outputs(&k, &Failing { expert, proj }, &mut y);
            match got {
                Err(KernelError::NotReady { expert: e, message }) => {
                    assert_eq!(e, expert);
                    assert!(message.contains("checksum"), "{message}");
                }
                other => panic!("{threads} threads, expert {expert} proj {proj}: {other:?}"),
            }
            // An expert whose gate/up failed never reaches down: its rows stay unwritten.
            for (p, &id) in layer.ids.iter().enumerate() {
                if id == i64::from(expert) {
                    let row = &y[p * 96..(p + 1) * 96];
                    assert!(row.iter().all(|v| v.is_nan()) || proj == 2, "position {p}");
                }
            }
        }
        // The same kernels still work after a failed call.
        let mut y = vec![0.0; layer.ids.len() * 96];
        layer.outputs(&k, &AllReady, &mut y).unwrap();
        let mut out = vec![0.0; layer.x.len()];
        weighted_sum(&y, &layer.weights, layer.top_k, 96, &mut out).unwrap();
        assert_eq!(out, layer.run(Isa::best(), 1));
    }
}

#[test]
fn bad_calls_are_errors_not_panics() {
    let mut rng = Rng(5);
    let mut layer = Layer::new(&mut rng, WeightKind::Int8, 8, 16, 2);
    let k = Kernels::new(Isa::Scalar, 1).unwrap();
    let mut out = vec![0.0; layer.x.len()];
    let some = layer.experts(|e| e != layer.ids[0] as u32);
    let err = k.moe_layer(
        &layer.format,
        &layer.routing(),
        &some,
        &layer.weights,
        &mut out,
    );
    assert!(
        matches!(err, Err(KernelError::MissingExpert { .. })),
        "{err:?}"
    );
    let mut short = vec![0.0; 3];
    let all = layer.experts(|_| true);
    let err = k.moe_layer(
        &layer.format,
        &layer.routing(),
        &all,
        &layer.weights,
        &mut short,
    );
    assert!(matches!(err, Err(KernelError::BadLength { .. })), "{err:?}");
    drop(all);
    drop(some);
    layer.ids[1] = 99;
    let all = layer.experts(|_| true);
    let err = k.moe_layer(
        &layer.format,
        &layer.routing(),
        &all,
        &layer.weights,
        &mut out,
    );
    assert!(
        matches!(err, Err(KernelError::ExpertOutOfRange { id: 99, .. })),
        "{err:?}"
    );
    assert!(layer.format.view(0, &[0u8; 7]).is_err());
    assert!(matches!(
        Isa::parse("neon"),
        Err(KernelError::UnknownIsa { .. })
    ));
}

/// `Dot::rows_act` gives each row the bits of its own `dot_act`, for the kinds
/// `prepared_kernels_match_the_reference` does not cover (plain rows: the f32 kernels),
/// ranges running past the last row included.
#[test]
fn rows_in_one_call_are_each_rows_own_dot() {
    let mut rng = Rng(0x0bad_cafe_1234_5678);
    let plain = vec![(7, 33), (64, 256), (5, 1)];
    for (kind, shapes) in [
        (WeightKind::F32, plain.clone()),
        (WeightKind::F16, plain.clone()),
        (WeightKind::Int8, plain),
        (WeightKind::Int4 { group: 16 }, vec![(16, 80), (32, 16)]),
    ] {
        for (rows, cols) in shapes {
            let format =
                ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
            let (bytes, _) = projection(&mut rng, kind, rows, cols);
            let proj = format.view(0, &bytes).unwrap();
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            for (isa, at_once) in available()
                .into_iter()
                .flat_map(|i| [(i, 1), (i, 2), (i, 4)])
            {
                let dot = exact_dot(isa).with_rows(at_once);
                let act = dot.prepare(kind, &x);
                for (r0, r1) in [(0, rows), (rows / 2, rows), (rows - 1, rows + 2)] {
                    let mut got = vec![f32::NAN; r1 - r0];
                    dot.rows_act(&proj, r0, &act, &mut got);
                    for (i, v) in got.iter().enumerate() {
                        let one = dot.dot_act(&proj, r0 + i, &act);
                        assert_eq!(
                            v.to_bits(),
                            one.to_bits(),
                            "{isa:?} {kind:?} {rows}x{cols}, {at_once} rows at once"
                        );
                    }
                }
            }
        }
    }
}

/// The kernels that read prepared activations (AVX-512 BF16 planes for bf16 rows, the
/// int4 column order for int4 rows with groups of 32, 64, 128): against the reference
/// on shapes around the 32- and 64-column steps, with activations that are exactly bf16
/// (one plane), 16-bit (two) and full f32 (three). Tolerance as every vector path:
/// 1e-5 of the row's sum of |w * x| (products are exact; only the order of the adds
/// differs from the reference).
#[test]
fn prepared_kernels_match_the_reference() {
    let mut rng = Rng(0x5151_7777_0000_0001);
    let cases: Vec<(WeightKind, usize, usize)> = vec![
        (WeightKind::Bf16, 3, 1),
        (WeightKind::Bf16, 5, 31),
        (WeightKind::Bf16, 4, 32),
        (WeightKind::Bf16, 7, 33),
        (WeightKind::Bf16, 3, 64),
        (WeightKind::Bf16, 6, 96),
        (WeightKind::Bf16, 2, 127),
        (WeightKind::Bf16, 9, 2048),
        (WeightKind::Int4 { group: 32 }, 32, 32),
        (WeightKind::Int4 { group: 32 }, 32, 96),
        (WeightKind::Int4 { group: 64 }, 64, 192),
        (WeightKind::Int4 { group: 128 }, 128, 384),
        (WeightKind::Int4 { group: 32 }, 32, 128),
        (WeightKind::Int4 { group: 32 }, 64, 384),
        (WeightKind::Int4 { group: 64 }, 64, 256),
        (WeightKind::Int4 { group: 128 }, 128, 256),
        (WeightKind::Int4 { group: 256 }, 256, 512),
    ];
    for (kind, rows, cols) in cases {
        let format = ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
        let (bytes, w) = projection(&mut rng, kind, rows, cols);
        let proj = format.view(0, &bytes).unwrap();
        let full: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
        for (planes, keep) in [(3, 0xffff_ffffu32), (2, 0xffff_ff00), (1, 0xffff_0000)] {
            let x: Vec<f32> = full
                .iter()
                .map(|v| f32::from_bits(v.to_bits() & keep))
                .collect();
            // int4 rows through the AVX-512 BF16 kernel and through the lanes kernel (the
            // default on Intel CPUs), on every instruction set (elsewhere the same).
            for (isa, lanes) in available()
                .into_iter()
                .flat_map(|i| [(i, false), (i, true)])
            {
                let dot = exact_dot(isa).with_int4_lanes(lanes);
                let act = dot.prepare(kind, &x);
                if isa == Isa::Avx512Bf16 && kind == WeightKind::Bf16 {
                    // Only rows that are exactly bf16 take the BF16 kernel.
                    let want = usize::from(planes == 1);
                    assert_eq!(act.bf16_planes(), want, "{cols} columns");
                }
                if isa == Isa::Avx512Bf16 && matches!(kind, WeightKind::Int4 { .. }) {
                    let want = match (lanes, planes, cols % 128) {
                        (true, _, 0) => "int4-lanes",
                        (false, 1, 0) => "int4-bf16",
                        _ => "int4",
                    };
                    assert_eq!(act.prepared(), want, "{kind:?} {cols} columns");
                }
                for r in 0..rows {
                    let want = reference_dot(kind, &bytes, &w, rows, cols, r, &x);
                    let got = dot.dot_act(&proj, r, &act);
                    let scale: f32 = (0..cols).map(|c| (w[r * cols + c] * x[c]).abs()).sum();
                    assert!(
                        (got - want).abs() <= 1e-5 * scale + 1e-30,
                        "{isa:?} {kind:?} {rows}x{cols} planes {planes} row {r} lanes {lanes}: \
                         {got} vs {want}"
                    );
                    let four = dot.dots_act(&proj, r, [&act, &act, &act, &act]);
                    assert!(four.iter().all(|v| v.to_bits() == got.to_bits()));
                }
                // Any range of rows in one call, one, two or four rows at once: the bits
                // of each row's own dot.
                for (r0, r1, at_once) in [
                    (0, rows),
                    (rows / 3, rows),
                    (rows / 2, rows / 2 + 1),
                    (rows - 1, rows + 2), // past the last row: as dot_act there
                ]
                .into_iter()
                .flat_map(|(r0, r1)| [(r0, r1, 1), (r0, r1, 2), (r0, r1, 4)])
                {
                    let mut got = vec![f32::NAN; r1.saturating_sub(r0)];
                    dot.with_rows(at_once).rows_act(&proj, r0, &act, &mut got);
                    for (i, v) in got.iter().enumerate() {
                        let one = dot.dot_act(&proj, r0 + i, &act);
                        assert_eq!(
                            v.to_bits(),
                            one.to_bits(),
                            "{isa:?} {kind:?} rows {r0}..{r1}, {at_once} at once"
                        );
                    }
                }
            }
        }
    }
}

/// The int8 VNNI kernel (8-bit activations, `Dot::with_int8_vnni`), where the CPU has
/// it: against its own scalar reference (`cpu_kernels::dot_q8`: the same rounded
/// activation, exact integer sums) within the vector paths' tolerance; against the f32
/// reference within the activation's rounding (half a step of each 32-column block's
/// scale per column); rows at once, rows in one call and four-token dots bit for bit as
/// one row at a time; rows of other widths and non-finite activations through the f32
/// kernels unchanged.
#[test]
fn int8_vnni_kernel_matches_its_reference() {
    let mut rng = Rng(0x0b0b_1234_5678_9abc);
    let kind = WeightKind::Int8;
    let mut ran = false;
    for (rows, cols) in [(5, 64), (7, 128), (9, 192), (6, 768), (4, 2048), (3, 100)] {
        let format = ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
        let (bytes, w) = projection(&mut rng, kind, rows, cols);
        let proj = format.view(0, &bytes).unwrap();
        let mut x: Vec<f32> = (0..cols).map(|_| rng.f() * 2.0).collect();
        for v in x.iter_mut().take(32) {
            *v = 0.0; // a block of zeros: scale 0
        }
        if let Some(v) = x.get_mut(40) {
            *v = 50.0; // an outlier in its block
        }
        for isa in available() {
            let plain = cpu_kernels::Dot::new(isa).unwrap().with_int8_vnni(false);
            let dot = plain.with_int8_vnni(true);
            if !dot.int8_vnni() {
                continue; // no VNNI here (or not an AVX-512 path)
            }
            ran = true;
            let act = dot.prepare(kind, &x);
            let vnni = cols % 64 == 0;
            assert_eq!(
                act.prepared(),
                if vnni { "int8-vnni" } else { "f32" },
                "{cols}"
            );
            for r in 0..rows {
                let got = dot.dot_act(&proj, r, &act);
                let exact = reference_dot(kind, &bytes, &w, rows, cols, r, &x);
                if !vnni {
                    let same = plain.dot_act(&proj, r, &plain.prepare(kind, &x));
                    assert_eq!(
                        got.to_bits(),
                        same.to_bits(),
                        "{cols} columns: the f32 kernel"
                    );
                    continue;
                }
                let want = cpu_kernels::dot_q8(&proj, r, &x).unwrap();
                let size: f32 = (0..cols).map(|c| (w[r * cols + c] * x[c]).abs()).sum();
                assert!(
                    (got - want).abs() <= 1e-5 * size * 1.05 + 1e-30,
                    "{isa:?} {rows}x{cols} row {r}: {got} vs its reference {want}"
                );
                // each q is within half a step of x / scale
                let step: f32 = (0..cols)
                    .map(|c| {
                        let block = &x[c / 32 * 32..(c / 32 + 1) * 32];
                        let top = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        w[r * cols + c].abs() * top / 127.0 * 0.5
                    })
                    .sum();
                assert!(
                    (got - exact).abs() <= step * 1.01 + 1e-5 * size,
                    "{isa:?} {rows}x{cols} row {r}: {got} vs f32 {exact} (bound {step})"
                );
            }
            for at_once in [1, 2, 4] {
                let d = dot.with_rows(at_once);
                let mut all = vec![f32::NAN; rows];
                d.rows_act(&proj, 0, &act, &mut all);
                for (r, v) in all.iter().enumerate() {
                    let one = dot.dot_act(&proj, r, &act);
                    assert_eq!(v.to_bits(), one.to_bits(), "{cols}: {at_once} rows at once");
                }
            }
            let four = dot.dots_act(&proj, 1, [&act, &act, &act, &act]);
            let one = dot.dot_act(&proj, 1, &act);
            assert!(
                four.iter().all(|v| v.to_bits() == one.to_bits()),
                "{cols}: four tokens"
            );
            let mut bad = x.clone();
            bad[3] = f32::NAN;
            assert_eq!(
                dot.prepare(kind, &bad).prepared(),
                "f32",
                "a NaN keeps the f32 kernels"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    assert!(
        ran || !std::is_x86_feature_detected!("avx512vnni"),
        "the kernel never ran"
    );
}

/// The layer call with int8 and int4 rows through the VNNI kernels: the same bytes on 1 and 3
/// threads, one token (the row kernels) and five (the prompt path, f32 tiles),
/// within the activation's rounding of the f32 kernels' result.
#[test]
fn layer_call_through_the_vnni_kernels() {
    let mut rng = Rng(0x0b0b_0000_0000_0002);
    for (kind, inter, hidden) in [
        (WeightKind::Int8, 128, 256),
        (WeightKind::Int8, 64, 192),
        (WeightKind::Int4 { group: 32 }, 128, 256),
        (WeightKind::Int4 { group: 64 }, 256, 128),
    ] {
        for tokens in [1, 5] {
            let layer = Layer::new(&mut rng, kind, inter, hidden, tokens);
            let want = layer.run_from(Isa::best(), 1, cpu_kernels::TILE_MIN_TOKENS);
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let run = |threads: usize| {
                let mut k = Kernels::new(Isa::best(), threads).unwrap();
                k.set_int8_vnni(true);
                k.set_int4_vnni(true);
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx512vnni") {
                    assert!(k.variants(kind).contains("vnni"), "{}", k.variants(kind));
                }
                layer.call(&k)
            };
            let (one, three) = (run(1), run(3));
            assert_eq!(
                one, three,
                "{inter}x{hidden} T={tokens}: thread count changed it"
            );
            let err = max_diff(&one, &want);
            assert!(
                err <= 3e-2 * scale,
                "{inter}x{hidden} T={tokens}: {err} vs {scale}"
            );
        }
    }
}

/// The int4 VNNI kernel (8-bit activations, `Dot::with_int4_vnni`), where the CPU has
/// it: against its scalar reference (`cpu_kernels::dot_q4`) within the vector paths'
/// tolerance, against the f32 reference within the activation's rounding, rows at once
/// and four-token dots bit for bit as one row; groups that are not a multiple of 32 and
/// rows that are not of 128 columns through the other int4 kernels unchanged.
#[test]
fn int4_vnni_kernel_matches_its_reference() {
    let mut rng = Rng(0x0b0b_4444_5678_9abc);
    let mut ran = false;
    // (down's columns are gate's rows: a multiple of the group too)
    for (group, rows, cols) in [
        (32, 32, 128),
        (32, 64, 256),
        (64, 64, 384),
        (128, 128, 768),
        (256, 256, 512),
        (32, 32, 2048),
        (16, 16, 128),
        (32, 32, 96),
        (96, 96, 384), // a 128-column step across two groups: the other kernels
        (192, 192, 768),
    ] {
        let kind = WeightKind::Int4 { group };
        let format = ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
        let (bytes, w) = projection(&mut rng, kind, rows, cols);
        let proj = format.view(0, &bytes).unwrap();
        let mut x: Vec<f32> = (0..cols).map(|_| rng.f() * 2.0).collect();
        for v in x.iter_mut().skip(32).take(32) {
            *v = 0.0;
        }
        if let Some(v) = x.get_mut(7) {
            *v = -40.0;
        }
        for isa in available() {
            let other = cpu_kernels::Dot::new(isa).unwrap().with_int4_vnni(false);
            let dot = other.with_int4_vnni(true);
            if !dot.int4_vnni() {
                continue;
            }
            ran = true;
            let act = dot.prepare(kind, &x);
            let vnni = matches!(group, 32 | 64) || group % 128 == 0;
            let vnni = vnni && cols % 128 == 0 && cols % group == 0;
            assert_eq!(
                act.prepared() == "int4-vnni",
                vnni,
                "group {group}, {cols} columns"
            );
            for r in 0..rows {
                let got = dot.dot_act(&proj, r, &act);
                if !vnni {
                    let same = other.dot_act(&proj, r, &other.prepare(kind, &x));
                    assert_eq!(
                        got.to_bits(),
                        same.to_bits(),
                        "group {group}: the other kernels"
                    );
                    continue;
                }
                let want = cpu_kernels::dot_q4(&proj, r, &x).unwrap();
                let size: f32 = (0..cols).map(|c| (w[r * cols + c] * x[c]).abs()).sum();
                assert!(
                    (got - want).abs() <= 2e-5 * size + 1e-30,
                    "{isa:?} group {group} {rows}x{cols} row {r}: {got} vs its reference {want}"
                );
                let exact = reference_dot(kind, &bytes, &w, rows, cols, r, &x);
                let step: f32 = (0..cols)
                    .map(|c| {
                        let block = &x[c / 32 * 32..(c / 32 + 1) * 32];
                        let top = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        w[r * cols + c].abs() * top / 127.0 * 0.5
                    })
                    .sum();
                assert!(
                    (got - exact).abs() <= step * 1.01 + 2e-5 * size,
                    "{isa:?} group {group} row {r}: {got} vs f32 {exact} (bound {step})"
                );
            }
            for at_once in [1, 2, 4] {
                let d = dot.with_rows(at_once);
                let mut all = vec![f32::NAN; rows];
                d.rows_act(&proj, 0, &act, &mut all);
                for (r, v) in all.iter().enumerate() {
                    let one = dot.dot_act(&proj, r, &act);
                    assert_eq!(
                        v.to_bits(),
                        one.to_bits(),
                        "group {group}: {at_once} at once"
                    );
                }
            }
            let four = dot.dots_act(&proj, 1, [&act, &act, &act, &act]);
            let one = dot.dot_act(&proj, 1, &act);
            assert!(
                four.iter().all(|v| v.to_bits() == one.to_bits()),
                "four tokens"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    assert!(
        ran || !std::is_x86_feature_detected!("avx512vnni"),
        "the kernel never ran"
    );
}

/// Four different tokens through the VNNI kernels, one of them with a NaN (which keeps
/// the f32 kernels): each token's result is its one-token result, bit for bit.
#[test]
fn vnni_four_token_dots_follow_each_tokens_own_kernel() {
    let mut rng = Rng(0x0b0b_0000_0000_0003);
    for (kind, rows, cols) in [
        (WeightKind::Int8, 8, 128),
        (WeightKind::Int4 { group: 32 }, 32, 256),
    ] {
        let format = ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
        let (bytes, _) = projection(&mut rng, kind, rows, cols);
        let proj = format.view(0, &bytes).unwrap();
        let mut xs: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..cols).map(|_| rng.f()).collect())
            .collect();
        xs[2][5] = f32::NAN;
        for isa in available() {
            let dot = cpu_kernels::Dot::new(isa)
                .unwrap()
                .with_int8_vnni(true)
                .with_int4_vnni(true);
            let four = dot.dots(&proj, 3, [&xs[0], &xs[1], &xs[2], &xs[3]]);
            for (t, got) in four.iter().enumerate() {
                let one = dot.dot(&proj, 3, &xs[t]);
                assert_eq!(
                    got.to_bits(),
                    one.to_bits(),
                    "{isa:?} {kind:?} token {t}: {got} vs {one}"
                );
            }
        }
    }
}

/// Activations far below f32's normal range round to zeros (127 / largest would
/// overflow), not to +-127: the kernel and its reference stay within half a step.
#[test]
fn vnni_tiny_blocks_count_as_zeros() {
    let kind = WeightKind::Int8;
    let (rows, cols) = (2, 64);
    let format = ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
    let mut rng = Rng(0x0b0b_0000_0000_0004);
    let (bytes, w) = projection(&mut rng, kind, rows, cols);
    let proj = format.view(0, &bytes).unwrap();
    let mut x = vec![1.0e-37f32; cols];
    for v in x.iter_mut().skip(32) {
        *v = 0.5; // the second block is ordinary
    }
    let want = cpu_kernels::dot_q8(&proj, 1, &x).unwrap();
    let exact: f32 = (0..cols).map(|c| w[cols + c] * x[c]).sum();
    assert!(
        (want - exact).abs() <= 1e-3 * exact.abs().max(1e-30),
        "{want} vs {exact}"
    );
}
