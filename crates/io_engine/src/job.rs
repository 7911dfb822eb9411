//! One expert read in progress: where it goes, which chunks are left, what has landed.

use std::time::Instant;

use crate::error::IoError;
use crate::slots::Slot;

/// (layer, expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    /// Model layer.
    pub layer: u32,
    /// Expert within the layer.
    pub expert: u32,
}

/// A projection of an expert slab, in storage order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    /// First: gate.
    Gate = 0,
    /// Second: up.
    Up = 1,
    /// Third: down (its ready flag means the whole slab is in and verified).
    Down = 2,
}

/// Why an expert is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadClass {
    /// Selected by the router and not resident: goes first, one request.
    Demand,
    /// Predicted by lookahead: chunked, capped, bound late.
    Prefetch,
    /// Background fill of empty slots (the usage table's most-used experts, or every
    /// expert when they all fit): chunked, served only when no demand or prefetch
    /// waits, never cancelled by a layer start, promoted when a layer selects it.
    Fill,
}

/// Where a job is in its life.
#[derive(Debug, Clone)]
pub(crate) enum JobState {
    /// Reads queued or in service.
    Active,
    /// Every byte landed; the checksum is being computed.
    Verifying,
    /// Verified and handed to the cache.
    Done,
    /// Failed; the slot was released.
    Failed(IoError),
    /// Cancelled; reads still in service finish into the slot, then it is released.
    Cancelled,
}

/// A read of one expert slab into one slot.
#[derive(Debug)]
pub(crate) struct Job {
    pub gen: u64,
    pub key: ExpertKey,
    pub class: ReadClass,
    pub slot: Slot,
    pub file_off: u64,
    pub slab_len: u64,
    /// End offsets (relative to the slab) of gate, up, down.
    pub proj_end: [u64; 3],
    pub xxh3: u64,
    /// Chunks not yet issued: (relative offset, length).
    pub pending: std::collections::VecDeque<(u64, u64)>,
    /// Chunks finished: (relative offset, length).
    pub landed: Vec<(u64, u64)>,
    pub in_flight: u32,
    pub ready: [bool; 3],
    pub state: JobState,
    pub submitted: Instant,
}

impl Job {
    /// True while being read or verified.
    pub fn is_live(&self) -> bool {
        matches!(self.state, JobState::Active | JobState::Verifying)
    }

    /// Bytes contiguously landed from the slab start.
    pub fn landed_prefix(&mut self) -> u64 {
        self.landed.sort_unstable();
        let mut end = 0;
        for &(off, len) in &self.landed {
            if off > end {
                break;
            }
            end = end.max(off + len);
        }
        end
    }

    /// True when nothing is queued or in service and every byte landed.
    pub fn all_landed(&mut self) -> bool {
        self.pending.is_empty() && self.in_flight == 0 && self.landed_prefix() >= self.slab_len
    }

    /// Marks gate/up ready once their bytes are in (down waits for verification).
    pub fn update_early_ready(&mut self) {
        let prefix = self.landed_prefix();
        for p in 0..2 {
            if let (Some(r), Some(&end)) = (self.ready.get_mut(p), self.proj_end.get(p)) {
                *r |= prefix >= end;
            }
        }
    }
}
