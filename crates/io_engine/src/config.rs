//! Engine settings. Defaults follow `../shared/ARCHITECTURE.md`.

use std::sync::Arc;

use crate::error::{IoError, Result};
use crate::job::ExpertKey;

/// A test hook called before every read: returning `Some(error)` makes that read fail
/// with it (fault injection: EIO, short reads). Never set in production.
pub type FaultHook = Arc<dyn Fn(ExpertKey, u64) -> Option<std::io::Error> + Send + Sync>;

/// How the engine reads.
#[derive(Clone)]
pub struct EngineConfig {
    /// Worker threads, each with its own file handle (default 8).
    pub workers: usize,
    /// Prefetch chunk size in bytes, a multiple of 4096 (default 512 KiB).
    pub chunk_bytes: u64,
    /// Prefetch chunks in service at once while a demand is in service (default 2).
    pub prefetch_cap_with_demand: usize,
    /// Prefetch chunks in service at once otherwise (default 4).
    pub prefetch_cap: usize,
    /// Split prefetches into chunks (off: one read per prefetch, for ablations).
    pub chunking: bool,
    /// Try O_DIRECT (falls back to buffered with one printed line where refused).
    pub direct: bool,
    /// Verify each slab's xxh3 before marking it ready.
    pub verify: bool,
    /// Fault injection for tests.
    pub fault: Option<FaultHook>,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("workers", &self.workers)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("prefetch_cap_with_demand", &self.prefetch_cap_with_demand)
            .field("prefetch_cap", &self.prefetch_cap)
            .field("chunking", &self.chunking)
            .field("direct", &self.direct)
            .field("verify", &self.verify)
            .field("fault", &self.fault.is_some())
            .finish()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            chunk_bytes: 512 << 10,
            prefetch_cap_with_demand: 2,
            prefetch_cap: 4,
            chunking: true,
            direct: true,
            verify: true,
            fault: None,
        }
    }
}

impl EngineConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.workers == 0 || self.workers > 256 {
            return Err(IoError::Config(format!(
                "workers = {} (1..=256)",
                self.workers
            )));
        }
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(4096) {
            return Err(IoError::Config(format!(
                "chunk size {} must be a positive multiple of 4096",
                self.chunk_bytes
            )));
        }
        if self.prefetch_cap == 0 || self.prefetch_cap_with_demand > self.prefetch_cap {
            return Err(IoError::Config(format!(
                "prefetch caps {}/{} must satisfy 0 <= with-demand <= idle, idle > 0",
                self.prefetch_cap_with_demand, self.prefetch_cap
            )));
        }
        Ok(())
    }
}
