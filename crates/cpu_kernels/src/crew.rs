//! The kernels' own worker threads: a call runs a job on the calling thread and on
//! every worker that is awake, or wakes, while the caller's own run lasts; a worker that
//! comes later skips it. The caller waits only for the workers that joined.
//!
//! Why not rayon's `in_place_scope` + `spawn_broadcast` (used before): the scope waits
//! for every worker to run its copy, so each call paid the slowest wake-up of the whole
//! pool even when the work was long done. On the GPU box (16 threads) a decode-sized
//! int4 call (8 experts, 21 MB) took ~0.52 ms against ~1.42 ms for four times the bytes:
//! ~0.2 ms of every call was fixed cost (docs/benchmarks.md, "The kernels' own
//! threads"). Here the workers also stay awake for a while after a job (spinning, then
//! yielding: [`spin_window`]) so that the next layer's call finds them running, and
//! park on a condition variable after that.
//!
//! Protocol: one atomic word holds the job's generation (high 32 bits), an open flag
//! and the number of workers that entered it (low bits). The caller publishes the job,
//! opens a new generation, runs the job, then closes the generation (clearing the flag
//! atomically returns how many entered) and waits until that many have left. A worker
//! enters only by a compare-and-swap on an open word of the generation it saw, so none
//! can enter after the close, and the job (which borrows the caller's stack) is never
//! touched after `run` returns.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{KernelError, Result};

/// The open flag of the state word.
const OPEN: u64 = 1 << 31;
/// The entered count of the state word.
const ENTERED: u64 = OPEN - 1;

/// How long an idle worker stays awake before parking, by default (microseconds): a
/// decode step's layer calls come every ~0.5-2 ms on the GPU path (attention and the
/// router run between them).
const SPIN_US_DEFAULT: usize = 2_000;

/// Spins (`spin_loop`) of a thread waiting on the others inside a call (a step, an
/// expert's down, the decode team's barrier) before it yields its core at each check.
const WAIT_SPINS: u32 = 1 << 12;

/// Waits inside a call until `ready()` holds (true) or `stop` is set (false):
/// [`WAIT_SPINS`] spins, then a yield of the core at every check, so that a thread with
/// work gets it.
pub(crate) fn wait_until(ready: impl Fn() -> bool, stop: &AtomicBool) -> bool {
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        if stop.load(Ordering::Acquire) {
            return false;
        }
        if spins < WAIT_SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Of which the first part is pure spinning; after it, every 64th check of the state
/// yields the core to any other runnable thread (the I/O threads, the caller's Python
/// thread).
const PURE_SPIN: Duration = Duration::from_micros(50);

/// How long idle workers stay awake (`FLINT_CPU_SPIN_US`, read once; 0 parks at once).
pub(crate) fn spin_window() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = crate::env_setting("FLINT_CPU_SPIN_US", SPIN_US_DEFAULT);
        Duration::from_micros(us as u64)
    })
}

/// A job as the workers see it: its borrow of the caller's stack erased (see `run`).
type JobRef = &'static (dyn Fn() + Sync);

#[derive(Default)]
struct Shared {
    state: AtomicU64,
    /// Workers that left the current generation's job.
    exited: AtomicUsize,
    job: Mutex<Option<JobRef>>,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    /// The first panic of a worker in the current job, raised again by the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    park: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// See the module docs.
pub(crate) struct Crew {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time (concurrent callers queue here).
    one: Mutex<()>,
}

impl std::fmt::Debug for Crew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crew")
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl Crew {
    /// `workers` threads named `flint-cpu-{i}`, idle workers awake for `spin`.
    pub(crate) fn new(workers: usize, spin: Duration) -> Result<Self> {
        // Built first, so that a failed spawn drops it: the workers already started
        // are shut down and joined, not left parked.
        let mut crew = Self {
            shared: Arc::new(Shared::default()),
            workers: Vec::with_capacity(workers),
            one: Mutex::new(()),
        };
        for i in 0..workers {
            let sh = Arc::clone(&crew.shared);
            let handle = std::thread::Builder::new()
                .name(format!("flint-cpu-{i}"))
                .spawn(move || worker(&sh, spin))
                .map_err(|e| KernelError::Pool {
                    threads: workers + 1,
                    message: e.to_string(),
                })?;
            crew.workers.push(handle);
        }
        Ok(crew)
    }

    /// Runs `job` on the calling thread and on the workers that join while it runs
    /// (module docs); returns when the caller's run is over and every worker that
    /// joined has left. `job` must tolerate any number of concurrent runs, including
    /// none besides the caller's. A job that waits for all workers to join (a team's
    /// barrier) gets them: the generation stays open while the caller's run lasts, and
    /// every worker, parked or newly started, enters the newest open generation. A
    /// worker's panic is raised again here, after every joined worker has left. Calls
    /// from several threads take turns; a job must not call `run` on its own crew (it
    /// would wait for itself).
    pub(crate) fn run(&self, job: &(dyn Fn() + Sync)) {
        let _one = self
            .one
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sh = &*self.shared;
        // SAFETY: the erased lifetime is never outlived. Workers reach `job` only after
        // entering the generation opened below, entering is impossible once `Close`
        // (dropped on every exit of this function, unwinding included) has closed it,
        // and `Close` returns only after every worker that entered has left, after which
        // the slot is cleared. So no worker holds `job` once `run` returns.
        let erased: JobRef = unsafe { std::mem::transmute::<&(dyn Fn() + Sync), JobRef>(job) };
        *lock(&sh.job) = Some(erased);
        lock(&sh.panic).take(); // one left by a call whose caller panicked too
        sh.exited.store(0, Ordering::Relaxed);
        let generation = (sh.state.load(Ordering::Acquire) >> 32).wrapping_add(1) & 0xffff_ffff;
        // No worker changes a closed word, so a plain store opens the next generation.
        sh.state.store(generation << 32 | OPEN, Ordering::SeqCst);
        // Right after the open: nothing between them can unwind.
        let close = Close(sh);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _park = lock(&sh.park);
            sh.wake.notify_all();
        }
        job();
        drop(close);
        if let Some(payload) = lock(&sh.panic).take() {
            resume_unwind(payload);
        }
    }
}

/// Closes the open generation and waits for the workers inside it (`Crew::run`).
struct Close<'s>(&'s Shared);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let sh = self.0;
        let entered = (sh.state.fetch_and(!OPEN, Ordering::AcqRel) & ENTERED) as usize;
        let mut spins = 0u32;
        while sh.exited.load(Ordering::Acquire) < entered {
            spins = spins.saturating_add(1);
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *lock(&sh.job) = None;
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        {
            let _park = lock(&sh.park);
            sh.wake.notify_all();
        }
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A worker: waits for a new generation, enters it if still open, runs the job.
fn worker(sh: &Shared, spin: Duration) {
    // Generation 0 is not opened before the generations wrap (2^32 calls): a worker that
    // starts after the first call opened still joins it (the decode step's team needs
    // every thread; see `run`).
    let mut seen = 0;
    loop {
        let Some(word) = next_generation(sh, seen, spin) else {
            return;
        };
        seen = word >> 32;
        if !enter(sh, word) {
            continue;
        }
        // Counts this worker out even if it unwinds (the caller waits for the count).
        let _leave = Leave(sh);
        let job = *lock(&sh.job);
        if let Some(job) = job {
            // A panic stops the call through the job's own guard (the layer call's
            // `StopOnPanic`) and is raised again by the caller; the worker lives on.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(job)) {
                lock(&sh.panic).get_or_insert(payload);
            }
        }
    }
}

/// A worker's exit from the job it entered (`worker`).
struct Leave<'s>(&'s Shared);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.exited.fetch_add(1, Ordering::AcqRel);
    }
}

/// Counts this worker in the generation of `word` if it is still open.
fn enter(sh: &Shared, mut word: u64) -> bool {
    let generation = word >> 32;
    while word >> 32 == generation && word & OPEN != 0 {
        match sh
            .state
            .compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => word = now,
        }
    }
    false
}

/// Waits until the state's generation differs from `seen`: spinning for `spin` (pure
/// spinning first, then yielding), then parked. None when the crew shuts down.
fn next_generation(sh: &Shared, seen: u64, spin: Duration) -> Option<u64> {
    let start = Instant::now();
    let mut checks = 0u32;
    loop {
        if sh.shutdown.load(Ordering::Acquire) {
            return None;
        }
        let word = sh.state.load(Ordering::Acquire);
        if word >> 32 != seen {
            return Some(word);
        }
        checks = checks.wrapping_add(1);
        if !checks.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        let waited = start.elapsed();
        if waited >= spin {
            break;
        }
        if waited >= PURE_SPIN {
            std::thread::yield_now();
        }
    }
    let mut park = lock(&sh.park);
    sh.sleepers.fetch_add(1, Ordering::SeqCst);
    let word = loop {
        let word = sh.state.load(Ordering::SeqCst);
        if word >> 32 != seen || sh.shutdown.load(Ordering::SeqCst) {
            break word;
        }
        park = sh
            .wake
            .wait(park)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    };
    sh.sleepers.fetch_sub(1, Ordering::SeqCst);
    drop(park);
    (!sh.shutdown.load(Ordering::Acquire)).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every item of a shared counter is claimed once, whichever threads join.
    fn claim_all(crew: &Crew, items: usize) -> Vec<usize> {
        let next = AtomicUsize::new(0);
        let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
        crew.run(&|| loop {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let Some(h) = hits.get(n) else { return };
            h.fetch_add(1, Ordering::Relaxed);
        });
        hits.iter().map(|h| h.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn every_item_once_spinning_parked_and_alone() {
        for spin in [Duration::ZERO, Duration::from_millis(5)] {
            for workers in [0, 1, 3] {
                let crew = Crew::new(workers, spin).expect("crew");
                for round in 0..200 {
                    if round % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(2)); // let them park
                    }
                    assert!(claim_all(&crew, 1 + round % 37).iter().all(|&h| h == 1));
                }
            }
        }
    }

    #[test]
    fn the_caller_waits_for_those_that_joined() {
        // Workers that joined are still inside the job when the caller's run ends; the
        // borrowed counter must not be read after `run` returns.
        let crew = Crew::new(3, Duration::from_millis(5)).expect("crew");
        for _ in 0..100 {
            let inside = AtomicUsize::new(0);
            crew.run(&|| {
                inside.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(200));
                inside.fetch_sub(1, Ordering::SeqCst);
            });
            assert_eq!(inside.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn a_team_gets_every_worker_even_right_after_start() {
        // The decode step's team waits at a barrier for all threads: every worker must
        // join the first call, whether it started before it or not, and later ones.
        for spin in [Duration::ZERO, Duration::from_millis(1)] {
            for _ in 0..20 {
                let crew = Crew::new(3, spin).expect("crew");
                for call in 0..3 {
                    if call == 2 {
                        std::thread::sleep(Duration::from_millis(3)); // parked
                    }
                    let arrived = AtomicUsize::new(0);
                    let start = Instant::now();
                    crew.run(&|| {
                        arrived.fetch_add(1, Ordering::SeqCst);
                        while arrived.load(Ordering::SeqCst) < 4
                            && start.elapsed() < Duration::from_secs(5)
                        {
                            std::hint::spin_loop();
                        }
                    });
                    assert_eq!(arrived.load(Ordering::SeqCst), 4, "call {call}");
                }
            }
        }
    }

    #[test]
    fn a_panicking_job_leaves_the_crew_usable() {
        let crew = Crew::new(2, Duration::from_millis(1)).expect("crew");
        let caller = std::thread::current().id();
        let r = catch_unwind(AssertUnwindSafe(|| {
            crew.run(&|| {
                if std::thread::current().id() == caller {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        assert!(claim_all(&crew, 64).iter().all(|&h| h == 1));
    }

    #[test]
    fn a_workers_panic_reaches_the_caller() {
        let crew = Crew::new(2, Duration::from_millis(5)).expect("crew");
        let caller = std::thread::current().id();
        for _ in 0..20 {
            let started = AtomicUsize::new(0);
            let r = catch_unwind(AssertUnwindSafe(|| {
                crew.run(&|| {
                    started.fetch_add(1, Ordering::SeqCst);
                    if std::thread::current().id() != caller {
                        panic!("worker");
                    }
                    // wait (bounded) for a worker to join and panic
                    let t = Instant::now();
                    while started.load(Ordering::SeqCst) < 2 && t.elapsed() < Duration::from_secs(5)
                    {
                        std::hint::spin_loop();
                    }
                })
            }));
            assert!(r.is_err(), "a worker's panic must not pass silently");
            assert!(claim_all(&crew, 64).iter().all(|&h| h == 1));
        }
    }

    #[test]
    fn concurrent_callers_take_turns() {
        let crew = Crew::new(2, Duration::from_millis(1)).expect("crew");
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for n in 0..100 {
                        assert!(claim_all(&crew, n % 17).iter().all(|&h| h == 1));
                    }
                });
            }
        });
    }
}
