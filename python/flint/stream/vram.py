"""The VRAM expert cache: copies of the hottest experts' slabs in device memory, so the
GPU computes them without a PCIe copy.

One pool of ``slots_per_layer`` slab-sized slots for every streamed layer, allocated
once (addresses stay fixed for the life of the model). Quantized experts are held in the
form their GPU kernel computes from (``pack``, done once per admission, about the
slab's size) instead, so a use does not re-pack them. It is seeded from the usage
table at start; empty slots take experts as they are first used; during decode, every
``SWAP_EVERY`` tokens up to ``MAX_SWAPS`` experts are swapped in where a newcomer's
recent count beats ``SWAP_FACTOR`` x the leaver's + ``SWAP_MARGIN``. A newcomer's bytes
come from its RAM cache slot, pinned while the copy runs (``IoEngine.pin_resident``).

Holding a copy never changes what an expert computes: the slab bytes are the verified
bytes of the file, and the layout decodes them the same way wherever they sit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SWAP_EVERY = 8  # decode tokens between swap rounds
MAX_SWAPS = 64  # per round, all layers together
SWAP_FACTOR = 1.25
SWAP_MARGIN = 4.0
RECENT_HALF_LIFE = 32.0  # tokens; "recent count" = selections decayed with this half-life


@dataclass(slots=True)
class VramCounters:
    hits: int = 0  # selected experts computed from a VRAM slot
    selections: int = 0  # distinct experts selected per layer call, held or not
    admitted: int = 0  # copied into a free slot on first use
    swaps: int = 0  # copied in over a colder expert
    seeded: int = 0  # copied in at start from the usage table
    pcie_bytes: int = 0  # host-to-device bytes of expert slabs (admissions, swaps, seeding)


class VramCache:
    """``slots_per_layer`` device-resident expert slabs for each streamed layer."""

    def __init__(
        self,
        layers: tuple[int, ...],
        n_experts: int,
        slots_per_layer: int,
        slab_bytes: int,
        device: torch.device,
        pack: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        if slots_per_layer < 1:
            raise ValueError("a VRAM cache needs at least one slot per layer")
        self.layers, self.n_experts, self.slots = layers, n_experts, slots_per_layer
        self.slab_bytes, self.device = slab_bytes, device
        self.row = {layer: i for i, layer in enumerate(layers)}
        self.pack = pack
        # one pool per layer (compacted or enlarged by ``resize``); no rows with ``pack``
        self.pools: dict[int, torch.Tensor] = {
            layer: self._pool(0 if pack is not None else slots_per_layer) for layer in layers
        }
        self.packed: dict[tuple[int, int], Any] = {}  # (layer, slot) -> packed form
        # what a kernel made of a layer's pool (the slab kernels' views); views keep
        # the pool's memory, so they go whenever the pool is replaced (``resize``)
        self.views: dict[int, Any] = {}
        self.where: dict[int, dict[int, int]] = {layer: {} for layer in layers}  # expert->slot
        self.free: dict[int, list[int]] = {
            layer: list(range(slots_per_layer))[::-1] for layer in layers
        }
        self.recent = torch.zeros(len(layers), n_experts, dtype=torch.float64)
        self._decay = 0.5 ** (1.0 / RECENT_HALF_LIFE)
        self.counters = VramCounters()
        self._decode_tokens = 0

    def _pool(self, rows: int) -> torch.Tensor:
        return torch.empty(rows, self.slab_bytes, dtype=torch.uint8, device=self.device)

    @property
    def held_bytes(self) -> int:
        """Device bytes this cache holds for experts (its pools, or the packed forms)."""
        if self.pack is None:
            return sum(p.numel() for p in self.pools.values())
        return len(self.packed) * self.slab_bytes  # a packed form is about a slab

    def entry(self, layer: int, expert: int) -> Any:
        """What the GPU computes ``expert`` from: its slab in the layer's pool, or its
        packed form (with ``pack``); None if not held."""
        slot = self.where[layer].get(expert)
        if slot is None:
            return None
        return self.packed[layer, slot] if self.pack is not None else self.pools[layer][slot]

    def _put(self, layer: int, slot: int, expert: int, src: torch.Tensor) -> Any:
        if self.pack is not None:
            # a copy even on the slot's own device: the packed form may view its input
            self.packed[layer, slot] = self.pack(src.to(self.device, copy=True))
        else:
            self.pools[layer][slot].copy_(src)
        self.where[layer][expert] = slot
        self.counters.pcie_bytes += self.slab_bytes
        return self.entry(layer, expert)

    def admit(self, layer: int, expert: int, src: torch.Tensor) -> Any:
        """Copies ``src`` (the expert's slab, in RAM) into a free slot; None when full."""
        free = self.free[layer]
        if not free or expert in self.where[layer]:
            return None
        self.counters.admitted += 1
        return self._put(layer, free.pop(), expert, src)

    def seed(
        self, counts: Callable[[int], list[int]], read: Callable[[int, int], torch.Tensor]
    ) -> None:
        """Fills each layer with its most-used experts (``counts(layer)``, the usage
        table), read by ``read(layer, expert)``; unused experts are not loaded, except
        where a layer has a slot for every expert: it is loaded whole and never
        streamed."""
        for layer in self.layers:
            c = counts(layer)
            whole = self.slots >= self.n_experts  # the layer fits: kept whole
            used = (e for e in range(self.n_experts) if c[e] > 0 or whole)
            ranked = sorted(used, key=lambda e: -c[e])
            for expert in ranked[: len(self.free[layer])]:
                self.admit(layer, expert, read(layer, expert))
                self.counters.seeded += 1
                self.counters.admitted -= 1

    def note(self, layer: int, counts: list[int]) -> None:
        """Counts a layer's router selections (``counts``: per expert, every token's)."""
        self.recent[self.row[layer]] += torch.tensor(counts, dtype=torch.float64)

    def token_done(self, tokens: int) -> bool:
        """Ages recent counts by ``tokens``; True when a decode swap round is due."""
        self.recent.mul_(self._decay**tokens)
        if tokens != 1:
            return False
        self._decode_tokens += 1
        return self._decode_tokens % SWAP_EVERY == 0

    def swap_plan(self) -> list[tuple[int, int, int]]:
        """(layer, newcomer, leaver) pairs, hottest newcomers first, at most MAX_SWAPS:
        a newcomer replaces the coldest resident expert while its recent count beats
        SWAP_FACTOR x the leaver's + SWAP_MARGIN."""
        pairs: list[tuple[float, int, int, int]] = []
        for layer in self.layers:
            r = self.recent[self.row[layer]].tolist()
            held = self.where[layer]
            if self.free[layer]:
                continue  # free slots fill on first use; nothing to evict
            leavers = sorted(held, key=lambda e: r[e])
            comers = sorted(
                (e for e in range(self.n_experts) if e not in held), key=lambda e: -r[e]
            )
            for comer, leaver in zip(comers, leavers, strict=False):
                if r[comer] <= SWAP_FACTOR * r[leaver] + SWAP_MARGIN:
                    break
                pairs.append((r[comer] - r[leaver], layer, comer, leaver))
        pairs.sort(reverse=True)
        return [(layer, comer, leaver) for _, layer, comer, leaver in pairs[:MAX_SWAPS]]

    def swap(self, layer: int, comer: int, leaver: int, src: torch.Tensor) -> None:
        """Replaces ``leaver`` by ``comer`` (its slab ``src``, from a pinned RAM slot)."""
        slot = self.where[layer].pop(leaver)
        self._put(layer, slot, comer, src)
        self.counters.swaps += 1

    def capacity(self, layer: int) -> int:
        """Slots ``layer`` has now (held + free)."""
        return len(self.where[layer]) + len(self.free[layer])

    def resize(self, slots: int) -> int:
        """Holds ``slots`` experts per layer from now on (0: none; elastic VRAM,
        ``flint.stream.elastic``). Each layer keeps its hottest experts by recent count
        (ties: the lower id) and drops the coldest, compacted into a new pool of
        ``slots`` rows (growing: the new slots fill on first use, as at start); the old
        pool is freed before the next layer's is made, so at most one layer's old and
        new pools are held together. Returns how many experts were dropped.

        A layer whose larger pool cannot be allocated keeps its size (``slots`` is then
        the smallest layer's); a smaller one that cannot be allocated next to the old
        is made after freeing the old (the layer then starts empty)."""
        if slots < 0:
            raise ValueError(f"slots must be >= 0, got {slots}")
        dropped = 0
        for layer in self.layers:
            held = self.where[layer]
            r = self.recent[self.row[layer]].tolist()
            keep = sorted(held, key=lambda e: (-r[e], e))[:slots]
            if self.pack is not None:
                by_expert = {e: self.packed.pop((layer, s)) for e, s in held.items()}
                for i, e in enumerate(keep):
                    self.packed[layer, i] = by_expert[e]
                del by_expert  # the dropped packed forms are freed with it
            else:
                self.views.pop(layer, None)
                old = self.pools[layer]
                if old.shape[0] == slots:
                    continue  # already this size (a retry after a partial growth)
                try:
                    new = self._pool(slots)
                except torch.cuda.OutOfMemoryError:  # (torch.OutOfMemoryError: 2.5+)
                    if slots > old.shape[0]:
                        continue  # stays as it is
                    self.pools[layer] = old = self._pool(0)
                    self._release()
                    new, keep = self._pool(slots), []
                if keep:
                    rows = torch.tensor([held[e] for e in keep], device=self.device)
                    torch.index_select(old, 0, rows, out=new[: len(keep)])
                self.pools[layer] = new
                del old
            dropped += len(held) - len(keep)
            self.where[layer] = {e: i for i, e in enumerate(keep)}
            self.free[layer] = list(range(len(keep), slots))[::-1]
        self.slots = min(self.capacity(layer) for layer in self.layers)
        if dropped:
            self._release()
        return dropped

    def _release(self) -> None:
        """Gives freed device memory back to the driver (other programs can use it)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


@dataclass(slots=True, frozen=True)
class VramRequest:
    """Asks for a VRAM expert cache on ``device``, planned when the model is built."""

    device: torch.device
    budget_gib: float | None  # --vram-budget; None: what is free
    notice: Callable[[str], None]
    read_slab: Callable[[int, int], torch.Tensor] | None = None  # seeds from the file
    free_bytes: Callable[[], int] | None = None  # tests simulate a device's free memory
    elastic: bool = True  # resized at token boundaries to what is free (``stream.elastic``)


def free_vram(device: torch.device) -> int:
    """Free bytes on ``device`` (CUDA: the driver's count, other programs included)."""
    if device.type != "cuda":
        raise ValueError(f"no free-memory probe for {device}; pass free_bytes")
    return int(torch.cuda.mem_get_info(device)[0])
