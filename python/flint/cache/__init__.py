"""The RAM expert cache from Python: routing traces and policy replay.

The cache itself (slot pools, eviction rules) lives in the Rust crate ``expert_cache``
and is reached through ``flint._core``; this package loads traces and runs replays.
"""

from __future__ import annotations

from flint.cache.replay import POLICIES, ReplayConfig, ReplayRow, run_replay
from flint.cache.trace import Trace, load_trace

__all__ = ["POLICIES", "ReplayConfig", "ReplayRow", "Trace", "load_trace", "run_replay"]
