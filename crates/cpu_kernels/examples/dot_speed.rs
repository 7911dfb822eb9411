//! Compute ceiling of the row dot products: one thread, a projection small enough to
//! stay in L2 (so memory bandwidth is out of the picture), weights per second per
//! instruction set and kind (best of 5 rounds). `cargo run --release -p cpu_kernels --example dot_speed`
//! [-- rows cols reps threads]. With `threads` given, only the layer call's kernels (the
//! best instruction set, a bf16-exact activation for bf16 and int4 rows, f32 for int8,
//! `Dot::rows_act` over all rows) run on that many threads at once, each on its own
//! copy: the compute ceiling per core with every core busy (clock speeds drop with
//! more cores running AVX-512), printed as the slowest, median and fastest thread.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

use std::time::Instant;

use cpu_kernels::{ExpertFormat, Isa, WeightKind};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let (rows, cols, reps) = (
        args.first().copied().unwrap_or(64),
        args.get(1).copied().unwrap_or(2048),
        args.get(2).copied().unwrap_or(400),
    );
    let threads = args.get(3).copied();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let x: Vec<f32> = (0..cols)
        .map(|_| (rnd() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect();
    let xb: Vec<f32> = x
        .iter()
        .map(|v| f32::from_bits(v.to_bits() & 0xffff_0000))
        .collect();
    println!(
        "x at {} mod 64, bf16-rounded x at {} mod 64",
        x.as_ptr() as usize % 64,
        xb.as_ptr() as usize % 64
    );
    for kind in [
        WeightKind::Bf16,
        WeightKind::Int8,
        WeightKind::Int4 { group: 32 },
    ] {
        let f = ExpertFormat::new(kind, [(rows, cols), (rows, cols), (cols, rows)]).unwrap();
        let mut bytes: Vec<u8> = (0..f.proj_bytes(0).unwrap()).map(|_| rnd() as u8).collect();
        if kind == WeightKind::Bf16 {
            // Finite weights in [-1, 1) (random bits would hold NaN and subnormals).
            for b in bytes.chunks_exact_mut(2) {
                let v = (rnd() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                b.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        } else {
            // Small positive scales at the end (int8: f32 per row, int4: bf16 per group).
            let n = bytes.len();
            let tail = if kind == WeightKind::Int8 {
                rows * 4
            } else {
                rows * cols / 32 * 2
            };
            for b in &mut bytes[n - tail..] {
                *b = 0x3c;
            }
        }
        if let Some(threads) = threads {
            on_threads(&f, kind, &bytes, (rows, cols, reps), &x, &xb, threads);
            continue;
        }
        let p = f.view(0, &bytes).unwrap();
        for isa in Isa::ALL
            .into_iter()
            .filter(|i| i.available() && *i != Isa::Scalar)
        {
            let dot = cpu_kernels::Dot::new(isa).unwrap();
            for (label, xv) in [("x f32 unprepared", &x), ("x f32", &x), ("x bf16", &xb)] {
                if label == "x bf16" && kind == WeightKind::Int8 {
                    continue;
                }
                // Unprepared: the plain f32 kernels as before prepared activations existed.
                let a = if label == "x f32 unprepared" {
                    cpu_kernels::Act::plain(xv)
                } else {
                    dot.prepare(kind, xv)
                };
                // Best of 5 rounds (the box is shared: the best round is the least disturbed).
                let mut sink = 0.0f32;
                let mut s = f64::INFINITY;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    for _ in 0..reps {
                        for r in 0..rows {
                            sink += dot.dot_act(&p, r, &a);
                        }
                    }
                    s = s.min(t0.elapsed().as_secs_f64());
                }
                let gw = (reps * rows * cols) as f64 / s / 1e9;
                let gb = (reps * rows * p.row_bytes()) as f64 / s / 1e9;
                let mut s4 = f64::INFINITY;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    for _ in 0..reps / 4 {
                        for r in 0..rows {
                            sink += dot.dots_act(&p, r, [&a, &a, &a, &a])[3];
                        }
                    }
                    s4 = s4.min(t0.elapsed().as_secs_f64());
                }
                println!(
                    "  four tokens: {:.2} G token-weights/s",
                    (reps / 4 * 4 * rows * cols) as f64 / s4 / 1e9
                );
                println!(
                    "{kind:?} {isa:?} {label} ({}): {gw:.2} G weights/s, {gb:.2} GB/s of weights (sink {sink:.1})",
                    a.prepared()
                );
            }
        }
    }
}

/// The rows kernel of the best instruction set on `threads` threads at once, each on its
/// own copy of `bytes` (so in its own L2): G weights/s per thread, best of 5 rounds.
fn on_threads(
    f: &ExpertFormat,
    kind: WeightKind,
    bytes: &[u8],
    (rows, cols, reps): (usize, usize, usize),
    x: &[f32],
    xb: &[f32],
    threads: usize,
) {
    let isa = Isa::ALL.into_iter().rev().find(|i| i.available()).unwrap();
    let xv = if kind == WeightKind::Int8 { x } else { xb };
    let barrier = std::sync::Barrier::new(threads);
    let mut rates: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    let own = bytes.to_vec();
                    let p = f.view(0, &own).unwrap();
                    let dot = cpu_kernels::Dot::new(isa).unwrap();
                    let a = dot.prepare(kind, xv);
                    let mut out = vec![0.0f32; rows];
                    let mut best = f64::INFINITY;
                    for _ in 0..5 {
                        barrier.wait();
                        let t0 = Instant::now();
                        for _ in 0..reps {
                            dot.rows_act(&p, 0, &a, &mut out);
                        }
                        best = best.min(t0.elapsed().as_secs_f64());
                        std::hint::black_box(&out);
                    }
                    (reps * rows * cols) as f64 / best / 1e9
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    rates.sort_by(f64::total_cmp);
    println!(
        "{kind:?} {isa:?} rows kernel, {threads} threads at once: G weights/s per thread \
         slowest {:.2}, median {:.2}, fastest {:.2}",
        rates[0],
        rates[threads / 2],
        rates[threads - 1]
    );
}
