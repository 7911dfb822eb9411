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


def first_selected(flat: torch.Tensor, n_experts: int) -> list[int]:
    """The distinct experts of ``flat`` [T*K] (on the CPU) in the order of their first
    selection. A prompt's pairs go through torch (an 8k-token prompt's 65k pairs:
    0.11 ms against 1.39 ms scanned in Python, per layer, on the CPU box;
    docs/benchmarks.md)."""
    n = flat.numel()
    if n <= FEW_PAIRS:
        return list(dict.fromkeys(flat.tolist()))
    first = torch.full((n_experts,), n, dtype=torch.int64)
    first.scatter_reduce_(0, flat, torch.arange(n), reduce="amin")  # [E]
    chosen = int((first < n).sum())
    return torch.argsort(first)[:chosen].tolist()  # unselected (n) sort last


def end_order(ids: torch.Tensor, n_experts: int, counts: list[int] | None = None) -> list[int]:
    """The distinct experts of ids [T, K], least needed at the end of the prompt first:
    by the last token that selected each, then by its number of selections, then id.
    ``ids`` belong on the CPU: on a GPU the count and the lists read back would each
    wait for the GPU's queued work. ``counts``: the selections per expert, where the
    caller has them already."""
    tokens, k = ids.shape
    flat = ids.reshape(-1)  # [T*K]
    pos = torch.arange(tokens, device=ids.device).repeat_interleave(k)  # [T*K]
    last = torch.full((n_experts,), -1, dtype=torch.int64, device=ids.device)
    last.scatter_reduce_(0, flat, pos, reduce="amax")  # [E]
    if counts is None:
        counts = torch.bincount(flat, minlength=n_experts).tolist()  # [E]
    lasts = last.tolist()
    chosen = [e for e, c in enumerate(counts) if c]
    return sorted(chosen, key=lambda e: (lasts[e], counts[e], e))


def plan_waves(
    ids: torch.Tensor,
    n_experts: int,
    slots: int,
    resident: Collection[int],
    counts: list[int] | None = None,
) -> WavePlan:
    """The wave plan for a layer whose router selected ids [T, K] (see module docs;
    on the CPU, as ``end_order`` says, which takes ``counts``)."""
    if slots < 1:
        raise ValueError(f"a layer needs at least one slot, got {slots}")
    order = end_order(ids, n_experts, counts)
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
