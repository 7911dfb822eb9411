"""The memory plan of a streamed model: how many RAM cache slots each streamed layer
gets, from what the machine has free (cgroup limits included) or an explicit budget.
Never refuses: a budget below one slot per layer is raised to that, with one line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

GIB = 1 << 30
HEADROOM_FRACTION = 0.10  # of available memory left to the OS, page cache and torch
HEADROOM_MIN = 1 << 30


def _own_cgroups(proc_cgroup: Path) -> list[tuple[str, str]]:
    """(hierarchy, path) of this process's memory cgroups: v2 ("", path) and v1
    ("memory", path), from /proc/self/cgroup."""
    out: list[tuple[str, str]] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out.append(("", path))
        elif "memory" in controllers.split(","):
            out.append(("memory", path))
    return out


def cgroup_available(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """Bytes this process's cgroups (v2, or v1's memory controller) still allow, the
    tightest of its own cgroup and every parent; None if none is limited."""
    best: int | None = None
    for hierarchy, path in _own_cgroups(proc_cgroup):
        base = root / hierarchy if hierarchy else root
        limit_name, usage_name = (
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
            if hierarchy
            else ("memory.max", "memory.current")
        )
        rel = Path(path.lstrip("/"))
        for d in [base / rel, *[base / p for p in rel.parents]]:
            try:
                limit = (d / limit_name).read_text().strip()
                usage = int((d / usage_name).read_text().strip())
            except (OSError, ValueError):
                continue
            if limit != "max" and int(limit) < (1 << 60):
                left = max(0, int(limit) - usage)
                best = left if best is None else min(best, left)
    return best


def available_memory() -> int:
    """Free memory for flint: the smaller of the machine's and the cgroup's."""
    free = int(psutil.virtual_memory().available)
    cg = cgroup_available()
    return free if cg is None else min(free, cg)


@dataclass(slots=True, frozen=True)
class StreamPlan:
    """Slots per streamed layer and where the number came from."""

    streamed_layers: tuple[int, ...]
    n_experts: int
    slot_bytes: int
    slots_per_layer: int
    budget_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def cache_bytes(self) -> int:
        return self.slots_per_layer * self.slot_bytes * len(self.streamed_layers)

    @property
    def expert_bytes(self) -> int:
        return self.n_experts * self.slot_bytes * len(self.streamed_layers)

    def describe(self) -> str:
        share = self.cache_bytes / max(1, self.expert_bytes)
        return (
            f"RAM expert cache: {self.slots_per_layer}/{self.n_experts} slots x "
            f"{len(self.streamed_layers)} layers = {self.cache_bytes / GIB:.2f} GiB "
            f"({share:.0%} of {self.expert_bytes / GIB:.2f} GiB of experts)"
        )


def _budget(
    flag: str, asked_gib: float | None, free: int, headroom_min: int, notes: list[str]
) -> int:
    """Bytes for experts: ``free`` minus headroom (10%, at least ``headroom_min``),
    capped by the ``flag`` budget when one is given (a larger one says so in ``notes``)."""
    if asked_gib is not None and not asked_gib >= 0:
        raise ValueError(f"{flag} must be a number of GiB >= 0, got {asked_gib}")
    room = max(0, free - max(headroom_min, int(free * HEADROOM_FRACTION)))
    if asked_gib is None:
        return room
    asked = round(asked_gib * GIB)  # not int(): a budget computed in GiB may land a hair under
    if asked > room:
        notes.append(
            f"{flag} {asked_gib:g} GiB is more than is free "
            f"({room / GIB:.2f} GiB after headroom); using what is free"
        )
    return min(asked, room)


def plan_cache(
    streamed_layers: list[int],
    n_experts: int,
    slot_bytes: int,
    ram_budget_gib: float | None = None,
    available: Callable[[], int] = available_memory,
) -> StreamPlan:
    """Slots per layer within ``ram_budget_gib`` (what flint may hold of routed
    experts) or, without one, within free memory minus headroom."""
    notes: list[str] = []
    budget = _budget("--ram-budget", ram_budget_gib, available(), HEADROOM_MIN, notes)
    per_layer = budget // max(1, slot_bytes * len(streamed_layers))
    slots = min(n_experts, per_layer)
    if slots < 1:
        slots = 1
        notes.append(
            f"RAM budget {budget / GIB:.3f} GiB is below one expert slot per streamed layer; "
            f"raised to {len(streamed_layers) * slot_bytes / GIB:.3f} GiB"
        )
    return StreamPlan(tuple(streamed_layers), n_experts, slot_bytes, slots, budget, tuple(notes))


VRAM_HEADROOM_MIN = 1 << 30  # and 10% of free VRAM, for activations, the allocator, others


@dataclass(slots=True, frozen=True)
class VramPlan:
    """VRAM expert slots per streamed layer (0: no VRAM cache) and why."""

    slots_per_layer: int
    n_layers: int
    slot_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def cache_bytes(self) -> int:
        return self.slots_per_layer * self.slot_bytes * self.n_layers

    def describe(self, n_experts: int) -> str:
        return (
            f"VRAM expert cache: {self.slots_per_layer}/{n_experts} slots x "
            f"{self.n_layers} layers = {self.cache_bytes / GIB:.2f} GiB"
        )


def plan_vram(
    n_layers: int,
    n_experts: int,
    slot_bytes: int,
    free_vram: int,
    vram_budget_gib: float | None = None,
) -> VramPlan:
    """VRAM slots per streamed layer within ``vram_budget_gib`` (what flint may hold of
    routed experts in VRAM) and within ``free_vram`` (bytes, measured after the dense
    weights and KV cache are in place) minus headroom. Never refuses: too little room
    means no VRAM cache (every expert then runs from RAM), said in one line."""
    notes: list[str] = []
    budget = _budget("--vram-budget", vram_budget_gib, free_vram, VRAM_HEADROOM_MIN, notes)
    slots = min(n_experts, budget // max(1, slot_bytes * n_layers))
    if slots < 1 and vram_budget_gib != 0:
        notes.append(
            f"VRAM for experts ({budget / GIB:.2f} GiB) is below one expert per streamed "
            "layer; experts run from the RAM cache only"
        )
    return VramPlan(int(slots), n_layers, slot_bytes, tuple(notes))
