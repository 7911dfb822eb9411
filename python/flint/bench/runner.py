"""One timed test of one mode (``pp N`` or ``tg N``) and what it measured.

``pp N``: N prompt tokens (random ids, seeded) in one prefill, timed up to the first
greedy token. ``tg N``: a short code prompt is prefilled (its time is the time to
first token), then N tokens are decoded greedily one forward at a time, timed.
``tg N`` with ``random_feed`` (row ``tgNr``) feeds seeded random ids instead of the
greedy tokens (whose argmax is still recorded and checked): a random-weight model's
greedy text repeats itself, so its routing would too and every cache would look
perfect; random ids give the near-uniform routing BENCHMARKS.md calls pessimistic. The
streaming counters are read before and after the timed part, so a ``tg`` row's
per-token numbers cover decode steps only and a ``pp`` row's cover prompt tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from flint.api import LLM
from flint.bench.belady import belady_reads
from flint.models.prefill import prefill
from flint.stream import StreamedExperts

TG_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"
PP_SEED = 0
MIB = 1 << 20


@dataclass(slots=True, frozen=True)
class Case:
    """A llama-bench test: ``pp`` (prompt processing) or ``tg`` (generation) of n tokens."""

    kind: str
    n: int
    random_feed: bool = False  # tg: feed seeded random ids instead of the greedy tokens

    @property
    def name(self) -> str:
        return f"{self.kind}{self.n}" + ("r" if self.random_feed else "")


@dataclass(slots=True)
class Sample:
    """One run of one test: speed, the greedy tokens, and streaming counters per token
    (None where nothing streams or a quantity is undefined)."""

    tok_s: float
    ttft_ms: float
    tokens: list[int]
    streaming: dict[str, float | None] = field(default_factory=dict)


def prompt_ids(llm: LLM, test: Case) -> list[int]:
    if test.kind == "tg":
        return llm.tokenizer.encode(TG_PROMPT)
    gen = torch.Generator().manual_seed(PP_SEED)
    vocab = llm.model.config.vocab_size
    return torch.randint(min(2, vocab - 1), vocab, (test.n,), generator=gen).tolist()


def _greedy(logits: torch.Tensor, vocab: int) -> int:
    return int(torch.argmax(logits[-1, :vocab]).item())  # .item() waits for the device


def _counters(llm: LLM) -> dict[str, Any] | None:
    backend = llm.expert_backend
    if not isinstance(backend, StreamedExperts):
        return None
    s: dict[str, Any] = dict(backend.engine.stats())
    q = backend.lookahead.quality
    s["stall_s"] = s["wait_us"] / 1e6  # blocked waits, timed in the engine (every path)
    s["forward_calls"] = backend.counters.tokens
    full = backend.stats()
    for key in ("vram_hits", "gpu_experts", "cpu_experts", "cpu_expert_s", "pcie_bytes"):
        s[key] = full.get(key, 0)
    for d in (1, 2, 3):
        s[f"q{d}"] = (q.hits[d], q.selected[d], q.predicted[d])
    if len(backend.vrams) > 1:  # layers split across GPUs: each one's VRAM cache
        for device, v in backend.vrams.items():
            s[f"vram {device}"] = (v.counters.hits, v.counters.selections)
    return s


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def per_token(before: dict[str, Any], after: dict[str, Any], tokens: int) -> dict[str, Any]:
    """Streaming counters between two snapshots, per token (BENCHMARKS.md columns)."""
    d = {k: after[k] - before[k] for k in after if isinstance(after[k], int | float)}
    placed = d["hits"] + d["in_flight_at_start"] + d["demand_placements"]
    out: dict[str, float | None] = {
        "stall_ms": 1000 * d["stall_s"] / tokens,
        "demand_reads": d["reads_demand"] / tokens,
        "prefetch_reads": d["reads_prefetch"] / tokens,
        "demand_misses": d["demand_placements"] / tokens,
        "read_mib": (d["bytes_demand"] + d["bytes_prefetch"]) / tokens / MIB,
        "ram_hit_rate": _ratio(d["hits"], placed),
        "vram_hit_rate": _ratio(d["vram_hits"], placed + d["vram_hits"])
        if after["vram_hits"]
        else None,
        "pcie_mib": d["pcie_bytes"] / tokens / MIB,
        "cpu_share": _ratio(d["cpu_experts"], d["cpu_experts"] + d["gpu_experts"]),
        "cpu_ms": 1000 * d["cpu_expert_s"] / tokens if d["cpu_experts"] else None,
    }
    for key in (k for k in after if k.startswith("vram ")):  # per GPU of a split
        (h1, n1), (h0, n0) = after[key], before[key]
        out[f"vram_hit_rate {key[5:]}"] = _ratio(h1 - h0, n1 - n0)
    for dist in (1, 2):
        (h1, s1, p1), (h0, s0, p0) = after[f"q{dist}"], before[f"q{dist}"]
        out[f"recall_d{dist}"] = _ratio(h1 - h0, s1 - s0)
        out[f"precision_d{dist}"] = _ratio(h1 - h0, p1 - p0)
    return out


def _prefill(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The prompt layer-major, as generation runs it; the last position's logits [1, V]."""
    model = llm.model
    x = torch.tensor(ids, dtype=torch.int64, device=model.place.device)
    return prefill(model, x)[None]


def run_test(llm: LLM, test: Case) -> Sample:
    """Runs ``test`` on ``llm`` from an empty KV cache (the expert cache is as the
    previous run left it: empty for a fresh model)."""
    model, vocab = llm.model, llm.model.config.vocab_size
    ids = prompt_ids(llm, test)
    model.reset()
    before = _counters(llm)
    t0 = time.perf_counter()
    token = _greedy(_prefill(llm, ids), vocab)
    t1 = time.perf_counter()
    tokens = [token]
    if test.kind == "pp":
        after = _counters(llm)
        stream = per_token(before, after, len(ids)) if before and after else {}
        return Sample(len(ids) / (t1 - t0), 1000 * (t1 - t0), tokens, stream)
    mid = _counters(llm)
    backend = llm.expert_backend if isinstance(llm.expert_backend, StreamedExperts) else None
    held, vram_slots = (backend.held(), _vram_slots(backend)) if backend is not None else ([], 0)
    device = model.place.device
    feed = torch.randint(0, vocab, (test.n,), generator=torch.Generator().manual_seed(PP_SEED))
    try:
        if backend is not None:
            backend.routing = []  # recorded for the Belady bound (``_belady_mib``)
        for i in range(test.n):
            fed = int(feed[i]) if test.random_feed else token
            logits = model.forward(torch.tensor([fed], dtype=torch.int64, device=device))
            token = _greedy(logits, vocab)
            tokens.append(token)
        t2 = time.perf_counter()
    finally:
        rows = backend.routing if backend is not None else None
        if backend is not None:
            backend.routing = None
    after = _counters(llm)
    stream = per_token(mid, after, test.n) if mid and after else {}
    if backend is not None and rows is not None:
        # the larger VRAM cache of the start and the end (an elastic one may shrink)
        capacity = backend.plan.slots_per_layer + max(vram_slots, _vram_slots(backend))
        stream["belady_mib"] = _belady_mib(backend, rows, held, capacity, test.n)
    return Sample(test.n / (t2 - t1), 1000 * (t1 - t0), tokens, stream)


def _vram_slots(backend: StreamedExperts) -> int:
    """VRAM expert slots per layer (the largest GPU's when the layers are split: the
    bound stays a lower bound, looser for the other GPUs' layers)."""
    return max((v.slots for v in backend.vrams.values()), default=0)


def _belady_mib(
    backend: StreamedExperts,
    rows: list[list[int]],
    held: list[set[int]],
    capacity: int,
    tokens: int,
) -> float | None:
    """MiB per token that Belady-optimal caching would still have read in this run, at
    ``capacity`` experts per layer (``flint.bench.belady``)."""
    reads = belady_reads(rows, held, backend.cfg.num_experts, capacity)
    if reads is None:
        return None
    return reads * backend.layout.slab_bytes / tokens / MIB
