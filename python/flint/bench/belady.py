"""The reads a decode run could not have avoided, for the SSD-stall bound of
BENCHMARKS.md's S1 target: Belady's offline optimum replayed over the run's own
recorded routing, at the run's cache capacity.

The run's decode started with what its prompt left in the cache; the replay starts
empty, so the trace is prefixed with pseudo-tokens that select each layer's held
experts (padded, where a layer holds fewer than top-k, with experts it did not hold,
unused ones first: the replay then starts with at least the run's experts, which keeps
the result a lower bound), and the prefix's reads (every distinct expert in it once:
they fit without an eviction) are taken off.
"""

from __future__ import annotations

import numpy as np

from flint.cache.replay import ReplayConfig, run_replay
from flint.cache.trace import Trace


def _prefix(
    held: list[set[int]], used: list[set[int]], top_k: int, n_experts: int
) -> tuple[list[list[int]], int]:
    """Pseudo-token rows (layer by layer) that select every held expert of each layer,
    and the reads they cost: each listed expert once. A layer holding fewer than top-k
    is padded with experts it did not hold, those the decode never uses first (they
    give the replay no head start)."""
    lists = []
    for experts, uses in zip(held, used, strict=True):
        ids = sorted(experts)
        if len(ids) < top_k:  # one row's worth at least
            spare = [e for e in range(n_experts) if e not in experts]
            spare.sort(key=lambda e: e in uses)  # unused ones first (a stable sort)
            ids += spare[: top_k - len(ids)]
        lists.append(ids)
    n_rows = [-(-len(ids) // top_k) for ids in lists]
    rows = []
    for t in range(max(n_rows, default=0)):
        for ids, n in zip(lists, n_rows, strict=True):
            row = ids[(t % n) * top_k : (t % n + 1) * top_k]  # layers needing fewer repeat
            row += [e for e in ids if e not in row][: top_k - len(row)]  # fill the last
            rows.append(row)
    return rows, sum(len(ids) for ids in lists)


def belady_reads(
    rows: list[list[int]], held: list[set[int]], n_experts: int, capacity: int
) -> int | None:
    """A lower bound on the expert reads of the decode steps whose selections are
    ``rows`` (one list of top-k ids per streamed layer, layer by layer, token by
    token), by any cache of ``capacity`` experts per layer that held ``held[layer]``
    at the first step (at most ``capacity`` each); None when the capacity is below
    top-k (no replay) or nothing was recorded."""
    n_layers = len(held)
    if not rows or not n_layers:
        return None
    top_k = len(rows[0])
    if len(rows) % n_layers or any(len(set(r)) != top_k or len(r) != top_k for r in rows):
        raise ValueError(
            f"{len(rows)} recorded rows for {n_layers} layers: each decode step must record "
            f"one row of {top_k} distinct experts per streamed layer"
        )
    if capacity < top_k:
        return None
    capacity = min(capacity, n_experts)
    if any(len(h) > capacity for h in held):
        return None  # more held than the capacity: the prefix would evict
    used = [{e for r in rows[layer::n_layers] for e in r} for layer in range(n_layers)]
    prefix, prefix_reads = _prefix(held, used, top_k, n_experts)
    tokens = (len(prefix) + len(rows)) // n_layers
    experts = np.asarray(prefix + rows, dtype=np.int16).reshape(tokens, n_layers, top_k)
    config = ReplayConfig(capacities=(capacity,), policies=("belady",))
    total = run_replay(Trace(experts=experts, n_experts=n_experts), config)[0].demand_reads
    return total - prefix_reads
