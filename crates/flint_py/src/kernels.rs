//! `CpuKernels`: the fused CPU expert kernels of crate `cpu_kernels`, one call per MoE
//! layer, without the GIL.
//!
//! Memory contract (the caller is `flint.models.cpu_kernels`, which checks every tensor's
//! dtype, shape, device and contiguity before passing its address): each address points
//! to memory that stays allocated and unchanged for the duration of the call and holds
//! what the argument says (`x` f32 `[T, H]`, `ids` i64 `[T, K]`, `weights` f32 `[T, K]`,
//! `out` f32 `[T, H]`, `y` f32 `[T * K, H]`, each expert projection address the
//! projection's bytes in the layout this object was made for). Nothing is kept after the
//! call returns; the outputs are written in place.

use std::sync::Mutex;
use std::time::Duration;

use cpu_kernels::{
    weighted_sum, AllReady, ExpertFormat, ExpertWeights, Isa, KernelError, Kernels, Ready, Routing,
    WeightKind,
};
use io_engine::{CachedEngine, IoError, Proj};
use pyo3::prelude::*;

use crate::error::{detach, IntoPyErr};
use crate::io::PyIoEngine;

/// Addresses of one expert's gate, up and down projections.
pub(crate) type Addrs = [usize; 3];

/// Fused CPU compute of a layer's routed experts (see module docs).
#[pyclass(module = "flint._core", name = "CpuKernels", frozen)]
#[derive(Debug)]
pub struct PyCpuKernels {
    pub(crate) inner: Kernels,
    pub(crate) format: ExpertFormat,
    pub(crate) n_experts: usize,
    pub(crate) proj_bytes: [usize; 3],
}

/// Error while waiting for an engine read inside a kernel call, kept typed.
struct EngineReady<'a> {
    engine: &'a CachedEngine,
    layer: u32,
    /// Experts already complete in their slots (no wait).
    hits: Vec<u32>,
    timeout: Duration,
    failure: Mutex<Option<IoError>>,
}

impl Ready for EngineReady<'_> {
    fn wait(&self, expert: u32, proj: usize) -> Result<(), String> {
        if self.hits.contains(&expert) {
            return Ok(());
        }
        let p = if proj >= 2 { Proj::Down } else { Proj::Up };
        match self.engine.wait(self.layer, expert, p, self.timeout) {
            Ok(_) => Ok(()),
            Err(e) => {
                let msg = e.to_string();
                if let Ok(mut f) = self.failure.lock() {
                    f.get_or_insert(e);
                }
                Err(msg)
            }
        }
    }
}

impl PyCpuKernels {
    /// Slices over the three projections of every listed expert.
    ///
    /// # Safety
    /// Every address must be valid for reads of its projection's bytes for `'a`.
    pub(crate) unsafe fn experts<'a>(
        &self,
        list: &[(u32, Addrs)],
    ) -> Result<Vec<(u32, ExpertWeights<'a>)>, KernelError> {
        list.iter()
            .map(|&(e, addrs)| {
                let mut bytes: [&'a [u8]; 3] = [&[]; 3];
                for ((b, &a), &n) in bytes.iter_mut().zip(&addrs).zip(&self.proj_bytes) {
                    if a == 0 {
                        return Err(KernelError::MissingExpert { expert: e });
                    }
                    // SAFETY: the caller's contract (module docs): `a` is valid for `n`
                    // bytes during the call.
                    *b = unsafe { std::slice::from_raw_parts(a as *const u8, n) };
                }
                Ok((e, ExpertWeights::new(&self.format, bytes)?))
            })
            .collect()
    }

    /// The routing slices of a call.
    ///
    /// # Safety
    /// `x` and `ids` must be valid for `tokens * H` f32 and `tokens * top_k` i64.
    unsafe fn routing<'a>(
        &self,
        x: usize,
        ids: usize,
        tokens: usize,
        top_k: usize,
    ) -> Result<Routing<'a>, KernelError> {
        let h = self.format.hidden();
        check_ptr(x, "x")?;
        check_ptr(ids, "ids")?;
        // SAFETY: the caller's contract (module docs).
        let (x, ids) = unsafe {
            (
                std::slice::from_raw_parts(x as *const f32, tokens * h),
                std::slice::from_raw_parts(ids as *const i64, tokens * top_k),
            )
        };
        Ok(Routing {
            x,
            ids,
            top_k,
            n_experts: self.n_experts,
        })
    }
}

fn check_ptr(addr: usize, what: &'static str) -> Result<(), KernelError> {
    if addr == 0 {
        return Err(KernelError::BadLength {
            what,
            got: 0,
            want: 1,
        });
    }
    Ok(())
}

/// Reads `n_experts` rows of (gate, up, down) addresses from an i64 `[E, 3]` table.
///
/// # Safety
/// `table` must be valid for `n_experts * 3` i64.
pub(crate) unsafe fn table(
    table: usize,
    n_experts: usize,
) -> Result<Vec<(u32, Addrs)>, KernelError> {
    check_ptr(table, "table")?;
    // SAFETY: the caller's contract.
    let t = unsafe { std::slice::from_raw_parts(table as *const i64, n_experts * 3) };
    Ok(t.chunks_exact(3)
        .enumerate()
        .map(|(e, r)| {
            let a = |i: usize| r.get(i).copied().unwrap_or(0) as usize;
            (e as u32, [a(0), a(1), a(2)])
        })
        .collect())
}

#[pymethods]
impl PyCpuKernels {
    /// Kernels for experts of `scheme` (`raw`/`int8`/`int4`), raw `dtype` (`f32`, `bf16`,
    /// `f16`), int4 `group_size`, `shapes` (rows, cols) of gate, up, down, on a pool of
    /// `threads` threads; `isa`: `auto` (the best this CPU has) or `scalar`,
    /// `portable`, `avx2`, `avx512`, `avx512bf16`; `round_hidden`: each expert's hidden
    /// row rounded to bf16 before down (a bf16 model's rounding; off: f32).
    #[new]
    #[pyo3(signature = (scheme, dtype, group_size, shapes, n_experts, threads = 1, isa = "auto", round_hidden = false))]
    #[allow(clippy::too_many_arguments)] // reason: the format's fields and two settings
    fn new(
        scheme: &str,
        dtype: &str,
        group_size: usize,
        shapes: [(usize, usize); 3],
        n_experts: usize,
        threads: usize,
        isa: &str,
        round_hidden: bool,
    ) -> PyResult<Self> {
        let kind = WeightKind::parse(scheme, dtype, group_size).map_err(IntoPyErr::into_py_err)?;
        let format = ExpertFormat::new(kind, shapes).map_err(IntoPyErr::into_py_err)?;
        let isa = Isa::parse(isa).map_err(IntoPyErr::into_py_err)?;
        let mut inner = Kernels::new(isa, threads).map_err(IntoPyErr::into_py_err)?;
        inner.set_round_hidden(round_hidden);
        let mut proj_bytes = [0; 3];
        for (p, b) in proj_bytes.iter_mut().enumerate() {
            *b = format.proj_bytes(p).map_err(IntoPyErr::into_py_err)?;
        }
        Ok(Self {
            inner,
            format,
            n_experts,
            proj_bytes,
        })
    }

    /// The instruction set in use.
    #[getter]
    fn isa(&self) -> &'static str {
        self.inner.isa().name()
    }

    /// The row kernels' variants for this layout's experts where the instruction set
    /// has a choice (e.g. `int4 lanes, 4 rows at once`), else empty.
    #[getter]
    fn variants(&self) -> String {
        self.inner.variants(self.format.kind)
    }

    /// Threads of the pool.
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }

    /// Whether hidden rows are rounded to bf16 before down.
    #[getter]
    fn round_hidden(&self) -> bool {
        self.inner.round_hidden()
    }

    /// A plain streaming read of `len` bytes at `addr` on the kernels' threads (the
    /// yardstick of `benches/cpu_kernels.py`); returns the wrapping sum of its u64 words.
    fn plain_read(&self, py: Python<'_>, addr: usize, len: usize) -> PyResult<u64> {
        if len == 0 {
            return Ok(0);
        }
        detach(py, || {
            check_ptr(addr, "buffer")?;
            // SAFETY: the caller guarantees `len` readable bytes at `addr` for the call
            // (the module's memory contract).
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            Ok::<_, KernelError>(self.inner.plain_read(bytes))
        })
    }

    /// Bytes of gate, up and down in this format.
    #[getter]
    fn proj_bytes(&self) -> (usize, usize, usize) {
        let [g, u, d] = self.proj_bytes;
        (g, u, d)
    }

    /// The whole layer: `out[t] = sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`, k in
    /// rank order; `table` is an i64 `[n_experts, 3]` of projection addresses (every
    /// routed expert's non-zero). Addresses: see the module docs.
    #[allow(clippy::too_many_arguments)] // reason: one address per tensor of the call
    fn moe_layer(
        &self,
        py: Python<'_>,
        x: usize,
        ids: usize,
        weights: usize,
        tokens: usize,
        top_k: usize,
        table_addr: usize,
        out: usize,
    ) -> PyResult<()> {
        detach(py, || {
            check_ptr(weights, "weights")?;
            check_ptr(out, "out")?;
            // SAFETY: the memory contract of the module docs, checked by the caller.
            unsafe {
                let routing = self.routing(x, ids, tokens, top_k)?;
                let list: Vec<_> = table(table_addr, self.n_experts)?
                    .into_iter()
                    .filter(|(_, a)| a.iter().all(|&v| v != 0))
                    .collect();
                let experts = self.experts(&list)?;
                let w = std::slice::from_raw_parts(weights as *const f32, tokens * top_k);
                let o =
                    std::slice::from_raw_parts_mut(out as *mut f32, tokens * self.format.hidden());
                self.inner.moe_layer(&self.format, &routing, &experts, w, o)
            }
        })
    }

    /// Expert outputs of the listed experts only (`experts`: (expert, gate, up, down
    /// addresses)) into `y` `[T * K, H]` at the positions routed to them; with `engine`,
    /// each expert not in `hits` is waited for (gate/up, then down) inside the call,
    /// on `engine`'s layer `layer`. A failed read raises its engine error.
    #[pyo3(signature = (x, ids, tokens, top_k, experts, y, engine = None, layer = 0, hits = vec![], timeout_s = 60.0))]
    #[allow(clippy::too_many_arguments)] // reason: mirrors the Python keyword signature
    fn expert_outputs(
        &self,
        py: Python<'_>,
        x: usize,
        ids: usize,
        tokens: usize,
        top_k: usize,
        experts: Vec<(u32, usize, usize, usize)>,
        y: usize,
        engine: Option<PyRef<'_, PyIoEngine>>,
        layer: u32,
        hits: Vec<u32>,
        timeout_s: f64,
    ) -> PyResult<()> {
        let timeout = Duration::try_from_secs_f64(timeout_s)
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("timeout_s must be >= 0"))?;
        let list: Vec<(u32, Addrs)> = experts.iter().map(|&(e, g, u, d)| (e, [g, u, d])).collect();
        let engine = engine.as_ref().map(|e| e.cached());
        detach(py, || -> Result<(), KernelOrIo> {
            check_ptr(y, "y")?;
            // SAFETY: the memory contract of the module docs, checked by the caller.
            unsafe {
                let routing = self.routing(x, ids, tokens, top_k)?;
                let ex = self.experts(&list)?;
                let yv = std::slice::from_raw_parts_mut(
                    y as *mut f32,
                    tokens * top_k * self.format.hidden(),
                );
                match engine {
                    None => {
                        Ok(self
                            .inner
                            .expert_outputs(&self.format, &routing, &ex, &AllReady, yv)?)
                    }
                    Some(engine) => {
                        let ready = EngineReady {
                            engine,
                            layer,
                            hits,
                            timeout,
                            failure: Mutex::new(None),
                        };
                        let r = self
                            .inner
                            .expert_outputs(&self.format, &routing, &ex, &ready, yv);
                        if let Some(e) = ready.failure.lock().ok().and_then(|mut f| f.take()) {
                            return Err(KernelOrIo::Io(e));
                        }
                        Ok(r?)
                    }
                }
            }
        })
    }

    /// `out[t] = sum_k weights[t, k] * y[t * K + k]` in rank order (f32; the operations
    /// of `flint.models.moe.weighted_sum`).
    fn weighted_sum(
        &self,
        py: Python<'_>,
        y: usize,
        weights: usize,
        tokens: usize,
        top_k: usize,
        out: usize,
    ) -> PyResult<()> {
        let h = self.format.hidden();
        detach(py, || {
            check_ptr(y, "y")?;
            check_ptr(weights, "weights")?;
            check_ptr(out, "out")?;
            // SAFETY: the memory contract of the module docs, checked by the caller.
            unsafe {
                let yv = std::slice::from_raw_parts(y as *const f32, tokens * top_k * h);
                let w = std::slice::from_raw_parts(weights as *const f32, tokens * top_k);
                let o = std::slice::from_raw_parts_mut(out as *mut f32, tokens * h);
                weighted_sum(yv, w, top_k, h, o)
            }
        })
    }
}

/// A kernel error or the engine's error that caused it.
enum KernelOrIo {
    Kernel(KernelError),
    Io(IoError),
}

impl From<KernelError> for KernelOrIo {
    fn from(e: KernelError) -> Self {
        Self::Kernel(e)
    }
}

impl IntoPyErr for KernelOrIo {
    fn into_py_err(self) -> PyErr {
        match self {
            Self::Kernel(e) => e.into_py_err(),
            Self::Io(e) => e.into_py_err(),
        }
    }
}
