//! `IoEngine`: the I/O engine over the RAM expert cache, for the streaming runtime.
//!
//! Memory: the engine owns one page-aligned arena holding every slot; addresses it
//! returns (`arena_address`, placements, `wait`) stay valid while the `IoEngine` object
//! lives. A slot's bytes are complete once `wait(..., proj=2)` returned for it (or it
//! was placed as a hit) and stay until a later `begin_layer` of the same layer may
//! evict it. The GIL is released while waiting.

use std::path::PathBuf;
use std::time::Duration;

use expert_cache::{AnyPolicy, Arena, ArenaPlan, ExpertCache, PolicyKind};
use ftw_format::FtwReader;
use io_engine::{CacheSlots, CachedEngine, EngineConfig, Proj, ReadMode};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{cache_err, detach, ftw_to_py, IntoPyErr};

/// Expert reads from a .ftw file into a RAM expert cache (see module docs).
#[pyclass(module = "flint._core", name = "IoEngine", frozen)]
#[derive(Debug)]
pub struct PyIoEngine {
    inner: CachedEngine,
    /// Identifies the model file's experts (its expert index checksum) in usage tables.
    model_key: u64,
}

fn proj(p: u8) -> PyResult<Proj> {
    match p {
        0 => Ok(Proj::Gate),
        1 => Ok(Proj::Up),
        2 => Ok(Proj::Down),
        _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "proj must be 0, 1 or 2, not {p}"
        ))),
    }
}

impl PyIoEngine {
    /// The engine, for the CPU kernels' waits.
    pub(crate) fn cached(&self) -> &CachedEngine {
        &self.inner
    }
}

#[pymethods]
impl PyIoEngine {
    /// Opens `path` and a cache of `slots_per_layer` slots for each layer in `streamed`.
    #[new]
    #[pyo3(signature = (path, streamed, slots_per_layer, policy = "decay", workers = 8,
        chunk_kib = 512, prefetch_cap = 4, prefetch_cap_with_demand = 2, chunking = true,
        direct = true, verify = true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        streamed: Vec<u32>,
        slots_per_layer: usize,
        policy: &str,
        workers: usize,
        chunk_kib: u64,
        prefetch_cap: usize,
        prefetch_cap_with_demand: usize,
        chunking: bool,
        direct: bool,
        verify: bool,
    ) -> PyResult<Self> {
        let reader = detach(py, || FtwReader::open(&path))?;
        let layout = *reader.layout();
        let (_, _, slab) = layout.canonical_slab().map_err(ftw_to_py)?;
        let n_total = streamed.len().saturating_mul(layout.n_experts as usize);
        let kind: PolicyKind = policy.parse().map_err(cache_err)?;
        let plan = ArenaPlan {
            n_layers: streamed.len(),
            slots_per_layer,
            slot_bytes: slab,
        };
        let arena = detach(py, || Arena::new(plan))?;
        let pol = AnyPolicy::online(kind, n_total).map_err(cache_err)?;
        let cache = ExpertCache::new(streamed.len(), layout.n_experts, slots_per_layer, pol)
            .map_err(cache_err)?;
        let slots = CacheSlots::new(cache, arena, &streamed);
        let cfg = EngineConfig {
            workers,
            chunk_bytes: chunk_kib.saturating_mul(1024),
            prefetch_cap,
            prefetch_cap_with_demand,
            chunking,
            direct,
            verify,
            fault: None,
        };
        let inner = detach(py, || {
            CachedEngine::open(&path, reader.experts(), slots, cfg)
        })?;
        Ok(Self {
            inner,
            model_key: reader.header().expert_index_xxh3,
        })
    }

    /// "direct" or "buffered".
    #[getter]
    fn mode(&self) -> &'static str {
        match self.inner.engine().mode() {
            ReadMode::Direct => "direct",
            ReadMode::Buffered => "buffered",
        }
    }

    /// Address of the arena's first byte.
    #[getter]
    fn arena_address(&self) -> usize {
        self.inner.slots().arena().as_ptr() as usize
    }

    /// Bytes in the arena.
    #[getter]
    fn arena_len(&self) -> usize {
        self.inner.slots().arena().len()
    }

    /// Bytes per slot.
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.inner.slots().arena().plan().slot_bytes
    }

    /// Starts a layer with the router's selected experts: cancels its other
    /// predictions, promotes selected ones still being read. Returns (cancelled, promoted).
    fn begin_layer(
        &self,
        py: Python<'_>,
        layer: u32,
        selected: Vec<u32>,
    ) -> PyResult<(usize, usize)> {
        let st = detach(py, || self.inner.begin_layer(layer, &selected))?;
        Ok((st.cancelled, st.promoted))
    }

    /// Places a wave of experts (at most the layer's slots), each pinned for use; returns
    /// for each (expert, slot index, slot address, hit). Non-hits must be waited for;
    /// call `unpin` with the same experts after computing them.
    fn place(
        &self,
        py: Python<'_>,
        layer: u32,
        experts: Vec<u32>,
    ) -> PyResult<Vec<(u32, u32, usize, bool)>> {
        let placed = detach(py, || self.inner.place(layer, &experts))?;
        Ok(placed
            .iter()
            .map(|p| (p.expert, p.slot.index, p.slot.addr, p.hit))
            .collect())
    }

    /// Drops the use pins taken by `place`.
    fn unpin(&self, layer: u32, experts: Vec<u32>) -> PyResult<()> {
        self.inner
            .unpin(layer, &experts)
            .map_err(IntoPyErr::into_py_err)
    }

    /// Pins those of `experts` whose bytes are complete in RAM and returns
    /// (expert, slot address) for each; nothing is read. Unpin them after copying.
    fn pin_resident(
        &self,
        py: Python<'_>,
        layer: u32,
        experts: Vec<u32>,
    ) -> PyResult<Vec<(u32, usize)>> {
        let placed = detach(py, || self.inner.pin_resident(layer, &experts))?;
        Ok(placed.iter().map(|p| (p.expert, p.slot.addr)).collect())
    }

    /// Counts selections served from elsewhere (a VRAM copy) in the usage table.
    fn record_use(&self, layer: u32, experts: Vec<u32>) -> PyResult<()> {
        self.inner
            .record_use(layer, &experts)
            .map_err(IntoPyErr::into_py_err)
    }

    /// The experts of `layer` holding a slot now (complete or being read).
    fn resident(&self, layer: u32) -> PyResult<Vec<u32>> {
        self.inner.resident(layer).map_err(IntoPyErr::into_py_err)
    }

    /// Protects the resident ones of `experts` until `layer` next starts or the forward
    /// pass ends (demand reads evict them last, prefetches never); returns how many.
    fn protect(&self, layer: u32, experts: Vec<u32>) -> PyResult<usize> {
        self.inner
            .protect(layer, &experts)
            .map_err(IntoPyErr::into_py_err)
    }

    /// Undecayed use counts (usage table) of `layer`'s experts.
    fn usage(&self, layer: u32) -> PyResult<Vec<u64>> {
        self.inner.usage(layer).map_err(IntoPyErr::into_py_err)
    }

    /// Lookahead predictions as (layer, expert, distance, rank).
    fn predict(&self, predictions: Vec<(u32, u32, u8, u8)>) -> PyResult<()> {
        self.inner
            .predict(&predictions)
            .map_err(IntoPyErr::into_py_err)
    }

    /// Blocks (GIL released) until projection `proj` (0 gate, 1 up, 2 down = whole
    /// slab verified) of the expert is in its slot; returns the slot address.
    #[pyo3(signature = (layer, expert, proj = 2, timeout_s = 60.0))]
    fn wait(
        &self,
        py: Python<'_>,
        layer: u32,
        expert: u32,
        proj: u8,
        timeout_s: f64,
    ) -> PyResult<usize> {
        let p = self::proj(proj)?;
        let timeout = Duration::try_from_secs_f64(timeout_s)
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("timeout_s must be >= 0"))?;
        detach(py, || {
            self.inner.wait(layer, expert, p, timeout).map(|s| s.addr)
        })
    }

    /// Reads the most-used experts not resident into empty slots (never evicting), in
    /// the background (after every demand and prefetch); returns the reads started.
    fn idle_fill(&self, py: Python<'_>) -> PyResult<usize> {
        detach(py, || self.inner.idle_fill())
    }

    /// True when every expert is in RAM and no read is queued or in service.
    fn all_resident(&self) -> bool {
        self.inner.all_resident()
    }

    /// Background fills ([`Self::idle_fill`]) not finished yet.
    fn fills_left(&self) -> usize {
        self.inner.fills_left()
    }

    /// Saves the usage table atomically to `path`.
    fn save_usage(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let key = self.model_key;
        detach(py, || self.inner.save_usage(&path, key))
    }

    /// Loads the usage table at `path` if present; returns why a table was ignored
    /// (corrupt, or another model's), or None.
    fn load_usage(&self, py: Python<'_>, path: PathBuf) -> PyResult<Option<String>> {
        let key = self.model_key;
        detach(py, || self.inner.load_usage(&path, key))
    }

    /// A forward pass of `tokens` tokens is done (a prompt batch ages the decay values
    /// by its token count).
    fn forward_done(&self, tokens: u64) {
        self.inner.forward_done(tokens);
    }

    /// LRU eviction while a prompt batch runs (True), the policy's values for decode.
    fn set_prompt_mode(&self, prompt: bool) {
        self.inner.set_prompt_mode(prompt);
    }

    /// Lends at least `nbytes` of slot memory (whole slots) to a prompt's working
    /// memory: empty slots first, then the coldest unpinned residents; never a pinned
    /// slot, never a layer's last usable slot. Their pages go back to the OS and no
    /// expert is placed in them until `reclaim`. Returns the bytes given back. The
    /// arena must not be page-locked (cudaHostRegister) while slots are lent.
    fn lend(&self, py: Python<'_>, nbytes: u64) -> PyResult<u64> {
        detach(py, || self.inner.lend(nbytes))
    }

    /// Every lent slot is usable again; returns how many came back.
    fn reclaim(&self, py: Python<'_>) -> usize {
        py.allow_threads(|| self.inner.reclaim())
    }

    /// Usable slots (slots minus lent ones) of each streamed layer, in the order of
    /// `streamed`: a wave holds at most this many experts.
    fn usable_slots(&self) -> Vec<usize> {
        self.inner.usable_slots()
    }

    /// The token is done (cache decay clock).
    fn tick(&self) {
        self.inner.tick();
    }

    /// Waits until nothing is queued or in service; True if it got there in time.
    fn wait_idle(&self, py: Python<'_>, timeout_s: f64) -> bool {
        let t = Duration::from_secs_f64(timeout_s.max(0.0));
        py.allow_threads(|| self.inner.engine().wait_idle(t))
    }

    /// Counters as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, c) = self.inner.stats();
        let lc = self.inner.lend_counts();
        let d = PyDict::new(py);
        for (k, v) in [
            ("demands", s.demands),
            ("predictions", s.predictions),
            ("bound", s.bound),
            ("bind_failed", s.bind_failed),
            ("cancelled", s.cancelled),
            ("promoted", s.promoted),
            ("failed", s.failed),
            ("reads_demand", s.reads.0),
            ("reads_prefetch", s.reads.1),
            ("bytes_demand", s.bytes.0),
            ("bytes_prefetch", s.bytes.1),
            ("reads_fill", s.reads.2),
            ("bytes_fill", s.bytes.2),
            ("waits", s.waits),
            ("wait_us", s.wait_us),
            ("max_in_service", s.max_in_service),
            ("hits", c.hits),
            ("in_flight_at_start", c.in_flight),
            ("demand_placements", c.demand),
            ("fills", c.fills),
            ("lent_slots", lc.lent_slots),
            ("lent_bytes", lc.lent_bytes),
            ("lends", lc.lends),
            ("given_back_bytes", lc.given_bytes),
            ("lend_evicted", lc.evicted),
            ("demand_p50_us", s.demand_latency.quantile_us(0.5)),
            ("demand_p99_us", s.demand_latency.quantile_us(0.99)),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}
