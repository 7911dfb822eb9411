//! The I/O engine: reads expert slabs from a `.ftw` file into RAM cache slots with
//! direct I/O, demand before prefetch, so a token waits on the drive as little as
//! possible (see `../shared/ARCHITECTURE.md`, "The I/O engine").
//!
//! - [`Engine`]: N worker threads, each with its own file handle.
//! - [`Scheduler`]: the pure queueing state (demand queue, chunked prefetches, late
//!   binding of predictions, caps, cancel and promote), driven by the engine.
//! - [`SlotSource`]: where slots come from; [`CacheSlots`] is the RAM expert cache's.
//! - [`CachedEngine`]: the engine over the cache, driven layer by layer.

mod aligned;
mod cached;
mod config;
mod engine;
mod error;
mod file;
mod job;
mod scheduler;
mod slots;
mod stats;

pub use aligned::AlignedBuf;
pub use cached::{CacheSlots, CachedEngine, LayerCounts, LendCounts, Placement};
pub use config::{EngineConfig, FaultHook};
pub use engine::Engine;
pub use error::{IoError, Result};
pub use file::{open_for_reads, ReadMode, REFUSE_DIRECT_ENV};
pub use job::{ExpertKey, Proj, ReadClass};
pub use scheduler::{Finish, LayerStart, Scheduler, WaitStatus, WorkItem};
pub use slots::{Slot, SlotSource};
pub use stats::{Histogram, Stats};
