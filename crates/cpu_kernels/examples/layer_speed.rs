//! The fused layer call without Python: 64 experts of Qwen3-30B-A3B geometry (H 2048,
//! I 768) per kind, one token routed to 8 random experts per call, median GB/s of expert
//! bytes. `cargo run --release -p cpu_kernels --example layer_speed [-- threads isa H I
//! calls]` (tiny-code-moe: H 256, I 64).
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

use std::time::Instant;

use cpu_kernels::{ExpertFormat, ExpertWeights, Isa, Kernels, Routing, WeightKind};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.first().map_or(1, |a| a.parse().unwrap());
    let isa = Isa::parse(args.get(1).map_or("auto", String::as_str)).unwrap();
    let num = |j: usize, d: usize| args.get(j).map_or(d, |a| a.parse().unwrap());
    let (h, i, n, k, calls) = (num(2, 2048), num(3, 768), 64, 8, num(4, 40));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let x: Vec<f32> = (0..h)
        .map(|_| f32::from_bits((((rnd() >> 40) as f32 / 8e6 - 1.0).to_bits()) & 0xffff_0000))
        .collect();
    for kind in [
        WeightKind::Bf16,
        WeightKind::Int8,
        WeightKind::Int4 { group: 32 },
    ] {
        let f = ExpertFormat::new(kind, [(i, h), (i, h), (h, i)]).unwrap();
        let slabs: Vec<[Vec<u8>; 3]> = (0..n)
            .map(|_| {
                [0, 1, 2].map(|p| {
                    let mut b: Vec<u8> =
                        (0..f.proj_bytes(p).unwrap()).map(|_| rnd() as u8).collect();
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
            .collect();
        let experts: Vec<(u32, ExpertWeights<'_>)> = slabs
            .iter()
            .enumerate()
            .map(|(e, s)| {
                (
                    e as u32,
                    ExpertWeights::new(&f, [&s[0], &s[1], &s[2]]).unwrap(),
                )
            })
            .collect();
        let kern = Kernels::new(isa, threads).unwrap();
        let bytes: usize = (0..3).map(|p| f.proj_bytes(p).unwrap()).sum::<usize>() * k;
        let mut times = Vec::new();
        let w = vec![1.0 / k as f32; k];
        let mut out = vec![0.0f32; h];
        for _ in 0..calls {
            let mut ids: Vec<i64> = Vec::new();
            while ids.len() < k {
                let e = (rnd() % n as u64) as i64;
                if !ids.contains(&e) {
                    ids.push(e);
                }
            }
            let routing = Routing {
                x: &x,
                ids: &ids,
                top_k: k,
                n_experts: n,
            };
            let t0 = Instant::now();
            kern.moe_layer(&f, &routing, &experts, &w, &mut out)
                .unwrap();
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!(
            "{kind:?} {:?} threads {threads}: {:.2} GB/s median ({:.0} us/call)",
            kern.isa(),
            bytes as f64 / med / 1e9,
            med * 1e6
        );
    }
}
