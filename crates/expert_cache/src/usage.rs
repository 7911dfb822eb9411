//! The usage table ("heat"): undecayed use counts per expert, kept next to the model
//! so that a restart begins with the experts that were hot last time (VRAM seeding,
//! idle fill).
//!
//! File layout, little endian:
//! ```text
//! 0   magic      b"FLNTHEAT"
//! 8   version    u32 = 1
//! 12  n_layers   u32
//! 16  n_experts  u32
//! 20  reserved   u32 = 0
//! 24  model_key  u64   caller's fingerprint of the model (e.g. hash of its header)
//! 32  counts     u64 x n_layers x n_experts, layer-major
//! end checksum   u64   xxh3-64 of every byte before it
//! ```
//! Writes go to a temporary file in the same directory, are synced, then renamed over
//! the table, so a crash leaves the old table or the new one, never half of one. A
//! table that is damaged or made for another model is reported and ignored by
//! [`UsageTable::load_or_new`]: heat is a hint, never a reason to stop.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{CacheError, Result};

const MAGIC: &[u8; 8] = b"FLNTHEAT";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 32;
/// A table larger than this many counts is refused before allocating (2^24 counts is
/// 128 MiB, far above 100 layers x 1,024 experts).
const MAX_COUNTS: usize = 1 << 24;

/// Undecayed use counts for every (layer, expert).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTable {
    n_layers: usize,
    n_experts: u32,
    counts: Vec<u64>,
}

impl UsageTable {
    /// An all-zero table.
    pub fn new(n_layers: usize, n_experts: u32) -> Result<Self> {
        let n = n_layers
            .checked_mul(n_experts as usize)
            .filter(|&n| n <= MAX_COUNTS)
            .ok_or(CacheError::Overflow {
                what: "usage table size",
            })?;
        Ok(Self {
            n_layers,
            n_experts,
            counts: vec![0; n],
        })
    }

    /// Where the table of `model` lives: the model's path with `.usage` appended.
    pub fn path_for(model: &Path) -> PathBuf {
        let mut name = model.as_os_str().to_owned();
        name.push(".usage");
        PathBuf::from(name)
    }

    /// Counts, layer-major.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Uses of `expert` in `layer` (0 when out of range).
    pub fn count(&self, layer: usize, expert: u32) -> u64 {
        if expert >= self.n_experts {
            return 0;
        }
        let idx = layer
            .saturating_mul(self.n_experts as usize)
            .saturating_add(expert as usize);
        self.counts.get(idx).copied().unwrap_or(0)
    }

    pub(crate) fn record(&mut self, idx: usize) {
        if let Some(c) = self.counts.get_mut(idx) {
            *c = c.saturating_add(1);
        }
    }

    pub(crate) fn check_geometry(&self, n_layers: usize, n_experts: u32) -> Result<()> {
        if (self.n_layers, self.n_experts) == (n_layers, n_experts) {
            return Ok(());
        }
        Err(CacheError::UsageForeign {
            path: PathBuf::new(),
            found: format!("{} layers x {} experts", self.n_layers, self.n_experts),
            expected: format!("{n_layers} layers x {n_experts} experts"),
        })
    }

    /// The file bytes for this table.
    pub fn to_bytes(&self, model_key: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + 8 * self.counts.len() + 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        // n_layers fits u32: new() capped the table at 2^24 counts.
        out.extend_from_slice(&(self.n_layers as u32).to_le_bytes());
        out.extend_from_slice(&self.n_experts.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&model_key.to_le_bytes());
        self.counts
            .iter()
            .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Parses file bytes, expecting this geometry and model. `path` only names errors.
    pub fn from_bytes(
        bytes: &[u8],
        n_layers: usize,
        n_experts: u32,
        model_key: u64,
        path: &Path,
    ) -> Result<Self> {
        let corrupt = |reason| CacheError::UsageCorrupt {
            path: path.to_owned(),
            reason,
        };
        let body_len = bytes
            .len()
            .checked_sub(8)
            .ok_or_else(|| corrupt("shorter than a header"))?;
        let (body, sum) = bytes.split_at(body_len);
        if bytes.len() < HEADER_BYTES + 8 || body.get(..8) != Some(MAGIC.as_slice()) {
            return Err(corrupt("not a usage table (bad magic)"));
        }
        if u64::from_le_bytes(word(sum)) != xxhash_rust::xxh3::xxh3_64(body) {
            return Err(corrupt("checksum mismatch"));
        }
        let field = |at: usize| u32::from_le_bytes(word(body.get(at..at + 4).unwrap_or(&[])));
        if field(8) != VERSION {
            return Err(corrupt("unknown version"));
        }
        let (found_layers, found_experts) = (field(12) as usize, field(16));
        let found_key = u64::from_le_bytes(word(body.get(24..32).unwrap_or(&[])));
        if (found_layers, found_experts, found_key) != (n_layers, n_experts, model_key) {
            return Err(CacheError::UsageForeign {
                path: path.to_owned(),
                found: format!("{found_layers}x{found_experts}, model key {found_key:#018x}"),
                expected: format!("{n_layers}x{n_experts}, model key {model_key:#018x}"),
            });
        }
        let mut table = Self::new(n_layers, n_experts)?;
        let counts = body.get(HEADER_BYTES..).unwrap_or(&[]);
        if counts.len() != 8 * table.counts.len() {
            return Err(corrupt("length does not match its geometry"));
        }
        for (c, chunk) in table.counts.iter_mut().zip(counts.chunks_exact(8)) {
            *c = u64::from_le_bytes(word(chunk));
        }
        Ok(table)
    }

    /// Writes the table atomically (temporary file, fsync, rename).
    pub fn save(&self, path: &Path, model_key: u64) -> Result<()> {
        let io = |source| CacheError::UsageIo {
            path: path.to_owned(),
            source,
        };
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp_name);
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(&self.to_bytes(model_key))?;
            file.sync_all()?;
            fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            // Best effort: the temporary file is garbage either way.
            let _ = fs::remove_file(&tmp);
            io(e)
        })
    }

    /// Reads a table, failing on any problem.
    pub fn load(path: &Path, n_layers: usize, n_experts: u32, model_key: u64) -> Result<Self> {
        let bytes = fs::read(path).map_err(|source| CacheError::UsageIo {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(&bytes, n_layers, n_experts, model_key, path)
    }

    /// Reads a table, or starts an empty one. The error, if any, is returned for the
    /// caller to print as one line; a missing file is not an error (first run).
    pub fn load_or_new(
        path: &Path,
        n_layers: usize,
        n_experts: u32,
        model_key: u64,
    ) -> Result<(Self, Option<CacheError>)> {
        match Self::load(path, n_layers, n_experts, model_key) {
            Ok(table) => Ok((table, None)),
            Err(CacheError::UsageIo { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok((Self::new(n_layers, n_experts)?, None))
            }
            Err(ignored) => Ok((Self::new(n_layers, n_experts)?, Some(ignored))),
        }
    }
}

/// The first `N` bytes of `bytes` as an array, zero-padded if short (callers check
/// lengths first; padding only keeps this total).
fn word<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.iter_mut().zip(bytes).for_each(|(o, b)| *o = *b);
    out
}
