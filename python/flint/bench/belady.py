"""The reads a decode run could not have avoided, for the SSD-stall bound of
BENCHMARKS.md's S1 target: Belady's offline optimum replayed over the run's own
recorded routing, at the run's cache capacity.

The replay starts from an empty cache, while the run's decode started with what its
prompt left in the cache; each expert held at the first step and used later saves at
most one read, so subtracting those keeps the result a lower bound for that start.
"""

from __future__ import annotations

import numpy as np

from flint.cache.replay import ReplayConfig, run_replay
from flint.cache.trace import Trace


def belady_reads(
    rows: list[list[int]], held: list[set[int]], n_experts: int, capacity: int
) -> int | None:
    """A lower bound on the expert reads of the decode steps whose selections are
    ``rows`` (one list of top-k ids per streamed layer, layer by layer, token by
    token), by any cache of ``capacity`` experts per layer that held ``held[layer]``
    at the first step; None when the capacity is below top-k (no replay)."""
    n_layers = len(held)
    if not rows or not n_layers:
        return 0
    top_k = len(rows[0])
    if capacity < top_k:
        return None
    tokens = len(rows) // n_layers
    experts = np.asarray(rows[: tokens * n_layers], dtype=np.int16)
    experts = experts.reshape(tokens, n_layers, top_k)
    config = ReplayConfig(capacities=(min(capacity, n_experts),), policies=("belady",))
    cold = run_replay(Trace(experts=experts, n_experts=n_experts), config)[0].demand_reads
    saved = sum(
        len(held[layer] & set(experts[:, layer, :].ravel().tolist())) for layer in range(n_layers)
    )
    return max(0, cold - saved)
