//! One call per MoE layer: every listed expert on the rows routed to it, gate, up and
//! SiLU fused in one pass over gate/up rows, then down; work split across the pool by
//! output rows; the weighted sum over the top-k in router-rank order.
//!
//! Determinism: every output value is computed by exactly one task with a fixed
//! sequence of operations, so the result does not depend on the number of threads, on
//! which thread ran what, or on how the experts were split into calls (a streamed
//! layer computed in waves gives the bytes a resident layer computes in one call).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::act::{Act, Aligned};
use crate::crew::{spin_window, wait_until, Crew};
use crate::error::{KernelError, Result};
use crate::format::{ExpertFormat, Proj};
use crate::isa::{Dot, Isa};
use crate::scalar::{bf16_round, silu};
use crate::simd::TOKENS;

/// Multiply-adds a task should at least do, so that scheduling a task (~1-2 us with
/// rayon on the CPU box, measured before tasks were claimed from an atomic counter)
/// stays small against it: 32 Ki is one 64 x 256 bf16 gate+up
/// pair (a tiny-code-moe expert) at one token.
const MIN_TASK_MACS: usize = 32 * 1024;

/// Tasks a phase is split into per thread, at most (fewer where [`MIN_TASK_MACS`] says
/// so). Blocks of [`MIN_TASK_MACS`] alone made 768 tasks of 32 KB of int8 for one token on
/// Qwen3-30B-A3B geometry, and two threads were slower than one (int4 8.0 vs 10.0 GB/s);
/// with 2-16 tasks per thread two threads got 10-13.6 GB/s (examples/layer_speed.rs,
/// docs/benchmarks.md). Which thread computes a row does not change its value.
/// `FLINT_CPU_TASKS` overrides it (measurement).
const TASKS_PER_THREAD: usize = 8;

/// [`TASKS_PER_THREAD`], or `FLINT_CPU_TASKS` (read once) to measure others with.
fn tasks_per_thread() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(
        || match crate::env_setting("FLINT_CPU_TASKS", TASKS_PER_THREAD) {
            0 => TASKS_PER_THREAD,
            n => n,
        },
    )
}

/// Multiply-adds below which a call runs on the calling thread alone: waking the pool
/// costs more than it saves. Tiny-code-moe decode (one token, 8 experts of 256 x 64)
/// is 0.375 Mi.
const SMALL_CALL_MACS: usize = 1 << 20;

/// Tokens a prompt-path task takes at least when an expert is split by tokens: each task
/// widens its weight rows again.
const MIN_TILE_TASK_TOKENS: usize = 48;

/// Expert output values from which [`Kernels::moe_layer`] keeps its buffer between
/// calls (256 KiB: below, the allocator reuses its own memory) ...
const KEEP_OUTPUTS: usize = 64 * 1024;

/// ... and up to which (16 MiB: tiny-code-moe's pp2048; a larger model's prompt would
/// hold hundreds of MiB after it, and its faults weigh less against its wider rows).
const KEEP_OUTPUTS_MAX: usize = 4 << 20;

/// Steps of a layer call: activation rows, then the experts (gate/up and down).
const STEPS: usize = 2;

/// Tokens routed to one expert from which it runs on the prompt path (`tile.rs`: weight
/// rows widened once into an f32 tile, a register-blocked product over all its tokens)
/// on AVX-512; below, the row dot products (four tokens per row read).
pub const TILE_MIN_TOKENS: usize = 4;

/// The threads of one call and where it stands: the open step, each step's next
/// unclaimed item and its finished items.
struct Gang {
    counts: [usize; STEPS],
    step: AtomicUsize,
    next: [AtomicUsize; STEPS],
    done: [AtomicUsize; STEPS],
    stop: AtomicBool,
}

/// Stops the call if the thread holding it unwinds (the others would wait forever).
struct StopOnPanic<'g>(&'g AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

impl Gang {
    fn new(counts: [usize; STEPS]) -> Self {
        Self {
            counts,
            step: AtomicUsize::new(0),
            next: Default::default(),
            done: Default::default(),
            stop: AtomicBool::new(false),
        }
    }

    /// Opens the first step with items (running `after` for those without).
    fn open(&self, after: &(dyn Fn(usize) + Sync)) {
        if self.counts.first().copied().unwrap_or(0) == 0 {
            self.finish(0, after);
        }
    }

    /// Step `s` is done: runs `after` for it and every following step without items,
    /// then opens the next step (or ends the call).
    fn finish(&self, mut s: usize, after: &(dyn Fn(usize) + Sync)) {
        loop {
            after(s);
            s += 1;
            if s >= STEPS || self.counts.get(s).copied().unwrap_or(0) > 0 {
                break;
            }
        }
        self.step.store(s, Ordering::Release);
    }

    /// Claims and runs items until the call is over.
    fn work(&self, item: &(dyn Fn(usize, usize) + Sync), after: &(dyn Fn(usize) + Sync)) {
        let _guard = StopOnPanic(&self.stop);
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let s = self.step.load(Ordering::Acquire);
            let (Some(next), Some(done), Some(&count)) =
                (self.next.get(s), self.done.get(s), self.counts.get(s))
            else {
                return;
            };
            let n = next.fetch_add(1, Ordering::Relaxed);
            if n < count {
                item(s, n);
                if done.fetch_add(1, Ordering::AcqRel) + 1 == count {
                    self.finish(s, after);
                }
                continue;
            }
            // Nothing left in this step: wait for the thread finishing its last item.
            wait_until(|| self.step.load(Ordering::Acquire) != s, &self.stop);
        }
    }
}

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
    pub(crate) dot: Dot,
    pub(crate) threads: usize,
    /// The `threads - 1` workers beside the calling thread (`crew.rs`; none for 1).
    pub(crate) crew: Option<Crew>,
    pub(crate) tile_min: usize,
    /// Round down's inputs `silu(gate) * up` to bf16 (see [`Self::set_round_hidden`]).
    pub(crate) round_hidden: bool,
    /// The expert outputs of the last large [`Self::moe_layer`] call, kept for the next:
    /// a prompt's `[T * K, H]` buffer (4 MiB at tiny-code-moe's pp512) was mapped,
    /// faulted in and unmapped by every call (page faults: ~25% of the call's time).
    pub(crate) outputs: std::sync::Mutex<Vec<f32>>,
}

/// One expert's share of a call: its weights and the flat positions (t * K + k) that
/// chose it.
struct Job<'a> {
    expert: u32,
    w: ExpertWeights<'a>,
    positions: Vec<usize>,
    /// On the prompt path (`tile.rs`): token-major task outputs.
    tiled: bool,
}

/// A block of output rows of one job, for its tokens `toks` (all of them, except on the
/// prompt path, where an expert with many tokens is also split by tokens).
#[derive(Clone, Copy)]
struct Task {
    job: usize,
    rows: (usize, usize),
    toks: (usize, usize),
}

impl Kernels {
    /// Kernels of `isa` on `threads` threads: the calling thread and a pool of
    /// `threads - 1` (none for 1).
    pub fn new(isa: Isa, threads: usize) -> Result<Self> {
        let dot = Dot::new(isa)?;
        let threads = threads.max(1);
        // The calling thread is one of the `threads`.
        let crew = if threads > 1 {
            Some(Crew::new(threads - 1, spin_window())?)
        } else {
            None
        };
        Ok(Self {
            dot,
            threads,
            crew,
            tile_min: TILE_MIN_TOKENS,
            round_hidden: false,
            outputs: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Sets the tokens per expert from which the prompt path runs (AVX-512 only;
    /// `usize::MAX`: never, 1: always). Tests and benches compare the two paths with it.
    pub fn set_tile_min_tokens(&mut self, tokens: usize) {
        self.tile_min = tokens.max(1);
    }

    /// Rounds each expert's hidden row `silu(gate) * up` to bf16 before down, as a bf16
    /// model's GPU kernels hold it (off: f32, as an f32 model's torch ops do). A bf16
    /// row then goes through down's AVX-512 BF16 kernel, one plane instead of the f32
    /// kernel (docs/benchmarks.md, "Down's input in bf16").
    pub fn set_round_hidden(&mut self, on: bool) {
        self.round_hidden = on;
    }

    /// int4 rows through the lanes kernel (`on`) or the AVX-512 BF16 one, where the
    /// instruction set has both ([`Dot::with_int4_lanes`]; default: `FLINT_CPU_INT4`).
    pub fn set_int4_lanes(&mut self, on: bool) {
        self.dot = self.dot.with_int4_lanes(on);
    }

    /// int8 rows through the VNNI kernel with 8-bit activations (`on`) or the f32 ones,
    /// where the CPU has it ([`Dot::with_int8_vnni`]; default: `FLINT_CPU_INT8`).
    pub fn set_int8_vnni(&mut self, on: bool) {
        self.dot = self.dot.with_int8_vnni(on);
    }

    /// int4 rows through the VNNI kernel with 8-bit activations (`on`), where the CPU
    /// has it ([`Dot::with_int4_vnni`]; default: `FLINT_CPU_INT4`).
    pub fn set_int4_vnni(&mut self, on: bool) {
        self.dot = self.dot.with_int4_vnni(on);
    }

    /// Whether hidden rows are rounded to bf16 before down.
    pub fn round_hidden(&self) -> bool {
        self.round_hidden
    }

    /// Whether a job of `tokens` tokens runs on the prompt path.
    fn tiled(&self, tokens: usize) -> bool {
        matches!(self.dot.isa(), Isa::Avx512 | Isa::Avx512Bf16)
            && cfg!(target_arch = "x86_64")
            && tokens >= self.tile_min
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.dot.isa()
    }

    /// The row kernels' variants for rows of `kind` ([`Dot::variants`]).
    pub fn variants(&self, kind: crate::WeightKind) -> String {
        self.dot.variants(kind)
    }

    /// Threads of the pool (the calling thread included when it is 1).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Writes `y[p]` (`H` values at `p * H`) for every position `p` routed to one of
    /// `experts`: `down(silu(gate(x_t)) * up(x_t))`, in f32. Positions of experts not
    /// listed are left as they are (a later call computes them). Waits on `ready`
    /// before reading each expert's gate/up and down. On an error (a failed wait) the
    /// call stops; the experts whose down had already run have written their rows, the
    /// others not: `y` is then partly written.
    ///
    /// The call runs two steps on the calling thread and the pool's threads, woken once
    /// per call: the activation rows, then the experts. Every thread claims the open
    /// step's items from an atomic counter; a thread that wakes late joins whatever step
    /// is open. The experts' step lists every gate/up task, then every down task: the
    /// thread finishing an expert's last gate/up task prepares its down inputs and opens
    /// its down tasks, so down starts expert by expert, without a barrier between the
    /// phases (a down task claimed early waits for its expert; all gate/up tasks were
    /// claimed before it, so the wait ends). Tasks write their rows in place (disjoint
    /// rows). Calls of fewer than `SMALL_CALL_MACS` (1 Mi) run on the calling thread alone.
    pub fn expert_outputs<R: Ready>(
        &self,
        format: &ExpertFormat,
        routing: &Routing<'_>,
        experts: &[(u32, ExpertWeights<'_>)],
        ready: &R,
        y: &mut [f32],
    ) -> Result<()> {
        let (h, i) = (format.hidden(), format.inter());
        let mut jobs = group(routing, experts, h)?;
        for job in &mut jobs {
            job.tiled = self.tiled(job.positions.len());
        }
        let want = routing.ids.len() * h;
        if y.len() != want {
            return Err(KernelError::BadLength {
                what: "expert outputs",
                got: y.len(),
                want,
            });
        }
        let x = routing.x;
        let k = routing.top_k.max(1);
        // Each token's activation row prepared once for the whole call (the same for every
        // expert and wave: the kernel a row goes through depends on the row only). The
        // prompt path reads `x` as it is: only the other jobs' tokens are prepared.
        let mut used = vec![false; routing.ids.len() / k];
        for p in jobs.iter().filter(|j| !j.tiled).flat_map(|j| &j.positions) {
            if let Some(u) = used.get_mut(p / k) {
                *u = true;
            }
        }
        let tokens: Vec<usize> = (0..used.len())
            .filter(|&t| used.get(t).copied().unwrap_or(false))
            .collect();
        let acts: Vec<OnceLock<Act<'_>>> = used.iter().map(|_| OnceLock::new()).collect();
        let rows1: OnceLock<Vec<Rows<'_, '_>>> = OnceLock::new();
        let tasks1 = tasks(&jobs, i, h * 2, self.threads, crate::tile::HALF);
        let tasks2 = tasks(&jobs, h, i, self.threads, crate::tile::BLOCK);
        // Each job's gate/up tasks still running or unclaimed.
        let mut left = vec![0usize; jobs.len()];
        for t in &tasks1 {
            if let Some(c) = left.get_mut(t.job) {
                *c += 1;
            }
        }
        let left: Vec<AtomicUsize> = left.into_iter().map(AtomicUsize::new).collect();
        // Each job's down inputs `[n, I]`, written in place by its gate/up tasks; 64-byte
        // aligned, so that down's f32 kernels read whole cache lines without a copy.
        let mut hidden: Vec<Aligned<f32>> = jobs
            .iter()
            .map(|j| Aligned::zeroed(j.positions.len() * i))
            .collect();
        let hp: Vec<Shared<'_>> = hidden
            .iter_mut()
            .map(|a| Shared::new(a.as_mut_slice()))
            .collect();
        // Down's prepared input rows per job (not the prompt path's: it reads `hidden` as
        // it is), and whether its down tasks may run.
        let hacts: Vec<OnceLock<Vec<Act<'_>>>> = jobs.iter().map(|_| OnceLock::new()).collect();
        let rows2: Vec<OnceLock<Rows<'_, '_>>> = jobs.iter().map(|_| OnceLock::new()).collect();
        let open: Vec<AtomicBool> = jobs.iter().map(|_| AtomicBool::new(false)).collect();
        let yp = Shared::new(&mut *y);
        let error: Mutex<Option<KernelError>> = Mutex::new(None);
        let gang = Gang::new([tokens.len(), tasks1.len() + tasks2.len()]);

        // The job's gate/up tasks are all done: its down inputs prepared, its down opened.
        let open_down = |j: usize| {
            if let (Some(job), Some(hj), Some(slot)) = (jobs.get(j), hp.get(j), hacts.get(j)) {
                if !job.tiled {
                    // SAFETY: every writer of the job's rows (its gate/up tasks) has
                    // finished (the count reached 0 with AcqRel) and none writes again.
                    let hj = unsafe { hj.slice() };
                    let n = job.positions.len();
                    let prepared = slot.get_or_init(|| {
                        (0..n)
                            .map(|m| self.dot.prepare(format.kind, row_of(hj, m, i)))
                            .collect()
                    });
                    if let Some(r) = rows2.get(j) {
                        let _ = r.set(rows_of(prepared.iter().collect()));
                    }
                }
            }
            if let Some(o) = open.get(j) {
                o.store(true, Ordering::Release);
            }
        };
        // Waits until the job's down is open; false if the call stopped meanwhile.
        let await_down = |j: usize| -> bool {
            let Some(o) = open.get(j) else { return false };
            wait_until(|| o.load(Ordering::Acquire), &gang.stop)
        };
        let fail = |e: KernelError| {
            if let Ok(mut first) = error.lock() {
                first.get_or_insert(e);
            }
            gang.stop.store(true, Ordering::Release);
        };
        let item = |step: usize, n: usize| {
            if step == 0 {
                if let Some((t, slot)) = tokens.get(n).and_then(|&t| Some((t, acts.get(t)?))) {
                    let _ = slot.set(self.dot.prepare(format.kind, row_of(x, t, h)));
                }
                return;
            }
            if gang.stop.load(Ordering::Acquire) {
                return; // an error: the call ends without the rest of its tasks
            }
            if let Some(t) = tasks1.get(n) {
                if let Err(e) = self.gate_up(&jobs, rows1.get(), (x, k), &hp, ready, t) {
                    // Before the count: the thread that sees it reach 0 then sees `stop`
                    // and leaves the job's down closed (its rows are incomplete).
                    fail(e);
                }
                let last = left
                    .get(t.job)
                    .is_some_and(|c| c.fetch_sub(1, Ordering::AcqRel) == 1);
                if last && !gang.stop.load(Ordering::Acquire) {
                    open_down(t.job);
                }
            } else if let Some(t) = tasks2.get(n - tasks1.len()) {
                if !await_down(t.job) {
                    return;
                }
                let prepared = rows2.get(t.job).and_then(OnceLock::get);
                if let Err(e) = self.down(&jobs, prepared, &hp, &yp, ready, t) {
                    fail(e);
                }
            }
        };
        // The serial work after the activation rows: each job's rows.
        let after = |step: usize| {
            if step == 0 {
                let _ = rows1.set(
                    jobs.iter()
                        .map(|job| {
                            if job.tiled {
                                return rows_of(Vec::new());
                            }
                            rows_of(
                                job.positions
                                    .iter()
                                    .filter_map(|&p| acts.get(p / k).and_then(OnceLock::get))
                                    .collect(),
                            )
                        })
                        .collect(),
                );
            }
        };
        let routed: usize = jobs.iter().map(|j| j.positions.len()).sum();
        let macs = h.saturating_mul(i).saturating_mul(3).saturating_mul(routed);
        match &self.crew {
            Some(crew) if macs >= SMALL_CALL_MACS => {
                gang.open(&after);
                crew.run(&|| gang.work(&item, &after));
            }
            _ => {
                gang.open(&after);
                gang.work(&item, &after);
            }
        }
        if let Some(e) = error.into_inner().ok().flatten() {
            return Err(e);
        }
        // Only an error stops the call (a panic is raised again by the crew, or unwinds
        // the calling thread).
        debug_assert!(!gang.stop.load(Ordering::Acquire));
        Ok(())
    }

    /// One gate/up task: `silu(gate_r . x_n) * (up_r . x_n)` for its rows r and tokens
    /// n, written into its job's down inputs `hp[job]` at `n * I + r` (rounded to bf16
    /// if [`Self::set_round_hidden`] says so).
    fn gate_up<R: Ready>(
        &self,
        jobs: &[Job<'_>],
        rows1: Option<&Vec<Rows<'_, '_>>>,
        (x, k): (&[f32], usize),
        hp: &[Shared<'_>],
        ready: &R,
        t: &Task,
    ) -> Result<()> {
        let job = jobs
            .get(t.job)
            .ok_or(KernelError::MissingExpert { expert: 0 })?;
        wait(ready, job.expert, 1)?;
        let (xs, xf) = rows1
            .and_then(|r| r.get(t.job))
            .ok_or(KernelError::MissingExpert { expert: job.expert })?;
        let dst = hp
            .get(t.job)
            .ok_or(KernelError::MissingExpert { expert: job.expert })?;
        let i = job.w.gate.rows;
        #[cfg(target_arch = "x86_64")]
        if job.tiled {
            let h = job.w.gate.cols;
            let rows: Vec<&[f32]> = job
                .positions
                .get(t.toks.0..t.toks.1)
                .unwrap_or_default()
                .iter()
                .map(|&p| row_of(x, p / k, h))
                .collect();
            let m0 = t.toks.0;
            let round = self.round_hidden;
            let mut rounded = [0.0f32; crate::tile::HALF]; // emit's rows: at most HALF
            let mut emit = |m: usize, r: usize, v: &[f32]| {
                let v = if round {
                    let n = v.len().min(rounded.len());
                    for (d, &h) in rounded.iter_mut().zip(v) {
                        *d = bf16_round(h);
                    }
                    rounded.get(..n).unwrap_or_default()
                } else {
                    v
                };
                // SAFETY: this task alone writes rows t.rows of tokens t.toks of job
                // t.job's hidden rows, and nothing reads them before the job's last
                // gate/up task ends.
                unsafe { dst.write((m0 + m) * i + r, v) };
            };
            crate::tile::Scratch::with(h, |s| {
                // SAFETY: `tiled` holds only for the AVX-512 isas, checked by `Dot::new`.
                unsafe { crate::tile::gate_up(&job.w.gate, &job.w.up, t.rows, &rows, s, &mut emit) }
            });
            return Ok(());
        }
        let n = job.positions.len();
        let mut out = Vec::with_capacity((t.rows.1 - t.rows.0) * n);
        // Rows nothing was prepared for go straight to the f32 kernels (the same
        // bits as through `dot_act`): on small rows (tiny-code-moe's 64 and 256
        // columns) the per-call dispatch of the prepared kernels measured -13% prefill.
        let (w, rows) = (&job.w, t.rows.0..t.rows.1);
        if let Some(xf) = xf {
            let d = self.dot;
            gate_up_rows(
                w,
                rows,
                xf,
                |p, r, x| d.dots_f32(p, r, x),
                |p, r, x| d.dot_f32(p, r, x),
                &mut out,
            );
        } else if let ([], &[xt]) = by_fours(xs) {
            // One token (a decode step): each projection's rows in one kernel call.
            let rows = t.rows.1 - t.rows.0;
            let mut u = vec![0.0f32; rows];
            out.resize(rows, 0.0);
            self.dot.rows_act(&job.w.gate, t.rows.0, xt, &mut out);
            self.dot.rows_act(&job.w.up, t.rows.0, xt, &mut u);
            for (g, u) in out.iter_mut().zip(u) {
                *g = silu(*g) * u;
            }
        } else {
            let d = self.dot;
            gate_up_rows(
                w,
                rows,
                xs,
                |p, r, x| d.dots_act(p, r, x),
                |p, r, x| d.dot_act(p, r, x),
                &mut out,
            );
        }
        if self.round_hidden {
            out.iter_mut().for_each(|v| *v = bf16_round(*v));
        }
        if n == 1 {
            // SAFETY: this task alone writes rows t.rows of job t.job's hidden rows, and
            // nothing reads them before the job's last gate/up task ends.
            unsafe { dst.write(t.rows.0, &out) };
            return Ok(());
        }
        // `out` is row-major by r: value (r, m) goes to token m's row at r.
        for (idx, &v) in out.iter().enumerate() {
            let (r, m) = (t.rows.0 + idx / n.max(1), idx % n.max(1));
            // SAFETY: this task alone writes rows t.rows of job t.job's hidden rows, and
            // nothing reads them before the job's last gate/up task ends.
            unsafe { dst.write(m * i + r, std::slice::from_ref(&v)) };
        }
        Ok(())
    }

    /// One down task: `down_r . h_n` for its rows r and tokens n, written into `y` at
    /// `p * H + r` for each token's position p.
    fn down<R: Ready>(
        &self,
        jobs: &[Job<'_>],
        rows2: Option<&Rows<'_, '_>>,
        hp: &[Shared<'_>],
        yp: &Shared<'_>,
        ready: &R,
        t: &Task,
    ) -> Result<()> {
        let job = jobs
            .get(t.job)
            .ok_or(KernelError::MissingExpert { expert: 0 })?;
        #[cfg(target_arch = "x86_64")]
        if job.tiled {
            let hj = hp
                .get(t.job)
                .ok_or(KernelError::MissingExpert { expert: job.expert })?;
            // SAFETY: the job's gate/up tasks (the only writers) have ended before its
            // down tasks run.
            let hj = unsafe { hj.slice() };
            let i = job.w.down.cols;
            let rows: Vec<&[f32]> = (t.toks.0..t.toks.1).map(|m| row_of(hj, m, i)).collect();
            wait(ready, job.expert, 2)?;
            let h = job.w.down.rows;
            let mut emit = |m: usize, r: usize, v: &[f32]| {
                if let Some(&p) = job.positions.get(t.toks.0 + m) {
                    // SAFETY: this task alone writes rows t.rows of its tokens' positions.
                    unsafe { yp.write(p * h + r, v) };
                }
            };
            crate::tile::Scratch::with(i, |s| {
                // SAFETY: `tiled` holds only for the AVX-512 isas, checked by `Dot::new`.
                unsafe { crate::tile::down(&job.w.down, t.rows, &rows, s, &mut emit) }
            });
            return Ok(());
        }
        let (hs, hf) = rows2.ok_or(KernelError::MissingExpert { expert: job.expert })?;
        wait(ready, job.expert, 2)?;
        let h = job.w.down.rows;
        let n = job.positions.len();
        let mut out = Vec::with_capacity((t.rows.1 - t.rows.0) * n);
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
        } else if let ([], &[ht]) = by_fours(hs) {
            // One token: the rows in one kernel call, as in `gate_up`, and one copy.
            out.resize(t.rows.1 - t.rows.0, 0.0);
            self.dot.rows_act(&job.w.down, t.rows.0, ht, &mut out);
            if let Some(&p) = job.positions.first() {
                // SAFETY: this task alone writes rows t.rows of its job's positions.
                unsafe { yp.write(p * h + t.rows.0, &out) };
            }
            return Ok(());
        } else {
            for r in t.rows.0..t.rows.1 {
                let (quads, rest) = by_fours(hs);
                for &four in quads {
                    out.extend(self.dot.dots_act(&job.w.down, r, four));
                }
                for &ht in rest {
                    out.push(self.dot.dot_act(&job.w.down, r, ht));
                }
            }
        }
        // `out` is row-major by r: value (r, m) goes to position m's row at r.
        for (idx, &v) in out.iter().enumerate() {
            let (r, m) = (t.rows.0 + idx / n.max(1), idx % n.max(1));
            if let Some(&p) = job.positions.get(m) {
                // SAFETY: this task alone writes rows t.rows of its job's positions.
                unsafe { yp.write(p * h + r, std::slice::from_ref(&v)) };
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
        let len = routing.ids.len() * format.hidden();
        // Large calls reuse the kept buffer when no other call holds it: every position
        // is written (every routed expert is listed), so what it held does not matter.
        let kept = (KEEP_OUTPUTS..=KEEP_OUTPUTS_MAX)
            .contains(&len)
            .then(|| self.outputs.try_lock().ok())
            .flatten();
        if let Some(mut y) = kept {
            y.resize(len, 0.0);
            let y = y.get_mut(..len).unwrap_or_default();
            self.expert_outputs(format, routing, experts, &AllReady, y)?;
            return weighted_sum(y, weights, routing.top_k, format.hidden(), out);
        }
        let mut y = vec![0.0f32; len];
        self.expert_outputs(format, routing, experts, &AllReady, &mut y)?;
        weighted_sum(&y, weights, routing.top_k, format.hidden(), out)
    }
}

/// `silu(gate x) * up x` of rows `rows` of `w` for each token of `xs`, row by row, in
/// `out`: four tokens at a time by `dots` (one read of each weight row for all four),
/// the rest one by one by `dot` (each token's bits the same either way).
fn gate_up_rows<'x, A: ?Sized>(
    w: &ExpertWeights<'_>,
    rows: std::ops::Range<usize>,
    xs: &[&'x A],
    dots: impl Fn(&Proj<'_>, usize, [&'x A; TOKENS]) -> [f32; TOKENS],
    dot: impl Fn(&Proj<'_>, usize, &'x A) -> f32,
    out: &mut Vec<f32>,
) {
    let (quads, rest) = by_fours(xs);
    for r in rows {
        for &four in quads {
            let (g, u) = (dots(&w.gate, r, four), dots(&w.up, r, four));
            out.extend(g.iter().zip(u).map(|(&g, u)| silu(g) * u));
        }
        for &xt in rest {
            out.push(silu(dot(&w.gate, r, xt)) * dot(&w.up, r, xt));
        }
    }
}

/// Activation rows in fours for [`Dot::dots_act`] (one read of each weight row per four
/// tokens) and the rest one by one. (int4 rows went one by one while their only
/// four-token path was slower; the AVX-512 int4 kernels are 1.9-2.6x faster per token
/// four at a time, `examples/dot_speed.rs`, and the other paths loop over the four.)
fn by_fours<'a, 'x, A: ?Sized>(rows: &'a [&'x A]) -> (&'a [[&'x A; TOKENS]], &'a [&'x A]) {
    rows.as_chunks::<TOKENS>()
}

/// A buffer tasks on several threads write disjoint parts of.
struct Shared<'a> {
    ptr: *mut f32,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a view of a `&mut [f32]` whose users keep writes disjoint (see the methods).
unsafe impl Sync for Shared<'_> {}
// SAFETY: as above.
unsafe impl Send for Shared<'_> {}

impl<'a> Shared<'a> {
    fn new(buf: &'a mut [f32]) -> Self {
        Self {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: std::marker::PhantomData,
        }
    }

    /// Copies `v` to `start..` (nothing if it does not fit).
    ///
    /// # Safety
    /// No other thread reads or writes those values meanwhile.
    unsafe fn write(&self, start: usize, v: &[f32]) {
        if start
            .checked_add(v.len())
            .is_some_and(|end| end <= self.len)
        {
            // SAFETY: in bounds (checked); exclusive by the caller's guarantee.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(start), v.len()) };
        }
    }

    /// The whole buffer.
    ///
    /// # Safety
    /// Nobody writes it while the slice lives.
    unsafe fn slice(&self) -> &[f32] {
        // SAFETY: `len` values at `ptr` (a live `&mut [f32]`); no writer (caller).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
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
            tiled: false,
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
/// Blocks of a job on the prompt path are a multiple of `align` rows (its tile's).
fn tasks(
    jobs: &[Job<'_>],
    rows: usize,
    macs_per_row_token: usize,
    threads: usize,
    align: usize,
) -> Vec<Task> {
    let total: usize = jobs
        .iter()
        .map(|j| {
            macs_per_row_token
                .saturating_mul(j.positions.len())
                .saturating_mul(rows)
        })
        .sum();
    let min = MIN_TASK_MACS.max(total / threads.saturating_mul(tasks_per_thread()).max(1));
    let mut out = Vec::new();
    for (job, j) in jobs.iter().enumerate() {
        let n = j.positions.len();
        let per_row = macs_per_row_token.saturating_mul(n).max(1);
        let mut block = min.div_ceil(per_row).clamp(1, rows.max(1));
        let mut chunk = n;
        if j.tiled {
            block = block.next_multiple_of(align.max(1)).min(rows.max(1));
            // One block holds the whole expert: split its tokens instead (an expert of
            // 437 of a prompt's 4096 positions was one task of 1/5 of a thread's work).
            let pieces = per_row.saturating_mul(block).div_ceil(min.max(1)).max(1);
            chunk = n
                .div_ceil(pieces)
                .next_multiple_of(crate::tile::TB)
                .max(MIN_TILE_TASK_TOKENS);
        }
        let mut r = 0;
        while r < rows {
            let end = (r + block).min(rows);
            let mut m = 0;
            while m < n {
                let m1 = (m + chunk.max(1)).min(n);
                out.push(Task {
                    job,
                    rows: (r, end),
                    toks: (m, m1),
                });
                m = m1;
            }
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
