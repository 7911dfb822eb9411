//! Counters for everything the engine does, readable at any time.

use std::time::Duration;

use crate::job::ReadClass;

/// Latencies in power-of-two microsecond buckets: bucket `i` counts values in
/// `[2^i, 2^(i+1))` us (bucket 0 also holds values below 1 us).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Counts per bucket.
    pub buckets: [u64; 32],
    /// Number of values.
    pub count: u64,
    /// Sum of values in microseconds.
    pub sum_us: u64,
}

impl Histogram {
    /// Adds one value.
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = (64 - us.leading_zeros()).saturating_sub(1).min(31) as usize;
        if let Some(b) = self.buckets.get_mut(i) {
            *b += 1;
        }
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Upper bound (us) of the bucket holding quantile `q` in [0, 1].
    pub fn quantile_us(&self, q: f64) -> u64 {
        let target = (q.clamp(0.0, 1.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return 1u64 << (i + 1);
            }
        }
        0
    }
}

/// Engine counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Demand jobs submitted.
    pub demands: u64,
    /// Predictions submitted.
    pub predictions: u64,
    /// Predictions bound to a slot and started.
    pub bound: u64,
    /// Predictions dropped because no slot could be had.
    pub bind_failed: u64,
    /// Predictions and prefetches cancelled at layer start.
    pub cancelled: u64,
    /// Prefetches promoted to demand.
    pub promoted: u64,
    /// Jobs that failed (I/O error, short read, checksum).
    pub failed: u64,
    /// Background fill jobs submitted.
    pub fills: u64,
    /// Reads issued per class: (demand, prefetch, fill).
    pub reads: (u64, u64, u64),
    /// Bytes read per class: (demand, prefetch, fill).
    pub bytes: (u64, u64, u64),
    /// Waits that blocked (one per waiting thread).
    pub waits: u64,
    /// Wall time, in microseconds, during which at least one waiter was blocked
    /// (threads waiting at the same time count once: a stall, not thread time).
    pub wait_us: u64,
    /// Submit-to-verified latency of demand jobs.
    pub demand_latency: Histogram,
    /// Submit-to-verified latency of prefetch jobs.
    pub prefetch_latency: Histogram,
    /// Largest number of reads in service at once.
    pub max_in_service: u64,
}

impl Stats {
    pub(crate) fn record_read(&mut self, class: ReadClass, len: u64, ok: bool) {
        let (r, b) = match class {
            ReadClass::Demand => (&mut self.reads.0, &mut self.bytes.0),
            ReadClass::Prefetch => (&mut self.reads.1, &mut self.bytes.1),
            ReadClass::Fill => (&mut self.reads.2, &mut self.bytes.2),
        };
        *r += 1;
        if ok {
            *b += len;
        }
    }

    pub(crate) fn record_done(&mut self, class: ReadClass, d: Duration) {
        match class {
            ReadClass::Demand => self.demand_latency.record(d),
            ReadClass::Prefetch => self.prefetch_latency.record(d),
            ReadClass::Fill => {}
        }
    }
}
