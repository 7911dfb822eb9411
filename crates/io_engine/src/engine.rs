//! The engine: worker threads around the [`Scheduler`], each with its own file handle
//! (one shared handle can serialize reads), meeting callers through two condition
//! variables: one wakes workers when work appears, one wakes waiters when reads end.

use std::collections::VecDeque;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ftw_format::ExpertEntry;

use crate::config::EngineConfig;
use crate::error::{IoError, Result};
use crate::file::{open_for_reads, read_at, ReadMode};
use crate::job::{ExpertKey, Proj};
use crate::scheduler::{Finish, LayerStart, Scheduler, WaitStatus, WorkItem};
use crate::slots::{Slot, SlotSource};
use crate::stats::Stats;

struct Shared {
    sched: Mutex<Scheduler>,
    work_cv: Condvar,
    done_cv: Condvar,
    /// Slabs whose bytes are all in, waiting for their checksum (hashed by verifier
    /// threads so a worker goes on to its next read at once: with one worker, hashing
    /// in line cost 10% of read throughput on the CPU box and 7 points on the GPU box).
    verify_q: Mutex<VecDeque<Finish>>,
    verify_cv: Condvar,
    shutdown: AtomicBool,
    src: Arc<dyn SlotSource>,
    cfg: EngineConfig,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Scheduler> {
        // A worker that panicked mid-update cannot leave the queues worse than a
        // crash would; keep serving instead of poisoning every later call.
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reads expert slabs into cache slots with N workers (see the crate docs).
pub struct Engine {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    mode: ReadMode,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workers", &self.workers.len())
            .field("mode", &self.mode)
            .finish()
    }
}

impl Engine {
    /// Starts the workers over `path`, whose validated expert index is `experts`.
    pub fn open(
        path: &Path,
        experts: &[ExpertEntry],
        src: Arc<dyn SlotSource>,
        cfg: EngineConfig,
    ) -> Result<Self> {
        cfg.validate()?;
        let (first, mode) = open_for_reads(path, cfg.direct)?;
        if cfg.direct && mode == ReadMode::Buffered {
            eprintln!(
                "flint: {}: the file system refuses direct I/O; reading through the page cache",
                path.display()
            );
        }
        let mut files = vec![first];
        for _ in 1..cfg.workers {
            files.push(open_for_reads(path, mode == ReadMode::Direct)?.0);
        }
        let shared = Arc::new(Shared {
            sched: Mutex::new(Scheduler::new(cfg.clone(), experts)),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            verify_q: Mutex::new(VecDeque::new()),
            verify_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            src,
            cfg,
        });
        let workers = files
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("flint-io-{i}"))
                    .spawn(move || worker(&s, &f))
                    .map_err(|e| IoError::Config(format!("spawning an I/O worker: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut workers = workers;
        for i in 0..(shared.cfg.workers / 4).max(1) {
            let s = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("flint-verify-{i}"))
                .spawn(move || verifier(&s))
                .map_err(|e| IoError::Config(format!("spawning a verifier: {e}")))?;
            workers.push(handle);
        }
        Ok(Self {
            shared,
            workers,
            mode,
        })
    }

    /// Whether reads bypass the page cache.
    pub fn mode(&self) -> ReadMode {
        self.mode
    }

    /// Reads `key` into `slot` before any prefetch. `Ok(false)`: the engine already had
    /// this expert in hand (a prefetch was promoted) and `slot` was not used.
    pub fn demand(&self, key: ExpertKey, slot: Slot) -> Result<bool> {
        let used = self.shared.lock().demand(key, slot)?;
        self.shared.work_cv.notify_all();
        Ok(used)
    }

    /// Reads `key` into `slot` in the background, after every demand and prefetch.
    /// `Ok(false)`: the engine is already reading this expert and `slot` was not used.
    pub fn fill(&self, key: ExpertKey, slot: Slot) -> Result<bool> {
        let used = self.shared.lock().fill(key, slot)?;
        self.shared.work_cv.notify_all();
        Ok(used)
    }

    /// Experts of `layer` whose background fill has no read in service yet.
    pub fn queued_fills(&self, layer: u32) -> Vec<u32> {
        self.shared.lock().queued_fills(layer)
    }

    /// Cancels the background fill of `key` if no read of it is in service (its slot is
    /// released at once); false if it is not such a fill.
    pub fn cancel_queued_fill(&self, key: ExpertKey) -> bool {
        let done = self
            .shared
            .lock()
            .cancel_queued_fill(key, self.shared.src.as_ref());
        self.shared.done_cv.notify_all();
        done
    }

    /// True when nothing is queued, waiting or in service (fills included).
    pub fn is_idle(&self) -> bool {
        self.shared.lock().idle()
    }

    /// Background fills not finished yet.
    pub fn fills_left(&self) -> usize {
        self.shared.lock().fills_left()
    }

    /// Queues predictions `(key, distance, rank)`; they get slots only when workers idle.
    pub fn predict(&self, predictions: &[(ExpertKey, u8, u8)]) -> Result<()> {
        {
            let mut s = self.shared.lock();
            for &(key, distance, rank) in predictions {
                s.predict(key, distance, rank)?;
            }
        }
        self.shared.work_cv.notify_all();
        Ok(())
    }

    /// A layer starts with `selected` experts: cancels its other predictions and
    /// prefetches, promotes the selected ones still being read.
    pub fn begin_layer(&self, layer: u32, selected: &[u32]) -> LayerStart {
        let out = self
            .shared
            .lock()
            .begin_layer(layer, selected, self.shared.src.as_ref());
        // Nothing dropped or promoted (every expert resident, no read in flight: V1's
        // decode): no thread to wake. Waking every worker each layer cost ~50 us a
        // layer call on the 2-core CPU box (`begin_layer` in a decode profile).
        if out.changed {
            self.shared.work_cv.notify_all();
            self.shared.done_cv.notify_all();
        }
        out
    }

    /// Stops reading `key` (its slot is released once no read of it is in service).
    pub fn cancel(&self, key: ExpertKey) {
        self.shared.lock().cancel(key, self.shared.src.as_ref());
        self.shared.done_cv.notify_all();
    }

    /// Blocks until `proj` of `key` is in its slot (down: the whole slab, verified),
    /// the read fails, or `timeout` passes.
    pub fn wait(&self, key: ExpertKey, proj: Proj, timeout: Duration) -> Result<Slot> {
        let start = Instant::now();
        let mut s = self.shared.lock();
        let mut blocked = false;
        let out = loop {
            match s.status(key, proj) {
                WaitStatus::Ready(slot) => break Ok(slot),
                WaitStatus::Failed(e) => break Err(e),
                WaitStatus::Pending => {}
            }
            let left = timeout
                .checked_sub(start.elapsed())
                .filter(|d| !d.is_zero());
            let Some(left) = left else {
                let ms = timeout.as_millis() as u64;
                break Err(IoError::Timeout {
                    layer: key.layer,
                    expert: key.expert,
                    ms,
                });
            };
            if !blocked {
                blocked = true;
                s.block_begin(start);
            }
            s = self
                .shared
                .done_cv
                .wait_timeout(s, left)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
        };
        if blocked {
            s.block_end(Instant::now());
        }
        out
    }

    /// True while the engine is reading (or verifying) `key`.
    pub fn is_live(&self, key: ExpertKey) -> bool {
        self.shared.lock().is_live(key)
    }

    /// Waits until some read ends (or `timeout`); false if no read was in flight.
    pub fn wait_for_reads(&self, timeout: Duration) -> bool {
        let s = self.shared.lock();
        if !s.reads_in_flight() {
            return false;
        }
        drop(
            self.shared
                .done_cv
                .wait_timeout(s, timeout)
                .unwrap_or_else(|p| p.into_inner()),
        );
        true
    }

    /// A copy of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.lock().stats.clone()
    }

    /// (demand jobs queued, prefetch jobs queued, predictions waiting, reads in service).
    pub fn depths(&self) -> (usize, usize, usize, usize) {
        self.shared.lock().depths()
    }

    /// Jobs tracked and cancelled jobs still finishing (for tests and diagnostics).
    pub fn tracked(&self) -> (usize, usize) {
        self.shared.lock().tracked()
    }

    /// Waits until nothing is queued or in service, up to `timeout`; true if idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut s = self.shared.lock();
        while !s.idle() {
            let Some(left) = timeout.checked_sub(start.elapsed()) else {
                return false;
            };
            s = self
                .shared
                .done_cv
                .wait_timeout(s, left)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        true
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Set under the locks the threads check it under, so none can miss the wake-up
        // between its check and its wait (a lost wake-up hung a test once in ~20 runs).
        {
            let _sched = self.shared.lock();
            self.shared.shutdown.store(true, Ordering::SeqCst);
        }
        self.shared.work_cv.notify_all();
        drop(
            self.shared
                .verify_q
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.shared.verify_cv.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared, file: &File) {
    loop {
        let item = {
            let mut sched = s.lock();
            loop {
                if s.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(item) = sched.next_work(s.src.as_ref()) {
                    let (_, _, _, in_service) = sched.depths();
                    sched.stats.max_in_service = sched.stats.max_in_service.max(in_service as u64);
                    break item;
                }
                sched = s.work_cv.wait(sched).unwrap_or_else(|p| p.into_inner());
            }
        };
        let res = read_item(file, &item, s.cfg.fault.as_ref());
        let fin = s.lock().finish(&item, res, s.src.as_ref());
        if matches!(fin, Finish::Verify { .. }) {
            s.verify_q
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(fin);
            s.verify_cv.notify_one();
        }
        s.done_cv.notify_all();
        s.work_cv.notify_all();
    }
}

fn verifier(s: &Shared) {
    loop {
        let fin = {
            let mut q = s.verify_q.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(f) = q.pop_front() {
                    break f;
                }
                q = s.verify_cv.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        if let Finish::Verify {
            key,
            gen,
            addr,
            len,
            xxh3,
        } = fin
        {
            // SAFETY: the slot is ours until `verified` hands it on (SlotSource contract);
            // every read into it has finished.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
            let ok = xxhash_rust::xxh3::xxh3_64(bytes) == xxh3;
            s.lock().verified(key, gen, ok, s.src.as_ref());
        }
        s.done_cv.notify_all();
        s.work_cv.notify_all();
    }
}

fn read_item(
    file: &File,
    item: &WorkItem,
    fault: Option<&crate::config::FaultHook>,
) -> Result<u64> {
    let (layer, expert) = (item.key.layer, item.key.expert);
    if let Some(e) = fault.and_then(|f| f(item.key, item.file_off)) {
        return Err(IoError::Read {
            layer,
            expert,
            message: e.to_string(),
        });
    }
    // SAFETY: the destination lies inside a slot the scheduler owns for this job
    // (SlotSource contract); no one else writes it while the read is in service.
    let buf = unsafe { std::slice::from_raw_parts_mut(item.addr as *mut u8, item.len as usize) };
    match read_at(file, buf, item.file_off) {
        Ok(n) if n as u64 == item.len => Ok(item.len),
        Ok(n) => Err(IoError::ShortRead {
            layer,
            expert,
            got: n as u64,
            want: item.len,
        }),
        Err(e) => Err(IoError::Read {
            layer,
            expert,
            message: e.to_string(),
        }),
    }
}
