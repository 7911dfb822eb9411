//! Python wrappers for crate `expert_cache`: `ExpertCache`, `replay` and its result.
//! Thin: argument conversion, error mapping, GIL release. The rules live in the crate.

use std::path::PathBuf;

use expert_cache::{
    Admission, AdmitKind, AnyPolicy, CacheError, ExpertCache, Mode, PolicyKind, Predictor,
    ReplayConfig, ReplayStats, Trace, UsageTable,
};
use pyo3::prelude::*;

use crate::error::{cache_err, detach, CacheArgumentError};

fn admit_kind(kind: &str) -> PyResult<AdmitKind> {
    match kind {
        "demand" => Ok(AdmitKind::Demand),
        "prefetch" => Ok(AdmitKind::Prefetch),
        "fill" => Ok(AdmitKind::Fill),
        other => Err(CacheArgumentError::new_err(format!(
            "unknown admission kind {other:?}: expected demand, prefetch or fill"
        ))),
    }
}

/// The RAM expert cache's decisions for every streamed layer (no memory of its own:
/// slots are indices into an `Arena`). Single-threaded: wrap calls in a lock if several
/// threads share one.
#[pyclass(module = "flint._core", name = "ExpertCache")]
#[derive(Debug)]
pub struct PyExpertCache {
    inner: ExpertCache<AnyPolicy>,
}

#[pymethods]
impl PyExpertCache {
    #[new]
    #[pyo3(signature = (n_layers, n_experts, capacity, policy = "decay"))]
    fn new(n_layers: usize, n_experts: u32, capacity: usize, policy: &str) -> PyResult<Self> {
        let kind: PolicyKind = policy.parse().map_err(cache_err)?;
        let policy = AnyPolicy::online(kind, n_layers.saturating_mul(n_experts as usize))
            .map_err(cache_err)?;
        let inner = ExpertCache::new(n_layers, n_experts, capacity, policy).map_err(cache_err)?;
        Ok(Self { inner })
    }

    #[getter]
    fn n_layers(&self) -> usize {
        self.inner.n_layers()
    }
    #[getter]
    fn n_experts(&self) -> u32 {
        self.inner.n_experts()
    }
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    #[getter]
    fn policy(&self) -> &'static str {
        use expert_cache::Policy;
        self.inner.policy().name()
    }

    /// Slot of a resident expert, or None. Changes nothing.
    fn lookup(&self, layer: usize, expert: u32) -> PyResult<Option<u32>> {
        self.inner.lookup(layer, expert).map_err(cache_err)
    }

    /// Records a router selection of a resident expert; returns its slot.
    fn touch(&mut self, layer: usize, expert: u32) -> PyResult<u32> {
        self.inner.touch(layer, expert).map_err(cache_err)
    }

    /// Gives a non-resident expert a slot: (slot, evicted expert or None), or None when
    /// a prefetch or fill was declined.
    #[pyo3(signature = (layer, expert, kind = "demand"))]
    fn admit(
        &mut self,
        layer: usize,
        expert: u32,
        kind: &str,
    ) -> PyResult<Option<(u32, Option<u32>)>> {
        let kind = admit_kind(kind)?;
        Ok(
            match self.inner.admit(layer, expert, kind).map_err(cache_err)? {
                Admission::Placed { slot, evicted } => Some((slot, evicted)),
                Admission::Declined => None,
            },
        )
    }

    /// Removes a resident, unpinned expert; returns the freed slot.
    fn evict(&mut self, layer: usize, expert: u32) -> PyResult<u32> {
        self.inner.evict(layer, expert).map_err(cache_err)
    }
    /// Pins a resident expert's slot (read or GPU copy in flight); pins nest.
    fn pin(&mut self, layer: usize, expert: u32) -> PyResult<u32> {
        self.inner.pin(layer, expert).map_err(cache_err)
    }
    /// Drops one pin.
    fn unpin(&mut self, layer: usize, expert: u32) -> PyResult<u32> {
        self.inner.unpin(layer, expert).map_err(cache_err)
    }
    /// Protects a resident expert predicted for a layer that has not run in this token.
    fn protect(&mut self, layer: usize, expert: u32) -> PyResult<u32> {
        self.inner.protect(layer, expert).map_err(cache_err)
    }
    /// The layer starts: its predictions stop being protected.
    fn start_layer(&mut self, layer: usize) -> PyResult<()> {
        self.inner.start_layer(layer).map_err(cache_err)
    }
    /// One decode token is done.
    fn tick(&mut self) {
        self.inner.tick();
    }
    /// A prompt batch of `tokens` tokens is done (ages values by its length).
    fn prompt_batch(&mut self, tokens: u64) {
        self.inner.prompt_batch(tokens);
    }
    /// "prompt" (LRU eviction) or "decode" (the policy's values).
    fn set_mode(&mut self, mode: &str) -> PyResult<()> {
        let mode = match mode {
            "prompt" => Mode::Prompt,
            "decode" => Mode::Decode,
            other => {
                let msg = format!("unknown mode {other:?}: expected prompt or decode");
                return Err(CacheArgumentError::new_err(msg));
            }
        };
        self.inner.set_mode(mode);
        Ok(())
    }
    /// Resident (slot, expert) pairs of a layer, in slot order.
    fn resident(&self, layer: usize) -> PyResult<Vec<(u32, u32)>> {
        self.inner.resident(layer).map_err(cache_err)
    }
    /// Free slots of a layer.
    fn free_slots(&self, layer: usize) -> PyResult<usize> {
        self.inner.free_slots(layer).map_err(cache_err)
    }
    /// (layer, expert) to load into empty slots, most used first; never evicts.
    fn idle_fill(&self) -> Vec<(usize, u32)> {
        self.inner.idle_fill()
    }
    /// Undecayed use counts, layer-major.
    fn usage_counts(&self) -> Vec<u64> {
        self.inner.usage().counts().to_vec()
    }

    /// Writes the usage table atomically.
    #[pyo3(signature = (path, model_key = 0))]
    fn save_usage(&self, py: Python<'_>, path: PathBuf, model_key: u64) -> PyResult<()> {
        let table = self.inner.usage().clone();
        detach(py, move || table.save(&path, model_key))
    }

    /// Loads a usage table if one is there. A corrupt or foreign table is ignored: the
    /// reason is returned (for one printed line) and the counts start from zero.
    #[pyo3(signature = (path, model_key = 0))]
    fn load_usage(
        &mut self,
        py: Python<'_>,
        path: PathBuf,
        model_key: u64,
    ) -> PyResult<Option<String>> {
        let (n_layers, n_experts) = (self.inner.n_layers(), self.inner.n_experts());
        let (table, ignored) = detach(py, move || {
            UsageTable::load_or_new(&path, n_layers, n_experts, model_key)
        })?;
        self.inner.set_usage(table).map_err(cache_err)?;
        Ok(ignored.map(|e| e.to_string()))
    }
}

/// Counts of one replay run.
#[pyclass(module = "flint._core", name = "ReplayResult", frozen, get_all)]
#[derive(Debug)]
pub struct PyReplayResult {
    policy: String,
    capacity: usize,
    tokens: u64,
    selections: u64,
    hits: u64,
    demand_reads: u64,
    prefetch_reads: u64,
    layer_hits: Vec<u64>,
}

impl PyReplayResult {
    fn new(policy: PolicyKind, capacity: usize, stats: ReplayStats) -> Self {
        Self {
            policy: policy.name().to_owned(),
            capacity,
            tokens: stats.tokens,
            selections: stats.selections,
            hits: stats.hits,
            demand_reads: stats.demand_reads(),
            prefetch_reads: stats.prefetch_reads,
            layer_hits: stats.layer_hits,
        }
    }
}

/// Replays a routing trace (`experts`: little-endian int16 `[n_tokens, n_layers,
/// top_k]`) through one policy at one per-layer capacity. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (experts, n_tokens, n_layers, top_k, n_experts, capacity, policy, predict_recall = None, seed = 0))]
#[allow(clippy::too_many_arguments)] // reason: mirrors the Python keyword signature
pub fn replay(
    py: Python<'_>,
    experts: &[u8],
    n_tokens: usize,
    n_layers: usize,
    top_k: usize,
    n_experts: u32,
    capacity: usize,
    policy: &str,
    predict_recall: Option<f64>,
    seed: u64,
) -> PyResult<PyReplayResult> {
    let kind: PolicyKind = policy.parse().map_err(cache_err)?;
    let trace =
        Trace::from_le_i16(experts, n_tokens, n_layers, top_k, n_experts).map_err(cache_err)?;
    let predictor = predict_recall.map(|recall| Predictor { recall, seed });
    let config = ReplayConfig {
        capacity,
        policy: kind,
        predictor,
    };
    let stats = detach(py, move || -> Result<ReplayStats, CacheError> {
        expert_cache::replay(&trace, &config)
    })?;
    Ok(PyReplayResult::new(kind, capacity, stats))
}
