//! The fused layer call without Python: 64 experts of Qwen3-30B-A3B geometry (H 2048,
//! I 768) per kind, one token routed to 8 random experts per call, median GB/s of expert
//! bytes. `cargo run --release -p cpu_kernels --example layer_speed [-- threads isa H I
//! calls kinds]` (tiny-code-moe: H 256, I 64; kinds e.g. `int8` or `bf16,int4`; threads
//! a list such as `1,2`).
//!
//! Every thread count in the list, and the bare kernel (`Dot::dot_act` over the same
//! experts' rows in the same order, one thread, no layer call around it), runs on each
//! call's experts in turn, in one process: the bandwidth this box gives a process moves
//! by up to 2x between runs, so only figures from the same run compare.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

use std::time::Instant;

mod common;

use cpu_kernels::{ExpertFormat, Isa, Kernels, Routing};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: Vec<usize> = args
        .first()
        .map_or("1", String::as_str)
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    let isa = Isa::parse(args.get(1).map_or("auto", String::as_str)).unwrap();
    let num = |j: usize, d: usize| args.get(j).map_or(d, |a| a.parse().unwrap());
    let (h, i, n, k, calls) = (num(2, 2048), num(3, 768), 64, 8, num(4, 40));
    let mut rnd = common::rng();
    let x: Vec<f32> = (0..h)
        .map(|_| f32::from_bits((((rnd() >> 40) as f32 / 8e6 - 1.0).to_bits()) & 0xffff_0000))
        .collect();
    let kinds = args.get(5).map_or("bf16,int8,int4", String::as_str);
    for (kind, _) in common::kinds(kinds) {
        let f = ExpertFormat::new(kind, [(i, h), (i, h), (h, i)]).unwrap();
        let slabs = common::slabs(&f, kind, n, &mut rnd);
        let experts = common::experts(&f, &slabs);
        let kerns: Vec<Kernels> = threads
            .iter()
            .map(|&t| Kernels::new(isa, t).unwrap())
            .collect();
        let bytes: usize = (0..3).map(|p| f.proj_bytes(p).unwrap()).sum::<usize>() * k;
        let mut times = vec![Vec::new(); kerns.len()];
        let mut plain = Vec::new();
        let dot = cpu_kernels::Dot::new(kerns[0].isa()).unwrap();
        let xa = dot.prepare(kind, &x);
        // Down's input as the layer call has it: f32 values that are not bf16 (so that
        // the bare kernel takes the same kernels as the layer call).
        let hv: Vec<f32> = (0..i)
            .map(|c| x[c % h] * 0.75 + 1.0e-3 * c as f32)
            .collect();
        let ha = dot.prepare(kind, &hv);
        let mut sink = 0.0f32;
        let w = vec![1.0 / k as f32; k];
        let mut out = vec![0.0f32; h];
        for call in 0..calls {
            // Each turn's own 8 random experts, so that every turn reads (mostly) cold
            // experts whatever ran before it.
            let turns = kerns.len() + 1;
            let picks: Vec<Vec<i64>> = (0..turns).map(|_| common::pick(n, k, &mut rnd)).collect();
            // The turns in a rotating order.
            for (turn, ids) in picks.iter().enumerate() {
                let which = (turn + call) % turns;
                let routing = Routing {
                    x: &x,
                    ids,
                    top_k: k,
                    n_experts: n,
                };
                let t0 = Instant::now();
                if let Some(kern) = kerns.get(which) {
                    kern.moe_layer(&f, &routing, &experts, &w, &mut out)
                        .unwrap();
                    times[which].push(t0.elapsed().as_secs_f64());
                    continue;
                }
                for &e in ids {
                    let ew = &experts[e as usize].1;
                    for r in 0..i {
                        sink += dot.dot_act(&ew.gate, r, &xa) * dot.dot_act(&ew.up, r, &xa);
                    }
                    for r in 0..h {
                        sink += dot.dot_act(&ew.down, r, &ha);
                    }
                }
                plain.push(t0.elapsed().as_secs_f64());
            }
        }
        plain.sort_by(f64::total_cmp);
        let gbs = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            bytes as f64 / v[v.len() / 2] / 1e9
        };
        let bare = gbs(&mut plain);
        for (kern, t) in kerns.iter().zip(&mut times) {
            let g = gbs(t);
            println!(
                "{kind:?} {:?} threads {}: {g:.2} GB/s median, {:.2} x the bare kernel",
                kern.isa(),
                kern.threads(),
                g / bare
            );
        }
        println!("{kind:?} bare kernel, one thread, same rows: {bare:.2} GB/s (sink {sink:.1})");
    }
}
