//! `DecodeStep`: one token through the whole decoder in Rust (crate `cpu_kernels`,
//! `Kernels::decode_step`), without the GIL.
//!
//! Memory contract (the caller is `flint.models.cpu_decode`, which checks every tensor's
//! dtype, shape, device and contiguity before passing its address): every weight,
//! norm, RoPE table and expert-table address given to the constructor points to memory
//! that stays allocated and unchanged for as long as this object lives (the Python
//! wrapper holds the tensors); the KV cache addresses point to the model's cache
//! tensors `[L, Nkv, S, D]`, also held, which this object writes only during `step`
//! (position `pos` of every layer) and which nothing else touches during a step. The
//! logits address of `step` holds `V` f32 for the call.

use cpu_kernels::{
    Attn, Decoder, ExpertWeights, Ffn, KernelError, KvRows, Layer, LayerCache, Moe, Proj, QkNorm,
    StepShape, Swiglu, WeightKind,
};
use pyo3::prelude::*;

use crate::error::{detach, IntoPyErr};
use crate::kernels::{table, PyCpuKernels};

/// A dense matrix: (address, dtype `f32`/`bf16`/`f16`, rows, cols).
type MatSpec = (usize, String, usize, usize);
/// An f32 vector: (address, length).
type VecSpec = (usize, usize);

/// One decoder layer's addresses (a dict with every key; `None` where absent).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct LayerSpec {
    input_norm: VecSpec,
    post_norm: VecSpec,
    q: MatSpec,
    k: MatSpec,
    v: MatSpec,
    o: MatSpec,
    bias: Option<[VecSpec; 3]>,
    o_bias: Option<VecSpec>,
    qk_norm: Option<[VecSpec; 2]>,
    router: Option<MatSpec>,
    experts: Option<usize>,
    shared: Option<[MatSpec; 3]>,
    shared_gate: Option<MatSpec>,
    dense: Option<[MatSpec; 3]>,
}

/// The decoder's shape: (hidden, heads, kv heads, head dim, eps, qk norm `none` /
/// `per_head` / `full`, clip or None, top-k, norm_topk_prob, context).
type ShapeSpec = (
    usize,
    usize,
    usize,
    usize,
    f32,
    String,
    Option<f32>,
    usize,
    bool,
    usize,
);

/// One decode step over a model's tensors (see module docs).
#[pyclass(module = "flint._core", name = "DecodeStep", frozen)]
#[derive(Debug)]
pub struct PyDecodeStep {
    kernels: Py<PyCpuKernels>,
    decoder: Decoder<'static>,
    /// Keys and values `[L, Nkv, S, D]`: addresses, and whether bf16 (else f32).
    cache: (usize, usize, bool),
}

fn bad(reason: String) -> KernelError {
    KernelError::BadFormat { reason }
}

/// # Safety
/// The constructor's contract: `spec`'s address holds rows x cols values of its dtype
/// for the object's life.
unsafe fn mat(spec: &MatSpec) -> Result<Proj<'static>, KernelError> {
    let (addr, dtype, rows, cols) = spec;
    let (kind, size) = match dtype.as_str() {
        "f32" => (WeightKind::F32, 4),
        "bf16" => (WeightKind::Bf16, 2),
        "f16" => (WeightKind::F16, 2),
        other => return Err(bad(format!("dense dtype {other:?} (f32, bf16, f16)"))),
    };
    let n = rows
        .checked_mul(*cols)
        .and_then(|n| n.checked_mul(size))
        .ok_or_else(|| bad(format!("[{rows}, {cols}] overflows")))?;
    if *addr == 0 || *rows == 0 || *cols == 0 {
        return Err(bad(format!("empty matrix [{rows}, {cols}] at {addr:#x}")));
    }
    // SAFETY: the caller's contract.
    let weights = unsafe { std::slice::from_raw_parts(*addr as *const u8, n) };
    Ok(Proj {
        kind,
        rows: *rows,
        cols: *cols,
        weights,
        scales: &[],
    })
}

/// # Safety
/// As [`mat`], for `len` f32.
unsafe fn vector(spec: VecSpec, want: usize) -> Result<&'static [f32], KernelError> {
    let (addr, len) = spec;
    if addr == 0 || len != want {
        return Err(KernelError::BadLength {
            what: "norm or bias vector",
            got: len,
            want,
        });
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(addr as *const f32, len) })
}

/// # Safety
/// As [`mat`], for three matrices.
unsafe fn swiglu(specs: &[MatSpec; 3]) -> Result<Swiglu<'static>, KernelError> {
    let [g, u, d] = specs;
    // SAFETY: the caller's contract.
    unsafe {
        Ok(Swiglu {
            gate: mat(g)?,
            up: mat(u)?,
            down: mat(d)?,
        })
    }
}

impl PyDecodeStep {
    /// # Safety
    /// The constructor's contract for every address in `spec`.
    unsafe fn layer(
        k: &PyCpuKernels,
        shape: &StepShape,
        spec: &LayerSpec,
    ) -> Result<Layer<'static>, KernelError> {
        let h = shape.hidden;
        let (qd, kd) = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        let norm_len = |n: usize| match shape.qk_norm {
            QkNorm::PerHead => shape.head_dim,
            _ => n,
        };
        // SAFETY: the caller's contract.
        unsafe {
            let attn = Attn {
                q: mat(&spec.q)?,
                k: mat(&spec.k)?,
                v: mat(&spec.v)?,
                o: mat(&spec.o)?,
                bias: match spec.bias {
                    Some([bq, bk, bv]) => Some([vector(bq, qd)?, vector(bk, kd)?, vector(bv, kd)?]),
                    None => None,
                },
                o_bias: spec.o_bias.map(|b| vector(b, h)).transpose()?,
                qk_norm: match spec.qk_norm {
                    Some([nq, nk]) => Some([vector(nq, norm_len(qd))?, vector(nk, norm_len(kd))?]),
                    None => None,
                },
            };
            let shapes = [
                (attn.q.rows, attn.q.cols, qd, h),
                (attn.k.rows, attn.k.cols, kd, h),
                (attn.v.rows, attn.v.cols, kd, h),
                (attn.o.rows, attn.o.cols, h, qd),
            ];
            if shapes.iter().any(|&(r, c, wr, wc)| (r, c) != (wr, wc)) {
                return Err(bad(format!("attention shapes {shapes:?}")));
            }
            let ffn = match (&spec.router, spec.experts, &spec.dense) {
                (Some(router), Some(table_addr), None) => {
                    let list = table(table_addr, k.n_experts)?;
                    let experts = k.experts(&list)?;
                    Ffn::Moe(Moe {
                        router: mat(router)?,
                        experts: experts
                            .into_iter()
                            .map(|(_, w)| w)
                            .collect::<Vec<ExpertWeights<'static>>>(),
                        shared: spec.shared.as_ref().map(|s| swiglu(s)).transpose()?,
                        shared_gate: spec.shared_gate.as_ref().map(|g| mat(g)).transpose()?,
                    })
                }
                (None, None, Some(dense)) => Ffn::Dense(swiglu(dense)?),
                _ => {
                    return Err(bad(
                        "a layer needs a router and experts, or a dense MLP".into()
                    ))
                }
            };
            Ok(Layer {
                input_norm: vector(spec.input_norm, h)?,
                post_norm: vector(spec.post_norm, h)?,
                attn,
                ffn,
            })
        }
    }
}

#[pymethods]
impl PyDecodeStep {
    /// The decoder over the addresses of a model's tensors (see the module docs for
    /// their contract): `shape` ([`ShapeSpec`]), the embedding, final norm and LM head,
    /// the RoPE tables (f32 `[context, D]`), one dict per layer, and the KV cache's keys
    /// and values (`cache_dtype` `f32` or `bf16`). The routed experts run through
    /// `kernels` (each MoE layer's `experts` is an i64 `[E, 3]` address table).
    #[new]
    #[allow(clippy::too_many_arguments)] // reason: one argument per part of the model
    fn new(
        kernels: Py<PyCpuKernels>,
        shape: ShapeSpec,
        embed: MatSpec,
        final_norm: VecSpec,
        lm_head: MatSpec,
        rope: (usize, usize),
        layers: Vec<Bound<'_, PyAny>>,
        cache: (usize, usize, String),
    ) -> PyResult<Self> {
        let (hidden, heads, kv_heads, head_dim, eps, qk, clip_qkv, top_k, norm_topk_prob, context) =
            shape;
        let qk_norm = match qk.as_str() {
            "none" => QkNorm::None,
            "per_head" => QkNorm::PerHead,
            "full" => QkNorm::Full,
            other => return Err(bad(format!("qk_norm {other:?}")).into_py_err()),
        };
        let shape = StepShape {
            hidden,
            heads,
            kv_heads,
            head_dim,
            eps,
            qk_norm,
            clip_qkv,
            top_k,
            norm_topk_prob,
            context,
        };
        let specs = layers
            .iter()
            .map(|l| l.extract::<LayerSpec>())
            .collect::<PyResult<Vec<_>>>()?;
        let k = kernels.get();
        let build = || -> Result<Decoder<'static>, KernelError> {
            let table = context
                .checked_mul(head_dim)
                .ok_or_else(|| bad("RoPE table overflows".into()))?;
            // SAFETY: the constructor's contract (module docs), checked by the caller.
            unsafe {
                Ok(Decoder {
                    shape,
                    embed: mat(&embed)?,
                    final_norm: vector(final_norm, hidden)?,
                    lm_head: mat(&lm_head)?,
                    cos: vector((rope.0, table), table)?,
                    sin: vector((rope.1, table), table)?,
                    layers: specs
                        .iter()
                        .map(|s| Self::layer(k, &shape, s))
                        .collect::<Result<Vec<_>, _>>()?,
                    experts: k.format,
                })
            }
        };
        let decoder = build().map_err(IntoPyErr::into_py_err)?;
        if decoder.embed.cols != hidden || decoder.lm_head.cols != hidden {
            return Err(bad("embedding / LM head columns != hidden".into()).into_py_err());
        }
        let bf16 = match cache.2.as_str() {
            "f32" => false,
            "bf16" => true,
            other => return Err(bad(format!("KV cache dtype {other:?}")).into_py_err()),
        };
        if cache.0 == 0 || cache.1 == 0 {
            return Err(bad("null KV cache".into()).into_py_err());
        }
        Ok(Self {
            kernels,
            decoder,
            cache: (cache.0, cache.1, bf16),
        })
    }

    /// Runs `token` at position `pos` (the cache holds positions `0..pos`), writing each
    /// layer's key and value at `pos` and the logits (f32 `[V]`) at `logits`.
    fn step(&self, py: Python<'_>, token: usize, pos: usize, logits: usize) -> PyResult<()> {
        let k = self.kernels.get();
        let d = &self.decoder;
        let s = &d.shape;
        let per = s.kv_heads * s.context * s.head_dim;
        let (keys, values, bf16) = self.cache;
        detach(py, || -> Result<(), KernelError> {
            if logits == 0 {
                return Err(bad("null logits".into()));
            }
            let elt = if bf16 { 2 } else { 4 };
            // SAFETY: the module docs' contract: the cache tensors hold L x per values of
            // the cache dtype and nothing else touches them during the step; logits holds
            // V f32.
            unsafe {
                let mut caches: Vec<LayerCache<'_>> = (0..d.layers.len())
                    .map(|l| {
                        let (ka, va) = (keys + l * per * elt, values + l * per * elt);
                        if bf16 {
                            LayerCache {
                                keys: KvRows::Bf16(std::slice::from_raw_parts_mut(
                                    ka as *mut u16,
                                    per,
                                )),
                                values: KvRows::Bf16(std::slice::from_raw_parts_mut(
                                    va as *mut u16,
                                    per,
                                )),
                            }
                        } else {
                            LayerCache {
                                keys: KvRows::F32(std::slice::from_raw_parts_mut(
                                    ka as *mut f32,
                                    per,
                                )),
                                values: KvRows::F32(std::slice::from_raw_parts_mut(
                                    va as *mut f32,
                                    per,
                                )),
                            }
                        }
                    })
                    .collect();
                let out = std::slice::from_raw_parts_mut(logits as *mut f32, d.lm_head.rows);
                k.inner.decode_step(d, &mut caches, token, pos, out)
            }
        })
    }
}
