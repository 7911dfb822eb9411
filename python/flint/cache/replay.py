"""Replay of a routing trace through each cache policy at several capacities.

Each run goes through ``flint._core.replay`` (Rust, without the GIL). Belady, the
offline optimum, is always run too, at every capacity, because every row reports its
ratio to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from flint import _core
from flint.cache.trace import Trace

POLICIES: tuple[str, ...] = ("lru", "lfu", "decay", "belady")


@dataclass(slots=True, frozen=True)
class ReplayConfig:
    """What to replay: per-layer capacities, policies, and an optional predictor."""

    capacities: tuple[int, ...]
    policies: tuple[str, ...] = POLICIES
    predict_recall: float | None = None  # simulated next-layer predictor, or none
    seed: int = 0  # the predictor's random stream

    def __post_init__(self) -> None:
        if not self.capacities or any(c < 1 for c in self.capacities):
            raise ValueError(f"capacities must be positive integers, got {self.capacities}")
        unknown = [p for p in self.policies if p not in POLICIES]
        if not self.policies or unknown:
            raise ValueError(f"policies must be among {', '.join(POLICIES)}, got {unknown}")
        if self.predict_recall is not None and not 0.0 <= self.predict_recall <= 1.0:
            raise ValueError(f"predict recall must be in [0, 1], got {self.predict_recall}")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")


@dataclass(slots=True, frozen=True)
class ReplayRow:
    """One policy at one capacity."""

    policy: str
    capacity: int
    tokens: int
    selections: int
    hits: int
    demand_reads: int
    prefetch_reads: int
    belady_demand_reads: int  # Belady's at the same capacity and predictor
    layer_hit_rate: tuple[float, ...]  # [L]

    @property
    def hit_rate(self) -> float:
        return self.hits / self.selections

    @property
    def misses_per_token(self) -> float:
        return self.demand_reads / self.tokens

    @property
    def prefetches_per_token(self) -> float:
        return self.prefetch_reads / self.tokens

    @property
    def ratio_to_belady(self) -> float:
        """Demand reads relative to Belady's (1.0 = optimal; inf if Belady has none)."""
        if self.belady_demand_reads == 0:
            return 1.0 if self.demand_reads == 0 else float("inf")
        return self.demand_reads / self.belady_demand_reads


def _run(
    trace: Trace, data: bytes, capacity: int, policy: str, cfg: ReplayConfig
) -> _core.ReplayResult:
    return _core.replay(
        data,
        trace.n_tokens,
        trace.n_layers,
        trace.top_k,
        trace.n_experts,
        capacity,
        policy,
        cfg.predict_recall,
        cfg.seed,
    )


def run_replay(trace: Trace, config: ReplayConfig) -> list[ReplayRow]:
    """Rows ordered by capacity, then by the order of ``config.policies``."""
    too_small = [c for c in config.capacities if c < trace.top_k]
    if too_small:
        raise ValueError(
            f"capacities {too_small} are below the trace's top-k {trace.top_k}: "
            "one token's experts must fit in a layer's cache"
        )
    data = trace.le_bytes()
    rows: list[ReplayRow] = []
    for capacity in config.capacities:
        belady = _run(trace, data, capacity, "belady", config)
        for policy in config.policies:
            r = belady if policy == "belady" else _run(trace, data, capacity, policy, config)
            per_layer = trace.n_tokens * trace.top_k
            rows.append(
                ReplayRow(
                    policy=policy,
                    capacity=capacity,
                    tokens=r.tokens,
                    selections=r.selections,
                    hits=r.hits,
                    demand_reads=r.demand_reads,
                    prefetch_reads=r.prefetch_reads,
                    belady_demand_reads=belady.demand_reads,
                    layer_hit_rate=tuple(h / per_layer for h in r.layer_hits),
                )
            )
    return rows
