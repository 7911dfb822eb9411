"""Expert waves: the order in which one MoE layer's selected experts are placed when a
prompt selects more distinct experts than the layer has slots.

Each selected expert is placed (read if not resident) exactly once per layer call, so
a layer-major prompt reads each of the layer's experts at most once, in
``ceil(distinct / slots)`` waves from a cold cache. The plan decides only the order;
which experts run and what they compute never change.

- Experts already resident (or being read) come first: a later wave's demand reads
  could evict them before they are used.
- The ``slots`` experts the end of the prompt used (latest use, then most uses) stay
  resident for the first reply tokens ("ready for decode"): those not resident form
  the final wave, placed in that order so prompt-mode LRU keeps them; those resident
  are protected when the layer starts, so the other waves' reads evict them last, and
  the waves before the last hold ``slots - protected`` experts each. When more than
  half of the slots would be protected (the end of the prompt is mostly resident
  already) nothing is protected and those waves hold ``slots`` experts.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch

# T = tokens, K = top-k, E = experts per layer


@dataclass(slots=True, frozen=True)
class WavePlan:
    """Waves of experts, placed and unpinned one after another; ``protect``: resident
    experts the end of the prompt needs, to protect when the layer starts (they are
    placed early, with the other residents, and kept through the later waves)."""

    waves: tuple[tuple[int, ...], ...]
    protect: tuple[int, ...] = ()


FEW_PAIRS = 64  # below this many (token, rank) pairs the Python scan is the faster


def routing_summary(
    flat: torch.Tensor, top_k: int, n_experts: int
) -> tuple[torch.Tensor, list[int], np.ndarray, np.ndarray]:
    """A prompt's ids ``flat`` [T*K] on a GPU with what the host plans from them, made
    there and read back in one copy: (the ids on the CPU, each expert's selections,
    first pair and last token (``first_selected``'s and ``end_order``'s ``first`` and
    ``last``)). On the H200 numpy's ``minimum.at`` / ``maximum.at`` over an 8k prompt's
    65k pairs took ~0.2 ms each per layer on the host while the GPU waited (gpu48)."""
    n, dev = flat.numel(), flat.device
    pair = torch.arange(n, device=dev)
    first = torch.full((n_experts,), n, dtype=torch.int64, device=dev)
    first.scatter_reduce_(0, flat, pair, "amin")
    last = torch.full((n_experts,), -1, dtype=torch.int64, device=dev)
    last.scatter_reduce_(0, flat, pair // top_k, "amax")
    counts = torch.zeros(n_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # (bincount would wait: its size)
    host = torch.cat([flat, first, last, counts]).cpu()  # the ids' read-back: one wait
    e = n_experts
    return (
        host[:n],
        host[n + 2 * e :].tolist(),
        host[n : n + e].numpy(),
        host[n + e : n + 2 * e].numpy(),
    )


def first_selected(
    flat: torch.Tensor, n_experts: int, first: np.ndarray | None = None
) -> list[int]:
    """The distinct experts of ``flat`` [T*K] (on the CPU) in the order of their first
    selection (``first``: each expert's first pair, T*K if none, where the caller has
    it: ``routing_summary``). A prompt's pairs go through numpy (an 8k-token prompt's
    65k pairs: 0.12 ms against 1.39 ms scanned in Python, per layer, on the CPU box;
    numpy, not torch, whose reductions on the GPU box's 16 threads took ~0.5 ms each
    under the profiler; docs/benchmarks.md)."""
    n = flat.numel()
    if n <= FEW_PAIRS and first is None:
        return list(dict.fromkeys(flat.tolist()))
    if first is None:
        first = np.full(n_experts, n, dtype=np.int64)
        np.minimum.at(first, flat.numpy(), np.arange(n))  # [E]
    chosen = int((first < n).sum())
    order: list[int] = np.argsort(first, kind="stable")[:chosen].tolist()
    return order  # unselected (n) sort last


def end_order(
    ids: torch.Tensor,
    n_experts: int,
    counts: list[int] | None = None,
    last: np.ndarray | None = None,
) -> list[int]:
    """The distinct experts of ids [T, K], least needed at the end of the prompt first:
    by the last token that selected each, then by its number of selections, then id.
    ``ids`` belong on the CPU: on a GPU the count and the lists read back would each
    wait for the GPU's queued work. ``counts``: the selections per expert, ``last``:
    the last token of each (-1 if none), where the caller has them already."""
    if last is None or counts is None:
        k = ids.shape[1]
        flat = ids.reshape(-1).cpu().numpy()  # [T*K]
        if last is None:
            last = np.full(n_experts, -1, dtype=np.int64)
            np.maximum.at(last, flat, np.arange(flat.size) // k)  # [E]: each's last token
        if counts is None:
            counts = np.bincount(flat, minlength=n_experts).tolist()  # [E]
    lasts = last.tolist()
    chosen = [e for e, c in enumerate(counts) if c]
    return sorted(chosen, key=lambda e: (lasts[e], counts[e], e))


def plan_waves(
    ids: torch.Tensor,
    n_experts: int,
    slots: int,
    resident: Collection[int],
    counts: list[int] | None = None,
    last_token: np.ndarray | None = None,
) -> WavePlan:
    """The wave plan for a layer whose router selected ids [T, K] (see module docs;
    on the CPU, as ``end_order`` says, which takes ``counts`` and ``last_token`` as ``last``)."""
    if slots < 1:
        raise ValueError(f"a layer needs at least one slot, got {slots}")
    order = end_order(ids, n_experts, counts, last_token)
    held = set(resident)
    if len(order) <= slots:  # one wave: residents first, pinned before any read
        first = [e for e in order if e in held] + [e for e in order if e not in held]
        return WavePlan((tuple(first),))
    tail = order[-slots:]
    keep = [e for e in tail if e in held]
    last = [e for e in tail if e not in held]
    if len(keep) > slots // 2:
        keep = []
    early = [e for e in order if e in held] + [e for e in order[:-slots] if e not in held]
    width = slots - len(keep)
    waves = [tuple(early[i : i + width]) for i in range(0, len(early), width)]
    if last:
        waves.append(tuple(last))
    return WavePlan(tuple(waves), tuple(keep))
