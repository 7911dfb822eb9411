//! One decode step of a standard-attention MoE decoder for one token, in one call:
//! embedding row, then per layer RMSNorm, q/k/v projections (optional biases, q/k
//! RMSNorm per head or over all heads, clipping), RoPE, the KV cache write, grouped-query
//! attention over the cached positions, o-projection and residual; RMSNorm, the softmax
//! router's top-k (optionally renormalised), the routed experts on the fused kernels'
//! row dot products (as [`Kernels::moe_layer`] computes one token, without its setup),
//! an optional (sigmoid-gated) shared expert or a dense SwiGLU MLP, residual; then the
//! final norm and the LM head.
//!
//! Why: on tiny-code-moe (8 layers, hidden 256) the torch path spends ~4 ms a token in
//! ~40 small torch ops per layer, each 5-20 us of dispatch for microseconds of math;
//! the same math here is one call of ~0.7 ms at 512 cached positions on the CPU box
//! (docs/benchmarks.md, "Decode step in Rust").
//!
//! Numerics: every activation is f32 from the embedding row to the logits (the torch
//! path rounds to the model dtype between ops; with an f32 model the two differ only by
//! summation order). Weights are read in their own dtype (f32, bf16, f16) and widened
//! exactly; the KV cache is read and written in its dtype (f32, or bf16 rounded to
//! nearest even, as torch's copy rounds).
//!
//! Threads: with more than one (the kernels' crew, `crew.rs`), every thread runs the
//! whole step as a team (`team.rs`), computing its share of each product and meeting
//! at a spin barrier to exchange shares; one wake of the crew per step (waking it per
//! product measured slower than one thread, see [`Kernels::routed`]); with one thread
//! the calling thread runs it.
//! Every output value is computed by one thread with the same operations, so the result
//! does not depend on the number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::act::Act;
use crate::crew::Crew;
use crate::error::{KernelError, Result};
use crate::format::{bf16_to_f32, ExpertFormat, Proj};
#[cfg(target_arch = "x86_64")]
use crate::isa::Isa;
use crate::layer::{weighted_sum, ExpertWeights, Kernels};
use crate::scalar::silu;
use crate::simd::TOKENS;
use crate::team::{StopOnPanic, Team};

/// Where q and k are RMS-normalised after their projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// No q/k norm (Qwen2-MoE, Mixtral).
    None,
    /// Each head's `D` values with one `[D]` weight (Qwen3-MoE).
    PerHead,
    /// All heads' values at once with an `[N * D]` weight (OLMoE).
    Full,
}

/// The shape and numerics of the decoder.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    /// H.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// D (every dim rotates).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// The q/k norm.
    pub qk_norm: QkNorm,
    /// q, k and v clamped to `[-c, c]` after the projection (OLMoE), if set.
    pub clip_qkv: Option<f32>,
    /// Routed experts per token.
    pub top_k: usize,
    /// Top-k weights divided by their sum.
    pub norm_topk_prob: bool,
    /// Cache positions (rows of `cos` / `sin`, slots of each cache head).
    pub context: usize,
}

/// A SwiGLU MLP: `down(silu(gate(x)) * up(x))` (dense layers, shared experts).
#[derive(Debug, Clone, Copy)]
pub struct Swiglu<'a> {
    /// Gate `[I, H]`.
    pub gate: Proj<'a>,
    /// Up `[I, H]`.
    pub up: Proj<'a>,
    /// Down `[H, I]`.
    pub down: Proj<'a>,
}

/// One layer's attention weights.
#[derive(Debug, Clone)]
pub struct Attn<'a> {
    /// q `[Nq * D, H]`.
    pub q: Proj<'a>,
    /// k `[Nkv * D, H]`.
    pub k: Proj<'a>,
    /// v `[Nkv * D, H]`.
    pub v: Proj<'a>,
    /// o `[H, Nq * D]`.
    pub o: Proj<'a>,
    /// q, k, v biases (Qwen2-MoE), f32.
    pub bias: Option<[&'a [f32]; 3]>,
    /// o's bias, f32.
    pub o_bias: Option<&'a [f32]>,
    /// q and k norm weights, f32 (`[D]` per head or `[N * D]`, per [`StepShape::qk_norm`]).
    pub qk_norm: Option<[&'a [f32]; 2]>,
}

/// The routed experts (and optional shared expert) of an MoE layer.
#[derive(Debug, Clone)]
pub struct Moe<'a> {
    /// Router `[E, H]`.
    pub router: Proj<'a>,
    /// Every expert's weights, by id, in the kernels' format.
    pub experts: Vec<ExpertWeights<'a>>,
    /// A shared expert added to the routed ones.
    pub shared: Option<Swiglu<'a>>,
    /// Its gate `[1, H]`: the shared output is scaled by `sigmoid(gate . x)` (Qwen2-MoE).
    pub shared_gate: Option<Proj<'a>>,
}

/// The MLP of a layer.
#[derive(Debug, Clone)]
pub enum Ffn<'a> {
    /// Router + routed experts (+ shared expert).
    Moe(Moe<'a>),
    /// A dense SwiGLU MLP.
    Dense(Swiglu<'a>),
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct Layer<'a> {
    /// Input RMSNorm weight `[H]`, f32.
    pub input_norm: &'a [f32],
    /// Post-attention RMSNorm weight `[H]`, f32.
    pub post_norm: &'a [f32],
    /// Attention.
    pub attn: Attn<'a>,
    /// MLP.
    pub ffn: Ffn<'a>,
}

/// The whole decoder, read-only.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    /// Shape and numerics.
    pub shape: StepShape,
    /// Embedding `[V, H]`.
    pub embed: Proj<'a>,
    /// Final RMSNorm weight `[H]`, f32.
    pub final_norm: &'a [f32],
    /// LM head `[V, H]`.
    pub lm_head: Proj<'a>,
    /// RoPE tables `[context, D]` each, f32.
    pub cos: &'a [f32],
    /// See `cos`.
    pub sin: &'a [f32],
    /// The layers.
    pub layers: Vec<Layer<'a>>,
    /// The routed experts' format (every MoE layer's).
    pub experts: ExpertFormat,
}

/// One layer's keys or values `[Nkv, context, D]`, in the cache's dtype.
#[derive(Debug)]
pub enum KvRows<'a> {
    /// f32 cache.
    F32(&'a mut [f32]),
    /// bf16 cache (bits).
    Bf16(&'a mut [u16]),
}

/// One layer's slice of the KV cache.
#[derive(Debug)]
pub struct LayerCache<'a> {
    /// Keys `[Nkv, context, D]`.
    pub keys: KvRows<'a>,
    /// Values `[Nkv, context, D]`.
    pub values: KvRows<'a>,
}

impl KvRows<'_> {
    fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
        }
    }

    /// The rows split into heads of `per` values (views of this layer's slice).
    fn heads(&mut self, per: usize) -> Vec<KvRows<'_>> {
        match self {
            Self::F32(v) => v.chunks_mut(per.max(1)).map(KvRows::F32).collect(),
            Self::Bf16(v) => v.chunks_mut(per.max(1)).map(KvRows::Bf16).collect(),
        }
    }

    /// Stores `x` at `at` (rounding to bf16 for a bf16 cache).
    fn write(&mut self, at: usize, x: &[f32]) {
        match self {
            Self::F32(v) => {
                if let Some(dst) = v.get_mut(at..at + x.len()) {
                    dst.copy_from_slice(x);
                }
            }
            Self::Bf16(v) => {
                if let Some(dst) = v.get_mut(at..at + x.len()) {
                    dst.iter_mut().zip(x).for_each(|(d, &s)| *d = to_bf16(s));
                }
            }
        }
    }

    /// Rows `0..n` of head `g` (`[context, D]` per head), widened to f32 into `buf`
    /// for a bf16 cache.
    fn head<'b>(
        &'b self,
        g: usize,
        n: usize,
        ctx: usize,
        d: usize,
        buf: &'b mut Vec<f32>,
    ) -> &'b [f32] {
        let range = g * ctx * d..(g * ctx + n) * d;
        match self {
            Self::F32(v) => v.get(range).unwrap_or_default(),
            Self::Bf16(v) => {
                buf.clear();
                buf.extend(
                    v.get(range)
                        .unwrap_or_default()
                        .iter()
                        .map(|&b| bf16_to_f32(b)),
                );
                buf
            }
        }
    }
}

/// f32 -> bf16 bits, round to nearest even (NaN stays NaN), as torch's cast.
fn to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    let round = ((b >> 16) & 1) + 0x7fff;
    (b.wrapping_add(round) >> 16) as u16
}

/// The hidden state and scratch rows of one step.
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    scores: Vec<f32>,
    ffn: Vec<f32>,
    mlp_h: Vec<f32>,
    logits_e: Vec<f32>,
}

impl Kernels {
    /// Runs `token` at position `pos` through `m`, writing each layer's key and value at
    /// `pos` into `caches` (one per layer) and reading positions `0..=pos`; writes the
    /// last token's logits `[V]` into `logits`.
    pub fn decode_step(
        &self,
        m: &Decoder<'_>,
        caches: &mut [LayerCache<'_>],
        token: usize,
        pos: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        let s = &m.shape;
        let (h, d) = (s.hidden, s.head_dim);
        check(m, caches, token, pos, logits)?;
        if let Some(crew) = &self.crew {
            return self.decode_team(crew, m, caches, token, pos, logits);
        }
        let mut t = Scratch {
            x: vec![0.0; h],
            xn: vec![0.0; h],
            q: vec![0.0; s.heads * d],
            k: vec![0.0; s.kv_heads * d],
            v: vec![0.0; s.kv_heads * d],
            attn: vec![0.0; s.heads * d],
            o: vec![0.0; h],
            scores: Vec::with_capacity(pos + 1),
            ffn: vec![0.0; h],
            mlp_h: Vec::new(),
            logits_e: Vec::new(),
        };
        embed_row(&m.embed, token, &mut t.x);
        let cos = m.cos.get(pos * d..(pos + 1) * d).unwrap_or_default();
        let sin = m.sin.get(pos * d..(pos + 1) * d).unwrap_or_default();
        for (layer, cache) in m.layers.iter().zip(caches.iter_mut()) {
            rms_norm(&t.x, layer.input_norm, s.eps, &mut t.xn);
            self.attention(m, layer, cache, pos, (cos, sin), &mut t)?;
            // t.x is now the residual after attention
            rms_norm(&t.x, layer.post_norm, s.eps, &mut t.xn);
            match &layer.ffn {
                Ffn::Moe(moe) => self.moe(m, moe, &mut t)?,
                Ffn::Dense(mlp) => {
                    let (xn, ffn, hbuf) = (&t.xn, &mut t.ffn, &mut t.mlp_h);
                    self.swiglu(mlp, xn, hbuf, ffn)?;
                }
            }
            t.x.iter_mut().zip(&t.ffn).for_each(|(x, &f)| *x += f);
        }
        rms_norm(&t.x, m.final_norm, s.eps, &mut t.xn);
        self.matvec(&m.lm_head, &t.xn, logits)
    }

    /// [`Self::decode_step`] on every thread of the crew at once (module docs, `team.rs`):
    /// each thread gets its kv groups of every layer's cache and its rows of the logits.
    fn decode_team(
        &self,
        crew: &Crew,
        m: &Decoder<'_>,
        caches: &mut [LayerCache<'_>],
        token: usize,
        pos: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        let s = &m.shape;
        let team = Team::new(self.threads);
        let n = team.threads();
        let per = s.context * s.head_dim;
        let mut groups: Vec<Vec<Vec<(KvRows<'_>, KvRows<'_>)>>> =
            (0..n).map(|_| Vec::new()).collect();
        for cache in caches.iter_mut() {
            let mut both = cache
                .keys
                .heads(per)
                .into_iter()
                .zip(cache.values.heads(per));
            for (tid, mine) in groups.iter_mut().enumerate() {
                let (g0, g1) = team.share(tid, s.kv_heads);
                mine.push(both.by_ref().take(g1 - g0).collect());
            }
        }
        let mut outs = Vec::with_capacity(n);
        let mut rest = logits;
        for tid in 0..n {
            let (v0, v1) = team.share(tid, m.lm_head.rows);
            let (mine, tail) = rest.split_at_mut(v1 - v0);
            outs.push((v0, mine));
            rest = tail;
        }
        let team = &team;
        // Every thread's share, taken by the thread that claims its seat: the caller and
        // each worker claim one (the team's barriers wait until all `n` have).
        let seats: Vec<Mutex<Option<_>>> = groups
            .into_iter()
            .zip(outs)
            .map(|seat| Mutex::new(Some(seat)))
            .collect();
        let next = AtomicUsize::new(0);
        crew.run(&|| {
            let tid = next.fetch_add(1, Ordering::Relaxed);
            let seat = seats
                .get(tid)
                .and_then(|s| s.lock().ok().and_then(|mut s| s.take()));
            if let Some((mut g, (v0, out))) = seat {
                self.member(m, team, tid, &mut g, token, pos, (v0, out));
            }
        });
        team.take_error().map_or(Ok(()), Err)
    }

    /// One thread of [`Self::decode_team`]; an error stops the others.
    #[allow(clippy::too_many_arguments)] // reason: the step's operands and this thread's share
    fn member(
        &self,
        m: &Decoder<'_>,
        team: &Team,
        tid: usize,
        groups: &mut [Vec<(KvRows<'_>, KvRows<'_>)>],
        token: usize,
        pos: usize,
        logits: (usize, &mut [f32]),
    ) {
        let _guard = StopOnPanic(team);
        if let Err(e) = self.member_step(m, team, tid, groups, token, pos, logits) {
            team.fail(e);
        }
    }

    /// The step of thread `tid`: returns early (Ok) when another thread stopped it.
    #[allow(clippy::too_many_arguments)] // reason: as `member`
    fn member_step(
        &self,
        m: &Decoder<'_>,
        team: &Team,
        tid: usize,
        groups: &mut [Vec<(KvRows<'_>, KvRows<'_>)>],
        token: usize,
        pos: usize,
        (v0, logits): (usize, &mut [f32]),
    ) -> Result<()> {
        let s = &m.shape;
        let (h, d) = (s.hidden, s.head_dim);
        let (qd, kd) = (s.heads * d, s.kv_heads * d);
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let cos = m.cos.get(pos * d..(pos + 1) * d).unwrap_or_default();
        let sin = m.sin.get(pos * d..(pos + 1) * d).unwrap_or_default();
        let (g0, _) = team.share(tid, s.kv_heads);
        let mut turn = 0;
        let (mut x, mut xn, mut o, mut ffn) =
            (vec![0.0; h], vec![0.0; h], vec![0.0; h], vec![0.0; h]);
        let (mut qkv, mut attn) = (vec![0.0; qd + 2 * kd], vec![0.0; qd]);
        let (mut part, mut scores, mut mlp_h, mut kbuf, mut vbuf) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        embed_row(&m.embed, token, &mut x);
        for (layer, mine) in m.layers.iter().zip(groups.iter_mut()) {
            let a = &layer.attn;
            rms_norm(&x, layer.input_norm, s.eps, &mut xn);
            // this thread's rows of q, k and v stacked
            let (r0, r1) = team.share(tid, qd + 2 * kd);
            part.clear();
            part.resize(r1 - r0, 0.0);
            let mut at = 0;
            for (w, start) in [(&a.q, 0), (&a.k, qd), (&a.v, qd + kd)] {
                let (lo, hi) = (r0.max(start), r1.min(start + w.rows));
                if lo < hi {
                    let act = self.dot.prepare(w.kind, &xn);
                    let dst = part.get_mut(at..at + hi - lo).unwrap_or_default();
                    self.dot.rows_act(w, lo - start, &act, dst);
                    at += hi - lo;
                }
            }
            if !team.gather(tid, &mut turn, &part, &mut qkv) {
                return Ok(());
            }
            let (q, kv) = qkv.split_at_mut(qd);
            let (k, v) = kv.split_at_mut(kd);
            finish_qkv(s, a, [q, k, v], (cos, sin));
            // this thread's kv groups: cache write, then their heads' attention
            part.clear();
            part.resize(mine.len() * group * d, 0.0);
            for (j, ((keys, values), outs)) in mine
                .iter_mut()
                .zip(part.chunks_exact_mut(group * d))
                .enumerate()
            {
                let g = g0 + j;
                keys.write(pos * d, k.get(g * d..(g + 1) * d).unwrap_or_default());
                values.write(pos * d, v.get(g * d..(g + 1) * d).unwrap_or_default());
                let kr = keys.head(0, pos + 1, s.context, d, &mut kbuf);
                let vr = values.head(0, pos + 1, s.context, d, &mut vbuf);
                let qs = q
                    .get(g * group * d..(g + 1) * group * d)
                    .unwrap_or_default();
                self.attend(qs, kr, vr, d, scale, &mut scores, outs);
            }
            if !team.gather(tid, &mut turn, &part, &mut attn) {
                return Ok(());
            }
            let (r0, r1) = team.share(tid, h);
            part.clear();
            part.resize(r1 - r0, 0.0);
            self.dot
                .rows_act(&a.o, r0, &self.dot.prepare(a.o.kind, &attn), &mut part);
            if !team.gather(tid, &mut turn, &part, &mut o) {
                return Ok(());
            }
            if let Some(b) = a.o_bias {
                o.iter_mut().zip(b).for_each(|(o, &b)| *o += b);
            }
            x.iter_mut().zip(&o).for_each(|(x, &o)| *x += o);
            rms_norm(&x, layer.post_norm, s.eps, &mut xn);
            match &layer.ffn {
                Ffn::Moe(moe) => {
                    if !self.member_moe(m, moe, team, tid, &mut turn, &xn, &mut part, &mut ffn)? {
                        return Ok(());
                    }
                    if let Some(mlp) = &moe.shared {
                        let mut shared = vec![0.0; h];
                        self.swiglu(mlp, &xn, &mut mlp_h, &mut shared)?;
                        if let Some(gate) = &moe.shared_gate {
                            let mut gv = [0.0f32];
                            self.dot
                                .rows_act(gate, 0, &self.dot.prepare(gate.kind, &xn), &mut gv);
                            let sig = 1.0 / (1.0 + (-gv[0]).exp());
                            shared.iter_mut().for_each(|v| *v *= sig);
                        }
                        ffn.iter_mut().zip(&shared).for_each(|(o, &v)| *o += v);
                    }
                }
                Ffn::Dense(mlp) => self.swiglu(mlp, &xn, &mut mlp_h, &mut ffn)?,
            }
            x.iter_mut().zip(&ffn).for_each(|(x, &f)| *x += f);
        }
        rms_norm(&x, m.final_norm, s.eps, &mut xn);
        self.dot.rows_act(
            &m.lm_head,
            v0,
            &self.dot.prepare(m.lm_head.kind, &xn),
            logits,
        );
        Ok(())
    }

    /// The router (on every thread) and this thread's share of the routed experts,
    /// gathered and summed into `ffn`; Ok(false) when another thread stopped the step.
    #[allow(clippy::too_many_arguments)] // reason: the block's operands and the team
    fn member_moe(
        &self,
        m: &Decoder<'_>,
        moe: &Moe<'_>,
        team: &Team,
        tid: usize,
        turn: &mut usize,
        xn: &[f32],
        part: &mut Vec<f32>,
        ffn: &mut [f32],
    ) -> Result<bool> {
        let s = &m.shape;
        let h = s.hidden;
        let mut logits = vec![0.0; moe.router.rows];
        self.dot.rows_act(
            &moe.router,
            0,
            &self.dot.prepare(moe.router.kind, xn),
            &mut logits,
        );
        softmax(&mut logits);
        let (ids, mut weights) = top_k(&logits, s.top_k);
        if s.norm_topk_prob {
            let sum: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        let (e0, e1) = team.share(tid, ids.len());
        part.clear();
        part.resize((e1 - e0) * h, 0.0);
        let act = self.dot.prepare(m.experts.kind, xn);
        for (&i, y) in ids
            .get(e0..e1)
            .unwrap_or_default()
            .iter()
            .zip(part.chunks_exact_mut(h))
        {
            let w = usize::try_from(i)
                .ok()
                .and_then(|i| moe.experts.get(i))
                .ok_or(KernelError::MissingExpert { expert: i as u32 })?;
            self.expert(w, &act, y)?;
        }
        let mut y = vec![0.0; ids.len() * h];
        if !team.gather(tid, turn, part, &mut y) {
            return Ok(false);
        }
        weighted_sum(&y, &weights, ids.len(), h, ffn)?;
        Ok(true)
    }

    /// Attention of one layer: `t.x += o(attn(norm(x)))`, `t.xn` holding `norm(x)`.
    fn attention(
        &self,
        m: &Decoder<'_>,
        layer: &Layer<'_>,
        cache: &mut LayerCache<'_>,
        pos: usize,
        (cos, sin): (&[f32], &[f32]),
        t: &mut Scratch,
    ) -> Result<()> {
        let s = &m.shape;
        let a = &layer.attn;
        let d = s.head_dim;
        self.matvec(&a.q, &t.xn, &mut t.q)?;
        self.matvec(&a.k, &t.xn, &mut t.k)?;
        self.matvec(&a.v, &t.xn, &mut t.v)?;
        finish_qkv(s, a, [&mut t.q, &mut t.k, &mut t.v], (cos, sin));
        let ctx = s.context;
        for (g, (k, v)) in t.k.chunks_exact(d).zip(t.v.chunks_exact(d)).enumerate() {
            cache.keys.write((g * ctx + pos) * d, k);
            cache.values.write((g * ctx + pos) * d, v);
        }
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let n = pos + 1;
        let mut kbuf = Vec::new();
        let mut vbuf = Vec::new();
        for g in 0..s.kv_heads {
            let keys = cache.keys.head(g, n, ctx, d, &mut kbuf);
            let values = cache.values.head(g, n, ctx, d, &mut vbuf);
            let qs =
                t.q.get(g * group * d..(g + 1) * group * d)
                    .unwrap_or_default();
            let outs = t
                .attn
                .get_mut(g * group * d..(g + 1) * group * d)
                .unwrap_or_default();
            self.attend(qs, keys, values, d, scale, &mut t.scores, outs);
        }
        self.matvec(&a.o, &t.attn, &mut t.o)?;
        if let Some(b) = a.o_bias {
            t.o.iter_mut().zip(b).for_each(|(o, &b)| *o += b);
        }
        t.x.iter_mut().zip(&t.o).for_each(|(x, &o)| *x += o);
        Ok(())
    }

    /// Softmax attention of the query heads `qs` (`[G, D]`, one kv group) over `keys` and
    /// `values` (`[n, D]`) into `outs` (`[G, D]`). Scores of up to [`TOKENS`] heads are
    /// taken per key row read.
    #[allow(clippy::too_many_arguments)] // reason: one slice per operand of the formula
    fn attend(
        &self,
        qs: &[f32],
        keys: &[f32],
        values: &[f32],
        d: usize,
        scale: f32,
        scores: &mut Vec<f32>,
        outs: &mut [f32],
    ) {
        let n = keys.len() / d.max(1);
        let kp = Proj {
            kind: crate::format::WeightKind::F32,
            rows: n,
            cols: d,
            weights: f32_bytes(keys),
            scales: &[],
        };
        let heads: Vec<&[f32]> = qs.chunks_exact(d).collect();
        let g = heads.len();
        scores.clear();
        scores.resize(g * n, 0.0); // [G, n]
        let (quads, rest) = heads.as_chunks::<TOKENS>();
        for (qi, four) in quads.iter().enumerate() {
            for r in 0..n {
                let v = self.dot.dots_f32(&kp, r, *four);
                for (j, &s) in v.iter().enumerate() {
                    if let Some(dst) = scores.get_mut((qi * TOKENS + j) * n + r) {
                        *dst = s * scale;
                    }
                }
            }
        }
        for (j, q) in rest.iter().enumerate() {
            let head = quads.len() * TOKENS + j;
            for r in 0..n {
                if let Some(dst) = scores.get_mut(head * n + r) {
                    *dst = self.dot.dot_f32(&kp, r, q) * scale;
                }
            }
        }
        for (row, out) in scores
            .chunks_exact_mut(n.max(1))
            .zip(outs.chunks_exact_mut(d))
        {
            softmax(row);
            self.weighted_rows(row, values, out);
        }
    }

    /// `out = sum_r p[r] * values[r]` (rows of `out.len()` values), r in order.
    fn weighted_rows(&self, p: &[f32], values: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if matches!(self.dot.isa(), Isa::Avx512 | Isa::Avx512Bf16) {
            // SAFETY: `Dot::new` checked avx512f.
            return unsafe { weighted_rows_avx512(p, values, out) };
        }
        weighted_rows(p, values, out);
    }

    /// The MoE block into `t.ffn` from `t.xn`.
    fn moe(&self, m: &Decoder<'_>, moe: &Moe<'_>, t: &mut Scratch) -> Result<()> {
        let s = &m.shape;
        let e = moe.router.rows;
        t.logits_e.resize(e, 0.0);
        self.matvec(&moe.router, &t.xn, &mut t.logits_e)?;
        softmax(&mut t.logits_e);
        let (ids, mut weights) = top_k(&t.logits_e, s.top_k);
        if s.norm_topk_prob {
            let sum: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        let experts = ids
            .iter()
            .map(|&i| {
                let w = usize::try_from(i).ok().and_then(|i| moe.experts.get(i));
                w.copied()
                    .ok_or(KernelError::MissingExpert { expert: i as u32 })
            })
            .collect::<Result<Vec<_>>>()?;
        self.routed(m.experts, &experts, &t.xn, &weights, &mut t.ffn)?;
        if let Some(mlp) = &moe.shared {
            let mut shared = vec![0.0; s.hidden];
            self.swiglu(mlp, &t.xn, &mut t.mlp_h, &mut shared)?;
            if let Some(gate) = &moe.shared_gate {
                let mut gv = [0.0f32];
                self.matvec(gate, &t.xn, &mut gv)?;
                let sig = 1.0 / (1.0 + (-gv[0]).exp());
                shared.iter_mut().for_each(|v| *v *= sig);
            }
            t.ffn.iter_mut().zip(&shared).for_each(|(o, &v)| *o += v);
        }
        Ok(())
    }

    /// The routed experts of one token: `out = sum_k weights[k] * expert_k(x)`, k in
    /// rank order ([`weighted_sum`]). Each expert's rows go through the same dot
    /// products as in [`Kernels::moe_layer`] at one token (the same bits), without its
    /// grouping, task lists and per-row dispatch, which cost more than the math at
    /// tiny-code-moe's size (64 x 256 projections). The one-thread step's: splitting
    /// the experts in two halves across the pool per layer measured slower (two threads
    /// 0.95-1.04 ms a step against one thread's 0.68-0.71, tiny-code-moe at position
    /// 512: waking the pool's thread per layer costs more than half the experts), which
    /// is why more threads run the step as a team ([`Kernels::decode_step`]).
    fn routed(
        &self,
        format: ExpertFormat,
        experts: &[ExpertWeights<'_>],
        x: &[f32],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let h = out.len();
        if format.hidden() != h || x.len() != h {
            return Err(KernelError::BadLength {
                what: "hidden states",
                got: x.len(),
                want: format.hidden(),
            });
        }
        let mut y = vec![0.0f32; experts.len() * h];
        let act = self.dot.prepare(format.kind, x);
        for (w, yk) in experts.iter().zip(y.chunks_exact_mut(h)) {
            self.expert(w, &act, yk)?;
        }
        weighted_sum(&y, weights, experts.len(), h, out)
    }

    /// One expert on one prepared activation row: `y = down(silu(gate x) * up x)`.
    fn expert(&self, w: &ExpertWeights<'_>, x: &Act<'_>, y: &mut [f32]) -> Result<()> {
        let i = w.gate.rows;
        let mut g = vec![0.0f32; i];
        let mut u = vec![0.0f32; i];
        self.dot.rows_act(&w.gate, 0, x, &mut g);
        self.dot.rows_act(&w.up, 0, x, &mut u);
        g.iter_mut().zip(&u).for_each(|(g, &u)| *g = silu(*g) * u);
        let hact = self.dot.prepare(w.down.kind, &g);
        if w.down.rows != y.len() || w.down.cols != g.len() {
            return Err(KernelError::BadLength {
                what: "expert output",
                got: y.len(),
                want: w.down.rows,
            });
        }
        self.dot.rows_act(&w.down, 0, &hact, y);
        Ok(())
    }

    /// `out = down(silu(gate(x)) * up(x))`; `hbuf` is scratch.
    fn swiglu(
        &self,
        mlp: &Swiglu<'_>,
        x: &[f32],
        hbuf: &mut Vec<f32>,
        out: &mut [f32],
    ) -> Result<()> {
        let i = mlp.gate.rows;
        let mut up = vec![0.0; i];
        hbuf.resize(i, 0.0);
        self.matvec(&mlp.gate, x, hbuf)?;
        self.matvec(&mlp.up, x, &mut up)?;
        hbuf.iter_mut()
            .zip(&up)
            .for_each(|(g, &u)| *g = silu(*g) * u);
        self.matvec(&mlp.down, hbuf, out)
    }

    /// `out[r] = w[r] . x` for every row, on the calling thread.
    fn matvec(&self, w: &Proj<'_>, x: &[f32], out: &mut [f32]) -> Result<()> {
        if w.cols != x.len() || w.rows != out.len() {
            return Err(KernelError::BadLength {
                what: "matrix-vector operands",
                got: x.len() * out.len(),
                want: w.cols * w.rows,
            });
        }
        self.dot.rows_act(w, 0, &self.dot.prepare(w.kind, x), out);
        Ok(())
    }
}

/// [`Kernels::weighted_rows`] compiled for AVX-512F (the generic body vectorizes to 16
/// lanes there, to SSE's 4 without).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_rows_avx512(p: &[f32], values: &[f32], out: &mut [f32]) {
    weighted_rows(p, values, out);
}

/// `out = sum_r p[r] * values[r]`, 16 columns at a time held in a local accumulator
/// across all rows (one multiply and one add per value, r in order).
#[inline(always)]
fn weighted_rows(p: &[f32], values: &[f32], out: &mut [f32]) {
    let d = out.len();
    if d == 0 {
        return;
    }
    let (chunks, rest) = out.as_chunks_mut::<16>();
    for (c, dst) in chunks.iter_mut().enumerate() {
        let mut acc = [0.0f32; 16];
        for (&w, v) in p.iter().zip(values.chunks_exact(d)) {
            let block = v.get(c * 16..).map(|v| v.as_chunks::<16>().0);
            if let Some(v) = block.and_then(|b| b.first()) {
                acc.iter_mut().zip(v).for_each(|(a, &v)| *a += w * v);
            }
        }
        *dst = acc;
    }
    let tail = chunks.len() * 16;
    for (j, o) in rest.iter_mut().enumerate() {
        *o = p
            .iter()
            .zip(values.chunks_exact(d))
            .fold(0.0, |a, (&w, v)| {
                a + w * v.get(tail + j).copied().unwrap_or(0.0)
            });
    }
}

/// Biases, q/k norm, clipping and RoPE on the projected q, k, v (each `[N * D]`).
fn finish_qkv(s: &StepShape, a: &Attn<'_>, qkv: [&mut [f32]; 3], (cos, sin): (&[f32], &[f32])) {
    let [q, k, v] = qkv;
    let d = s.head_dim;
    if let Some([bq, bk, bv]) = a.bias {
        for (y, b) in [(&mut *q, bq), (&mut *k, bk), (&mut *v, bv)] {
            y.iter_mut().zip(b).for_each(|(y, &b)| *y += b);
        }
    }
    if let Some([nq, nk]) = a.qk_norm {
        for (y, w) in [(&mut *q, nq), (&mut *k, nk)] {
            match s.qk_norm {
                QkNorm::Full => rms_norm_in_place(y, w, s.eps),
                QkNorm::PerHead => y
                    .chunks_exact_mut(d)
                    .for_each(|head| rms_norm_in_place(head, w, s.eps)),
                QkNorm::None => {}
            }
        }
    }
    if let Some(c) = s.clip_qkv {
        for y in [&mut *q, &mut *k, &mut *v] {
            y.iter_mut().for_each(|v| *v = v.clamp(-c, c));
        }
    }
    for y in [q, k] {
        y.chunks_exact_mut(d).for_each(|head| rope(head, cos, sin));
    }
}

/// Checks the buffers against the decoder's shapes.
fn check(
    m: &Decoder<'_>,
    caches: &[LayerCache<'_>],
    token: usize,
    pos: usize,
    logits: &[f32],
) -> Result<()> {
    let s = &m.shape;
    let bad = |what, got, want| Err(KernelError::BadLength { what, got, want });
    if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) || !s.head_dim.is_multiple_of(2) {
        return Err(KernelError::BadFormat {
            reason: format!(
                "{} heads, {} kv heads, head dim {}",
                s.heads, s.kv_heads, s.head_dim
            ),
        });
    }
    if token >= m.embed.rows {
        return bad("token id", token, m.embed.rows);
    }
    if pos >= s.context {
        return bad("position", pos, s.context);
    }
    if logits.len() != m.lm_head.rows {
        return bad("logits", logits.len(), m.lm_head.rows);
    }
    if caches.len() != m.layers.len() {
        return bad("layer caches", caches.len(), m.layers.len());
    }
    let per = s.kv_heads * s.context * s.head_dim;
    for c in caches {
        if c.keys.len() != per || c.values.len() != per {
            return bad("KV cache layer", c.keys.len().min(c.values.len()), per);
        }
    }
    let table = s.context * s.head_dim;
    if m.cos.len() != table || m.sin.len() != table {
        return bad("RoPE table", m.cos.len().min(m.sin.len()), table);
    }
    Ok(())
}

/// Row `token` of the embedding, widened to f32.
fn embed_row(embed: &Proj<'_>, token: usize, out: &mut [f32]) {
    let row = embed.row(token);
    match embed.kind {
        crate::format::WeightKind::F32 => {
            for (o, b) in out.iter_mut().zip(row.as_chunks::<4>().0) {
                *o = f32::from_le_bytes(*b);
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(row.as_chunks::<2>().0) {
                let bits = u16::from_le_bytes(*b);
                *o = if embed.kind == crate::format::WeightKind::F16 {
                    crate::format::f16_to_f32(bits)
                } else {
                    bf16_to_f32(bits)
                };
            }
        }
    }
}

/// The bytes of an f32 slice (little-endian, as the f32 kernels read them).
fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 bit pattern is valid bytes; the length covers exactly `x`.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

/// `out = w * x / rms(x)` (f32 statistics, as `flint.models.norm.rms_norm`).
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = inv_rms(x, eps);
    for ((o, &x), &w) in out.iter_mut().zip(x).zip(w) {
        *o = w * (x * inv);
    }
}

fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = inv_rms(x, eps);
    x.iter_mut().zip(w).for_each(|(x, &w)| *x = w * (*x * inv));
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32;
    1.0 / (mean + eps).sqrt()
}

/// `x * cos + rotate_half(x) * sin` over a head (`rotate_half` = `[-x2, x1]`).
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (a, b) = x.split_at_mut(half);
    let (c1, c2) = cos.split_at(half.min(cos.len()));
    let (s1, s2) = sin.split_at(half.min(sin.len()));
    for (((((x1, x2), &c1), &c2), &s1), &s2) in a.iter_mut().zip(b).zip(c1).zip(c2).zip(s1).zip(s2)
    {
        let (u, v) = (*x1, *x2);
        *x1 = u * c1 - v * s1;
        *x2 = v * c2 + u * s2;
    }
}

/// In-place softmax (max subtracted).
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// The `k` largest of `p`, largest first (ties: the lower id first), as (ids, values).
fn top_k(p: &[f32], k: usize) -> (Vec<i64>, Vec<f32>) {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    let key = |i: &usize| p.get(*i).copied().unwrap_or(f32::NEG_INFINITY);
    idx.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
    idx.truncate(k);
    let vals = idx.iter().map(key).collect();
    (idx.into_iter().map(|i| i as i64).collect(), vals)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::format::WeightKind;
    use crate::isa::Isa;

    /// Deterministic values in [-0.5, 0.5).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    fn mat(w: &[f32], rows: usize, cols: usize) -> Proj<'_> {
        Proj {
            kind: WeightKind::F32,
            rows,
            cols,
            weights: f32_bytes(w),
            scales: &[],
        }
    }

    const H: usize = 128;
    const HEADS: usize = 4;
    const KV: usize = 2;
    const D: usize = 32;
    const I: usize = 16;
    const E: usize = 4;
    const V: usize = 4096;
    const CTX: usize = 8;

    /// Weights of a one-layer model, one Vec per tensor.
    struct Weights {
        embed: Vec<f32>,
        ones: Vec<f32>,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        o: Vec<f32>,
        router: Vec<f32>,
        experts: Vec<[Vec<f32>; 3]>,
        cos: Vec<f32>,
        sin: Vec<f32>,
    }

    fn weights() -> Weights {
        let angles = values(CTX * D, 9);
        Weights {
            embed: values(V * H, 1),
            ones: vec![1.0; H],
            q: values(HEADS * D * H, 2),
            k: values(KV * D * H, 3),
            v: values(KV * D * H, 4),
            o: values(H * HEADS * D, 5),
            router: values(E * H, 6),
            experts: (0..E as u64)
                .map(|e| {
                    [
                        values(I * H, 10 + e),
                        values(I * H, 20 + e),
                        values(H * I, 30 + e),
                    ]
                })
                .collect(),
            cos: angles.iter().map(|a| a.cos()).collect(),
            sin: angles.iter().map(|a| a.sin()).collect(),
        }
    }

    fn decoder(w: &Weights) -> Decoder<'_> {
        let format = ExpertFormat::new(WeightKind::F32, [(I, H), (I, H), (H, I)]).unwrap();
        let experts = w
            .experts
            .iter()
            .map(|[g, u, d]| {
                ExpertWeights::new(&format, [f32_bytes(g), f32_bytes(u), f32_bytes(d)]).unwrap()
            })
            .collect();
        Decoder {
            shape: StepShape {
                hidden: H,
                heads: HEADS,
                kv_heads: KV,
                head_dim: D,
                eps: 1e-6,
                qk_norm: QkNorm::PerHead,
                clip_qkv: None,
                top_k: 2,
                norm_topk_prob: true,
                context: CTX,
            },
            embed: mat(&w.embed, V, H),
            final_norm: &w.ones,
            lm_head: mat(&w.embed, V, H),
            cos: &w.cos,
            sin: &w.sin,
            layers: vec![Layer {
                input_norm: &w.ones,
                post_norm: &w.ones,
                attn: Attn {
                    q: mat(&w.q, HEADS * D, H),
                    k: mat(&w.k, KV * D, H),
                    v: mat(&w.v, KV * D, H),
                    o: mat(&w.o, H, HEADS * D),
                    bias: None,
                    o_bias: None,
                    qk_norm: Some([&w.ones[..D], &w.ones[..D]]),
                },
                ffn: Ffn::Moe(Moe {
                    router: mat(&w.router, E, H),
                    experts,
                    shared: None,
                    shared_gate: None,
                }),
            }],
            experts: format,
        }
    }

    /// Logits of tokens 3, 7, 11 at positions 0, 1, 2, and the cache after them.
    fn run(threads: usize) -> (Vec<f32>, Vec<f32>) {
        let w = weights();
        let m = decoder(&w);
        let kernels = Kernels::new(Isa::best(), threads).unwrap();
        let (mut keys, mut vals) = (vec![0.0; KV * CTX * D], vec![0.0; KV * CTX * D]);
        let mut logits = vec![0.0; 3 * V];
        for (pos, (token, out)) in [3, 7, 11]
            .into_iter()
            .zip(logits.chunks_exact_mut(V))
            .enumerate()
        {
            let mut caches = [LayerCache {
                keys: KvRows::F32(&mut keys),
                values: KvRows::F32(&mut vals),
            }];
            kernels
                .decode_step(&m, &mut caches, token, pos, out)
                .unwrap();
        }
        (logits, keys)
    }

    #[test]
    fn threads_do_not_change_the_step_and_the_cache_is_written_at_each_position() {
        let (one, keys) = run(1); // the calling thread alone
                                  // three threads as a team (one of them with no kv group of its own)
        let (three, keys3) = run(3);
        assert_eq!(one, three);
        assert_eq!(keys, keys3);
        assert!(one.iter().all(|v| v.is_finite()));
        for g in 0..KV {
            for p in 0..CTX {
                let row = &keys[(g * CTX + p) * D..(g * CTX + p + 1) * D];
                assert_eq!(
                    row.iter().any(|&v| v != 0.0),
                    p < 3,
                    "head {g} position {p}"
                );
            }
        }
    }

    #[test]
    fn bad_tokens_and_positions_are_errors() {
        let w = weights();
        let m = decoder(&w);
        let kernels = Kernels::new(Isa::Scalar, 1).unwrap();
        let (mut keys, mut vals) = (vec![0.0; KV * CTX * D], vec![0.0; KV * CTX * D]);
        let mut logits = vec![0.0; V];
        for (token, pos) in [(V, 0), (0, CTX)] {
            let mut caches = [LayerCache {
                keys: KvRows::F32(&mut keys),
                values: KvRows::F32(&mut vals),
            }];
            let err = kernels.decode_step(&m, &mut caches, token, pos, &mut logits);
            assert!(
                matches!(err, Err(KernelError::BadLength { .. })),
                "{token} {pos}"
            );
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_top_k_breaks_ties_by_id() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie -> even
        assert_eq!(to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie -> even
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(to_bf16(f32::NAN), 0x7fc0);
        let (ids, vals) = top_k(&[0.1, 0.4, 0.2, 0.4], 3);
        assert_eq!(ids, vec![1, 3, 2]);
        assert_eq!(vals, vec![0.4, 0.4, 0.2]);
    }

    #[test]
    fn rope_matches_rotate_half() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        let (cos, sin) = ([0.5, 0.25, 0.5, 0.25], [2.0, 4.0, 2.0, 4.0]);
        rope(&mut x, &cos, &sin);
        // x * cos + [-x3, -x4, x1, x2] * sin
        assert_eq!(x, vec![0.5 - 6.0, 0.5 - 16.0, 1.5 + 2.0, 1.0 + 8.0]);
    }
}
