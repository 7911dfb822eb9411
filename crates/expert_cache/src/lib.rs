//! The RAM expert cache: slot pools per streamed layer over one page-aligned arena,
//! and the eviction policy that decides which experts stay (pure logic: no threads,
//! no I/O, no clock). See `../shared/ARCHITECTURE.md`, "The RAM expert cache".
//!
//! - [`arena`]: the aligned memory behind the slots and its lifetime contract.
//! - [`cache`]: [`ExpertCache`], the rules shared by all policies (pins, protection,
//!   ties), idle fill, and slots lent to a prompt's working memory.
//! - [`policy`]: the [`Policy`] interface; [`decay`] (the default), [`lru`], [`lfu`]
//!   and [`belady`] (the offline bound) implement it.
//! - [`usage`]: the persisted per-expert usage table.
//! - [`trace`], [`replay`]: routing traces and policy replay.

pub mod arena;
pub mod belady;
pub mod cache;
pub mod decay;
pub mod error;
pub mod lfu;
pub mod lru;
pub mod policy;
mod pool;
pub mod replay;
mod rng;
pub mod trace;
pub mod usage;

pub use arena::{Arena, ArenaPlan, SLOT_ALIGN};
pub use cache::{Admission, ExpertCache, Lent};
pub use error::{CacheError, Result};
pub use policy::{AdmitKind, AnyPolicy, Mode, Policy, PolicyKind};
pub use replay::{replay, Predictor, ReplayConfig, ReplayStats};
pub use trace::Trace;
pub use usage::UsageTable;
