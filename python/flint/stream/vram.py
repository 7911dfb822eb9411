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
        rows = 0 if pack is not None else len(layers) * slots_per_layer
        self.pool = torch.empty(rows, slab_bytes, dtype=torch.uint8, device=device)
        self.packed: dict[int, Any] = {}  # pool row -> packed form (with ``pack``)
        self.where: dict[int, dict[int, int]] = {layer: {} for layer in layers}  # expert->slot
        self.free: dict[int, list[int]] = {
            layer: list(range(slots_per_layer))[::-1] for layer in layers
        }
        self.recent = torch.zeros(len(layers), n_experts, dtype=torch.float64)
        self._decay = 0.5 ** (1.0 / RECENT_HALF_LIFE)
        self.counters = VramCounters()
        self._decode_tokens = 0

    def entry(self, layer: int, expert: int) -> Any:
        """What the GPU computes ``expert`` from: its slab in the pool, or its packed
        form (with ``pack``); None if not held."""
        slot = self.where[layer].get(expert)
        if slot is None:
            return None
        row = self.row[layer] * self.slots + slot
        return self.packed[row] if self.pack is not None else self.pool[row]

    def _put(self, layer: int, slot: int, expert: int, src: torch.Tensor) -> Any:
        row = self.row[layer] * self.slots + slot
        if self.pack is not None:
            # a copy even on the slot's own device: the packed form may view its input
            self.packed[row] = self.pack(src.to(self.device, copy=True))
        else:
            self.pool[row].copy_(src)
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

    def note(self, layer: int, ids: torch.Tensor) -> None:
        """Counts a layer's router selections (``ids``: every token's, [T*K])."""
        counts = torch.bincount(ids.cpu(), minlength=self.n_experts)
        self.recent[self.row[layer]] += counts.to(torch.float64)

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


@dataclass(slots=True, frozen=True)
class VramRequest:
    """Asks for a VRAM expert cache on ``device``, planned when the model is built."""

    device: torch.device
    budget_gib: float | None  # --vram-budget; None: what is free
    notice: Callable[[str], None]
    read_slab: Callable[[int, int], torch.Tensor] | None = None  # seeds from the file
    free_bytes: Callable[[], int] | None = None  # tests simulate a device's free memory


def free_vram(device: torch.device) -> int:
    """Free bytes on ``device`` (CUDA: the driver's count, other programs included)."""
    if device.type != "cuda":
        raise ValueError(f"no free-memory probe for {device}; pass free_bytes")
    return int(torch.cuda.mem_get_info(device)[0])
