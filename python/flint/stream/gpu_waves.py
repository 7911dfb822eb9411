"""GPU waves (issue 8): a prompt's experts outside VRAM, copied from their RAM slots into
two alternating sets of VRAM staging buffers on a side stream and computed there.

For each expert the copy is queued on the copy stream, an event marks its end and the
compute stream waits on that event alone, so expert j computes while expert j+1 is
copied; the next chunk's copies go into the other set of buffers as soon as the chunk
before it has finished computing from them (double buffering). The calling thread
returns once every copy of the wave has landed (not every computation), so the wave's
RAM slots can be unpinned and the next wave placed while the GPU still computes.

The copies are asynchronous only from page-locked memory; from pageable memory torch
stages them synchronously and the overlap is lost, the result is the same. An expert
computed from a staged copy is computed exactly as from its RAM slot: the same bytes,
decoded by the same layout, the same ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flint.stream.slab import slot_bytes

STAGE_SLOTS = 16  # experts per buffer set: 2 x 16 slabs of VRAM (80 MiB at 30B-A3B int4)


def cuda_event(timing: bool = False) -> Any:
    """A CUDA event (``timing``: it records time; torch's constructor is untyped)."""
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]


class GpuStager:
    """Two sets of ``slots`` slab-sized VRAM buffers and a copy stream on ``device``."""

    def __init__(self, device: torch.device, slab_bytes: int, slots: int = STAGE_SLOTS) -> None:
        self.device, self.slab_bytes, self.slots = device, slab_bytes, slots
        self.buffers = torch.empty(2, slots, slab_bytes, dtype=torch.uint8, device=device)
        self.copies = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.released: list[Any] = [None, None]  # per set: computation done with it
        self.next = 0
        self.staged = 0  # experts copied through the buffers
        self.chunks = 0

    def run(
        self,
        experts: list[tuple[int, int, bool]],  # (expert, slot address, bytes all in)
        wait: Callable[[int], None],
        compute: Callable[[int, torch.Tensor], None] | None = None,
        compute_chunk: Callable[[list[int], torch.Tensor], None] | None = None,
        sync: bool = True,
    ) -> None:
        """Stages and computes ``experts``: ``wait(expert)`` blocks until its slab is in
        and verified, ``compute(expert, slab)`` queues its computation on the current
        stream from the staged copy as soon as that copy lands; or ``compute_chunk``
        (experts, buffer set ``[slots, slab_bytes]``: expert j in row j) queues one
        computation per chunk once the chunk's copies have landed. Returns when every
        copy has landed, or with ``sync=False`` at once (the caller then waits for an
        event recorded on the compute stream after this call before it frees the
        sources: the computation waited for the copies)."""
        if not experts:
            return
        main = torch.cuda.current_stream(self.device)
        last = None
        for start in range(0, len(experts), self.slots):
            chunk = experts[start : start + self.slots]
            half = self.next
            self.next ^= 1
            if self.released[half] is not None:
                self.copies.wait_event(self.released[half])  # its last reader is done
            if compute_chunk is not None:
                # one stream switch and one event per chunk: the copy stream runs the
                # chunk's copies in order, so the last one's event covers them all
                with torch.cuda.stream(self.copies):
                    for j, (expert, address, hit) in enumerate(chunk):
                        if not hit:
                            wait(expert)
                        src = slot_bytes(address, self.slab_bytes)
                        self.buffers[half, j].copy_(src, non_blocking=True)
                    last = cuda_event()
                    last.record(self.copies)
                main.wait_event(last)
                compute_chunk([e for e, _, _ in chunk], self.buffers[half])
            else:
                for j, (expert, address, hit) in enumerate(chunk):
                    if not hit:
                        wait(expert)
                    staged = self.buffers[half, j]
                    with torch.cuda.stream(self.copies):
                        staged.copy_(slot_bytes(address, self.slab_bytes), non_blocking=True)
                        last = cuda_event()
                        last.record(self.copies)
                    if compute is not None:
                        main.wait_event(last)
                        compute(expert, staged)
            released = cuda_event()
            released.record(main)
            self.released[half] = released
            self.staged += len(chunk)
            self.chunks += 1
        if last is not None and sync:
            last.synchronize()  # the slots' bytes are copied: they may be unpinned
