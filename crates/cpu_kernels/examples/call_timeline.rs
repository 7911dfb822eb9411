//! Where the time of a fused layer call goes, thread by thread: every task of a call
//! waits on its expert's [`Ready`] first, so a `Ready` that only records the time and
//! the thread gives each task's start without touching the kernels. Per call: its wall
//! time, when the first task started, when the n-th distinct thread started its first
//! task (n = 2, half the threads, all of them), when down started (its first task) and
//! how many threads took part; medians over the calls, in microseconds.
//!
//! `cargo run --release -p cpu_kernels --example call_timeline [-- threads kind top_k
//! gap_us calls round_hidden H I x experts]`, e.g. `-- 16 int4 8 0,2000 200 off` (`x`:
//! `bf16`, the default, or `f32` hidden states): `experts` (default 64) experts of
//! Qwen3-30B-A3B geometry, one token routed to `top_k` random experts per call,
//! `gap_us` of sleep between calls (a list: each runs in turn). With `experts` equal to
//! `top_k` every call reads the same experts, which then stay in the caches: the call's
//! speed without the memory's.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::print_stdout)]

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

use cpu_kernels::{ExpertFormat, Isa, Kernels, Ready, Routing};

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static THREAD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn thread_index() -> usize {
    THREAD.with(|t| {
        if t.get() == usize::MAX {
            t.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// Records (thread, microseconds since the call started, projection) of every wait.
struct Clock {
    t0: Instant,
    marks: Mutex<Vec<(usize, f64, usize)>>,
}

impl Ready for Clock {
    fn wait(&self, _expert: u32, proj: usize) -> Result<(), String> {
        let at = self.t0.elapsed().as_secs_f64() * 1e6;
        self.marks.lock().unwrap().push((thread_index(), at, proj));
        Ok(())
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |j: usize, d: &'static str| args.get(j).map_or(d, String::as_str).to_string();
    let threads: usize = arg(0, "16").parse().unwrap();
    let kinds = arg(1, "int4");
    let k: usize = arg(2, "8").parse().unwrap();
    let gaps: Vec<u64> = arg(3, "0").split(',').map(|g| g.parse().unwrap()).collect();
    let calls: usize = arg(4, "200").parse().unwrap();
    let round = arg(5, "off") == "on";
    let (h, i): (usize, usize) = (
        arg(6, "2048").parse().unwrap(),
        arg(7, "768").parse().unwrap(),
    );
    // The hidden state exactly bf16 (a bf16 model's) or f32 (an f32 model's, `f32`).
    let keep = if arg(8, "bf16") == "f32" {
        u32::MAX
    } else {
        0xffff_0000
    };
    let n: usize = arg(9, "64").parse().unwrap();
    let mut rnd = common::rng();
    let x: Vec<f32> = (0..h)
        .map(|_| f32::from_bits((((rnd() >> 40) as f32 / 8e6 - 1.0).to_bits()) & keep))
        .collect();
    for (kind, _) in common::kinds(&kinds) {
        let f = ExpertFormat::new(kind, [(i, h), (i, h), (h, i)]).unwrap();
        let slabs = common::slabs(&f, kind, n, &mut rnd);
        let experts = common::experts(&f, &slabs);
        let mut kern = Kernels::new(Isa::parse("auto").unwrap(), threads).unwrap();
        kern.set_round_hidden(round);
        let bytes: usize = (0..3).map(|p| f.proj_bytes(p).unwrap()).sum::<usize>() * k;
        let mut y = vec![0.0f32; k * h];
        for &gap in &gaps {
            let mut cols: [Vec<f64>; 8] = Default::default();
            for call in 0..calls + 5 {
                std::thread::sleep(Duration::from_micros(gap));
                let ids = common::pick(n, k, &mut rnd);
                let routing = Routing {
                    x: &x,
                    ids: &ids,
                    top_k: k,
                    n_experts: n,
                };
                let clock = Clock {
                    t0: Instant::now(),
                    marks: Mutex::new(Vec::with_capacity(1024)),
                };
                kern.expert_outputs(&f, &routing, &experts, &clock, &mut y)
                    .unwrap();
                let wall = clock.t0.elapsed().as_secs_f64() * 1e6;
                if call < 5 {
                    continue; // warm-up
                }
                let marks = clock.marks.into_inner().unwrap();
                let mut first: Vec<(usize, f64)> = Vec::new();
                for &(t, at, _) in &marks {
                    match first.iter_mut().find(|(u, _)| *u == t) {
                        Some(e) => e.1 = e.1.min(at),
                        None => first.push((t, at)),
                    }
                }
                let mut starts: Vec<f64> = first.iter().map(|e| e.1).collect();
                starts.sort_by(f64::total_cmp);
                let nth = |n: usize| starts.get(n.saturating_sub(1)).copied().unwrap_or(f64::NAN);
                let down = marks
                    .iter()
                    .filter(|m| m.2 == 2)
                    .map(|m| m.1)
                    .fold(f64::INFINITY, f64::min);
                let row = [
                    wall,
                    nth(1),
                    nth(2),
                    nth(threads.div_ceil(2)),
                    nth(threads),
                    down,
                    starts.len() as f64,
                    bytes as f64 / wall / 1e3,
                ];
                for (c, v) in cols.iter_mut().zip(row) {
                    c.push(v);
                }
            }
            let m: Vec<f64> = cols.iter_mut().map(|c| median(c)).collect();
            println!(
                "{kind:?} threads {threads} experts {n} top-k {k} gap {gap} us round_hidden {round}: \
                 wall {:.0} us ({:.1} GB/s; median of GB/s {:.1}), first task {:.0}, 2nd thread {:.0}, \
                 {}th thread {:.0}, {threads}th thread {:.0}, down from {:.0}, threads taking part {:.0}",
                m[0],
                bytes as f64 / m[0] / 1e3,
                m[7],
                m[1],
                m[2],
                threads.div_ceil(2),
                m[3],
                m[4],
                m[5],
                m[6]
            );
        }
    }
}
