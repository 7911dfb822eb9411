//! The queueing state of the engine, free of threads and I/O so its rules can be tested
//! directly: demand first; prefetches split into chunks and capped (fewer while a demand
//! is in service); predictions bound to a slot only when a worker has nothing better to
//! do (late binding); cancel and promote when a layer starts. Background fills come
//! last: chunked like prefetches, started only when no prefetch waits, never cancelled
//! by a layer start, and promoted to demand when a layer selects one.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use ftw_format::ExpertEntry;

use crate::config::EngineConfig;
use crate::error::{IoError, Result};
use crate::job::{ExpertKey, Job, JobState, Proj, ReadClass};
use crate::slots::{Slot, SlotSource};
use crate::stats::Stats;

/// Where one expert's slab lies in the file.
#[derive(Debug, Clone, Copy)]
struct SlabInfo {
    off: u64,
    len: u64,
    proj_end: [u64; 3],
    xxh3: u64,
}

/// One read for a worker: `len` bytes at `file_off` into `addr`.
#[derive(Debug, Clone, Copy)]
pub struct WorkItem {
    /// The expert.
    pub key: ExpertKey,
    /// Generation of the job it belongs to.
    pub gen: u64,
    /// Queue it came from (counts against that class's service).
    pub class: ReadClass,
    /// Absolute file offset.
    pub file_off: u64,
    /// Destination address (slot start + relative offset).
    pub addr: usize,
    /// Offset inside the slab.
    pub rel_off: u64,
    /// Bytes.
    pub len: u64,
}

/// A prediction waiting for a worker and a slot.
#[derive(Debug, Clone, Copy)]
struct Prediction {
    key: ExpertKey,
    distance: u8,
    rank: u8,
}

/// What `begin_layer` found for each selected expert.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LayerStart {
    /// Being read by the engine (promoted if it was a prefetch): wait on them.
    pub pending: Vec<u32>,
    /// Read earlier and handed to the cache: resident now.
    pub done: Vec<u32>,
    /// Unknown to the engine: check the cache, demand if missing.
    pub absent: Vec<u32>,
    /// Predictions and prefetches of this layer that the router did not select.
    pub cancelled: usize,
    /// Selected experts whose prefetch was moved to the demand queue.
    pub promoted: usize,
    /// Whether any prediction, read or record of the layer was dropped or promoted:
    /// only then can an idle worker have new work or a waiter a new outcome.
    pub changed: bool,
}

/// Result of a finished read that the engine must act on outside the lock.
#[derive(Debug, Clone, Copy)]
pub enum Finish {
    /// Nothing more to do.
    Nothing,
    /// All bytes are in: hash `len` bytes at `addr` and call `verified`.
    Verify {
        /// The expert.
        key: ExpertKey,
        /// Its job generation.
        gen: u64,
        /// Slot address.
        addr: usize,
        /// Slab length.
        len: u64,
        /// Expected checksum.
        xxh3: u64,
    },
}

/// What a waiter sees.
#[derive(Debug, Clone)]
pub enum WaitStatus {
    /// The projection is in the slot.
    Ready(Slot),
    /// Not yet.
    Pending,
    /// Never will be.
    Failed(IoError),
}

/// The scheduler state (see the module docs).
#[derive(Debug)]
pub struct Scheduler {
    cfg: EngineConfig,
    index: HashMap<ExpertKey, SlabInfo>,
    jobs: HashMap<ExpertKey, Job>,
    zombies: Vec<Job>,
    demand_q: VecDeque<ExpertKey>,
    prefetch_q: VecDeque<ExpertKey>,
    fill_q: VecDeque<ExpertKey>,
    waiting: Vec<Prediction>,
    demand_in_service: usize,
    prefetch_in_service: usize,
    fill_in_service: usize,
    verifying: usize,
    next_gen: u64,
    /// Waiters blocked now, and since when at least one has been (stall time is wall
    /// time with someone blocked: threads that wait together count once).
    blocked: u32,
    blocked_since: Option<Instant>,
    /// Counters.
    pub stats: Stats,
}

impl Scheduler {
    /// A scheduler over the experts of a file (from its validated index).
    pub fn new(cfg: EngineConfig, experts: &[ExpertEntry]) -> Self {
        let index = experts
            .iter()
            .map(|e| {
                let key = ExpertKey {
                    layer: e.layer,
                    expert: e.expert,
                };
                let proj_end = e.proj.map(|p| p.off + p.len);
                (
                    key,
                    SlabInfo {
                        off: e.off,
                        len: e.len,
                        proj_end,
                        xxh3: e.xxh3,
                    },
                )
            })
            .collect();
        Self {
            cfg,
            index,
            jobs: HashMap::new(),
            zombies: Vec::new(),
            demand_q: VecDeque::new(),
            prefetch_q: VecDeque::new(),
            fill_q: VecDeque::new(),
            waiting: Vec::new(),
            demand_in_service: 0,
            prefetch_in_service: 0,
            fill_in_service: 0,
            verifying: 0,
            next_gen: 1,
            blocked: 0,
            blocked_since: None,
            stats: Stats::default(),
        }
    }

    /// A waiter starts blocking at `now`.
    pub fn block_begin(&mut self, now: Instant) {
        if self.blocked == 0 {
            self.blocked_since = Some(now);
        }
        self.blocked += 1;
        self.stats.waits += 1;
    }

    /// A waiter that blocked stops at `now`; the last one out adds the wall time since
    /// the first one in to `wait_us`.
    pub fn block_end(&mut self, now: Instant) {
        self.blocked = self.blocked.saturating_sub(1);
        if self.blocked == 0 {
            if let Some(since) = self.blocked_since.take() {
                self.stats.wait_us += now.saturating_duration_since(since).as_micros() as u64;
            }
        }
    }

    fn info(&self, key: ExpertKey) -> Result<SlabInfo> {
        self.index.get(&key).copied().ok_or(IoError::NoSuchExpert {
            layer: key.layer,
            expert: key.expert,
        })
    }

    fn new_job(&mut self, key: ExpertKey, class: ReadClass, slot: Slot) -> Result<Job> {
        let info = self.info(key)?;
        if slot.len < info.len || !slot.addr.is_multiple_of(4096) || slot.addr == 0 {
            let detail = format!(
                "{} bytes at {:#x} for a {}-byte slab",
                slot.len, slot.addr, info.len
            );
            return Err(IoError::BadSlot {
                layer: key.layer,
                expert: key.expert,
                detail,
            });
        }
        let chunk = if class != ReadClass::Demand && self.cfg.chunking {
            self.cfg.chunk_bytes
        } else {
            info.len
        };
        let pending = (0..info.len.div_ceil(chunk))
            .map(|i| (i * chunk, chunk.min(info.len - i * chunk)))
            .collect();
        self.next_gen += 1;
        Ok(Job {
            gen: self.next_gen,
            key,
            class,
            slot,
            file_off: info.off,
            slab_len: info.len,
            proj_end: info.proj_end,
            xxh3: info.xxh3,
            pending,
            landed: Vec::new(),
            in_flight: 0,
            ready: [false; 3],
            state: JobState::Active,
            submitted: Instant::now(),
        })
    }

    /// Queues a demand read of `key` into `slot`. Returns `false` (slot not used: give
    /// it back) when the engine is already reading this expert; a prefetch of it is
    /// promoted instead.
    pub fn demand(&mut self, key: ExpertKey, slot: Slot) -> Result<bool> {
        self.waiting.retain(|p| p.key != key);
        if let Some(job) = self.jobs.get(&key) {
            if matches!(job.state, JobState::Active | JobState::Verifying) {
                self.promote(key);
                return Ok(false);
            }
            // Failed, or Done earlier and since evicted by the cache (the caller only
            // demands what the cache does not hold): a stale record, read again.
            self.jobs.remove(&key);
        }
        let job = self.new_job(key, ReadClass::Demand, slot)?;
        self.jobs.insert(key, job);
        self.demand_q.push_back(key);
        self.stats.demands += 1;
        Ok(true)
    }

    /// Queues a background fill of `key` into `slot`. Returns `false` (slot not used:
    /// give it back) when the engine is already reading this expert.
    pub fn fill(&mut self, key: ExpertKey, slot: Slot) -> Result<bool> {
        if self.is_live(key) {
            return Ok(false);
        }
        self.jobs.remove(&key); // a stale record (see `demand`)
        let job = self.new_job(key, ReadClass::Fill, slot)?;
        self.jobs.insert(key, job);
        self.fill_q.push_back(key);
        self.stats.fills += 1;
        Ok(true)
    }

    /// Adds a prediction (distance in layers ahead, rank in the router's top-k).
    pub fn predict(&mut self, key: ExpertKey, distance: u8, rank: u8) -> Result<()> {
        self.info(key)?;
        if self.jobs.contains_key(&key) || self.waiting.iter().any(|p| p.key == key) {
            return Ok(());
        }
        let at = self
            .waiting
            .partition_point(|p| (p.distance, p.rank) <= (distance, rank));
        self.waiting.insert(
            at,
            Prediction {
                key,
                distance,
                rank,
            },
        );
        self.stats.predictions += 1;
        Ok(())
    }

    fn promote(&mut self, key: ExpertKey) {
        let Some(job) = self.jobs.get_mut(&key) else {
            return;
        };
        if job.class != ReadClass::Demand && matches!(job.state, JobState::Active) {
            let from = job.class;
            job.class = ReadClass::Demand;
            self.stats.promoted += 1;
            if !job.pending.is_empty() {
                match from {
                    ReadClass::Fill => self.fill_q.retain(|k| *k != key),
                    _ => self.prefetch_q.retain(|k| *k != key),
                }
                self.demand_q.push_back(key);
            }
        }
    }

    /// Cancels and promotes for a layer that starts with `selected` experts.
    pub fn begin_layer(
        &mut self,
        layer: u32,
        selected: &[u32],
        src: &dyn SlotSource,
    ) -> LayerStart {
        let mut out = LayerStart::default();
        let is_sel = |e: u32| selected.contains(&e);
        // Unbound predictions of this layer go: selected ones are demanded by the
        // caller (reported absent), the others were wrong guesses. Fills stay.
        let wrong = self
            .waiting
            .iter()
            .filter(|p| p.key.layer == layer && !is_sel(p.key.expert));
        out.cancelled += wrong.count();
        let before = self.waiting.len();
        self.waiting.retain(|p| p.key.layer != layer);
        out.changed |= self.waiting.len() != before;
        let keys: Vec<ExpertKey> = self
            .jobs
            .iter()
            .filter(|(k, j)| k.layer == layer && !(j.class == ReadClass::Fill && j.is_live()))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if !is_sel(key.expert) {
                out.changed = true;
                let was_active = self
                    .jobs
                    .get(&key)
                    .is_some_and(|j| matches!(j.state, JobState::Active));
                self.cancel(key, src);
                out.cancelled += usize::from(was_active);
            }
        }
        for &e in selected {
            let key = ExpertKey { layer, expert: e };
            match self.jobs.get(&key).map(|j| j.state.clone()) {
                None => out.absent.push(e),
                Some(JobState::Done) => {
                    self.jobs.remove(&key);
                    out.done.push(e);
                }
                Some(JobState::Failed(_)) | Some(JobState::Cancelled) => out.pending.push(e),
                Some(JobState::Active) | Some(JobState::Verifying) => {
                    let before = self.stats.promoted;
                    self.promote(key);
                    out.promoted += usize::from(self.stats.promoted > before);
                    out.changed |= self.stats.promoted > before;
                    out.pending.push(e);
                }
            }
        }
        self.stats.cancelled += out.cancelled as u64;
        out
    }

    /// Stops the read of `key`: queued chunks dropped, slot released once no read of it
    /// is in service; waiters see `Cancelled`. Finished records are just forgotten.
    pub fn cancel(&mut self, key: ExpertKey, src: &dyn SlotSource) {
        self.waiting.retain(|p| p.key != key);
        let Some(mut job) = self.jobs.remove(&key) else {
            return;
        };
        if !matches!(job.state, JobState::Active | JobState::Verifying) {
            return;
        }
        self.demand_q.retain(|k| *k != key);
        self.prefetch_q.retain(|k| *k != key);
        self.fill_q.retain(|k| *k != key);
        job.pending.clear();
        let verifying = matches!(job.state, JobState::Verifying);
        job.state = JobState::Cancelled;
        // A slot being read into or hashed is released only when that work ends.
        if job.in_flight == 0 && !verifying {
            src.release(key, job.slot);
        } else {
            self.zombies.push(job);
        }
    }

    fn prefetch_cap(&self) -> usize {
        if self.demand_in_service > 0 || !self.demand_q.is_empty() {
            self.cfg.prefetch_cap_with_demand
        } else {
            self.cfg.prefetch_cap
        }
    }

    /// Background fill chunks in service at once: every worker while no demand is
    /// queued or in service, the prefetch cap with demand otherwise.
    fn fill_cap(&self) -> usize {
        if self.demand_in_service > 0 || !self.demand_q.is_empty() {
            self.cfg.prefetch_cap_with_demand
        } else {
            self.cfg.workers
        }
    }

    /// The next read a free worker should do, binding a prediction if nothing better;
    /// a background fill only when no prefetch is waiting for its turn.
    pub fn next_work(&mut self, src: &dyn SlotSource) -> Option<WorkItem> {
        if let Some(item) = self.pop_chunk(ReadClass::Demand) {
            self.demand_in_service += 1;
            return Some(item);
        }
        if self.prefetch_in_service < self.prefetch_cap() {
            if self.prefetch_q.is_empty() {
                self.bind_next(src);
            }
            if let Some(item) = self.pop_chunk(ReadClass::Prefetch) {
                self.prefetch_in_service += 1;
                return Some(item);
            }
        } else if !self.prefetch_q.is_empty() || !self.waiting.is_empty() {
            return None; // prefetches first
        }
        if self.fill_in_service + self.prefetch_in_service >= self.fill_cap() {
            return None;
        }
        let item = self.pop_chunk(ReadClass::Fill)?;
        self.fill_in_service += 1;
        Some(item)
    }

    fn bind_next(&mut self, src: &dyn SlotSource) {
        while !self.waiting.is_empty() {
            let p = self.waiting.remove(0);
            let Some(slot) = src.bind(p.key, ReadClass::Prefetch) else {
                self.stats.bind_failed += 1;
                continue;
            };
            match self.new_job(p.key, ReadClass::Prefetch, slot) {
                Ok(job) => {
                    self.jobs.insert(p.key, job);
                    self.prefetch_q.push_back(p.key);
                    self.stats.bound += 1;
                    return;
                }
                Err(_) => src.release(p.key, slot),
            }
        }
    }

    fn pop_chunk(&mut self, class: ReadClass) -> Option<WorkItem> {
        let q = match class {
            ReadClass::Demand => &mut self.demand_q,
            ReadClass::Prefetch => &mut self.prefetch_q,
            ReadClass::Fill => &mut self.fill_q,
        };
        let key = *q.front()?;
        let job = self.jobs.get_mut(&key)?;
        let (rel_off, len) = job.pending.pop_front()?;
        if job.pending.is_empty() {
            q.pop_front();
        }
        job.in_flight += 1;
        Some(WorkItem {
            key,
            gen: job.gen,
            class,
            file_off: job.file_off + rel_off,
            addr: job.slot.addr + rel_off as usize,
            rel_off,
            len,
        })
    }

    /// Records the end of a read (`Ok(bytes read)` or the error).
    pub fn finish(&mut self, item: &WorkItem, res: Result<u64>, src: &dyn SlotSource) -> Finish {
        match item.class {
            ReadClass::Demand => self.demand_in_service -= 1,
            ReadClass::Prefetch => self.prefetch_in_service -= 1,
            ReadClass::Fill => self.fill_in_service -= 1,
        }
        self.stats.record_read(item.class, item.len, res.is_ok());
        if let Some(i) = self
            .zombies
            .iter()
            .position(|z| z.key == item.key && z.gen == item.gen)
        {
            let z = self.zombies.get_mut(i).map(|z| {
                z.in_flight -= 1;
                (z.in_flight, z.slot)
            });
            if let Some((0, slot)) = z {
                self.zombies.swap_remove(i);
                src.release(item.key, slot);
            }
            return Finish::Nothing;
        }
        let Some(job) = self.jobs.get_mut(&item.key).filter(|j| j.gen == item.gen) else {
            return Finish::Nothing;
        };
        job.in_flight -= 1;
        match res {
            Err(e) => {
                job.pending.clear();
                job.state = JobState::Failed(e);
                self.demand_q.retain(|k| *k != item.key);
                self.prefetch_q.retain(|k| *k != item.key);
                self.fill_q.retain(|k| *k != item.key);
                self.stats.failed += 1;
            }
            Ok(_) => {
                job.landed.push((item.rel_off, item.len));
                job.update_early_ready();
            }
        }
        let Some(job) = self.jobs.get_mut(&item.key) else {
            return Finish::Nothing;
        };
        let all_landed = job.all_landed();
        match job.state {
            JobState::Failed(_) if job.in_flight == 0 => {
                src.release(item.key, job.slot);
                Finish::Nothing
            }
            JobState::Active if all_landed => {
                if self.cfg.verify {
                    job.state = JobState::Verifying;
                    self.verifying += 1;
                    let (key, gen, addr, len, xxh3) =
                        (job.key, job.gen, job.slot.addr, job.slab_len, job.xxh3);
                    Finish::Verify {
                        key,
                        gen,
                        addr,
                        len,
                        xxh3,
                    }
                } else {
                    let (key, gen) = (job.key, job.gen);
                    self.verified(key, gen, true, src);
                    Finish::Nothing
                }
            }
            _ => Finish::Nothing,
        }
    }

    /// Records a checksum result: the slab becomes ready (and resident in the cache),
    /// or the job fails naming the expert.
    pub fn verified(&mut self, key: ExpertKey, gen: u64, ok: bool, src: &dyn SlotSource) {
        if self.cfg.verify {
            self.verifying = self.verifying.saturating_sub(1);
        }
        if let Some(i) = self
            .zombies
            .iter()
            .position(|z| z.key == key && z.gen == gen)
        {
            let z = self.zombies.swap_remove(i);
            src.release(key, z.slot);
            return;
        }
        let Some(job) = self.jobs.get_mut(&key).filter(|j| j.gen == gen) else {
            return;
        };
        if ok {
            job.ready = [true; 3];
            job.state = JobState::Done;
            self.stats.record_done(job.class, job.submitted.elapsed());
            src.complete(key, job.slot);
        } else {
            job.ready = [false; 3];
            job.state = JobState::Failed(IoError::Checksum {
                layer: key.layer,
                expert: key.expert,
            });
            self.stats.failed += 1;
            src.release(key, job.slot);
        }
    }

    /// What a waiter for `proj` of `key` sees now.
    pub fn status(&self, key: ExpertKey, proj: Proj) -> WaitStatus {
        let Some(job) = self.jobs.get(&key) else {
            return WaitStatus::Failed(IoError::NotRequested {
                layer: key.layer,
                expert: key.expert,
            });
        };
        match &job.state {
            JobState::Failed(e) => WaitStatus::Failed(e.clone()),
            JobState::Cancelled => WaitStatus::Failed(IoError::Cancelled {
                layer: key.layer,
                expert: key.expert,
            }),
            _ if job.ready.get(proj as usize).copied().unwrap_or(false) => {
                WaitStatus::Ready(job.slot)
            }
            _ => WaitStatus::Pending,
        }
    }

    /// True while the engine is reading (or verifying) `key`.
    pub fn is_live(&self, key: ExpertKey) -> bool {
        self.jobs.get(&key).is_some_and(Job::is_live)
    }

    /// True while any read is in service or being verified (its slot is pinned).
    pub fn reads_in_flight(&self) -> bool {
        self.demand_in_service + self.prefetch_in_service + self.fill_in_service + self.verifying
            > 0
            || !self.zombies.is_empty()
    }

    /// True when nothing is queued, waiting or in service.
    pub fn idle(&self) -> bool {
        self.demand_q.is_empty()
            && self.prefetch_q.is_empty()
            && self.fill_q.is_empty()
            && self.waiting.is_empty()
            && self.demand_in_service == 0
            && self.prefetch_in_service == 0
            && self.fill_in_service == 0
            && self.verifying == 0
    }

    /// Queue depths now: (demand jobs, prefetch jobs, waiting predictions, in service).
    pub fn depths(&self) -> (usize, usize, usize, usize) {
        let in_service = self.demand_in_service + self.prefetch_in_service + self.fill_in_service;
        (
            self.demand_q.len(),
            self.prefetch_q.len(),
            self.waiting.len(),
            in_service,
        )
    }

    /// Prefetch chunks in service now.
    pub fn prefetch_in_service(&self) -> usize {
        self.prefetch_in_service
    }

    /// Experts of `layer` whose background fill has no read in service yet (it could be
    /// cancelled without waiting on a read), in no particular order.
    pub fn queued_fills(&self, layer: u32) -> Vec<u32> {
        self.jobs
            .values()
            .filter(|j| j.key.layer == layer && j.class == ReadClass::Fill && j.in_flight == 0)
            .filter(|j| matches!(j.state, JobState::Active))
            .map(|j| j.key.expert)
            .collect()
    }

    /// Cancels the background fill of `key` if no read of it is in service (its slot
    /// goes back at once); false if it is not such a fill any more.
    pub fn cancel_queued_fill(&mut self, key: ExpertKey, src: &dyn SlotSource) -> bool {
        let queued = self.jobs.get(&key).is_some_and(|j| {
            j.class == ReadClass::Fill && j.in_flight == 0 && matches!(j.state, JobState::Active)
        });
        if queued {
            self.cancel(key, src);
            self.stats.cancelled += 1;
        }
        queued
    }

    /// Background fill jobs not finished yet (queued, in service or being verified).
    pub fn fills_left(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.class == ReadClass::Fill && j.is_live())
            .count()
    }

    /// Jobs tracked (live and finished-but-unswept) plus zombies.
    pub fn tracked(&self) -> (usize, usize) {
        (self.jobs.len(), self.zombies.len())
    }
}
