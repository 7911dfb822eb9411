"""Elastic VRAM: the VRAM expert cache gives memory back when another program takes
some, and takes more again when it comes back.

At load ``plan_vram`` sizes the cache from free VRAM minus a headroom (activations,
the allocator, others). At token boundaries (every ``CHECK_EVERY`` decode tokens and at
each new prompt) ``ElasticVram.check`` plans again from what is free now plus what the
cache itself holds (plus what this process allocated since the plan: that is what the
headroom is for, so only other programs make it shrink): when free VRAM has fallen
into the headroom the cache shrinks to the planned size (each layer drops its coldest
experts by decayed recent count and its memory goes back to the driver); when it has
come back the cache grows (new slots fill on first use, as at start). One printed line
per change.

Which experts sit in VRAM never changes what they compute (the same verified bytes,
the same kernel), so a resize changes speed, never output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flint.stream.plan import GIB, plan_vram
from flint.stream.vram import VramCache, free_vram

# Decode tokens between checks (and one at every prompt). A check costs one
# cudaMemGetInfo plus torch's allocator counters, tens of microseconds
# (``benches/pinned_copy.py`` prints it), against a streamed decode token of tens of
# milliseconds: every 16 tokens is < 0.01% of decode time, and another program's
# allocation is answered within 16 tokens (well under a second at those speeds).
CHECK_EVERY = 16
# Growing waits until this much more than the planned slots is free, so a few MiB of
# allocator noise at the boundary does not flip the size back and forth.
GROW_SLACK = 64 << 20


def usable_vram(device: torch.device) -> int:
    """Free bytes on ``device`` for this process: the driver's free count plus what
    torch's allocator has reserved but not handed out (freed activations it keeps)."""
    free = free_vram(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


@dataclass(slots=True)
class ElasticCounters:
    checks: int = 0
    shrinks: int = 0
    grows: int = 0
    dropped: int = 0  # experts dropped from VRAM by shrinking


@dataclass
class ElasticVram:
    """Resizes ``vram`` to what ``free_bytes()`` (plus what it holds) allows."""

    vram: VramCache
    free_bytes: Callable[[], int]
    budget_gib: float | None  # the cache's share of --vram-budget: growth stops there
    notice: Callable[[str], None]
    # this process's allocated device bytes (CUDA: torch's count); what it allocates
    # after the plan besides the cache (GPU-wave buffers, workspaces) comes out of the
    # headroom and is no reason to shrink: only other programs' allocations are
    allocated: Callable[[], int] | None = None
    every: int = CHECK_EVERY
    counters: ElasticCounters = field(default_factory=ElasticCounters)
    _decode_tokens: int = 0
    _last_free: int = 0  # ``_free()`` after the last (re)size
    _others0: int = 0  # allocated bytes besides the cache at the plan
    _blocked: int | None = None  # free bytes when a growth last failed to allocate

    def __post_init__(self) -> None:
        self._others0 = self._others()
        self._last_free = self._free()

    def _free(self) -> int:
        """Free bytes as the cache sees them: ``free_bytes()`` plus what this process
        allocated besides the cache since the plan (that is what the headroom is for)."""
        return self.free_bytes() + max(0, self._others() - self._others0)

    def _others(self) -> int:
        """This process's allocated bytes besides the cache's."""
        return 0 if self.allocated is None else self.allocated() - self.vram.held_bytes

    def due(self, tokens: int) -> bool:
        """Whether the boundary before a forward of ``tokens`` tokens checks: every
        ``every``-th decode token and every prompt."""
        if tokens > 1:
            return True
        self._decode_tokens += 1
        return self._decode_tokens % self.every == 0

    def target(self, free: int, held: int) -> int:
        v = self.vram
        plan = plan_vram(len(v.layers), v.n_experts, v.slab_bytes, free + held, self.budget_gib)
        return plan.slots_per_layer

    def check(self) -> int | None:
        """Plans from what is free now; resizes when that differs (growing only past
        ``GROW_SLACK``). Returns the new slots per layer, or None when unchanged."""
        v = self.vram
        self.counters.checks += 1
        free, held, before, last = self._free(), v.held_bytes, v.slots, self._last_free
        new = self.target(free, held)
        if new >= before:
            new = max(before, self.target(free - GROW_SLACK, held))
        if new == before:
            return None
        if new > before and self._blocked is not None and free <= self._blocked + GROW_SLACK:
            return None  # the last growth from about this much free memory failed
        dropped = v.resize(new)
        label = f"{v.device}: VRAM expert cache"
        if new > before and v.slots == before:
            self._blocked = free
            self.notice(
                f"{label} could not grow {before} -> {new} slots/layer (the allocation "
                "failed); it stays and tries again when more memory is free"
            )
            return None
        self._blocked = None
        if v.slots < before:
            self.counters.shrinks += 1
            self.counters.dropped += dropped
            self.notice(
                f"{label} shrunk {before} -> {v.slots} slots/layer (free VRAM fell by "
                f"{(last - free) / GIB:.1f} GiB: another program took memory)"
            )
        elif v.slots > before:
            self.counters.grows += 1
            self.notice(
                f"{label} grew {before} -> {v.slots} slots/layer "
                f"({(free - last) / GIB:.1f} GiB of VRAM came back)"
            )
        self._last_free = self._free()
        return v.slots
