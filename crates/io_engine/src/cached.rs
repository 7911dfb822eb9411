//! The engine bound to the RAM expert cache: slots come from the cache's arena, chosen
//! by its policy. This is what the streaming runtime drives, layer by layer:
//!
//! 1. `predict` the next layers' experts (lookahead): read only into slots the cache
//!    gives without evicting anything protected, when workers have nothing better to do;
//! 2. `begin_layer(layer, selected)`: wrong guesses are cancelled, selected prefetches
//!    promoted;
//! 3. `place(layer, wave)`: each expert of a wave (at most the layer's slots) gets a
//!    pinned slot: a cache hit, a read in flight, or a demand read into a slot chosen
//!    by the policy;
//! 4. `wait` for each projection before computing with it, then `unpin` the wave.
//!
//! While a prompt runs, `lend` takes slots out of use and gives their memory back to
//! the OS for the prompt's activations; `reclaim` takes them back (at the first decode
//! token). Waves must then fit the layer's usable slots (`usable_slots`).
//!
//! Lock order: engine state, then cache; lending, then cache. The cache lock is never
//! held while calling into the engine.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use expert_cache::{Admission, AdmitKind, AnyPolicy, Arena, ExpertCache, Lent, Mode, UsageTable};
use ftw_format::ExpertEntry;

use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::error::{IoError, Result};
use crate::job::{ExpertKey, Proj, ReadClass};
use crate::scheduler::LayerStart;
use crate::slots::{Slot, SlotSource};
use crate::stats::Stats;

/// The cache and its arena as a [`SlotSource`].
#[derive(Debug)]
pub struct CacheSlots {
    cache: Mutex<ExpertCache<AnyPolicy>>,
    arena: Arena,
    /// Model layer -> streamed (cache) layer.
    layers: Vec<Option<usize>>,
    /// Streamed (cache) layer -> model layer.
    streamed: Vec<u32>,
}

impl CacheSlots {
    /// `streamed[i]` is the model layer of cache layer `i`.
    pub fn new(cache: ExpertCache<AnyPolicy>, arena: Arena, streamed: &[u32]) -> Self {
        let max = streamed.iter().copied().max().map_or(0, |m| m as usize + 1);
        let mut layers = vec![None; max];
        for (i, &l) in streamed.iter().enumerate() {
            if let Some(slot) = layers.get_mut(l as usize) {
                *slot = Some(i);
            }
        }
        Self {
            cache: Mutex::new(cache),
            arena,
            layers,
            streamed: streamed.to_vec(),
        }
    }

    /// The cache, locked (never call the engine while holding it).
    pub fn cache(&self) -> MutexGuard<'_, ExpertCache<AnyPolicy>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The arena behind every slot.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The cache layer of a model layer.
    pub fn cache_layer(&self, layer: u32) -> Option<usize> {
        self.layers.get(layer as usize).copied().flatten()
    }

    fn slot(&self, layer: usize, slot: u32) -> Option<Slot> {
        let addr = self.arena.slot_ptr(layer, slot as usize).ok()? as usize;
        Some(Slot {
            index: slot,
            addr,
            len: self.arena.plan().slot_bytes,
        })
    }

    fn admit(&self, key: ExpertKey, kind: AdmitKind) -> Option<Slot> {
        let l = self.cache_layer(key.layer)?;
        let mut c = self.cache();
        if c.lookup(l, key.expert).ok()?.is_some() {
            return None;
        }
        match c.admit(l, key.expert, kind).ok()? {
            Admission::Placed { slot, .. } => {
                c.pin(l, key.expert).ok()?;
                drop(c);
                self.slot(l, slot)
            }
            Admission::Declined => None,
        }
    }
}

impl SlotSource for CacheSlots {
    fn bind(&self, key: ExpertKey, _class: ReadClass) -> Option<Slot> {
        self.admit(key, AdmitKind::Prefetch)
    }
    fn complete(&self, key: ExpertKey, _slot: Slot) {
        if let Some(l) = self.cache_layer(key.layer) {
            let _ = self.cache().unpin(l, key.expert);
        }
    }
    fn release(&self, key: ExpertKey, _slot: Slot) {
        if let Some(l) = self.cache_layer(key.layer) {
            let mut c = self.cache();
            let _ = c.unpin(l, key.expert);
            let _ = c.evict(l, key.expert);
        }
    }
}

/// Where a selected expert's bytes are when its layer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The expert.
    pub expert: u32,
    /// Its slot in the layer's pool.
    pub slot: Slot,
    /// Already resident and complete (no wait needed).
    pub hit: bool,
}

fn cache_error(e: expert_cache::CacheError) -> IoError {
    IoError::Config(format!("expert cache: {e}"))
}

/// Residents evicted among `lent` (slots whose lending was undone still lost them).
fn count_evicted(lent: Option<&[Lent]>) -> u64 {
    lent.map_or(0, |l| {
        l.iter().filter(|x| x.evicted.is_some()).count() as u64
    })
}

/// Counters of the cache side, per layer start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerCounts {
    /// Selected experts found resident.
    pub hits: u64,
    /// Selected experts being read when the layer started (prefetch in flight).
    pub in_flight: u64,
    /// Selected experts read on demand.
    pub demand: u64,
    /// Experts read by idle fill.
    pub fills: u64,
}

/// Slots lent to a prompt's working memory ([`CachedEngine::lend`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LendCounts {
    /// Slots lent out now.
    pub lent_slots: u64,
    /// Bytes given back to the OS for the slots lent now.
    pub lent_bytes: u64,
    /// Calls to `lend` that lent at least one slot.
    pub lends: u64,
    /// Bytes given back over all lends.
    pub given_bytes: u64,
    /// Residents evicted to lend their slots, over all lends.
    pub evicted: u64,
}

/// An [`Engine`] whose slots are the RAM expert cache's.
#[derive(Debug)]
pub struct CachedEngine {
    slots: Arc<CacheSlots>,
    engine: Engine,
    counts: Mutex<LayerCounts>,
    /// Held through `lend` and `reclaim` (before the cache lock), so they never overlap.
    lending: Mutex<LendCounts>,
}

impl CachedEngine {
    /// Opens `path` (expert index `experts`) over the given cache and arena.
    pub fn open(
        path: &Path,
        experts: &[ExpertEntry],
        slots: CacheSlots,
        cfg: EngineConfig,
    ) -> Result<Self> {
        let slots = Arc::new(slots);
        let engine = Engine::open(path, experts, slots.clone(), cfg)?;
        Ok(Self {
            slots,
            engine,
            counts: Mutex::new(LayerCounts::default()),
            lending: Mutex::new(LendCounts::default()),
        })
    }

    /// The engine (for waits, predictions, stats).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The cache and arena.
    pub fn slots(&self) -> &CacheSlots {
        &self.slots
    }

    fn layer_index(&self, layer: u32) -> Result<usize> {
        self.slots
            .cache_layer(layer)
            .ok_or(IoError::NoSuchExpert { layer, expert: 0 })
    }

    /// Starts `layer` with the router's `selected` experts: its predictions and
    /// prefetches the router did not pick are cancelled, picked ones still being read
    /// are promoted, and its experts lose their prediction protection.
    pub fn begin_layer(&self, layer: u32, selected: &[u32]) -> Result<LayerStart> {
        let l = self.layer_index(layer)?;
        let start = self.engine.begin_layer(layer, selected);
        self.slots.cache().start_layer(l).map_err(cache_error)?;
        Ok(start)
    }

    /// Gives each of `experts` (at most the layer's slot count) a slot and pins it for
    /// use: a hit, a read in flight, or a new demand read. Call [`Self::unpin`] with the
    /// same experts once they have been computed. Resident experts are pinned first, so
    /// a demand read of the same wave never evicts one of them before it is pinned;
    /// the result keeps the order of `experts`.
    pub fn place(&self, layer: u32, experts: &[u32]) -> Result<Vec<Placement>> {
        let l = self.layer_index(layer)?;
        let mut out: Vec<Option<Placement>> = vec![None; experts.len()];
        let mut counts = LayerCounts::default();
        let mut misses = Vec::new();
        for (i, &e) in experts.iter().enumerate() {
            let resident = self.slots.cache().lookup(l, e).map_err(cache_error)?;
            match resident {
                Some(slot) => {
                    let placed = self.use_resident(l, ExpertKey { layer, expert: e }, slot)?;
                    if placed.hit {
                        counts.hits += 1;
                    } else {
                        counts.in_flight += 1;
                    }
                    if let Some(o) = out.get_mut(i) {
                        *o = Some(placed);
                    }
                }
                None => misses.push(i),
            }
        }
        for i in misses {
            let Some(&e) = experts.get(i) else { continue };
            counts.demand += 1;
            let placed = self.demand(ExpertKey { layer, expert: e }, experts)?;
            self.slots.cache().pin(l, e).map_err(cache_error)?;
            if let Some(o) = out.get_mut(i) {
                *o = Some(placed);
            }
        }
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.hits += counts.hits;
        c.in_flight += counts.in_flight;
        c.demand += counts.demand;
        Ok(out.into_iter().flatten().collect())
    }

    /// A use of a resident expert (complete: a hit; or still being read): touched and
    /// pinned.
    fn use_resident(&self, l: usize, key: ExpertKey, slot: u32) -> Result<Placement> {
        let live = self.engine.is_live(key);
        let mut c = self.slots.cache();
        c.touch(l, key.expert).map_err(cache_error)?;
        c.pin(l, key.expert).map_err(cache_error)?;
        drop(c);
        let s = self
            .slots
            .slot(l, slot)
            .ok_or(IoError::Config(format!("slot {slot} outside the arena")))?;
        Ok(Placement {
            expert: key.expert,
            slot: s,
            hit: !live,
        })
    }

    /// Pins those of `experts` whose bytes are complete in RAM (resident, no read in
    /// flight) and returns their placements; others are skipped, nothing is read and
    /// recency is unchanged. For copies out of a slot (e.g. into a VRAM cache): call
    /// [`Self::unpin`] with the returned experts once the copy is done.
    pub fn pin_resident(&self, layer: u32, experts: &[u32]) -> Result<Vec<Placement>> {
        let l = self.layer_index(layer)?;
        let mut out = Vec::new();
        for &e in experts {
            if self.engine.is_live(ExpertKey { layer, expert: e }) {
                continue;
            }
            let mut c = self.slots.cache();
            let Some(slot) = c.lookup(l, e).map_err(cache_error)? else {
                continue;
            };
            c.pin(l, e).map_err(cache_error)?;
            drop(c);
            let s = self
                .slots
                .slot(l, slot)
                .ok_or(IoError::Config(format!("slot {slot} outside the arena")))?;
            out.push(Placement {
                expert: e,
                slot: s,
                hit: true,
            });
        }
        Ok(out)
    }

    /// Counts router selections served without this cache (VRAM hits) in the usage
    /// table, so it ranks experts by all their uses.
    pub fn record_use(&self, layer: u32, experts: &[u32]) -> Result<()> {
        let l = self.layer_index(layer)?;
        let mut c = self.slots.cache();
        for &e in experts {
            c.record_use(l, e).map_err(cache_error)?;
        }
        Ok(())
    }

    /// Drops the use pins [`Self::place`] took.
    pub fn unpin(&self, layer: u32, experts: &[u32]) -> Result<()> {
        let l = self.layer_index(layer)?;
        let mut c = self.slots.cache();
        for &e in experts {
            c.unpin(l, e).map_err(cache_error)?;
        }
        Ok(())
    }

    /// A demand read of `key` for a wave of `wave`'s experts.
    fn demand(&self, key: ExpertKey, wave: &[u32]) -> Result<Placement> {
        let full = || IoError::BadSlot {
            layer: key.layer,
            expert: key.expert,
            detail: "every slot of the layer is pinned".into(),
        };
        // A slot may be pinned by a read still in service (a cancelled prediction of
        // this layer finishing its chunk): wait for reads to end before giving up.
        let deadline = Instant::now() + Duration::from_secs(30);
        let slot = loop {
            if let Some(slot) = self.slots.admit(key, AdmitKind::Demand) {
                break slot;
            }
            // Slots held by background fills not started yet: give one back now rather
            // than wait for the fill to get to it (the idle fill reads it again later).
            if self.cancel_one_fill(key.layer, wave) {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(full());
            }
            if !self
                .engine
                .wait_for_reads(left.min(Duration::from_millis(50)))
            {
                // Nothing in flight any more: one last try, then the layer is truly full.
                break self.slots.admit(key, AdmitKind::Demand).ok_or_else(full)?;
            }
        };
        if !self.engine.demand(key, slot)? {
            // The engine already had it in hand: undo the second placement.
            self.slots.release(key, slot);
        }
        Ok(Placement {
            expert: key.expert,
            slot,
            hit: false,
        })
    }

    /// Cancels one of `layer`'s background fills that has no read in service, is not of
    /// `wave`'s experts and holds only its read's pin; true if one was.
    fn cancel_one_fill(&self, layer: u32, wave: &[u32]) -> bool {
        let Some(l) = self.slots.cache_layer(layer) else {
            return false;
        };
        for expert in self.engine.queued_fills(layer) {
            if wave.contains(&expert) || self.slots.cache().pins(l, expert) != 1 {
                continue;
            }
            if self.engine.cancel_queued_fill(ExpertKey { layer, expert }) {
                return true;
            }
        }
        false
    }

    /// Blocks until `proj` of the expert is in its slot (down: whole slab verified).
    /// A resident expert the engine has no read of is complete: its slot is returned.
    pub fn wait(&self, layer: u32, expert: u32, proj: Proj, timeout: Duration) -> Result<Slot> {
        match self.engine.wait(ExpertKey { layer, expert }, proj, timeout) {
            Err(e @ IoError::NotRequested { .. }) => {
                let l = self.slots.cache_layer(layer).ok_or(e.clone())?;
                let slot = self
                    .slots
                    .cache()
                    .lookup(l, expert)
                    .ok()
                    .flatten()
                    .ok_or(e.clone())?;
                self.slots.slot(l, slot).ok_or(e)
            }
            other => other,
        }
    }

    /// The experts of `layer` that hold a slot now (complete, or being read), in
    /// expert order. For planning a prompt's waves: these need no new read.
    pub fn resident(&self, layer: u32) -> Result<Vec<u32>> {
        let l = self.layer_index(layer)?;
        let c = self.slots.cache();
        let mut out = Vec::new();
        for e in 0..c.n_experts() {
            if c.lookup(l, e).map_err(cache_error)?.is_some() {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Protects those of `experts` resident in `layer` until the layer next starts or
    /// the forward pass ends: a demand read of this layer evicts them only when every
    /// other unpinned slot is protected too, a prefetch never. A prompt's wave plan uses
    /// it to keep a later wave's resident experts until that wave runs. Returns how
    /// many were protected.
    pub fn protect(&self, layer: u32, experts: &[u32]) -> Result<usize> {
        let l = self.layer_index(layer)?;
        let mut c = self.slots.cache();
        let mut n = 0;
        for &e in experts {
            if c.lookup(l, e).map_err(cache_error)?.is_some() {
                c.protect(l, e).map_err(cache_error)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Undecayed use counts of `layer`'s experts (the usage table's row).
    pub fn usage(&self, layer: u32) -> Result<Vec<u64>> {
        let l = self.layer_index(layer)?;
        let c = self.slots.cache();
        let n = c.n_experts() as usize;
        let row = c
            .usage()
            .counts()
            .get(l * n..(l + 1) * n)
            .ok_or(IoError::Config(format!("usage table has no row {l}")))?;
        Ok(row.to_vec())
    }

    /// Lookahead predictions `(layer, expert, distance, rank)`.
    pub fn predict(&self, predictions: &[(u32, u32, u8, u8)]) -> Result<()> {
        let p: Vec<_> = predictions
            .iter()
            .filter(|(l, ..)| self.slots.cache_layer(*l).is_some())
            .map(|&(layer, expert, d, r)| (ExpertKey { layer, expert }, d, r))
            .collect();
        self.engine.predict(&p)
    }

    /// True when every expert of every streamed layer is in RAM and no read is queued
    /// or in service: nothing can miss, so lookahead has nothing to read ahead.
    pub fn all_resident(&self) -> bool {
        // The cache first: a budget that cannot hold every expert answers at its first
        // layer, before the engine's lock is taken (called once per decode layer).
        self.slots.cache().holds_every_expert() && self.engine.is_idle()
    }

    /// Background fills not finished yet ([`Self::idle_fill`]'s reads).
    pub fn fills_left(&self) -> usize {
        self.engine.fills_left()
    }

    /// Idle fill: reads the most-used experts (usage table) not resident into the empty
    /// slots of every layer, never evicting, as background reads (after every demand
    /// and prefetch; a layer that selects one promotes it). Returns the reads started.
    pub fn idle_fill(&self) -> Result<usize> {
        let plan = self.slots.cache().idle_fill();
        let mut started = 0;
        for (l, expert) in plan {
            let Some(&layer) = self.slots.streamed.get(l) else {
                continue;
            };
            let key = ExpertKey { layer, expert };
            if self.engine.is_live(key) {
                continue;
            }
            if let Some(slot) = self.slots.admit(key, AdmitKind::Fill) {
                if self.engine.fill(key, slot)? {
                    started += 1;
                } else {
                    self.slots.release(key, slot);
                }
            }
        }
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).fills += started as u64;
        Ok(started)
    }

    /// Saves the usage table (undecayed use counts) atomically to `path`.
    pub fn save_usage(&self, path: &Path, model_key: u64) -> Result<()> {
        let table = self.slots.cache().usage().clone();
        table.save(path, model_key).map_err(cache_error)
    }

    /// Loads the usage table at `path` if there is one; a corrupt or foreign table is
    /// ignored and its reason returned (for one printed line).
    pub fn load_usage(&self, path: &Path, model_key: u64) -> Result<Option<String>> {
        let mut c = self.slots.cache();
        let (layers, experts) = (c.n_layers(), c.n_experts());
        let (table, ignored) =
            UsageTable::load_or_new(path, layers, experts, model_key).map_err(cache_error)?;
        c.set_usage(table).map_err(cache_error)?;
        Ok(ignored.map(|e| e.to_string()))
    }

    /// A forward pass of `tokens` tokens is done: one decode tick, or a prompt batch
    /// that ages the decay values by its token count.
    pub fn forward_done(&self, tokens: u64) {
        let mut c = self.slots.cache();
        if tokens > 1 {
            c.prompt_batch(tokens);
        } else {
            c.tick();
        }
    }

    /// Eviction mode for the next forward pass: LRU for prompt batches, the policy's
    /// values for decode.
    pub fn set_prompt_mode(&self, prompt: bool) {
        self.slots
            .cache()
            .set_mode(if prompt { Mode::Prompt } else { Mode::Decode });
    }

    /// The token is done (decay clock, protections end).
    pub fn tick(&self) {
        self.slots.cache().tick();
    }

    /// Lends at least `bytes` of slot memory (whole slots) to a prompt's working memory,
    /// as far as the rules allow: empty slots first, then the coldest unpinned
    /// residents (evicted by the policy's order); never a pinned slot, and every layer
    /// keeps at least one usable slot. Each lent slot's pages are given back to the OS
    /// (`madvise`) and no expert is placed in it until [`Self::reclaim`]. A slot whose
    /// pages could not be given back (a platform without the call, pages larger than
    /// a slot) is usable again at once. Returns the bytes given back.
    ///
    /// The arena must not be page-locked for a device while slots are lent (a device
    /// would keep the old pages); the streaming runtime lends only for CPU prompts.
    pub fn lend(&self, bytes: u64) -> Result<u64> {
        let slot_bytes = self.slots.arena.plan().slot_bytes.max(1);
        let n = usize::try_from(bytes.div_ceil(slot_bytes)).unwrap_or(usize::MAX);
        if n == 0 {
            return Ok(0);
        }
        let mut counts = self.lending.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = self.slots.cache();
        let lent = c.lend(n, 1);
        let mut given = 0u64;
        let mut kept = 0u64;
        let mut evicted = 0u64;
        for (i, l) in lent.iter().enumerate() {
            // SAFETY: the cache lock is held and the slot was just lent: it is unpinned
            // (no read into it, no copy from it), holds no expert (no view of it is in
            // use) and is not free, so nothing is placed in it until `reclaim`, which
            // takes the lending lock held here. The arena is not page-locked (see above).
            let released = unsafe { self.slots.arena.release_slot(l.layer, l.slot as usize) };
            match released {
                Ok(b) if b > 0 => {
                    given += b as u64;
                    kept += 1;
                    evicted += u64::from(l.evicted.is_some());
                }
                Ok(_) => {
                    c.reclaim_slot(l.layer, l.slot).map_err(cache_error)?;
                    evicted += u64::from(l.evicted.is_some());
                }
                Err(e) => {
                    for back in lent.iter().skip(i) {
                        c.reclaim_slot(back.layer, back.slot).map_err(cache_error)?;
                    }
                    counts.lent_bytes += given;
                    counts.given_bytes += given;
                    counts.evicted += evicted + count_evicted(lent.get(i..));
                    counts.lent_slots = c.total_lent() as u64;
                    return Err(cache_error(e));
                }
            }
        }
        counts.lent_slots = c.total_lent() as u64;
        counts.lent_bytes += given;
        counts.given_bytes += given;
        counts.evicted += evicted;
        counts.lends += u64::from(kept > 0);
        Ok(given)
    }

    /// Every lent slot is usable again (empty; its pages fault back in when a read
    /// writes it). Returns how many slots came back.
    pub fn reclaim(&self) -> usize {
        let mut counts = self.lending.lock().unwrap_or_else(|p| p.into_inner());
        let back = self.slots.cache().reclaim().len();
        counts.lent_slots = 0;
        counts.lent_bytes = 0;
        back
    }

    /// Usable slots (slots minus lent ones) of every streamed layer, in the order of
    /// the `streamed` layers the cache was built with: a wave holds at most this many.
    pub fn usable_slots(&self) -> Vec<usize> {
        let c = self.slots.cache();
        (0..c.n_layers())
            .map(|l| c.usable_slots(l).unwrap_or(0))
            .collect()
    }

    /// Counters of lent slots and memory given back.
    pub fn lend_counts(&self) -> LendCounts {
        *self.lending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Engine counters and the cache-side counts.
    pub fn stats(&self) -> (Stats, LayerCounts) {
        (
            self.engine.stats(),
            *self.counts.lock().unwrap_or_else(|p| p.into_inner()),
        )
    }
}
