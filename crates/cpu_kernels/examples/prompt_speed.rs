//! The fused layer call on a prompt, without Python: tiny-code-moe geometry (H 256,
//! I 64, 64 experts, top 8) by default, T tokens routed to 8 random experts each, the
//! row dot products (`set_tile_min_tokens(usize::MAX)`) against the prompt path
//! (`tile.rs`), interleaved call by call; median ms per call and the largest difference
//! between the two relative to max |out|.
//! `cargo run --release -p cpu_kernels --example prompt_speed [-- threads tokens calls H I kinds both|old|new tile_min]`
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

use std::time::Instant;

mod common;

use cpu_kernels::{ExpertFormat, Isa, Kernels, Routing};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |j: usize, d: usize| args.get(j).map_or(d, |a| a.parse().unwrap());
    let (threads, t, calls, h, i) = (num(0, 1), num(1, 512), num(2, 20), num(3, 256), num(4, 64));
    let (n, k) = (64usize, 8usize);
    let kinds = args.get(5).map_or("bf16,int8,int4", String::as_str);
    let mut rnd = common::rng();
    let x: Vec<f32> = (0..t * h)
        .map(|_| (rnd() >> 40) as f32 / 8e6 - 1.0)
        .collect();
    let ids: Vec<i64> = (0..t).flat_map(|_| common::pick(n, k, &mut rnd)).collect();
    let w = vec![1.0 / k as f32; t * k];
    for (kind, name) in common::kinds(kinds) {
        let f = ExpertFormat::new(kind, [(i, h), (i, h), (h, i)]).unwrap();
        let slabs = common::slabs(&f, kind, n, &mut rnd);
        let experts = common::experts(&f, &slabs);
        let old = {
            let mut k = Kernels::new(Isa::best(), threads).unwrap();
            k.set_tile_min_tokens(usize::MAX);
            k
        };
        let mut new = Kernels::new(Isa::best(), threads).unwrap();
        if let Some(m) = args.get(7) {
            new.set_tile_min_tokens(m.parse().unwrap()); // the prompt path from m tokens
        }
        let routing = Routing {
            x: &x,
            ids: &ids,
            top_k: k,
            n_experts: n,
        };
        let (mut a, mut b) = (vec![0.0f32; t * h], vec![0.0f32; t * h]);
        let (mut ta, mut tb) = (Vec::new(), Vec::new());
        let only = args.get(6).map_or("both", String::as_str);
        for _ in 0..calls {
            let t0 = Instant::now();
            if only != "new" {
                old.moe_layer(&f, &routing, &experts, &w, &mut a).unwrap();
            }
            ta.push(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            if only != "old" {
                new.moe_layer(&f, &routing, &experts, &w, &mut b).unwrap();
            }
            tb.push(t0.elapsed().as_secs_f64());
        }
        ta.sort_by(f64::total_cmp);
        tb.sort_by(f64::total_cmp);
        let max = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0.0f32, |m, (p, q)| m.max((p - q).abs()));
        println!(
            "{name} {:?} threads {threads} T {t}: dots {:.3} ms, prompt path {:.3} ms ({:.2}x), diff {:.2e} of max",
            old.isa(),
            ta[ta.len() / 2] * 1e3,
            tb[tb.len() / 2] * 1e3,
            ta[ta.len() / 2] / tb[tb.len() / 2],
            diff / max
        );
    }
}
