"""What ``flint tune`` measures on this machine for one model, and what it picks.

- Direct reads: the I/O engine (O_DIRECT, one handle per worker) demand-reads whole
  expert slabs, a layer's worth at a time, for each worker count: GB/s and the
  engine's demand latency p50/p99 under that load; plus the latency of one read with
  nothing else queued.
- CPU expert compute: one decode token through a layer's top-k experts, computed from
  cache slots by the streaming backend with the kernels a run uses: GB/s of expert bytes.
- Layer compute time: decode steps of the whole model with nothing read (the
  ``nowait`` backend), per layer.
- Pinned host-to-device bandwidth, only where CUDA is present.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from flint import _core
from flint.bench.modes import NoWaitExperts, Setup, load
from flint.bench.runner import Case, run_test
from flint.models import parse_config
from flint.models.ftw_source import FtwSource

READ_BYTES_CAP = 256 << 20  # read per worker count and pass: a small model is read whole
SLOTS_BYTES_CAP = 64 << 20  # RAM the read test's cache may take
PINNED_BYTES = 256 << 20


@dataclass(slots=True, frozen=True)
class ReadPoint:
    """Direct-read throughput and demand latency with ``workers`` reader threads."""

    workers: int
    gb_s: float
    p50_us: int
    p99_us: int


def _streamed_layers(source: FtwSource) -> list[int]:
    return [i for i, s in enumerate(parse_config(source.config).sparse_layers) if s]


def _read_pass(source: FtwSource, layers: list[int], workers: int) -> tuple[float, dict[str, int]]:
    """Seconds to demand-read a cache's worth of experts of each of ``layers`` (each
    layer's reads in flight together, as a layer's misses are), and the counters."""
    lay = source.expert_layout
    assert lay is not None  # checked by tune()
    slots = max(1, min(lay.n_experts, SLOTS_BYTES_CAP // (lay.slab_bytes * len(layers))))
    engine = _core.IoEngine(
        str(source.path), layers, slots, policy="lru", workers=workers, chunking=False
    )
    experts = list(range(slots))
    t0 = time.perf_counter()
    for layer in layers:
        for e, *_ in engine.place(layer, experts):
            engine.wait(layer, e, 2)
        engine.unpin(layer, experts)
    return time.perf_counter() - t0, engine.stats()


def direct_reads(source: FtwSource, workers: int, passes: int = 2) -> ReadPoint:
    """Median GB/s over ``passes`` fresh engines, each with an empty cache."""
    lay = source.expert_layout
    assert lay is not None
    layers = _streamed_layers(source)
    per_layer = min(lay.n_experts * lay.slab_bytes, SLOTS_BYTES_CAP)
    layers = layers[: max(1, min(len(layers), READ_BYTES_CAP // per_layer))]
    rates: list[float] = []
    stats: dict[str, int] = {}
    for _ in range(passes):
        seconds, stats = _read_pass(source, layers, workers)
        rates.append(stats["bytes_demand"] / seconds / 1e9)
    return ReadPoint(
        workers, statistics.median(rates), stats["demand_p50_us"], stats["demand_p99_us"]
    )


def io_mode(source: FtwSource) -> str:
    """ "direct", or "buffered" where the file system refused O_DIRECT (then the read
    numbers include the page cache and say little about the drive)."""
    return _core.IoEngine(str(source.path), _streamed_layers(source)[:1], 1, workers=1).mode


def idle_latency_us(source: FtwSource, reads: int = 32) -> float:
    """Median microseconds of one demand read (submit to verified) with nothing else
    queued: one slot, so every read is a miss."""
    lay = source.expert_layout
    assert lay is not None
    layer = _streamed_layers(source)[0]
    engine = _core.IoEngine(str(source.path), [layer], 1, policy="lru", workers=1)
    times = []
    for i in range(reads):
        e = i % lay.n_experts
        t0 = time.perf_counter()
        engine.place(layer, [e])
        engine.wait(layer, e, 2)
        times.append(time.perf_counter() - t0)
        engine.unpin(layer, [e])
    return 1e6 * statistics.median(times)


def compute(setup: Setup, tokens: int = 16) -> dict[str, float]:
    """Expert compute GB/s (one token through top-k experts of one layer, from slots)
    and decode time per layer with nothing read (the ``nowait`` backend)."""
    llm = load("nowait", setup, notice=lambda _: None)
    try:
        backend = llm.expert_backend
        assert isinstance(backend, NoWaitExperts)
        cfg = llm.model.config
        k = cfg.top_k
        x = torch.randn(1, cfg.hidden_size, dtype=llm.dtype, device=llm.device)
        ids = torch.arange(k, device=llm.device).view(1, k)  # [1, K]
        weights = torch.full((1, k), 1.0 / k, device=llm.device)
        layer = backend.first_layer
        calls = []
        for i in range(24):
            t0 = time.perf_counter()
            backend(layer, x, ids, weights).sum().item()  # .item(): wait for the device
            if i >= 4:  # the first calls pay for kernel selection and caches
                calls.append(time.perf_counter() - t0)
        per_call = statistics.median(calls)
        sample = run_test(llm, Case("tg", tokens))
        layers = len(llm.model.layers)
    finally:
        llm.close()
    slab = backend.layout.slab_bytes
    return {
        "expert_compute_gb_s": k * slab / per_call / 1e9,
        "experts_us_per_layer": 1e6 * per_call,
        "decode_ms_per_token": 1000 / sample.tok_s,
        "layer_ms": 1000 / sample.tok_s / layers,
    }


def pinned_h2d_gb_s(
    device: torch.device | None = None, nbytes: int = PINNED_BYTES, reps: int = 5
) -> float | None:
    """Pinned host-to-device copy GB/s to ``device`` (default: the current GPU), the
    median of ``reps`` copies of ``nbytes``; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    target = device if device is not None else torch.device("cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=target)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize(target)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(target)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def pick_workers(points: list[ReadPoint], within: float = 0.9) -> int:
    """The fewest workers that reach ``within`` of the best measured throughput (more
    threads than the drive needs only add queueing)."""
    best = max(p.gb_s for p in points)
    return min(p.workers for p in points if p.gb_s >= within * best)


def pick_lookahead(read_us: float, layer_ms: float) -> int:
    """Layers ahead a prediction must be issued so its read (``read_us``: a layer's
    top-k misses at the chosen workers) is done when the layer starts: ceil(read /
    layer time), at least 1, at most 3."""
    if layer_ms <= 0:
        return 3
    return max(1, min(3, math.ceil(read_us / 1000 / layer_ms)))


def layer_read_us(source: FtwSource, point: ReadPoint, idle_us: float, top_k: int) -> float:
    """Time to read one layer's top-k experts: one read's latency plus the rest at the
    measured throughput."""
    lay = source.expert_layout
    assert lay is not None
    return idle_us + (top_k - 1) * lay.slab_bytes / (point.gb_s * 1e9) * 1e6


def as_dict(points: list[ReadPoint]) -> list[dict[str, Any]]:
    return [
        {"workers": p.workers, "gb_s": round(p.gb_s, 4), "p50_us": p.p50_us, "p99_us": p.p99_us}
        for p in points
    ]
