"""A long prompt's next layer copied up ahead (issue 8, P8): while the GPU still
computes layer L of a layer-major prompt, layer L+1's experts go from their RAM slots
into one of two VRAM areas on the copy stream, so their PCIe time overlaps L's experts
and L+1's attention instead of following L+1's router.

Which experts: a prompt of T tokens selects about every expert of a layer once
T x K >= ``AHEAD_PAIRS_PER_EXPERT`` x E (at 8 pairs per expert an expert goes unselected
with probability about e^-8, 0.03%), so every expert of L+1 that is complete in RAM and
not in VRAM is copied; one that is then not selected costs its copy, nothing else. The
ones not copied ahead (being read, or in no slot) take the usual GPU-wave path.

Each copied expert's RAM slot stays pinned until its copy has landed, which L+1's call
waits for once it has queued the launch that reads them (the compute stream waits on
the copies' event; by then they have usually landed) before it unpins them. The areas
are allocated at the first long prompt and given back at the first decode step
(``_free_aheads``). L+1 computes them from the area together with the experts VRAM
holds (``cuda_place._early``: one grouped call), the same kernel on the same bytes as
from a staging buffer, so the output is unchanged bit for bit. The two areas alternate
by layer; an area is copied into again only after the launch that read it (an event).

Only where it helps and is safe: the slab kernels, page-locked RAM (a pageable copy
would block the host), a layer whose slots hold every expert (one wave: prefetching
into a layer that needs several waves would pin slots its waves need), the next layer
on the same GPU, and room for the two areas (``AREA_SHARE`` of usable VRAM at most).
``FLINT_PROMPT_AHEAD=0`` turns it off, to compare.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from flint.stream.gpu_waves import cuda_event
from flint.stream.slab import slot_bytes

AHEAD_PAIRS_PER_EXPERT = 8
AREA_SHARE = 0.25  # the two areas take at most this share of the usable VRAM


def prompt_ahead_enabled() -> bool:
    return os.environ.get("FLINT_PROMPT_AHEAD", "1") != "0"


def worth_it(tokens: int, top_k: int, n_experts: int) -> bool:
    """Whether a prompt of ``tokens`` selects about every expert of each layer."""
    return tokens * top_k >= AHEAD_PAIRS_PER_EXPERT * n_experts


def runs(addresses: list[int], stride: int) -> list[tuple[int, int]]:
    """(first index, length) of each run of ``addresses`` (ascending) that are
    ``stride`` apart: the slabs one copy can move."""
    out: list[tuple[int, int]] = []
    for i, address in enumerate(addresses):
        if out and address == addresses[i - 1] + stride:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def copy_plan(
    placed: list[tuple[int, int]], stride: int
) -> tuple[dict[int, int], list[tuple[int, int, int]]]:
    """For ``placed`` (expert, slot address), slots ``stride`` bytes apart: each
    expert's row of the area (in address order) and the copies, (first row, source
    address, slabs) per run of adjacent slots."""
    ordered = sorted(placed, key=lambda p: p[1])
    rows = {e: row for row, (e, _) in enumerate(ordered)}
    addresses = [a for _, a in ordered]
    return rows, [(row, addresses[row], n) for row, n in runs(addresses, stride)]


@dataclass(slots=True)
class Ahead:
    """One layer's experts copied ahead: ``rows[e]`` is expert e's row of ``area``."""

    layer: int
    area: int
    rows: dict[int, int]
    copied: Any  # CUDA event on the copy stream: every copy landed
    pinned: list[int]  # their RAM slots, pinned until ``copied``


class PromptAhead:
    """Two areas of ``rows`` slabs on ``device``, filled on ``copies`` (a stream)."""

    def __init__(self, device: torch.device, slab_bytes: int, rows: int, copies: Any) -> None:
        self.device, self.slab_bytes, self.rows = device, slab_bytes, rows
        self.areas = torch.empty(2, rows, slab_bytes, dtype=torch.uint8, device=device)
        self.copies = copies
        self.released: list[Any] = [None, None]  # per area: the launch that read it
        self.next = 0
        self.pending: dict[int, Ahead] = {}
        # the kernels' views of an area, per (layer, area): made by the caller on first
        # use, and gone with the areas
        self.pools: dict[tuple[int, int], Any] = {}

    def queue(self, layer: int, placed: list[tuple[int, int]]) -> int:
        """Queues the copies of ``placed`` (expert, pinned slot address), at most
        ``rows`` of them (the caller pins no more), into the next area: in address
        order, one copy per run of adjacent slots (a layer whose experts were read in
        one go sits in one run: a copy call instead of ~100 per layer). Returns the
        number of copy calls."""
        assert len(placed) <= self.rows and layer not in self.pending
        area = self.next
        self.next ^= 1
        rows, spans = copy_plan(placed, self.slab_bytes)
        with torch.cuda.stream(self.copies):
            if self.released[area] is not None:
                self.copies.wait_event(self.released[area])  # its last reader is done
            for row, address, n in spans:
                src = slot_bytes(address, n * self.slab_bytes)
                self.areas[area, row : row + n].view(-1).copy_(src, non_blocking=True)
            copied = cuda_event()
            copied.record(self.copies)
        self.pending[layer] = Ahead(layer, area, rows, copied, [e for e, _ in placed])
        return len(spans)

    def take(self, layer: int) -> Ahead | None:
        """``layer``'s experts copied ahead, once their copies have landed: for
        ``drop_all`` (a call reads ``pending`` itself, queues its launch, then waits)."""
        ahead = self.pending.pop(layer, None)
        if ahead is not None:
            ahead.copied.synchronize()
        return ahead

    def area(self, ahead: Ahead) -> torch.Tensor:
        return self.areas[ahead.area]  # [rows, slab_bytes]

    def read(self, ahead: Ahead, stream: Any) -> None:
        """The launch that reads ``ahead``'s area is queued on ``stream``."""
        released = cuda_event()
        released.record(stream)
        self.released[ahead.area] = released

    def drop_all(self) -> list[Ahead]:
        """Every pending layer (a forward that ended early): their copies waited for,
        for the caller to unpin."""
        out = [self.take(layer) for layer in list(self.pending)]
        return [a for a in out if a is not None]
