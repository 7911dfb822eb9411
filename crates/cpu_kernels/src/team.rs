//! The threads of one decode step, all running the whole step (`decode.rs`): each
//! computes its share of every large product (rows, kv groups, experts) and the small
//! serial work itself (norms, RoPE, router), and they meet at a spin barrier to
//! exchange the shares. One wake of the pool per step instead of one per product: at
//! tiny-code-moe's size a product is ~5-40 us, and waking a sleeping pool thread per
//! layer measured slower than one thread (docs/benchmarks.md).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::crew::wait_until;
use crate::error::KernelError;

/// Where the threads of a step meet (see module docs).
#[derive(Debug)]
pub(crate) struct Team {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    stop: AtomicBool,
    /// Each thread's share of the current exchange, two sets used in turn so that a
    /// thread writing the next exchange never overwrites what another still reads.
    slots: [Vec<Mutex<Vec<f32>>>; 2],
    error: Mutex<Option<KernelError>>,
}

/// Stops the step if the thread holding it unwinds (the others would wait forever).
pub(crate) struct StopOnPanic<'t>(pub(crate) &'t Team);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop.store(true, Ordering::Release);
        }
    }
}

impl Team {
    pub(crate) fn new(n: usize) -> Self {
        let set = || (0..n.max(1)).map(|_| Mutex::new(Vec::new())).collect();
        Self {
            n: n.max(1),
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            slots: [set(), set()],
            error: Mutex::new(None),
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.n
    }

    /// Rows `start..end` of `0..rows` that thread `tid` computes (contiguous, in
    /// thread order).
    pub(crate) fn share(&self, tid: usize, rows: usize) -> (usize, usize) {
        (tid * rows / self.n, (tid + 1) * rows / self.n)
    }

    /// Records the first error and stops every thread.
    pub(crate) fn fail(&self, e: KernelError) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
        self.stop.store(true, Ordering::Release);
    }

    pub(crate) fn take_error(&self) -> Option<KernelError> {
        self.error.lock().ok().and_then(|mut e| e.take())
    }

    /// Waits for every thread; false if the step was stopped.
    fn barrier(&self) -> bool {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
        } else if !wait_until(
            || self.generation.load(Ordering::Acquire) != generation,
            &self.stop,
        ) {
            return false;
        }
        !self.stop.load(Ordering::Acquire)
    }

    /// Every thread's `part` concatenated in thread order into `out` (whose length is
    /// the sum of the parts); `turn` counts this thread's exchanges. False if the step
    /// was stopped.
    pub(crate) fn gather(
        &self,
        tid: usize,
        turn: &mut usize,
        part: &[f32],
        out: &mut [f32],
    ) -> bool {
        if self.n == 1 {
            out.iter_mut().zip(part).for_each(|(o, &p)| *o = p);
            return !self.stop.load(Ordering::Acquire);
        }
        let Some(set) = self.slots.get(*turn % 2) else {
            return false;
        };
        *turn += 1;
        if let Some(Ok(mut slot)) = set.get(tid).map(Mutex::lock) {
            slot.clear();
            slot.extend_from_slice(part);
        }
        if !self.barrier() {
            return false;
        }
        let mut at = 0;
        for slot in set {
            if let Ok(s) = slot.lock() {
                if let Some(dst) = out.get_mut(at..at + s.len()) {
                    dst.copy_from_slice(&s);
                }
                at += s.len();
            }
        }
        true
    }
}
