//! One call per MoE layer: every listed expert on the rows routed to it, gate, up and
//! SiLU fused in one pass over gate/up rows, then down; work split across the pool by
//! output rows; the weighted sum over the top-k in router-rank order.
//!
//! Determinism: every output value is computed by exactly one task with a fixed
//! sequence of operations, so the result does not depend on the number of threads, on
//! which thread ran what, or on how the experts were split into calls (a streamed
//! layer computed in waves gives the bytes a resident layer computes in one call).

use rayon::prelude::*;

use crate::act::{Act, Aligned};
use crate::error::{KernelError, Result};
use crate::format::{ExpertFormat, Proj};
use crate::isa::{Dot, Isa};
use crate::scalar::silu;
use crate::simd::TOKENS;

/// Multiply-adds a task should at least do, so that scheduling a task (~1-2 us with
/// rayon on the CPU box) stays small against it: 32 Ki is one 64 x 256 bf16 gate+up
/// pair (a tiny-code-moe expert) at one token.
const MIN_TASK_MACS: usize = 32 * 1024;

/// Tasks a phase is split into per thread, at most (fewer where [`MIN_TASK_MACS`] says
/// so). Blocks of [`MIN_TASK_MACS`] alone made 768 tasks of 32 KB of int8 for one token on
/// Qwen3-30B-A3B geometry, and two threads were slower than one (int4 8.0 vs 10.0 GB/s);
/// with 2-16 tasks per thread two threads got 10-13.6 GB/s (examples/layer_speed.rs,
/// docs/benchmarks.md). Which thread computes a row does not change its value.
const TASKS_PER_THREAD: usize = 8;

/// Where an expert's bytes are, for calls that start before they all landed.
pub trait Ready: Sync {
    /// Blocks until `proj` of `expert` is in memory: 1 = gate and up, 2 = all three.
    fn wait(&self, expert: u32, proj: usize) -> std::result::Result<(), String>;
}

/// Every expert's bytes are already in memory (resident experts, cache hits).
#[derive(Debug, Clone, Copy)]
pub struct AllReady;

impl Ready for AllReady {
    fn wait(&self, _expert: u32, _proj: usize) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// The three projections of one expert.
#[derive(Debug, Clone, Copy)]
pub struct ExpertWeights<'a> {
    /// Gate `[I, H]`.
    pub gate: Proj<'a>,
    /// Up `[I, H]`.
    pub up: Proj<'a>,
    /// Down `[H, I]`.
    pub down: Proj<'a>,
}

impl<'a> ExpertWeights<'a> {
    /// Views of the three projections' bytes in `format`.
    pub fn new(format: &ExpertFormat, bytes: [&'a [u8]; 3]) -> Result<Self> {
        let [g, u, d] = bytes;
        Ok(Self {
            gate: format.view(0, g)?,
            up: format.view(1, u)?,
            down: format.view(2, d)?,
        })
    }
}

/// The routing of one layer call: `x` `[T, H]`, `ids` `[T, K]` (router-rank order).
#[derive(Debug, Clone, Copy)]
pub struct Routing<'a> {
    /// Hidden states, `T * H` values.
    pub x: &'a [f32],
    /// Selected experts, `T * K` ids.
    pub ids: &'a [i64],
    /// K.
    pub top_k: usize,
    /// Experts in the layer (ids must be below it).
    pub n_experts: usize,
}

/// The kernels and their thread pool.
#[derive(Debug)]
pub struct Kernels {
    dot: Dot,
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

/// One expert's share of a call: its weights and the flat positions (t * K + k) that
/// chose it.
struct Job<'a> {
    expert: u32,
    w: ExpertWeights<'a>,
    positions: Vec<usize>,
}

/// A block of output rows of one job.
#[derive(Clone, Copy)]
struct Task {
    job: usize,
    rows: (usize, usize),
}

impl Kernels {
    /// Kernels of `isa` on a pool of `threads` (1: the calling thread only).
    pub fn new(isa: Isa, threads: usize) -> Result<Self> {
        let dot = Dot::new(isa)?;
        let threads = threads.max(1);
        let pool = if threads > 1 {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("flint-cpu-{i}"))
                .build()
                .map_err(|e| KernelError::Pool {
                    threads,
                    message: e.to_string(),
                })?;
            Some(p)
        } else {
            None
        };
        Ok(Self { dot, threads, pool })
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.dot.isa()
    }

    /// Threads of the pool (the calling thread included when it is 1).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` over `tasks`, on the pool if there is one, results in task order.
    fn run<T: Send>(
        &self,
        tasks: &[Task],
        f: impl Fn(&Task) -> Result<T> + Sync + Send,
    ) -> Result<Vec<T>> {
        match &self.pool {
            Some(pool) => pool.install(|| tasks.par_iter().with_max_len(1).map(f).collect()),
            None => tasks.iter().map(f).collect(),
        }
    }

    /// `f` over `items` with their indices, on the pool if there is one, in order.
    fn map<'s, I: Sync, T: Send>(
        &self,
        items: &'s [I],
        f: impl Fn((usize, &'s I)) -> T + Sync + Send,
    ) -> Vec<T> {
        match &self.pool {
            Some(pool) if items.len() > 1 => {
                pool.install(|| items.par_iter().enumerate().map(f).collect())
            }
            _ => items.iter().enumerate().map(f).collect(),
        }
    }

    /// Writes `y[p]` (`H` values at `p * H`) for every position `p` routed to one of
    /// `experts`: `down(silu(gate(x_t)) * up(x_t))`, in f32. Positions of experts not
    /// listed are left as they are (a later call computes them). Waits on `ready`
    /// before reading each expert's gate/up and down.
    pub fn expert_outputs<R: Ready>(
        &self,
        format: &ExpertFormat,
        routing: &Routing<'_>,
        experts: &[(u32, ExpertWeights<'_>)],
        ready: &R,
        y: &mut [f32],
    ) -> Result<()> {
        // The whole call inside the pool: its parallel steps (activation rows, phase 1,
        // down's inputs, phase 2) then start from a pool thread, not each by injecting
        // a job from outside and sleeping until it is done (tiny-code-moe geometry at
        // two threads: 1.5-1.7x the GB/s, examples/layer_speed.rs).
        match &self.pool {
            Some(pool) => pool.install(|| self.outputs(format, routing, experts, ready, y)),
            None => self.outputs(format, routing, experts, ready, y),
        }
    }

    /// [`Self::expert_outputs`], on the pool's threads if called inside it.
    fn outputs<R: Ready>(
        &self,
        format: &ExpertFormat,
        routing: &Routing<'_>,
        experts: &[(u32, ExpertWeights<'_>)],
        ready: &R,
        y: &mut [f32],
    ) -> Result<()> {
        let (h, i) = (format.hidden(), format.inter());
        let jobs = group(routing, experts, h)?;
        let want = routing.ids.len() * h;
        if y.len() != want {
            return Err(KernelError::BadLength {
                what: "expert outputs",
                got: y.len(),
                want,
            });
        }
        let x = routing.x;
        let k = routing.top_k;
        // Each token's activation row prepared once for the whole call (the same for every
        // expert and wave: the kernel a row goes through depends on the row only).
        let mut used = vec![false; routing.ids.len() / k.max(1)];
        for p in jobs.iter().flat_map(|j| &j.positions) {
            if let Some(u) = used.get_mut(p / k) {
                *u = true;
            }
        }
        let acts: Vec<Option<Act<'_>>> = self.map(&used, |(t, &u)| {
            u.then(|| self.dot.prepare(format.kind, row_of(x, t, h)))
        });
        // Each job's activation rows, once for all its tasks (and as f32 slices where none
        // was prepared for a prepared kernel).
        let rows1: Vec<Rows<'_, '_>> = jobs
            .iter()
            .map(|job| {
                rows_of(
                    job.positions
                        .iter()
                        .filter_map(|&p| acts.get(p / k).and_then(Option::as_ref))
                        .collect(),
                )
            })
            .collect();
        // Phase 1: h[n, r] = silu(gate_r . x_n) * (up_r . x_n), tasks by rows of I.
        let tasks1 = tasks(&jobs, i, h * 2, self.threads);
        let parts1 = self.run(&tasks1, |t| {
            let job = jobs
                .get(t.job)
                .ok_or(KernelError::MissingExpert { expert: 0 })?;
            wait(ready, job.expert, 1)?;
            let mut out = Vec::with_capacity((t.rows.1 - t.rows.0) * job.positions.len());
            let (xs, xf) = rows1
                .get(t.job)
                .ok_or(KernelError::MissingExpert { expert: 0 })?;
            // Rows nothing was prepared for go straight to the f32 kernels (the same
            // bits as through `dot_act`): on small rows (tiny-code-moe's 64 and 256
            // columns) the per-call dispatch of the prepared kernels measured -13% prefill.
            if let Some(xf) = xf {
                let (quads, rest) = by_fours(xf);
                for r in t.rows.0..t.rows.1 {
                    for &four in quads {
                        let g = self.dot.dots_f32(&job.w.gate, r, four);
                        let u = self.dot.dots_f32(&job.w.up, r, four);
                        out.extend(g.iter().zip(u).map(|(&g, u)| silu(g) * u));
                    }
                    for &xt in rest {
                        let g = self.dot.dot_f32(&job.w.gate, r, xt);
                        let u = self.dot.dot_f32(&job.w.up, r, xt);
                        out.push(silu(g) * u);
                    }
                }
                return Ok(out);
            }
            for r in t.rows.0..t.rows.1 {
                let (quads, rest) = by_fours(xs);
                for &four in quads {
                    let g = self.dot.dots_act(&job.w.gate, r, four);
                    let u = self.dot.dots_act(&job.w.up, r, four);
                    out.extend(g.iter().zip(u).map(|(&g, u)| silu(g) * u));
                }
                for &xt in rest {
                    let g = self.dot.dot_act(&job.w.gate, r, xt);
                    let u = self.dot.dot_act(&job.w.up, r, xt);
                    out.push(silu(g) * u);
                }
            }
            Ok(out)
        })?;
        // 64-byte aligned, so that down's f32 kernels read whole cache lines without an
        // aligned copy of each row.
        let mut hidden: Vec<Aligned<f32>> = jobs
            .iter()
            .map(|j| Aligned::zeroed(j.positions.len() * i))
            .collect();
        for (t, part) in tasks1.iter().zip(parts1) {
            let (Some(dst), Some(job)) = (hidden.get_mut(t.job), jobs.get(t.job)) else {
                continue;
            };
            let n = job.positions.len();
            for (idx, v) in part.into_iter().enumerate() {
                let (r, m) = (t.rows.0 + idx / n, idx % n);
                if let Some(d) = dst.as_mut_slice().get_mut(m * i + r) {
                    *d = v;
                }
            }
        }
        // Phase 2: y[p, r] = down_r . h[n], tasks by rows of H.
        let rows2: Vec<(usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| (0..job.positions.len()).map(move |m| (j, m)))
            .collect();
        let hacts: Vec<Act<'_>> = self.map(&rows2, |(_, &(j, m))| {
            let hj = hidden.get(j).map(Aligned::as_slice).unwrap_or_default();
            self.dot.prepare(format.kind, row_of(hj, m, i))
        });
        let mut first = Vec::with_capacity(jobs.len());
        let mut n = 0;
        for job in &jobs {
            first.push(n);
            n += job.positions.len();
        }
        let rows2: Vec<Rows<'_, '_>> = jobs
            .iter()
            .zip(&first)
            .map(|(job, &start)| {
                rows_of(
                    hacts
                        .get(start..start + job.positions.len())
                        .unwrap_or_default()
                        .iter()
                        .collect(),
                )
            })
            .collect();
        let tasks2 = tasks(&jobs, h, i, self.threads);
        let parts2 = self.run(&tasks2, |t| {
            let job = jobs
                .get(t.job)
                .ok_or(KernelError::MissingExpert { expert: 0 })?;
            let (hs, hf) = rows2
                .get(t.job)
                .ok_or(KernelError::MissingExpert { expert: 0 })?;
            wait(ready, job.expert, 2)?;
            let mut out = Vec::with_capacity((t.rows.1 - t.rows.0) * job.positions.len());
            if let Some(hf) = hf {
                let (quads, rest) = by_fours(hf);
                for r in t.rows.0..t.rows.1 {
                    for &four in quads {
                        out.extend(self.dot.dots_f32(&job.w.down, r, four));
                    }
                    for &ht in rest {
                        out.push(self.dot.dot_f32(&job.w.down, r, ht));
                    }
                }
                return Ok(out);
            }
            for r in t.rows.0..t.rows.1 {
                let (quads, rest) = by_fours(hs);
                for &four in quads {
                    out.extend(self.dot.dots_act(&job.w.down, r, four));
                }
                for &ht in rest {
                    out.push(self.dot.dot_act(&job.w.down, r, ht));
                }
            }
            Ok(out)
        })?;
        for (t, part) in tasks2.iter().zip(parts2) {
            let Some(job) = jobs.get(t.job) else { continue };
            let n = job.positions.len();
            for (idx, v) in part.into_iter().enumerate() {
                let (r, m) = (t.rows.0 + idx / n, idx % n);
                let p = job.positions.get(m).copied().unwrap_or(usize::MAX);
                if let Some(d) = y.get_mut(p.saturating_mul(h).saturating_add(r)) {
                    *d = v;
                }
            }
        }
        Ok(())
    }

    /// The whole layer in one call: [`Self::expert_outputs`] for every routed expert
    /// (each must be in `experts`), then [`weighted_sum`] into `out` `[T, H]`.
    pub fn moe_layer(
        &self,
        format: &ExpertFormat,
        routing: &Routing<'_>,
        experts: &[(u32, ExpertWeights<'_>)],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let mut listed = vec![false; routing.n_experts];
        for (e, _) in experts {
            if let Some(l) = listed.get_mut(*e as usize) {
                *l = true;
            }
        }
        for &id in routing.ids {
            let e = usize::try_from(id).unwrap_or(usize::MAX);
            if !listed.get(e).copied().unwrap_or(true) {
                return Err(KernelError::MissingExpert { expert: e as u32 });
            }
        }
        let mut y = vec![0.0f32; routing.ids.len() * format.hidden()];
        self.expert_outputs(format, routing, experts, &AllReady, &mut y)?;
        weighted_sum(&y, weights, routing.top_k, format.hidden(), out)
    }
}

/// Activation rows in fours for [`Dot::dots_act`] (one read of each weight row per four
/// tokens) and the rest one by one. (int4 rows went one by one while their only
/// four-token path was slower; the AVX-512 int4 kernels are 1.9-2.6x faster per token
/// four at a time, `examples/dot_speed.rs`, and the other paths loop over the four.)
fn by_fours<'a, 'x, A: ?Sized>(rows: &'a [&'x A]) -> (&'a [[&'x A; TOKENS]], &'a [&'x A]) {
    rows.as_chunks::<TOKENS>()
}

/// A job's activation rows, and the same as f32 slices if none was prepared for a
/// prepared kernel (then the f32 kernels are called directly).
type Rows<'r, 'x> = (Vec<&'r Act<'x>>, Option<Vec<&'r [f32]>>);

fn rows_of<'r, 'x>(acts: Vec<&'r Act<'x>>) -> Rows<'r, 'x> {
    let plain = acts
        .iter()
        .all(|a| a.is_plain())
        .then(|| acts.iter().map(|a| a.f32_row()).collect());
    (acts, plain)
}

fn wait<R: Ready>(ready: &R, expert: u32, proj: usize) -> Result<()> {
    ready
        .wait(expert, proj)
        .map_err(|message| KernelError::NotReady { expert, message })
}

/// Row `t` (`n` values) of a row-major matrix; empty if out of range.
#[inline]
fn row_of(m: &[f32], t: usize, n: usize) -> &[f32] {
    m.get(t * n..(t + 1) * n).unwrap_or_default()
}

/// The positions routed to each listed expert, checking ids and x's length.
fn group<'a>(
    routing: &Routing<'_>,
    experts: &[(u32, ExpertWeights<'a>)],
    hidden: usize,
) -> Result<Vec<Job<'a>>> {
    let k = routing.top_k.max(1);
    if !routing.ids.len().is_multiple_of(k) || routing.x.len() != routing.ids.len() / k * hidden {
        return Err(KernelError::BadLength {
            what: "hidden states",
            got: routing.x.len(),
            want: routing.ids.len() / k * hidden,
        });
    }
    let mut job_of = vec![usize::MAX; routing.n_experts];
    let mut jobs: Vec<Job<'a>> = Vec::with_capacity(experts.len());
    for (e, w) in experts {
        let slot = job_of
            .get_mut(*e as usize)
            .ok_or(KernelError::ExpertOutOfRange {
                id: i64::from(*e),
                position: usize::MAX,
                n_experts: routing.n_experts,
            })?;
        *slot = jobs.len();
        jobs.push(Job {
            expert: *e,
            w: *w,
            positions: Vec::new(),
        });
    }
    for (position, &id) in routing.ids.iter().enumerate() {
        let j = usize::try_from(id).ok().and_then(|e| job_of.get(e)).ok_or(
            KernelError::ExpertOutOfRange {
                id,
                position,
                n_experts: routing.n_experts,
            },
        )?;
        if let Some(job) = jobs.get_mut(*j) {
            job.positions.push(position);
        }
    }
    jobs.retain(|j| !j.positions.is_empty());
    Ok(jobs)
}

/// Blocks of output rows for every job (a block never spans two jobs), each at least
/// [`MIN_TASK_MACS`] of work and at least 1 / ([`TASKS_PER_THREAD`] x `threads`) of the
/// phase's work.
fn tasks(jobs: &[Job<'_>], rows: usize, macs_per_row_token: usize, threads: usize) -> Vec<Task> {
    let total: usize = jobs
        .iter()
        .map(|j| {
            macs_per_row_token
                .saturating_mul(j.positions.len())
                .saturating_mul(rows)
        })
        .sum();
    let min = MIN_TASK_MACS.max(total / threads.saturating_mul(TASKS_PER_THREAD).max(1));
    let mut out = Vec::new();
    for (job, j) in jobs.iter().enumerate() {
        let per_row = macs_per_row_token.saturating_mul(j.positions.len()).max(1);
        let block = min.div_ceil(per_row).clamp(1, rows.max(1));
        let mut r = 0;
        while r < rows {
            let end = (r + block).min(rows);
            out.push(Task {
                job,
                rows: (r, end),
            });
            r = end;
        }
    }
    out
}

/// `out[t] = sum_k weights[t, k] * y[t, k]` in f32, k = 0..K in order, each step a
/// multiply then an add: the same operations as `flint.models.moe.weighted_sum`.
pub fn weighted_sum(
    y: &[f32],
    weights: &[f32],
    top_k: usize,
    hidden: usize,
    out: &mut [f32],
) -> Result<()> {
    let tokens = weights.len() / top_k.max(1);
    for (what, got, want) in [
        ("routing weights", weights.len(), tokens * top_k),
        ("expert outputs", y.len(), tokens * top_k * hidden),
        ("layer output", out.len(), tokens * hidden),
    ] {
        if got != want || top_k == 0 {
            return Err(KernelError::BadLength { what, got, want });
        }
    }
    for (t, dst) in out.chunks_exact_mut(hidden).enumerate() {
        for k in 0..top_k {
            let w = weights.get(t * top_k + k).copied().unwrap_or(0.0);
            let src = row_of(y, t * top_k + k, hidden);
            if k == 0 {
                dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v * w);
            } else {
                dst.iter_mut().zip(src).for_each(|(d, &v)| *d += v * w);
            }
        }
    }
    Ok(())
}
